//! HierR process reward, the summary reward, and the no-call penalty, by hand.
use rlmesh_core::reward::hierr::{hierr_process, hierr_reward, HierRProcess};
use rlmesh_core::reward::judge::{FixedJudge, Judge, JudgeError, JudgeRequest, JudgeStats};
use rlmesh_core::reward::Transcript;
use rlmesh_core::Task;
use serde_json::json;

fn weather_task() -> Task {
    serde_json::from_value(json!({
        "requires_tool": true, "allowed_tools": ["get_weather", "get_time"],
        "gold_tool_calls": [[
            {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}},
            {"name": "get_time", "arguments": {"tz": "CET"}}
        ]]
    }))
    .unwrap()
}

const WEATHER: &str = r#"{"name": "get_weather", "arguments": {"city": "paris ", "unit": "celsius"}}"#;
const TIME: &str = r#"{"name": "get_time", "arguments": {"tz": "CET"}}"#;
const REPLY: &str = "<tool_response>18C</tool_response><tool_response>14:00</tool_response>It is 18C and 14:00 in Paris.";

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

#[test]
fn parallel_calls_in_one_block() {
    let text = format!("<tool_call>\n[{WEATHER}, {TIME}]\n</tool_call>{REPLY}");
    let t = Transcript::from_completion(&text);
    let p = hierr_process(&weather_task(), &t);
    // fmt 1/1, name F1 2·2/(2+2) = 1, key 1, value 1 (" paris " ≈ "Paris"), parallel: 2 calls = 2 gold
    assert_eq!(p, HierRProcess { fmt: 1.0, name: 1.0, key: 1.0, value: 1.0, parallel: 1.0 });
    let stats = JudgeStats::default();
    let s = hierr_reward(&weather_task(), &t, &FixedJudge(4), &stats);
    // process 1.0 + summary (4 − 1)/4 = 0.75 → 1.75
    assert!(close(s.total, 1.75));
    assert_eq!(s.component("summary"), Some(0.75));
    assert_eq!(s.component("no_call"), Some(0.0));
}

#[test]
fn parallel_calls_split_across_blocks() {
    let text = format!("<tool_call>\n{WEATHER}\n</tool_call>\n<tool_call>\n{TIME}\n</tool_call>{REPLY}");
    let p = hierr_process(&weather_task(), &Transcript::from_completion(&text));
    // fmt 2/2, name 1, key 1, value 1, parallel 0 (first block has 1 call, gold step has 2)
    // process = 0.10 + 0.25 + 0.15 + 0.20 + 0 = 0.70
    assert_eq!(p.parallel, 0.0);
    assert!(close(p.process(), 0.70));
}

#[test]
fn partial_arguments_and_a_malformed_block() {
    let text = r#"<tool_call>{"name": "get_weather", "arguments": {"city": "Paris", "unit": "fahrenheit", "days": 3}}</tool_call><tool_call>{bad}</tool_call><tool_response>64F</tool_response>Sunny, 64F."#;
    let p = hierr_process(&weather_task(), &Transcript::from_completion(text));
    // fmt = 1 valid / max(2, 2) = 0.5
    // name = 2·1/(1 + 2) = 2/3
    // get_weather: key |{city,unit}| / |{city,unit,days}| = 2/3, value 1/2 (unit differs); get_time: none left → 0, 0
    // key = (2/3 + 0)/2 = 1/3, value = (1/2 + 0)/2 = 1/4, parallel 0 (1 ≠ 2)
    // process = 0.1·0.5 + 0.25·2/3 + 0.15·1/3 + 0.2·1/4 = 0.05 + 0.1666… + 0.05 + 0.05 = 0.31666…
    assert!(close(p.fmt, 0.5) && close(p.name, 2.0 / 3.0) && close(p.key, 1.0 / 3.0) && close(p.value, 0.25));
    assert!(close(p.process(), 0.316_666_666_666_666_7));
}

