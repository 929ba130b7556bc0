//! What a run records per RL step: the figures over scored groups, the
//! `metrics.jsonl` row (also set on the step's gauges), the step's phases and
//! the `batches.jsonl` row.
use super::recipe::Recipe;
use crate::learner::{StepStats, TrainBatch};
use crate::metrics::Metrics;
use crate::reward::ScoredGroup;
use serde_json::{json, Value};
use std::collections::HashMap;

/// Figures over a set of scored groups.
pub(super) fn figures(groups: &[ScoredGroup]) -> Value {
    let (mut n, mut ok, mut fin, mut rep, mut tool_tasks, mut tool_called, mut plain, mut unnec) = (0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0);
    for g in groups {
        for s in &g.scores {
            let o = s.outcome;
            n += 1.0;
            ok += o.success as u8 as f64;
            fin += o.final_correct as u8 as f64;
            rep += o.repeated_call as u8 as f64;
            if g.group.task.requires_tool {
                tool_tasks += 1.0;
                tool_called += o.called_tool as u8 as f64;
            } else {
                plain += 1.0;
                unnec += o.unnecessary_tool as u8 as f64;
            }
        }
    }
    let r = |a: f64, b: f64| if b > 0.0 { a / b } else { 0.0 };
    // On tool tasks: the gold steps made right in place, and the judged summary (SLCA's q).
    let (mut step_acc, mut summary) = (0.0, 0.0);
    for g in groups.iter().filter(|g| g.group.task.requires_tool) {
        for (t, s) in g.group.trajectories.iter().zip(&g.scores) {
            step_acc += rlmesh_core::analysis::step_call_accuracy(&g.group.task, t).unwrap_or(0.0);
            summary += s.segments.summary;
        }
    }
    json!({
        "rollouts": n, "trajectory_success": r(ok, n), "final_answer_accuracy": r(fin, n), "repeated_call_rate": r(rep, n),
        "tool_call_rate": r(tool_called, tool_tasks), "unnecessary_tool_rate": r(unnec, plain),
        "step_call_accuracy": r(step_acc, tool_tasks), "summary_score": r(summary, tool_tasks),
    })
}

/// One rate of [`figures`] as a number (NaN where it is missing). A
/// `serde_json::Value` ignores a format's precision, so progress lines take
/// their figures through this.
pub(super) fn rate(figures: &Value, key: &str) -> f64 {
    figures[key].as_f64().unwrap_or(f64::NAN)
}

/// The progress line after the warm-up's held-out evaluation, greedy and sampled.
pub(super) fn warmed_up_line(greedy: &Value, sampled: &Value) -> String {
    format!(
        "after warm-up: held-out success {:.3} (sampled {:.3}) final {:.3} unnecessary-tool {:.3} (sampled {:.3})",
        rate(greedy, "trajectory_success"),
        rate(sampled, "trajectory_success"),
        rate(greedy, "final_answer_accuracy"),
        rate(greedy, "unnecessary_tool_rate"),
        rate(sampled, "unnecessary_tool_rate")
    )
}

/// `RUN_DIR/batches.jsonl` (with `--record-batches`): per RL step, each
/// sequence's loss mask and the per-token advantages (or, for `steptool`, the
/// per-token rewards) the learner was sent.
pub(super) fn batch_record(step: u64, groups: &[ScoredGroup], batch: &TrainBatch) -> Value {
    let ids = groups.iter().flat_map(|g| g.group.trajectories.iter().chain(&g.group.earlier_segments).map(move |t| (g.group.group_id, t.sample_index)));
    let sequences: Vec<Value> = ids
        .zip(&batch.sequences)
        .map(|((group, sample), s)| json!({"group": group, "sample": sample, "loss_mask": s.loss_mask, "advantages": s.advantages, "rewards": s.rewards}))
        .collect();
    json!({"step": step, "sequences": sequences})
}
/// `RUN_DIR/scored.jsonl` (with `--record-batches`): each trained rollout as
/// the reward actor saw it (task and trajectory) with the total and the reward
/// functions' values it was trained on. `launcher reward --recipe` scores these
/// lines again, offline, to the same totals.
pub(super) fn scored_records(step: u64, groups: &[ScoredGroup]) -> Vec<Value> {
    groups
        .iter()
        .flat_map(|g| {
            g.group.trajectories.iter().zip(&g.scores).map(move |(t, s)| {
                let functions: serde_json::Map<String, Value> = s.functions.iter().map(|(n, v)| (n.clone(), json!(v))).collect();
                json!({"step": step, "group": g.group.group_id, "sample": t.sample_index, "task": g.group.task, "trajectory": t, "total": s.total, "functions": functions})
            })
        })
        .collect()
}

