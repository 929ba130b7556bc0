//! Command verifiers against real child processes written by the test: a good
//! one, one that answers out of order, one that sleeps past its timeout, one
//! that crashes, one that prints garbage, one that answers null. Every failure
//! is counted and unscorable, and no process is left behind.
mod common;
use common::*;
use rlmesh_verifiers::{Request, Score, Verifier, VerifierError, VerifierSpec};
use serde_json::json;
use std::process::{Command, Stdio};
use std::time::Duration;

fn start(dir: &std::path::Path, name: &str, body: &str, timeout_ms: u64, max_restarts: u32) -> Verifier {
    let path = script(dir, &format!("{name}.py"), body);
    let spec = VerifierSpec {
        timeout: Duration::from_millis(timeout_ms),
        max_restarts,
        ..VerifierSpec::command(name, [python(), path.display().to_string()])
    };
    Verifier::start(spec).unwrap()
}

fn pid(v: &Verifier) -> u32 {
    match v {
        Verifier::Command(c) => c.pid().expect("running"),
        Verifier::Http(_) => unreachable!(),
    }
}

fn unscorable(s: &Score) -> &str {
    match s {
        Score::Unscorable { reason } => reason,
        other => panic!("expected unscorable, got {other:?}"),
    }
}

#[test]
fn a_good_verifier_scores_answers_nulls_and_errors() {
    let dir = tempfile::tempdir().unwrap();
    let v = start(dir.path(), "good", GOOD, 10_000, 1);
    let (right, wrong, null, error) =
        (task("408", json!({})), task("408", json!({})), task("408", json!({"mode": "null"})), task("408", json!({"mode": "error"})));
    let (m_right, m_wrong) = (messages("408"), messages("407"));
    let reqs = [
        Request { task: &right, messages: &m_right, completion: "408" },
        Request { task: &wrong, messages: &m_wrong, completion: "407" },
        Request { task: &null, messages: &m_right, completion: "408" },
        Request { task: &error, messages: &m_right, completion: "408" },
    ];
    let scores = v.score_all(&reqs);
    assert_eq!(scores[..3], [Score::Value(1.0), Score::Value(0.0), Score::NotApplicable]);
    assert_eq!(unscorable(&scores[3]), "the verifier said: cannot parse the answer");
    let s = v.stats();
    assert_eq!((s.requests, s.scored, s.not_applicable, s.errors, s.unscorable()), (4, 2, 1, 1, 1));
    let p = pid(&v);
    drop(v);
    assert!(gone_within(p, Duration::from_secs(2)), "the verifier process is gone after drop");
}

#[test]
fn answers_out_of_order_are_matched_by_id() {
    let dir = tempfile::tempdir().unwrap();
    // Holds two requests, answers the second first; the score is the task's info.value.
    let reorder = r#"
import json, sys
held = []
for line in sys.stdin:
    held.append(json.loads(line))
    if len(held) == 2:
        for req in reversed(held):
            print(json.dumps({"id": req["id"], "score": req["task"]["info"]["value"]}))
        held = []
"#;
    let v = start(dir.path(), "reorder", reorder, 10_000, 1);
    let tasks: Vec<_> = (0..4).map(|i| task("x", json!({"value": i}))).collect();
    let m = messages("x");
    let reqs: Vec<Request> = tasks.iter().map(|t| Request { task: t, messages: &m, completion: "x" }).collect();
    assert_eq!(v.score_all(&reqs), (0..4).map(|i| Score::Value(i as f64)).collect::<Vec<_>>());
}

#[test]
fn a_verifier_that_sleeps_past_its_timeout_is_unscorable_and_restarted() {
    let dir = tempfile::tempdir().unwrap();
    let v = start(dir.path(), "slow", GOOD, 400, 3);
    let first = pid(&v);
    let slow = task("408", json!({"mode": "sleep", "seconds": 30}));
    let m = messages("408");
    let s = v.score(&Request { task: &slow, messages: &m, completion: "408" });
    assert_eq!(unscorable(&s), "no answer within 400ms");
    assert_eq!(v.stats().timeouts, 1);
    // Silent since the request: taken as hung, killed and started again; the next request is scored.
    assert!(gone_within(first, Duration::from_secs(3)), "the hung process is killed");
    let quick = task("408", json!({}));
    let s = v.score(&Request { task: &quick, messages: &m, completion: "408" });
    assert_eq!(s, Score::Value(1.0));
    let st = v.stats();
    assert_eq!((st.restarts, st.crashes, st.timeouts, st.scored), (1, 0, 1, 1));
    assert_ne!(pid(&v), first);
}

