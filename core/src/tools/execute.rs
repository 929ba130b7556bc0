//! Running tool calls safely: a time limit, an output limit, panics caught, a
//! cap on calls per turn, and repeated-call detection.
//!
//! Each call runs on its own thread; the caller waits at most the time limit.
//! A tool that hangs is abandoned (its thread keeps running until the tool
//! returns: Rust cannot kill a thread), so it never blocks the rollout.
//!
//! Tool threads are named `tool:<name>`; the first call installs a panic hook
//! that stays silent for them (the panic message is recorded in the step, and
//! printing a backtrace can take longer than the time limit) and defers to the
//! previous hook for every other thread.
use super::parse::ParsedCall;
use super::tool::{error_result, CallError, Tool};
use crate::trajectory::Step;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::collections::HashSet;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{mpsc, Once};
use std::time::{Duration, Instant};

/// Limits applied to every tool call.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct ExecLimits {
    /// Wall-time limit of one call, in milliseconds.
    pub timeout_ms: u64,
    /// Longest tool result kept, in bytes (longer ones are truncated and marked).
    pub max_output_bytes: usize,
    /// Calls executed per assistant turn; further calls get an error result.
    pub max_calls_per_turn: usize,
}

impl Default for ExecLimits {
    fn default() -> Self {
        ExecLimits { timeout_ms: 10_000, max_output_bytes: 4096, max_calls_per_turn: 8 }
    }
}

/// Why a function run with [`run_limited`] gave no value.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum Interrupted {
    /// It panicked, with this message.
    #[error("panicked: {0}")]
    Panicked(String),
    /// It did not return within the limit.
    #[error("did not return within the time limit")]
    TimedOut,
}

/// Runs `f` on a fresh thread and waits at most `timeout` for its value;
/// a panic is caught and returned as its message.
pub fn run_limited<T, F>(name: &str, timeout: Duration, f: F) -> Result<T, Interrupted>
where
    T: Send + 'static,
    F: FnOnce() -> T + Send + 'static,
{
    static QUIET_TOOL_PANICS: Once = Once::new();
    QUIET_TOOL_PANICS.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !std::thread::current().name().is_some_and(|n| n.starts_with(THREAD_PREFIX)) {
                previous(info);
            }
        }));
    });
    let (tx, rx) = mpsc::sync_channel(1);
    let spawned = std::thread::Builder::new().name(format!("{THREAD_PREFIX}{name}")).spawn(move || {
        let out = catch_unwind(AssertUnwindSafe(f)).map_err(|p| panic_message(p.as_ref()));
        let _ = tx.send(out);
    });
    if let Err(e) = spawned {
        return Err(Interrupted::Panicked(format!("could not start a thread: {e}")));
    }
    match rx.recv_timeout(timeout) {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(message)) => Err(Interrupted::Panicked(message)),
        Err(mpsc::RecvTimeoutError::Timeout) => Err(Interrupted::TimedOut),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err(Interrupted::Panicked("the tool thread exited".into())),
    }
}

const THREAD_PREFIX: &str = "tool:";

fn panic_message(p: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = p.downcast_ref::<&str>() {
        s.to_string()
    } else if let Some(s) = p.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic without a message".into()
    }
}

/// Cuts `text` to at most `max_bytes` (on a character boundary) and marks the
/// cut: `…[truncated N bytes]`, N the number of bytes removed.
pub fn truncate_output(mut text: String, max_bytes: usize) -> String {
    if text.len() <= max_bytes {
        return text;
    }
    let cut = (0..=max_bytes).rev().find(|&i| text.is_char_boundary(i)).unwrap_or(0);
    let removed = text.len() - cut;
    text.truncate(cut);
    text.push_str(&format!("…[truncated {removed} bytes]"));
    text
}

/// The canonical text of a call's arguments: object keys sorted at every
/// level, integral floats written as integers (`17.0` ≡ `17`).
pub fn canonical_arguments(v: &Value) -> String {
    fn canon(v: &Value) -> Value {
        match v {
            Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                Value::Object(keys.into_iter().map(|k| (k.clone(), canon(&m[k]))).collect())
            }
            Value::Array(a) => Value::Array(a.iter().map(canon).collect()),
            Value::Number(n) => match n.as_f64() {
                Some(f) if n.is_f64() && f.fract() == 0.0 && f.abs() < 9.0e15 => Value::from(f as i64),
                _ => v.clone(),
            },
            _ => v.clone(),
        }
    }
    canon(v).to_string()
}

