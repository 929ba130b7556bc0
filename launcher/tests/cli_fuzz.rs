//! The JSON commands (`score`, `render`, `advantages`, `reward`) and `plan`
//! through the real binary on mutated inputs (issue 19, "Also"): each run ends
//! by itself within 60 s with exit 0 or 2 — no panic (101), no abort (134), no
//! signal — and its peak memory stays under 1.5 GiB. The bulk of the cases run
//! in-process (core/tests/offline_fuzz.rs, actors/tests/controller_fuzz.rs);
//! these few check the binary's own reading and limits.
mod common;

use common::*;
use rlmesh_actors::controller::init::{create_tiny_model, TinySpec};
use serde_json::json;
use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Peak resident memory any one run may reach (libtorch alone takes a few hundred MiB).
const MAX_RSS_KIB: i64 = 1536 << 10;

/// xorshift64*: a small deterministic generator (state never 0).
struct Rng(u64);

impl Rng {
    /// Uniform-enough index below `n`.
    fn below(&mut self, n: usize) -> usize {
        let x = &mut self.0;
        *x ^= *x >> 12;
        *x ^= *x << 25;
        *x ^= *x >> 27;
        (x.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1) as u64) as usize
    }
}

/// Text that replaces a piece of JSON: extremes, non-JSON numbers, wrong types, odd roles.
const SPLICES: &[&str] = &[
    "1e308", "-1e308", "1e400", "NaN", "Infinity", "-0", "4294967296", "99999999999999999999", "null", "true", "\"x\"", "[]", "{}",
    "[[[[[[[[[[", "\"narrator\"", "\"tool\"", "\"\\ud800\"", "0.5", "-1",
];

/// One text mutation of a JSON line: a token replaced by a splice, a cut, or a duplicated array body.
fn mutate(text: &str, rng: &mut Rng) -> String {
    let boundaries: Vec<usize> = text.char_indices().filter(|(_, c)| matches!(c, ',' | ':' | '[' | ']' | '{' | '}')).map(|(i, _)| i).collect();
    let at = boundaries.get(rng.below(boundaries.len())).copied().unwrap_or(0);
    match rng.below(4) {
        0 | 1 => {
            let end = text[at + 1..].find([',', ']', '}']).map_or(text.len(), |e| at + 1 + e);
            format!("{}{}{}", &text[..=at], SPLICES[rng.below(SPLICES.len())], &text[end..])
        }
        2 => text[..at].to_string(),
        _ => match (text.find('['), text.rfind(']')) {
            (Some(a), Some(b)) if a < b => format!("{}{}{}", &text[..=a], vec![&text[a + 1..b]; 2 + rng.below(200)].join(","), &text[b..]),
            _ => text.to_string(),
        },
    }
}

