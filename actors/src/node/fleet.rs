//! The controller's side of a distributed run: it starts every process of
//! the plan, waits for each to join, tells each what to host, and stands for
//! the remote actors with proxy actors that take the same messages as local
//! ones ([`RolloutMsg`], [`LearnerMsg`]).
//!
//! - **Start.** A process whose host is one of this machine's addresses is a
//!   child; any other starts through the system OpenSSH client
//!   (`mesh::launch`), with the run's cookie in its environment (on ssh's
//!   stdin, never on a command line) and its output appended to
//!   `RUN_DIR/logs/<node>_<process>.log`. Hosts with more than one process
//!   get `OMP_WAIT_POLICY=PASSIVE`, so idle OpenMP threads sleep instead of
//!   spinning on a shared core.
//! - **Join.** Each process says [`Hello`] on the control plane; one that
//!   exits first, or is silent past the join timeout, fails the start with
//!   the last lines of its log.
//! - **Host.** [`Fleet::host`] sends each its [`NodeSetup`]: the actors of its
//!   roles, its threads and cores (the cores of a host are split evenly
//!   between its rollout and learner processes, each pinned to its share).
//! - **Serve.** One router task owns the control node and the controller's
//!   data inbox and hands every reply to the call waiting for it. A process
//!   declared lost (silent past the heartbeat deadline) fails its calls, and
//!   its proxy stops, so the driver stops choosing it.
use super::serve::endpoint;
use super::wire::*;
use super::weights::{GroupSpec, WeightGroup};
use super::{Outboxes, RefusalMirror};
use crate::weight_sync::WeightUpdate;
use crate::metrics::Metrics;
use crate::controller::plan::{Plan, Process as Planned};
use crate::controller::status::ProcessEntry;
use crate::controller::topology::Role;
use crate::learner::actor::LearnerMsg;
use crate::learner::LearnerConfig;
use crate::rollout::actor::{RolloutMsg, RolloutResult};
use crate::weight_sync::WeightAck;
use ractor::{Actor, ActorProcessingErr, ActorRef};
use rlmesh_mesh::control::{ControlConfig, ControlNode, ControlSender, Incoming, PeerEvent};
use rlmesh_mesh::cookie::Cookie;
use rlmesh_mesh::data_plane::{DataPlaneConfig, Inbox};
use rlmesh_mesh::frame::FrameCodec;
use rlmesh_mesh::launch::{Host, Launcher, Process, ProcessSpec, SshConfig};
use rlmesh_mesh::slurm::SrunConfig;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How to start the processes of a plan.
#[derive(Clone, Debug)]
pub struct FleetSpec {
    /// The placement.
    pub plan: Plan,
    /// How remote hosts are reached.
    pub ssh: SshConfig,
    /// The program every process runs (`launcher`, at the same path on every host).
    pub program: PathBuf,
    /// How long every process has to join.
    pub join_timeout: Duration,
    /// Inside a Slurm allocation: every process is a job step of this job.
    pub slurm: Option<SlurmSteps>,
    /// Something else starts the processes (Kubernetes: `launcher k8s`):
    /// `up` only waits for each to join, with the cookie from its own
    /// environment (`RLMESH_COOKIE` / `RLMESH_COOKIE_FILE`).
    pub external: bool,
}

/// How the processes of a run start as steps of a Slurm job.
#[derive(Clone, Debug)]
pub struct SlurmSteps {
    /// The job.
    pub job_id: String,
    /// Every step's name (the run's).
    pub step_name: String,
    /// The job was made by `launcher submit` for this run alone.
    pub submitted: bool,
}

impl FleetSpec {
    /// How process `p` is started: a Slurm step on its node, or a child / ssh by its host.
    pub fn launcher(&self, p: &Planned) -> Launcher {
        match &self.slurm {
            Some(s) => {
                let gpus = p.actors.iter().filter(|a| matches!(a.device, crate::controller::topology::Device::Gpu(_))).count() as u32;
                let srun = SrunConfig { program: "srun".into(), job_id: s.job_id.clone(), node: p.host.clone(), step_name: s.step_name.clone(), gpus, extra: vec![] };
                Launcher::new(Host::Slurm { srun })
            }
            None => Launcher::for_host(&p.host, self.ssh.clone()),
        }
    }
}

