//! The run driver: one run from its set-up to its summary, phase by phase.
//!
//! [`run`] checks a resume before anything is created, then opens the run
//! (`setup::Opened`: directory, `/metrics`, the other processes), loads the
//! policy (`setup::Policy`), starts the learner and warms it up
//! (`warm_start::WarmUp`), spawns the other actors or hosts them in the
//! fleet's processes, evaluates the warmed-up policy, runs the RL phase
//! (`super::rl_loop`) and ends with the held-out evaluation and
//! `summary.json` (`finish`). The phases live in their own files; this one
//! only sequences them.
use super::driver::Driver;
use super::error::answered;
use super::finish::finish;
use super::journal::{checkpoint, Cursor};
use super::progress::{stop_on_sigterm, Progress};
use super::record::{self, figures};
use super::resume::open_ledger;
use super::rl_loop::{RlContext, RlLoop};
use super::setup::{rl_learner_config, Opened, Policy, Roles, UserWork};
use super::warm_start::{self, WarmUp};
use crate::learner::actor::LearnerMsg;
use crate::metrics::Metrics;
use crate::node::link::LearnerLoss;
use ractor::ActorRef;
use rlmesh_core::Task;
use serde_json::Value;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

pub use super::error::RunError;
pub use super::finish::Summary;
pub use super::resume::{check_resumable, finished_run};
pub use super::run_dir::{claim_run_dir, set_aside_previous_run};
pub use super::setup::RunOptions;
pub use crate::node::link::LostRank;

/// Every tool some training task allows, sorted.
fn allowed_tools(train: &[Task]) -> Vec<String> {
    let set: std::collections::BTreeSet<&String> = train.iter().flat_map(|t| &t.allowed_tools).collect();
    set.into_iter().cloned().collect()
}

/// Run a recipe to the end; returns the summary (also written to `summary.json`).
///
/// When a learner rank's process is lost, the run fails with
/// [`RunError::LearnerLost`], after every process of the run has been stopped.
pub async fn run(opts: RunOptions) -> Result<Summary, RunError> {
    let lost: LearnerLoss = Arc::default();
    match run_processes(opts, lost.clone()).await {
        Err(e @ (RunError::Refused(_) | RunError::Stopped(_))) => Err(e),
        Err(e) => match lost.lock().expect("loss lock").clone() {
            Some(LostRank { why, exited }) => Err(RunError::LearnerLost { why, cause: e.to_string(), exited }),
            None => Err(e),
        },
        ok => ok,
    }
}

