//! The controller's side of a distributed run: it starts every process of
//! the plan, waits for each to join, tells each what to host, and stands for
//! the remote actors with proxy actors that take the same messages as local
//! ones (`RolloutMsg`, `LearnerMsg`).
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
//!   data inbox and hands every reply to the call waiting for it.
//! - **Keep.** A process that exits, or falls silent past the heartbeat
//!   deadline, fails its calls and leaves the driver's choice; rollout and
//!   reward processes are started again ([`super::keeper`]). The weight-sync
//!   group is formed again, one epoch higher, whenever its members change.
use super::serve::{bind_endpoint, endpoint, listen_address};
use super::wire::*;
use super::weights::{GroupSpec, WeightGroup};
use super::keeper::{KeepPolicy, Keeper};
use super::link::{has, ready, tail, Core, LearnerLoss, Member, Reply, Route, Say, HELLO_ID, SETUP_ID};
use super::proxies::{proxy, RemoteLearner, RemoteLearnerArgs};
use super::publisher::{Publisher, Root};
use super::{Outboxes, RefusalMirror};
use crate::weight_sync::parts::Assemblies;
use crate::controller::supervisor::RolloutSlots;
use crate::metrics::Metrics;
use crate::controller::plan::{Plan, Process as Planned, WeightTransport};
use crate::controller::status::ProcessEntry;
use crate::controller::topology::Role;
use crate::learner::actor::LearnerMsg;
use crate::learner::LearnerConfig;
use ractor::{Actor, ActorRef};
use rlmesh_mesh::control::{ControlConfig, ControlNode, Incoming, PeerEvent};
use rlmesh_mesh::cookie::Cookie;
use rlmesh_mesh::data_plane::{DataPlaneConfig, Inbox};
use rlmesh_mesh::frame::FrameCodec;
use rlmesh_mesh::launch::{Exit, Host, Launcher, Process, ProcessSpec, SshConfig};
use rlmesh_mesh::slurm::SrunConfig;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

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
    /// Kill processes of a role at random times (`--chaos`).
    pub chaos: Option<super::chaos::Chaos>,
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
    /// The Slurm node of each topology node (`srun -w`): a process's `host` is
    /// the node's address, which several nodes may share.
    pub nodes: BTreeMap<String, String>,
}

impl SlurmSteps {
    /// The step that runs process `p`: one task on its Slurm node, with its own GPUs.
    pub fn srun(&self, p: &Planned) -> SrunConfig {
        let gpus = p.actors.iter().filter(|a| matches!(a.device, crate::controller::topology::Device::Gpu(_))).count() as u32;
        let node = self.nodes.get(&p.node).unwrap_or(&p.host).clone();
        SrunConfig { program: "srun".into(), job_id: self.job_id.clone(), node, step_name: self.step_name.clone(), gpus, extra: vec![] }
    }
}

