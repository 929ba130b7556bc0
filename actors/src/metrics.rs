//! Every Prometheus metric of rlmesh, defined once, and the `/metrics` endpoint.
//!
//! Each process makes one [`Metrics`] (one registry holding every series
//! below) and serves it with [`serve`]. The names, kinds, labels and meanings
//! live only in the `metrics!` table of this file; [`DEFINITIONS`] and
//! [`markdown_table`] (the README's table) are generated from it.
//!
//! ```
//! let m = rlmesh_actors::metrics::Metrics::new();
//! m.groups_trained_total.inc();
//! let server = rlmesh_actors::metrics::serve(&m, "127.0.0.1:0").unwrap();
//! assert_ne!(server.local_addr().port(), 0);
//! assert!(m.encode().contains("rlmesh_groups_trained_total 1"));
//! ```
use prometheus::{Encoder, Gauge, GaugeVec, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, Opts, Registry, TextEncoder};
use std::io::{self, Read, Write};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

/// The kind of a metric, as Prometheus names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up.
    Counter,
    /// Goes up and down.
    Gauge,
    /// Counts observations into buckets.
    Histogram,
}

impl Kind {
    /// `counter`, `gauge` or `histogram`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric's name, kind, labels and meaning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Definition {
    /// Full name, prefixed `rlmesh_`.
    pub name: &'static str,
    /// Its kind.
    pub kind: Kind,
    /// Label names (empty for a single series).
    pub labels: &'static [&'static str],
    /// What it measures.
    pub help: &'static str,
}

/// How a metric type is made from its definition.
trait Build: Sized {
    const KIND: Kind;
    fn build(name: &str, help: &str, labels: &[&str], buckets: Option<Vec<f64>>) -> prometheus::Result<Self>;
}

impl Build for IntCounter {
    const KIND: Kind = Kind::Counter;
    fn build(name: &str, help: &str, _: &[&str], _: Option<Vec<f64>>) -> prometheus::Result<Self> {
        IntCounter::with_opts(Opts::new(name, help))
    }
}

impl Build for IntCounterVec {
    const KIND: Kind = Kind::Counter;
    fn build(name: &str, help: &str, labels: &[&str], _: Option<Vec<f64>>) -> prometheus::Result<Self> {
        IntCounterVec::new(Opts::new(name, help), labels)
    }
}

impl Build for Gauge {
    const KIND: Kind = Kind::Gauge;
    fn build(name: &str, help: &str, _: &[&str], _: Option<Vec<f64>>) -> prometheus::Result<Self> {
        Gauge::with_opts(Opts::new(name, help))
    }
}

impl Build for GaugeVec {
    const KIND: Kind = Kind::Gauge;
    fn build(name: &str, help: &str, labels: &[&str], _: Option<Vec<f64>>) -> prometheus::Result<Self> {
        GaugeVec::new(Opts::new(name, help), labels)
    }
}

impl Build for Histogram {
    const KIND: Kind = Kind::Histogram;
    fn build(name: &str, help: &str, _: &[&str], buckets: Option<Vec<f64>>) -> prometheus::Result<Self> {
        let opts = HistogramOpts::new(name, help);
        Histogram::with_opts(match buckets {
            Some(b) => opts.buckets(b),
            None => opts,
        })
    }
}

impl Build for HistogramVec {
    const KIND: Kind = Kind::Histogram;
    fn build(name: &str, help: &str, labels: &[&str], buckets: Option<Vec<f64>>) -> prometheus::Result<Self> {
        let opts = HistogramOpts::new(name, help);
        HistogramVec::new(
            match buckets {
                Some(b) => opts.buckets(b),
                None => opts,
            },
            labels,
        )
    }
}

