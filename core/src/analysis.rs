//! The error-analysis table: one row per rollout, plus reward-hacking views.
//!
//! A row holds the seed's columns, in this order: `prompt_id, task_type,
//! rendered_prompt, completion, tool_name, arguments, tool_result,
//! call_count, format_reward, selection_reward, argument_reward,
//! execution_reward, final_reward, total_reward, verifier_error, human_note`.
//! It is built from the task, the trajectory and its
//! [`process_reward`](crate::reward::process::process_reward). The rows go to
//! `rollouts.jsonl` ([`write_jsonl`]); the views pick the rows a person should
//! read first when a policy games its reward.
use crate::reward::{Scored, Transcript};
use crate::task::{Task, TaskType};
use crate::trajectory::Trajectory;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::io::Write;

/// One rollout in the error-analysis table.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AnalysisRow {
    /// Task identifier.
    pub prompt_id: String,
    /// `tool_required`, `no_tool` or `multi_step`.
    pub task_type: TaskType,
    /// The prompt as the chat template rendered it.
    pub rendered_prompt: String,
    /// Everything generated after the prompt (tool results included).
    pub completion: String,
    /// Names of the calls made, comma-separated (`None` without a call).
    pub tool_name: Option<String>,
    /// Arguments of the calls made, a JSON list in call order (`None` without a call).
    pub arguments: Option<Value>,
    /// Results of the calls, one per line (`None` without a call).
    pub tool_result: Option<String>,
    /// Number of calls made.
    pub call_count: usize,
    /// `format_ok`.
    pub format_reward: Option<f64>,
    /// `correct_tool` on tool tasks, `no_call` on no-tool tasks.
    pub selection_reward: Option<f64>,
    /// `correct_arguments`.
    pub argument_reward: Option<f64>,
    /// `execution_success`.
    pub execution_reward: Option<f64>,
    /// `final_correct`.
    pub final_reward: Option<f64>,
    /// The reward used for training.
    pub total_reward: f64,
    /// SLCA's process-segment reward `p` (HierR), when the reward actor scored segments.
    #[serde(default)]
    pub process_segment_reward: Option<f64>,
    /// SLCA's summary-segment reward `q` (the judge), when scored.
    #[serde(default)]
    pub summary_segment_reward: Option<f64>,
    /// StepTool's reward of each assistant turn in order, when scored.
    #[serde(default)]
    pub step_rewards: Option<Vec<f64>>,
    /// Why part of the rollout could not be graded, if so.
    pub verifier_error: Option<String>,
    /// Free text for a person reviewing the row (empty when written).
    pub human_note: Option<String>,
}

/// Builds the row of one rollout from its process reward (components named as in
/// [`PROCESS_COMPONENTS`](crate::reward::process::PROCESS_COMPONENTS)).
pub fn analysis_row(task: &Task, traj: &Trajectory, reward: &Scored) -> AnalysisRow {
    let has_calls = !traj.steps.is_empty();
    let names: Vec<&str> = traj.steps.iter().map(|s| s.name.as_str()).collect();
    let results: Vec<&str> = traj.steps.iter().map(|s| s.result.as_str()).collect();
    let selection = reward.component("correct_tool").or_else(|| reward.component("no_call"));
    AnalysisRow {
        prompt_id: task.id.clone(),
        task_type: task.task_type(),
        rendered_prompt: traj.rendered_prompt.clone(),
        completion: traj.completion.clone(),
        tool_name: has_calls.then(|| names.join(",")),
        arguments: has_calls.then(|| Value::Array(traj.steps.iter().map(|s| s.arguments.clone()).collect())),
        tool_result: has_calls.then(|| results.join("\n")),
        call_count: traj.steps.len(),
        format_reward: reward.component("format_ok"),
        selection_reward: selection,
        argument_reward: reward.component("correct_arguments"),
        execution_reward: reward.component("execution_success"),
        final_reward: reward.component("final_correct"),
        total_reward: reward.total,
        process_segment_reward: None,
        summary_segment_reward: None,
        step_rewards: None,
        verifier_error: task.expected_answer.is_none().then(|| "task has no expected_answer: final answer not graded".to_string()),
        human_note: None,
    }
}

/// Writes rows as JSON lines, columns in table order.
pub fn write_jsonl<W: Write>(rows: &[AnalysisRow], mut out: W) -> std::io::Result<()> {
    for row in rows {
        serde_json::to_writer(&mut out, row)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

/// Mean of the process columns that apply (selection, arguments, execution); `None` when none applies.
pub fn process_score(row: &AnalysisRow) -> Option<f64> {
    let parts: Vec<f64> = [row.selection_reward, row.argument_reward, row.execution_reward].into_iter().flatten().collect();
    (!parts.is_empty()).then(|| parts.iter().sum::<f64>() / parts.len() as f64)
}

/// Thresholds of the reward-hacking views.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HackingThresholds {
    /// A total at or above this is "high".
    pub high_total: f64,
    /// A process score below this is "low".
    pub low_process: f64,
    /// This many calls or more is a "long tool loop".
    pub long_loop_calls: usize,
}

impl Default for HackingThresholds {
    fn default() -> Self {
        HackingThresholds { high_total: 0.4, low_process: 0.5, long_loop_calls: 5 }
    }
}

/// Rows with a high total but a low process score (the reward paid for something other than the process).
pub fn high_total_low_process<'a>(rows: &'a [AnalysisRow], th: &HackingThresholds) -> Vec<&'a AnalysisRow> {
    rows.iter()
        .filter(|r| r.total_reward >= th.high_total && process_score(r).is_some_and(|p| p < th.low_process))
        .collect()
}