/// What every role needs, from the recipe.
#[derive(Clone, Debug)]
pub struct RoleSetup {
    /// Model directory (initial weights, tokenizer).
    pub model_dir: PathBuf,
    /// Rollout actors' settings.
    pub rollout: RolloutSetup,
    /// The reward function.
    pub reward: crate::reward::RewardSpec,
    /// The learner's first settings (the warm-up's).
    pub learner: LearnerConfig,
}

/// The remote actors, behind proxies.
pub struct Hosted {
    /// Broadcasts versions to the rollout processes (their weight-sync group).
    pub publisher: Option<Publisher>,
    /// One per rollout process.
    pub rollouts: Vec<ActorRef<RolloutMsg>>,
    /// The learner ranks, when they are not in the controller's process.
    pub learner: Option<ActorRef<LearnerMsg>>,
    /// Ranks behind `learner`.
    pub learner_ranks: usize,
}

/// Key of a call waiting for its reply: (call id, learner rank or 0).
type Key = (u64, u32);
const SETUP_ID: u64 = u64::MAX;

#[derive(Debug)]
enum Reply {
    Control(ControlMsg),
    Data(DataMsg),
    Lost(String),
}

/// What the proxies and the router share.
struct Core {
    tx: ControlSender<ControlMsg>,
    out: Outboxes,
    my_data: String,
    next: AtomicU64,
    names: Vec<String>,
    /// The policy version each rollout process holds (checked by its digest).
    versions: Mutex<HashMap<String, u64>>,
    pending: Mutex<HashMap<Key, (String, oneshot::Sender<Reply>)>>,
}

impl Core {
    fn id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    fn expect(&self, process: &str, key: Key) -> oneshot::Receiver<Reply> {
        let (tx, rx) = oneshot::channel();
        self.pending.lock().expect("pending lock").insert(key, (process.to_string(), tx));
        rx
    }

    fn resolve(&self, key: Key, reply: Reply) {
        match self.pending.lock().expect("pending lock").remove(&key) {
            Some((_, tx)) => {
                let _ = tx.send(reply);
            }
            None => eprintln!("[fleet] a reply to call {key:?} that nothing waits for (late, after a loss?)"),
        }
    }

    fn fail_process(&self, process: &str) {
        let keys: Vec<Key> = self.pending.lock().expect("pending lock").iter().filter(|(_, (p, _))| p == process).map(|(k, _)| *k).collect();
        for k in keys {
            if let Some((_, tx)) = self.pending.lock().expect("pending lock").remove(&k) {
                let _ = tx.send(Reply::Lost(process.to_string()));
            }
        }
    }
}

/// One started process.
struct Member {
    planned: Planned,
    hello: Hello,
    /// The handle of a process this run started (none when started externally).
    process: Option<Process>,
    log: PathBuf,
}

/// The processes of a run other than the controller's own.
pub struct Fleet {
    core: Arc<Core>,
    cookie: String,
    members: Vec<Member>,
    me: Planned,
    plan: Plan,
    router: tokio::task::JoinHandle<()>,
}

fn roles_of(p: &Planned) -> Vec<String> {
    let mut r: Vec<String> = p.actors.iter().map(|a| a.role.to_string()).collect();
    r.dedup();
    r
}

fn log_name(process: &str) -> String {
    format!("{}.log", process.replace('/', "_"))
}