macro_rules! metrics {
    ($( $field:ident : $ty:ident $([$($label:literal),+])? $(buckets $buckets:expr)? => $name:literal, $help:literal; )*) => {
        /// Every metric of one process, registered in the process's registry.
        #[derive(Clone, Debug)]
        pub struct Metrics {
            registry: Registry,
            /// Held (write) while a step's gauges are set, and (read) while a scrape
            /// encodes them: a scrape never sees half a step.
            consistent: Arc<std::sync::RwLock<()>>,
            $( #[doc = $help] pub $field: $ty, )*
        }

        /// Every metric's definition, in table order.
        pub const DEFINITIONS: &[Definition] = &[
            $( Definition { name: $name, kind: <$ty as Build>::KIND, labels: &[$($($label),+)?], help: $help }, )*
        ];

        impl Metrics {
            /// A fresh registry holding every metric (zero-valued).
            pub fn new() -> Metrics {
                let registry = Registry::new();
                $(
                    let buckets: Option<Vec<f64>> = None $(.or(Some($buckets)))?;
                    let $field = <$ty as Build>::build($name, $help, &[$($($label),+)?], buckets).expect("metric definitions are valid");
                    registry.register(Box::new($field.clone())).expect("metric names are unique");
                )*
                let m = Metrics { registry, consistent: Arc::default(), $($field),* };
                m.zero_known_series();
                m
            }
        }
    };
}

metrics! {
    reward_component: GaugeVec["component"] => "rlmesh_reward_component",
        "Mean of each reward component over the last step's rollouts, where it applies.";
    reward_mean: GaugeVec["function"] => "rlmesh_reward_mean",
        "Mean of each reward function over the last step's rollouts.";
    reward_std: GaugeVec["function"] => "rlmesh_reward_std",
        "Standard deviation of each reward function over the last step's rollouts.";
    trajectory_success: GaugeVec["split"] => "rlmesh_trajectory_success",
        "Share of rollouts with the right tool, arguments, execution and answer and no unnecessary or repeated call (split: train = last step, eval = held-out).";
    final_answer_accuracy: GaugeVec["split"] => "rlmesh_final_answer_accuracy",
        "Share of rollouts whose final answer is right.";
    tool_call_rate: GaugeVec["split"] => "rlmesh_tool_call_rate",
        "Share of rollouts that call at least one tool.";
    unnecessary_tool_rate: GaugeVec["split"] => "rlmesh_unnecessary_tool_rate",
        "Share of rollouts on no-tool tasks that call a tool.";
    repeated_call_rate: GaugeVec["split"] => "rlmesh_repeated_call_rate",
        "Share of rollouts that repeat a call (same tool and arguments).";
    generated_tokens_total: IntCounterVec["actor"] => "rlmesh_generated_tokens_total",
        "Tokens generated by each rollout actor.";
    tokens_per_second: GaugeVec["stage"] => "rlmesh_tokens_per_second",
        "Throughput of the last step (stage: rollout = tokens generated per second of generation in the step's answers, learner = tokens trained per second of its step).";
    staleness: Histogram buckets vec![0.0, 1.0, 2.0, 3.0, 4.0, 6.0, 8.0, 16.0] => "rlmesh_staleness",
        "Policy versions between a trained group's oldest token and the learner.";
    staleness_bound: Gauge => "rlmesh_staleness_bound",
        "The most policy versions a trained group may lag (the mode's bound; groups past it are dropped as stale).";
    policy_version: GaugeVec["actor"] => "rlmesh_policy_version",
        "Policy version each actor holds.";
    weight_sync_seconds: Histogram buckets prometheus::exponential_buckets(0.001, 4.0, 10).expect("valid buckets") => "rlmesh_weight_sync_seconds",
        "Seconds to move one policy version to every rollout actor, from the learner's snapshot to the last receiver's acknowledgement (digest checks and loading included).";
    step_seconds: Histogram buckets prometheus::exponential_buckets(0.01, 2.0, 14).expect("valid buckets") => "rlmesh_step_seconds",
        "Wall seconds of each RL step, from the previous step's record to this one's (the controller's clock).";
    step_phase_seconds: HistogramVec["phase"] buckets prometheus::exponential_buckets(0.001, 2.0, 18).expect("valid buckets") => "rlmesh_step_phase_seconds",
        "Seconds of each RL step spent per phase: generate, tools and reward summed over the step's rollout answers; queue_wait, the mean time its groups waited scored before the learner took them; train, the learner's step (advantages and the round trip included), of which all_reduce was in collectives between data-parallel ranks; sync, publishing the new version. Generation overlaps training when the mode runs ahead.";
    idle_ratio: GaugeVec["actor_role"] => "rlmesh_idle_ratio",
        "Share of the last RL step a role waited (learner: 1 - train / step; rollout: 1 - (generate + tools) / (step × rollout actors); reward: 1 - reward / step).";
    generate_seconds: HistogramVec["actor"] buckets prometheus::exponential_buckets(0.005, 2.0, 14).expect("valid buckets") => "rlmesh_generate_seconds",
        "Seconds each rollout request spent generating (prefill and decode, tool execution excluded), per rollout actor.";
    rollout_prefill_tokens_total: IntCounterVec["kind"] => "rlmesh_rollout_prefill_tokens_total",
        "Tokens the rollout actors prefilled (kind: new = never computed before for that rollout; recomputed = whose keys and values an earlier turn of the same rollout had computed, prefilled again). A group's shared prompt counts once; with the cache kept across turns, recomputed stays 0.";
    weight_sync_phase_seconds: HistogramVec["phase"] buckets prometheus::exponential_buckets(0.0005, 4.0, 11).expect("valid buckets") => "rlmesh_weight_sync_phase_seconds",
        "Seconds of each policy version per phase where this process did it: send (rank 0's broadcast to the group), receive (a rollout process receiving it), verify (hashing every bucket and comparing with the sender's digests; across processes the hashing is fused into the receive, whose seconds include it), load (into the rollout actor's model).";
    weight_sync_digest_failures_total: IntCounter => "rlmesh_weight_sync_digest_failures_total",
        "Policy versions this process refused because a bucket's digest did not match the sender's.";
    weight_sync_received_bytes_total: IntCounter => "rlmesh_weight_sync_received_bytes_total",
        "Bytes of the policy versions this process's rollout actor loaded (digest-checked; refused versions are not counted).";
    restart_budget_left: GaugeVec["actor"] => "rlmesh_restart_budget_left",
        "Restarts each supervised actor, or each process the controller started (`actor` = NODE/PROCESS), has left before it stays down.";
    tool_call_seconds: HistogramVec["tool"] buckets prometheus::exponential_buckets(0.0001, 4.0, 10).expect("valid buckets") => "rlmesh_tool_call_seconds",
        "Wall seconds of each tool call in trained rollouts (tool: a name the tasks allow, or other).";
    tool_calls_total: IntCounterVec["tool", "outcome"] => "rlmesh_tool_calls_total",
        "Tool calls in trained rollouts (outcome: ok, or error: the tool failed, refused its arguments, or does not exist).";
    turns_per_trajectory: Histogram buckets vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 8.0, 12.0, 16.0] => "rlmesh_turns_per_trajectory",
        "Assistant turns of each trained rollout (tool-calling turns and the final answer).";
    warmup_step: Gauge => "rlmesh_warmup_step",
        "SFT warm-up steps done.";
    warmup_loss: Gauge => "rlmesh_warmup_loss",
        "Loss of the last SFT warm-up step.";
    learner_step: Gauge => "rlmesh_learner_step",
        "Optimizer steps done.";
    learner_loss: Gauge => "rlmesh_learner_loss",
        "Policy loss of the last step.";
    learner_kl: Gauge => "rlmesh_learner_kl",
        "KL divergence to the reference (or behaviour) policy in the last step.";
    learner_entropy: Gauge => "rlmesh_learner_entropy",
        "Mean token entropy of the policy in the last step.";
    learner_clip_fraction: Gauge => "rlmesh_learner_clip_fraction",
        "Share of policy tokens whose importance ratio was clipped in the last step.";
    learner_grad_norm: Gauge => "rlmesh_learner_grad_norm",
        "Gradient norm before clipping in the last step.";
    learner_tokens_total: IntCounterVec["kind"] => "rlmesh_learner_tokens_total",
        "Tokens of the learner's RL steps (kind: trained = under the loss mask, what the loss reads; computed = positions its forward passes ran, padding included and a group's shared prompt once). computed / trained is what a trained token costs.";
    actor_restarts_total: IntCounterVec["actor"] => "rlmesh_actor_restarts_total",
        "Restarts of each actor by its supervisor, and of each process the controller started again (`actor` = NODE/PROCESS).";
    groups_dispatched_total: IntCounter => "rlmesh_groups_dispatched_total",
        "Prompt groups sent to rollout actors for the first time.";
    groups_redispatched_total: IntCounter => "rlmesh_groups_redispatched_total",
        "Prompt groups sent out again after their work was lost.";
    groups_trained_total: IntCounter => "rlmesh_groups_trained_total",
        "Prompt groups the learner trained on.";
    groups_dropped_total: IntCounterVec["reason"] => "rlmesh_groups_dropped_total",
        "Prompt groups dropped without training (reason: stale, run_ended, uniform = every rollout scored alike, dropped by dynamic sampling, unscorable = a reward function could not score a rollout: a verifier failed, timed out or answered garbage, or a tool server lost the rollout's state, or its rollouts failed in 3 requests, e.g. a reset tool that fails on its env_state; failed_agent = an agent program exited non-zero, timed out or made no call).";
    peer_rejected_total: IntCounterVec["plane", "reason"] => "rlmesh_peer_rejected_total",
        "Input from peers this process refused, and went on serving (plane: control or data; reason: malformed, version, kind, too_large, unauthenticated, payload, handshake = a session that never authenticated, unexpected = a message of the wrong type, unknown_peer, duplicate = a second process claiming a taken name or rank, superseded = a replaced process speaking up); each is named in the log with the peer's address.";
    peers_lost_total: IntCounterVec["peer"] => "rlmesh_peers_lost_total",
        "Processes this one declared lost: silent past the heartbeat deadline, or (the controller) exited or unreachable.";
    serve_requests_total: IntCounterVec["endpoint", "status"] => "rlmesh_serve_requests_total",
        "Requests the OpenAI-compatible endpoint answered (endpoint: chat or completions; status: the HTTP status).";
    serve_request_seconds: HistogramVec["endpoint"] buckets prometheus::exponential_buckets(0.005, 2.0, 14).expect("valid buckets") => "rlmesh_serve_request_seconds",
        "Seconds from a request's arrival at the OpenAI-compatible endpoint to its answer (queueing and generation included).";
    serve_batch_rows: Histogram buckets vec![1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0] => "rlmesh_serve_batch_rows",
        "Rows (samples) of each engine call the endpoint made: concurrent requests share one.";
    agent_sessions_total: IntCounterVec["shape"] => "rlmesh_agent_sessions_total",
        "Agent-program sessions that became trajectories (shape: prefix = every call extended the previous one, one sequence; segments = one segment per call).";
}

