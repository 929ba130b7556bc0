//! Servers over Streamable HTTP: the test's Python server (uvicorn) and
//! server-everything's `streamableHttp` mode, shared and per-rollout sessions.
mod common;
use common::*;
use rlmesh_core::tools::{ExecLimits, ToolRegistry};
use rlmesh_mcp::{register, McpError, McpServer, ServerSpec, SessionMode};
use serde_json::json;
use std::time::Duration;

const LIMITS: ExecLimits = ExecLimits { timeout_ms: 20_000, max_output_bytes: 4096, max_calls_per_turn: 8 };


fn python_http(py: &str) -> ServerProcess {
    ServerProcess::start(&[py, &server_file("tools_server.py"), "http", "{port_file}"], "/mcp")
}

#[test]
fn a_python_server_over_http_serves_calls_and_per_rollout_sessions() {
    let py = require!(python());
    let process = python_http(&py);
    let spec = ServerSpec {
        session: SessionMode::PerRollout,
        reset_tool: Some("reset".into()),
        reward_tool: Some("get_reward".into()),
        ..ServerSpec::http("web", &process.url)
    };
    let mut registry = ToolRegistry::new(LIMITS);
    let servers = register(&mut registry, &[spec]).unwrap();
    assert_eq!(servers[0].tools().len(), 10);
    let mut a = registry.session(&task("a", Some(json!({"start": 1, "target": 2})))).unwrap();
    let mut b = registry.session(&task("b", Some(json!({"start": 7, "target": 2})))).unwrap();
    let run = |s: &mut rlmesh_core::tools::ToolSession, name: &str, args: serde_json::Value| {
        let turn = s.parse(&call(name, args));
        s.execute(0, &turn.calls).remove(0).result
    };
    assert_eq!(run(&mut a, "increment", json!({})), "2");
    assert_eq!(run(&mut b, "increment", json!({})), "8", "each rollout has its own HTTP session and state");
    assert_eq!(run(&mut a, "greet", json!({"name": "Ada"})), "Hello, Ada!");
    assert_eq!(run(&mut a, "greet", json!({"name": 7})), r#"{"error": "invalid arguments for \"greet\": argument \"name\": expected string, got an integer (7)"}"#);
    assert_eq!(a.grades(), [("web".to_string(), Ok(Some(1.0)))]);
    assert_eq!(b.grades(), [("web".to_string(), Ok(Some(0.0)))]);
}

#[test]
fn a_dead_http_server_fails_calls_until_it_is_back_then_the_budget_runs_out() {
    let py = require!(python());
    let process = python_http(&py);
    let spec = ServerSpec { max_restarts: 2, ..ServerSpec::http("web", &process.url) };
    let server = McpServer::start(spec).unwrap();
    let s = server.session(None).unwrap();
    assert_eq!(s.call("add", &json!({"a": 1, "b": 1})).unwrap(), "2");
    drop(process);
    let first = s.call("add", &json!({"a": 1})).unwrap_err();
    assert!(matches!(first, McpError::Died { .. }), "{first}");
    let mut last = first;
    for _ in 0..3 {
        last = s.call("add", &json!({"a": 1})).unwrap_err();
    }
    assert!(last.is_fatal(), "{last}");
    assert!(server.health().is_err());
}

#[test]
fn server_everything_over_http() {
    let entry = require!(everything());
    let process = ServerProcess::start(&["node", &entry, "streamableHttp", "{port}"], "/mcp");
    let server = McpServer::start(ServerSpec::http("everything", &process.url)).unwrap();
    let names: Vec<&str> = server.tools().iter().map(|t| t.name.as_str()).collect();
    assert!(names.contains(&"get-sum") && names.contains(&"echo"), "{names:?}");
    let s = server.session(None).unwrap();
    assert_eq!(s.call("get-sum", &json!({"a": 2, "b": 40})).unwrap(), "The sum of 2 and 40 is 42.");
    assert_eq!(s.call("echo", &json!({"message": "hi"})).unwrap(), "Echo: hi");
    drop(s);
    drop(server);
    std::thread::sleep(Duration::from_millis(100));
}