#[test]
fn a_crashing_verifier_is_restarted_within_its_budget_then_given_up() {
    let dir = tempfile::tempdir().unwrap();
    let crash = r#"
import sys
for line in sys.stdin:
    sys.stderr.write("boom: cannot import grader\n")
    sys.stderr.flush()
    sys.exit(3)
"#;
    let v = start(dir.path(), "crash", crash, 5_000, 2);
    let t = task("408", json!({}));
    let m = messages("408");
    let req = Request { task: &t, messages: &m, completion: "408" };
    for _ in 0..3 {
        let s = v.score(&req);
        let reason = unscorable(&s);
        assert!(reason.starts_with("the verifier process exited (exit status: 3)"), "{reason}");
        assert!(reason.contains("boom: cannot import grader"), "the end of its stderr: {reason}");
    }
    // Past max_restarts = 2: given up, and every request fails at once.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while v.given_up().is_none() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(v.given_up().unwrap().contains("after 2 restart(s) (max_restarts = 2)"), "{:?}", v.given_up());
    let s = v.score(&req);
    assert!(unscorable(&s).starts_with("the verifier was given up: "), "{s:?}");
    let st = v.stats();
    assert_eq!((st.crashes, st.restarts, st.lost, st.given_up, st.unscorable()), (3, 2, 3, 1, 4));
}

#[test]
fn a_verifier_that_crashes_once_recovers_after_its_restart() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("crashed-once");
    let body = format!(
        "import json, os, sys\nfor line in sys.stdin:\n    if not os.path.exists({m:?}):\n        open({m:?}, 'w').close()\n        os._exit(1)\n    req = json.loads(line)\n    print(json.dumps({{\"id\": req[\"id\"], \"score\": 0.5}}))\n",
        m = marker.display().to_string()
    );
    let v = start(dir.path(), "once", &body, 5_000, 1);
    let t = task("x", json!({}));
    let m = messages("x");
    let req = Request { task: &t, messages: &m, completion: "x" };
    assert!(v.score(&req).is_unscorable());
    assert_eq!(v.score(&req), Score::Value(0.5));
    assert_eq!((v.stats().crashes, v.stats().restarts), (1, 1));
}

