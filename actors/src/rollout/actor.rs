//! The rollout actor: a policy copy on its own device thread, answering
//! generation requests with groups of trajectories and loading new versions.
use super::{rollout_groups_timed, RolloutConfig};
use crate::device::DeviceThread;
use crate::weight_sync::image::{load, verify, WeightAck, WeightError, WeightUpdate};
use ractor::{Actor, ActorProcessingErr, ActorRef, RpcReplyPort};
use rlmesh_core::tools::{ExecLimits, ToolRegistry};
use rlmesh_core::{Group, Task};
use rlmesh_model::{Tokenizer, Transformer};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use super::agent_host::{failed_trajectory, AgentHost};

/// A request for groups of rollouts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RolloutRequest {
    /// Groups to sample: (ledger id, task).
    pub groups: Vec<(u64, Task)>,
    /// How to sample.
    pub purpose: Purpose,
    /// Sampling seed.
    pub seed: u64,
}

/// What a [`RolloutRequest`] is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Purpose {
    /// G samples per task at the configured temperature.
    Train,
    /// One greedy rollout per task.
    EvalGreedy,
    /// One rollout per task at the configured temperature.
    EvalSampled,
}

/// The answer to a [`RolloutRequest`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RolloutResult {
    /// The groups, in request order.
    pub groups: Vec<Group>,
    /// Policy version that generated them.
    pub version: u64,
    /// Tokens generated.
    pub generated_tokens: usize,
    /// Wall seconds.
    pub seconds: f64,
    /// Of those, seconds spent executing tools and appending their results.
    #[serde(default)]
    pub tool_seconds: f64,
    /// The actor that generated them (its process's name, or `rollout-I` in the controller's).
    #[serde(default)]
    pub actor: String,
    /// The groups scored on their way to the controller (a reward process
    /// scored them; `groups` is then empty); `None`: not scored yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scored: Option<Vec<crate::reward::ScoredGroup>>,
}

/// Messages of a rollout actor.
pub enum RolloutMsg {
    /// Generate groups.
    Generate(RolloutRequest, RpcReplyPort<Result<RolloutResult, String>>),
    /// Load a new policy version (digest-checked).
    LoadWeights(WeightUpdate, RpcReplyPort<Result<WeightAck, String>>),
}

// In-process only: never serialised (ractor's `cluster` feature asks every message type to say so).
impl ractor::Message for RolloutMsg {}

/// Start-up arguments of a rollout actor.
#[derive(Clone)]
pub struct RolloutArgs {
    /// Model directory (initial weights, tokenizer, template).
    pub model_dir: PathBuf,
    /// Tools offered.
    pub tools: Vec<String>,
    /// MCP tool servers it starts or reaches for itself.
    pub servers: Vec<rlmesh_mcp::ServerSpec>,
    /// Tool limits.
    pub limits: ExecLimits,
    /// Sampling and loop limits.
    pub config: RolloutConfig,
    /// Intra-op threads of the device thread.
    pub threads: i32,
    /// Where it generates (a CUDA device: weights are copied to it as they arrive).
    pub device: tch::Device,
    /// Fault injection for tests: panic on this request number (counted across restarts).
    pub panic_on_request: Option<u64>,
    /// Requests seen by this actor slot (shared across restarts).
    pub requests: Arc<AtomicU64>,
    /// The process's metrics (refused versions are counted there), if it serves any.
    pub metrics: Option<crate::metrics::Metrics>,
    /// Its name in metrics and results (`actor` label): its process's, or `rollout-I`.
    pub label: String,
}

/// What the device thread owns.
pub struct RolloutDevice {
    pub(super) model: Transformer,
    pub(super) tokenizer: Tokenizer,
    registry: ToolRegistry,
    /// Keeps the MCP servers' processes alive as long as the actor.
    _servers: Vec<std::sync::Arc<rlmesh_mcp::McpServer>>,
    pub(super) version: u64,
}

/// How a rollout answer begins when a tool server is past its restart budget
/// (the controller stops the run at a checkpoint).
pub const TOOLS_GIVEN_UP: &str = "a tool server was given up";