async fn run_processes(opts: RunOptions, learner_loss: LearnerLoss) -> Result<Summary, RunError> {
    let t0 = Instant::now();
    // The controller's own tensor work (creating the tiny model) is light: on one
    // thread it leaves no idle OpenMP team behind. libgomp counts every team's
    // threads, and with more of them than cores it stops spin-waiting between
    // parallel regions, which made each warm-up step much slower (measured).
    tch::set_num_threads(1);
    let progress = Arc::new(Progress::new(opts.progress, t0));
    let stop = stop_on_sigterm();
    let stopping = || stop.load(std::sync::atomic::Ordering::SeqCst);
    let (dir, recipe) = (&opts.run_dir, &opts.recipe);
    let steps = opts.max_steps.unwrap_or(recipe.rl.steps);
    // Every check comes before anything is created: a refused run changes no file.
    if opts.resume {
        check_resumable(dir, recipe)?;
        if let Some(summary) = finished_run(dir, steps) {
            progress.line(format!("{} finished at step {}; nothing to resume", dir.display(), summary.steps));
            return Ok(summary);
        }
    }
    let work = UserWork::load(recipe, &progress)?;
    let mut run = Opened::open(&opts, learner_loss, &progress).await?;
    let policy = Policy::load(&opts, work, &progress)?;
    run.status_at(dir, "warmup", 0, 0);

    // The learner, warmed up with SFT.
    let sft_steps = if opts.resume || policy.reused { 0 } else { opts.sft_steps.unwrap_or(recipe.sft.steps) };
    let roles = Roles::of(recipe, &opts.tokenizer_dir, sft_steps);
    let (mut hosted, learner) = roles.start_learner(run.fleet.as_ref(), &policy, recipe, &run.metrics, &progress).await?;
    let warm = WarmUp { learner: &learner, tokenizer: &policy.tokenizer, registry: &policy.registry, recipe, tasks: &policy.sft_tasks, file: &policy.sft_file, steps: sft_steps };
    if let Err(e) = warm.run(&progress, &run.metrics, &stopping).await {
        if matches!(e, RunError::Stopped(_)) {
            run.status_at(dir, "stopped", 0, 0);
        }
        return Err(e);
    }
    let resumed = resume_or_configure(&learner, &opts, &run.metrics, &progress).await?;

    // The other actors, every one at the starting version, and the warmed-up policy's figures.
    let mut driver = roles.spawn_actors(learner, hosted.as_mut(), &policy, &opts, &run.metrics).await?;
    let version = resumed.as_ref().map_or(0, |r| r.0);
    driver.publish(version, true).await?;
    let (after_warmup, after_warmup_sampled) = match &resumed {
        Some((_, c)) => (c.after_warmup.clone(), c.after_warmup_sampled.clone()),
        None => evaluate_warmed_up(&mut driver, &policy.held_out, recipe.seed, &progress).await?,
    };

    // RL.
    let start = resumed.as_ref().map(|r| r.1.clone()).unwrap_or_default();
    let (ledger, retry) = open_ledger(dir, resumed.is_some().then_some(&start), &policy.train, &progress)?;
    if resumed.is_none() {
        let c = Cursor {
            after_warmup: after_warmup.clone(),
            after_warmup_sampled: after_warmup_sampled.clone(),
            groups_trained: Some(0),
            wall_seconds: t0.elapsed().as_secs_f64(),
            counters: run.metrics.carried(),
            ..Default::default()
        };
        let after = checkpoint(&driver.learner, dir, version, &c).await?;
        share_the_warm_up(&policy, &after, &progress);
    }
    let cx = RlContext {
        recipe,
        train: &policy.train,
        dir,
        metrics: &run.metrics,
        progress: &progress,
        fleet: run.fleet.as_ref(),
        stopping: &stopping,
        steps,
        after_warmup: &after_warmup,
        after_warmup_sampled: &after_warmup_sampled,
        earlier_seconds: start.wall_seconds,
        t0,
        tools: allowed_tools(&policy.train),
    };
    run.metrics.zero_tool_series(&cx.tools);
    let mut rl = RlLoop::open(cx, ledger, retry, &start, version, opts.record_batches)?;
    if let Some(f) = &run.fleet {
        f.rl_started();
    }
    rl.run(&mut driver, &mut run.status).await?;

    // Held-out evaluation with the final policy.
    let summary = finish(&mut driver, &rl, &policy, &mut run.status, &run.metrics_addr).await?;
    drop(rl);
    driver.stop();
    run.close().await;
    Ok(summary)
}

/// On a resume, the learner's state from the newest checkpoint: (policy
/// version, the pipeline's cursor); else the learner is switched to its RL settings.
async fn resume_or_configure(learner: &ActorRef<LearnerMsg>, opts: &RunOptions, metrics: &Metrics, progress: &Progress) -> Result<Option<(u64, Cursor)>, RunError> {
    if !opts.resume {
        answered("learner", ractor::call!(learner, LearnerMsg::Configure, rl_learner_config(&opts.recipe)))?;
        return Ok(None);
    }
    let meta = answered("learner", ractor::call!(learner, LearnerMsg::Resume, opts.run_dir.join("checkpoints"), rl_learner_config(&opts.recipe)))?;
    let cursor: Cursor = serde_json::from_value(meta.data_cursor)
        .map_err(|e| RunError::Setup(format!("--resume: the checkpoint's data cursor is not this pipeline's ({e})")))?;
    progress.line(format!("resuming at RL step {} (policy v{})", cursor.step, meta.policy_version));
    // The counters go on from the checkpoint's, not from zero.
    metrics.carry_over(&cursor.counters);
    Ok(Some((meta.policy_version, cursor)))
}

/// The warmed-up policy's held-out figures, greedy and sampled.
async fn evaluate_warmed_up(driver: &mut Driver, held_out: &[Task], seed: u64, progress: &Progress) -> Result<(Value, Value), RunError> {
    let f = figures(&driver.evaluate(held_out, seed, true).await?);
    let fs = figures(&driver.evaluate(held_out, seed, false).await?);
    progress.line(record::warmed_up_line(&f, &fs));
    Ok((f, fs))
}

/// Stores the warm-up's checkpoint `after` for the runs next to this one, when the recipe shares it and it was not stored yet.
fn share_the_warm_up(policy: &Policy, after: &Path, progress: &Progress) {
    if let (Some(s), false) = (&policy.shared, policy.reused) {
        match warm_start::store(s, &policy.model_dir, after) {
            Ok(()) => progress.line(format!("warm-up: stored for the runs next to this one in {}", s.display())),
            Err(e) => progress.line(format!("warm-up: could not store it in {} ({e}); later runs warm up again", s.display())),
        }
    }
}