/// Kinds of learner tokens (`rlmesh_learner_tokens_total{kind}`).
pub const LEARNER_TOKEN_KINDS: [&str; 2] = ["trained", "computed"];

/// Kinds of prefilled tokens (`rlmesh_rollout_prefill_tokens_total{kind}`).
pub const PREFILL_KINDS: [&str; 2] = ["new", "recomputed"];

/// Reasons a group is dropped untrained (`rlmesh_groups_dropped_total{reason}`).
pub const DROP_REASONS: [&str; 5] = ["stale", "run_ended", "uniform", "unscorable", "failed_agent"];

/// The phases of an RL step (`rlmesh_step_phase_seconds{phase}`).
pub const STEP_PHASES: [&str; 7] = ["generate", "tools", "reward", "queue_wait", "train", "all_reduce", "sync"];

/// The roles whose waiting is measured (`rlmesh_idle_ratio{actor_role}`).
pub const IDLE_ROLES: [&str; 3] = ["learner", "rollout", "reward"];

/// The phases of a version's weight sync (`rlmesh_weight_sync_phase_seconds{phase}`).
pub const WEIGHT_SYNC_PHASES: [&str; 4] = ["send", "receive", "verify", "load"];

/// Labels every scrape target carries (`launcher up`'s `targets.json`, and
/// Prometheus' own `job` and `instance`): no metric may use one of them, or
/// Prometheus would rename it `exported_*`.
pub const TARGET_LABELS: [&str; 7] = ["run", "process", "host", "role", "rank", "job", "instance"];

