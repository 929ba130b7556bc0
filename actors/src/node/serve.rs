//! `launcher node`: one process of a distributed run, hosting the actors the
//! controller gives it.
//!
//! The process reads its place from the environment the plan wrote
//! ([`crate::controller::plan`]) and its cookie from `RLMESH_COOKIE_FILE` or
//! `RLMESH_COOKIE`. It joins the controller's control plane, binds its data
//! port, says [`Hello`], and waits for a [`NodeSetup`]. Then it serves:
//!
//! - a **rollout** actor: [`ControlMsg::Generate`] runs the tool loop and
//!   sends the groups to the named reward endpoint; [`DataMsg::Weights`] loads
//!   a version between requests (digest-checked) and answers on the control plane;
//! - a **reward** actor: [`DataMsg::Groups`] are scored and go on to the controller;
//! - a **learner** rank: every [`DataMsg::Learner`] call runs on this rank's
//!   shard; gradients are all-reduced with the other ranks over `comm`'s ring.
//!
//! Messages to one actor are enqueued in the order they arrive, so a version
//! sent before a request is loaded before it. The process leaves on
//! [`ControlMsg::Stop`], on SIGTERM, or when the controller is lost (silent
//! past the heartbeat deadline): a node never outlives its run.
use crate::device::torch_device;
use crate::learner::GROUP_BROKEN;
use super::wire::*;
use super::weights::{GroupSpec, Pending, WeightGroup};
use std::net::IpAddr;
use super::{Outboxes, RefusalMirror};
use crate::weight_sync::image::WeightUpdate;
use crate::weight_sync::parts::{parts, Assemblies, WEIGHT_PART_BYTES};
use tokio::sync::{mpsc, oneshot};
use crate::metrics::{serve as serve_metrics, Metrics};
use crate::learner::actor::{LearnerActor, LearnerArgs, LearnerMsg};
use crate::reward::Scorer;
use crate::rollout::actor::{RolloutActor, RolloutArgs, RolloutMsg, RolloutRequest, RolloutResult};
use ractor::{Actor, ActorRef};
use rlmesh_mesh::control::{ControlConfig, ControlNode, ControlSender, Incoming, PeerEvent};
use rlmesh_mesh::cookie::Cookie;
use rlmesh_mesh::data_plane::{DataPlaneConfig, DataPlaneStats, Inbox};
use rlmesh_mesh::frame::FrameCodec;
use rlmesh_comm::RingConfig;
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

/// Where this process is, from the plan's environment.
#[derive(Clone, Debug)]
pub struct NodeEnv {
    /// `node/process`.
    pub process: String,
    /// This host's address (the data port is bound there).
    pub host: String,
    /// The controller process's name.
    pub controller: String,
    /// The controller's control port, `host:port`.
    pub controller_addr: String,
    /// This process's control port.
    pub control_port: u16,
    /// This process's data port.
    pub data_port: u16,
    /// This process's `/metrics` port.
    pub metrics_port: u16,
    /// The address its listeners bind (`None`: every interface, `RLMESH_LISTEN_ALL=1`).
    pub listen: Option<IpAddr>,
}

impl NodeEnv {
    /// Reads `RLMESH_PROCESS`, `RLMESH_HOST`, `RLMESH_CONTROLLER`,
    /// `RLMESH_CONTROLLER_ADDR`, `RLMESH_CONTROL_PORT` and `RLMESH_DATA_PORT`.
    pub fn from_env() -> Result<NodeEnv, String> {
        let var = |k: &str| std::env::var(k).map_err(|_| format!("{k} is not set (`launcher node` is started by `launcher up`, which sets it)"));
        let port = |k: &str| -> Result<u16, String> { var(k)?.parse().map_err(|_| format!("{k}: not a port")) };
        let host = var("RLMESH_HOST")?;
        Ok(NodeEnv {
            process: var("RLMESH_PROCESS")?,
            listen: listen_address(&host, std::env::var("RLMESH_LISTEN_ALL").is_ok_and(|v| v == "1"))?,
            host,
            controller: var("RLMESH_CONTROLLER")?,
            controller_addr: var("RLMESH_CONTROLLER_ADDR")?,
            control_port: port("RLMESH_CONTROL_PORT")?,
            data_port: port("RLMESH_DATA_PORT")?,
            metrics_port: port("RLMESH_METRICS_PORT")?,
        })
    }
}

