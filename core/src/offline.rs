//! Offline re-scoring: the logic behind `launcher advantages` and `launcher reward` (JSON in, JSON out).
//!
//! [`advantages_json`] takes `{"estimator", "params", "groups"}` and returns
//! `{"advantages": [[[per-token]]], "returns": … }` (returns only for StepTool
//! with a critic). [`reward_json_line`] scores one JSONL line
//! `{"reward", "task", "completion" | "messages", "judge_score"?}` and returns
//! `{"total", "components"}` (plus `"step_rewards"` for StepTool). Both
//! follow `shared/design/CLI.md`; every error names the offending field, e.g.
//! `groups[1][0].loss_mask: expected array of 0/1`. A malformed completion is
//! data, scored like any other (format 0), never an error.
//!
//! Parameter defaults: `reward_weights` all 1, `scale_rewards` `"group"`
//! (Dr.GRPO: `"none"`, the only value it accepts); SLCA `w_process` 1,
//! `w_summary` 1, `norm_by_std` true; StepTool `gamma` 0.99, `lam` 0.95,
//! `kl_coef` 0.3 (applied only where `logprobs` and `ref_logprobs` are given),
//! `upstream_weighting` false, `critic_free` false.
//!
//! Bounds: every number read must be finite and within ±[`MAX_MAGNITUDE`]
//! (larger ones overflow the estimators' f64 sums and squares, or the f32
//! output); `gamma` and `lam` lie in [0, 1], `kl_coef` is ≥ 0. An advantage or
//! return that still comes out non-finite is an error naming its group,
//! rollout and token, never a null or a silent 0.
use crate::advantage::grpo::{grpo_advantages, rloo_advantages, ScaleRewards};
use crate::advantage::slca::{slca_advantages, SlcaParams, SlcaRollout};
use crate::advantage::steptool::{critic_free_advantages, place_step_rewards, steptool_advantages, StepToolParams, StepToolRollout};
use crate::advantage::broadcast;
use crate::chat::Message;
use crate::reward::combine::combine_rewards;
use crate::reward::hierr::hierr_reward;
use crate::reward::judge::{FixedJudge, Judge, JudgeStats, RuleJudge};
use crate::reward::process::{final_only_reward, process_reward};
use crate::reward::steptool::{annotate, steptool_reward};
use crate::reward::Transcript;
use crate::task::Task;
use serde_json::{json, Value};

/// A bad `launcher advantages` / `launcher reward` input.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OfflineError {
    /// The input is not JSON (the parser's message, with a hint for NaN and Infinity).
    #[error("input: not valid JSON ({0})")]
    NotJson(String),
    /// A field is missing or has the wrong shape.
    #[error("{path}: expected {expected}")]
    Field {
        /// Where, e.g. `groups[1][0].loss_mask`.
        path: String,
        /// What was expected there.
        expected: String,
    },
}

/// The largest magnitude accepted for any number of the input: squares of
/// differences (up to 4e30) summed over millions of tokens stay far inside
/// f64, and advantages, returns and weighted sums stay inside f32 (3.4e38).
pub const MAX_MAGNITUDE: f64 = 1e15;

/// Parses JSON text; the error says what the parser expected, and that NaN and
/// Infinity, which some writers emit, are not JSON.
pub fn parse_json(text: &str) -> Result<Value, OfflineError> {
    serde_json::from_str(text).map_err(|e| {
        let hint = if ["NaN", "Infinity"].iter().any(|w| text.contains(w)) {
            "; NaN and Infinity are not JSON numbers: write null or a finite number"
        } else {
            ""
        };
        OfflineError::NotJson(format!("{e}{hint}"))
    })
}

fn bad(path: impl Into<String>, expected: impl Into<String>) -> OfflineError {
    OfflineError::Field { path: path.into(), expected: expected.into() }
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_string()
    } else {
        format!("{path}.{key}")
    }
}

fn object<'a>(v: &'a Value, path: &str) -> Result<&'a serde_json::Map<String, Value>, OfflineError> {
    v.as_object().ok_or_else(|| bad(if path.is_empty() { "input" } else { path }, "a JSON object"))
}

/// The expectation of a bounded number, for errors.
fn bounded(what: &str) -> String {
    format!("{what} within ±{MAX_MAGNITUDE:e} (larger values overflow the estimators)")
}

