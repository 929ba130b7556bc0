//! HTTP verifiers against a tiny Python `http.server` the test starts on an
//! ephemeral loopback port: scores, null, a timeout, a 500, garbage, a
//! refused connection — each failure counted and unscorable.
mod common;
use common::*;
use rlmesh_verifiers::{Request, Score, Verifier, VerifierSpec};
use serde_json::json;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

const SERVER: &str = r#"
import json, sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["content-length"])))
        mode = (req["task"].get("info") or {}).get("mode", "grade")
        status, body = 200, None
        if mode == "sleep":
            time.sleep(5)
        if mode == "500":
            status, body = 500, b"internal error: grader crashed"
        elif mode == "garbage":
            body = b"<html>not json</html>"
        elif mode == "null":
            body = json.dumps({"id": req["id"], "score": None}).encode()
        elif mode == "wrong-id":
            body = json.dumps({"id": req["id"] + 1000, "score": 1}).encode()
        else:
            body = json.dumps({"id": req["id"], "score": 1.0 if req["completion"] == req["task"]["answer"] else 0.0}).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"#;

/// The server process; killed when dropped.
struct Server(Child, u16);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn server(dir: &std::path::Path) -> Server {
    let path = script(dir, "server.py", SERVER);
    let mut child = Command::new(python()).arg(path).stdout(Stdio::piped()).stderr(Stdio::inherit()).spawn().unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let port = line.trim().parse().unwrap_or_else(|_| panic!("the server's port, got {line:?}"));
    Server(child, port)
}

#[test]
fn an_http_verifier_scores_and_counts_every_failure() {
    let dir = tempfile::tempdir().unwrap();
    let srv = server(dir.path());
    let spec = VerifierSpec { timeout: Duration::from_millis(800), ..VerifierSpec::url("web", format!("http://127.0.0.1:{}/score", srv.1)) };
    let v = Verifier::start(spec).unwrap();
    let mode = |m: &str| task("408", json!({"mode": m}));
    let tasks = [mode("grade"), mode("grade"), mode("null"), mode("sleep"), mode("500"), mode("garbage"), mode("wrong-id")];
    let (right, wrong) = (messages("408"), messages("7"));
    let reqs: Vec<Request> = tasks
        .iter()
        .enumerate()
        .map(|(i, t)| Request { task: t, messages: if i == 1 { &wrong } else { &right }, completion: if i == 1 { "7" } else { "408" } })
        .collect();
    let scores = v.score_all(&reqs);
    assert_eq!(scores[..3], [Score::Value(1.0), Score::Value(0.0), Score::NotApplicable]);
    let reason = |s: &Score| match s {
        Score::Unscorable { reason } => reason.clone(),
        other => panic!("expected unscorable, got {other:?}"),
    };
    assert_eq!(reason(&scores[3]), "no answer within 800ms");
    assert_eq!(reason(&scores[4]), r#"HTTP 500 Internal Server Error: "internal error: grader crashed""#);
    assert_eq!(reason(&scores[5]), r#"not a valid response: not a response object: "<html>not json</html>""#);
    assert!(reason(&scores[6]).starts_with("not a valid response: it names id 1007"), "{}", reason(&scores[6]));
    let st = v.stats();
    assert_eq!((st.requests, st.scored, st.not_applicable, st.timeouts, st.lost, st.bad_responses), (7, 2, 1, 1, 1, 2));
    assert_eq!(st.unscorable(), 4);

    // Called from inside an async runtime, it neither panics nor blocks that runtime's own verifier.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let s = rt.block_on(async { v.score(&reqs[0]) });
    assert_eq!(s, Score::Value(1.0));
    drop(v);
    drop(rt);
}

#[test]
fn a_refused_connection_is_unscorable() {
    // A port that was just free: nothing listens there.
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let v = Verifier::start(VerifierSpec { timeout: Duration::from_secs(2), ..VerifierSpec::url("gone", format!("http://127.0.0.1:{port}/")) }).unwrap();
    let t = task("x", json!({}));
    let m = messages("x");
    let s = v.score(&Request { task: &t, messages: &m, completion: "x" });
    assert!(matches!(&s, Score::Unscorable { reason } if reason.starts_with("HTTP request failed")), "{s:?}");
    assert_eq!(v.stats().lost, 1);
    assert!(Verifier::start(VerifierSpec::url("bad", "ftp://x")).is_err());
}
