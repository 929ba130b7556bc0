//! External tool sources in the registry: opened on every rollout beside the
//! built-in tools and environments, name clashes and bad schemas refused
//! naming the source, grades and health reported by source.
use rlmesh_core::tools::{
    calculator, ExecLimits, Grader, RegistryError, SourceSession, Tool, ToolRegistry, ToolSource, ToolSpec,
};
use rlmesh_core::Task;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

const LIMITS: ExecLimits = ExecLimits { timeout_ms: 500, max_output_bytes: 1000, max_calls_per_turn: 4 };

/// A counter per rollout, started at the task's `env_state.start`; graded 1
/// when it reached `env_state.target`.
struct Counters {
    name: String,
    specs: Vec<ToolSpec>,
    opened: AtomicUsize,
    broken: Mutex<Option<String>>,
}

impl Counters {
    fn new(name: &str, tools: &[&str]) -> Arc<Counters> {
        let spec = |n: &&str| ToolSpec {
            name: n.to_string(),
            description: "Adds to the counter.".into(),
            parameters: json!({"type": "object", "properties": {"by": {"type": "integer", "default": 1}}}),
        };
        Arc::new(Counters { name: name.into(), specs: tools.iter().map(spec).collect(), opened: AtomicUsize::new(0), broken: Mutex::new(None) })
    }
}

impl ToolSource for Counters {
    fn name(&self) -> &str {
        &self.name
    }
    fn specs(&self) -> Vec<ToolSpec> {
        self.specs.clone()
    }
    fn check_task(&self, task: &Task) -> Result<(), String> {
        match &task.env_state {
            Some(s) if !s.is_object() => Err("env_state: expected an object".into()),
            _ => Ok(()),
        }
    }
    fn open(&self, task: &Task, _: &ExecLimits) -> Result<SourceSession, String> {
        let state = task.env_state.clone().unwrap_or(json!({}));
        if state.get("refuse").is_some() {
            return Err("the server refused the reset".into());
        }
        self.opened.fetch_add(1, Ordering::SeqCst);
        let count = Arc::new(AtomicI64::new(state["start"].as_i64().unwrap_or(0)));
        let tools = self
            .specs
            .iter()
            .map(|spec| {
                let count = count.clone();
                Tool::from_handler(spec.clone(), Arc::new(move |args: &Value| {
                    let by = args.get("by").and_then(Value::as_i64).unwrap_or(1);
                    Ok((count.fetch_add(by, Ordering::SeqCst) + by).to_string())
                }))
            })
            .collect();
        let target = state["target"].as_i64();
        let grader: Grader = Arc::new(move || Ok(target.map(|t| f64::from(u8::from(count.load(Ordering::SeqCst) == t)))));
        Ok(SourceSession { tools, observation: Some(format!("counter at {}", state["start"])), grader: Some(grader) })
    }
    fn health(&self) -> Result<(), String> {
        self.broken.lock().unwrap().clone().map_or(Ok(()), Err)
    }
}

fn task(environment: Option<&str>, env_state: Option<Value>) -> Task {
    Task {
        id: "t".into(),
        prompt: "p".into(),
        requires_tool: true,
        allowed_tools: vec![],
        gold_tool_calls: vec![],
        expected_answer: None,
        environment: environment.map(String::from),
        env_state,
        ..Task::default()
    }
}

fn call(name: &str, args: Value) -> String {
    format!("<tool_call>\n{}\n</tool_call>", json!({"name": name, "arguments": args}))
}

