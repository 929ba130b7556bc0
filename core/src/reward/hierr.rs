//! HierR: SLCA-GRPO's hierarchical process reward, the judge-scored summary reward, and the no-call penalty.
//!
//! `process = 0.10·fmt + 0.25·name + 0.15·key + 0.20·value + 0.30·parallel`.
//! A block is *valid* when it is well-shaped and every name in it is allowed
//! (`allowed_tools`; when empty, the gold names; when both are empty, any
//! name). The predicted calls are those of valid blocks.
//! - fmt = valid blocks / max(#`<tool_call>`, #`</tool_call>`), 0 without tags;
//! - name = multiset F1 of predicted vs gold names (both empty → 1, one empty → 0);
//! - key, value: over gold calls with non-empty arguments (none → 1, 1; no
//!   predicted call → 0, 0); each gold call greedily takes the unused
//!   same-name prediction maximising key + value (first on ties; none left →
//!   0, 0); key = Jaccard of the key sets, value = keys with
//!   [`loose_eq`] values / gold keys; averaged over those gold calls;
//! - parallel = 1 when the first valid block has as many calls as the first
//!   gold step (no gold step: 1 when there is no valid block), else 0.
//!
//! Summary `q`: 0 without a tool response or with a final reply under 10
//! characters, else the judge's `(r − 1)/4`. A tool-requiring task with no
//! predicted call sets `no_call` and scores −0.5; otherwise the total is
//! `process + summary`.
use super::answer::loose_eq;
use super::judge::{judge_unit_score, Judge, JudgeRequest, JudgeStats};
use super::transcript::{Block, Call, Transcript};
use super::{indicator, Scored};
use crate::task::Task;
use serde_json::Value;
use std::collections::{BTreeSet, HashMap};

/// Total score of a tool-requiring rollout that made no call.
pub const NO_CALL_SCORE: f64 = -0.5;
/// Final replies shorter than this (in characters) get summary reward 0.
pub const MIN_SUMMARY_CHARS: usize = 10;

/// The five HierR process scores, each in 0..=1.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HierRProcess {
    /// Share of valid blocks.
    pub fmt: f64,
    /// Multiset F1 of call names.
    pub name: f64,
    /// Mean Jaccard of argument keys.
    pub key: f64,
    /// Mean share of matching argument values.
    pub value: f64,
    /// First block's call count equals the first gold step's.
    pub parallel: f64,
}

impl HierRProcess {
    /// `0.10·fmt + 0.25·name + 0.15·key + 0.20·value + 0.30·parallel`.
    pub fn process(&self) -> f64 {
        0.10 * self.fmt + 0.25 * self.name + 0.15 * self.key + 0.20 * self.value + 0.30 * self.parallel
    }
}

/// The blocks whose calls are all well-shaped and allowed.
fn valid_blocks<'t>(task: &Task, t: &'t Transcript) -> Vec<&'t [Call]> {
    let allowed: BTreeSet<&str> = if task.allowed_tools.is_empty() {
        task.gold_calls_flat().map(|g| g.name.as_str()).collect()
    } else {
        task.allowed_tools.iter().map(String::as_str).collect()
    };
    t.blocks()
        .filter_map(|b| match b {
            Block::Calls(c) if allowed.is_empty() || c.iter().all(|c| allowed.contains(c.name.as_str())) => Some(c.as_slice()),
            _ => None,
        })
        .collect()
}

/// The five process scores of a rollout.
pub fn hierr_process(task: &Task, t: &Transcript) -> HierRProcess {
    let valid = valid_blocks(task, t);
    let tags = t.open_tags.max(t.close_tags);
    let fmt = if tags == 0 { 0.0 } else { valid.len() as f64 / tags as f64 };
    let predicted: Vec<&Call> = valid.iter().flat_map(|b| b.iter()).collect();
    let gold: Vec<(&str, &Value)> = task.gold_calls_flat().map(|g| (g.name.as_str(), &g.arguments)).collect();
    let (key, value) = key_value(&predicted, &gold);
    let parallel = match (valid.first(), task.gold_tool_calls.first()) {
        (Some(b), Some(step)) => indicator(b.len() == step.len()),
        (None, None) => 1.0,
        _ => 0.0,
    };
    HierRProcess { fmt, name: name_f1(&predicted, &gold), key, value, parallel }
}