/// A finite number within ±[`MAX_MAGNITUDE`]; `what` says what was expected there.
fn bounded_number(v: &Value, path: &str, what: &str) -> Result<f64, OfflineError> {
    match v.as_f64() {
        Some(x) if x.abs() <= MAX_MAGNITUDE => Ok(x),
        Some(x) => Err(bad(path, format!("{}, got {}", bounded(what), show(x)))),
        None => Err(bad(path, what)),
    }
}

fn number(v: &Value, path: &str) -> Result<f64, OfflineError> {
    bounded_number(v, path, "a number")
}

/// An optional parameter in `[lo, hi]` with a default.
fn param_in(obj: &serde_json::Map<String, Value>, key: &str, default: f64, lo: f64, hi: f64, why: &str) -> Result<f64, OfflineError> {
    let path = join("params", key);
    let x = match obj.get(key).filter(|v| !v.is_null()) {
        None => default,
        Some(v) => v.as_f64().ok_or_else(|| bad(&path, "a number"))?,
    };
    if (lo..=hi).contains(&x) {
        Ok(x)
    } else {
        Err(bad(path, format!("a number in [{}, {}] ({why}), got {}", show(lo), show(hi), show(x))))
    }
}

/// A number as errors print it: plain when short, else in exponent form.
fn show(x: f64) -> String {
    if x != 0.0 && !(1e-4..1e6).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        x.to_string()
    }
}

/// The first non-finite value of per-token output `field`, as an error naming group, rollout and token.
fn check_finite(field: &str, out: &[Vec<Vec<f32>>]) -> Result<(), OfflineError> {
    for (g, group) in out.iter().enumerate() {
        for (i, rollout) in group.iter().enumerate() {
            if let Some(t) = rollout.iter().position(|x| !x.is_finite()) {
                return Err(bad(
                    format!("groups[{g}][{i}]"),
                    format!("inputs whose {field} are finite: token {t} overflows to {} (scale the inputs down)", rollout[t]),
                ));
            }
        }
    }
    Ok(())
}

/// An optional number field with a default.
fn number_or(obj: &serde_json::Map<String, Value>, path: &str, key: &str, default: f64) -> Result<f64, OfflineError> {
    obj.get(key).filter(|v| !v.is_null()).map_or(Ok(default), |v| number(v, &join(path, key)))
}

/// An optional boolean field with a default.
fn bool_or(obj: &serde_json::Map<String, Value>, path: &str, key: &str, default: bool) -> Result<bool, OfflineError> {
    obj.get(key).filter(|v| !v.is_null()).map_or(Ok(default), |v| v.as_bool().ok_or_else(|| bad(join(path, key), "true or false")))
}

fn required<'a>(obj: &'a serde_json::Map<String, Value>, path: &str, key: &str, what: &str) -> Result<&'a Value, OfflineError> {
    obj.get(key).ok_or_else(|| bad(join(path, key), what))
}

fn array<'a>(v: &'a Value, path: &str, what: &str) -> Result<&'a Vec<Value>, OfflineError> {
    v.as_array().ok_or_else(|| bad(path, what))
}

fn loss_mask(rollout: &serde_json::Map<String, Value>, path: &str) -> Result<Vec<u8>, OfflineError> {
    let p = join(path, "loss_mask");
    let what = "array of 0/1";
    let items = array(required(rollout, path, "loss_mask", what)?, &p, what)?;
    items
        .iter()
        .map(|x| match x {
            Value::Bool(b) => Ok(u8::from(*b)),
            Value::Number(n) if n.as_f64() == Some(0.0) => Ok(0),
            Value::Number(n) if n.as_f64() == Some(1.0) => Ok(1),
            _ => Err(bad(&p, what)),
        })
        .collect()
}

/// A numeric array, of length `len` when given.
fn numbers(rollout: &serde_json::Map<String, Value>, path: &str, key: &str, len: Option<usize>) -> Result<Vec<f64>, OfflineError> {
    let p = join(path, key);
    let what = match len {
        Some(n) => format!("array of {n} numbers (one per loss_mask entry)"),
        None => "array of numbers".to_string(),
    };
    let items = array(required(rollout, path, key, &what)?, &p, &what)?;
    if len.is_some_and(|n| n != items.len()) {
        return Err(bad(p, what));
    }
    items.iter().map(|x| bounded_number(x, &p, &what)).collect()
}