#[test]
fn a_source_opens_a_fresh_state_on_every_rollout_beside_the_built_ins() {
    let mut r = ToolRegistry::from_names(&["calculator", "inventory"], LIMITS).unwrap();
    let counters = Counters::new("counters", &["bump"]);
    r.add_source(counters.clone()).unwrap();
    let t = task(None, Some(json!({"start": 5, "target": 7})));
    assert_eq!(r.check_task(&t), Ok(()));
    let names = |specs: Vec<ToolSpec>| specs.into_iter().map(|s| s.name).collect::<Vec<_>>();
    assert_eq!(names(r.specs_for(&t).unwrap()), ["calculator", "bump"]);
    let inv = task(Some("inventory"), Some(json!({"stock": {"apples": 1}})));
    assert_eq!(names(r.specs_for(&inv).unwrap()), ["calculator", "list_items", "get_stock", "set_stock", "bump"]);

    let mut a = r.session(&t).unwrap();
    let mut b = r.session(&t).unwrap();
    assert_eq!(a.observation(), Some("counter at 5"));
    let turn = a.parse(&format!("{}{}", call("bump", json!({})), call("bump", json!({"by": 1}))));
    assert_eq!(a.execute(0, &turn.calls).iter().map(|s| s.result.as_str()).collect::<Vec<_>>(), ["6", "7"]);
    let turn = b.parse(&call("bump", json!({"by": 10})));
    assert_eq!(b.execute(0, &turn.calls)[0].result, "15", "each rollout has its own counter");
    assert_eq!(a.grades(), [("counters".to_string(), Ok(Some(1.0)))]);
    assert_eq!(b.grades(), [("counters".to_string(), Ok(Some(0.0)))]);
    assert_eq!(counters.opened.load(Ordering::SeqCst), 2);

    // Arguments are checked against the source's schema before its handler runs.
    let turn = a.parse(&call("bump", json!({"by": "two"})));
    assert_eq!(turn.calls[0].error.as_ref().unwrap().to_string(), "invalid arguments for \"bump\": argument \"by\": expected integer, got a string (\"two\")");

    // A task's environment and the source both grade, the environment's observation first.
    let s = r.session(&inv).unwrap();
    assert_eq!(s.observation(), Some("The inventory tracks these items: apples.\n\ncounter at null"));
    assert_eq!(s.grades().iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(), ["inventory", "counters"]);
    // A task may name the source as its environment.
    assert!(r.session(&task(Some("counters"), None)).is_ok());
}

#[test]
fn clashes_and_bad_schemas_are_refused_naming_the_source() {
    let mut r = ToolRegistry::from_names(&["calculator", "inventory"], LIMITS).unwrap();
    r.add_source(Counters::new("first", &["bump"])).unwrap();
    let cases: [(Arc<Counters>, &str); 5] = [
        (Counters::new("c", &["calculator"]), "tool source \"c\": tool \"calculator\" is also offered by the built-in tools"),
        (Counters::new("c", &["get_stock"]), "tool source \"c\": tool \"get_stock\" is also offered by \"inventory\""),
        (Counters::new("c", &["bump"]), "tool source \"c\": tool \"bump\" is also offered by \"first\""),
        (Counters::new("c", &["x", "x"]), "tool source \"c\": tool \"x\" is also offered by this source"),
        (Counters::new("first", &["y"]), "tool source \"first\": a tool source of this name is already registered"),
    ];
    for (source, want) in cases {
        assert_eq!(r.add_source(source).unwrap_err().to_string(), want);
    }
    let bad = Counters::new("bad", &["z"]);
    let mut specs = bad.specs.clone();
    specs[0].parameters = json!({"type": "object", "properties": {"n": {"type": "int"}}});
    let bad = Arc::new(Counters { specs, ..Arc::into_inner(bad).unwrap() });
    assert_eq!(
        r.add_source(bad).unwrap_err().to_string(),
        "tool source \"bad\": tool \"z\": bad parameter schema: properties.n.type: unknown type \"int\" (JSON types: string, integer, number, boolean, array, object, null)"
    );
    // A refused source leaves the registry as it was; a tool added later may not take a source's name.
    assert_eq!(r.specs_for(&task(None, None)).unwrap().len(), 2);
    assert_eq!(r.add_tool(calculator::tool()), Err(RegistryError::Duplicate("calculator".into())));
}

#[test]
fn a_source_that_cannot_open_or_serve_is_reported_by_name() {
    let mut r = ToolRegistry::new(LIMITS);
    let counters = Counters::new("counters", &["bump"]);
    r.add_source(counters.clone()).unwrap();
    let e = r.session(&task(None, Some(json!({"refuse": true})))).err().unwrap();
    assert_eq!(e.to_string(), "task \"t\": reset of environment \"counters\" failed: the server refused the reset");
    assert_eq!(r.check_task(&task(None, Some(json!(3)))).unwrap_err().to_string(), "task \"t\": env_state: expected an object");
    let e = r.check_task(&task(Some("files"), None)).unwrap_err();
    assert_eq!(e.to_string(), "task \"t\": environment \"files\" is not configured (configured: counters)");
    assert_eq!(r.health(), Ok(()));
    *counters.broken.lock().unwrap() = Some("restart budget exhausted".into());
    assert_eq!(r.health().unwrap_err().to_string(), "tool source \"counters\": restart budget exhausted");
}