/// What one RL step did, for its record.
pub(super) struct StepFacts<'a> {
    pub(super) step: u64,
    pub(super) version: u64,
    pub(super) stats: &'a StepStats,
    pub(super) admitted: &'a [ScoredGroup],
    pub(super) gen_tok_s: f64,
    pub(super) max_stale: u64,
    pub(super) seconds: f64,
    pub(super) phases: &'a StepPhases,
}

/// Where the wall time between two RL step records went. Phases overlap when
/// the mode lets generation run ahead of training, so they may sum to more
/// than `step_seconds`.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct StepPhases {
    /// Wall seconds since the previous step's record (the first step: since the RL loop began).
    pub(super) step_seconds: f64,
    /// Tokens the policy generated in the rollout answers received in that time.
    pub(super) generated_tokens: usize,
    /// Rollout seconds outside tools (prefill and decode), summed over the answers.
    pub(super) generate: f64,
    /// Rollout seconds executing tools and appending their results.
    pub(super) tools: f64,
    /// Scoring the groups in this process (0 when a reward process scored them on their way).
    pub(super) reward: f64,
    /// The mean time the step's groups waited, scored, before the learner took them.
    pub(super) queue_wait: f64,
    /// Advantages and the learner's step.
    pub(super) train: f64,
    /// Of `train`, the learner's time in collectives with the other data-parallel ranks.
    pub(super) all_reduce: f64,
    /// Publishing the new version (the wait `up` sees; finished background syncs are in `weight_sync_seconds`).
    pub(super) sync: f64,
}

impl StepPhases {
    /// Observes the step on its histograms and sets each role's idle ratio,
    /// `rollout_actors` sharing the generation.
    pub(super) fn observe(&self, metrics: &Metrics, rollout_actors: usize) {
        metrics.step_seconds.observe(self.step_seconds);
        let phases = [self.generate, self.tools, self.reward, self.queue_wait, self.train, self.all_reduce, self.sync];
        for (name, secs) in crate::metrics::STEP_PHASES.iter().zip(phases) {
            metrics.step_phase_seconds.with_label_values(&[name]).observe(secs);
        }
        let step = self.step_seconds.max(1e-9);
        let idle = |busy: f64| (1.0 - busy / step).clamp(0.0, 1.0);
        metrics.idle_ratio.with_label_values(&["learner"]).set(idle(self.train));
        metrics.idle_ratio.with_label_values(&["rollout"]).set(idle((self.generate + self.tools) / rollout_actors.max(1) as f64));
        metrics.idle_ratio.with_label_values(&["reward"]).set(idle(self.reward));
    }

    pub(super) fn record(&self, row: &mut Value) {
        row["step_seconds"] = json!(self.step_seconds);
        row["generated_tokens"] = json!(self.generated_tokens);
        for (k, v) in [("generate", self.generate), ("tools", self.tools), ("reward", self.reward), ("queue_wait", self.queue_wait), ("train", self.train), ("all_reduce", self.all_reduce), ("sync", self.sync)] {
            row[format!("phase/{k}_seconds")] = json!(v);
        }
    }
}