impl FleetSpec {
    /// How process `p` is started: a Slurm step on its node, or a child / ssh by its host.
    pub fn launcher(&self, p: &Planned) -> Launcher {
        match &self.slurm {
            Some(s) => Launcher::new(Host::Slurm { srun: s.srun(p) }),
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
    /// One slot per rollout process (empty while it is down).
    pub rollouts: RolloutSlots,
    /// The learner ranks, when they are not in the controller's process.
    pub learner: Option<ActorRef<LearnerMsg>>,
    /// Ranks behind `learner`.
    pub learner_ranks: usize,
}

/// The processes of a run other than the controller's own.
pub struct Fleet {
    core: Arc<Core>,
    me: Planned,
    plan: Plan,
    spec: FleetSpec,
    router: tokio::task::JoinHandle<()>,
    keeper: Mutex<Option<tokio::task::JoinHandle<()>>>,
    losses: Mutex<Option<mpsc::UnboundedReceiver<(String, String)>>>,
    /// Set when the RL phase starts (`--chaos` kills only then).
    rl: tokio::sync::watch::Sender<bool>,
}

fn roles_of(p: &Planned) -> Vec<String> {
    let mut r: Vec<String> = p.actors.iter().map(|a| a.role.to_string()).collect();
    r.dedup();
    r
}

fn log_name(process: &str) -> String {
    format!("{}.log", process.replace('/', "_"))
}


impl Fleet {
    /// Starts every process of `spec.plan` but the controller's own, and waits until each has joined.
    /// `learner_loss` is set when a learner rank's process is lost (before its calls fail).
    pub async fn launch(spec: &FleetSpec, run_dir: &Path, metrics: Arc<Metrics>, learner_loss: LearnerLoss, progress: &(dyn Fn(String) + Sync)) -> Result<Fleet, String> {
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
        let listen = listen_address(&me.host, plan.listen_all)?;
        let ccfg = ControlConfig { cap: CONTROL_CAP, host: me.host.clone(), listen, heartbeat: plan.faults.heartbeat(), deadline: plan.faults.deadline(), ..ControlConfig::default() };
        let mut control = ControlNode::<ControlMsg>::start(&me.name, me.ports.control, &cookie, ccfg)
            .await
            .map_err(|e| format!("{e} (the topology's ports.control)"))?;
        let codec = FrameCodec::new(cookie.as_bytes(), DATA_CAP);
        let my_data = endpoint(&me.host, me.ports.data);
        let inbox = Inbox::<DataMsg>::bind(&bind_endpoint(&my_data, listen, me.ports.data), codec.clone(), &DataPlaneConfig::default()).map_err(|e| format!("{e} (the topology's ports.data)"))?;
        let logs = run_dir.join("logs");
        std::fs::create_dir_all(&logs).map_err(|e| format!("{}: {e}", logs.display()))?;
        let mut per_host: BTreeMap<&str, usize> = BTreeMap::new();
        for p in &plan.processes {
            *per_host.entry(p.host.as_str()).or_default() += 1;
        }
        let mut started: Vec<(Planned, Option<Process>, PathBuf)> = vec![];
        let mut specs: HashMap<String, ProcessSpec> = HashMap::new();
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
            specs.insert(p.name.clone(), s);
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
                Ok(Some((from, ControlMsg::Hello(h)))) if started.iter().any(|(p, _, _)| p.name == from) => {
                    hellos.insert(from, h);
                }
                Ok(Some((from, other))) => {
                    let what = other.name();
                    control.stats().reject(if matches!(other, ControlMsg::Hello(_)) { "unknown_peer" } else { "unexpected" }, || {
                        format!("[fleet] refused {what} from {from} while the processes join: only the plan's processes say Hello, and nothing else comes first")
                    });
                }
                Ok(None) => return Err("the control plane closed".into()),
                Err(_) => {}
            }
        }
        progress(format!("{} processes joined in {:.1} s", started.len(), t0.elapsed().as_secs_f64()));
        // Series known from the plan start at zero (dashboards and alerts see them before any fault).
        for (p, _, _) in &started {
            metrics.peers_lost_total.with_label_values(&[&p.name]);
            if has(p, Role::Rollout) || has(p, Role::Reward) {
                metrics.actor_restarts_total.with_label_values(&[&p.name]);
            }
        }
        let members: Vec<Member> = started
            .into_iter()
            .map(|(planned, process, log)| Member { hello: hellos.remove(&planned.name).expect("the loop above ends when every planned process has said Hello"), spec: specs.remove(&planned.name), setup: None, restarts: 0, planned, process, log })
            .collect();
        let (lost, losses) = mpsc::unbounded_channel();
        let core = Arc::new(Core {
            tx: control.sender(),
            out: Outboxes { codec, open: Arc::default() },
            my_data,
            next: AtomicU64::new(1),
            names: members.iter().map(|m| m.planned.name.clone()).collect(),
            cookie: cookie.to_hex(),
            listen,
            call_timeout: plan.faults.call_timeout(),
            members: Mutex::new(members),
            versions: Mutex::new(HashMap::new()),
            settling: Mutex::new(HashMap::new()),
            pending: Mutex::new(HashMap::new()),
            rollouts: Arc::default(),
            routes: std::sync::OnceLock::new(),
            down: Mutex::default(),
            gone: Mutex::default(),
            missed: Mutex::default(),
            lost,
            learner_loss,
        });
        let router = tokio::spawn(route(control, inbox, core.clone(), metrics));
        Ok(Fleet { core, me, plan, spec: spec.clone(), router, keeper: Mutex::new(None), losses: Mutex::new(Some(losses)), rl: tokio::sync::watch::channel(false).0 })
    }

    /// The RL phase starts now.
    pub fn rl_started(&self) {
        self.rl.send_replace(true);
    }