fn to_f32(xs: Vec<f64>) -> Vec<f32> {
    xs.into_iter().map(|x| x as f32).collect()
}

/// The per-token advantages (and returns, where defined) of `launcher advantages`.
pub fn advantages_json(input: &Value) -> Result<Value, OfflineError> {
    let root = object(input, "")?;
    let estimators = "one of \"grpo\", \"dr_grpo\", \"rloo\", \"slca\", \"steptool\"";
    let estimator = required(root, "", "estimator", estimators)?.as_str().ok_or_else(|| bad("estimator", estimators))?;
    let empty = json!({});
    let params = object(root.get("params").filter(|p| !p.is_null()).unwrap_or(&empty), "params")?;
    let groups_v = array(required(root, "", "groups", "array of groups")?, "groups", "array of groups (arrays of rollouts)")?;
    let mut groups = Vec::with_capacity(groups_v.len());
    for (g, group) in groups_v.iter().enumerate() {
        let path = format!("groups[{g}]");
        let rollouts = array(group, &path, "array of rollouts")?;
        let rollouts = rollouts
            .iter()
            .enumerate()
            .map(|(i, r)| object(r, &format!("{path}[{i}]")))
            .collect::<Result<Vec<_>, _>>()?;
        groups.push(rollouts);
    }
    match estimator {
        "grpo" | "dr_grpo" | "rloo" => group_relative(estimator, params, &groups),
        "slca" => slca(params, &groups),
        "steptool" => steptool(params, &groups),
        _ => Err(bad("estimator", estimators)),
    }
}

type Rollouts<'a> = Vec<Vec<&'a serde_json::Map<String, Value>>>;

fn group_relative(estimator: &str, params: &serde_json::Map<String, Value>, groups: &Rollouts<'_>) -> Result<Value, OfflineError> {
    let mut masks = Vec::new();
    let mut matrices = Vec::new();
    let mut n_functions = None;
    for (g, group) in groups.iter().enumerate() {
        let (mut gm, mut rows) = (Vec::new(), Vec::new());
        for (i, r) in group.iter().enumerate() {
            let path = format!("groups[{g}][{i}]");
            gm.push(loss_mask(r, &path)?);
            let p = join(&path, "rewards");
            let what = match n_functions {
                Some(f) => format!("array of {f} numbers or nulls (one per reward function)"),
                None => "array of numbers or nulls (one per reward function)".to_string(),
            };
            let items = array(required(r, &path, "rewards", &what)?, &p, &what)?;
            if n_functions.is_some_and(|f| f != items.len()) {
                return Err(bad(p, what));
            }
            n_functions = Some(items.len());
            let row = items
                .iter()
                .map(|x| match x {
                    Value::Null => Ok(None),
                    v => bounded_number(v, &p, &what).map(Some),
                })
                .collect::<Result<Vec<_>, _>>()?;
            rows.push(row);
        }
        masks.push(gm);
        matrices.push(rows);
    }
    let f = n_functions.unwrap_or(0);
    let weights = match params.get("reward_weights").filter(|w| !w.is_null()) {
        None => vec![1.0; f],
        Some(w) => {
            let what = format!("array of {f} numbers (one per reward function)");
            let items = array(w, "params.reward_weights", &what)?;
            if items.len() != f {
                return Err(bad("params.reward_weights", what));
            }
            items.iter().map(|x| bounded_number(x, "params.reward_weights", &what)).collect::<Result<_, _>>()?
        }
    };
    let scale_name = params.get("scale_rewards").filter(|s| !s.is_null());
    let scale = match (estimator, scale_name) {
        ("dr_grpo", None) => ScaleRewards::None,
        ("dr_grpo", Some(v)) if v.as_str() == Some("none") => ScaleRewards::None,
        ("dr_grpo", Some(_)) => return Err(bad("params.scale_rewards", "\"none\" (Dr.GRPO does not scale)")),
        (_, None) => ScaleRewards::Group,
        (_, Some(v)) => v
            .as_str()
            .and_then(ScaleRewards::parse)
            .ok_or_else(|| bad("params.scale_rewards", "one of \"group\", \"batch\", \"none\""))?,
    };
    let rewards: Vec<Vec<f64>> = matrices.iter().map(|m| combine_rewards(m, &weights)).collect();
    let advantages = if estimator == "rloo" { rloo_advantages(&rewards) } else { grpo_advantages(&rewards, scale) };
    let per_token: Vec<Vec<Vec<f32>>> = masks
        .iter()
        .zip(&advantages)
        .map(|(ms, adv)| ms.iter().zip(adv).map(|(m, a)| broadcast(m, *a)).collect())
        .collect();
    check_finite("advantages", &per_token)?;
    Ok(json!({ "advantages": per_token }))
}

