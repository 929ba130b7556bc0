//! The model judge behind the `Judge` interface, on the real SmolLM2-135M:
//! it answers (a score or a counted failure), never crashes, and a judge that
//! times out scores 0 and is counted.
use rlmesh_actors::reward::judge::{parse_score, ModelJudge};
use rlmesh_core::reward::judge::{judge_unit_score, Judge, JudgeError, JudgeRequest, JudgeStats};
use rlmesh_core::reward::Transcript;
use rlmesh_core::Task;
use std::path::{Path, PathBuf};
use std::time::Duration;

fn smollm2() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let out = std::process::Command::new(root.join("scripts/prepare-models.sh")).output().unwrap();
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim().lines().last().unwrap()).join("smollm2-135m")
}

#[test]
fn scores_are_digits_and_failures_are_counted() {
    assert_eq!(parse_score(" 4 out of 5").unwrap(), 4);
    assert!(matches!(parse_score("great"), Err(JudgeError::BadScore(_))));
    assert!(matches!(parse_score("7"), Err(JudgeError::BadScore(_))));
    let task = Task {
        id: "t".into(),
        prompt: "Use the calculator to compute 17 * 24.".into(),
        requires_tool: true,
        allowed_tools: vec!["calculator".into()],
        gold_tool_calls: vec![],
        expected_answer: Some("408".into()),
        environment: None,
        env_state: None,
        ..Default::default()
    };
    let transcript = Transcript::from_completion("<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"operation\": \"multiply\", \"a\": 17, \"b\": 24}}\n</tool_call>\n<tool_response>\n408\n</tool_response>\nThe answer is 408.");
    let req = JudgeRequest { task: &task, transcript: &transcript };
    let judge = ModelJudge::load(&smollm2(), Duration::from_secs(60)).unwrap();
    let stats = JudgeStats::default();
    let unit = judge_unit_score(&judge, &req, &stats);
    assert!((0.0..=1.0).contains(&unit));
    match judge.score(&req) {
        Ok(s) => assert!((1..=5).contains(&s)),
        Err(JudgeError::BadScore(text)) => assert!(stats.failures() == 1, "bad score {text:?} must be counted"),
        Err(e) => panic!("the judge model must answer: {e}"),
    }
    // A judge with no time to answer: unavailable, scored 0, counted.
    let slow = ModelJudge::load(&smollm2(), Duration::from_millis(0)).unwrap();
    let stats = JudgeStats::default();
    assert_eq!(judge_unit_score(&slow, &req, &stats), 0.0);
    assert_eq!((stats.calls(), stats.failures()), (1, 1));
}

/// A trajectory with one executed call of `result` and the reply `answer` (the loss mask: two turns).
fn trajectory(result: &str, answer: &str) -> rlmesh_core::Trajectory {
    let mask: Vec<u8> = [vec![0; 4], vec![1; 6], vec![0; 3], vec![1; 5]].concat();
    let n = mask.len();
    rlmesh_core::Trajectory {
        task_id: "t".into(),
        sample_index: 0,
        prompt_len: 4,
        rendered_prompt: String::new(),
        token_ids: vec![5; n],
        loss_mask: mask,
        logprobs: vec![0.0; n],
        versions: vec![0; n],
        segments: vec![rlmesh_core::Span { start: 4, end: 10 }],
        summary: Some(rlmesh_core::Span { start: 13, end: 18 }),
        steps: vec![rlmesh_core::Step {
            turn: 0,
            index: 0,
            name: "calculator".into(),
            arguments: serde_json::json!({"operation": "multiply", "a": 17, "b": 24}),
            result: result.into(),
            success: true,
            error: None,
            latency_ms: 1.0,
            repeated: false,
        }],
        format_errors: vec![],
        messages: vec![],
        completion: String::new(),
        final_answer: answer.into(),
        stop_reason: rlmesh_core::StopReason::Answered,
        grades: Vec::new(),
    }
}

#[test]
fn a_reward_scorer_with_the_model_judge_scores_segments_and_counts_its_cost() {
    use rlmesh_actors::controller::recipe::RewardKind;
    use rlmesh_actors::reward::{JudgeSpec, RewardSpec, Scorer};
    let task: Task = serde_json::from_value(serde_json::json!({
        "id": "t", "prompt": "Use the calculator to compute 17 * 24.", "requires_tool": true, "allowed_tools": ["calculator"],
        "gold_tool_calls": [[{"name": "calculator", "arguments": {"operation": "multiply", "a": 17, "b": 24}}]], "expected_answer": "408"
    }))
    .unwrap();
    let group = rlmesh_core::Group { group_id: 1, task, trajectories: vec![trajectory("408", "The answer is 408."), trajectory("408", "No idea.")], failed: None, earlier_segments: vec![] };
    let model = Scorer::new(&RewardSpec::rubric(RewardKind::Hierr, JudgeSpec::Model { dir: smollm2() })).unwrap();
    let scored = model.score(group.clone());
    // Both replies have a tool response and at least 10 characters except "No idea." (8): one judge call.
    assert_eq!(scored.judge.calls, 1, "{:?}", scored.judge);
    assert!(scored.judge.seconds > 0.0);
    for s in &scored.scores {
        assert!((0.0..=1.0).contains(&s.segments.summary));
        // HierR's total is the process reward plus the judged summary, once.
        assert!((s.total - (s.segments.process + s.segments.summary)).abs() < 1e-12);
    }
    assert_eq!(scored.scores[1].segments.summary, 0.0);
    // The rule rubric on the same group: 5 → 1.0 for the stated, concise, grounded reply.
    let rule = Scorer::new(&RewardSpec::rubric(RewardKind::Hierr, JudgeSpec::Rule)).unwrap().score(group);
    assert_eq!(rule.scores[0].segments.summary, 1.0);
    assert_eq!(scored.scores[0].segments.process, rule.scores[0].segments.process);
    let missing = Scorer::new(&RewardSpec::rubric(RewardKind::Hierr, JudgeSpec::Model { dir: "/nonexistent".into() })).err().unwrap();
    assert!(missing.contains("/nonexistent"), "{missing}");
}