/// Summary reward `q` in 0..=1 (see the module doc); a judge failure gives 0 and is counted in `stats`.
pub fn summary_reward(task: &Task, t: &Transcript, judge: &dyn Judge, stats: &JudgeStats) -> f64 {
    if t.tool_responses == 0 || t.final_answer.chars().count() < MIN_SUMMARY_CHARS {
        return 0.0;
    }
    judge_unit_score(judge, &JudgeRequest { task, transcript: t }, stats)
}

/// HierR with components `fmt, name, key, value, parallel, process, summary, no_call`; total `process + summary` or −0.5.
pub fn hierr_reward(task: &Task, t: &Transcript, judge: &dyn Judge, stats: &JudgeStats) -> Scored {
    let p = hierr_process(task, t);
    let process = p.process();
    let no_call = task.requires_tool && valid_blocks(task, t).is_empty();
    let summary = if no_call { 0.0 } else { summary_reward(task, t, judge, stats) };
    let total = if no_call { NO_CALL_SCORE } else { process + summary };
    Scored {
        total,
        components: vec![
            ("fmt", Some(p.fmt)),
            ("name", Some(p.name)),
            ("key", Some(p.key)),
            ("value", Some(p.value)),
            ("parallel", Some(p.parallel)),
            ("process", Some(process)),
            ("summary", Some(summary)),
            ("no_call", Some(indicator(no_call))),
        ],
    }
}

/// Multiset F1 of predicted vs gold names.
fn name_f1(predicted: &[&Call], gold: &[(&str, &Value)]) -> f64 {
    match (predicted.is_empty(), gold.is_empty()) {
        (true, true) => return 1.0,
        (true, false) | (false, true) => return 0.0,
        _ => {}
    }
    let mut counts: HashMap<&str, usize> = HashMap::new();
    for (name, _) in gold {
        *counts.entry(name).or_default() += 1;
    }
    let mut hits = 0usize;
    for c in predicted {
        if let Some(n) = counts.get_mut(c.name.as_str()).filter(|n| **n > 0) {
            *n -= 1;
            hits += 1;
        }
    }
    2.0 * hits as f64 / (predicted.len() + gold.len()) as f64
}

/// Mean key and value scores over the gold calls that have arguments.
fn key_value(predicted: &[&Call], gold: &[(&str, &Value)]) -> (f64, f64) {
    let with_args: Vec<&(&str, &Value)> =
        gold.iter().filter(|(_, a)| a.as_object().is_some_and(|m| !m.is_empty())).collect();
    if with_args.is_empty() {
        return (1.0, 1.0);
    }
    if predicted.is_empty() {
        return (0.0, 0.0);
    }
    let mut used = vec![false; predicted.len()];
    let (mut key_sum, mut value_sum) = (0.0, 0.0);
    for (name, args) in &with_args {
        let mut best: Option<(usize, f64, f64)> = None;
        for (i, c) in predicted.iter().enumerate() {
            if used[i] || c.name != *name {
                continue;
            }
            let (k, v) = key_value_pair(&c.arguments, args);
            if best.is_none_or(|(_, bk, bv)| k + v > bk + bv) {
                best = Some((i, k, v));
            }
        }
        if let Some((i, k, v)) = best {
            used[i] = true;
            key_sum += k;
            value_sum += v;
        }
    }
    let n = with_args.len() as f64;
    (key_sum / n, value_sum / n)
}

/// Jaccard of key sets, and share of gold keys whose values match.
fn key_value_pair(predicted: &Value, gold: &Value) -> (f64, f64) {
    let empty = serde_json::Map::new();
    let p = predicted.as_object().unwrap_or(&empty);
    let g = gold.as_object().unwrap_or(&empty);
    let inter = g.keys().filter(|k| p.contains_key(*k)).count();
    let union = p.len() + g.len() - inter;
    let key = if union == 0 { 1.0 } else { inter as f64 / union as f64 };
    let matching = g.iter().filter(|(k, gv)| p.get(*k).is_some_and(|pv| loose_eq(pv, gv))).count();
    let value = if g.is_empty() { 1.0 } else { matching as f64 / g.len() as f64 };
    (key, value)
}
