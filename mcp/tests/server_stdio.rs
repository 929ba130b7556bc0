//! A Python MCP server (the `mcp` package's MCPServer, pydantic-typed tools)
//! as a child on stdio: discovery, calls through the tool registry with the
//! schema check, results as text, and stateful per-rollout sessions.
mod common;
use common::*;
use rlmesh_core::tools::{ExecLimits, ToolRegistry};
use rlmesh_mcp::{register, McpError, McpServer, ServerSpec, SessionMode};
use serde_json::json;

const LIMITS: ExecLimits = ExecLimits { timeout_ms: 20_000, max_output_bytes: 4096, max_calls_per_turn: 8 };



fn counter(py: &str, name: &str) -> ServerSpec {
    ServerSpec {
        session: SessionMode::PerRollout,
        reset_tool: Some("reset".into()),
        reward_tool: Some("get_reward".into()),
        ..tools_server(py, name)
    }
}

#[test]
fn discovery_offers_the_tools_with_their_schemas_and_hides_reset_and_reward() {
    let py = require!(python());
    let server = McpServer::start(counter(&py, "counter")).unwrap();
    let names: Vec<&str> = server.tools().iter().map(|t| t.name.as_str()).collect();
    assert_eq!(names, ["add", "greet", "total", "area", "fail", "nap", "crash", "pid", "picture", "increment"]);
    let add = &server.tools()[0];
    assert_eq!(add.description, "Adds two integers.");
    assert_eq!(add.parameters["properties"]["b"], json!({"default": 0, "title": "B", "type": "integer"}));
    assert_eq!(add.parameters["required"], json!(["a"]));
    assert!(server.tools()[2].parameters["$defs"]["Item"].is_object(), "nested models come with their $defs");
}

#[test]
fn calls_through_the_registry_check_arguments_and_return_text() {
    let py = require!(python());
    let mut registry = ToolRegistry::from_names(&["calculator"], LIMITS).unwrap();
    register(&mut registry, &[tools_server(&py, "py")]).unwrap();
    let mut s = registry.session(&task("t", None)).unwrap();
    assert_eq!(s.schemas()[1]["function"]["name"], "add", "after the built-in calculator");
    let text = [
        call("add", json!({"a": 2})),
        call("greet", json!({"name": "Ada", "title": null, "punctuation": "."})),
        call("total", json!({"items": [{"name": "pen", "price": 1.5, "quantity": 2}], "discount": 0.5})),
        call("area", json!({"shape": {"kind": "square", "side": 3}})),
        call("picture", json!({})),
        call("fail", json!({"message": "the disk is full"})),
        call("add", json!({"a": "two"})),
        call("area", json!({"shape": {"kind": "square", "radius": 3}})),
    ]
    .concat();
    let turn = s.parse(&text);
    let steps = s.execute(0, &turn.calls);
    let results: Vec<&str> = steps.iter().map(|s| s.result.as_str()).collect();
    assert_eq!(
        results,
        [
            "2",
            "Hello, Ada.",
            "1.50",
            "9.00",
            "a red pixel\n[image: image/png, 8 bytes]",
            r#"{"error": "Error executing tool fail: the disk is full"}"#,
            r#"{"error": "invalid arguments for \"add\": argument \"a\": expected integer, got a string (\"two\")"}"#,
            r#"{"error": "invalid arguments for \"area\": missing required argument \"shape.side\""}"#,
        ]
    );
    assert_eq!(steps.iter().map(|s| s.success).collect::<Vec<_>>(), [true, true, true, true, true, false, false, false]);
    // A tool no server offers is the executor's error; the servers are not asked.
    let turn = s.parse(&call("delete_everything", json!({})));
    let step = s.execute(1, &turn.calls).remove(0);
    assert!(step.result.starts_with(r#"{"error": "unknown tool \"delete_everything\" (available: calculator, add, "#), "{}", step.result);
}

#[test]
fn per_rollout_sessions_hold_their_own_state_reset_by_env_state_and_graded_by_the_reward_tool() {
    let py = require!(python());
    let mut registry = ToolRegistry::new(LIMITS);
    let servers = register(&mut registry, &[counter(&py, "counter")]).unwrap();
    assert_eq!(servers[0].pid(), None, "a per-rollout server keeps no shared child");
    let (a_task, b_task) = (task("a", Some(json!({"start": 1, "target": 3}))), task("b", Some(json!({"start": 10, "target": 3}))));
    registry.check_task(&a_task).unwrap();
    let mut a = registry.session(&a_task).unwrap();
    let mut b = registry.session(&b_task).unwrap();
    assert_eq!(a.observation(), Some("counter at 1"));
    assert_eq!(b.observation(), Some("counter at 10"));
    let run = |s: &mut rlmesh_core::tools::ToolSession, text: &str| {
        let turn = s.parse(text);
        s.execute(0, &turn.calls).into_iter().map(|s| s.result).collect::<Vec<_>>()
    };
    assert_eq!(run(&mut a, &[call("increment", json!({})), call("increment", json!({}))].concat()), ["2", "3"]);
    assert_eq!(run(&mut b, &call("increment", json!({"by": 5}))), ["15"]);
    let (pa, pb) = (run(&mut a, &call("pid", json!({})))[0].clone(), run(&mut b, &call("pid", json!({})))[0].clone());
    assert_ne!(pa, pb, "each rollout has its own process");
    assert!(run(&mut a, &call("get_reward", json!({})))[0].starts_with(r#"{"error": "unknown tool \"get_reward\""#), "hidden from the model");
    assert_eq!(a.grades(), [("counter".to_string(), Ok(Some(1.0)))]);
    assert_eq!(b.grades(), [("counter".to_string(), Ok(Some(0.0)))]);
    // Without a target the reward tool gives no number: no grade, not 0.
    let c = registry.session(&task("c", None)).unwrap();
    assert_eq!(c.grades(), [("counter".to_string(), Ok(None))]);
    let pid: u32 = pa.parse().unwrap();
    drop(a);
    assert!(eventually(std::time::Duration::from_secs(5), || !alive(pid)), "a closed rollout's child is gone");
}

#[test]
fn a_shared_session_serves_every_rollout() {
    let py = require!(python());
    let server = McpServer::start(ServerSpec { reset_tool: Some("reset".into()), ..tools_server(&py, "shared") }).unwrap();
    let pid = server.pid().unwrap();
    let a = server.session(Some(&json!({"start": 5}))).unwrap();
    assert_eq!(a.call("increment", &json!({})).unwrap(), "6");
    let b = server.session(None).unwrap();
    assert_eq!(b.observation(), Some("counter at 0"), "a shared server's reset runs on every open");
    assert_eq!(a.call("increment", &json!({})).unwrap(), "1", "one state for all");
    assert_eq!(a.call("pid", &json!({})).unwrap(), pid.to_string());
    let e = server.session(Some(&json!([1]))).err().unwrap();
    assert_eq!(e.to_string(), "tool server \"shared\": env_state must be a JSON object (the reset tool's arguments), got [1]");
    let e = a.call("fail", &json!({"message": "no"})).unwrap_err();
    assert_eq!(e, McpError::Call { server: "shared".into(), tool: "fail".into(), reason: "Error executing tool fail: no".into() });
    assert!(alive(pid));
    drop((a, b, server));
    assert!(eventually(std::time::Duration::from_secs(5), || !alive(pid)));
}