/// The last `n` lines of a log file, for an error message.
fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl Fleet {
    /// Starts every process of `spec.plan` but the controller's own, and waits until each has joined.
    pub async fn launch(spec: &FleetSpec, run_dir: &Path, metrics: Arc<Metrics>, progress: &(dyn Fn(String) + Sync)) -> Result<Fleet, String> {
        let plan = spec.plan.clone();
        let me = plan.processes.iter().find(|p| p.actors.iter().any(|a| a.role == Role::Controller)).cloned().ok_or("the plan has no controller")?;
        let cookie_path = run_dir.join("cookie");
        let _ = std::fs::remove_file(&cookie_path);
        let cookie = if spec.external {
            Cookie::from_env().map_err(|e| format!("the processes are started externally, so the run's cookie comes from the environment: {e}"))?
        } else {
            Cookie::generate().map_err(|e| e.to_string())?
        };
        cookie.write_private(&cookie_path).map_err(|e| e.to_string())?;
        let ccfg = ControlConfig { cap: CONTROL_CAP, host: me.host.clone(), ..ControlConfig::default() };
        let mut control = ControlNode::<ControlMsg>::start(&me.name, me.ports.control, &cookie, ccfg)
            .await
            .map_err(|e| format!("{e} (the topology's ports.control)"))?;
        let codec = FrameCodec::new(cookie.as_bytes(), DATA_CAP);
        let my_data = endpoint(&me.host, me.ports.data);
        let inbox = Inbox::<DataMsg>::bind(&my_data, codec.clone(), &DataPlaneConfig::default()).map_err(|e| format!("{e} (the topology's ports.data)"))?;
        let logs = run_dir.join("logs");
        std::fs::create_dir_all(&logs).map_err(|e| format!("{}: {e}", logs.display()))?;
        let mut per_host: BTreeMap<&str, usize> = BTreeMap::new();
        for p in &plan.processes {
            *per_host.entry(p.host.as_str()).or_default() += 1;
        }
        let mut started: Vec<(Planned, Option<Process>, PathBuf)> = vec![];
        for p in plan.processes.iter().filter(|p| p.name != me.name) {
            if spec.external {
                started.push((p.clone(), None, logs.join(log_name(&p.name))));
                continue;
            }
            let mut s = ProcessSpec::new(spec.program.display().to_string(), ["node"]);
            s.env = p.env.clone();
            if per_host[p.host.as_str()] > 1 {
                s.env.insert("OMP_WAIT_POLICY".into(), "PASSIVE".into());
            }
            s.secret_env.insert(rlmesh_mesh::cookie::COOKIE_ENV.into(), cookie.to_hex());
            let log = logs.join(log_name(&p.name));
            s.log = Some(log.clone());
            let launcher = spec.launcher(p);
            let proc = launcher.spawn(&s).map_err(|e| format!("starting {} on {}: {e}", p.name, p.host))?;
            let step = proc.slurm_step().map(|s| format!(", Slurm step {s}")).unwrap_or_default();
            progress(format!("started {} on {} (pid {}{step}, log {})", p.name, launcher.host(), proc.pid(), log.display()));
            started.push((p.clone(), Some(proc), log));
        }
        if spec.external {
            progress(format!("waiting up to {:?} for {} externally started processes to join", spec.join_timeout, started.len()));
        }
        // Every process says Hello, or the start fails naming the first that did not.
        let t0 = Instant::now();
        let mut hellos: HashMap<String, Hello> = HashMap::new();
        while hellos.len() < started.len() {
            if t0.elapsed() > spec.join_timeout {
                let (p, _, log) = started.iter().find(|(p, _, _)| !hellos.contains_key(&p.name)).expect("one is missing");
                return Err(format!("{} did not join within {:?}; the end of its log ({}):\n{}", p.name, spec.join_timeout, log.display(), tail(log, 20)));
            }
            for (p, proc, log) in started.iter_mut() {
                if hellos.contains_key(&p.name) {
                    continue;
                }
                if let Some(Ok(Some(exit))) = proc.as_mut().map(Process::try_wait) {
                    return Err(format!("{} exited before joining ({exit:?}); the end of its log ({}):\n{}", p.name, log.display(), tail(log, 20)));
                }
            }
            match tokio::time::timeout(Duration::from_millis(200), control.recv()).await {
                Ok(Some((from, ControlMsg::Hello(h)))) => {
                    hellos.insert(from, h);
                }
                Ok(Some((from, other))) => eprintln!("[fleet] before setup, {from} sent {other:?}"),
                Ok(None) => return Err("the control plane closed".into()),
                Err(_) => {}
            }
        }
        progress(format!("{} processes joined in {:.1} s", started.len(), t0.elapsed().as_secs_f64()));
        // Series known from the plan start at zero (dashboards and alerts see them before any fault).
        for (p, _, _) in &started {
            metrics.peers_lost_total.with_label_values(&[&p.name]);
            if has(p, Role::Rollout) {
                metrics.actor_restarts_total.with_label_values(&[&p.name]);
            }
        }
        let members: Vec<Member> = started.into_iter().map(|(planned, process, log)| Member { hello: hellos.remove(&planned.name).expect("joined"), planned, process, log }).collect();
        let core = Arc::new(Core {
            tx: control.sender(),
            out: Outboxes { codec, open: Arc::default() },
            my_data,
            next: AtomicU64::new(1),
            names: members.iter().map(|m| m.planned.name.clone()).collect(),
            versions: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
        });
        let router = tokio::spawn(route(control, inbox, core.clone(), metrics));
        Ok(Fleet { core, cookie: cookie.to_hex(), members, me, plan, router })
    }

    /// The plan.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// The controller's own process in the plan.
    pub fn controller(&self) -> &Planned {
        &self.me
    }

    /// `status.json` entries of the started processes, with the version each
    /// holds (learner ranks: `learner_version`) and its heartbeat's age now.
    pub fn entries(&self, learner_version: u64) -> Vec<ProcessEntry> {
        let versions = self.core.versions.lock().expect("versions lock");
        self.members
            .iter()
            .map(|m| ProcessEntry {
                name: m.planned.name.clone(),
                pid: m.hello.pid,
                host: m.planned.host.clone(),
                roles: roles_of(&m.planned),
                start_time: m.hello.start_time,
                version: if has(&m.planned, Role::Learner) { Some(learner_version) } else { versions.get(&m.planned.name).copied() },
                heartbeat_age_s: self.core.tx.last_heard(&m.planned.name).map(|d| d.as_secs_f64()),
                restarts: 0,
                slurm_step: m.process.as_ref().and_then(|p| p.slurm_step()).map(String::from),
            })
            .collect()
    }

    /// Tells every process what to host and waits until all are ready; returns the proxies.
    pub async fn host(&self, roles: &RoleSetup) -> Result<Hosted, String> {
        let cpus = split_cores(&self.members);
        let learner_ranks = self.members.iter().filter(|m| has(&m.planned, Role::Learner)).count();
        // The weight-sync group: its root (learner rank 0's process, or this one) and the rollout processes.
        let rollout_members: Vec<usize> = (0..self.members.len()).filter(|&i| has(&self.members[i].planned, Role::Rollout)).collect();
        let root = self.members.iter().position(|m| m.planned.actors.iter().any(|a| a.role == Role::Learner && a.rank == 0));
        let master_port: u16 = self.plan.master.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or(29400);
        let group_addr = format!("{}:{}", root.map_or(&self.me.host, |r| &self.members[r].planned.host), master_port.wrapping_add(1));
        let world = rollout_members.len() as u32 + 1;
        let group_rank = |i: usize| -> Option<u32> {
            if rollout_members.is_empty() {
                None
            } else if Some(i) == root {
                Some(0)
            } else {
                rollout_members.iter().position(|&r| r == i).map(|k| k as u32 + 1)
            }
        };
        let mut waits = vec![];
        for (i, m) in self.members.iter().enumerate() {
            let p = &m.planned;
            let (threads, cpus) = cpus[i].clone();
            let learner = p.actors.iter().find(|a| a.role == Role::Learner).map(|a| LearnerSetup {
                config: roles.learner.clone(),
                rank: a.rank,
                world: self.plan.world_size,
                master: self.plan.master.clone(),
            });
            let setup = NodeSetup {
                model_dir: roles.model_dir.clone(),
                threads,
                cpus,
                controller_data: self.core.my_data.clone(),
                rollout: has(p, Role::Rollout).then(|| roles.rollout.clone()),
                reward: has(p, Role::Reward).then(|| roles.reward.clone()),
                learner,
                weights: group_rank(i).map(|rank| GroupSpec { rank, world, addr: group_addr.clone() }),
            };
            let rx = self.core.expect(&p.name, (SETUP_ID, i as u32));
            self.core.tx.send(&p.name, &ControlMsg::Setup(Json::of(&setup))).map_err(|e| format!("{}: {e}", p.name))?;
            waits.push((i, rx));
        }
        // The controller is the group's root when the learner is in its process.
        let own = (root.is_none() && !rollout_members.is_empty()).then(|| Arc::new(WeightGroup::join(&GroupSpec { rank: 0, world, addr: group_addr.clone() }, &self.cookie)));
        for (i, rx) in waits {
            let m = &self.members[i];
            match tokio::time::timeout(Duration::from_secs(300), rx).await {
                Ok(Ok(Reply::Control(ControlMsg::Ready(Ok(()))))) => {}
                Ok(Ok(Reply::Control(ControlMsg::Ready(Err(e))))) => return Err(format!("{}: setup failed: {e}", m.planned.name)),
                Ok(Ok(other)) => return Err(format!("{}: setup: unexpected answer {other:?}; its log: {}", m.planned.name, m.log.display())),
                Ok(Err(_)) => return Err(format!("{}: setup: the router stopped", m.planned.name)),
                Err(_) => return Err(format!("{}: not ready within 300 s; the end of its log ({}):\n{}", m.planned.name, m.log.display(), tail(&m.log, 20))),
            }
        }
        // Scored groups come from a reward process (round robin), else the controller scores them.
        let rewards: Vec<String> = self.members.iter().filter(|m| has(&m.planned, Role::Reward)).map(|m| m.hello.data.clone()).collect();
        let mut rollouts = vec![];
        for (k, &i) in rollout_members.iter().enumerate() {
            let m = &self.members[i];
            let reward = if rewards.is_empty() { self.core.my_data.clone() } else { rewards[k % rewards.len()].clone() };
            let args = RemoteRolloutArgs { core: self.core.clone(), process: m.planned.name.clone(), data: m.hello.data.clone(), reward, key: i as u32 + 1 };
            let (r, _) = Actor::spawn(None, RemoteRollout, args).await.map_err(|e| format!("rollout proxy: {e}"))?;
            rollouts.push(r);
        }
        let learner = if learner_ranks > 0 {
            let mut ranks: Vec<(u32, String, String)> = self
                .members
                .iter()
                .filter_map(|m| m.planned.actors.iter().find(|a| a.role == Role::Learner).map(|a| (a.rank, m.planned.name.clone(), m.hello.data.clone())))
                .collect();
            ranks.sort();
            let (r, _) = Actor::spawn(None, RemoteLearner, RemoteLearnerArgs { core: self.core.clone(), ranks }).await.map_err(|e| format!("learner proxy: {e}"))?;
            Some(r)
        } else {
            None
        };
        let publisher = (!rollout_members.is_empty()).then(|| Publisher {
            core: self.core.clone(),
            rollouts: rollout_members.iter().map(|&i| (self.members[i].planned.name.clone(), i as u32 + 1)).collect(),
            root: match (own, root) {
                (Some(g), _) => Root::Controller(g),
                (None, Some(r)) => Root::Learner { process: self.members[r].planned.name.clone(), data: self.members[r].hello.data.clone() },
                (None, None) => unreachable!("a group has a root"),
            },
        });
        Ok(Hosted { publisher, rollouts, learner, learner_ranks })
    }

    /// Asks every process to leave, waits up to `grace` for each, then kills what is left.
    pub async fn shutdown(self, grace: Duration) {
        for m in &self.members {
            let _ = self.core.tx.send(&m.planned.name, &ControlMsg::Stop);
        }
        let members = self.members;
        let _ = tokio::task::spawn_blocking(move || {
            for m in members {
                // An externally started process leaves on Stop; its starter owns it.
                let Some(mut process) = m.process else { continue };
                match process.wait_timeout(grace) {
                    Ok(Some(_)) => {}
                    _ => {
                        eprintln!("[fleet] {} did not leave within {grace:?}; stopping it", m.planned.name);
                        let _ = process.stop(Duration::from_secs(3));
                    }
                }
            }
        })
        .await;
        self.router.abort();
    }
}