fn slca(params: &serde_json::Map<String, Value>, groups: &Rollouts<'_>) -> Result<Value, OfflineError> {
    let p = SlcaParams {
        w_process: number_or(params, "params", "w_process", 1.0)?,
        w_summary: number_or(params, "params", "w_summary", 1.0)?,
        norm_by_std: bool_or(params, "params", "norm_by_std", true)?,
    };
    let mut out = Vec::with_capacity(groups.len());
    for (g, group) in groups.iter().enumerate() {
        let mut masks = Vec::with_capacity(group.len());
        let mut scores = Vec::with_capacity(group.len());
        for (i, r) in group.iter().enumerate() {
            let path = format!("groups[{g}][{i}]");
            masks.push(loss_mask(r, &path)?);
            let num = |key: &str| number(required(r, &path, key, "a number")?, &join(&path, key));
            scores.push((num("process")?, num("summary")?, num("total")?, bool_or(r, &path, "no_call", false)?));
        }
        let rollouts: Vec<SlcaRollout<'_>> = masks
            .iter()
            .zip(&scores)
            .map(|(m, &(process, summary, total, no_call))| SlcaRollout { loss_mask: m, process, summary, total, no_call })
            .collect();
        out.push(slca_advantages(&rollouts, &p));
    }
    check_finite("advantages", &out)?;
    Ok(json!({ "advantages": out }))
}

/// One StepTool rollout read from JSON.
struct StepInput {
    mask: Vec<u8>,
    step_rewards: Option<Vec<f64>>,
    token_rewards: Vec<f64>,
    values: Vec<f32>,
    logprobs: Option<(Vec<f32>, Vec<f32>)>,
}

