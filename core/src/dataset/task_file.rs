//! The user's tasks from a file: `[tasks] file = "train.jsonl"` (JSONL, or
//! Parquet by its `.parquet` extension), one row a task.
//!
//! A row's fields (all but `prompt` optional):
//! - `prompt`: a string, or a list of OpenAI-format messages (a system
//!   message and earlier turns allowed, see [`super::conversation`]). A list
//!   that ends after its last user message with assistant or tool messages
//!   (TRL's `messages` shape) is cut there; a list that is one user message
//!   is that message's text.
//! - `answer` (or today's `expected_answer`): a string or a number; a list of
//!   messages gives its last assistant message's text (TRL's `completion`).
//! - `tools` (or `allowed_tools`): the tools the model may call, as names or
//!   function schemas (their `name`); absent: every tool.
//! - `requires_tool`: when absent, `true` if the row has `gold_tool_calls`,
//!   else `false` only if `tools` is an empty list, else `true`. A tool task
//!   needs no gold calls: the process reward scores without them.
//! - `env_state`: any JSON, handed to the environment's reset (a tool
//!   server's `reset_tool`, or the built-in `environment`'s reset).
//! - `info`: any JSON, handed to verifiers.
//! - `id`: a string (or an integer); absent: `<file name>:<line>` (Parquet:
//!   `<file name>:<row>`), so every task id comes from the file. Ids are unique.
//! - today's `gold_tool_calls` and `environment`.
//!
//! Other fields are ignored, except a near-miss of a field name
//! (`requires_tools`), which is an error. `[tasks.columns]` ([`Columns`])
//! names the column each field comes from, with a dotted path into nested
//! objects, so other shapes load unchanged:
//!
//! | shape | `[tasks.columns]` |
//! |---|---|
//! | TRL prompt-only / prompt-completion | none (`answer = "completion"` to grade against it) |
//! | TRL conversational `messages` | `prompt = "messages"` |
//! | verl Parquet (`prompt` messages, `reward_model`, `extra_info`) | `answer = "reward_model.ground_truth"`, `info = "extra_info"` |
//! | verifiers (`question`, `answer`, `info`) | `prompt = "question"` |
//!
//! ```
//! use rlmesh_core::dataset::task_file::{parse_jsonl_with, Columns};
//! let columns = Columns::new([("prompt", "question")]).unwrap();
//! let tasks = parse_jsonl_with(r#"{"question": "2 + 2?", "answer": 4, "info": {"level": 1}}"#, "math.jsonl", &columns).unwrap();
//! assert_eq!((tasks[0].id.as_str(), tasks[0].prompt.as_str()), ("math.jsonl:1", "2 + 2?"));
//! assert_eq!(tasks[0].expected_answer.as_deref(), Some("4"));
//! assert!(tasks[0].requires_tool);
//! ```
use super::conversation::parse_messages;
use super::mix::Rng;
use super::rows::{describe, read_jsonl, read_rows, MAX_LINE_BYTES};
use super::{file_name, misspelling_of, DatasetError, Ids, Location};
use crate::task::{GoldCall, Task};
use serde_json::{json, Map, Value};
use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

/// The fields of a task row, as `[tasks.columns]` names them.
pub const FIELDS: &[&str] =
    &["id", "prompt", "answer", "tools", "requires_tool", "env_state", "info", "gold_tool_calls", "environment"];

/// Today's `Task` names that a row may use instead: (old name, field).
const ALIASES: &[(&str, &str)] = &[("expected_answer", "answer"), ("allowed_tools", "tools")];

/// Names whose near-misses are errors rather than ignored columns.
const GUARDED: &[&str] = &["requires_tool", "expected_answer", "allowed_tools", "gold_tool_calls", "env_state"];

/// `[tasks.columns]`: for a field, the file's column it comes from (a dotted
/// path reaches into nested objects: `reward_model.ground_truth`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Columns(BTreeMap<String, String>);