/// The `tool` label of a call to a tool no task allows (a bounded label set).
pub const OTHER_TOOL: &str = "other";

impl Metrics {
    /// Starts the tool series at zero for every tool the tasks allow, and `other`.
    pub fn zero_tool_series(&self, tools: &[String]) {
        for tool in tools.iter().map(String::as_str).chain([OTHER_TOOL]) {
            self.tool_call_seconds.with_label_values(&[tool]);
            for outcome in ["ok", "error"] {
                self.tool_calls_total.with_label_values(&[tool, outcome]);
            }
        }
    }

    /// Counts the tool calls and turns of trained rollouts; a tool outside `tools` is counted as `other`.
    pub fn observe_rollouts<'t>(&self, trajectories: impl Iterator<Item = &'t rlmesh_core::Trajectory>, tools: &[String]) {
        for t in trajectories {
            self.turns_per_trajectory.observe(t.messages.iter().filter(|m| m.role == "assistant").count() as f64);
            for s in &t.steps {
                let tool = if tools.contains(&s.name) { s.name.as_str() } else { OTHER_TOOL };
                self.tool_call_seconds.with_label_values(&[tool]).observe(s.latency_ms / 1000.0);
                self.tool_calls_total.with_label_values(&[tool, if s.success { "ok" } else { "error" }]).inc();
            }
        }
    }
}