fn has(p: &Planned, role: Role) -> bool {
    p.actors.iter().any(|a| a.role == role)
}

/// (threads, cores) of each member: on each host, the rollout and learner
/// processes take the host's cores in turn, each pinned to an even share
/// (one core each when there are more of them than cores); others are not pinned.
fn split_cores(members: &[Member]) -> Vec<(i32, Vec<usize>)> {
    let mut out = vec![(1, vec![]); members.len()];
    let mut hosts: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, m) in members.iter().enumerate() {
        if has(&m.planned, Role::Rollout) || has(&m.planned, Role::Learner) {
            hosts.entry(m.planned.host.as_str()).or_default().push(i);
        }
    }
    for idx in hosts.values() {
        let cores = members[idx[0]].hello.cores.max(1);
        let share = (cores / idx.len()).max(1);
        for (k, &i) in idx.iter().enumerate() {
            let first = (k * share) % cores;
            out[i] = (share as i32, (first..first + share).collect());
        }
    }
    out
}

async fn route(mut control: ControlNode<ControlMsg>, mut inbox: Inbox<DataMsg>, core: Arc<Core>, metrics: Arc<Metrics>) {
    let (mut mirror, mut tick) = (RefusalMirror::default(), tokio::time::interval(Duration::from_secs(1)));
    let data_stats = inbox.stats();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                mirror.frames(&metrics, "control", control.stats());
                mirror.frames(&metrics, "data", &data_stats);
                mirror.sessions(&metrics, control.sessions_refused());
            }
            m = control.next() => match m {
                None => break,
                Some(Incoming::Message(from, msg)) => match msg {
                    ControlMsg::WeightsLoaded { id, .. } => match core.names.iter().position(|n| *n == from) {
                        Some(i) => core.resolve((id, i as u32 + 1), Reply::Control(msg)),
                        None => eprintln!("[fleet] WeightsLoaded from {from}, which is not in the plan"),
                    },
                    ControlMsg::Ready(_) => match core.names.iter().position(|n| *n == from) {
                        Some(i) => core.resolve((SETUP_ID, i as u32), Reply::Control(msg)),
                        None => eprintln!("[fleet] Ready from {from}, which is not in the plan"),
                    },
                    other => eprintln!("[fleet] unexpected control message from {from}: {other:?}"),
                },
                Some(Incoming::Peer(PeerEvent::Lost(p))) => {
                    eprintln!("[fleet] {p} is lost: its calls fail");
                    metrics.peers_lost_total.with_label_values(&[&p]).inc();
                    core.fail_process(&p);
                }
                Some(Incoming::Peer(PeerEvent::Back(p))) => eprintln!("[fleet] {p} is back"),
                Some(Incoming::Peer(PeerEvent::Joined(_))) => {}
            },
            d = inbox.recv() => {
                let Some(msg) = d else { break };
                match &msg {
                    DataMsg::Groups { id, .. } | DataMsg::Scored { id, .. } | DataMsg::Snapshot { id, .. } => core.resolve((*id, 0), Reply::Data(msg)),
                    DataMsg::LearnerDone { id, rank, .. } => core.resolve((*id, *rank), Reply::Data(msg)),
                    _ => eprintln!("[fleet] unexpected data message on the controller's inbox"),
                }
            }
        }
    }
}

