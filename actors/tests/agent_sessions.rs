//! Agent programs through the endpoint, as training runs them: real Python
//! programs with the stock `openai` client, a real endpoint on SmolLM2-135M
//! with per-rollout keys, real processes killed at their timeout.
use rlmesh_actors::rollout::agent::{assemble, AgentFailure, SessionShape};
use rlmesh_core::Task;
use rlmesh_model::Tokenizer;
use rlmesh_serve::agent::{run_agent, AgentExit, SessionTable};
use rlmesh_serve::batcher::{BatchPolicy, Batcher, Readiness};
use rlmesh_serve::engine::ModelEngine;
use rlmesh_serve::sessions::Auth;
use rlmesh_serve::{Endpoint, ServeConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn python() -> String {
    std::env::var("RLMESH_PYTHON").unwrap_or_else(|_| repo().join("scripts/py").display().to_string())
}

fn model_dir() -> PathBuf {
    let out = std::process::Command::new(repo().join("scripts/prepare-models.sh")).output().expect("run scripts/prepare-models.sh");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8(out.stdout).unwrap().lines().last().unwrap().trim()).join("smollm2-135m")
}

/// An endpoint whose keys are the table's sessions, on SmolLM2 with the Qwen2.5 tool template.
async fn endpoint(sessions: Arc<SessionTable>) -> (Endpoint, Arc<Tokenizer>) {
    let dir = model_dir();
    let mut tok = Tokenizer::load(&dir).unwrap();
    tok.set_chat_template(std::fs::read_to_string(repo().join("model/templates/qwen2.5-tools.jinja")).unwrap());
    let tok = Arc::new(tok);
    let t = tok.clone();
    let batcher = Batcher::spawn(move || ModelEngine::load(&dir, tch::Device::Cpu, t), BatchPolicy::default(), None);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let config = ServeConfig { auth: Auth::Sessions(sessions), any_model: true, ..ServeConfig::default() };
    let e = Endpoint::start(listener, config, tok.clone(), batcher).unwrap();
    while e.readiness() == Readiness::Loading {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (e, tok)
}

/// A test agent: `body` runs after `c = OpenAI(max_retries=0)` and `task = <the stdin row>`.
fn agent(dir: &Path, name: &str, body: &str) -> Vec<String> {
    let path = dir.join(format!("{name}.py"));
    let head = "import json, sys, os, subprocess, time\nfrom openai import OpenAI\nc = OpenAI(max_retries=0)\ntask = json.loads(sys.stdin.readline())\n";
    std::fs::write(&path, format!("{head}{body}")).unwrap();
    vec![python(), path.display().to_string()]
}

fn task() -> Task {
    Task { id: "t1".into(), prompt: "What is 12 times 9?".into(), ..Default::default() }
}

/// Two calls, the second after a tool result; each prints the ids the endpoint returned.
const TWO_CALLS: &str = r#"
msgs = [{"role": "user", "content": task["prompt"]}]
got = []
for turn in range(2):
    # Seeded: a reply cut at max_tokens can re-render into other tokens (then the
    # session is honestly segments), which an unseeded sample hit now and then.
    r = c.chat.completions.create(model="gpt-4o", messages=msgs, max_tokens=12, temperature=1.0, seed=7 + turn, extra_body={"return_token_ids": True})
    got.append({"prompt": r.prompt_token_ids, "ids": r.choices[0].token_ids})
    msgs.append(r.choices[0].message.model_dump(exclude_none=True))
    msgs.append({"role": "user", "content": "Are you sure?"})
    if REWRITE:
        msgs = msgs[-1:]  # a harness that drops history
print(json.dumps({"calls": got, "answer": "done"}))
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_trained_ids_are_the_ids_the_endpoint_sampled_and_a_rewriting_harness_makes_segments() {
    let sessions = Arc::new(SessionTable::new());
    let (e, tok) = endpoint(sessions.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    for (rewrite, shape) in [(false, SessionShape::Prefix), (true, SessionShape::Segments)] {
        let cmd = agent(dir.path(), "two", &format!("REWRITE = {}\n{TWO_CALLS}", if rewrite { "True" } else { "False" }));
        let key = sessions.open("r0");
        let row = serde_json::to_string(&task()).unwrap();
        let exit = run_agent(&cmd, &e.base_url(), &key, &row, Duration::from_secs(120)).await;
        let AgentExit::Exited { code: 0, last_line: Some(line), .. } = &exit else { panic!("{exit:?}") };
        let printed: serde_json::Value = serde_json::from_str(line).unwrap();
        let calls = sessions.close(&key);
        assert_eq!(calls.len(), 2);
        let s = assemble(&task(), 0, &calls, &tok).unwrap();
        assert_eq!(s.shape, shape);
        let sampled: Vec<u32> = printed["calls"].as_array().unwrap().iter().flat_map(|c| c["ids"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32)).collect();
        let trained: Vec<u32> =
            s.trajectories.iter().flat_map(|t| t.token_ids.iter().zip(&t.loss_mask).filter(|(_, &m)| m == 1).map(|(&id, _)| id)).collect();
        assert_eq!(trained, sampled, "the policy tokens trained are exactly those the agent received");
        match shape {
            SessionShape::Prefix => {
                let t = &s.trajectories[0];
                let second_prompt: Vec<u32> = printed["calls"][1]["prompt"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u32).collect();
                assert!(t.token_ids.starts_with(&second_prompt), "one sequence: the second prompt is its prefix");
                assert!(t.loss_mask[t.prompt_len..].contains(&0), "tokens between the calls are environment tokens");
                let lp: Vec<f32> = t.logprobs.iter().zip(&t.loss_mask).filter(|(_, &m)| m == 1).map(|(&l, _)| l).collect();
                assert!(lp.iter().all(|&l| l < 0.0 && l.is_finite()), "{lp:?}");
            }
            SessionShape::Segments => assert_eq!(s.trajectories.len(), 2, "one segment per call"),
        }
    }
    e.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crashing_hanging_and_silent_agents_fail_and_finished_keys_get_401() {
    let sessions = Arc::new(SessionTable::new());
    let (e, tok) = endpoint(sessions.clone()).await;
    let dir = tempfile::tempdir().unwrap();
    let row = serde_json::to_string(&task()).unwrap();
    // Crashes after one call: failed (never scored 0), whatever it called.
    let crash = agent(dir.path(), "crash", "c.chat.completions.create(model='m', messages=[{'role': 'user', 'content': 'hi'}], max_tokens=2)\nsys.exit(3)\n");
    let key = sessions.open("crash");
    let exit = run_agent(&crash, &e.base_url(), &key, &row, Duration::from_secs(60)).await;
    assert!(matches!(exit, AgentExit::Exited { code: 3, .. }), "{exit:?}");
    assert_eq!(sessions.close(&key).len(), 1);
    // Hangs with a child: both are killed at the timeout.
    let pidfile = dir.path().join("child.pid");
    let hang = agent(dir.path(), "hang", &format!("p = subprocess.Popen(['sleep', '300'])\nopen({:?}, 'w').write(str(p.pid))\ntime.sleep(300)\n", pidfile.display().to_string()));
    let key = sessions.open("hang");
    let started = std::time::Instant::now();
    let exit = run_agent(&hang, &e.base_url(), &key, &row, Duration::from_secs(3)).await;
    assert_eq!(exit, AgentExit::TimedOut);
    assert!(started.elapsed() < Duration::from_secs(10));
    let child: i32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    // SAFETY: signal 0 only asks whether the process exists.
    let alive = unsafe { libc::kill(child, 0) } == 0 && !std::fs::read_to_string(format!("/proc/{child}/stat")).unwrap_or_default().contains(") Z ");
    assert!(!alive, "the agent's child {child} was killed with it");
    // Exits 0 without a call: no rollout.
    let silent = agent(dir.path(), "silent", "print(json.dumps({'answer': '108'}))\n");
    let key = sessions.open("silent");
    let exit = run_agent(&silent, &e.base_url(), &key, &row, Duration::from_secs(60)).await;
    assert!(matches!(exit, AgentExit::Exited { code: 0, .. }), "{exit:?}");
    assert_eq!(assemble(&task(), 0, &sessions.close(&key), &tok), Err(AgentFailure::NoCall));
    // A finished session's key, and an unknown one: 401.
    let late = agent(dir.path(), "late", "import openai\ntry:\n    c.chat.completions.create(model='m', messages=[{'role': 'user', 'content': 'hi'}], max_tokens=2)\nexcept openai.AuthenticationError as e:\n    print(json.dumps({'status': e.status_code}))\n");
    for key in [key.clone(), "made-up".to_string()] {
        let exit = run_agent(&late, &e.base_url(), &key, &row, Duration::from_secs(60)).await;
        let AgentExit::Exited { code: 0, last_line: Some(line), .. } = &exit else { panic!("{exit:?}") };
        assert_eq!(line, r#"{"status": 401}"#);
    }
    e.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_agent_runs_a_calculator_task_through_the_endpoint() {
    let sessions = Arc::new(SessionTable::new());
    let (e, tok) = endpoint(sessions.clone()).await;
    let cmd = vec![python(), repo().join("examples/openai-agent/agent.py").display().to_string()];
    let key = sessions.open("example");
    let row = serde_json::to_string(&task()).unwrap();
    let exit = run_agent(&cmd, &e.base_url(), &key, &row, Duration::from_secs(120)).await;
    let AgentExit::Exited { code: 0, last_line: Some(line), stderr_tail } = &exit else { panic!("{exit:?}") };
    assert!(serde_json::from_str::<serde_json::Value>(line).unwrap().get("answer").is_some(), "{line} {stderr_tail}");
    let calls = sessions.close(&key);
    let s = assemble(&task(), 0, &calls, &tok).unwrap();
    assert!(s.trajectories.iter().all(|t| t.policy_tokens() > 0));
    e.shutdown().await;
}
