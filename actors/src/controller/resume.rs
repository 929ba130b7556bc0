//! Resuming a run: what may resume (checked before anything changes), a run
//! that already finished, and the ledger's groups to send out again.
use super::error::RunError;
use super::finish::Summary;
use super::journal::Cursor;
use super::ledger::{Event, Ledger, LEDGER_FILE};
use super::progress::Progress;
use super::recipe::Recipe;
use rlmesh_core::Task;
use serde_json::Value;
use std::collections::{HashMap, VecDeque};
use std::path::Path;

/// The newest checkpoint's pipeline record (`state.json`'s data cursor), read without changing anything.
fn newest_cursor(dir: &Path) -> Option<Cursor> {
    let (_, newest) = crate::learner::list_checkpoints(&dir.join("checkpoints")).into_iter().next()?;
    let state: Value = serde_json::from_str(&std::fs::read_to_string(newest.join("state.json")).ok()?).ok()?;
    serde_json::from_value(state.get("meta")?.get("data_cursor")?.clone()).ok()
}

/// Replays `ledger.jsonl` without changing it: (next group id, groups trained at steps ≤ `step`).
/// A torn last line is skipped, as [`Ledger::open`] would cut it off.
fn ledger_at(dir: &Path, step: u64) -> (u64, usize) {
    let text = std::fs::read_to_string(dir.join(LEDGER_FILE)).unwrap_or_default();
    let mut next = 0;
    let mut trained: HashMap<u64, u64> = HashMap::new();
    for e in text.lines().filter_map(|l| serde_json::from_str::<Event>(l).ok()) {
        if let Some(g) = e.group() {
            next = next.max(g + 1);
        }
        match e {
            Event::Trained { group, step } => {
                trained.insert(group, step);
            }
            Event::Rollback { step } => trained.retain(|_, s| *s <= step),
            _ => {}
        }
    }
    (next, trained.values().filter(|s| **s <= step).count())
}

/// A resumed run that already finished: its `summary.json`, when it trained `steps` steps.
/// Resuming it does nothing and changes no file.
pub fn finished_run(dir: &Path, steps: u64) -> Option<Summary> {
    let summary: Summary = serde_json::from_str(&std::fs::read_to_string(dir.join("summary.json")).ok()?).ok()?;
    (summary.steps >= steps && newest_cursor(dir).is_some_and(|c| c.step >= steps)).then_some(summary)
}

/// A run can resume when its directory holds a checkpoint, was started with the
/// same recipe (`config.json`) and its ledger holds every group the checkpoint
/// counted; anything else is refused before anything is changed.
pub fn check_resumable(dir: &Path, recipe: &Recipe) -> Result<(), RunError> {
    let refuse = |why: String| Err(RunError::Refused(format!("--resume: {}: {why}", dir.display())));
    if crate::learner::list_checkpoints(&dir.join("checkpoints")).is_empty() {
        return refuse("no checkpoint to resume from (start the run without --resume)".into());
    }
    let cfg_path = dir.join("config.json");
    let stored: Value = match std::fs::read_to_string(&cfg_path).ok().and_then(|t| serde_json::from_str(&t).ok()) {
        Some(v) => v,
        None => return refuse("config.json is missing or unreadable".into()),
    };
    let ours = serde_json::to_value(recipe).expect("recipes serialise");
    // Read back through the recipe type, so a field added since the run began
    // compares as its default: a run of an earlier build resumes when nothing it set changed.
    let stored = stored.get("recipe").cloned().unwrap_or(Value::Null);
    let stored = serde_json::from_value::<Recipe>(stored.clone()).ok().and_then(|r| serde_json::to_value(r).ok()).unwrap_or(stored);
    if let Some((field, was, now)) = first_difference("", &stored, &ours) {
        return refuse(format!("the run was started with another recipe: `{field}` was {was} in its config.json, is {now} now"));
    }
    // The ledger is written before the checkpoint that counts it: one that has
    // seen fewer groups than the checkpoint lost records, and resuming from it
    // could train a group twice or leave one untrained.
    let Some(c) = newest_cursor(dir) else { return Ok(()) };
    let (next, trained) = ledger_at(dir, c.step);
    if (next as usize) < c.train_cursor || c.groups_trained.is_some_and(|n| trained < n) {
        return refuse(format!(
            "{} records {next} groups ({trained} trained by step {}) but the checkpoint saw {}{}: the ledger lost records, refusing to resume",
            dir.join(LEDGER_FILE).display(),
            c.step,
            c.train_cursor,
            c.groups_trained.map_or_else(String::new, |n| format!(" ({n} trained)"))
        ));
    }
    Ok(())
}

/// The first field where two JSON values differ: (dotted path, a's value, b's value).
fn first_difference(path: &str, a: &Value, b: &Value) -> Option<(String, Value, Value)> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            let keys: std::collections::BTreeSet<&String> = x.keys().chain(y.keys()).collect();
            keys.into_iter().find_map(|k| {
                let p = if path.is_empty() { k.clone() } else { format!("{path}.{k}") };
                first_difference(&p, x.get(k).unwrap_or(&Value::Null), y.get(k).unwrap_or(&Value::Null))
            })
        }
        _ if a == b => None,
        _ => Some((if path.is_empty() { "recipe".into() } else { path.to_string() }, a.clone(), b.clone())),
    }
}

/// The run's ledger, and on a resume the groups to send out again: training
/// after the checkpoint `start` is lost with the process, so those groups and
/// the ones that were out go out again (group id g is training task g).
pub(super) fn open_ledger(dir: &Path, start: Option<&Cursor>, train: &[Task], progress: &Progress) -> Result<(Ledger, VecDeque<(u64, Task)>), RunError> {
    let mut ledger = Ledger::open(dir)?;
    let mut retry = VecDeque::new();
    let Some(start) = start else { return Ok((ledger, retry)) };
    // The ledger is written before the checkpoint that counts it: one that has
    // seen fewer groups than the checkpoint lost records, and resuming from it
    // could train a group twice.
    if (ledger.next_group_id() as usize) < start.train_cursor {
        return Err(RunError::Refused(format!(
            "--resume: {} records {} groups but the checkpoint saw {}: the ledger lost records, refusing to resume",
            ledger.path().display(),
            ledger.next_group_id(),
            start.train_cursor
        )));
    }
    ledger.rollback(start.step)?;
    for g in ledger.in_flight() {
        retry.push_back((g, train[g as usize % train.len()].clone()));
    }
    progress.line(format!("ledger: {} groups to send out again", retry.len()));
    Ok((ledger, retry))
}

