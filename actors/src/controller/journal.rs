//! What a run keeps on disk as it goes, so that it can be watched and resumed:
//! `status.json`, the JSONL logs (cut back to a checkpoint's rows on a resume),
//! and checkpoints with the pipeline's cursor.
use super::error::{answered, io, RunError};
use super::ledger::Ledger;
use super::status::RunStatus;
use crate::learner::actor::LearnerMsg;
use crate::learner::CheckpointMeta;
use crate::node::fleet::Fleet;
use ractor::ActorRef;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Write `status.json` (read by `launcher status` / `launcher down`) at `phase`, `step`, `version`.
pub(super) fn write_status(status: &mut RunStatus, dir: &Path, phase: &str, step: u64, version: u64, fleet: Option<&Fleet>) {
    if let Some(f) = fleet {
        status.processes.truncate(1);
        status.processes.extend(f.entries(version));
    }
    status.phase = phase.to_string();
    status.step = step;
    status.version = version;
    let _ = status.write(dir);
}

pub(super) struct Jsonl(std::fs::File, PathBuf, usize);

impl Jsonl {
    /// Opens `path` keeping only its first `rows` lines (what a checkpoint had seen).
    pub(super) fn resume(path: PathBuf, rows: usize) -> Result<Jsonl, RunError> {
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let keep: usize = text.split_inclusive('\n').take(rows).map(str::len).sum();
        let f = std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(io(&path))?;
        f.set_len(keep as u64).map_err(io(&path))?;
        let kept = text[..keep].lines().count();
        Ok(Jsonl(f, path, kept))
    }
    pub(super) fn write(&mut self, v: &impl Serialize) -> Result<(), RunError> {
        let line = serde_json::to_string(v).expect("rows serialise");
        self.2 += 1;
        writeln!(self.0, "{line}").map_err(io(&self.1))
    }
    pub(super) fn rows(&self) -> usize {
        self.2
    }
}

/// Where a resumed run picks up: the pipeline's record in a checkpoint.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(super) struct Cursor {
    /// RL steps trained.
    pub(super) step: u64,
    /// Next training task (equal to the next group id).
    pub(super) train_cursor: usize,
    /// Rows in `metrics.jsonl` and `rollouts.jsonl` at the checkpoint.
    pub(super) metrics_rows: usize,
    pub(super) rollouts_rows: usize,
    /// The held-out figures measured after the warm-up (greedy, sampled).
    pub(super) after_warmup: Value,
    pub(super) after_warmup_sampled: Value,
    /// Groups the ledger recorded as trained at the checkpoint (absent in older checkpoints).
    #[serde(default)]
    pub(super) groups_trained: Option<usize>,
    /// Wall seconds of the run up to the checkpoint, over all its processes.
    #[serde(default)]
    pub(super) wall_seconds: f64,
    /// The counters carried over a resume (absent in older checkpoints).
    #[serde(default)]
    pub(super) counters: crate::metrics::Carried,
}

impl Cursor {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn at(step: u64, train_cursor: usize, metrics: &Jsonl, rollouts: &Jsonl, after_warmup: &Value, after_warmup_sampled: &Value, ledger: &Ledger, wall_seconds: f64, counters: crate::metrics::Carried) -> Cursor {
        Cursor {
            step,
            train_cursor,
            metrics_rows: metrics.rows(),
            rollouts_rows: rollouts.rows(),
            after_warmup: after_warmup.clone(),
            after_warmup_sampled: after_warmup_sampled.clone(),
            groups_trained: Some(ledger.counts().trained),
            wall_seconds,
            counters,
        }
    }
}

pub(super) async fn checkpoint(learner: &ActorRef<LearnerMsg>, dir: &Path, version: u64, cursor: &Cursor) -> Result<PathBuf, RunError> {
    let meta = CheckpointMeta { policy_version: version, data_cursor: serde_json::to_value(cursor).expect("json") };
    answered("learner", ractor::call!(learner, LearnerMsg::Checkpoint, dir.join("checkpoints"), meta))
}