/// The data endpoint `tcp://host:port`.
pub fn endpoint(host: &str, port: u16) -> String {
    // ZeroMQ binds only to an address or an interface name, never a host name
    // (a Slurm node is named, `h0`): a name is resolved here, its IPv4 first.
    match rlmesh_mesh::host_ip(host) {
        Some(ip) => format!("tcp://{}", std::net::SocketAddr::new(ip, port)),
        None => format!("tcp://{host}:{port}"),
    }
}

/// The address a process on `host` listens on: `host`'s own, or every interface (`None`) with `all`.
pub fn listen_address(host: &str, all: bool) -> Result<Option<IpAddr>, String> {
    if all {
        return Ok(None);
    }
    rlmesh_mesh::host_ip(host)
        .map(Some)
        .ok_or_else(|| format!("the host {host:?} does not resolve to an address to listen on (set [network] listen_all = true in the topology to listen on every interface)"))
}

/// The endpoint a data inbox binds: `advertised` (`tcp://host:port`), or every interface on `port`.
pub fn bind_endpoint(advertised: &str, listen: Option<IpAddr>, port: u16) -> String {
    match listen {
        Some(_) => advertised.to_string(),
        None => format!("tcp://0.0.0.0:{port}"),
    }
}

/// The actors this process hosts.
#[derive(Default)]
struct Hosted {
    rollout: Option<ActorRef<RolloutMsg>>,
    reward: Option<Arc<Scorer>>,
    learner: Option<(ActorRef<LearnerMsg>, u32)>,
    controller_data: String,
    /// This process's member of the weight-sync group (replaced when the group is formed again).
    weights: Arc<std::sync::Mutex<Option<Arc<WeightGroup>>>>,
    /// Versions being received, in order (loaded one after the other by one task).
    loads: Option<mpsc::UnboundedSender<(u64, std::time::Instant, Pending<WeightUpdate>)>>,
    /// Rank 0's snapshots to broadcast, in order.
    publishes: Option<mpsc::UnboundedSender<Publication>>,
    /// The address this process's ring listeners bind.
    listen: Option<IpAddr>,
    /// This process's name (`node/process`).
    process: String,
    /// The GPU of its weight-sync member (its learner's, else its rollout actor's), if any.
    cuda: Option<usize>,
    /// A version arriving from the controller in parts ([`DataMsg::Weights`]).
    assembling: std::sync::Mutex<Assemblies>,
}

/// A version rank 0 broadcasts: its call, the snapshot to come, and the group to send it to.
type Publication = (u64, oneshot::Receiver<WeightUpdate>, Option<Arc<WeightGroup>>);

