//! StepTool's rule-based annotators, by hand.
use rlmesh_core::reward::steptool::{annotate, average_runs, steptool_reward};
use rlmesh_core::reward::Transcript;
use rlmesh_core::Task;
use serde_json::json;

fn task(expected: Option<&str>) -> Task {
    serde_json::from_value(json!({"requires_tool": true, "allowed_tools": ["calculator"], "expected_answer": expected})).unwrap()
}

fn calc(expr: &str, result: &str) -> String {
    format!("<tool_call>{}</tool_call><tool_response>{result}</tool_response>", json!({"name": "calculator", "arguments": {"expression": expr}}))
}

#[test]
fn successful_contributing_call_and_solved() {
    let t = Transcript::from_completion(&(calc("17*24", "408") + "The answer is 408."));
    let a = annotate(&task(Some("408")), &t);
    // SuccCalling 1; Contribution round(5 · |{408}∩{the,answer,is,408}| / min(1,4)) = 5; r_0 = (1 + 5/5)/2 = 1
    // IsSolved 1
    assert_eq!((a.succ_calling.clone(), a.contribution.clone(), a.solved), (vec![1.0], vec![5.0], 1.0));
    assert_eq!(a.step_rewards(), vec![1.0, 1.0]);
}

#[test]
fn failed_call_then_retry() {
    let text = calc("17*", "{\"error\": \"syntax error\"}") + "Retrying." + &calc("17*24", "408") + "It is 408";
    let t = Transcript::from_completion(&text);
    let a = annotate(&task(Some("408")), &t);
    // action 0: error → SuccCalling 0, no successful result → Contribution 0 → r = 0
    // action 1: r = (1 + 5/5)/2 = 1; IsSolved 1
    assert_eq!(a.step_rewards(), vec![0.0, 1.0, 1.0]);
    let s = steptool_reward(&task(Some("408")), &t);
    // total = mean(0, 1, 1) = 2/3; succ mean 0.5; contribution mean 2.5
    assert!((s.total - 2.0 / 3.0).abs() < 1e-12);
    assert_eq!((s.component("succ_calling"), s.component("contribution")), (Some(0.5), Some(2.5)));
}

#[test]
fn partial_contribution_and_unsure_final() {
    // result words {result, 408, units}; reply words {result, is, 17}; overlap 1/min(3,3) = 1/3
    // Contribution round(5/3) = 2 → r = (1 + 2/5)/2 = 0.7; no expected answer → IsSolved 0.5 (unsure)
    let t = Transcript::from_completion(&(calc("17*24", "result 408 units") + "Result is 17"));
    let steps = annotate(&task(None), &t).step_rewards();
    assert!((steps[0] - 0.7).abs() < 1e-12);
    assert_eq!(steps[1], 0.5);
}

#[test]
fn no_action_gives_only_the_final_reward() {
    let s = annotate(&task(Some("408")), &Transcript::from_completion("409"));
    // no call: no intermediate step; wrong answer → Unsolved 0
    assert_eq!(s.step_rewards(), vec![0.0]);
    assert_eq!(steptool_reward(&task(Some("408")), &Transcript::from_completion("409")).component("succ_calling"), None);
}

#[test]
fn annotator_runs_are_averaged() {
    // ([1, 0.5] + [0, 0.5]) / 2 = [0.5, 0.5]
    assert_eq!(average_runs(&[vec![1.0, 0.5], vec![0.0, 0.5]]), Some(vec![0.5, 0.5]));
    assert_eq!(average_runs(&[vec![1.0], vec![0.0, 0.5]]), None);
    assert_eq!(average_runs(&[]), None);
}