fn steptool(params: &serde_json::Map<String, Value>, groups: &Rollouts<'_>) -> Result<Value, OfflineError> {
    let p = StepToolParams {
        gamma: param_in(params, "gamma", 0.99, 0.0, 1.0, "a discount")?,
        lam: param_in(params, "lam", 0.95, 0.0, 1.0, "GAE's λ")?,
        kl_coef: param_in(params, "kl_coef", 0.3, 0.0, MAX_MAGNITUDE, "a penalty weight")?,
        upstream_weighting: bool_or(params, "params", "upstream_weighting", false)?,
    };
    let critic_free = bool_or(params, "params", "critic_free", false)?;
    let mut inputs: Vec<Vec<StepInput>> = Vec::with_capacity(groups.len());
    for (g, group) in groups.iter().enumerate() {
        let mut gi = Vec::with_capacity(group.len());
        for (i, r) in group.iter().enumerate() {
            let path = format!("groups[{g}][{i}]");
            let mask = loss_mask(r, &path)?;
            let n = Some(mask.len());
            let (step_rewards, token_rewards) = match (r.contains_key("step_rewards"), r.contains_key("token_rewards")) {
                (true, false) => {
                    let steps = numbers(r, &path, "step_rewards", None)?;
                    let placed = place_step_rewards(&mask, &steps, p.upstream_weighting)
                        .map_err(|e| bad(join(&path, "step_rewards"), e.to_string().trim_start_matches("step_rewards: expected ")))?;
                    (Some(steps), placed)
                }
                (false, true) if !critic_free => (None, numbers(r, &path, "token_rewards", n)?),
                (false, true) => return Err(bad(join(&path, "step_rewards"), "array of numbers (critic_free reads step rewards)")),
                _ => return Err(bad(path, "exactly one of \"step_rewards\" or \"token_rewards\"")),
            };
            let values = if critic_free { Vec::new() } else { to_f32(numbers(r, &path, "values", n)?) };
            let logprobs = match (r.contains_key("logprobs"), r.contains_key("ref_logprobs")) {
                (false, false) => None,
                (true, true) => Some((to_f32(numbers(r, &path, "logprobs", n)?), to_f32(numbers(r, &path, "ref_logprobs", n)?))),
                (true, false) => return Err(bad(join(&path, "ref_logprobs"), "an array beside \"logprobs\"")),
                (false, true) => return Err(bad(join(&path, "logprobs"), "an array beside \"ref_logprobs\"")),
            };
            gi.push(StepInput { mask, step_rewards, token_rewards, values, logprobs });
        }
        inputs.push(gi);
    }
    if critic_free {
        let mut out = Vec::with_capacity(inputs.len());
        for (g, group) in inputs.iter().enumerate() {
            let pairs: Vec<(&[u8], &[f64])> =
                group.iter().map(|s| (s.mask.as_slice(), s.step_rewards.as_deref().unwrap_or(&[]))).collect();
            out.push(
                critic_free_advantages(&pairs, p.gamma, p.upstream_weighting)
                    .map_err(|e| bad(format!("groups[{g}]"), format!("step rewards matching the loss masks ({e})")))?,
            );
        }
        check_finite("advantages", &out)?;
        return Ok(json!({ "advantages": out }));
    }
    let batch: Vec<StepToolRollout<'_>> = inputs
        .iter()
        .flatten()
        .map(|s| StepToolRollout {
            loss_mask: &s.mask,
            token_rewards: &s.token_rewards,
            values: &s.values,
            logprobs: s.logprobs.as_ref().map(|(a, b)| (a.as_slice(), b.as_slice())),
        })
        .collect();
    let out = steptool_advantages(&batch, &p).map_err(|e| bad("groups", format!("consistent per-token arrays ({e})")))?;
    let (mut adv, mut ret) = (out.advantages.into_iter(), out.returns.into_iter());
    let regroup = |it: &mut dyn Iterator<Item = Vec<f32>>| -> Vec<Vec<Vec<f32>>> {
        inputs.iter().map(|g| g.iter().map(|_| it.next().unwrap_or_default()).collect()).collect()
    };
    let (adv, ret) = (regroup(&mut adv), regroup(&mut ret));
    check_finite("advantages", &adv)?;
    check_finite("returns", &ret)?;
    Ok(json!({ "advantages": adv, "returns": ret }))
}

/// Scores one `launcher reward` input line.
pub fn reward_json_line(line: &str) -> Result<Value, OfflineError> {
    let v = parse_json(line)?;
    let root = object(&v, "")?;
    let kinds = "one of \"process\", \"final_only\", \"hierr\", \"steptool\"";
    let kind = required(root, "", "reward", kinds)?.as_str().ok_or_else(|| bad("reward", kinds))?;
    let task: Task = serde_json::from_value(required(root, "", "task", "a task object")?.clone())
        .map_err(|e| bad("task", format!("a task object with requires_tool, allowed_tools, gold_tool_calls, expected_answer ({e})")))?;
    let transcript = match (root.get("completion"), root.get("messages")) {
        (Some(c), None) => Transcript::from_completion(c.as_str().ok_or_else(|| bad("completion", "a string"))?),
        (None, Some(m)) => {
            let messages: Vec<Message> = serde_json::from_value(m.clone())
                .map_err(|e| bad("messages", format!("an array of chat messages ({e})")))?;
            Transcript::from_messages(&messages)
        }
        _ => return Err(bad("completion", "exactly one of \"completion\" (a string) or \"messages\" (an array)")),
    };
    let judge: Box<dyn Judge> = match root.get("judge_score").filter(|j| !j.is_null()) {
        None => Box::new(RuleJudge),
        Some(j) => match j.as_u64().filter(|r| (1..=5).contains(r)) {
            Some(r) => Box::new(FixedJudge(r as u8)),
            None => return Err(bad("judge_score", "an integer 1..=5")),
        },
    };
    let out = match kind {
        "process" => process_reward(&task, &transcript).to_json(),
        "final_only" => final_only_reward(&task, &transcript).to_json(),
        "hierr" => hierr_reward(&task, &transcript, judge.as_ref(), &JudgeStats::default()).to_json(),
        "steptool" => {
            let mut out = steptool_reward(&task, &transcript).to_json();
            out["step_rewards"] = json!(annotate(&task, &transcript).step_rewards());
            out
        }
        _ => return Err(bad("reward", kinds)),
    };
    Ok(out)
}