#[test]
fn garbage_lines_are_counted_and_fail_the_affected_request() {
    let dir = tempfile::tempdir().unwrap();
    // First request: a debug print instead of a response. Second: a response with a bad score. Third: good.
    let garbage = r#"
import json, sys
n = 0
for line in sys.stdin:
    req = json.loads(line)
    n += 1
    if n == 1:
        print("debug: got a request")
    elif n == 2:
        print(json.dumps({"id": req["id"], "score": "high"}))
    else:
        print(json.dumps({"id": req["id"], "score": 1}))
"#;
    let v = start(dir.path(), "garbage", garbage, 5_000, 1);
    let t = task("x", json!({}));
    let m = messages("x");
    let req = Request { task: &t, messages: &m, completion: "x" };
    let first = v.score(&req);
    assert_eq!(
        unscorable(&first),
        r#"not a valid response: not a response object: "debug: got a request" (stdout is for responses only; log to stderr)"#
    );
    let second = v.score(&req);
    assert_eq!(unscorable(&second), r#"not a valid response: "score" must be a number or null, got "high""#);
    assert_eq!(v.score(&req), Score::Value(1.0));
    let st = v.stats();
    assert_eq!((st.bad_responses, st.scored, st.restarts, st.unscorable()), (2, 1, 0, 2));
}

#[test]
fn a_verifier_that_returns_null_does_not_apply() {
    let dir = tempfile::tempdir().unwrap();
    let null = "import json, sys\nfor line in sys.stdin:\n    print(json.dumps({'id': json.loads(line)['id'], 'score': None}))\n";
    let v = start(dir.path(), "null", null, 5_000, 1);
    let t = task("x", json!({}));
    let m = messages("x");
    assert_eq!(v.score(&Request { task: &t, messages: &m, completion: "x" }), Score::NotApplicable);
    assert_eq!((v.stats().not_applicable, v.stats().unscorable()), (1, 0));
}

#[test]
fn the_request_carries_the_task_row_the_messages_and_the_completion() {
    let dir = tempfile::tempdir().unwrap();
    // Scores 1 only if every documented key is where the protocol says.
    let check = r#"
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    t = r["task"]
    ok = (t["answer"] == "408" and t["info"] == {"k": 1} and t["prompt"] == "What is 17 * 24?"
          and r["messages"][-1] == {"role": "assistant", "content": "408", "tool_calls": None, "name": None}
          and r["completion"] == "408" and isinstance(r["id"], int))
    print(json.dumps({"id": r["id"], "score": 1 if ok else 0}))
"#;
    let v = start(dir.path(), "check", check, 5_000, 1);
    let t = task("408", json!({"k": 1}));
    let m = messages("408");
    assert_eq!(v.score(&Request { task: &t, messages: &m, completion: "408" }), Score::Value(1.0));
}

#[test]
fn a_verifier_that_cannot_start_is_refused_with_its_stderr() {
    let e = Verifier::start(VerifierSpec::command("nope", ["/no/such/verifier-program"])).err().unwrap();
    assert!(matches!(e, VerifierError::Start { .. }), "{e}");
    assert!(e.to_string().starts_with("verifier \"nope\": `/no/such/verifier-program` did not start: "), "{e}");
    let spec = VerifierSpec::command("dies", [python().as_str(), "-c", "import sys; sys.stderr.write('ModuleNotFoundError: grader'); sys.exit(1)"]);
    let e = Verifier::start(spec).err().unwrap().to_string();
    assert!(e.contains("it ended at once (exit status: 1); stderr: ModuleNotFoundError: grader"), "{e}");
    assert!(matches!(Verifier::start(VerifierSpec::command("empty", Vec::<String>::new())), Err(VerifierError::Invalid { .. })));
}

#[test]
fn drop_kills_the_whole_process_group() {
    let dir = tempfile::tempdir().unwrap();
    let pidfile = dir.path().join("grandchild.pid");
    // The verifier starts a grandchild of its own (a sleeping helper) and records its pid.
    let body = format!(
        "import json, subprocess, sys\np = subprocess.Popen(['sleep', '60'])\nopen({f:?}, 'w').write(str(p.pid))\nfor line in sys.stdin:\n    print(json.dumps({{'id': json.loads(line)['id'], 'score': 1}}))\n",
        f = pidfile.display().to_string()
    );
    let v = start(dir.path(), "spawner", &body, 5_000, 1);
    let t = task("x", json!({}));
    let m = messages("x");
    assert_eq!(v.score(&Request { task: &t, messages: &m, completion: "x" }), Score::Value(1.0));
    let grandchild: u32 = std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap();
    let child = pid(&v);
    assert!(alive(grandchild) && alive(child));
    drop(v);
    assert!(gone_within(child, Duration::from_secs(2)), "the verifier is gone");
    assert!(gone_within(grandchild, Duration::from_secs(2)), "and what it started");
    assert!(processes_mentioning(&dir.path().display().to_string()).is_empty(), "nothing of this test runs");
}

/// Not a test by itself: the child process of
/// `a_verifier_dies_with_the_process_that_started_it`, which holds a verifier
/// until it is killed.
#[test]
fn helper_holds_a_verifier_until_killed() {
    let Ok(path) = std::env::var("RLMESH_VERIFIER_HELPER_SCRIPT") else { return };
    let v = Verifier::start(VerifierSpec::command("held", [python(), path])).unwrap();
    let out = std::env::var("RLMESH_VERIFIER_HELPER_PIDFILE").unwrap();
    std::fs::write(out, pid(&v).to_string()).unwrap();
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn a_verifier_dies_with_the_process_that_started_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = script(dir.path(), "held.py", GOOD);
    let pidfile = dir.path().join("verifier.pid");
    let mut helper = Command::new(std::env::current_exe().unwrap())
        .args(["helper_holds_a_verifier_until_killed", "--exact", "--test-threads=1"])
        .env("RLMESH_VERIFIER_HELPER_SCRIPT", &path)
        .env("RLMESH_VERIFIER_HELPER_PIDFILE", &pidfile)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut verifier = None;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while verifier.is_none() && std::time::Instant::now() < deadline {
        verifier = std::fs::read_to_string(&pidfile).ok().and_then(|t| t.trim().parse::<u32>().ok());
        std::thread::sleep(Duration::from_millis(20));
    }
    let verifier = verifier.expect("the helper reports its verifier's pid");
    assert!(alive(verifier));
    helper.kill().unwrap(); // SIGKILL: no destructor runs
    helper.wait().unwrap();
    assert!(gone_within(verifier, Duration::from_secs(3)), "the verifier outlived its parent");
}