impl Columns {
    /// Checks that every key is a field of [`FIELDS`] and every column a non-empty name.
    pub fn new<K: Into<String>, V: Into<String>>(map: impl IntoIterator<Item = (K, V)>) -> Result<Columns, DatasetError> {
        let map: BTreeMap<String, String> = map.into_iter().map(|(k, v)| (k.into(), v.into())).collect();
        for (field, column) in &map {
            if !FIELDS.contains(&field.as_str()) {
                return Err(DatasetError::Spec(format!(
                    "[tasks.columns]: unknown field \"{field}\" (expected one of: {})",
                    FIELDS.join(", ")
                )));
            }
            if column.trim().is_empty() || column.split('.').any(str::is_empty) {
                return Err(DatasetError::Spec(format!("[tasks.columns] {field}: \"{column}\" is not a column name")));
            }
        }
        Ok(Columns(map))
    }

    /// The column `field` is mapped to, if any.
    pub fn column(&self, field: &str) -> Option<&str> {
        self.0.get(field).map(String::as_str)
    }
}

/// Where a run's tasks come from: `[tasks] file`, `held_out_file` or
/// `held_out`, `[tasks.columns]`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskFiles {
    /// The training tasks (JSONL, or Parquet by extension).
    pub file: PathBuf,
    /// Held-out tasks from their own file (same columns).
    pub held_out_file: Option<PathBuf>,
    /// Or: this many rows of `file` held out, chosen with the run's seed.
    pub held_out: usize,
    /// Where each field comes from.
    pub columns: Columns,
    /// The longest JSONL line accepted ([`MAX_LINE_BYTES`] by default).
    pub max_line_bytes: usize,
}

impl TaskFiles {
    /// Tasks from `file`, nothing held out, no column mapping.
    pub fn new(file: impl Into<PathBuf>) -> Self {
        TaskFiles { file: file.into(), held_out_file: None, held_out: 0, columns: Columns::default(), max_line_bytes: MAX_LINE_BYTES }
    }
}

/// A run's tasks: those it trains on and those it evaluates on.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TaskSplit {
    /// Training tasks, in file order.
    pub train: Vec<Task>,
    /// Held-out tasks (file order).
    pub held_out: Vec<Task>,
}

/// Loads a run's tasks. With `held_out = N`, N rows chosen with `seed` are
/// held out (the same rows for the same file and seed); both sides keep file
/// order. Ids must be unique across the two sides.
pub fn load_tasks(spec: &TaskFiles, seed: u64) -> Result<TaskSplit, DatasetError> {
    let train = load_task_file_with(&spec.file, &spec.columns, spec.max_line_bytes)?;
    match (&spec.held_out_file, spec.held_out) {
        (Some(_), n) if n > 0 => Err(DatasetError::Spec(
            "[tasks]: held_out and held_out_file are both set; use one".into(),
        )),
        (Some(path), _) => {
            let held_out = load_task_file_with(path, &spec.columns, spec.max_line_bytes)?;
            let ids: HashSet<&str> = train.iter().map(|t| t.id.as_str()).collect();
            if let Some(t) = held_out.iter().find(|t| ids.contains(t.id.as_str())) {
                return Err(DatasetError::File {
                    file: path.display().to_string(),
                    message: format!("task id \"{}\" is also in {}; ids must be unique", t.id, spec.file.display()),
                });
            }
            Ok(TaskSplit { train, held_out })
        }
        (None, 0) => Ok(TaskSplit { train, held_out: Vec::new() }),
        (None, n) if n >= train.len() => Err(DatasetError::Spec(format!(
            "[tasks] held_out = {n} leaves no training task: {} has {} row(s)",
            spec.file.display(),
            train.len()
        ))),
        (None, n) => {
            let (train, held_out) = split_off(train, n, seed);
            Ok(TaskSplit { train, held_out })
        }
    }
}

/// Takes `n` tasks chosen with `seed` out of `tasks`: (the rest, the `n`),
/// each in the original order.
pub fn split_off(tasks: Vec<Task>, n: usize, seed: u64) -> (Vec<Task>, Vec<Task>) {
    let mut order: Vec<usize> = (0..tasks.len()).collect();
    let mut rng = Rng(seed ^ 0x6865_6C64_5F6F_7574);
    let n = n.min(tasks.len());
    for i in 0..n {
        let j = rng.range(i as i64, order.len() as i64 - 1) as usize;
        order.swap(i, j);
    }
    let held: HashSet<usize> = order[..n].iter().copied().collect();
    let (mut rest, mut out) = (Vec::new(), Vec::new());
    for (i, t) in tasks.into_iter().enumerate() {
        if held.contains(&i) { out.push(t) } else { rest.push(t) }
    }
    (rest, out)
}