/// The counters a run carries over a restart and a resume: kept in every
/// checkpoint's data cursor and added back when the run continues from it, so
/// `rate()` and the totals do not start again from zero.
#[derive(Clone, Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Carried {
    /// `rlmesh_groups_dispatched_total`.
    pub groups_dispatched: u64,
    /// `rlmesh_groups_redispatched_total`.
    pub groups_redispatched: u64,
    /// `rlmesh_groups_trained_total`.
    pub groups_trained: u64,
    /// `rlmesh_groups_dropped_total`, by reason.
    pub groups_dropped: std::collections::BTreeMap<String, u64>,
    /// `rlmesh_generated_tokens_total`, by actor.
    pub generated_tokens: std::collections::BTreeMap<String, u64>,
    /// `rlmesh_actor_restarts_total`, by actor.
    pub actor_restarts: std::collections::BTreeMap<String, u64>,
}

/// The values of a one-label counter family, by label value.
fn by_label(v: &IntCounterVec) -> std::collections::BTreeMap<String, u64> {
    use prometheus::core::Collector;
    let mut out = std::collections::BTreeMap::new();
    for family in v.collect() {
        for m in family.get_metric() {
            let label = m.get_label().first().map(|l| l.value().to_string()).unwrap_or_default();
            let n = m.get_counter().get_value() as u64;
            if n > 0 {
                out.insert(label, n);
            }
        }
    }
    out
}

impl Metrics {
    /// The carried counters now.
    pub fn carried(&self) -> Carried {
        Carried {
            groups_dispatched: self.groups_dispatched_total.get(),
            groups_redispatched: self.groups_redispatched_total.get(),
            groups_trained: self.groups_trained_total.get(),
            groups_dropped: by_label(&self.groups_dropped_total),
            generated_tokens: by_label(&self.generated_tokens_total),
            actor_restarts: by_label(&self.actor_restarts_total),
        }
    }

    /// Adds counters carried from a checkpoint (a resumed run's earlier processes).
    pub fn carry_over(&self, c: &Carried) {
        self.groups_dispatched_total.inc_by(c.groups_dispatched);
        self.groups_redispatched_total.inc_by(c.groups_redispatched);
        self.groups_trained_total.inc_by(c.groups_trained);
        for (vec, values) in [(&self.groups_dropped_total, &c.groups_dropped), (&self.generated_tokens_total, &c.generated_tokens), (&self.actor_restarts_total, &c.actor_restarts)] {
            for (label, n) in values {
                vec.with_label_values(&[label]).inc_by(*n);
            }
        }
    }
}