/// Executes one assistant turn's calls in order with the limits, one [`Step`]
/// per call (latency 0 for calls that were not run). `seen` holds the `(name, canonical arguments)` of earlier calls in
/// the rollout and marks repeats; it is updated.
pub(crate) fn execute_calls(
    tools: &[Tool],
    limits: &ExecLimits,
    seen: &mut HashSet<(String, String)>,
    turn: usize,
    calls: &[ParsedCall],
) -> Vec<Step> {
    calls
        .iter()
        .enumerate()
        .map(|(index, call)| {
            let repeated = !matches!(call.error, Some(CallError::Format(_)))
                && !seen.insert((call.name.clone(), canonical_arguments(&call.arguments)));
            let (outcome, latency_ms) = if index >= limits.max_calls_per_turn {
                (Err(CallError::CallLimit(limits.max_calls_per_turn)), 0.0)
            } else if let Some(e) = &call.error {
                (Err(e.clone()), 0.0)
            } else {
                let start = Instant::now();
                let outcome = run_call(tools, limits, call);
                (outcome, start.elapsed().as_secs_f64() * 1000.0)
            };
            let (result, success, error) = match outcome {
                Ok(text) => (truncate_output(text, limits.max_output_bytes), true, None),
                Err(e) => {
                    let text = truncate_output(e.to_string(), limits.max_output_bytes);
                    (error_result(&text), false, Some(text))
                }
            };
            Step {
                turn,
                index,
                name: call.name.clone(),
                arguments: call.arguments.clone(),
                result,
                success,
                error,
                latency_ms,
                repeated,
            }
        })
        .collect()
}

fn run_call(tools: &[Tool], limits: &ExecLimits, call: &ParsedCall) -> Result<String, CallError> {
    let Some(tool) = tools.iter().find(|t| t.name() == call.name) else {
        let available = tools.iter().map(Tool::name).collect::<Vec<_>>().join(", ");
        return Err(CallError::UnknownTool { name: call.name.clone(), available });
    };
    let (t, args) = (tool.clone(), call.arguments.clone());
    match run_limited(&call.name, Duration::from_millis(limits.timeout_ms), move || t.call(&args)) {
        Ok(r) => r,
        Err(Interrupted::Panicked(message)) => Err(CallError::Panicked { tool: call.name.clone(), message }),
        Err(Interrupted::TimedOut) => Err(CallError::TimedOut { tool: call.name.clone(), ms: limits.timeout_ms }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn truncation_respects_char_boundaries_and_counts_removed_bytes() {
        assert_eq!(truncate_output("abc".into(), 3), "abc");
        assert_eq!(truncate_output("abcdef".into(), 4), "abcd…[truncated 2 bytes]");
        // "é" is two bytes: a cut inside it backs off to the boundary before it.
        assert_eq!(truncate_output("aéb".into(), 2), "a…[truncated 3 bytes]");
    }

    #[test]
    fn canonical_arguments_ignore_key_order_and_integral_floats() {
        assert_eq!(canonical_arguments(&json!({"b": 24, "a": 17.0})), canonical_arguments(&json!({"a": 17, "b": 24})));
        assert_ne!(canonical_arguments(&json!({"a": 17.5})), canonical_arguments(&json!({"a": 17})));
        assert_eq!(canonical_arguments(&json!({"x": [{"z": 1, "y": 2}]})), r#"{"x":[{"y":2,"z":1}]}"#);
    }

    #[test]
    fn run_limited_returns_values_panics_and_timeouts() {
        let d = Duration::from_millis(500);
        assert_eq!(run_limited("ok", d, || 7), Ok(7));
        assert_eq!(run_limited("boom", d, || -> i32 { panic!("boom {}", 1) }), Err(Interrupted::Panicked("boom 1".into())));
        let t = Instant::now();
        let r = run_limited("hang", Duration::from_millis(50), || std::thread::sleep(Duration::from_secs(5)));
        assert_eq!(r, Err(Interrupted::TimedOut));
        assert!(t.elapsed() < Duration::from_secs(2));
    }
}
