//! The verifier protocol: one JSON object a line each way (or one a POST).
//!
//! A request is `{"id", "task", "messages", "completion"}`: `id` an integer
//! the response repeats, `task` the task as a row of the task-file format
//! (`id`, `prompt`, `answer`, `tools`, `requires_tool`, `env_state`, `info`,
//! `gold_tool_calls`, `environment`), `messages` the prompt's and the
//! rollout's messages (`role`, `content`, `tool_calls` with `arguments` as
//! objects, `name` on tool messages), `completion` the last assistant text.
//!
//! A response is `{"id", "score": <number>}`, `{"id", "score": null}` (does
//! not apply) or `{"id", "error": "…"}` (could not score). Other keys are
//! ignored. Anything else is a bad response, which fails the request as well.
//!
//! ```
//! use rlmesh_verifiers::protocol::parse_response;
//! use rlmesh_verifiers::Score;
//! let r = parse_response(r#"{"id": 7, "score": 0.5}"#);
//! assert_eq!((r.id, r.outcome), (Some(7), Ok(Score::Value(0.5))));
//! assert_eq!(parse_response(r#"{"id": 7, "score": null}"#).outcome, Ok(Score::NotApplicable));
//! assert!(parse_response("0.5").outcome.is_err());
//! ```
use crate::{Request, Score};
use rlmesh_core::dataset::task_row;
use serde_json::{json, Value};

/// The most of a bad line an error quotes.
const QUOTED: usize = 200;

/// The request line for `req` with `id` (no newline).
pub fn request_line(id: u64, req: &Request<'_>) -> String {
    json!({"id": id, "task": task_row(req.task), "messages": req.messages, "completion": req.completion}).to_string()
}

/// What a response said: the id it names (if one could be read), and the
/// score — or why it is not a valid response.
#[derive(Clone, Debug, PartialEq)]
pub struct Response {
    /// The request it answers.
    pub id: Option<u64>,
    /// The verifier's answer (its `error` is [`Score::Unscorable`]), or what is wrong with the line.
    pub outcome: Result<Score, String>,
}

/// Reads one response line (or HTTP body).
pub fn parse_response(line: &str) -> Response {
    let bad = |id, why: String| Response { id, outcome: Err(why) };
    let obj = match serde_json::from_str::<Value>(line) {
        Ok(Value::Object(o)) => o,
        Ok(_) | Err(_) => return bad(None, format!("not a response object: {}", quote(line))),
    };
    let id = match obj.get("id") {
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::String(s)) => s.parse().ok(),
        _ => None,
    };
    let outcome = match (obj.get("score"), obj.get("error")) {
        (Some(_), Some(_)) => Err(format!("both \"score\" and \"error\": {}", quote(line))),
        (Some(Value::Null), None) => Ok(Score::NotApplicable),
        (Some(Value::Number(n)), None) => match n.as_f64() {
            Some(v) if v.is_finite() => Ok(Score::Value(v)),
            _ => Err(format!("\"score\" is not a finite number: {}", quote(line))),
        },
        (Some(other), None) => Err(format!("\"score\" must be a number or null, got {other}")),
        (None, Some(e)) => Ok(Score::Unscorable {
            reason: format!("the verifier said: {}", e.as_str().map_or_else(|| e.to_string(), String::from)),
        }),
        (None, None) => Err(format!("neither \"score\" nor \"error\": {}", quote(line))),
    };
    Response { id, outcome }
}

/// `line`, cut to [`QUOTED`] bytes, in quotes.
pub(crate) fn quote(line: &str) -> String {
    let mut end = line.len().min(QUOTED);
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    if end < line.len() {
        format!("{:?}…", &line[..end])
    } else {
        format!("{line:?}")
    }
}