impl Metrics {
    /// Series whose label values are known in advance exist from the start at
    /// zero, so `rate()`, dashboards and alerts see them before the first event.
    fn zero_known_series(&self) {
        for plane in ["control", "data"] {
            for reason in rlmesh_mesh::frame::REFUSAL_REASONS {
                self.peer_rejected_total.with_label_values(&[plane, reason]);
            }
        }
        for reason in DROP_REASONS {
            self.groups_dropped_total.with_label_values(&[reason]);
        }
        for phase in STEP_PHASES {
            self.step_phase_seconds.with_label_values(&[phase]);
        }
        for role in IDLE_ROLES {
            self.idle_ratio.with_label_values(&[role]);
        }
        for kind in LEARNER_TOKEN_KINDS {
            self.learner_tokens_total.with_label_values(&[kind]);
        }
        for kind in PREFILL_KINDS {
            self.rollout_prefill_tokens_total.with_label_values(&[kind]);
        }
        for phase in WEIGHT_SYNC_PHASES {
            self.weight_sync_phase_seconds.with_label_values(&[phase]);
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// The process's registry.
    pub fn registry(&self) -> &Registry {
        &self.registry
    }

    /// Every series in Prometheus' text format (a consistent snapshot: not in the middle of a [`Metrics::update`]).
    pub fn encode(&self) -> String {
        let _read = self.consistent.read().unwrap_or_else(|e| e.into_inner());
        encode(&self.registry)
    }

    /// Holds scrapes off while the caller sets several series that belong
    /// together (one RL step's gauges), until the guard is dropped.
    pub fn update(&self) -> std::sync::RwLockWriteGuard<'_, ()> {
        self.consistent.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// The registry's series in Prometheus' text format.
pub fn encode(registry: &Registry) -> String {
    let mut buf = Vec::new();
    TextEncoder::new().encode(&registry.gather(), &mut buf).expect("text encoding into memory does not fail");
    String::from_utf8(buf).expect("the text format is UTF-8")
}

/// The README's metric table (markdown), from [`DEFINITIONS`].
pub fn markdown_table() -> String {
    let mut out = String::from("| metric | type | labels | meaning |\n|---|---|---|---|\n");
    for d in DEFINITIONS {
        let labels: Vec<String> = d.labels.iter().map(|l| format!("`{l}`")).collect();
        out.push_str(&format!("| `{}` | {} | {} | {} |\n", d.name, d.kind.as_str(), labels.join(", "), d.help));
    }
    out
}

/// A running `/metrics` endpoint; dropping it stops the server thread.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// The bound address (the real port when asked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the blocking accept.
        let mut wake = self.addr;
        if wake.ip().is_unspecified() {
            wake.set_ip(if wake.is_ipv4() { Ipv4Addr::LOCALHOST.into() } else { Ipv6Addr::LOCALHOST.into() });
        }
        let _ = TcpStream::connect_timeout(&wake, Duration::from_secs(1));
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Serves the metrics as `GET /metrics` on `addr` (port 0: an ephemeral port) from a thread of its own.
pub fn serve(metrics: &Metrics, addr: impl ToSocketAddrs) -> io::Result<MetricsServer> {
    let listener = TcpListener::bind(addr)?;
    let addr = listener.local_addr()?;
    let stop = Arc::new(AtomicBool::new(false));
    let registry = metrics.clone();
    let thread = std::thread::Builder::new().name("rlmesh-metrics".to_string()).spawn({
        let stop = stop.clone();
        move || {
            for conn in listener.incoming() {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(stream) = conn {
                    // A client that misbehaves only loses its own response.
                    let _ = respond(stream, &registry);
                }
            }
        }
    })?;
    Ok(MetricsServer { addr, stop, thread: Some(thread) })
}

/// Longest request head read.
const MAX_REQUEST: usize = 8 * 1024;

/// Reads one request head and answers it: the series for `GET /metrics`, 404 or 405 otherwise.
fn respond(mut stream: TcpStream, metrics: &Metrics) -> io::Result<()> {
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.set_write_timeout(Some(Duration::from_secs(5)))?;
    let mut head = Vec::new();
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST {
        let n = stream.read(&mut chunk)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&chunk[..n]);
    }
    let head = String::from_utf8_lossy(&head);
    let mut parts = head.lines().next().unwrap_or("").split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    let (status, content_type, body) = match (method, path) {
        ("GET", "/metrics") => ("200 OK", "text/plain; version=0.0.4; charset=utf-8", metrics.encode()),
        ("GET", _) => ("404 Not Found", "text/plain; charset=utf-8", "not found; try /metrics\n".to_string()),
        _ => ("405 Method Not Allowed", "text/plain; charset=utf-8", "only GET\n".to_string()),
    };
    let response =
        format!("HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}", body.len());
    stream.write_all(response.as_bytes())?;
    stream.flush()
}