/// Arguments of a [`RemoteRollout`] proxy.
pub struct RemoteRolloutArgs {
    core: Arc<Core>,
    process: String,
    data: String,
    reward: String,
    /// Its key for weight acknowledgements (member index + 1).
    key: u32,
}

/// Stands for the rollout actor of one process.
pub struct RemoteRollout;

impl Actor for RemoteRollout {
    type Msg = RolloutMsg;
    type State = RemoteRolloutArgs;
    type Arguments = RemoteRolloutArgs;

    async fn pre_start(&self, _myself: ActorRef<Self::Msg>, args: RemoteRolloutArgs) -> Result<Self::State, ActorProcessingErr> {
        Ok(args)
    }

    async fn handle(&self, myself: ActorRef<Self::Msg>, msg: Self::Msg, s: &mut RemoteRolloutArgs) -> Result<(), ActorProcessingErr> {
        let core = &s.core;
        let id = core.id();
        let key = if matches!(msg, RolloutMsg::LoadWeights(..)) { s.key } else { 0 };
        let rx = core.expect(&s.process, (id, key));
        match msg {
            RolloutMsg::Generate(req, reply) => {
                let out = match core.tx.send(&s.process, &ControlMsg::Generate { id, reward: s.reward.clone(), request: Json::of(&req) }) {
                    Err(e) => Err(e.to_string()),
                    Ok(()) => match rx.await {
                        Ok(Reply::Data(DataMsg::Scored { result, .. } | DataMsg::Groups { result, .. })) => result.and_then(|j| j.get::<RolloutResult>("RolloutResult")),
                        Ok(Reply::Lost(p)) => Err(format!("{p} is lost")),
                        other => Err(format!("{}: unexpected answer {other:?}", s.process)),
                    },
                };
                let lost = out.as_ref().is_err_and(|e| e.ends_with("is lost"));
                let _ = reply.send(out.map_err(|e| format!("{}: {e}", s.process)));
                if lost {
                    myself.stop(Some("its process is lost".into()));
                }
            }
            RolloutMsg::LoadWeights(update, reply) => {
                let out: Result<WeightAck, String> = match core.out.send(&s.data, DataMsg::Weights { id, update }).await {
                    Err(e) => Err(e),
                    Ok(()) => match rx.await {
                        Ok(Reply::Control(ControlMsg::WeightsLoaded { result, .. })) => {
                            if let Ok(ack) = &result {
                                core.versions.lock().expect("versions lock").insert(s.process.clone(), ack.version);
                            }
                            result
                        }
                        Ok(Reply::Lost(p)) => Err(format!("{p} is lost")),
                        other => Err(format!("unexpected answer {other:?}")),
                    },
                };
                let _ = reply.send(out.map_err(|e| format!("{}: {e}", s.process)));
            }
        }
        Ok(())
    }
}

