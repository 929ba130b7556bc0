//! A run directory has one owner, `up` checks everything before it creates
//! anything, and resuming changes nothing that should not change: real `up` jobs
//! of a tiny recipe, against the same directory, started and stopped by the test.
mod common;

use common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

/// `DIR/tiny.toml`: a tiny recipe of `steps` RL steps, checkpointing every step.
fn recipe(dir: &Path, steps: u64, lr: &str) -> String {
    let text = format!(
        "reward = \"process\"\n[model]\nhidden = 32\nlayers = 1\n[tasks]\nsize = 64\nheld_out = 100\n[sft]\nsteps = 2\nbatch_size = 4\ntasks = 256\n\
         [rl]\nsteps = {steps}\nlr = {lr}\ngroup_size = 2\ngroups_per_step = 2\nmax_turns = 2\nmax_new_tokens = 16\ncheckpoint_every = 1\n"
    );
    std::fs::create_dir_all(dir).unwrap();
    let path = dir.join("tiny.toml");
    std::fs::write(&path, text).unwrap();
    path.to_str().unwrap().to_string()
}

/// `launcher up deploy/local.toml --recipe R --run-dir RUN …` (on an ephemeral metrics port unless `extra` names one).
fn up(recipe: &str, run: &Path, extra: &[&str]) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_launcher"));
    c.current_dir(repo()).args(["up", "deploy/local.toml", "--recipe", recipe, "--run-dir", run.to_str().unwrap(), "--eval-limit", "2"]);
    if !extra.contains(&"--metrics-addr") {
        c.args(["--metrics-addr", "127.0.0.1:0"]);
    }
    c.args(extra);
    c
}

fn err(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Every file under `dir` and its bytes.
fn snapshot(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    let mut out = BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else {
                out.insert(p.strip_prefix(dir).unwrap().display().to_string(), std::fs::read(&p).unwrap_or_default());
            }
        }
    }
    out
}

/// Siblings of `run` named `<run>.prev-*`.
fn set_aside(run: &Path) -> Vec<String> {
    let name = format!("{}.prev-", run.file_name().unwrap().to_str().unwrap());
    std::fs::read_dir(run.parent().unwrap()).unwrap().flatten().filter_map(|e| e.file_name().into_string().ok()).filter(|n| n.starts_with(&name)).collect()
}

