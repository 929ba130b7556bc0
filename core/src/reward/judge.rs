//! Judges: score a final reply 1–5 behind one interface.
//!
//! [`RuleJudge`] is the default. A model judge (a frozen policy-format model
//! with a fixed prompt) implements the same [`Judge`] trait elsewhere. A judge
//! failure never stops training: [`judge_unit_score`] turns it into a 0 and
//! counts it in [`JudgeStats`].
use super::answer::{answers_match, parse_number};
use super::transcript::Transcript;
use crate::task::Task;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};

/// What a judge sees: the task, the tool results and the final reply.
#[derive(Clone, Copy, Debug)]
pub struct JudgeRequest<'a> {
    /// The task.
    pub task: &'a Task,
    /// The rollout (tool results, final reply).
    pub transcript: &'a Transcript,
}

/// Why a judge gave no score.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum JudgeError {
    /// The judge could not be reached or did not answer.
    #[error("judge unavailable: {0}")]
    Unavailable(String),
    /// The judge answered something that is not a score 1..=5.
    #[error("judge answer is not a score 1..=5: {0}")]
    BadScore(String),
}

/// Scores a final reply 1 (useless) to 5 (complete and correct).
pub trait Judge: Send + Sync {
    /// The score 1..=5 of the request's final reply.
    fn score(&self, request: &JudgeRequest<'_>) -> Result<u8, JudgeError>;
}

/// Calls and failures of a judge, shareable across threads.
#[derive(Debug, Default)]
pub struct JudgeStats {
    calls: AtomicU64,
    failures: AtomicU64,
}

impl JudgeStats {
    /// Judge calls made.
    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::Relaxed)
    }
    /// Judge calls that failed (scored 0).
    pub fn failures(&self) -> u64 {
        self.failures.load(Ordering::Relaxed)
    }
}

/// The judge's score mapped to `(r − 1)/4` in 0..=1; a failure or a score outside 1..=5 gives 0 and is counted.
pub fn judge_unit_score(judge: &dyn Judge, request: &JudgeRequest<'_>, stats: &JudgeStats) -> f64 {
    stats.calls.fetch_add(1, Ordering::Relaxed);
    match judge.score(request) {
        Ok(r @ 1..=5) => f64::from(r - 1) / 4.0,
        Ok(_) | Err(_) => {
            stats.failures.fetch_add(1, Ordering::Relaxed);
            0.0
        }
    }
}

/// The default rule-based judge.
///
/// With an expected answer: 5 when the reply gives it, else 1 + round(overlap)
/// (1 or 2). Without one: 1 + round(4 · overlap). `overlap` is [`overlap`] of
/// the reply with all tool results.
#[derive(Clone, Copy, Debug, Default)]
pub struct RuleJudge;

impl Judge for RuleJudge {
    fn score(&self, request: &JudgeRequest<'_>) -> Result<u8, JudgeError> {
        let reply = &request.transcript.final_answer;
        let results: Vec<&str> =
            request.transcript.calls().filter_map(|c| c.outcome.as_ref()).map(|o| o.result.as_str()).collect();
        let o = overlap(&results.join(" "), reply);
        let score = match &request.task.expected_answer {
            Some(e) if answers_match(reply, e) => 5.0,
            Some(_) => 1.0 + o.round(),
            None => 1.0 + (4.0 * o).round(),
        };
        Ok(score as u8)
    }
}

/// Words a summary may use before it stops being concise.
pub const CONCISE_WORDS: usize = 20;

/// The rule judge of a summary on its own, apart from tool correctness.
///
/// Three things make a good summary: it *states the result* in the form the
/// task asks for ([`answers_match`] with the expected answer; without one, an
/// overlap of at least ½ with the tool results), it is *concise* (at most
/// [`CONCISE_WORDS`] words) and it is *grounded* (every number in it appears in
/// a tool result or in the prompt: it claims nothing the tools did not
/// return). Score: stated → 3 + concise + grounded (3..=5); not stated → 1 +
/// grounded (1..=2). So a rollout with the right calls can still earn a poor
/// summary, and a lucky guess without grounding scores below a grounded one.
#[derive(Clone, Copy, Debug, Default)]
pub struct SummaryRubric;

impl SummaryRubric {
    /// `(stated, concise, grounded)` of a request's final reply.
    pub fn criteria(request: &JudgeRequest<'_>) -> (bool, bool, bool) {
        let reply = &request.transcript.final_answer;
        let results: Vec<&str> =
            request.transcript.calls().filter_map(|c| c.outcome.as_ref()).filter(|o| o.success).map(|o| o.result.as_str()).collect();
        let results = results.join(" ");
        let stated = match &request.task.expected_answer {
            Some(e) => answers_match(reply, e),
            None => overlap(&results, reply) >= 0.5,
        };
        let concise = reply.split_whitespace().count() <= CONCISE_WORDS;
        let known: HashSet<String> = numbers(&results).chain(numbers(&request.task.prompt)).collect();
        let grounded = numbers(reply).all(|n| known.contains(&n));
        (stated, concise, grounded)
    }
}

