//! The placement of a topology: every process, its host, actors, ports and environment.
//!
//! [`plan`] is a pure function of a validated [`Topology`], linear in its actors; `launcher plan`
//! prints its [`Plan::table`] or its JSON, and `launcher up` starts one
//! `launcher node` per [`Process`] with its [`Process::env`].
//!
//! Environment of every process:
//! - `RLMESH_PROCESS`, `RLMESH_NODE` — its name (`node/process`) and node;
//! - `RLMESH_HOST` — the address of its host (it binds its data port there);
//! - `RLMESH_CONTROLLER`, `RLMESH_CONTROLLER_ADDR` — the controller process's
//!   name and the `host:port` of its control port;
//! - `RLMESH_CONTROL_PORT`, `RLMESH_DATA_PORT`, `RLMESH_METRICS_PORT` — its own ports;
//! - `CUDA_VISIBLE_DEVICES` — its GPUs in ascending order (empty: none), so
//!   an actor's in-process CUDA ordinal is its GPU's position in that list;
//! - `RLMESH_LISTEN_ALL=1` — only with `[network] listen_all`: listen on every
//!   interface (otherwise every listener binds `RLMESH_HOST`);
//! - `RLMESH_HEARTBEAT_S`, `RLMESH_DEADLINE_S` — only where `[faults]` changes them;
//! - `NCCL_HOSTID` — its name, only for a process with GPUs on a node with
//!   `share_gpus` (NCCL refuses two ranks of one communicator on one GPU of
//!   one host, so processes sharing a GPU pose as different hosts);
//!
//! and of a learner's process: `RLMESH_RANK`, `RLMESH_WORLD_SIZE`,
//! `RLMESH_MASTER_ADDR`, `RLMESH_MASTER_PORT` (learner rank 0's host and
//! the `ports.master` port), `RLMESH_DIST_BACKEND` (`nccl` or `cpu`).
use super::topology::{process_keys, process_name, Device, Role, Topology};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fmt::{self, Write};

/// Where everything of a run goes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    /// The topology's name.
    pub topology: String,
    /// The learners' collective backend.
    pub learner_backend: Backend,
    /// How new weights reach the rollout actors.
    pub weight_transport: WeightTransport,
    /// Learner data-parallel world size.
    pub world_size: u32,
    /// `host:port` of the learners' rendezvous.
    pub master: String,
    /// `host:port` of the controller's control port.
    pub controller: String,
    /// Listeners bind every interface (`[network] listen_all`), not each process's host.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub listen_all: bool,
    /// Heartbeats, deadline and call timeout (`[faults]`).
    #[serde(default)]
    pub faults: super::topology::Faults,
    /// Every process, in start order.
    pub processes: Vec<Process>,
}

/// The learners' collective backend, chosen by their devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    /// GPU learners: NCCL all-reduce.
    Nccl,
    /// CPU learners: the CPU collective.
    Cpu,
}

/// How new weights reach the rollout actors.
///
/// Both broadcast each version from learner rank 0 (or the controller, when
/// the learner is in its process) to the weight-sync group of rollout
/// processes, digest-checked per bucket by every receiver.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightTransport {
    /// The version's bytes on the host, along `comm`'s TCP ring (shared memory
    /// when every member is on one host; a message within one process).
    DataPlane,
    /// Learner rank 0 and every rollout actor are on GPUs, each in its own
    /// process: the image goes GPU to GPU by NCCL broadcast, the per-bucket
    /// digests computed on the GPUs.
    Nccl,
}

impl fmt::Display for Backend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Backend::Nccl => "nccl",
            Backend::Cpu => "cpu",
        })
    }
}

impl fmt::Display for WeightTransport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WeightTransport::DataPlane => "data_plane",
            WeightTransport::Nccl => "nccl",
        })
    }
}

/// One OS process of the run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Process {
    /// `node/process`, e.g. `n2/learner-3` or `local/main`.
    pub name: String,
    /// Its node's name.
    pub node: String,
    /// Its node's address.
    pub host: String,
    /// Its ports.
    pub ports: ProcessPorts,
    /// The roles of its actors, in plan order.
    pub roles: Vec<Role>,
    /// The actors it hosts.
    pub actors: Vec<Actor>,
    /// Environment variables it is started with.
    pub env: BTreeMap<String, String>,
    /// The command it runs (`launcher node`; the controller's process runs
    /// `launcher up`). How it is started (a child, ssh, a Slurm step) wraps it:
    /// see `launcher up --dry-run`.
    pub command: Vec<String>,
}