/// Arguments of a [`RemoteLearner`] proxy.
pub struct RemoteLearnerArgs {
    core: Arc<Core>,
    /// (rank, process, data endpoint), by rank.
    ranks: Vec<(u32, String, String)>,
}

/// Stands for the learner's data-parallel ranks: every call goes to every rank
/// (each trains on its shard), and rank 0's answer is the answer.
pub struct RemoteLearner;

impl RemoteLearner {
    async fn call(s: &RemoteLearnerArgs, call: LearnerCall) -> Result<Reply, String> {
        let id = s.core.id();
        let json = Json::of(&call);
        let mut waits = vec![];
        for (rank, process, data) in &s.ranks {
            let rx = s.core.expect(process, (id, *rank));
            s.core.out.send(data, DataMsg::Learner { id, call: json.clone() }).await?;
            waits.push((*rank, process, rx));
        }
        let mut first = None;
        for (rank, process, rx) in waits {
            let r = rx.await.map_err(|_| "the router stopped".to_string())?;
            match &r {
                Reply::Lost(p) => return Err(format!("learner rank {rank} ({p}) is lost")),
                Reply::Data(DataMsg::LearnerDone { result: Err(e), .. }) => return Err(format!("learner rank {rank} ({process}): {e}")),
                _ => {}
            }
            if rank == 0 {
                first = Some(r);
            }
        }
        first.ok_or_else(|| "no learner rank 0".to_string())
    }