/// Rows whose every process column is 1 but whose final answer is wrong.
pub fn process_right_final_wrong(rows: &[AnalysisRow]) -> Vec<&AnalysisRow> {
    rows.iter()
        .filter(|r| process_score(r) == Some(1.0) && r.final_reward == Some(0.0))
        .collect()
}

/// Rows with `long_loop_calls` calls or more.
pub fn long_tool_loops<'a>(rows: &'a [AnalysisRow], th: &HackingThresholds) -> Vec<&'a AnalysisRow> {
    rows.iter().filter(|r| r.call_count >= th.long_loop_calls).collect()
}

/// Rows of no-tool tasks where a tool was called.
pub fn tools_on_no_tool_tasks(rows: &[AnalysisRow]) -> Vec<&AnalysisRow> {
    rows.iter().filter(|r| r.task_type == TaskType::NoTool && r.call_count > 0).collect()
}

/// How many rows each reward-hacking view holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct HackingCounts {
    /// [`high_total_low_process`].
    pub high_total_low_process: usize,
    /// [`process_right_final_wrong`].
    pub process_right_final_wrong: usize,
    /// [`long_tool_loops`].
    pub long_tool_loops: usize,
    /// [`tools_on_no_tool_tasks`].
    pub tools_on_no_tool_tasks: usize,
}

/// The size of every reward-hacking view.
pub fn hacking_counts(rows: &[AnalysisRow], th: &HackingThresholds) -> HackingCounts {
    HackingCounts {
        high_total_low_process: high_total_low_process(rows, th).len(),
        process_right_final_wrong: process_right_final_wrong(rows).len(),
        long_tool_loops: long_tool_loops(rows, th).len(),
        tools_on_no_tool_tasks: tools_on_no_tool_tasks(rows).len(),
    }
}

/// The held-out verdict on one rollout: the figures of `summary.json`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct TrajectoryOutcome {
    /// Tool chosen right, arguments right, executed, final answer right, no unnecessary or repeated call.
    pub success: bool,
    /// The final answer matches the expected one.
    pub final_correct: bool,
    /// At least one tool call was made.
    pub called_tool: bool,
    /// A tool was called on a task that needs none.
    pub unnecessary_tool: bool,
    /// A call repeated an earlier identical call.
    pub repeated_call: bool,
}

/// Judge a rollout with the process rubric's components (see [`crate::reward::process`]):
/// a tool task succeeds when format, tool, arguments, execution and final answer are all right,
/// no call repeats, and no more calls were made than the gold calls; a no-tool task succeeds
/// when it makes no call and answers right.
pub fn trajectory_outcome(task: &Task, traj: &Trajectory) -> TrajectoryOutcome {
    let t = Transcript::from_trajectory(traj);
    let s = crate::reward::process::process_reward(task, &t);
    let one = |name: &str| s.component(name).is_some_and(|v| v >= 1.0);
    let calls = t.calls().count();
    let final_correct = one("final_correct") || (task.expected_answer.is_none() && one("format_ok"));
    let repeated_call = t.has_repeated_call();
    let called_tool = t.blocks().next().is_some();
    let success = if task.requires_tool {
        let args_ok = s.component("correct_arguments").is_none_or(|v| v >= 1.0);
        one("format_ok") && one("correct_tool") && args_ok && one("execution_success") && final_correct && !repeated_call
            && calls <= task.gold_calls_flat().count().max(1)
    } else {
        !called_tool && final_correct
    };
    TrajectoryOutcome { success, final_correct, called_tool, unnecessary_tool: !task.requires_tool && called_tool, repeated_call }
}

/// Per-step call accuracy of a tool task: the share of gold steps whose
/// calls the rollout made, right, in the same turn position — the k-th turn
/// with calls holds exactly the k-th gold step's calls (names and arguments
/// under [`loose_eq`](crate::reward::answer::loose_eq), in any order), and they
/// ran. `None` for a task without gold calls.
pub fn step_call_accuracy(task: &Task, traj: &Trajectory) -> Option<f64> {
    if task.gold_tool_calls.is_empty() {
        return None;
    }
    let mut turns: Vec<Vec<&crate::trajectory::Step>> = Vec::new();
    for s in &traj.steps {
        match turns.last_mut() {
            Some(t) if t[0].turn == s.turn => t.push(s),
            _ => turns.push(vec![s]),
        }
    }
    let right = task
        .gold_tool_calls
        .iter()
        .zip(turns.iter().map(Some).chain(std::iter::repeat(None)))
        .filter(|(gold, made)| {
            made.is_some_and(|calls| {
                let mut unused: Vec<&crate::trajectory::Step> = calls.clone();
                calls.len() == gold.len()
                    && gold.iter().all(|g| {
                        let hit = unused.iter().position(|c| c.success && c.name == g.name && arguments_match(&c.arguments, &g.arguments));
                        hit.map(|i| unused.remove(i)).is_some()
                    })
            })
        })
        .count();
    Some(right as f64 / task.gold_tool_calls.len() as f64)
}

/// Arguments that match: objects with the same keys whose values are
/// [`loose_eq`](crate::reward::answer::loose_eq); other values loosely equal.
fn arguments_match(made: &Value, gold: &Value) -> bool {
    match (made.as_object(), gold.as_object()) {
        (Some(m), Some(g)) => m.len() == g.len() && g.iter().all(|(k, gv)| m.get(k).is_some_and(|mv| crate::reward::answer::loose_eq(mv, gv))),
        _ => crate::reward::answer::loose_eq(made, gold),
    }
}