/// Reads a task file with no column mapping (see the module docs).
pub fn load_task_file(path: &Path) -> Result<Vec<Task>, DatasetError> {
    load_task_file_with(path, &Columns::default(), MAX_LINE_BYTES)
}

/// Reads a task file, each field from its `columns` column.
pub fn load_task_file_with(path: &Path, columns: &Columns, max_line_bytes: usize) -> Result<Vec<Task>, DatasetError> {
    tasks(&path.display().to_string(), columns, |each| read_rows(path, max_line_bytes, each))
}

/// Parses JSONL task text with no column mapping (`file` names it in errors and ids).
pub fn parse_jsonl(text: &str, file: &str) -> Result<Vec<Task>, DatasetError> {
    parse_jsonl_with(text, file, &Columns::default())
}

/// Parses JSONL task text, each field from its `columns` column.
pub fn parse_jsonl_with(text: &str, file: &str, columns: &Columns) -> Result<Vec<Task>, DatasetError> {
    tasks(file, columns, |each| read_jsonl(text.as_bytes(), file, MAX_LINE_BYTES, each))
}

/// The tasks of the rows `read` yields, with unique ids.
fn tasks(
    file: &str,
    columns: &Columns,
    read: impl FnOnce(&mut dyn FnMut(Location, Map<String, Value>) -> Result<(), String>) -> Result<usize, DatasetError>,
) -> Result<Vec<Task>, DatasetError> {
    let short = file_name(file);
    let mut ids = Ids::default();
    let mut out = Vec::new();
    read(&mut |at, obj| {
        let task = task_from_row(&obj, columns, &format!("{short}:{}", at.number()), at.noun())?;
        ids.claim(&task.id, at)?;
        out.push(task);
        Ok(())
    })?;
    Ok(out)
}

/// One row's view through the column mapping.
struct Row<'a> {
    obj: &'a Map<String, Value>,
    columns: &'a Columns,
    noun: &'a str,
}

impl<'a> Row<'a> {
    /// The value of `field` (null counts as absent) and its name for errors.
    fn get(&self, field: &str) -> Result<Option<(&'a Value, String)>, String> {
        let noun = self.noun;
        if let Some(col) = self.columns.column(field) {
            return match lookup(self.obj, col) {
                Some(Value::Null) => Ok(None),
                Some(v) => Ok(Some((v, format!("{noun} \"{col}\" ({field})")))),
                None => Err(format!(
                    "missing {noun} \"{col}\" ({field}, from [tasks.columns]); the row has: {}",
                    self.obj.keys().map(String::as_str).collect::<Vec<_>>().join(", ")
                )),
            };
        }
        let names = std::iter::once(field).chain(ALIASES.iter().filter(|(_, f)| *f == field).map(|(old, _)| *old));
        let present: Vec<(&str, &Value)> = names.filter_map(|n| self.obj.get(n).filter(|v| !v.is_null()).map(|v| (n, v))).collect();
        match present.as_slice() {
            [] => Ok(None),
            [(name, v)] => Ok(Some((v, format!("{noun} \"{name}\"")))),
            [(a, _), (b, _), ..] => Err(format!("{noun}s \"{a}\" and \"{b}\" are both given; keep one")),
        }
    }

    /// Fails on a near-miss of a field name that is no mapped column.
    fn check_names(&self) -> Result<(), String> {
        let mapped: HashSet<&str> = self.columns.0.values().map(|c| c.split('.').next().unwrap_or(c)).collect();
        for key in self.obj.keys().filter(|k| !mapped.contains(k.as_str())) {
            if let Some(k) = misspelling_of(key, GUARDED) {
                let noun = self.noun;
                return Err(format!("unknown {noun} \"{key}\"; did you mean \"{k}\"? (other unknown {noun}s are ignored)"));
            }
        }
        Ok(())
    }
}

/// `path` in `obj`: the key itself, else a dotted path through nested objects.
fn lookup<'a>(obj: &'a Map<String, Value>, path: &str) -> Option<&'a Value> {
    if let Some(v) = obj.get(path) {
        return Some(v);
    }
    let mut parts = path.split('.');
    let mut v = obj.get(parts.next()?)?;
    for p in parts {
        v = v.as_object()?.get(p)?;
    }
    Some(v)
}

