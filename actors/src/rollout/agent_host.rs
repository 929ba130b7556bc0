//! `[agent]` in a rollout process: the policy behind an OpenAI-compatible
//! endpoint, and one agent program per rollout calling it.
//!
//! The endpoint's engine is the rollout actor's own model: its calls run as
//! jobs on the actor's device thread ([`DeviceEngine`]), so every completion
//! is sampled at the version the actor holds (no version loads while a
//! request's programs run: the actor handles one message at a time). Each
//! rollout opens a session (a key of its own, sampling at the recipe's
//! temperature, or greedily for a greedy evaluation), runs the program with
//! the task's row on stdin, and closes the session: its recorded calls become
//! the rollout's trajectory ([`super::agent::assemble`]).
use super::actor::RolloutDevice;
use super::agent::{assemble, AgentFailure, AgentSession, AgentSpec, SessionShape};
use crate::device::DeviceJobs;
use rlmesh_core::reward::functions::Score;
use rlmesh_core::tools::ToolFormat;
use rlmesh_core::{Group, Message, Step, Task, Trajectory};
use rlmesh_model::{Completion, SamplingParams, Tokenizer};
use rlmesh_serve::agent::{run_agent_in, AgentExit, SessionTable};
use rlmesh_serve::batcher::{BatchPolicy, Batcher};
use rlmesh_serve::engine::{generate_on, top_logprobs_on, Engine, TopTokens};
use rlmesh_serve::sessions::Auth;
use rlmesh_serve::{Endpoint, ServeConfig};
use serde_json::Value;
use std::sync::Arc;
use std::time::Duration;

/// The grade source (and reward function) of an agent's own `reward`.
pub const AGENT_FUNCTION: &str = "agent";

/// The rollout actor's model as an endpoint engine: each call is a job on its device thread.
struct DeviceEngine {
    jobs: DeviceJobs<RolloutDevice>,
    context: usize,
}

impl Engine for DeviceEngine {
    fn generate(&mut self, prompts: &[Vec<u32>], params: &SamplingParams) -> Result<Vec<Completion>, String> {
        let (prompts, params) = (prompts.to_vec(), params.clone());
        self.jobs.run_blocking(move |d| generate_on(&d.model, &d.tokenizer, &prompts, &params)).map_err(|e| e.to_string())?
    }

    fn top_logprobs(&mut self, sequence: &[u32], from: usize, k: usize, temperature: f64) -> Result<Vec<TopTokens>, String> {
        let sequence = sequence.to_vec();
        self.jobs.run_blocking(move |d| top_logprobs_on(&d.model, &sequence, from, k, temperature)).map_err(|e| e.to_string())?
    }

    fn version(&self) -> u64 {
        self.jobs.run_blocking(|d| d.version).unwrap_or(0)
    }

    fn context(&self) -> usize {
        self.context
    }
}

/// The endpoint of a rollout process in agent mode, and the program it serves.
pub struct AgentHost {
    endpoint: Endpoint,
    sessions: Arc<SessionTable>,
    tokenizer: Arc<Tokenizer>,
    spec: AgentSpec,
}

/// What one rollout's program gave.
type Outcome = Result<(AgentSession, Option<f64>, Option<String>), AgentFailure>;

impl AgentHost {
    /// Serves the device thread's model on an ephemeral local port.
    pub async fn start(jobs: DeviceJobs<RolloutDevice>, context: usize, tokenizer: Arc<Tokenizer>, spec: AgentSpec, tool_format: ToolFormat) -> Result<AgentHost, String> {
        let sessions = Arc::new(SessionTable::new());
        let batcher = Batcher::spawn(move || Ok(DeviceEngine { jobs, context }), BatchPolicy::default(), None);
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.map_err(|e| format!("the agent endpoint cannot listen: {e}"))?;
        let config = ServeConfig { model_name: "policy".into(), any_model: true, tool_format, auth: Auth::Sessions(sessions.clone()), ..ServeConfig::default() };
        let endpoint = Endpoint::start(listener, config, tokenizer.clone(), batcher).map_err(|e| format!("the agent endpoint: {e}"))?;
        Ok(AgentHost { endpoint, sessions, tokenizer, spec })
    }

    /// The tokenizer its endpoint renders and encodes with.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// `OPENAI_BASE_URL` of its programs.
    pub fn base_url(&self) -> String {
        self.endpoint.base_url()
    }