    fn out(r: Result<Reply, String>) -> Result<LearnerOut, String> {
        match r? {
            Reply::Data(DataMsg::LearnerDone { result, .. }) => result.and_then(|j| j.get::<LearnerOut>("LearnerOut")),
            other => Err(format!("unexpected learner answer {other:?}")),
        }
    }
}

impl Actor for RemoteLearner {
    type Msg = LearnerMsg;
    type State = RemoteLearnerArgs;
    type Arguments = RemoteLearnerArgs;

    async fn pre_start(&self, _myself: ActorRef<Self::Msg>, args: RemoteLearnerArgs) -> Result<Self::State, ActorProcessingErr> {
        Ok(args)
    }

    async fn handle(&self, _myself: ActorRef<Self::Msg>, msg: Self::Msg, s: &mut RemoteLearnerArgs) -> Result<(), ActorProcessingErr> {
        let stats = |o: Result<LearnerOut, String>| match o? {
            LearnerOut::Stats(st) => Ok(st),
            other => Err(format!("expected step statistics, got {other:?}")),
        };
        match msg {
            LearnerMsg::Sft(b, reply) => {
                let _ = reply.send(stats(Self::out(Self::call(s, LearnerCall::Sft(b)).await)));
            }
            LearnerMsg::Train(b, reply) => {
                let _ = reply.send(stats(Self::out(Self::call(s, LearnerCall::Train(b)).await)));
            }
            LearnerMsg::Configure(c, reply) => {
                let _ = reply.send(Self::out(Self::call(s, LearnerCall::Configure(c)).await).map(|_| ()));
            }
            LearnerMsg::Checkpoint(root, meta, reply) => {
                let _ = reply.send(Self::out(Self::call(s, LearnerCall::Checkpoint(root, meta)).await).and_then(|o| match o {
                    LearnerOut::Path(p) => Ok(p),
                    other => Err(format!("expected a checkpoint path, got {other:?}")),
                }));
            }
            LearnerMsg::Resume(root, c, reply) => {
                let _ = reply.send(Self::out(Self::call(s, LearnerCall::Resume(root, c)).await).and_then(|o| match o {
                    LearnerOut::Meta(m) => Ok(m),
                    other => Err(format!("expected a checkpoint record, got {other:?}")),
                }));
            }
            LearnerMsg::Snapshot(version, reply) => match Self::call(s, LearnerCall::Snapshot(version)).await {
                Ok(Reply::Data(DataMsg::Snapshot { update, .. })) => {
                    let _ = reply.send(update);
                }
                // The reply port takes a weight image only: failing the call is the only way to say it failed.
                other => return Err(format!("learner snapshot v{version}: {other:?}").into()),
            },
        }
        Ok(())
    }
}