#[test]
fn up_checks_everything_before_it_creates_anything() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let tiny = recipe(tmp.path(), 2, "1e-4");
    // A GPU topology on a machine without GPUs: refused by --dry-run as by up, naming the field.
    for dry in [true, false] {
        let mut c = Command::new(env!("CARGO_BIN_EXE_launcher"));
        c.current_dir(repo()).args(["up", "deploy/dev-2gpu.toml", "--recipe", &tiny, "--run-dir", run.to_str().unwrap()]);
        if dry {
            c.arg("--dry-run");
        }
        let o = c.output().unwrap();
        assert_eq!(o.status.code(), Some(2), "dry {dry}: {}", err(&o));
        assert!(err(&o).contains("deploy/dev-2gpu.toml: field \"rollout.placement[0]\"") && err(&o).contains("GPU 0 on this machine, but libtorch sees 0 CUDA device(s) here"), "{}", err(&o));
    }
    // A GPU actor in the controller's own process: refused on any machine (GPU actors get processes of their own).
    let other = tempfile::tempdir().unwrap();
    let shared = other.path().join("gpu-in-main.toml");
    let text = std::fs::read_to_string(repo().join("deploy/dev-1gpu.toml")).unwrap();
    std::fs::write(&shared, text.replace("[rollout]\nplacement = [{ node = \"dev\", gpus = [0] }]", "[rollout]\nplacement = [{ node = \"dev\", gpus = [0], process = \"main\" }]")).unwrap();
    let o = Command::new(env!("CARGO_BIN_EXE_launcher")).current_dir(repo()).args(["up", shared.to_str().unwrap(), "--recipe", &tiny, "--run-dir", run.to_str().unwrap()]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains("gpu-in-main.toml: field \"rollout.placement[0]\": a GPU actor in the controller's process \"dev/main\""), "{}", err(&o));
    assert!(!run.exists(), "nothing created");
    // A model directory that does not exist, or holds no tokenizer.
    let half = tmp.path().join("half-model");
    std::fs::create_dir_all(&half).unwrap();
    // A real (tiny) config, so the memory plan reads it and the tokenizer is what is missing.
    let config = r#"{"architectures":["LlamaForCausalLM"],"vocab_size":256,"hidden_size":64,"intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,"num_key_value_heads":2,"max_position_embeddings":512,"rms_norm_eps":1e-5,"rope_theta":10000.0,"tie_word_embeddings":true,"torch_dtype":"float32"}"#;
    std::fs::write(half.join("config.json"), config).unwrap();
    let missing = tmp.path().join("missing.toml");
    for (path, says) in [("/nonexistent/model", "/nonexistent/model does not exist"), (half.to_str().unwrap(), "half-model holds no tokenizer.json")] {
        std::fs::write(&missing, std::fs::read_to_string(&tiny).unwrap().replace("[model]\n", &format!("[model]\npath = \"{path}\"\n"))).unwrap();
        for extra in [&["--dry-run"][..], &[]] {
            let o = up(missing.to_str().unwrap(), &run, extra).output().unwrap();
            assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", err(&o));
            assert!(err(&o).contains("missing.toml: field \"model.path\": ") && err(&o).contains(says), "{}", err(&o));
        }
    }
    // A metrics port in use.
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    for dry in [true, false] {
        let mut c = up(&tiny, &run, &["--metrics-addr", &addr]);
        if dry {
            c.arg("--dry-run");
        }
        let o = c.output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", err(&o));
        assert!(err(&o).contains(&format!("/metrics on {addr} (--metrics-addr")), "{}", err(&o));
    }
    // Nothing to resume.
    let o = up(&tiny, &run, &["--resume", "--dry-run"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", err(&o));
    assert!(err(&o).contains("no checkpoint to resume from"), "{}", err(&o));
    assert!(!run.exists(), "a refused up created the run directory");
    assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 3, "only the two recipes and the model directory");
}