/// A task from one row. `default_id` is used when the row has none; `noun`
/// is `field` (JSONL) or `column` (Parquet), for errors.
pub fn task_from_row(obj: &Map<String, Value>, columns: &Columns, default_id: &str, noun: &str) -> Result<Task, String> {
    let row = Row { obj, columns, noun };
    row.check_names()?;
    let expected = |name: &str, what: &str, v: &Value| format!("{name}: expected {what}, got {}", describe(v));
    let id = match row.get("id")? {
        None => default_id.to_string(),
        Some((Value::String(s), name)) if s.trim().is_empty() => return Err(format!("{name}: must not be empty")),
        Some((Value::String(s), _)) => s.clone(),
        Some((Value::Number(n), _)) if n.is_u64() || n.is_i64() => n.to_string(),
        Some((v, name)) => return Err(expected(&name, "a string", v)),
    };
    let mut task = Task { id, ..Task::default() };
    match row.get("prompt")? {
        None => {
            let col = columns.column("prompt").unwrap_or("prompt");
            return Err(format!("missing {noun} \"{col}\" (the prompt)"));
        }
        Some((Value::String(s), _)) => task.prompt = s.clone(),
        Some((v @ Value::Array(_), name)) => {
            let mut messages = parse_messages(v, &name)?;
            let last_user = messages.iter().rposition(|m| m.role == "user").ok_or_else(|| format!("{name}: no user message"))?;
            messages.truncate(last_user + 1);
            task.prompt = messages[last_user].content.clone();
            if messages.len() > 1 {
                task.messages = messages;
            }
        }
        Some((v, name)) => return Err(expected(&name, "a string or a list of messages", v)),
    }
    task.expected_answer = match row.get("answer")? {
        None => None,
        Some((Value::String(s), _)) => Some(s.clone()),
        Some((v @ (Value::Number(_) | Value::Bool(_)), _)) => Some(v.to_string()),
        Some((v @ Value::Array(_), name)) => {
            let messages = parse_messages(v, &name)?;
            let last = messages.iter().rev().find(|m| m.role == "assistant").ok_or_else(|| format!("{name}: no assistant message to take the answer from"))?;
            Some(last.content.clone())
        }
        Some((v, name)) => return Err(expected(&name, "a string, a number or a list of messages", v)),
    };
    let tools = match row.get("tools")? {
        None => None,
        Some((Value::Array(list), name)) => Some(tool_names(list, &name)?),
        Some((v, name)) => return Err(expected(&name, "a list of tool names", v)),
    };
    let requires_tool = match row.get("requires_tool")? {
        None => None,
        Some((Value::Bool(b), name)) => Some((*b, name)),
        Some((v, name)) => return Err(expected(&name, "a boolean", v)),
    };
    if let Some((v, name)) = row.get("gold_tool_calls")? {
        task.gold_tool_calls = gold_calls(v, &name)?;
    }
    task.environment = match row.get("environment")? {
        None => None,
        Some((Value::String(s), _)) => Some(s.clone()),
        Some((v, name)) => return Err(expected(&name, "a string or null", v)),
    };
    task.env_state = row.get("env_state")?.map(|(v, _)| v.clone());
    task.info = row.get("info")?.map(|(v, _)| v.clone());
    let no_tools = tools.as_ref().is_some_and(Vec::is_empty);
    if no_tools && !task.gold_tool_calls.is_empty() {
        return Err(format!("{noun} \"gold_tool_calls\": given, but the task's tools are an empty list"));
    }
    task.requires_tool = match requires_tool {
        Some((true, name)) if no_tools => return Err(format!("{name}: true, but the task's tools are an empty list")),
        Some((b, _)) => b,
        None => !task.gold_tool_calls.is_empty() || !no_tools,
    };
    task.allowed_tools = tools.unwrap_or_default();
    check_task(&task, noun)?;
    Ok(task)
}

/// Tool names from a `tools` list: names, or function schemas (`name` or `function.name`).
fn tool_names(list: &[Value], name: &str) -> Result<Vec<String>, String> {
    list.iter()
        .enumerate()
        .map(|(i, t)| match t {
            Value::String(s) => Ok(s.clone()),
            Value::Object(o) => o
                .get("name")
                .or_else(|| o.get("function").and_then(|f| f.get("name")))
                .and_then(Value::as_str)
                .map(String::from)
                .ok_or_else(|| format!("{name}[{i}]: a tool schema without \"name\" or \"function\".\"name\"")),
            other => Err(format!("{name}[{i}]: expected a tool name, got {}", describe(other))),
        })
        .collect()
}