/// The rollout actor.
pub struct RolloutActor;

/// State of a running rollout actor.
pub struct RolloutState {
    /// `[agent]`'s endpoint (declared first: dropped before the device thread it calls).
    agent: Option<AgentHost>,
    device: DeviceThread<RolloutDevice>,
    args: RolloutArgs,
}

impl Actor for RolloutActor {
    type Msg = RolloutMsg;
    type State = RolloutState;
    type Arguments = RolloutArgs;

    async fn pre_start(&self, myself: ActorRef<Self::Msg>, args: RolloutArgs) -> Result<RolloutState, ActorProcessingErr> {
        let (dir, tools, limits, threads, on) = (args.model_dir.clone(), args.tools.clone(), args.limits, args.threads, args.device);
        let servers = args.servers.clone();
        let format = args.config.tool_format;
        let name = format!("rollout-{}", myself.get_id());
        let log_name = args.label.clone();
        let device = DeviceThread::spawn(&name, move || -> Result<RolloutDevice, String> {
            tch::set_num_threads(threads);
            let model = Transformer::load(&dir, on, Some(tch::Kind::Float)).map_err(|e| e.to_string())?;
            let tokenizer = Tokenizer::load(&dir).map_err(|e| e.to_string())?;
            let opened = super::tools::open_tools(&tools, &servers, limits, format)?;
            for s in &opened.servers {
                let names: Vec<&str> = s.tools().iter().map(|t| t.name.as_str()).collect();
                let pid = s.pid().map(|p| format!(", pid {p}")).unwrap_or_default();
                eprintln!("[tools] {log_name}: tool server {} ready: {} tools ({}){pid}", s.name(), names.len(), names.join(", "));
            }
            Ok(RolloutDevice { model, tokenizer, registry: opened.registry, _servers: opened.servers, version: 0 })
        })
        .await??;
        let agent = match args.config.agent.clone() {
            None => None,
            Some(spec) => {
                let context = device.run(|d| usize::try_from(d.model.config.max_position_embeddings).unwrap_or(usize::MAX)).await?;
                let tokenizer = Arc::new(Tokenizer::load(&args.model_dir).map_err(|e| e.to_string())?);
                let host = AgentHost::start(device.jobs(), context, tokenizer, spec, format).await?;
                eprintln!("[agent] {}: the policy's endpoint for agent programs is {}", args.label, host.base_url());
                Some(host)
            }
        };
        Ok(RolloutState { agent, device, args })
    }

    async fn post_stop(&self, _myself: ActorRef<Self::Msg>, state: &mut RolloutState) -> Result<(), ActorProcessingErr> {
        if let Some(host) = state.agent.take() {
            host.shutdown().await;
        }
        Ok(())
    }

