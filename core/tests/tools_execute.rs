//! Executing tool calls: order, repeats, limits, failures, environments.
use rlmesh_core::tools::{
    calculator, CallError, Environment, ExecLimits, Method, RegistryError, Tool, ToolError, ToolRegistry, ToolSession,
};
use rlmesh_core::{Step, Task};
use serde_json::json;
use std::time::{Duration, Instant};

rlmesh_core::tool_args! {
    /// No arguments.
    pub struct Empty {}
}

rlmesh_core::tool_args! {
    /// Arguments of `sleep`.
    pub struct SleepArgs {
        /// Milliseconds to sleep.
        pub ms: u64,
    }
}

const LIMITS: ExecLimits = ExecLimits { timeout_ms: 200, max_output_bytes: 1000, max_calls_per_turn: 3 };

fn registry() -> ToolRegistry {
    let mut r = ToolRegistry::new(LIMITS);
    r.add_tool(calculator::tool()).unwrap();
    r.add_tool(Tool::new("sleep", "Sleeps.", |a: SleepArgs| {
        std::thread::sleep(Duration::from_millis(a.ms));
        Ok("woke".to_string())
    }))
    .unwrap();
    r.add_tool(Tool::new("boom", "Panics.", |_: Empty| -> Result<String, ToolError> { panic!("kaboom") })).unwrap();
    r.add_tool(Tool::new("huge", "Returns 5 MiB.", |_: Empty| Ok("x".repeat(5 << 20)))).unwrap();
    r
}

fn task(environment: Option<&str>, env_state: Option<serde_json::Value>) -> Task {
    Task {
        id: "t".into(),
        prompt: "p".into(),
        requires_tool: true,
        allowed_tools: vec![],
        gold_tool_calls: vec![],
        expected_answer: None,
        environment: environment.map(String::from),
        env_state,
        ..Default::default()
    }
}

fn call(name: &str, args: serde_json::Value) -> String {
    format!("<tool_call>\n{}\n</tool_call>", json!({"name": name, "arguments": args}))
}

fn calc(op: &str, a: f64, b: f64) -> String {
    call("calculator", json!({"operation": op, "a": a, "b": b}))
}

fn run(session: &mut ToolSession, turn: usize, text: &str) -> Vec<Step> {
    let parsed = session.parse(text);
    session.execute(turn, &parsed.calls)
}

#[test]
fn parallel_calls_run_in_order_each_with_its_own_result() {
    let mut s = registry().session(&task(None, None)).unwrap();
    let steps = run(&mut s, 2, &format!("Three at once.\n{}\n{}\n{}", calc("add", 1.0, 2.0), calc("multiply", 17.0, 24.0), calc("divide", 7.0, 2.0)));
    let results: Vec<&str> = steps.iter().map(|s| s.result.as_str()).collect();
    assert_eq!(results, ["3", "408", "3.5"]);
    assert_eq!(steps.iter().map(|s| (s.turn, s.index)).collect::<Vec<_>>(), [(2, 0), (2, 1), (2, 2)]);
    assert!(steps.iter().all(|s| s.success && s.error.is_none() && !s.repeated));
    assert_eq!(steps[1].arguments, json!({"operation": "multiply", "a": 17.0, "b": 24.0}));
}

#[test]
fn identical_calls_are_marked_repeated_across_turns_and_within_a_turn() {
    let mut s = registry().session(&task(None, None)).unwrap();
    let first = run(&mut s, 0, &call("calculator", json!({"operation": "add", "a": 1, "b": 2})));
    assert!(!first[0].repeated);
    // Same call with the keys reordered and an integral float: repeated.
    let again = run(&mut s, 1, &call("calculator", json!({"b": 2.0, "operation": "add", "a": 1})));
    assert!(again[0].repeated && again[0].success);
    let other = run(&mut s, 2, &format!("{}{}", calc("add", 1.0, 3.0), calc("add", 1.0, 3.0)));
    assert_eq!(other.iter().map(|s| s.repeated).collect::<Vec<_>>(), [false, true]);
    // A fresh rollout remembers nothing.
    let mut fresh = registry().session(&task(None, None)).unwrap();
    assert!(!run(&mut fresh, 0, &calc("add", 1.0, 2.0))[0].repeated);
}

