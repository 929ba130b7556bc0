//! Segment and step scores of multi-step rollouts, malformed ones included:
//! they never panic, every turn (run of 1s in the loss mask) gets exactly one
//! step reward, and SLCA's segments follow the loss-mask rule.
use rlmesh_core::advantage::slca::slca_segments;
use rlmesh_core::advantage::steptool::place_step_rewards;
use rlmesh_core::advantage::mask_runs;
use rlmesh_core::analysis::step_call_accuracy;
use rlmesh_core::reward::judge::{JudgeStats, SummaryRubric};
use rlmesh_core::reward::segments::segment_scores;
use rlmesh_core::{Span, Step, StopReason, Task, Trajectory};
use serde_json::json;

fn task() -> Task {
    serde_json::from_value(json!({
        "id": "calc3-1", "requires_tool": true, "allowed_tools": ["calculator"],
        "prompt": "Use the calculator to compute (12 + 3) * 4, then subtract 7. Reply with the final number.",
        "gold_tool_calls": [
            [{"name": "calculator", "arguments": {"operation": "add", "a": 12, "b": 3}}],
            [{"name": "calculator", "arguments": {"operation": "multiply", "a": 15, "b": 4}}],
            [{"name": "calculator", "arguments": {"operation": "subtract", "a": 60, "b": 7}}]
        ],
        "expected_answer": "53"
    }))
    .unwrap()
}

fn call(turn: usize, op: &str, a: i64, b: i64, result: &str) -> Step {
    Step {
        turn,
        index: 0,
        name: "calculator".into(),
        arguments: json!({"operation": op, "a": a, "b": b}),
        result: result.into(),
        success: true,
        error: None,
        latency_ms: 1.0,
        repeated: false,
    }
}

/// One assistant turn as the rollout records it: its generated token count,
/// its executed calls (empty: the turn ended the rollout as its reply) and its text.
struct TurnSpec {
    tokens: usize,
    calls: Vec<Step>,
    text: &'static str,
}

/// A trajectory laid out as the tool loop lays it out: prompt (mask 0), each
/// turn's tokens (mask 1), tool results between turns (mask 0).
fn trajectory(turns: Vec<TurnSpec>, format_errors: Vec<String>, stop: StopReason) -> Trajectory {
    let (mut mask, mut segments, mut summary, mut steps) = (vec![0u8; 5], vec![], None, vec![]);
    let n = turns.len();
    let mut final_answer = String::new();
    for (i, t) in turns.into_iter().enumerate() {
        let span = Span { start: mask.len(), end: mask.len() + t.tokens };
        mask.extend(std::iter::repeat_n(1, t.tokens));
        final_answer = t.text.to_string();
        if t.calls.is_empty() {
            summary = Some(span);
        } else {
            segments.push(span);
            steps.extend(t.calls);
            if i + 1 < n {
                mask.extend([0, 0, 0]);
            }
        }
    }
    let len = mask.len();
    Trajectory {
        task_id: "calc3-1".into(),
        sample_index: 0,
        prompt_len: 5,
        rendered_prompt: String::new(),
        token_ids: vec![7; len],
        loss_mask: mask,
        logprobs: vec![0.0; len],
        versions: vec![0; len],
        segments,
        summary,
        steps,
        format_errors,
        messages: vec![],
        completion: String::new(),
        final_answer,
        stop_reason: stop,
        grades: Vec::new(),
    }
}

fn check(t: &Trajectory) -> rlmesh_core::reward::segments::SegmentScores {
    let s = segment_scores(&task(), t, &SummaryRubric, &JudgeStats::default());
    let runs = mask_runs(&t.loss_mask);
    assert_eq!(s.step_rewards.len(), runs.len(), "one step reward per turn: {s:?}");
    // The step rewards go on the last token of each turn without an error.
    let placed = place_step_rewards(&t.loss_mask, &s.step_rewards, false).unwrap();
    for (run, r) in runs.iter().zip(&s.step_rewards) {
        assert_eq!(placed[run.end - 1], *r);
    }
    // SLCA: the last run is the summary, the earlier ones the process segment.
    let seg = slca_segments(&t.loss_mask);
    assert_eq!(seg.summary, runs.last().copied());
    assert_eq!(seg.process, runs[..runs.len().saturating_sub(1)].to_vec());
    s
}

#[test]
fn a_clean_three_step_rollout_scores_by_hand() {
    let t = trajectory(
        vec![
            TurnSpec { tokens: 10, calls: vec![call(0, "add", 12, 3, "15")], text: "" },
            TurnSpec { tokens: 10, calls: vec![call(1, "multiply", 15, 4, "60")], text: "" },
            TurnSpec { tokens: 10, calls: vec![call(2, "subtract", 60, 7, "53")], text: "" },
            TurnSpec { tokens: 6, calls: vec![], text: "The result is 53." },
        ],
        vec![],
        StopReason::Answered,
    );
    let s = check(&t);
    // HierR: every part 1 except `parallel` (1: the first block has one call, like the first gold step) → 1.0.
    assert!((s.process - 1.0).abs() < 1e-12, "{s:?}");
    // Rubric 5 (stated, concise, grounded) → (5 − 1)/4 = 1.
    assert_eq!(s.summary, 1.0);
    assert_eq!(s.total, 2.0);
    // Turns 1, 2: SuccCalling 1, results 15 and 60 do not appear in the reply: Contribution 0 → 0.5.
    // Turn 3: result 53 is the reply's number; overlap({53}, {the, result, is, 53}) = 1 → 5 → 1.0. Reply: solved → 1.
    assert_eq!(s.step_rewards, vec![0.5, 0.5, 1.0, 1.0]);
    assert_eq!(step_call_accuracy(&task(), &t), Some(1.0));
}