#[test]
fn a_live_run_owns_its_directory_and_a_second_up_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let long = recipe(tmp.path(), 100_000, "1e-4");
    let run = tmp.path().join("run");
    let mut child = up(&long, &run, &[]).stdout(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let pid = child.id();
    let deadline = Instant::now() + Duration::from_secs(600);
    loop {
        let s: Option<Value> = std::fs::read_to_string(run.join("status.json")).ok().and_then(|t| serde_json::from_str(&t).ok());
        if s.as_ref().is_some_and(|s| s["phase"] == "rl" && s["tokens_per_s"].is_number()) {
            break;
        }
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        assert!(Instant::now() < deadline, "the run never reached RL");
        std::thread::sleep(Duration::from_millis(50));
    }
    // The job's own status, read back: throughput and staleness, not "?".
    let o = launcher(&["status", "--run-dir", run.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains(&format!(": running (pid {pid})")) && out.contains("phase rl"), "{out}");
    assert!(!out.contains("throughput ?") && !out.contains("staleness ?"), "{out}");

    // Another up into it, fresh, resumed or dry, is refused naming the owner; the live run stays where it is.
    for extra in [&[][..], &["--resume"], &["--dry-run"]] {
        let o = up(&long, &run, extra).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{extra:?}: {}", err(&o));
        assert!(err(&o).contains(&format!("a live run owns this directory (pid {pid})")), "{extra:?}: {}", err(&o));
    }
    assert!(set_aside(&run).is_empty(), "the live run was moved: {:?}", set_aside(&run));
    let s: Value = serde_json::from_str(&std::fs::read_to_string(run.join("status.json")).unwrap()).unwrap();
    assert_eq!(s["pid"], pid);

    child.kill().unwrap();
    child.wait().unwrap();
    // Once the job is gone nobody owns the directory.
    let o = up(&long, &run, &["--dry-run"]).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let o = launcher(&["status", "--run-dir", run.to_str().unwrap()]);
    assert_eq!(code(&o), 1);
    assert!(stderr(&o).contains("--resume"), "{}", stderr(&o));
}

#[test]
fn a_finished_run_resumes_to_nothing_and_a_refused_resume_changes_no_file() {
    let tmp = tempfile::tempdir().unwrap();
    let tiny = recipe(tmp.path(), 2, "1e-4");
    let run = tmp.path().join("run");
    // An earlier run that nobody owns any more is set aside.
    std::fs::create_dir_all(&run).unwrap();
    std::fs::write(run.join("old.txt"), "earlier run").unwrap();
    std::fs::write(run.join(".lock"), "1").unwrap();
    let o = up(&tiny, &run, &[]).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    let aside = set_aside(&run);
    assert_eq!(aside.len(), 1, "{aside:?}");
    assert!(tmp.path().join(&aside[0]).join("old.txt").exists() && !run.join("old.txt").exists());

    let o = launcher(&["status", "--run-dir", run.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains(": finished (pid") && !stdout(&o).contains("throughput ?"), "{}", stdout(&o));

    // Resuming the finished run does nothing.
    let before = snapshot(&run);
    let o = up(&tiny, &run, &["--resume"]).output().unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", err(&o));
    assert!(err(&o).contains("nothing to resume"), "{}", err(&o));
    assert_eq!(snapshot(&run), before, "resuming a finished run changed files");

    // Its last `trained` record torn, and summary.json gone (as if killed just before it was written).
    let ledger = std::fs::read_to_string(run.join("ledger.jsonl")).unwrap();
    let last = ledger.rfind("{\"event\":\"trained\"").unwrap();
    std::fs::write(run.join("ledger.jsonl"), &ledger[..last + 20]).unwrap();
    std::fs::remove_file(run.join("summary.json")).unwrap();
    let before = snapshot(&run);
    // The same recipe name, another learning rate.
    let other = recipe(&tmp.path().join("elsewhere"), 2, "2e-4");
    for (r, says) in [(&other, "the run was started with another recipe"), (&tiny, "the ledger lost records, refusing to resume")] {
        let o = up(r, &run, &["--resume"]).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", err(&o));
        assert!(err(&o).contains(says), "{}", err(&o));
        assert_eq!(snapshot(&run), before, "a refused resume changed files");
    }
}

/// Kills a spinning shell when dropped (also when an assertion fails).
struct Spinner(std::process::Child);

impl Drop for Spinner {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn beside_a_busy_core_an_embedded_run_starts_again_waiting_passively_unless_told_otherwise() {
    let tmp = tempfile::tempdir().unwrap();
    let tiny = recipe(tmp.path(), 1, "1e-4");
    let _spin = Spinner(Command::new("sh").args(["-c", "while :; do :; done"]).spawn().unwrap());
    std::thread::sleep(Duration::from_millis(200));
    for (user_policy, restarts) in [(None, true), (Some("ACTIVE"), false)] {
        let run = tmp.path().join(format!("run-{restarts}"));
        let mut c = up(&tiny, &run, &[]);
        c.env_remove("OMP_WAIT_POLICY").env_remove("RLMESH_PASSIVE_WAIT_WHY");
        if let Some(p) = user_policy {
            c.env("OMP_WAIT_POLICY", p);
        }
        let child = c.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let pid = child.id();
        let o = child.wait_with_output().unwrap();
        assert_eq!(o.status.code(), Some(0), "{}", err(&o));
        let said = err(&o).matches("starting again with OMP_WAIT_POLICY=PASSIVE").count();
        let log = std::fs::read_to_string(run.join("progress.log")).unwrap();
        let logged = log.matches("OpenMP threads wait passively (OMP_WAIT_POLICY=PASSIVE): other programs kept").count();
        if restarts {
            assert_eq!((said, logged), (1, 1), "once on stderr, once in progress.log: {}\n{log}", err(&o));
            // exec: the run kept the pid its starter knows.
            let s: Value = serde_json::from_str(&std::fs::read_to_string(run.join("status.json")).unwrap()).unwrap();
            assert_eq!(s["pid"], pid);
        } else {
            assert_eq!((said, logged), (0, 0), "a policy the user set is kept: {}\n{log}", err(&o));
        }
        assert_eq!(String::from_utf8_lossy(&o.stdout).matches("\"wall_seconds\"").count(), 1, "one summary: the run ran once");
    }
}