impl Judge for SummaryRubric {
    fn score(&self, request: &JudgeRequest<'_>) -> Result<u8, JudgeError> {
        let (stated, concise, grounded) = SummaryRubric::criteria(request);
        Ok(if stated { 3 + u8::from(concise) + u8::from(grounded) } else { 1 + u8::from(grounded) })
    }
}

/// The numbers of a text, each as its value prints (`408.0` → `408`).
fn numbers(text: &str) -> impl Iterator<Item = String> + '_ {
    text.split(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-')).filter_map(|w| parse_number(w.trim_matches(['.', '-'])).map(|n| format!("{n}")))
}

/// A judge that always gives the same score (a score supplied with the input, as in `launcher reward`).
#[derive(Clone, Copy, Debug)]
pub struct FixedJudge(pub u8);

impl Judge for FixedJudge {
    fn score(&self, _request: &JudgeRequest<'_>) -> Result<u8, JudgeError> {
        Ok(self.0)
    }
}

/// Overlap coefficient `|A ∩ B| / min(|A|, |B|)` of the word sets of two texts (0 when either is empty).
///
/// Words are lower-cased alphanumeric runs; numbers are compared by value (`408.0` = `408`).
pub fn overlap(a: &str, b: &str) -> f64 {
    let (wa, wb) = (words(a), words(b));
    if wa.is_empty() || wb.is_empty() {
        return 0.0;
    }
    wa.intersection(&wb).count() as f64 / wa.len().min(wb.len()) as f64
}

fn words(text: &str) -> HashSet<String> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '.' || c == '-'))
        .map(|w| w.trim_matches(['.', '-']))
        .filter(|w| !w.is_empty())
        .map(|w| match parse_number(w) {
            Some(n) => format!("{n}"),
            None => w.to_lowercase(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Failing;
    impl Judge for Failing {
        fn score(&self, _: &JudgeRequest<'_>) -> Result<u8, JudgeError> {
            Err(JudgeError::Unavailable("timeout".into()))
        }
    }

    fn task() -> Task {
        serde_json::from_value(serde_json::json!({"requires_tool": true, "expected_answer": "408"})).unwrap()
    }

    #[test]
    fn failures_score_zero_and_are_counted() {
        let (task, t, stats) = (task(), Transcript::default(), JudgeStats::default());
        let req = JudgeRequest { task: &task, transcript: &t };
        assert_eq!(judge_unit_score(&Failing, &req, &stats), 0.0);
        assert_eq!(judge_unit_score(&FixedJudge(9), &req, &stats), 0.0);
        // (4 − 1) / 4 = 0.75
        assert_eq!(judge_unit_score(&FixedJudge(4), &req, &stats), 0.75);
        assert_eq!((stats.calls(), stats.failures()), (3, 2));
    }

    #[test]
    fn rule_judge_scores() {
        let task = task();
        let t = Transcript::from_completion("<tool_call>{\"name\":\"c\",\"arguments\":{}}</tool_call><tool_response>408.0</tool_response>It is 408");
        assert_eq!(RuleJudge.score(&JudgeRequest { task: &task, transcript: &t }), Ok(5));
        let wrong = Transcript::from_completion("<tool_call>{\"name\":\"c\",\"arguments\":{}}</tool_call><tool_response>408</tool_response>Not 408, it is 7");
        // overlap({408}, {not,408,it,is,7}) = 1/1 → 1 + round(1) = 2
        assert_eq!(RuleJudge.score(&JudgeRequest { task: &task, transcript: &wrong }), Ok(2));
    }

    #[test]
    fn summary_rubric_by_hand() {
        let task: Task = serde_json::from_value(serde_json::json!({"requires_tool": true, "prompt": "Compute (12 + 3) * 4, then subtract 7.", "expected_answer": "53"})).unwrap();
        let t = |reply: &str| {
            Transcript::from_completion(&format!("<tool_call>{{\"name\":\"c\",\"arguments\":{{}}}}</tool_call><tool_response>60</tool_response><tool_call>{{\"name\":\"c\",\"arguments\":{{}}}}</tool_call><tool_response>53</tool_response>{reply}"))
        };
        let score = |reply: &str| SummaryRubric.score(&JudgeRequest { task: &task, transcript: &t(reply) }).unwrap();
        // stated, concise, grounded: 3 + 1 + 1
        assert_eq!(score("The result is 53."), 5);
        // stated and grounded but 21 words: 3 + 0 + 1
        assert_eq!(score("Well, after adding and multiplying and then subtracting as the task asked, I am quite sure the final number is 53"), 4);
        // stated, concise, but 99 came from nowhere: 3 + 1 + 0
        assert_eq!(score("Not 99: it is 53"), 4);
        // not stated, grounded (60 is a tool result): 1 + 1
        assert_eq!(score("The result is 60."), 2);
        // not stated, ungrounded: 1
        assert_eq!(score("The result is 61."), 1);
    }

    #[test]
    fn overlap_is_by_value() {
        assert_eq!(overlap("{\"result\": 408.0}", "The result is 408"), 1.0);
        assert_eq!(overlap("", "x"), 0.0);
    }
}
