//! The end of a run: the final policy evaluated on the held-out tasks (greedy,
//! then sampled), its last checkpoint, and `summary.json`.
use super::driver::Driver;
use super::error::{io, RunError};
use super::journal::{checkpoint, write_status, Jsonl};
use super::record::{self, figures};
use super::rl_loop::RlLoop;
use super::setup::Policy;
use super::status::RunStatus;
use crate::node::fleet::Fleet;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// `summary.json`: the held-out figures of a finished run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Recipe name.
    pub recipe: String,
    /// Held-out tasks evaluated.
    pub eval_tasks: usize,
    /// Share with the right tool, arguments, execution and answer and no unnecessary or repeated call.
    pub trajectory_success: f64,
    /// Share with the right final answer.
    pub final_answer_accuracy: f64,
    /// Share of no-tool tasks where a tool was called.
    pub unnecessary_tool_rate: f64,
    /// Share of rollouts repeating a call.
    pub repeated_call_rate: f64,
    /// Share of tool tasks where a tool was called.
    pub tool_call_rate: f64,
    /// On tool tasks: the share of gold steps made right, in place.
    #[serde(default)]
    pub step_call_accuracy: f64,
    /// On tool tasks: the judged summary score `q` (0..=1).
    #[serde(default)]
    pub summary_score: f64,
    /// The same figures before RL (after the SFT warm-up).
    pub after_warmup: Option<Value>,
    /// The figures above come from greedy decoding; these from one rollout per
    /// held-out task sampled at the RL temperature (the policy's own
    /// distribution, as the seed measures it): `{"temperature", "final", "after_warmup"}`.
    #[serde(default)]
    pub sampled: Value,
    /// RL steps trained.
    pub steps: u64,
    /// Groups trained / dropped as stale / re-dispatched after a failure.
    pub groups: Value,
    /// Rollout actor restarts (the first actor in this process).
    pub actor_restarts: u64,
    /// Restarts of each process of a distributed run that was started again.
    #[serde(default)]
    pub process_restarts: std::collections::BTreeMap<String, u32>,
    /// The run's counters at the end, over every process of it (a resumed run's included).
    #[serde(default)]
    pub counters: crate::metrics::Carried,
    /// Wall seconds of the whole run.
    pub wall_seconds: f64,
    /// Where `/metrics` was served.
    pub metrics_addr: String,
}


/// Evaluates the final policy, checkpoints it with its tokenizer files, and
/// writes `summary.json` (returned). A resumed run writes the held-out table
/// anew rather than appending a second one.
pub(super) async fn finish(driver: &mut Driver, rl: &RlLoop<'_>, policy: &Policy, status: &mut RunStatus, metrics_addr: &str) -> Result<Summary, RunError> {
    let cx = rl.context();
    let (recipe, dir, metrics) = (cx.recipe, cx.dir, cx.metrics);
    let (step, version) = (rl.step, rl.version);
    write_status(status, dir, "eval", step, version, cx.fleet);
    // The last step published this version and the RL loop awaited it (a
    // process that missed it gets it before its next request): no second broadcast.
    if driver.current != Some(version) {
        driver.publish(version, true).await?;
    }
    let eval = driver.evaluate(&policy.held_out, recipe.seed + 1, true).await?;
    let f = figures(&eval);
    let f_sampled = figures(&driver.evaluate(&policy.held_out, recipe.seed + 1, false).await?);
    let mut eval_log = Jsonl::resume(dir.join("eval_rollouts.jsonl"), 0)?;
    for s in eval.iter().flat_map(|g| &g.scores) {
        eval_log.write(&s.row)?;
    }
    for (k, gauge) in [
        ("trajectory_success", &metrics.trajectory_success),
        ("final_answer_accuracy", &metrics.final_answer_accuracy),
        ("tool_call_rate", &metrics.tool_call_rate),
        ("unnecessary_tool_rate", &metrics.unnecessary_tool_rate),
        ("repeated_call_rate", &metrics.repeated_call_rate),
    ] {
        gauge.with_label_values(&["eval"]).set(f[k].as_f64().unwrap_or(0.0));
    }
    let ckpt = checkpoint(&driver.learner, dir, version, &rl.cursor_now()).await?;
    for file in ["tokenizer.json", "tokenizer_config.json", "generation_config.json", "chat_template.jinja"] {
        let src = policy.model_dir.join(file);
        if src.exists() {
            let _ = std::fs::copy(&src, ckpt.join(file));
        }
    }
    let counts = rl.ledger.counts();
    let figure = |k: &str| f[k].as_f64().unwrap_or(0.0);
    let summary = Summary {
        recipe: recipe.name.clone(),
        eval_tasks: policy.held_out.len(),
        trajectory_success: figure("trajectory_success"),
        final_answer_accuracy: figure("final_answer_accuracy"),
        unnecessary_tool_rate: figure("unnecessary_tool_rate"),
        repeated_call_rate: figure("repeated_call_rate"),
        step_call_accuracy: figure("step_call_accuracy"),
        summary_score: figure("summary_score"),
        tool_call_rate: figure("tool_call_rate"),
        after_warmup: Some(cx.after_warmup.clone()),
        sampled: json!({"temperature": recipe.rl.temperature, "final": f_sampled, "after_warmup": cx.after_warmup_sampled}),
        steps: step,
        groups: json!({"trained": counts.trained, "dropped": counts.dropped, "in_flight": counts.dispatched + counts.scored,
                        "stale": rl.gate.stale, "redispatched": metrics.groups_redispatched_total.get()}),
        actor_restarts: metrics.actor_restarts_total.with_label_values(&["rollout-0"]).get(),
        process_restarts: cx.fleet.map(Fleet::restarts).unwrap_or_default(),
        counters: metrics.carried(),
        wall_seconds: rl.wall(),
        metrics_addr: metrics_addr.to_string(),
    };
    write_status(status, dir, "done", step, version, cx.fleet);
    let path = dir.join("summary.json");
    std::fs::write(&path, serde_json::to_string_pretty(&summary).expect("json")).map_err(io(&path))?;
    cx.progress.line(format!(
        "done: held-out success {:.3} (sampled {:.3}), final answer {:.3}, unnecessary tool {:.3}, repeated {:.3} on {} tasks",
        summary.trajectory_success, record::rate(&f_sampled, "trajectory_success"), summary.final_answer_accuracy, summary.unnecessary_tool_rate, summary.repeated_call_rate, summary.eval_tasks
    ));
    Ok(summary)
}
