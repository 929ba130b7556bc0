//! Servers that fail: refused at start with their name and stderr; a hung or
//! dead server restarted with back-off; past the restart budget, a fatal
//! error the run can detect.
mod common;
use common::*;
use rlmesh_core::tools::{calculator, ExecLimits, ToolRegistry};
use rlmesh_mcp::{register, McpError, McpServer, ServerSpec, SessionMode};
use serde_json::json;
use std::time::{Duration, Instant};

const LIMITS: ExecLimits = ExecLimits { timeout_ms: 20_000, max_output_bytes: 4096, max_calls_per_turn: 8 };

fn start_err(spec: ServerSpec) -> String {
    McpServer::start(spec).expect_err("the start should fail").to_string()
}

#[test]
fn a_server_that_cannot_start_is_refused_with_its_name_and_stderr() {
    let e = start_err(ServerSpec::stdio("ghost", ["/nonexistent/mcp-server"]));
    assert_eq!(e, "tool server \"ghost\" could not start: cannot run \"/nonexistent/mcp-server\": No such file or directory (os error 2)");
    let e = start_err(ServerSpec::stdio("quitter", ["sh", "-c", "echo starting >&2; echo 'fatal: TOOLS_DB is not set' >&2; exit 3"]));
    assert!(e.starts_with("tool server \"quitter\" could not start: initialize failed: "), "{e}");
    assert!(e.ends_with("; its stderr ends:\nstarting\nfatal: TOOLS_DB is not set"), "{e}");
    let e = start_err(ServerSpec { start_timeout_s: 0.5, ..ServerSpec::stdio("mute", ["sh", "-c", "echo waiting forever >&2; exec sleep 60"]) });
    assert_eq!(e, "tool server \"mute\" could not start: no answer to initialize within 500ms; its stderr ends:\nwaiting forever");
    let e = start_err(ServerSpec::http("nowhere", format!("http://127.0.0.1:{}/mcp", free_port())));
    assert!(e.starts_with("tool server \"nowhere\" could not start: initialize at http://127.0.0.1:"), "{e}");
    let e = start_err(ServerSpec { url: Some("http://x".into()), ..ServerSpec::stdio("both", ["x"]) });
    assert_eq!(e, "tool server \"both\": command, url: give one of them, not both");
}

#[test]
fn a_python_server_that_crashes_at_import_shows_its_traceback() {
    let py = require!(python());
    let e = start_err(ServerSpec::stdio("broken", [py.as_str(), "-c", "import tools_that_do_not_exist"]));
    assert!(e.starts_with("tool server \"broken\" could not start: initialize failed"), "{e}");
    assert!(e.ends_with("ModuleNotFoundError: No module named 'tools_that_do_not_exist'"), "{e}");
}

#[test]
fn unusable_tool_lists_are_refused_naming_the_server() {
    let py = require!(python());
    let e = start_err(raw_server(&py, "empty", json!([])));
    assert_eq!(e, "tool server \"empty\": lists no tools");
    let hidden_only = json!([{"name": "reset", "inputSchema": {"type": "object"}}]);
    let e = start_err(ServerSpec { reset_tool: Some("reset".into()), ..raw_server(&py, "hidden", hidden_only) });
    assert_eq!(e, "tool server \"hidden\": lists no tools besides its reset and reward tools");
    let e = start_err(ServerSpec { reward_tool: Some("score".into()), ..tools_server(&py, "py") });
    assert!(e.starts_with("tool server \"py\": reward_tool \"score\" is not among its tools (add, greet, "), "{e}");

    let mut registry = ToolRegistry::new(LIMITS);
    registry.add_tool(calculator::tool()).unwrap();
    let bad = json!([{"name": "lookup", "inputSchema": {"type": "object", "properties": {"key": {"type": "str"}}}}]);
    let e = register(&mut registry, &[raw_server(&py, "sloppy", bad)]).unwrap_err();
    assert!(matches!(e, McpError::Registry(_)));
    assert_eq!(e.to_string(), "tool source \"sloppy\": tool \"lookup\": bad parameter schema: properties.key.type: unknown type \"str\" (JSON types: string, integer, number, boolean, array, object, null)");
    let clash = json!([{"name": "calculator", "inputSchema": {"type": "object"}}]);
    let e = register(&mut registry, &[raw_server(&py, "calc", clash)]).unwrap_err();
    assert_eq!(e.to_string(), "tool source \"calc\": tool \"calculator\" is also offered by the built-in tools");
    let e = register(&mut registry, &[tools_server(&py, "one"), tools_server(&py, "two")]).unwrap_err();
    assert_eq!(e.to_string(), "tool source \"two\": tool \"add\" is also offered by \"one\"");
}