/// `gold_tool_calls`: a list of steps, each a list of `{"name", "arguments"}`.
fn gold_calls(v: &Value, name: &str) -> Result<Vec<Vec<GoldCall>>, String> {
    let steps = v.as_array().ok_or_else(|| format!("{name}: expected a list of steps (lists of calls), got {}", describe(v)))?;
    let mut out = Vec::with_capacity(steps.len());
    for (i, step) in steps.iter().enumerate() {
        let calls = step.as_array().ok_or_else(|| format!("{name}[{i}]: expected a list of calls, got {}", describe(step)))?;
        let mut parsed = Vec::with_capacity(calls.len());
        for (j, call) in calls.iter().enumerate() {
            let at = format!("{name}[{i}][{j}]");
            let c = call.as_object().ok_or_else(|| format!("{at}: expected an object {{\"name\", \"arguments\"}}, got {}", describe(call)))?;
            let call_name = match c.get("name") {
                Some(Value::String(n)) => n.clone(),
                Some(n) => return Err(format!("{at}.name: expected a string, got {}", describe(n))),
                None => return Err(format!("{at}: missing \"name\"")),
            };
            let arguments = match c.get("arguments") {
                None => json!({}),
                Some(a @ Value::Object(_)) => a.clone(),
                Some(a) => return Err(format!("{at}.arguments: expected an object, got {}", describe(a))),
            };
            if let Some(extra) = c.keys().find(|k| *k != "name" && *k != "arguments") {
                return Err(format!("{at}: unknown field \"{extra}\" (expected: name, arguments)"));
            }
            parsed.push(GoldCall { name: call_name, arguments });
        }
        out.push(parsed);
    }
    Ok(out)
}

/// Checks a task's grading data; the error names the field.
///
/// The prompt is not blank; a task that needs no tool expects no calls; a
/// tool task's gold calls (optional) have no empty step and, when its tools
/// are listed, call only those.
pub fn validate_task(t: &Task) -> Result<(), String> {
    check_task(t, "field")
}

fn check_task(t: &Task, noun: &str) -> Result<(), String> {
    if t.prompt.trim().is_empty() {
        return Err(format!("{noun} \"prompt\": must not be empty"));
    }
    if !t.requires_tool {
        if !t.gold_tool_calls.is_empty() {
            return Err(format!("{noun} \"gold_tool_calls\": a task with \"requires_tool\": false must not expect calls"));
        }
        return Ok(());
    }
    for (i, step) in t.gold_tool_calls.iter().enumerate() {
        if step.is_empty() {
            return Err(format!("{noun} \"gold_tool_calls\"[{i}]: a step needs at least one call"));
        }
        for (j, call) in step.iter().enumerate() {
            if !t.allowed_tools.is_empty() && !t.allowed_tools.contains(&call.name) {
                return Err(format!("{noun} \"gold_tool_calls\"[{i}][{j}].name: \"{}\" is not in the task's tools", call.name));
            }
        }
    }
    Ok(())
}

/// A task as a row of the file format: what a verifier receives as `task`,
/// and what [`task_from_row`] reads back as the same task.
pub fn task_row(t: &Task) -> Value {
    let prompt = if t.messages.is_empty() {
        Value::String(t.prompt.clone())
    } else {
        serde_json::to_value(&t.messages).unwrap_or_else(|e| unreachable!("messages serialise to JSON: {e}"))
    };
    let mut row = json!({
        "id": t.id,
        "prompt": prompt,
        "answer": t.expected_answer,
        "requires_tool": t.requires_tool,
        "env_state": t.env_state,
        "info": t.info,
        "gold_tool_calls": t.gold_tool_calls,
        "environment": t.environment,
    });
    // An empty list on a tool task means "every tool": the row leaves `tools` out.
    if !(t.requires_tool && t.allowed_tools.is_empty()) {
        row["tools"] = json!(t.allowed_tools);
    }
    row
}

/// Writes tasks as JSONL rows ([`task_row`]), one per line; [`parse_jsonl`] reads them back.
pub fn to_jsonl(tasks: &[Task]) -> String {
    tasks.iter().map(|t| task_row(t).to_string() + "\n").collect()
}