#[test]
fn a_hanging_tool_times_out_without_blocking_the_turn() {
    let mut s = registry().session(&task(None, None)).unwrap();
    let t = Instant::now();
    let steps = run(&mut s, 0, &format!("{}{}", call("sleep", json!({"ms": 5000})), calc("add", 2.0, 2.0)));
    assert!(t.elapsed() < Duration::from_secs(2), "blocked for {:?}", t.elapsed());
    assert!(!steps[0].success);
    assert_eq!(steps[0].error.as_deref(), Some("tool \"sleep\" timed out after 200 ms"));
    assert_eq!(steps[0].result, r#"{"error": "tool \"sleep\" timed out after 200 ms"}"#);
    assert!(steps[0].latency_ms >= 200.0 && steps[0].latency_ms < 2000.0, "{}", steps[0].latency_ms);
    assert_eq!(steps[1].result, "4");
    // A quick call of the same tool still works.
    assert_eq!(run(&mut s, 1, &call("sleep", json!({"ms": 1})))[0].result, "woke");
}

#[test]
fn a_panicking_tool_becomes_a_failed_step() {
    let mut s = registry().session(&task(None, None)).unwrap();
    let steps = run(&mut s, 0, &format!("{}{}", call("boom", json!({})), calc("subtract", 5.0, 7.0)));
    assert!(!steps[0].success);
    assert_eq!(steps[0].result, r#"{"error": "tool \"boom\" crashed: kaboom"}"#);
    assert_eq!(steps[1].result, "-2");
}

#[test]
fn huge_output_is_truncated_and_marked() {
    let mut s = registry().session(&task(None, None)).unwrap();
    let steps = run(&mut s, 0, &call("huge", json!({})));
    assert!(steps[0].success);
    assert_eq!(steps[0].result, format!("{}…[truncated {} bytes]", "x".repeat(1000), (5 << 20) - 1000));
}

#[test]
fn unknown_tools_are_failed_steps_naming_the_available_tools() {
    let mut s = registry().session(&task(None, None)).unwrap();
    let steps = run(&mut s, 0, &call("search", json!({"q": "rust"})));
    assert_eq!(steps[0].name, "search");
    assert!(!steps[0].success);
    assert_eq!(steps[0].result, r#"{"error": "unknown tool \"search\" (available: calculator, sleep, boom, huge)"}"#);
}

#[test]
fn malformed_json_is_a_failed_step_and_a_format_error() {
    let mut s = registry().session(&task(None, None)).unwrap();
    let text = "<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"a\": 1,}}\n</tool_call>";
    let parsed = s.parse(text);
    assert_eq!(parsed.format_errors(), ["malformed tool call: invalid JSON: trailing comma at line 1 column 45"]);
    assert_eq!(parsed.message().tool_calls, None);
    let steps = s.execute(0, &parsed.calls);
    assert_eq!(steps.len(), 1);
    assert!(!steps[0].success && !steps[0].repeated);
    assert_eq!(steps[0].name, "");
    assert_eq!(steps[0].latency_ms, 0.0);
    assert!(steps[0].result.starts_with(r#"{"error": "malformed tool call: invalid JSON"#), "{}", steps[0].result);
}

#[test]
fn schema_violations_are_not_executed() {
    let mut s = registry().session(&task(None, None)).unwrap();
    let steps = run(&mut s, 0, &call("calculator", json!({"operation": "add", "a": 1, "b": "2"})));
    assert!(!steps[0].success);
    assert_eq!(steps[0].error.as_deref(), Some("invalid arguments for \"calculator\": argument \"b\": expected number, got a string (\"2\")"));
}

#[test]
fn tool_errors_are_failed_steps() {
    let mut s = registry().session(&task(None, None)).unwrap();
    let steps = run(&mut s, 0, &calc("divide", 1.0, 0.0));
    assert_eq!((steps[0].success, steps[0].result.as_str()), (false, r#"{"error": "division by zero"}"#));
}

#[test]
fn calls_beyond_the_cap_get_an_error_result() {
    let mut s = registry().session(&task(None, None)).unwrap();
    let text: String = (1..=5).map(|i| calc("add", i as f64, 1.0)).collect();
    let steps = run(&mut s, 0, &text);
    assert_eq!(steps.len(), 5);
    assert_eq!(steps.iter().map(|s| s.success).collect::<Vec<_>>(), [true, true, true, false, false]);
    assert_eq!(steps[4].result, r#"{"error": "call not executed: at most 3 tool calls run per turn"}"#);
    assert_eq!(steps[4].index, 4);
}

#[test]
fn inventory_rollouts_are_stateful_fresh_and_self_graded() {
    let r = ToolRegistry::from_names(&["calculator", "inventory"], LIMITS).unwrap();
    let state = json!({"stock": {"apples": 12, "bananas": 3}, "goal": {"apples": 20}});
    let t = task(Some("inventory"), Some(state));
    let mut s = r.session(&t).unwrap();
    assert_eq!(s.observation(), Some("The inventory tracks these items: apples, bananas."));
    let names: Vec<String> = s.schemas().iter().map(|v| v["function"]["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(names, ["calculator", "list_items", "get_stock", "set_stock"]);
    assert_eq!(s.reward(), Some(0.0));
    assert_eq!(run(&mut s, 0, &call("get_stock", json!({"item": "apples"})))[0].result, "12");
    assert_eq!(run(&mut s, 1, &call("set_stock", json!({"item": "apples", "quantity": 20})))[0].result, "apples: 20");
    assert_eq!(run(&mut s, 2, &call("get_stock", json!({"item": "apples"})))[0].result, "20");
    let missing = run(&mut s, 3, &call("get_stock", json!({"item": "kiwis"})));
    assert_eq!(missing[0].result, r#"{"error": "unknown item \"kiwis\" (items: apples, bananas)"}"#);
    assert_eq!(s.reward(), Some(1.0));
    // The next rollout gets a fresh instance.
    let mut next = r.session(&t).unwrap();
    assert_eq!(run(&mut next, 0, &call("get_stock", json!({"item": "apples"})))[0].result, "12");
    // A task without the environment does not see its tools.
    let mut plain = r.session(&task(None, None)).unwrap();
    assert_eq!(plain.reward(), None);
    assert!(!run(&mut plain, 0, &call("get_stock", json!({"item": "apples"})))[0].success);
}

/// A test environment whose methods misbehave on purpose.
#[derive(Default)]
struct Unruly {
    count: i64,
}

rlmesh_core::tool_args! {
    /// Arguments of `hang`.
    pub struct HangArgs {
        /// Milliseconds to hold the state.
        pub ms: u64,
    }
}

impl Environment for Unruly {
    fn methods() -> Vec<Method<Self>> {
        vec![
            Method::new("incr", "Adds one.", |e: &mut Unruly, _: Empty| {
                e.count += 1;
                Ok(e.count.to_string())
            }),
            Method::new("crash", "Panics mid-update.", |e: &mut Unruly, _: Empty| -> Result<String, ToolError> {
                e.count += 100;
                panic!("crashed at {}", e.count)
            }),
            Method::new("hang", "Holds the state.", |_: &mut Unruly, a: HangArgs| {
                std::thread::sleep(Duration::from_millis(a.ms));
                Ok("done".into())
            }),
        ]
    }
    fn check_task(_: &Task) -> Result<(), String> {
        Ok(())
    }
    fn reset(&mut self, task: &Task) -> Option<String> {
        assert!(task.prompt != "panic", "reset refused the task");
        None
    }
    fn get_reward(&self) -> Option<f64> {
        Some(self.count as f64)
    }
}

#[test]
fn a_misbehaving_environment_never_blocks_the_rollout() {
    let mut r = ToolRegistry::new(LIMITS);
    r.add_environment("unruly", Unruly::default).unwrap();
    let mut s = r.session(&task(Some("unruly"), None)).unwrap();
    assert_eq!(s.observation(), None);
    let steps = run(&mut s, 0, &format!("{}{}{}", call("incr", json!({})), call("crash", json!({})), call("incr", json!({}))));
    assert_eq!(steps[1].result, r#"{"error": "tool \"crash\" crashed: crashed at 101"}"#);
    assert_eq!(steps[2].result, "102", "the state survives the panic as it was");
    let t = Instant::now();
    let steps = run(&mut s, 1, &format!("{}{}", call("hang", json!({"ms": 3000})), call("incr", json!({}))));
    assert_eq!(steps[1].error.as_deref(), Some("tool \"incr\" timed out after 200 ms"), "waits on the held state, within the limit");
    assert_eq!(s.reward(), None, "the grader cannot read a state held by a hung call");
    assert!(t.elapsed() < Duration::from_secs(2), "blocked for {:?}", t.elapsed());
    let mut bad = task(Some("unruly"), None);
    bad.prompt = "panic".into();
    let err = r.session(&bad).err().unwrap();
    assert!(err.to_string().starts_with("task \"t\": reset of environment \"unruly\" failed: panicked: reset refused the task"), "{err}");
}

#[test]
fn registry_errors_name_what_is_wrong() {
    let e = ToolRegistry::from_names(&["calc"], LIMITS).err().unwrap();
    assert_eq!(e.to_string(), "unknown tool or environment \"calc\" (built-in tools: calculator; built-in environments: inventory)");
    let e = ToolRegistry::from_names(&["calculator", "calculator"], LIMITS).err().unwrap();
    assert_eq!(e, RegistryError::Duplicate("calculator".into()));
    let r = ToolRegistry::from_names(&["calculator"], LIMITS).unwrap();
    let e = r.session(&task(Some("inventory"), None)).err().unwrap();
    assert_eq!(e.to_string(), "task \"t\": environment \"inventory\" is not configured (configured: )");
    let mut t = task(None, None);
    t.allowed_tools = vec!["get_stock".into()];
    assert_eq!(
        r.check_task(&t).unwrap_err().to_string(),
        "task \"t\": allowed tool \"get_stock\" is not available (available: calculator)"
    );
    let r = ToolRegistry::from_names(&["inventory"], LIMITS).unwrap();
    let bad = task(Some("inventory"), Some(json!({"stock": {"apples": "many"}})));
    assert_eq!(
        r.check_task(&bad).unwrap_err().to_string(),
        "task \"t\": env_state.stock.apples: expected a non-negative integer, got \"many\""
    );
}

#[test]
fn sessions_and_errors_can_cross_threads() {
    fn send<T: Send>() {}
    fn sync<T: Send + Sync>() {}
    send::<ToolSession>();
    sync::<ToolRegistry>();
    sync::<CallError>();
}
