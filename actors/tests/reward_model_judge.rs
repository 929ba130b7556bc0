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