/// Where a version starts from.
enum Root {
    /// This process (the learner is here): it broadcasts the image it is given.
    Controller(Arc<WeightGroup>),
    /// Learner rank 0's process: it broadcasts its own weights.
    Learner { process: String, data: String },
}

/// Sends each version to every rollout process through the weight-sync group.
pub struct Publisher {
    core: Arc<Core>,
    /// (process, acknowledgement key), in group order.
    rollouts: Vec<(String, u32)>,
    root: Root,
}

impl Publisher {
    /// Does the controller hold the weights it sends (the learner is in its process)?
    pub fn needs_image(&self) -> bool {
        matches!(self.root, Root::Controller(_))
    }

    /// Starts version `version` towards every rollout process (`image`: the
    /// weights, when [`Publisher::needs_image`]); the future ends when every
    /// process has checked and loaded it, with the seconds the broadcast took.
    pub async fn publish(&self, version: u64, image: Option<WeightUpdate>) -> Result<impl std::future::Future<Output = Result<f64, String>> + Send + 'static, String> {
        let core = &self.core;
        let id = core.id();
        let mut acks = vec![];
        for (process, key) in &self.rollouts {
            acks.push((process.clone(), core.expect(process, (id, *key))));
            core.tx.send(process, &ControlMsg::Receive { id }).map_err(|e| format!("{process}: {e}"))?;
        }
        let sent: std::pin::Pin<Box<dyn std::future::Future<Output = Result<f64, String>> + Send>> = match &self.root {
            Root::Controller(g) => {
                let update = image.ok_or("the controller sends the weights but was given none")?;
                let pending = g.send(update);
                Box::pin(async move { pending.wait().await })
            }
            Root::Learner { process, data } => {
                let rx = core.expect(process, (id, 0));
                core.out.send(data, DataMsg::Learner { id, call: Json::of(&LearnerCall::Publish(version)) }).await?;
                let process = process.clone();
                Box::pin(async move {
                    match rx.await {
                        Ok(Reply::Data(DataMsg::LearnerDone { result, .. })) => match result.and_then(|j| j.get::<LearnerOut>("LearnerOut"))? {
                            LearnerOut::Published(secs) => Ok(secs),
                            other => Err(format!("{process}: expected a publication, got {other:?}")),
                        },
                        Ok(Reply::Lost(p)) => Err(format!("{p} is lost")),
                        other => Err(format!("{process}: unexpected answer {other:?}")),
                    }
                })
            }
        };
        let versions = core.clone();
        Ok(async move {
            let secs = sent.await.map_err(|e| format!("weight broadcast v{version}: {e}"))?;
            for (process, rx) in acks {
                match rx.await {
                    Ok(Reply::Control(ControlMsg::WeightsLoaded { result: Ok(ack), .. })) => {
                        versions.versions.lock().expect("versions lock").insert(process, ack.version);
                    }
                    Ok(Reply::Control(ControlMsg::WeightsLoaded { result: Err(e), .. })) => return Err(format!("{process}: v{version}: {e}")),
                    Ok(Reply::Lost(p)) => return Err(format!("{p} is lost")),
                    other => return Err(format!("{process}: unexpected answer {other:?}")),
                }
            }
            Ok(secs)
        })
    }
}