#[test]
fn a_hung_call_times_out_and_the_next_call_gets_a_restarted_server() {
    let py = require!(python());
    let server = McpServer::start(ServerSpec { timeout_s: 1.0, ..tools_server(&py, "sleepy") }).unwrap();
    let session = server.session(None).unwrap();
    let first = server.pid().unwrap();
    let t = Instant::now();
    let e = session.call("nap", &json!({"seconds": 30})).unwrap_err();
    assert_eq!(e, McpError::TimedOut { server: "sleepy".into(), tool: "nap".into(), ms: 1000 });
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert!(eventually(Duration::from_secs(5), || !alive(first)), "the hung server was killed");
    assert_eq!(session.call("add", &json!({"a": 1, "b": 2})).unwrap(), "3");
    let second = server.pid().unwrap();
    assert_ne!(first, second);
    assert_eq!(server.health(), Ok(()));
}

#[test]
fn a_server_killed_between_calls_or_dying_mid_call_is_restarted() {
    let py = require!(python());
    let mut registry = ToolRegistry::new(LIMITS);
    let servers = register(&mut registry, &[tools_server(&py, "fragile")]).unwrap();
    let mut s = registry.session(&task("t", None)).unwrap();
    let first = servers[0].pid().unwrap();
    // SAFETY: kill(2) on the server's child, which this test just read from the server.
    unsafe { libc::kill(first as i32, libc::SIGKILL) };
    assert!(eventually(Duration::from_secs(5), || !alive(first)));
    let turn = s.parse(&call("add", json!({"a": 4})));
    assert_eq!(s.execute(0, &turn.calls)[0].result, "4", "a death between calls is noticed before the call");
    let second = servers[0].pid().unwrap();
    assert_ne!(first, second);
    let turn = s.parse(&call("crash", json!({})));
    let step = &s.execute(1, &turn.calls)[0];
    assert!(!step.success);
    assert_eq!(step.result, r#"{"error": "tool server \"fragile\" failed during \"crash\" (Transport closed); it is being restarted"}"#, "no server logs for the model");
    let turn = s.parse(&call("add", json!({"a": 5})));
    assert_eq!(s.execute(2, &turn.calls)[0].result, "5");
    assert_ne!(servers[0].pid().unwrap(), second);
    assert_eq!(registry.health(), Ok(()));
}

#[test]
fn a_per_rollout_session_restarted_mid_rollout_has_no_reward() {
    let py = require!(python());
    let spec = ServerSpec {
        session: SessionMode::PerRollout,
        reset_tool: Some("reset".into()),
        reward_tool: Some("get_reward".into()),
        ..tools_server(&py, "env")
    };
    let server = McpServer::start(spec).unwrap();
    let s = server.session(Some(&json!({"start": 1, "target": 2}))).unwrap();
    assert_eq!(s.call("increment", &json!({})).unwrap(), "2");
    assert_eq!(s.reward(), Ok(Some(1.0)));
    assert!(s.call("crash", &json!({})).is_err());
    assert_eq!(s.call("increment", &json!({})).unwrap(), "2", "restarted and reset with the same env_state");
    assert_eq!(s.reward(), Err(McpError::StateLost { server: "env".into() }));
}

#[test]
fn past_the_restart_budget_the_server_is_given_up_with_a_fatal_error() {
    let py = require!(python());
    let mut registry = ToolRegistry::new(LIMITS);
    let spec = ServerSpec { max_restarts: 1, ..tools_server(&py, "doomed") };
    let servers = register(&mut registry, &[spec]).unwrap();
    let server = &servers[0];
    let s = server.session(None).unwrap();
    assert!(matches!(s.call("crash", &json!({})), Err(McpError::Died { .. })));
    assert_eq!(server.health(), Ok(()), "one failure is within the budget");
    let t = Instant::now();
    assert!(matches!(s.call("crash", &json!({})), Err(McpError::Died { .. })), "restarted, then died again");
    assert!(t.elapsed() >= Duration::from_millis(200), "after the back-off");
    let e = s.call("add", &json!({"a": 1})).unwrap_err();
    assert!(e.is_fatal(), "{e}");
    assert!(e.to_string().starts_with("tool server \"doomed\" is given up after 2 failures in a row (max_restarts = 1); the last: tool server \"doomed\" failed during \"crash\""), "{e}");
    assert_eq!(server.health(), Err(e.clone()));
    let h = registry.health().unwrap_err().to_string();
    assert!(h.starts_with("tool source \"doomed\": tool server \"doomed\" is given up"), "{h}");
    let e = registry.session(&task("t", None)).err().unwrap().to_string();
    assert!(e.starts_with("task \"t\": reset of environment \"doomed\" failed: tool server \"doomed\" is given up"), "{e}");
    assert_eq!(server.pid(), None, "no child is left running");
}