/// Pins every thread of this process to `cpus` (threads started later inherit it).
pub fn pin_process(cpus: &[usize]) -> Result<(), String> {
    if cpus.is_empty() {
        return Ok(());
    }
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes inside it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &c in cpus {
        unsafe { libc::CPU_SET(c, &mut set) };
    }
    let tasks = std::fs::read_dir("/proc/self/task").map_err(|e| format!("/proc/self/task: {e}"))?;
    for t in tasks.flatten() {
        let Ok(tid) = t.file_name().to_string_lossy().parse::<i32>() else { continue };
        // SAFETY: `set` is a valid cpu_set_t of the size passed.
        if unsafe { libc::sched_setaffinity(tid, std::mem::size_of::<libc::cpu_set_t>(), &set) } != 0 {
            return Err(format!("sched_setaffinity({tid}, {cpus:?}): {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

/// Runs this process until it is told to stop or its controller is gone.
pub async fn serve() -> Result<(), String> {
    let env = NodeEnv::from_env()?;
    let cookie = Cookie::from_env().map_err(|e| e.to_string())?;
    let metrics = Metrics::new();
    let maddr = match env.listen {
        Some(ip) => std::net::SocketAddr::new(ip, env.metrics_port).to_string(),
        None => format!("0.0.0.0:{}", env.metrics_port),
    };
    let _server = serve_metrics(&metrics, maddr.as_str()).map_err(|e| format!("/metrics on {maddr} (the topology's ports.metrics): {e}"))?;
    let faults = crate::controller::topology::Faults::from_env()?;
    let ccfg = ControlConfig { cap: CONTROL_CAP, host: env.host.clone(), listen: env.listen, heartbeat: faults.heartbeat(), deadline: faults.deadline(), ..ControlConfig::default() };
    let mut control = ControlNode::<ControlMsg>::start(&env.process, env.control_port, &cookie, ccfg).await.map_err(|e| e.to_string())?;
    // The controller may come up after us (pods start in any order): retry
    // until RLMESH_JOIN_TIMEOUT_S (default 30 s) has passed.
    let join = std::env::var("RLMESH_JOIN_TIMEOUT_S").ok().and_then(|s| s.parse::<u64>().ok()).unwrap_or(30);
    let deadline = std::time::Instant::now() + Duration::from_secs(join);
    loop {
        match control.connect(&env.controller_addr).await {
            Ok(()) => break,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("[node] {}: controller at {} not reachable yet ({e}); retrying", env.process, env.controller_addr);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => return Err(format!("{e} (controller at {}, tried for {join} s)", env.controller_addr)),
        }
    }
    control.wait_for_peer(&env.controller, Duration::from_secs(30)).await.map_err(|e| format!("{e} (controller at {})", env.controller_addr))?;
    let codec = FrameCodec::new(cookie.as_bytes(), DATA_CAP);
    let data = endpoint(&env.host, env.data_port);
    let mut inbox = Inbox::<DataMsg>::bind(&bind_endpoint(&data, env.listen, env.data_port), codec.clone(), &DataPlaneConfig::default()).map_err(|e| e.to_string())?;
    let outboxes = Outboxes { codec, open: Arc::default() };
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let hello = Hello { pid: std::process::id(), host: crate::controller::status::host_name(), start_time: crate::controller::status::start_time(std::process::id()), data, cores };
    let tx = control.sender();
    tx.send(&env.controller, &ControlMsg::Hello(hello)).map_err(|e| e.to_string())?;
    eprintln!("[node] {}: joined the controller {} at {}", env.process, env.controller, env.controller_addr);
    metrics.peers_lost_total.with_label_values(&[&env.controller]);
    let mut hosted = Hosted { listen: env.listen, process: env.process.clone(), ..Hosted::default() };
    let (mut mirror, mut tick) = (RefusalMirror::default(), tokio::time::interval(Duration::from_secs(1)));
    let data_stats = inbox.stats();
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(|e| e.to_string())?;
    loop {
        tokio::select! {
            m = control.next() => {
                let (from, msg) = match m {
                    None => break,
                    Some(Incoming::Peer(PeerEvent::Lost(p))) if p == env.controller => {
                        eprintln!("[node] {}: the controller is lost (silent past the heartbeat deadline); leaving", env.process);
                        break;
                    }
                    Some(Incoming::Peer(PeerEvent::Lost(p))) => {
                        metrics.peers_lost_total.with_label_values(&[&p]).inc();
                        continue;
                    }
                    Some(Incoming::Peer(_)) => continue,
                    Some(Incoming::Message(from, msg)) => (from, msg),
                };
                if from != env.controller {
                    control.stats().reject("unknown_peer", || format!("[node] {}: refused {} from {from}: only the controller ({}) sends to a node", env.process, msg.name(), env.controller));
                    continue;
                }
                match msg {
                    ControlMsg::Setup(setup) => {
                        let out = match setup.get::<NodeSetup>("NodeSetup") {
                            Ok(s) => host(&mut hosted, s, &cookie.to_hex(), &tx, &env.controller, &outboxes, &metrics).await,
                            Err(e) => Err(e),
                        };
                        if let Err(e) = &out {
                            eprintln!("[node] {}: setup failed: {e}", env.process);
                        }
                        let _ = tx.send(&env.controller, &ControlMsg::Ready(out));
                    }
                    ControlMsg::Generate { id, reward, request } => generate(&hosted, id, reward, request, &outboxes),
                    ControlMsg::Regroup { spec, abort } => regroup(&hosted, &spec, abort, &cookie.to_hex()),
                    ControlMsg::Receive { id } => match (hosted.group(), &hosted.loads) {
                        (Some(g), Some(loads)) => {
                            let _ = loads.send((id, std::time::Instant::now(), g.receive()));
                        }
                        _ => {
                            let _ = tx.send(&env.controller, &ControlMsg::WeightsLoaded { id, result: Err("this process is in no weight-sync group".into()) });
                        }
                    },
                    ControlMsg::Stop => {
                        eprintln!("[node] {}: stop requested by the controller", env.process);
                        break;
                    }
                    other => control.stats().reject("unexpected", || format!("[node] {}: refused {} from the controller: a node takes no such message", env.process, other.name())),
                }
            }
            d = inbox.recv() => {
                let Some(msg) = d else { break };
                on_data(&hosted, msg, &outboxes, &tx, &env.controller, &cookie.to_hex(), &data_stats);
            }
            _ = tick.tick() => {
                mirror.copy(&metrics, "control", control.stats());
                mirror.copy(&metrics, "data", &data_stats);
            }
            _ = term.recv() => {
                eprintln!("[node] {}: SIGTERM; leaving", env.process);
                break;
            }
        }
    }
    if let Some(r) = hosted.rollout.take() {
        r.stop(None);
    }
    if let Some((l, _)) = hosted.learner.take() {
        l.stop(None);
    }
    Ok(())
}

async fn host(hosted: &mut Hosted, s: NodeSetup, cookie: &str, tx: &ControlSender<ControlMsg>, controller: &str, outboxes: &Outboxes, metrics: &Metrics) -> Result<(), String> {
    pin_process(&s.cpus)?;
    hosted.controller_data = s.controller_data.clone();
    hosted.cuda = s.learner.as_ref().and_then(|l| l.cuda).or(s.rollout.as_ref().and_then(|r| r.cuda));
    if let Some(spec) = &s.weights {
        regroup(hosted, spec, false, cookie);
    }
    if let Some(r) = s.rollout {
        let args = RolloutArgs {
            model_dir: s.model_dir.clone(),
            tools: r.tools,
            servers: r.servers,
            limits: r.limits,
            config: r.config,
            threads: s.threads,
            device: torch_device(r.cuda).map_err(|e| format!("rollout actor: {e}"))?,
            panic_on_request: None,
            requests: Arc::new(AtomicU64::new(0)),
            metrics: Some(metrics.clone()),
            label: hosted.process.clone(),
        };
        eprintln!("[node] {}: rollout actor on {:?}", hosted.process, args.device);
        let (a, _) = Actor::spawn(None, RolloutActor, args).await.map_err(|e| format!("rollout actor: {e}"))?;
        hosted.rollout = Some(a);
    }
    if let Some(spec) = &s.reward {
        hosted.reward = Some(Arc::new(Scorer::new(spec).map_err(|e| format!("reward actor: {e}"))?));
    }
    if let Some(l) = s.learner {
        // The learners' ring: its own cookie derived from the run's, its listener on this host.
        let ring = RingConfig::new(l.rank as usize, l.world as usize, l.master.clone()).cookie(format!("{cookie}:learners")).bind(hosted.listen);
        let device = torch_device(l.cuda).map_err(|e| format!("learner rank {}: {e}", l.rank))?;
        let first_start = std::env::var(super::LEARNER_RESTARTS_ENV).map_or(true, |v| v == "0");
        // Fault injection (tests): a malformed value is refused, not silently ignored.
        let fault = match std::env::var(super::RING_FAULT_ENV) {
            Err(_) => None,
            Ok(v) => Some(
                v.split_once(':')
                    .and_then(|(r, step)| Some((r.trim().parse::<u32>().ok()?, step.trim().parse::<u64>().ok()?)))
                    .ok_or_else(|| format!("{}={v:?}: expected RANK:STEP, e.g. 1:3", super::RING_FAULT_ENV))?,
            ),
        };
        let abort_ring_before_step = fault.filter(|&(r, _)| r == l.rank && first_start).map(|(_, step)| step);
        let args = LearnerArgs { model_dir: s.model_dir.clone(), config: l.config, threads: s.threads, ring: Some(ring), device, abort_ring_before_step };
        eprintln!("[node] {}: learner rank {} of {} on {:?}", hosted.process, l.rank, l.world, args.device);
        let (a, _) = Actor::spawn(None, LearnerActor, args).await.map_err(|e| format!("learner rank {}: {e}", l.rank))?;
        hosted.learner = Some((a, l.rank));
    }
    if let Some(rollout) = &hosted.rollout {
        // Receipts complete in broadcast order; one task loads them in that order, between requests.
        let (ltx, mut lrx) = mpsc::unbounded_channel::<(u64, std::time::Instant, Pending<WeightUpdate>)>();
        let (rollout, tx, controller, metrics) = (rollout.clone(), tx.clone(), controller.to_string(), metrics.clone());
        tokio::spawn(async move {
            while let Some((id, asked, pending)) = lrx.recv().await {
                let result = match pending.wait().await {
                    Err(e) => Err(e),
                    Ok(update) => {
                        // From the controller's Receive to the whole version here.
                        metrics.weight_sync_phase_seconds.with_label_values(&["receive"]).observe(asked.elapsed().as_secs_f64());
                        let (port, rx) = ractor::concurrency::oneshot();
                        match rollout.send_message(RolloutMsg::LoadWeights(update, port.into())) {
                            Err(e) => Err(format!("rollout actor: {e}")),
                            Ok(()) => rx.await.unwrap_or_else(|_| Err("the rollout actor stopped".into())),
                        }
                    }
                };
                if let Err(e) = &result {
                    eprintln!("[node] weights refused: {e}");
                }
                let _ = tx.send(&controller, &ControlMsg::WeightsLoaded { id, result });
            }
        });
        hosted.loads = Some(ltx);
    }
    if let Some((_, 0)) = &hosted.learner {
        // Rank 0's snapshots complete in mailbox order; one task broadcasts them in that order.
        // Each goes to the group as it was when its call arrived (a later regroup is for later versions).
        let (ptx, mut prx) = mpsc::unbounded_channel::<Publication>();
        let (to, outboxes) = (hosted.controller_data.clone(), outboxes.clone());
        tokio::spawn(async move {
            while let Some((id, snapshot, group)) = prx.recv().await {
                let result = match (snapshot.await, group) {
                    (Err(_), _) => Err("the learner actor stopped".to_string()),
                    (Ok(_), None) => Err("this rank is in no weight-sync group".to_string()),
                    (Ok(update), Some(group)) => group.send(update).wait().await.map(|secs| Json::of(&LearnerOut::Published(secs))),
                };
                let _ = outboxes.send(&to, DataMsg::LearnerDone { id, rank: 0, result }).await;
            }
        });
        hosted.publishes = Some(ptx);
    }
    Ok(())
}

impl Hosted {
    /// This process's member of the weight-sync group now.
    fn group(&self) -> Option<Arc<WeightGroup>> {
        self.weights.lock().expect("weights lock").clone()
    }
}

/// Leaves the weight-sync group (its thread ends once its queued work is
/// done or fails; with `abort`, at once) and joins it at `spec`'s epoch.
fn regroup(hosted: &Hosted, spec: &GroupSpec, abort: bool, cookie: &str) {
    eprintln!("[node] weight-sync group: joining epoch {} as rank {} of {}{}", spec.epoch, spec.rank, spec.world, if abort { " (the old one aborted)" } else { "" });
    let old = hosted.weights.lock().expect("weights lock").replace(Arc::new(WeightGroup::join(spec, cookie, hosted.listen, hosted.cuda)));
    if let (Some(old), true) = (old, abort) {
        old.abort();
    }
}

fn generate(hosted: &Hosted, id: u64, reward: String, request: Json, outboxes: &Outboxes) {
    let (rollout, outboxes) = (hosted.rollout.clone(), outboxes.clone());
    let (port, rx) = ractor::concurrency::oneshot();
    let sent: Result<(), String> = match (rollout, request.get::<RolloutRequest>("RolloutRequest")) {
        (None, _) => Err("this process hosts no rollout actor".into()),
        (_, Err(e)) => Err(e),
        (Some(r), Ok(req)) => r.send_message(RolloutMsg::Generate(req, port.into())).map_err(|e| format!("rollout actor: {e}")),
    };
    tokio::spawn(async move {
        let result = match sent {
            Err(e) => Err(e),
            Ok(()) => match rx.await {
                Ok(r) => r.map(|res: RolloutResult| Json::of(&res)),
                Err(_) => Err("the rollout actor stopped".into()),
            },
        };
        let _ = outboxes.send(&reward, DataMsg::Groups { id, result }).await;
    });
}

fn on_data(hosted: &Hosted, msg: DataMsg, outboxes: &Outboxes, tx: &ControlSender<ControlMsg>, controller: &str, cookie: &str, stats: &DataPlaneStats) {
    match msg {
        DataMsg::Weights { id, part } => {
            // The parts of a version arrive in order; it is loaded once all are in.
            let update = match hosted.assembling.lock().expect("assembly lock").receive(id, part) {
                Ok(None) => return,
                Ok(Some(update)) => Ok(update),
                Err(e) => Err(e),
            };
            let (port, rx) = ractor::concurrency::oneshot();
            let update = match update {
                Ok(u) => u,
                Err(e) => {
                    eprintln!("[node] weights refused: {e}");
                    let _ = tx.send(controller, &ControlMsg::WeightsLoaded { id, result: Err(e) });
                    return;
                }
            };
            let sent = match &hosted.rollout {
                Some(r) => r.send_message(RolloutMsg::LoadWeights(update, port.into())).map_err(|e| format!("rollout actor: {e}")),
                None => Err("this process hosts no rollout actor".into()),
            };
            let (tx, controller) = (tx.clone(), controller.to_string());
            tokio::spawn(async move {
                let result = match sent {
                    Err(e) => Err(e),
                    Ok(()) => rx.await.unwrap_or_else(|_| Err("the rollout actor stopped".into())),
                };
                if let Err(e) = &result {
                    eprintln!("[node] weights refused: {e}");
                }
                let _ = tx.send(&controller, &ControlMsg::WeightsLoaded { id, result });
            });
        }
        DataMsg::Groups { id, result } => {
            let (scorer, to, outboxes) = (hosted.reward.clone(), hosted.controller_data.clone(), outboxes.clone());
            tokio::spawn(async move {
                let result = match (scorer, result) {
                    (None, _) => Err("this process hosts no reward actor".into()),
                    (_, Err(e)) => Err(e),
                    (Some(scorer), Ok(json)) => match json.get::<RolloutResult>("RolloutResult") {
                        Err(e) => Err(e),
                        Ok(mut res) => {
                            let groups = std::mem::take(&mut res.groups);
                            match tokio::task::spawn_blocking(move || groups.into_iter().map(|g| scorer.score(g)).collect()).await {
                                Ok(scored) => {
                                    res.scored = Some(scored);
                                    Ok(Json::of(&res))
                                }
                                Err(e) => Err(format!("scoring failed: {e}")),
                            }
                        }
                    },
                };
                let _ = outboxes.send(&to, DataMsg::Scored { id, result }).await;
            });
        }
        DataMsg::Learner { id, call } => {
            let Some((learner, rank)) = hosted.learner.clone() else {
                return stats.reject("unexpected", || "[node] refused a learner call: this process hosts no learner rank".to_string());
            };
            let (to, outboxes) = (hosted.controller_data.clone(), outboxes.clone());
            let call: Result<LearnerCall, String> = call.get("LearnerCall");
            macro_rules! enqueue {
                ($variant:ident $(, $arg:expr)*) => {{
                    let (port, rx) = ractor::concurrency::oneshot();
                    learner.send_message(LearnerMsg::$variant($($arg,)* port.into())).map(|_| rx).map_err(|e| format!("learner actor: {e}"))
                }};
            }
            match call {
                Err(e) => {
                    tokio::spawn(async move { outboxes.send(&to, DataMsg::LearnerDone { id, rank, result: Err(e) }).await });
                }
                Ok(LearnerCall::Regroup { spec, abort }) => regroup(hosted, &spec, abort, cookie),
                Ok(LearnerCall::Publish(version)) => {
                    // An NCCL group sends the image from the learner's GPU: it is packed there.
                    let group = hosted.group();
                    let on_device = group.as_ref().is_some_and(|g| g.over_nccl());
                    let (port, rx) = ractor::concurrency::oneshot();
                    let queued = learner.send_message(LearnerMsg::Snapshot(version, on_device, port.into())).map_err(|e| format!("learner actor: {e}"));
                    match (queued, &hosted.publishes) {
                        (Ok(()), Some(p)) => {
                            let _ = p.send((id, rx, group));
                        }
                        (Err(e), _) => {
                            tokio::spawn(async move { outboxes.send(&to, DataMsg::LearnerDone { id, rank, result: Err(e) }).await });
                        }
                        (Ok(()), None) => {
                            let e = "this rank is not the weight-sync group's rank 0".to_string();
                            tokio::spawn(async move { outboxes.send(&to, DataMsg::LearnerDone { id, rank, result: Err(e) }).await });
                        }
                    }
                }
                Ok(LearnerCall::Snapshot(version)) => {
                    let rx = enqueue!(Snapshot, version, false);
                    tokio::spawn(async move {
                        let msg = match rx {
                            Ok(rx) => match rx.await {
                                Ok(update) if rank == 0 => {
                                    // In bounded parts, in order; the controller puts them together.
                                    for part in parts(&update, WEIGHT_PART_BYTES) {
                                        if outboxes.send(&to, DataMsg::Snapshot { id, part }).await.is_err() {
                                            break;
                                        }
                                    }
                                    return;
                                }
                                Ok(_) => DataMsg::LearnerDone { id, rank, result: Ok(Json::of(&LearnerOut::Done)) },
                                Err(_) => DataMsg::LearnerDone { id, rank, result: Err("the learner actor stopped".into()) },
                            },
                            Err(e) => DataMsg::LearnerDone { id, rank, result: Err(e) },
                        };
                        let _ = outboxes.send(&to, msg).await;
                    });
                }
                Ok(call) => {
                    let rx = match call {
                        LearnerCall::Sft(b) => enqueue!(Sft, b).map(|rx| Box::pin(async move { rx.await.map(|r| r.map(LearnerOut::Stats)) }) as Reply),
                        LearnerCall::Train(b) => enqueue!(Train, b).map(|rx| Box::pin(async move { rx.await.map(|r| r.map(LearnerOut::Stats)) }) as Reply),
                        LearnerCall::Configure(c) => enqueue!(Configure, c).map(|rx| Box::pin(async move { rx.await.map(|r| r.map(|_| LearnerOut::Done)) }) as Reply),
                        LearnerCall::Checkpoint(root, meta) => enqueue!(Checkpoint, root, meta).map(|rx| Box::pin(async move { rx.await.map(|r| r.map(LearnerOut::Path)) }) as Reply),
                        LearnerCall::Resume(root, c) => enqueue!(Resume, root, c).map(|rx| Box::pin(async move { rx.await.map(|r| r.map(LearnerOut::Meta)) }) as Reply),
                        LearnerCall::Snapshot(_) | LearnerCall::Publish(_) | LearnerCall::Regroup { .. } => unreachable!("handled above"),
                    };
                    tokio::spawn(async move {
                        let result = match rx {
                            Err(e) => Err(e),
                            Ok(rx) => match rx.await {
                                Ok(r) => r.map(|out| Json::of(&out)),
                                Err(_) => Err("the learner actor stopped".into()),
                            },
                        };
                        let broken = result.as_ref().err().filter(|e| e.starts_with(GROUP_BROKEN)).cloned();
                        let _ = outboxes.send(&to, DataMsg::LearnerDone { id, rank, result }).await;
                        if let Some(e) = broken {
                            leave_broken_group(rank, &e).await;
                        }
                    });
                }
            }
        }
        other => stats.reject("unexpected", || format!("[node] refused {} on the data port: a node takes no such message", other.name())),
    }
}

/// This rank's collective is broken (aborted, its peer gone or stalled): the
/// process leaves, so the controller sees a lost learner rank, stops the others
/// and `launcher up` starts the run again from the newest checkpoint, where the
/// learners form their group anew. Its reply has gone out first.
async fn leave_broken_group(rank: u32, why: &str) {
    eprintln!("[node] learner rank {rank}: {why}; leaving so that the learner group forms again from the newest checkpoint");
    // Time for the reply's frame to leave this process.
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    std::process::exit(EXIT_GROUP_BROKEN);
}

/// The exit status of a learner rank's process that left a broken group.
pub const EXIT_GROUP_BROKEN: i32 = 3;

type Reply = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Result<LearnerOut, String>, tokio::sync::oneshot::error::RecvError>> + Send>>;