    /// `group_size` programs per task, all at once, sampling at `temperature`;
    /// a group with a failed program carries why (`Group::failed`) and its
    /// rollouts that did not fail. Also returns each session's shape.
    pub async fn rollouts(&self, groups: &[(u64, Task)], group_size: usize, temperature: f64, label: &str) -> (Vec<Group>, Vec<SessionShape>) {
        let mut runs = tokio::task::JoinSet::new();
        for (gi, (gid, task)) in groups.iter().enumerate() {
            for si in 0..group_size {
                let key = self.sessions.open_at(&format!("{label}-g{gid}-{si}"), Some(temperature));
                let (spec, url) = (self.spec.clone(), self.base_url());
                let row = serde_json::to_string(task).expect("a task serialises");
                runs.spawn(async move {
                    let timeout = Duration::from_secs_f64(spec.timeout_s);
                    let exit = run_agent_in(&spec.command, spec.cwd.as_deref().map(std::path::Path::new), &url, &key, &row, timeout).await;
                    (gi, si, key, exit)
                });
            }
        }
        let mut done: Vec<(usize, usize, Outcome)> = Vec::new();
        while let Some(joined) = runs.join_next().await {
            let Ok((gi, si, key, exit)) = joined else { continue };
            let calls = self.sessions.close(&key);
            let task = &groups[gi].1;
            let outcome = match exit {
                AgentExit::NotStarted(e) => Err(AgentFailure::NotStarted(e)),
                AgentExit::TimedOut => Err(AgentFailure::TimedOut(self.spec.timeout_s.ceil() as u64)),
                AgentExit::Exited { code, stderr_tail, .. } if code != 0 => Err(AgentFailure::Exited { code, stderr: stderr_tail }),
                AgentExit::Exited { last_line, .. } => assemble(task, si, &calls, &self.tokenizer).map(|s| {
                    let (reward, answer) = last_line.as_deref().map(printed).unwrap_or_default();
                    (s, reward, answer)
                }),
            };
            done.push((gi, si, outcome));
        }
        done.sort_by_key(|(gi, si, _)| (*gi, *si));
        let mut shapes = Vec::new();
        let mut out: Vec<Group> = groups.iter().map(|(gid, task)| Group { group_id: *gid, task: task.clone(), trajectories: vec![], failed: None, earlier_segments: vec![] }).collect();
        for (gi, si, outcome) in done {
            let g = &mut out[gi];
            match outcome {
                Ok((session, reward, answer)) => {
                    shapes.push(session.shape);
                    // The last call holds the final conversation: it is the rollout
                    // that is scored; earlier segments take its advantage.
                    let mut calls = session.trajectories;
                    let Some(mut t) = calls.pop() else { continue };
                    t.steps = steps_of(&t.messages);
                    if let Some(a) = &answer {
                        t.final_answer = a.clone();
                    }
                    t.grades.push((AGENT_FUNCTION.to_string(), reward.map_or(Score::NotApplicable, Score::Value)));
                    g.trajectories.push(t);
                    g.earlier_segments.extend(calls);
                }
                Err(e) => {
                    g.failed.get_or_insert(format!("rollout {si}: {e}"));
                }
            }
        }
        (out, shapes)
    }

    /// Stops the endpoint (programs still running are killed with their runs).
    pub async fn shutdown(self) {
        self.endpoint.shutdown().await;
    }
}

/// The program's last line `{"answer": …, "reward": …}`, when it printed one.
fn printed(line: &str) -> (Option<f64>, Option<String>) {
    let Ok(Value::Object(m)) = serde_json::from_str::<Value>(line) else { return (None, None) };
    let reward = m.get("reward").and_then(Value::as_f64).filter(|r| r.is_finite());
    let answer = m.get("answer").map(|a| a.as_str().map_or_else(|| a.to_string(), str::to_string));
    (reward, answer)
}

/// The tool calls of a conversation as the rubric's steps: each assistant
/// call, answered by the tool messages after it in order; a result that
/// starts with `error` (or is `{"error": …}`) counts as a failed call.
pub fn steps_of(messages: &[Message]) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut turn = 0;
    for (i, m) in messages.iter().enumerate() {
        if m.role != "assistant" {
            continue;
        }
        let calls = m.tool_calls.as_deref().unwrap_or_default();
        let results: Vec<&Message> = messages[i + 1..].iter().take_while(|r| r.role == "tool").collect();
        for (index, call) in calls.iter().enumerate() {
            let result = results.get(index).map_or(String::new(), |r| r.content.clone());
            let failed = result.trim_start().to_ascii_lowercase().starts_with("error") || result.trim_start().starts_with("{\"error\"");
            let repeated = steps.iter().any(|s| s.name == call.function.name && s.arguments == call.function.arguments);
            steps.push(Step {
                turn,
                index,
                name: call.function.name.clone(),
                arguments: call.function.arguments.clone(),
                error: failed.then(|| result.clone()),
                success: !failed && index < results.len(),
                result,
                latency_ms: 0.0,
                repeated,
            });
        }
        turn += 1;
    }
    steps
}

/// A stand-in for an evaluation rollout whose program failed: no answer (it counts as unsolved).
pub fn failed_trajectory(task: &Task, sample_index: usize, tokenizer: &Tokenizer) -> Trajectory {
    super::agent::sequence(task, sample_index, &[], tokenizer)
}
