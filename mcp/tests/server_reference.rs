//! The reference servers users will point rlmesh at: `mcp-server-time` from
//! PyPI and `@modelcontextprotocol/server-everything` from npm, over stdio:
//! discovery, a call, and the argument check on their schemas.
mod common;
use common::*;
use rlmesh_core::tools::{ExecLimits, ToolRegistry};
use rlmesh_mcp::{register, ServerSpec};
use serde_json::{json, Value};

const LIMITS: ExecLimits = ExecLimits { timeout_ms: 20_000, max_output_bytes: 8192, max_calls_per_turn: 8 };


fn run(registry: &ToolRegistry, name: &str, args: Value) -> (bool, String) {
    let mut s = registry.session(&task("t", None)).unwrap();
    let turn = s.parse(&call(name, args));
    let step = s.execute(0, &turn.calls).remove(0);
    (step.success, step.result)
}

#[test]
fn mcp_server_time_from_pypi() {
    let py = require!(python());
    let mut registry = ToolRegistry::from_names(&["calculator"], LIMITS).unwrap();
    register(&mut registry, &[ServerSpec::stdio("time", [py.as_str(), "-m", "mcp_server_time", "--local-timezone", "Etc/UTC"])]).unwrap();
    let names: Vec<String> = registry.specs_for(&task("t", None)).unwrap().into_iter().map(|s| s.name).collect();
    assert_eq!(names, ["calculator", "get_current_time", "convert_time"]);
    let (ok, text) = run(&registry, "convert_time", json!({"source_timezone": "Europe/Paris", "time": "12:00", "target_timezone": "Asia/Tokyo"}));
    assert!(ok, "{text}");
    let v: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(v["source"]["timezone"], "Europe/Paris");
    assert_eq!(v["target"]["timezone"], "Asia/Tokyo");
    let (ok, text) = run(&registry, "get_current_time", json!({"timezone": "Mars/Olympus"}));
    assert!(!ok && text.contains("Mars/Olympus"), "the server's own error: {text}");
    let (_, text) = run(&registry, "convert_time", json!({"source_timezone": "Europe/Paris"}));
    assert_eq!(text, r#"{"error": "invalid arguments for \"convert_time\": missing required argument \"time\""}"#);
}

#[test]
fn server_everything_from_npm() {
    let entry = require!(everything());
    // The run's cookie stays out of a tool server's environment; the spec's env goes in.
    std::env::set_var("RLMESH_COOKIE", "0123456789abcdef");
    let mut spec = ServerSpec::stdio("everything", ["node", entry.as_str(), "stdio"]);
    spec.env.insert("TOOLS_MODE".into(), "test".into());
    let mut registry = ToolRegistry::new(LIMITS);
    let servers = register(&mut registry, &[spec]).unwrap();
    let (ok, env) = run(&registry, "get-env", json!({}));
    assert!(ok && env.contains("\"TOOLS_MODE\": \"test\"") && env.contains("\"PATH\""), "{env}");
    assert!(!env.contains("RLMESH_COOKIE") && !env.contains("0123456789abcdef"), "{env}");
    let tools = servers[0].tools();
    let links = tools.iter().find(|t| t.name == "get-resource-links").unwrap();
    assert_eq!(links.parameters["properties"]["count"]["default"], 3, "its schemas carry defaults");
    // Defaults make arguments optional; bounds and enums are checked before the call is sent.
    let (ok, text) = run(&registry, "get-resource-links", json!({}));
    assert!(ok && text.contains("[resource link: "), "{text}");
    assert_eq!(run(&registry, "get-sum", json!({"a": 1.5, "b": 2})), (true, "The sum of 1.5 and 2 is 3.5.".to_string()));
    let (ok, text) = run(&registry, "get-resource-links", json!({"count": 11}));
    assert!(!ok);
    assert_eq!(text, r#"{"error": "invalid arguments for \"get-resource-links\": argument \"count\": expected at most 10, got an integer (11)"}"#);
    let (_, text) = run(&registry, "get-annotated-message", json!({"messageType": "fatal"}));
    assert_eq!(text, r#"{"error": "invalid arguments for \"get-annotated-message\": argument \"messageType\": expected one of [\"error\", \"success\", \"debug\"], got a string (\"fatal\")"}"#);
    let (ok, text) = run(&registry, "get-tiny-image", json!({}));
    assert!(ok && text.contains("[image: image/png, "), "{text}");
}