#[test]
fn greedy_match_takes_the_best_same_name_prediction() {
    let task: Task = serde_json::from_value(json!({
        "requires_tool": true, "allowed_tools": ["f"],
        "gold_tool_calls": [[{"name": "f", "arguments": {"x": 1, "flag": true}}]]
    }))
    .unwrap();
    let text = r#"<tool_call>[{"name": "f", "arguments": {"x": 2}}, {"name": "f", "arguments": {"x": "1.0", "flag": 1}}]</tool_call>"#;
    let p = hierr_process(&task, &Transcript::from_completion(text));
    // second prediction: key 2/2, value 2/2 ("1.0" = 1, 1 = true) beats the first (key 1/2, value 0)
    // name F1 = 2·1/(2 + 1) = 2/3; parallel: 2 calls vs 1 gold → 0
    assert_eq!((p.key, p.value, p.parallel), (1.0, 1.0, 0.0));
    assert!(close(p.name, 2.0 / 3.0));
}

#[test]
fn no_call_on_a_tool_task_scores_minus_half() {
    let stats = JudgeStats::default();
    let t = Transcript::from_completion("I think it is sunny in Paris right now.");
    let s = hierr_reward(&weather_task(), &t, &FixedJudge(5), &stats);
    // no tags: fmt 0, name 0, key 0, value 0, parallel 0 → process 0; total −0.5, judge not asked
    assert_eq!(s.total, -0.5);
    assert_eq!(s.component("no_call"), Some(1.0));
    assert_eq!(s.component("process"), Some(0.0));
    assert_eq!(stats.calls(), 0);
    // A call to a tool that is not allowed is not a call.
    let bad = Transcript::from_completion(r#"<tool_call>{"name": "rm", "arguments": {}}</tool_call><tool_response>ok</tool_response>Done, all removed."#);
    assert_eq!(hierr_reward(&weather_task(), &bad, &FixedJudge(5), &stats).total, -0.5);
}

#[test]
fn short_reply_or_no_response_gets_no_summary() {
    let stats = JudgeStats::default();
    let short = Transcript::from_completion(&format!("<tool_call>[{WEATHER}, {TIME}]</tool_call><tool_response>18C</tool_response>Sunny."));
    // "Sunny." has 6 < 10 characters → q = 0 without asking the judge; total = process 1.0
    assert_eq!(hierr_reward(&weather_task(), &short, &FixedJudge(5), &stats).total, 1.0);
    let unrun = Transcript::from_completion(&format!("<tool_call>[{WEATHER}, {TIME}]</tool_call>It is sunny and warm there."));
    assert_eq!(hierr_reward(&weather_task(), &unrun, &FixedJudge(5), &stats).component("summary"), Some(0.0));
    assert_eq!(stats.calls(), 0);
}

struct Down;
impl Judge for Down {
    fn score(&self, _: &JudgeRequest<'_>) -> Result<u8, JudgeError> {
        Err(JudgeError::Unavailable("connection refused".into()))
    }
}

#[test]
fn judge_failure_scores_zero_and_is_counted() {
    let stats = JudgeStats::default();
    let t = Transcript::from_completion(&format!("<tool_call>[{WEATHER}, {TIME}]</tool_call>{REPLY}"));
    let s = hierr_reward(&weather_task(), &t, &Down, &stats);
    // process 1.0 + summary 0 (failure)
    assert_eq!(s.total, 1.0);
    assert_eq!((stats.calls(), stats.failures()), (1, 1));
}

#[test]
fn no_tool_task_without_calls() {
    let task: Task = serde_json::from_value(json!({"requires_tool": false})).unwrap();
    let p = hierr_process(&task, &Transcript::from_completion("Paris."));
    // fmt 0 (no tags), name 1 (both empty), key 1, value 1 (no gold arguments), parallel 1 (no block, no gold step)
    // process = 0 + 0.25 + 0.15 + 0.20 + 0.30 = 0.90
    assert!(close(p.process(), 0.90));
}