#[test]
fn step_call_accuracy_counts_right_steps_in_place() {
    // Step 2 with a wrong operand (16 for 15), step 3 then computed from it: 1 of 3 right.
    let t = trajectory(
        vec![
            TurnSpec { tokens: 4, calls: vec![call(0, "add", 12, 3, "15")], text: "" },
            TurnSpec { tokens: 4, calls: vec![call(1, "multiply", 16, 4, "64")], text: "" },
            TurnSpec { tokens: 4, calls: vec![call(2, "subtract", 64, 7, "57")], text: "" },
            TurnSpec { tokens: 3, calls: vec![], text: "57" },
        ],
        vec![],
        StopReason::Answered,
    );
    assert_eq!(step_call_accuracy(&task(), &t), Some(1.0 / 3.0));
    // Two steps merged into one turn: neither position holds its gold step alone; the third is missing.
    let mut merged = call(0, "multiply", 15, 4, "60");
    merged.index = 1;
    let t = trajectory(
        vec![TurnSpec { tokens: 4, calls: vec![call(0, "add", 12, 3, "15"), merged], text: "" }, TurnSpec { tokens: 3, calls: vec![], text: "60" }],
        vec![],
        StopReason::Answered,
    );
    assert_eq!(step_call_accuracy(&task(), &t), Some(0.0));
    // Arguments compare loosely: "12" and 12.0 are 12.
    let mut loose = call(0, "add", 0, 0, "15");
    loose.arguments = json!({"operation": "add", "a": "12", "b": 3.0});
    let t = trajectory(vec![TurnSpec { tokens: 4, calls: vec![loose], text: "" }, TurnSpec { tokens: 3, calls: vec![], text: "15" }], vec![], StopReason::Answered);
    assert_eq!(step_call_accuracy(&task(), &t), Some(1.0 / 3.0));
    let no_tool: Task = serde_json::from_value(json!({"requires_tool": false, "expected_answer": "hi"})).unwrap();
    assert_eq!(step_call_accuracy(&no_tool, &t), None);
}

#[test]
fn right_tools_and_a_poor_summary_are_scored_apart() {
    let turns = |reply: &'static str| {
        vec![
            TurnSpec { tokens: 10, calls: vec![call(0, "add", 12, 3, "15")], text: "" },
            TurnSpec { tokens: 10, calls: vec![call(1, "multiply", 15, 4, "60")], text: "" },
            TurnSpec { tokens: 10, calls: vec![call(2, "subtract", 60, 7, "53")], text: "" },
            TurnSpec { tokens: 6, calls: vec![], text: reply },
        ]
    };
    let good = check(&trajectory(turns("The result is 53."), vec![], StopReason::Answered));
    let poor = check(&trajectory(turns("I think it might be 99, I guess."), vec![], StopReason::Answered));
    assert_eq!(good.process, poor.process);
    // Not stated, 99 is from nowhere: rubric 1 → 0.
    assert_eq!(poor.summary, 0.0);
    assert!(good.summary > poor.summary);
}

#[test]
fn malformed_multi_step_outputs_score_without_a_crash() {
    // Half a call: the turn had no complete call, so it is the reply (a format error).
    let half = trajectory(
        vec![TurnSpec { tokens: 12, calls: vec![], text: "<tool_call>\n{\"name\": \"calculator\", \"argu" }],
        vec!["unterminated <tool_call>".into()],
        StopReason::TokenBudget,
    );
    let s = check(&half);
    assert!(s.no_call);
    assert_eq!(s.total, -0.5);
    assert_eq!(s.step_rewards, vec![0.0]);
    // A call after the summary: the turn holds a call, so it is an action, and the rollout goes on.
    let after = trajectory(
        vec![
            TurnSpec { tokens: 14, calls: vec![call(0, "add", 12, 3, "15")], text: "The answer is 53. " },
            TurnSpec { tokens: 5, calls: vec![], text: "53" },
        ],
        vec![],
        StopReason::Answered,
    );
    let s = check(&after);
    assert!(!s.no_call);
    assert_eq!(s.step_rewards.len(), 2);
    // A summary between calls, then out of turns on a call: IsSolved (0) joins the last call turn.
    let between = trajectory(
        vec![
            TurnSpec { tokens: 10, calls: vec![call(0, "add", 12, 3, "15")], text: "" },
            TurnSpec { tokens: 16, calls: vec![call(1, "multiply", 15, 4, "60")], text: "So far 15. " },
            TurnSpec { tokens: 10, calls: vec![call(2, "subtract", 60, 7, "53")], text: "" },
        ],
        vec![],
        StopReason::MaxTurns,
    );
    let s = check(&between);
    assert_eq!(s.step_rewards.len(), 3);
    assert_eq!(s.solved, 0.0);
    // No policy token at all: no segment, no step.
    let empty = trajectory(vec![], vec![], StopReason::TokenBudget);
    let s = segment_scores(&task(), &empty, &SummaryRubric, &JudgeStats::default());
    assert!(s.step_rewards.is_empty());
    assert!(slca_segments(&empty.loss_mask).summary.is_none());
}