/// A process's own ports.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProcessPorts {
    /// Actor control messages.
    pub control: u16,
    /// The data plane.
    pub data: u16,
    /// Prometheus `/metrics`.
    pub metrics: u16,
}

/// One actor inside a process.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actor {
    /// Its role.
    pub role: Role,
    /// Index within the role (the data-parallel rank for learners).
    pub rank: u32,
    /// Its device.
    pub device: Device,
}

/// Places every actor of a validated topology into processes with ports and environment.
pub fn plan(topology: &Topology) -> Plan {
    let slots = topology.actors();
    let index = topology.node_index();
    let host_of = |node: &str| index.get(node).map_or_else(|| node.to_string(), |n| n.host.clone());
    let mut next_on_host: BTreeMap<String, u16> = BTreeMap::new();
    let mut processes: Vec<Process> = process_keys(&slots)
        .into_iter()
        .map(|(node, name)| {
            let host = host_of(node);
            let i = next_on_host.entry(host.clone()).or_default();
            let ports = ProcessPorts { control: topology.ports.control + *i, data: topology.ports.data + *i, metrics: topology.ports.metrics + *i };
            *i += 1;
            Process { name: format!("{node}/{name}"), node: node.to_string(), host, ports, roles: Vec::new(), actors: Vec::new(), env: BTreeMap::new(), command: Vec::new() }
        })
        .collect();
    let by_name: HashMap<String, usize> = processes.iter().enumerate().map(|(i, p)| (p.name.clone(), i)).collect();
    for s in &slots {
        let i = by_name[&format!("{}/{}", s.node, process_name(s))];
        processes[i].actors.push(Actor { role: s.role, rank: s.rank, device: s.device });
    }

    let learners: Vec<_> = slots.iter().filter(|s| s.role == Role::Learner).collect();
    let on_gpu = |role: Role| slots.iter().filter(|s| s.role == role).all(|s| s.device != Device::Cpu);
    let learner_backend = if on_gpu(Role::Learner) { Backend::Nccl } else { Backend::Cpu };
    // NCCL for weights needs a GPU at both ends and learner rank 0 outside the
    // controller's process (GPU actors never run there).
    let controller_slot = slots.iter().find(|s| s.role == Role::Controller).map(|s| (s.node.clone(), process_name(s)));
    let rank0_on_gpu = learners.iter().any(|l| l.rank == 0 && l.device != Device::Cpu && Some((l.node.clone(), process_name(l))) != controller_slot);
    let any_rollout = slots.iter().any(|s| s.role == Role::Rollout);
    let weight_transport = if any_rollout && on_gpu(Role::Rollout) && rank0_on_gpu { WeightTransport::Nccl } else { WeightTransport::DataPlane };
    let master_host = learners.first().map_or_else(String::new, |l| host_of(&l.node));
    let master = format!("{master_host}:{}", topology.ports.master);
    let (controller_name, controller) = processes
        .iter()
        .find(|p| p.actors.iter().any(|a| a.role == Role::Controller))
        .map(|p| (p.name.clone(), format!("{}:{}", p.host, p.ports.control)))
        .expect("the controller has a process");
    let world_size = learners.len() as u32;

    for p in &mut processes {
        let visible: Vec<String> = p.gpus().iter().map(u32::to_string).collect();
        let env = BTreeMap::from([
            ("RLMESH_PROCESS".to_string(), p.name.clone()),
            ("RLMESH_NODE".to_string(), p.node.clone()),
            ("RLMESH_HOST".to_string(), p.host.clone()),
            ("RLMESH_CONTROLLER".to_string(), controller_name.clone()),
            ("RLMESH_CONTROLLER_ADDR".to_string(), controller.clone()),
            ("RLMESH_CONTROL_PORT".to_string(), p.ports.control.to_string()),
            ("RLMESH_DATA_PORT".to_string(), p.ports.data.to_string()),
            ("RLMESH_METRICS_PORT".to_string(), p.ports.metrics.to_string()),
            ("CUDA_VISIBLE_DEVICES".to_string(), visible.join(",")),
        ]);
        let mut roles: Vec<Role> = Vec::new();
        for a in &p.actors {
            if !roles.contains(&a.role) {
                roles.push(a.role);
            }
        }
        let mut env = topology.extra_env(&roles).into_iter().chain(env).collect::<BTreeMap<_, _>>();
        if topology.network.listen_all {
            env.insert("RLMESH_LISTEN_ALL".to_string(), "1".to_string());
        }
        env.extend(topology.faults.env());
        // NCCL refuses two ranks of one communicator on one GPU; where processes
        // share GPUs, each gets its own NCCL host id, so NCCL treats them as
        // different hosts (and moves bytes over its network transport).
        if !p.gpus().is_empty() && index.get(p.node.as_str()).is_some_and(|n| n.share_gpus) {
            env.insert("NCCL_HOSTID".to_string(), p.name.clone());
        }
        p.command = if roles.contains(&Role::Controller) { vec!["launcher".into(), "up".into()] } else { vec!["launcher".into(), "node".into()] };
        p.roles = roles;
        if let Some(l) = p.actors.iter().find(|a| a.role == Role::Learner) {
            env.insert("RLMESH_RANK".to_string(), l.rank.to_string());
            env.insert("RLMESH_WORLD_SIZE".to_string(), world_size.to_string());
            env.insert("RLMESH_MASTER_ADDR".to_string(), master_host.clone());
            env.insert("RLMESH_MASTER_PORT".to_string(), topology.ports.master.to_string());
            env.insert("RLMESH_DIST_BACKEND".to_string(), learner_backend.to_string());
        }
        p.env = env;
    }

    Plan { topology: topology.name.clone(), learner_backend, weight_transport, world_size, master, controller, listen_all: topology.network.listen_all, faults: topology.faults.clone(), processes }
}