    /// Restarts of each process started again at least once.
    pub fn restarts(&self) -> BTreeMap<String, u32> {
        self.core.members.lock().expect("members lock").iter().filter(|m| m.restarts > 0).map(|m| (m.planned.name.clone(), m.restarts)).collect()
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
        self.core
            .members
            .lock()
            .expect("members lock")
            .iter()
            .map(|m| ProcessEntry {
                name: m.planned.name.clone(),
                pid: m.hello.pid,
                host: m.planned.host.clone(),
                roles: roles_of(&m.planned),
                start_time: m.hello.start_time,
                version: if has(&m.planned, Role::Learner) { Some(learner_version) } else { versions.get(&m.planned.name).copied() },
                heartbeat_age_s: self.core.tx.last_heard(&m.planned.name).map(|d| d.as_secs_f64()),
                restarts: m.restarts,
                slurm_step: m.process.as_ref().and_then(|p| p.slurm_step()).map(String::from),
            })
            .collect()
    }

    /// Tells every process what to host and waits until all are ready; returns
    /// the proxies. From then on the keeper watches the processes (`say`: its
    /// lines, for the run's progress log).
    pub async fn host(&self, roles: &RoleSetup, say: Say, metrics: Arc<Metrics>) -> Result<Hosted, String> {
        let core = &self.core;
        let (learner_ranks, rollout_members, root, waits, group_addr, world, nccl) = {
            let mut members = core.members.lock().expect("members lock");
            let cpus = split_cores(&members);
            let learner_ranks = members.iter().filter(|m| has(&m.planned, Role::Learner)).count();
            // The weight-sync group: its root (learner rank 0's process, or this one) and the rollout processes.
            let rollout_members: Vec<usize> = (0..members.len()).filter(|&i| has(&members[i].planned, Role::Rollout)).collect();
            let root = members.iter().position(|m| m.planned.actors.iter().any(|a| a.role == Role::Learner && a.rank == 0));
            let master_port: u16 = self.plan.master.rsplit(':').next().and_then(|p| p.parse().ok()).unwrap_or(29400);
            let group_addr = format!("{}:{}", root.map_or(&self.me.host, |r| &members[r].planned.host), master_port.wrapping_add(1));
            let world = rollout_members.len() as u32 + 1;
            // The image goes GPU to GPU over NCCL when the plan says so (a GPU learner rank 0 and GPU rollout processes).
            let nccl = self.plan.weight_transport == WeightTransport::Nccl;
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
            for (i, m) in members.iter_mut().enumerate() {
                let p = &m.planned;
                let (threads, cpus) = cpus[i].clone();
                let learner = p.actors.iter().find(|a| a.role == Role::Learner).map(|a| LearnerSetup {
                    config: roles.learner.clone(),
                    rank: a.rank,
                    world: self.plan.world_size,
                    master: self.plan.master.clone(),
                    cuda: p.cuda_ordinal(Role::Learner),
                });
                let setup = NodeSetup {
                    model_dir: roles.model_dir.clone(),
                    threads,
                    cpus,
                    controller_data: core.my_data.clone(),
                    rollout: has(p, Role::Rollout).then(|| RolloutSetup { cuda: p.cuda_ordinal(Role::Rollout), ..roles.rollout.clone() }),
                    reward: has(p, Role::Reward).then(|| roles.reward.clone()),
                    learner,
                    weights: group_rank(i).map(|rank| GroupSpec { rank, world, addr: group_addr.clone(), epoch: 0, nccl }),
                };
                let rx = core.expect(&[&p.name], (SETUP_ID, i as u32));
                core.tx.send(&p.name, &ControlMsg::Setup(Json::of(&setup))).map_err(|e| format!("{}: {e}", p.name))?;
                m.setup = Some(setup);
                waits.push((i, p.name.clone(), m.log.clone(), rx));
            }
            (learner_ranks, rollout_members, root, waits, group_addr, world, nccl)
        };
        // The controller is the group's root when the learner is in its process.
        let own = (root.is_none() && !rollout_members.is_empty()).then(|| WeightGroup::join(&GroupSpec { rank: 0, world, addr: group_addr.clone(), epoch: 0, nccl: false }, &core.cookie, core.listen, None));
        for (_, name, log, rx) in waits {
            ready(rx, &name, &log).await?;
        }
        let (routes, ranks, root_data) = {
            let members = core.members.lock().expect("members lock");
            // Scored groups come from a reward process (round robin), else the controller scores them.
            let rewards: Vec<(String, String)> = members.iter().filter(|m| has(&m.planned, Role::Reward)).map(|m| (m.planned.name.clone(), m.hello.data.clone())).collect();
            let routes: Vec<Route> = rollout_members
                .iter()
                .enumerate()
                .map(|(k, &i)| Route {
                    process: members[i].planned.name.clone(),
                    data: members[i].hello.data.clone(),
                    reward: (!rewards.is_empty()).then(|| rewards[k % rewards.len()].clone()),
                    key: i as u32 + 1,
                })
                .collect();
            let mut ranks: Vec<(u32, String, String)> = members
                .iter()
                .filter_map(|m| m.planned.actors.iter().find(|a| a.role == Role::Learner).map(|a| (a.rank, m.planned.name.clone(), m.hello.data.clone())))
                .collect();
            ranks.sort();
            (routes, ranks, root.map(|r| (members[r].planned.name.clone(), members[r].hello.data.clone())))
        };
        let _ = core.routes.set(routes.clone());
        let mut proxies = vec![];
        for route in routes {
            proxies.push(Some(proxy(core, route).await?));
        }
        *core.rollouts.lock().expect("slots lock") = proxies;
        let learner = if learner_ranks > 0 {
            let (r, _) = Actor::spawn(None, RemoteLearner, RemoteLearnerArgs { core: core.clone(), ranks }).await.map_err(|e| format!("learner proxy: {e}"))?;
            Some(r)
        } else {
            None
        };
        let publisher = (!rollout_members.is_empty()).then(|| {
            let root = match (own, root_data) {
                (Some(g), _) => Root::Controller(Mutex::new(Arc::new(g))),
                (None, Some((process, data))) => Root::Learner { process, data },
                (None, None) => unreachable!("a group has a root"),
            };
            Publisher::new(core.clone(), root, group_addr, nccl, rollout_members.len())
        });
        let launchers: HashMap<String, Launcher> = if self.spec.external {
            HashMap::new()
        } else {
            self.plan.processes.iter().filter(|p| p.name != self.me.name).map(|p| (p.name.clone(), self.spec.launcher(p))).collect()
        };
        let losses = self.losses.lock().expect("losses lock").take().ok_or("the fleet is hosted once")?;
        let keeper = Keeper::new(core.clone(), publisher.clone(), launchers, KeepPolicy::new(self.spec.join_timeout), metrics, say);
        *self.keeper.lock().expect("keeper lock") = Some(tokio::spawn(keeper.run(losses, self.spec.chaos.clone(), self.rl.subscribe())));
        Ok(Hosted { publisher, rollouts: core.rollouts.clone(), learner, learner_ranks })
    }