/// One RL step's `metrics.jsonl` row (reward and its components, the rollout
/// figures, the learner's statistics), also set on the step's gauges.
pub(super) fn step_record(metrics: &Metrics, recipe: &Recipe, s: &StepFacts<'_>) -> Value {
    let _whole_step = metrics.update();
    let (stats, admitted) = (s.stats, s.admitted);
    let f = figures(admitted);
    let reward_mean = admitted.iter().flat_map(|g| g.scores.iter().map(|s| s.total)).sum::<f64>() / (admitted.len() * recipe.rl.group_size) as f64;
    let mut row = json!({
        "step": s.step, "version": s.version, "reward_mean": reward_mean, "loss": stats.loss, "kl": stats.kl, "entropy": stats.entropy,
        "clip_fraction": stats.clip_fraction, "grad_norm": stats.grad_norm, "learner_tokens_per_s": stats.tokens_per_s,
        "learner_trained_tokens": stats.trained_tokens, "learner_computed_tokens": stats.computed_tokens,
        "learner_computed_per_trained": stats.computed_tokens as f64 / stats.trained_tokens.max(1) as f64,
        "tokens_per_s": s.gen_tok_s, "staleness_max": s.max_stale, "groups_trained": admitted.len(), "seconds": s.seconds,
    });
    s.phases.record(&mut row);
    for (k, v) in f.as_object().expect("object") {
        row[k] = v.clone();
    }
    // What the judge cost: wall seconds of scoring per group, and failed judge calls.
    let groups = admitted.len().max(1) as f64;
    row["judge/seconds_per_group"] = json!(admitted.iter().map(|g| g.judge.seconds).sum::<f64>() / groups);
    row["judge/calls"] = json!(admitted.iter().map(|g| g.judge.calls).sum::<u64>());
    row["judge/failures"] = json!(admitted.iter().map(|g| g.judge.failures).sum::<u64>());
    if let Some(v) = stats.value_loss {
        row["value_loss"] = json!(v);
    }
    if let Some(b) = stats.kl_coef {
        row["kl_coef"] = json!(b);
    }
    // The segment and step rewards, whatever the estimator trains on.
    let segs: Vec<&rlmesh_core::reward::segments::SegmentScores> = admitted.iter().flat_map(|g| g.scores.iter().map(|s| &s.segments)).collect();
    let n = segs.len().max(1) as f64;
    row["segment/process"] = json!(segs.iter().map(|s| s.process).sum::<f64>() / n);
    row["segment/summary"] = json!(segs.iter().map(|s| s.summary).sum::<f64>() / n);
    let steps: Vec<f64> = segs.iter().flat_map(|s| s.step_rewards.iter().copied()).collect();
    row["step_reward_mean"] = json!(steps.iter().sum::<f64>() / steps.len().max(1) as f64);
    let mut comp: HashMap<String, (f64, f64)> = HashMap::new();
    for t in admitted.iter().flat_map(|g| &g.scores) {
        for (name, v) in &t.components {
            if let Some(v) = v {
                let e = comp.entry(name.clone()).or_default();
                e.0 += v;
                e.1 += 1.0;
            }
        }
    }
    for (name, (sum, n)) in &comp {
        row[format!("reward/{name}")] = json!(sum / n);
        metrics.reward_component.with_label_values(&[name]).set(sum / n);
    }
    // Each reward function's mean and spread over the values it gave (TRL's per-function logs).
    let mut by_function: Vec<(String, Vec<f64>)> = Vec::new();
    for t in admitted.iter().flat_map(|g| &g.scores) {
        for (name, v) in &t.functions {
            let at = by_function.iter().position(|(n, _)| n == name).unwrap_or_else(|| {
                by_function.push((name.clone(), Vec::new()));
                by_function.len() - 1
            });
            by_function[at].1.push(v.unwrap_or(f64::NAN));
        }
    }
    for (name, values) in &by_function {
        let present: Vec<f64> = values.iter().copied().filter(|v| !v.is_nan()).collect();
        let mean = present.iter().sum::<f64>() / present.len().max(1) as f64;
        let mean = if present.is_empty() { f64::NAN } else { mean };
        metrics.reward_mean.with_label_values(&[name]).set(mean);
        metrics.reward_std.with_label_values(&[name]).set(rlmesh_core::reward::combine::nanstd(values));
        row[format!("reward_function/{name}")] = json!(mean);
    }
    let rate = |k: &str| f[k].as_f64().unwrap_or(0.0);
    metrics.trajectory_success.with_label_values(&["train"]).set(rate("trajectory_success"));
    metrics.final_answer_accuracy.with_label_values(&["train"]).set(rate("final_answer_accuracy"));
    metrics.tool_call_rate.with_label_values(&["train"]).set(rate("tool_call_rate"));
    metrics.unnecessary_tool_rate.with_label_values(&["train"]).set(rate("unnecessary_tool_rate"));
    metrics.repeated_call_rate.with_label_values(&["train"]).set(rate("repeated_call_rate"));
    metrics.tokens_per_second.with_label_values(&["rollout"]).set(s.gen_tok_s);
    metrics.tokens_per_second.with_label_values(&["learner"]).set(stats.tokens_per_s);
    metrics.policy_version.with_label_values(&["learner"]).set(s.version as f64);
    metrics.learner_step.set(s.step as f64);
    metrics.learner_loss.set(stats.loss);
    metrics.learner_kl.set(stats.kl.unwrap_or(0.0));
    metrics.learner_entropy.set(stats.entropy);
    metrics.learner_clip_fraction.set(stats.clip_fraction.unwrap_or(0.0));
    metrics.learner_grad_norm.set(stats.grad_norm);
    metrics.learner_tokens_total.with_label_values(&[crate::metrics::LEARNER_TOKEN_KINDS[0]]).inc_by(stats.trained_tokens as u64);
    metrics.learner_tokens_total.with_label_values(&[crate::metrics::LEARNER_TOKEN_KINDS[1]]).inc_by(stats.computed_tokens as u64);
    row
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warm_up_line_rounds_every_rate_to_three_places() {
        let greedy = json!({"trajectory_success": 0.965, "final_answer_accuracy": 2.0 / 3.0, "unnecessary_tool_rate": 1.0 / 93.0});
        let sampled = json!({"trajectory_success": 0.595, "unnecessary_tool_rate": 35.0 / 93.0});
        assert_eq!(
            warmed_up_line(&greedy, &sampled),
            "after warm-up: held-out success 0.965 (sampled 0.595) final 0.667 unnecessary-tool 0.011 (sampled 0.376)"
        );
        assert!(rate(&greedy, "absent").is_nan());
    }
}