/// Exit code and stderr of `launcher ARGS`, after checking its time, exit (not a signal, 0 or 2) and peak memory.
fn run_bounded(args: &[&str]) -> (i32, String) {
    // Reaped below by wait4, which also reports the peak memory.
    #[allow(clippy::zombie_processes)]
    let mut child = Command::new(env!("CARGO_BIN_EXE_launcher"))
        .args(args)
        .current_dir(repo())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut err_pipe = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err_pipe.read_to_string(&mut s);
        s
    });
    let pid = child.id() as libc::pid_t;
    let deadline = Instant::now() + Duration::from_secs(60);
    let (status, rss) = loop {
        let mut status = 0;
        // SAFETY: rusage is plain data, filled by wait4.
        let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
        // SAFETY: waits for our own child only.
        let r = unsafe { libc::wait4(pid, &mut status, libc::WNOHANG, &mut usage) };
        if r == pid {
            break (status, usage.ru_maxrss);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{args:?}: still running after 60 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let err = reader.join().unwrap();
    assert!(libc::WIFEXITED(status), "{args:?}: killed by signal {}: {err}", libc::WTERMSIG(status));
    let code = libc::WEXITSTATUS(status);
    assert!(code == 0 || code == 2, "{args:?}: exit {code}: {err}");
    assert!(rss < MAX_RSS_KIB, "{args:?}: peak memory {} MiB", rss >> 10);
    (code, err)
}

/// Runs `command` on `cases` mutations of `valid` (a file per case), asserting run_bounded's checks and that refusals name the file.
fn fuzz(dir: &Path, command: &[&str], valid: &str, seed: u64, cases: usize) {
    let mut rng = Rng(seed);
    let mut refused = 0;
    for case in 0..cases {
        let mut text = valid.to_string();
        for _ in 0..=rng.below(3) {
            text = mutate(&text, &mut rng);
        }
        let path = dir.join(format!("{}-{case}.json", command[0]));
        std::fs::write(&path, &text).unwrap();
        let args: Vec<&str> = command.iter().copied().chain(["--input", path.to_str().unwrap()]).collect();
        let (code, err) = run_bounded(&args);
        if code == 2 {
            assert!(err.contains(&format!("{}-{case}.json", command[0])), "{args:?}: {err}\n---\n{text}");
            refused += 1;
        }
    }
    assert!(refused > 0, "{command:?}: no mutation was refused");
}

#[test]
fn advantages_and_reward_binaries_on_mutated_input() {
    let dir = tempfile::tempdir().unwrap();
    let adv = json!({"estimator": "steptool", "params": {"gamma": 0.9, "lam": 0.8},
                     "groups": [[{"loss_mask": [0, 1, 1, 0, 1], "step_rewards": [1.0, 0.5], "values": [0.0, 0.1, 0.2, 0.3, 0.4]}]]});
    fuzz(dir.path(), &["advantages"], &adv.to_string(), 1, 12);
    let grpo = json!({"estimator": "grpo", "params": {"scale_rewards": "none"},
                      "groups": [[{"loss_mask": [0, 1], "rewards": [1.0]}, {"loss_mask": [1, 1], "rewards": [0.0]}]]});
    fuzz(dir.path(), &["advantages"], &grpo.to_string(), 2, 12);
    let task = json!({"requires_tool": true, "allowed_tools": ["calculator"],
                      "gold_tool_calls": [[{"name": "calculator", "arguments": {"expression": "17*24"}}]], "expected_answer": "408"});
    let line = json!({"reward": "hierr", "task": task, "completion": "<tool_call>{\"name\": \"calculator\"}</tool_call>408", "judge_score": 3});
    fuzz(dir.path(), &["reward"], &line.to_string(), 3, 12);
}

#[test]
fn render_and_score_binaries_on_mutated_input() {
    let dir = tempfile::tempdir().unwrap();
    let smol = models_dir().join("smollm2-135m");
    let req = json!({"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                                  {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {"name": "calculator", "arguments": {"expression": "1+1"}}}]},
                                  {"role": "tool", "name": "calculator", "content": "2"}],
                     "tools": [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}], "add_generation_prompt": true});
    fuzz(dir.path(), &["render", "--model", smol.to_str().unwrap()], &req.to_string(), 4, 12);
    let spec = TinySpec { hidden: 16, layers: 1, heads: 2, kv_heads: 1, intermediate: 32 };
    let model = create_tiny_model(&dir.path().join("tiny"), &smol, spec, 5).unwrap();
    let seqs = json!({"token_ids": [1, 5, 9, 63, 2, 49151]});
    fuzz(dir.path(), &["score", "--model", model.to_str().unwrap()], &seqs.to_string(), 5, 12);
}

#[test]
fn plan_binary_on_a_huge_placement_and_a_mutated_topology() {
    let dir = tempfile::tempdir().unwrap();
    let local = std::fs::read_to_string(repo().join("deploy/local.toml")).unwrap();
    for (n, from, to) in [
        (0, "actors = 1, process = \"main\" }]", "actors = 4000000000, process = \"main\" }]"),
        (1, "actors = 1, process = \"main\" }]", "actors = 99999999999999999999, process = \"main\" }]"),
        (2, "ranks = 1", "ranks = 4294967295"),
        (3, "control = 29500", "control = 0"),
    ] {
        let path = dir.path().join(format!("t{n}.toml"));
        std::fs::write(&path, local.replacen(from, to, 1)).unwrap();
        let (code, err) = run_bounded(&["plan", path.to_str().unwrap()]);
        assert_eq!(code, 2, "{to}: {err}");
        assert!(err.contains(&format!("t{n}.toml:")) && err.contains("field \""), "{to}: {err}");
    }
}