impl Process {
    /// The node's GPUs this process uses, sorted: its `CUDA_VISIBLE_DEVICES`.
    pub fn gpus(&self) -> Vec<u32> {
        let mut gpus: Vec<u32> = self.actors.iter().filter_map(|a| if let Device::Gpu(g) = a.device { Some(g) } else { None }).collect();
        gpus.sort_unstable();
        gpus.dedup();
        gpus
    }

    /// The CUDA ordinal, inside this process, of its first actor of `role`:
    /// that GPU's place in [`Process::gpus`] (what `CUDA_VISIBLE_DEVICES`
    /// renumbers it to). `None`: the actor computes on the CPU, or there is none.
    pub fn cuda_ordinal(&self, role: Role) -> Option<usize> {
        let Device::Gpu(g) = self.actors.iter().find(|a| a.role == role)?.device else { return None };
        self.gpus().iter().position(|&x| x == g)
    }
}

impl Plan {
    /// The processes hosting an actor of `role`.
    pub fn processes_with(&self, role: Role) -> impl Iterator<Item = &Process> {
        self.processes.iter().filter(move |p| p.actors.iter().any(|a| a.role == role))
    }

    /// A human table: a summary line, then one row per actor with its process, host, device and ports.
    pub fn table(&self) -> String {
        let nodes = {
            let mut n: Vec<&str> = self.processes.iter().map(|p| p.node.as_str()).collect();
            n.sort_unstable();
            n.dedup();
            n.len()
        };
        let mut out = format!(
            "topology {}: {} node(s), {} process(es), learner world size {} ({} backend, master {}), weights by {}, controller at {}\n",
            self.topology,
            nodes,
            self.processes.len(),
            self.world_size,
            self.learner_backend,
            self.master,
            self.weight_transport,
            self.controller
        );
        let header = ["PROCESS", "HOST", "ROLE", "RANK", "DEVICE", "CONTROL", "DATA", "METRICS"].map(String::from);
        let mut rows = vec![header];
        for p in &self.processes {
            for a in &p.actors {
                rows.push([
                    p.name.clone(),
                    p.host.clone(),
                    a.role.to_string(),
                    a.rank.to_string(),
                    a.device.to_string(),
                    p.ports.control.to_string(),
                    p.ports.data.to_string(),
                    p.ports.metrics.to_string(),
                ]);
            }
        }
        let widths: Vec<usize> = (0..8).map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0)).collect();
        for r in &rows {
            let cells: Vec<String> = r.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
            let _ = writeln!(out, "{}", cells.join("  ").trim_end());
        }
        out
    }
}