    async fn handle(&self, _myself: ActorRef<Self::Msg>, msg: Self::Msg, state: &mut RolloutState) -> Result<(), ActorProcessingErr> {
        match msg {
            RolloutMsg::Generate(req, reply) => {
                let n = state.args.requests.fetch_add(1, Ordering::SeqCst) + 1;
                if state.args.panic_on_request == Some(n) {
                    panic!("injected fault: rollout actor dies on request {n}");
                }
                let mut cfg = state.args.config.clone();
                let (metrics, actor) = (state.args.metrics.clone(), state.args.label.clone());
                if req.purpose != Purpose::Train {
                    cfg.group_size = 1;
                }
                if req.purpose == Purpose::EvalGreedy {
                    cfg.sampling.temperature = 0.0;
                }
                if let Some(host) = &state.agent {
                    let out = agent_rollouts(host, &state.device, req, &cfg, metrics.as_ref(), actor).await;
                    let _ = reply.send(out);
                    return Ok(());
                }
                let out = state
                    .device
                    .run(move |d| -> Result<RolloutResult, String> {
                        let t = std::time::Instant::now();
                        let done = rollout_groups_timed(&d.model, &d.tokenizer, &d.registry, &req.groups, &cfg, d.version, req.seed);
                        // A tool server past its restart budget (whether or not the rollouts
                        // failed on it, e.g. its reset could not open a session): the run
                        // stops at a checkpoint rather than re-dispatching to it forever.
                        d.registry.health().map_err(|e| format!("{TOOLS_GIVEN_UP}: {e}"))?;
                        let (groups, timing) = done.map_err(|e| e.to_string())?;
                        let generated_tokens = groups.iter().flat_map(|g| &g.trajectories).map(|t| t.policy_tokens()).sum();
                        let seconds = t.elapsed().as_secs_f64();
                        if let Some(m) = &metrics {
                            m.generate_seconds.with_label_values(&[&actor]).observe(seconds - timing.tools_seconds);
                            let [new, recomputed] = crate::metrics::PREFILL_KINDS;
                            m.rollout_prefill_tokens_total.with_label_values(&[new]).inc_by(timing.prefill.new as u64);
                            m.rollout_prefill_tokens_total.with_label_values(&[recomputed]).inc_by(timing.prefill.recomputed as u64);
                        }
                        Ok(RolloutResult { groups, version: d.version, generated_tokens, seconds, tool_seconds: timing.tools_seconds, actor, scored: None })
                    })
                    .await?;
                let _ = reply.send(out);
            }
            RolloutMsg::LoadWeights(update, reply) => {
                let (metrics, actor) = (state.args.metrics.clone(), state.args.label.clone());
                let out = state
                    .device
                    .run(move |d| -> Result<WeightAck, String> {
                        // Digests hashed while the version arrived count as verification.
                        let hashed = update.arrived.as_ref().map_or(0.0, |a| a.seconds);
                        let phase = |name: &str, t: std::time::Instant, before: f64| {
                            if let Some(m) = &metrics {
                                m.weight_sync_phase_seconds.with_label_values(&[name]).observe(before + t.elapsed().as_secs_f64());
                            }
                        };
                        let t = std::time::Instant::now();
                        let received = verify(&update).map_err(|e| {
                            if let (WeightError::Digest { .. }, Some(m)) = (&e, &metrics) {
                                m.weight_sync_digest_failures_total.inc();
                            }
                            e.to_string()
                        })?;
                        phase("verify", t, hashed);
                        let t = std::time::Instant::now();
                        let ack = load(&d.model, &update, received).map_err(|e| e.to_string())?;
                        phase("load", t, 0.0);
                        if let Some(m) = &metrics {
                            m.weight_sync_received_bytes_total.inc_by(update.buckets.len as u64);
                            m.policy_version.with_label_values(&[&actor]).set(ack.version as f64);
                        }
                        d.version = ack.version;
                        Ok(ack)
                    })
                    .await?;
                let _ = reply.send(out);
            }
        }
        Ok(())
    }
}

/// A request's rollouts as agent programs' runs: each group's sessions, or
/// (evaluation) a stand-in with no answer for a program that failed.
async fn agent_rollouts(host: &AgentHost, device: &DeviceThread<RolloutDevice>, req: RolloutRequest, cfg: &super::RolloutConfig, metrics: Option<&crate::metrics::Metrics>, actor: String) -> Result<RolloutResult, String> {
    let t = std::time::Instant::now();
    let version = device.run(|d| d.version).await.map_err(|e| e.to_string())?;
    let (mut groups, shapes) = host.rollouts(&req.groups, cfg.group_size, cfg.sampling.temperature, &actor).await;
    if let Some(m) = metrics {
        for s in shapes {
            m.agent_sessions_total.with_label_values(&[s.label()]).inc();
        }
    }
    if req.purpose != Purpose::Train {
        // An evaluation scores every task: a failed program's rollout is unsolved.
        let tokenizer = host.tokenizer();
        for g in groups.iter_mut().filter(|g| g.trajectories.is_empty()) {
            g.trajectories.push(failed_trajectory(&g.task, 0, tokenizer));
            g.failed = None;
        }
    }
    let generated_tokens = groups.iter().flat_map(|g| &g.trajectories).map(|t| t.policy_tokens()).sum();
    let seconds = t.elapsed().as_secs_f64();
    Ok(RolloutResult { groups, version, generated_tokens, seconds, tool_seconds: 0.0, actor, scored: None })
}
