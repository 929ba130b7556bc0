//! `launcher serve` answered over real HTTP by the stock `openai` Python client
//! (tests/oracle/serve_openai.py), checked against transformers on the same
//! weights and template. Each server listens on an ephemeral port and is
//! killed when its test ends, passing or not.
mod common;

use common::{models_dir, repo};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One server and one transformers oracle at a time: the machine has few cores.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// A `launcher serve` child, killed on drop.
struct Server {
    child: Child,
    base_url: String,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn model() -> PathBuf {
    models_dir().join("smollm2-135m")
}

fn template() -> PathBuf {
    repo().join("model/templates/qwen2.5-tools.jinja")
}

/// Plain HTTP GET on `addr`: (status, body).
fn get(addr: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect(addr)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let status = text.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((status, text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()))
}

/// Starts `launcher serve` on SmolLM2-135M with the Qwen2.5 tool template and
/// `extra` flags; returns once `/health` answers 200.
fn serve(extra: &[&str]) -> Server {
    let mut args = vec!["--chat-template".to_string(), template().display().to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    serve_model(&model(), &args)
}

/// Starts `launcher serve --model dir ARGS`; returns once `/health` answers 200.
fn serve_model(dir: &std::path::Path, args: &[String]) -> Server {
    let mut child = Command::new(env!("CARGO_BIN_EXE_launcher"))
        .args(["serve", "--model"])
        .arg(dir)
        .args(["--listen", "127.0.0.1:0", "--threads", "2"])
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start launcher serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).expect("read the listening line");
    let mut server = Server { child, base_url: String::new() };
    let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("first line {line:?}: {e}"));
    server.base_url = v["base_url"].as_str().unwrap().to_string();
    let addr = v["listening"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        match get(&addr, "/health") {
            Ok((200, _)) => return server,
            Ok((503, body)) => assert!(body.contains("\"error\""), "503 while loading is OpenAI-shaped: {body}"),
            other => panic!("/health: {other:?}"),
        }
        assert!(Instant::now() < deadline, "the model did not load in 120 s");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs one case of tests/oracle/serve_openai.py against `server`; returns what it printed.
fn case(server: &Server, name: &str, extra: &[&str]) -> serde_json::Value {
    let python = std::env::var_os("RLMESH_PYTHON").map(PathBuf::from).unwrap_or_else(|| repo().join("scripts/py"));
    let out = Command::new(python)
        .arg(repo().join("tests/oracle/serve_openai.py"))
        .args([name, "--base-url", &server.base_url, "--model"])
        .arg(model())
        .arg("--template")
        .arg(template())
        .args(extra)
        .output()
        .expect("run tests/oracle/serve_openai.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "case {name} failed:\n{}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    let last = stdout.lines().last().unwrap_or_default();
    eprintln!("{name}: {last}");
    serde_json::from_str(last).unwrap_or_else(|e| panic!("case {name} printed {last:?}: {e}"))
}

#[test]
fn chat_logprobs_and_text_completions_equal_transformers_on_the_same_weights() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let server = serve(&[]);
    let chat = case(&server, "chat", &[]);
    assert_eq!(chat["content"], "The capital of France is Paris.");
    let lp = case(&server, "logprobs", &[]);
    assert!(lp["max_abs_diff"].as_f64().unwrap() < 2e-3);
    case(&server, "completions", &[]);
}

#[test]
fn tool_calls_are_parsed_and_a_round_trip_extends_the_prompt() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let server = serve(&[]);
    let tools = case(&server, "tools", &[]);
    assert_eq!(tools["call"], serde_json::json!({"operation": "multiply", "a": 12, "b": 9}));
}

#[test]
fn streaming_n_and_seed_follow_the_openai_client() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let server = serve(&[]);
    case(&server, "stream", &[]);
    let n = case(&server, "n", &[]);
    assert_eq!(n["samples"].as_array().unwrap().len(), 4);
}

#[test]
fn errors_are_openai_shaped_with_their_statuses() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let server = serve(&[]);
    let codes = case(&server, "errors", &[]);
    assert_eq!(codes["model"], 404);
    assert_eq!(codes["overflow"], 400);
}

#[test]
fn a_key_is_required_when_one_is_set() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let server = serve(&["--api-key", "sesame"]);
    case(&server, "auth", &["--key", "sesame"]);
    let addr = server.base_url.trim_start_matches("http://").trim_end_matches("/v1").to_string();
    assert_eq!(get(&addr, "/v1/models").unwrap().0, 401, "the model list needs the key too");
}

#[test]
fn requests_past_the_in_flight_limit_get_429() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let server = serve(&["--max-in-flight", "1"]);
    case(&server, "busy", &[]);
}

#[test]
fn concurrent_requests_share_one_engine_call() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let server = serve(&["--batch-wait-ms", "400"]);
    case(&server, "batch", &[]);
}

#[test]
fn a_model_that_cannot_load_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json", "config.json"] {
        std::fs::copy(model().join(f), dir.path().join(f)).unwrap();
    }
    std::fs::write(dir.path().join("model.safetensors"), b"not safetensors").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_launcher"))
        .args(["serve", "--model"])
        .arg(dir.path())
        .args(["--listen", "127.0.0.1:0"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("model.safetensors"), "{}", String::from_utf8_lossy(&out.stderr));
}

/// A run's own checkpoint, served as it was saved (its template is rlmesh's tool template).
const TINY_RUN: &str = "reward = \"final_only\"\ntools = [\"calculator\"]\n[model]\npath = \"tiny\"\ntokenizer = \"smollm2\"\nhidden = 64\nlayers = 2\nheads = 4\nkv_heads = 2\n[tasks]\nsize = 64\nheld_out = 100\n[sft]\nsteps = 4\nbatch_size = 8\ntasks = 64\n[rl]\nsteps = 1\ngroup_size = 2\ngroups_per_step = 2\nmax_turns = 2\nmax_new_tokens = 16\n";

#[test]
fn a_finished_runs_checkpoint_answers_the_openai_client() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let recipe = dir.path().join("tiny.toml");
    std::fs::write(&recipe, TINY_RUN).unwrap();
    let run = dir.path().join("run");
    let out = Command::new(env!("CARGO_BIN_EXE_launcher"))
        .args(["up", "deploy/local.toml", "--recipe"])
        .arg(&recipe)
        .arg("--run-dir")
        .arg(&run)
        .args(["--metrics-addr", "127.0.0.1:0"])
        .current_dir(repo())
        .output()
        .unwrap();
    assert!(out.status.success(), "launcher up: {}", String::from_utf8_lossy(&out.stderr));
    let server = serve_model(&run.join("checkpoints/latest"), &[]);
    let smoke = case(&server, "smoke", &[]);
    assert!(smoke["tokens"].as_u64().unwrap() > 0);
}
