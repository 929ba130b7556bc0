//! The model judge: a frozen policy-format model that scores a final reply
//! 1–5 from a fixed prompt, behind `rlmesh_core`'s [`Judge`] interface.
//!
//! The model lives on its own thread (its device); `score` sends the rendered
//! prompt there and waits with a time limit. A model that does not answer, or
//! answers something other than a digit 1–5, is a [`JudgeError`] — which the
//! reward turns into a 0 and counts, never a crash.
use rlmesh_core::reward::judge::{Judge, JudgeError, JudgeRequest};
use rlmesh_model::{SamplingParams, Tokenizer, Transformer};
use serde_json::json;
use std::path::Path;
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::Duration;

/// The fixed instruction given to the judge model.
pub const JUDGE_INSTRUCTION: &str = "You grade an assistant's final reply. Score 1 (useless or wrong) to 5 (complete and correct). Answer with one digit.";

type Job = (String, mpsc::Sender<Result<String, String>>);

/// A model judge on its own thread.
pub struct ModelJudge {
    jobs: Mutex<mpsc::Sender<Job>>,
    timeout: Duration,
}

impl ModelJudge {
    /// Load the judge model from an HF directory onto its own thread.
    pub fn load(dir: &Path, timeout: Duration) -> Result<ModelJudge, rlmesh_model::ModelError> {
        let model = Transformer::load(dir, tch::Device::Cpu, Some(tch::Kind::Float))?;
        let tokenizer = Tokenizer::load(dir)?;
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("judge".into())
            .spawn(move || {
                while let Ok((prompt, reply)) = rx.recv() {
                    let _ = reply.send(answer(&model, &tokenizer, &prompt));
                }
            })
            .map_err(|e| rlmesh_model::ModelError::Input(format!("starting the judge thread: {e}")))?;
        Ok(ModelJudge { jobs: Mutex::new(tx), timeout })
    }
}

fn answer(model: &Transformer, tokenizer: &Tokenizer, user: &str) -> Result<String, String> {
    let messages = [json!({"role": "system", "content": JUDGE_INSTRUCTION}), json!({"role": "user", "content": user})];
    let (_, ids) = tokenizer.render_ids(&messages, None, true).map_err(|e| e.to_string())?;
    let params = SamplingParams { max_new_tokens: 4, temperature: 0.0, stop_token_ids: tokenizer.stop_token_ids().to_vec(), ..Default::default() };
    let out = model.generate(&[ids], &params, None).map_err(|e| e.to_string())?;
    tokenizer.decode(&out[0].tokens, true).map_err(|e| e.to_string())
}

/// The judge's user message: the task, the tool results and the reply.
pub fn judge_prompt(request: &JudgeRequest<'_>) -> String {
    let results: Vec<&str> = request.transcript.calls().filter_map(|c| c.outcome.as_ref().map(|o| o.result.as_str())).collect();
    format!(
        "Task: {}\nTool results: {}\nFinal reply: {}\nScore (1-5):",
        request.task.prompt,
        if results.is_empty() { "(none)".to_string() } else { results.join(" | ") },
        request.transcript.final_answer
    )
}

/// The first digit 1–5 of the judge's answer.
pub fn parse_score(text: &str) -> Result<u8, JudgeError> {
    text.trim().chars().next().and_then(|c| c.to_digit(10)).filter(|d| (1..=5).contains(d)).map(|d| d as u8).ok_or_else(|| JudgeError::BadScore(text.trim().to_string()))
}

impl Judge for ModelJudge {
    fn score(&self, request: &JudgeRequest<'_>) -> Result<u8, JudgeError> {
        let (tx, rx) = mpsc::channel();
        self.jobs.lock().map_err(|_| JudgeError::Unavailable("judge lock poisoned".into()))?.send((judge_prompt(request), tx)).map_err(|_| JudgeError::Unavailable("judge thread is gone".into()))?;
        match rx.recv_timeout(self.timeout) {
            Ok(Ok(text)) => parse_score(&text),
            Ok(Err(e)) => Err(JudgeError::Unavailable(e)),
            Err(_) => Err(JudgeError::Unavailable(format!("no answer within {:?}", self.timeout))),
        }
    }
}