    /// Asks every process to leave, waits up to `grace` for each, then kills
    /// what is left. (A fleet dropped without it, on an error, stops its processes too.)
    pub async fn shutdown(self, grace: Duration) {
        // No restart from now on.
        // Taken first: an `if let` scrutinee's guard would stay locked across the await.
        let keeper = self.keeper.lock().expect("keeper lock").take();
        if let Some(k) = keeper {
            k.abort();
            let _ = k.await;
        }
        let members: Vec<Member> = std::mem::take(&mut *self.core.members.lock().expect("members lock"));
        let down = self.core.down.lock().expect("down lock").clone();
        for m in &members {
            let _ = self.core.tx.send(&m.planned.name, &ControlMsg::Stop);
        }
        let _ = tokio::task::spawn_blocking(move || {
            for m in members {
                // An externally started process leaves on Stop; its starter owns it.
                let Some(mut process) = m.process else { continue };
                // A lost one heard no Stop, and may be on a host that is gone.
                if down.contains(&m.planned.name) {
                    process.abandon();
                    continue;
                }
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

impl Drop for Fleet {
    /// A run that ends on an error stops every process it started (TERM, 3 s, KILL), so none outlives it.
    fn drop(&mut self) {
        if let Some(k) = self.keeper.lock().expect("keeper lock").take() {
            k.abort();
        }
        self.router.abort();
        // A learner rank that exited may have failed the run (its peers' collective
        // broke as its sockets closed) before the keeper's poll saw it, or before it
        // finished exiting: it is a lost rank all the same, so the run starts again
        // from its checkpoint rather than ending. Its exit is awaited for up to
        // 5 s (a rank leaving a broken group replies, waits 200 ms and exits:
        // on a loaded 2-core machine that took over the 1 s waited before).
        let t0 = Instant::now();
        loop {
            let exited: Vec<(String, String)> = self
                .core
                .members
                .lock()
                .expect("members lock")
                .iter_mut()
                .filter(|m| has(&m.planned, Role::Learner))
                .filter_map(|m| match m.process.as_mut().map(Process::try_wait) {
                    Some(Ok(Some(exit))) if !matches!(exit, Exit::Code(0) | Exit::Signal(libc::SIGTERM | libc::SIGINT)) => Some((m.planned.name.clone(), format!("exited: {exit:?}"))),
                    _ => None,
                })
                .collect();
            let lost = self.core.learner_loss.lock().expect("loss lock").is_some();
            for (name, why) in &exited {
                self.core.lose(name, why, true);
            }
            let learners = self.core.members.lock().expect("members lock").iter().any(|m| has(&m.planned, Role::Learner) && m.process.is_some());
            if lost || !exited.is_empty() || !learners || t0.elapsed() > Duration::from_secs(5) {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let members: Vec<Member> = std::mem::take(&mut *self.core.members.lock().expect("members lock"));
        let down = self.core.down.lock().expect("down lock").clone();
        for m in &members {
            let _ = self.core.tx.send(&m.planned.name, &ControlMsg::Stop);
        }
        for m in members {
            let Some(mut p) = m.process else { continue };
            // A lost one may be on a host that is gone: only this machine's side is ended.
            if down.contains(&m.planned.name) {
                p.abandon();
            } else {
                let _ = p.stop(Duration::from_secs(3));
            }
        }
    }
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
    // Snapshots from learner rank 0 arrive in parts.
    let mut snapshots = Assemblies::default();
    loop {
        tokio::select! {
            _ = tick.tick() => {
                mirror.copy(&metrics, "control", control.stats());
                mirror.copy(&metrics, "data", &data_stats);
            }
            m = control.next() => match m {
                None => break,
                Some(Incoming::Message(from, msg)) => {
                    let Some(i) = core.index(&from) else {
                        control.stats().reject("unknown_peer", || format!("[fleet] refused {} from {from}, which is not in the plan", msg.name()));
                        continue;
                    };
                    match msg {
                        ControlMsg::WeightsLoaded { id, .. } => core.resolve((id, i as u32 + 1), Reply::Control(msg)),
                        ControlMsg::Ready(_) => core.resolve((SETUP_ID, i as u32), Reply::Control(msg)),
                        // A process started again says Hello to the keeper waiting for it.
                        ControlMsg::Hello(_) => core.resolve((HELLO_ID, i as u32), Reply::Control(msg)),
                        other => control.stats().reject("unexpected", || format!("[fleet] refused {} from {from}: the controller takes no such message", other.name())),
                    }
                }
                Some(Incoming::Peer(PeerEvent::Lost(p))) => {
                    core.lose(&p, "silent past the heartbeat deadline", false);
                    let _ = core.lost.send((p, "silent past the heartbeat deadline".into()));
                }
                Some(Incoming::Peer(PeerEvent::Back(p))) => eprintln!("[fleet] {p} is back"),
                Some(Incoming::Peer(PeerEvent::Joined(_))) => {}
            },
            d = inbox.recv() => {
                let Some(msg) = d else { break };
                match msg {
                    DataMsg::Groups { id, .. } | DataMsg::Scored { id, .. } => core.resolve((id, 0), Reply::Data(msg)),
                    DataMsg::Snapshot { id, part } => match snapshots.receive(id, part) {
                        Ok(None) => {}
                        Ok(Some(update)) => core.resolve((id, 0), Reply::Weights(update)),
                        Err(e) => core.resolve((id, 0), Reply::Data(DataMsg::LearnerDone { id, rank: 0, result: Err(e) })),
                    },
                    DataMsg::LearnerDone { id, rank, .. } => core.resolve((id, rank), Reply::Data(msg)),
                    other => data_stats.reject("unexpected", || format!("[fleet] refused {} on the controller's data port: the controller takes no such message", other.name())),
                }
            }
        }
    }
}
