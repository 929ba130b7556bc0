//! Topology files (`deploy/*.toml`): *where* a run's actors go.
//!
//! One format serves the embedded CPU default, a two-GPU workstation and a
//! 32-GPU cluster:
//!
//! ```toml
//! name = "dev-2gpu"
//!
//! [[nodes]]                 # machines: a name, an address, their GPUs
//! name = "dev"
//! host = "127.0.0.1"
//! gpus = 2
//! gpu_type = "any"          # optional, informative
//!
//! [ports]                   # bases; the i-th process on a host adds i
//! control = 29500           # actor control (ractor_cluster)
//! data = 29600              # data plane (ZeroMQ)
//! metrics = 9100            # Prometheus /metrics
//! master = 29400            # on learner rank 0's host: the learners' ring (+1: the weight-sync group)
//!
//! [controller]              # singletons: a node and an optional shared process
//! node = "dev"
//! process = "main"
//!
//! [weight_sync]
//! node = "dev"
//! process = "main"
//!
//! [rollout]                 # one actor per listed GPU, or `actors` CPU actors
//! placement = [{ node = "dev", gpus = [0] }]
//!
//! [reward]
//! placement = [{ node = "dev", actors = 2, process = "main" }]
//!
//! [learner]                 # data-parallel: one rank per listed GPU
//! ranks = 1
//! placement = [{ node = "dev", gpus = [1] }]
//! ```
//!
//! Each actor runs in a process of its own unless its entry names a
//! `process`: actors naming the same process on the same node share it (the
//! embedded default puts every actor in `main`). [`Topology::validate`]
//! checks nodes, devices, ranks and ports on plain data;
//! [`Topology::load`] adds the file and line to its errors.
//!
//! Sizes are bounded before anything of that size is built: at most
//! [`MAX_ACTORS_PER_PLACEMENT`] CPU actors per entry, [`MAX_ACTORS`] actors and
//! [`MAX_PROCESSES`] processes in all. Validation and planning are linear in
//! the number of actors (node and process lookups go through hash maps).
use super::source::{self, ConfigError, Invalid};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::Path;

/// Most CPU actors one placement entry may ask for (4096): each is at least a
/// thread with its own engine, and 4096 is past the cores of any one machine.
pub const MAX_ACTORS_PER_PLACEMENT: u32 = 4096;

/// Most actors of a topology (2^20): the list of actor slots is built whole.
pub const MAX_ACTORS: usize = 1 << 20;

/// Most processes of a topology (100000): 12500 nodes of 8 GPUs, past any
/// cluster rlmesh targets; `plan`, `up` and `status` handle every process.
pub const MAX_PROCESSES: usize = 100_000;

/// A parsed topology file.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Topology {
    /// The topology's name, shown by `launcher plan`.
    pub name: String,
    /// The machines.
    pub nodes: Vec<NodeSpec>,
    /// Port bases.
    pub ports: Ports,
    /// Where the controller runs.
    pub controller: Singleton,
    /// Where the weight-sync coordinator runs.
    pub weight_sync: Singleton,
    /// Where rollout actors run.
    pub rollout: Placements,
    /// Where reward actors run.
    pub reward: Placements,
    /// Where learner ranks run.
    pub learner: Learner,
    /// How `launcher up` reaches nodes that are not this machine (the system
    /// `ssh`: user, port, identity file, config file, options); default: plain `ssh HOST`.
    #[serde(default)]
    pub ssh: rlmesh_mesh::launch::SshConfig,
    /// The network the collectives use (NCCL / Gloo interfaces, InfiniBand HCAs).
    #[serde(default)]
    pub network: Network,
    /// Extra environment variables: `all` for every process, then one table per
    /// role (`rollout`, `reward`, `learner`, `controller`, `weight_sync`), the
    /// role's winning over `all`.
    #[serde(default)]
    pub env: BTreeMap<String, BTreeMap<String, String>>,
    /// How soon a lost or stalled process is noticed.
    #[serde(default)]
    pub faults: Faults,
}

/// Failure detection: heartbeats with a deadline on the control plane, and a
/// bound on every call a process must answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Faults {
    /// Seconds between heartbeats to each peer.
    pub heartbeat_s: f64,
    /// A peer silent this many seconds is declared lost (its calls fail, it is started again).
    pub deadline_s: f64,
    /// A call (a rollout request, a version to load, a learner step or
    /// checkpoint) not answered within this many seconds marks its process as
    /// stalled: lost like a silent one, though its heartbeats still arrive.
    pub call_timeout_s: f64,
}

impl Default for Faults {
    fn default() -> Self {
        Faults { heartbeat_s: 0.5, deadline_s: 5.0, call_timeout_s: 900.0 }
    }
}

impl Faults {
    /// `[faults]` as the plan's environment: only what differs from the defaults.
    pub fn env(&self) -> Vec<(String, String)> {
        let d = Faults::default();
        let mut env = vec![];
        if self.heartbeat_s != d.heartbeat_s {
            env.push(("RLMESH_HEARTBEAT_S".to_string(), self.heartbeat_s.to_string()));
        }
        if self.deadline_s != d.deadline_s {
            env.push(("RLMESH_DEADLINE_S".to_string(), self.deadline_s.to_string()));
        }
        env
    }

    /// Reads what [`Faults::env`] wrote (a node process's side); missing values are the defaults.
    pub fn from_env() -> Result<Faults, String> {
        let mut f = Faults::default();
        for (key, slot) in [("RLMESH_HEARTBEAT_S", &mut f.heartbeat_s), ("RLMESH_DEADLINE_S", &mut f.deadline_s)] {
            if let Ok(v) = std::env::var(key) {
                *slot = v.parse().map_err(|_| format!("{key}={v:?}: not a number of seconds"))?;
            }
        }
        Ok(f)
    }

    fn validate(&self) -> Result<(), Invalid> {
        for (field, v, lo, hi) in [("faults.heartbeat_s", self.heartbeat_s, 0.01, 60.0), ("faults.deadline_s", self.deadline_s, 0.1, 3600.0), ("faults.call_timeout_s", self.call_timeout_s, 0.1, 7.0 * 86400.0)] {
            if !(lo..=hi).contains(&v) {
                return Err(Invalid::new(field, format!("{v} is outside {lo}..={hi} seconds")));
            }
        }
        if self.deadline_s < 3.0 * self.heartbeat_s {
            return Err(Invalid::new("faults.deadline_s", format!("{} s is under three heartbeats ({} s each): a peer would be declared lost between two of its heartbeats", self.deadline_s, self.heartbeat_s)));
        }
        Ok(())
    }

    /// The heartbeat interval.
    pub fn heartbeat(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.heartbeat_s)
    }

    /// The deadline.
    pub fn deadline(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.deadline_s)
    }

    /// The call timeout.
    pub fn call_timeout(&self) -> std::time::Duration {
        std::time::Duration::from_secs_f64(self.call_timeout_s)
    }
}

/// The network the collectives use; each field, when set, becomes the
/// environment variables named beside it in every process.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Network {
    /// The interface for NCCL's and Gloo's sockets (`NCCL_SOCKET_IFNAME`, `GLOO_SOCKET_IFNAME`), e.g. `ib0` or `^lo,docker`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub socket_ifname: Option<String>,
    /// InfiniBand HCAs NCCL may use (`NCCL_IB_HCA`), e.g. `mlx5_0,mlx5_1`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ib_hca: Option<String>,
    /// Listen on every interface rather than on each node's `host` address
    /// (its control, data, ring and `/metrics` ports); e.g. behind NAT, where
    /// `host` is an address that is not on the machine.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub listen_all: bool,
}

/// One machine.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeSpec {
    /// Name used by placements.
    pub name: String,
    /// Address other nodes reach it at.
    pub host: String,
    /// Number of GPUs (indices `0..gpus`); 0 for a CPU-only node.
    #[serde(default)]
    pub gpus: u32,
    /// GPU model, informative (e.g. `H100-80GB`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_type: Option<String>,
    /// Lets a rollout and a learner process use the same GPU (a one-GPU
    /// workstation). Learner ranks still need a GPU each: NCCL refuses two
    /// ranks of one communicator on one device.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub share_gpus: bool,
}

/// Port bases: the i-th process on a host (in plan order) uses `base + i`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ports {
    /// Control messages between actors.
    pub control: u16,
    /// The bulk data plane.
    pub data: u16,
    /// Prometheus `/metrics`.
    pub metrics: u16,
    /// The learners' rendezvous, on learner rank 0's host only.
    pub master: u16,
}

/// An actor of which the run has exactly one.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Singleton {
    /// The node it runs on.
    pub node: String,
    /// A process it shares with other actors of the same node (default: its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<String>,
}

/// Where the actors of one role run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Placements {
    /// Entries, in actor-index order.
    pub placement: Vec<Placement>,
}

/// The learner's data-parallel ranks and where they run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Learner {
    /// Data-parallel world size: must equal the number of learner devices placed.
    pub ranks: u32,
    /// Entries, in rank order.
    pub placement: Vec<Placement>,
}

/// Actors of one role on one node: one per listed GPU, or `actors` on the CPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Placement {
    /// The node.
    pub node: String,
    /// GPU indices on the node, one actor each; empty for CPU actors.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<u32>,
    /// Number of CPU actors (default 1); only without `gpus`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actors: Option<u32>,
    /// A process the actors share with others of the same node (default: one process per actor).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process: Option<String>,
}

/// The five actor roles of the architecture.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Owns the run.
    Controller,
    /// Generates groups.
    Rollout,
    /// Scores groups.
    Reward,
    /// Trains (one data-parallel rank each).
    Learner,
    /// Moves new policy versions to rollout actors.
    WeightSync,
}

impl Role {
    /// The role's name in files and tables (`weight_sync`, …).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Controller => "controller",
            Role::Rollout => "rollout",
            Role::Reward => "reward",
            Role::Learner => "learner",
            Role::WeightSync => "weight_sync",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The device an actor computes on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Device {
    /// The CPU.
    Cpu,
    /// A GPU, by its index on the node (before `CUDA_VISIBLE_DEVICES`).
    Gpu(u32),
}

impl fmt::Display for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Device::Cpu => f.write_str("cpu"),
            Device::Gpu(i) => write!(f, "gpu:{i}"),
        }
    }
}

/// One actor as the topology places it: role, index within the role, node, device, shared process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ActorSlot {
    /// Its role.
    pub role: Role,
    /// Index within the role (the data-parallel rank for learners).
    pub rank: u32,
    /// Its node's name.
    pub node: String,
    /// Its device.
    pub device: Device,
    /// The named process it shares, if any.
    pub process: Option<String>,
    /// Field path of the entry that placed it, for errors.
    pub field: String,
}

impl Topology {
    /// Reads, parses and validates a topology file; errors name the file, line and field.
    pub fn load(path: &Path) -> Result<Topology, ConfigError> {
        source::load(path, Topology::validate)
    }

    /// Parses and validates topology text (named `file` in errors).
    pub fn parse(file: &str, text: &str) -> Result<Topology, ConfigError> {
        source::parse(file, text, Topology::validate)
    }

    /// `[env]`: tables `all` and the roles only; names are shell names, and
    /// not the `RLMESH_*` variables the plan itself sets.
    fn check_env(&self) -> Result<(), Invalid> {
        let tables = ["all", "controller", "rollout", "reward", "learner", "weight_sync"];
        for (table, vars) in &self.env {
            if !tables.contains(&table.as_str()) {
                return Err(Invalid::new(format!("env.{table}"), format!("unknown table; expected one of {}", tables.join(", "))));
            }
            for (k, v) in vars {
                let shell = !k.is_empty() && !k.starts_with(|c: char| c.is_ascii_digit()) && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                if !shell {
                    return Err(Invalid::new(format!("env.{table}.{k}"), "not an environment variable name (letters, digits, _; not starting with a digit)"));
                }
                if k.starts_with("RLMESH_") || k == "CUDA_VISIBLE_DEVICES" {
                    return Err(Invalid::new(format!("env.{table}.{k}"), "set by the plan itself (`launcher plan --json` shows it); it cannot be overridden"));
                }
                if v.contains('\0') {
                    return Err(Invalid::new(format!("env.{table}.{k}"), "a value cannot contain NUL"));
                }
            }
        }
        Ok(())
    }

    /// The environment `[network]` and `[env]` give a process hosting `roles`.
    pub fn extra_env(&self, roles: &[Role]) -> BTreeMap<String, String> {
        let mut env = BTreeMap::new();
        if let Some(i) = &self.network.socket_ifname {
            env.insert("NCCL_SOCKET_IFNAME".to_string(), i.clone());
            env.insert("GLOO_SOCKET_IFNAME".to_string(), i.clone());
        }
        if let Some(h) = &self.network.ib_hca {
            env.insert("NCCL_IB_HCA".to_string(), h.clone());
        }
        if let Some(all) = self.env.get("all") {
            env.extend(all.iter().map(|(k, v)| (k.clone(), v.clone())));
        }
        for r in roles {
            if let Some(vars) = self.env.get(r.as_str()) {
                env.extend(vars.iter().map(|(k, v)| (k.clone(), v.clone())));
            }
        }
        env
    }

    /// This topology on the hosts of an allocation: the controller's node on
    /// `first` (where `launcher up` runs), every other node, in file order, on
    /// the next host of `hosts` not yet taken. Errors when there are fewer hosts
    /// than nodes.
    pub fn on_hosts(&self, hosts: &[String], first: &str) -> Result<Topology, String> {
        if !hosts.iter().any(|h| h == first) {
            return Err(format!("this node ({first}) is not one of the allocation's hosts ({})", hosts.join(",")));
        }
        if hosts.len() < self.nodes.len() {
            return Err(format!(
                "the topology {} has {} nodes but the allocation has {} ({}); allocate at least {} (sbatch/salloc -N {})",
                self.name,
                self.nodes.len(),
                hosts.len(),
                hosts.join(","),
                self.nodes.len(),
                self.nodes.len()
            ));
        }
        let mut free = hosts.iter().filter(|h| *h != first);
        let mut t = self.clone();
        for n in &mut t.nodes {
            n.host = if n.name == self.controller.node { first.to_string() } else { free.next().expect("counted above").clone() };
        }
        Ok(t)
    }

    /// This topology with every GPU actor on the CPU (`launcher up --device
    /// cpu`): each GPU entry becomes as many CPU actors in the same processes,
    /// and the nodes lose their GPUs, so a GPU topology runs, and is tested, anywhere.
    pub fn on_cpu(&self) -> Topology {
        let mut t = self.clone();
        for n in &mut t.nodes {
            n.gpus = 0;
            n.gpu_type = None;
        }
        for p in t.rollout.placement.iter_mut().chain(t.reward.placement.iter_mut()).chain(t.learner.placement.iter_mut()) {
            if !p.gpus.is_empty() {
                p.actors = Some(p.gpus.len() as u32);
                p.gpus.clear();
            }
        }
        t
    }

    /// The node called `name`.
    pub fn node(&self, name: &str) -> Option<&NodeSpec> {
        self.nodes.iter().find(|n| n.name == name)
    }

    /// Every node by name (the first of duplicates), for lookups in loops.
    pub(crate) fn node_index(&self) -> HashMap<&str, &NodeSpec> {
        let mut index = HashMap::with_capacity(self.nodes.len());
        for n in &self.nodes {
            index.entry(n.name.as_str()).or_insert(n);
        }
        index
    }

    /// Every actor, role by role (controller, rollout, reward, learner, weight_sync), in index order.
    pub fn actors(&self) -> Vec<ActorSlot> {
        let mut out = Vec::new();
        let singleton = |role: Role, s: &Singleton| ActorSlot {
            role,
            rank: 0,
            node: s.node.clone(),
            device: Device::Cpu,
            process: s.process.clone(),
            field: role.as_str().to_string(),
        };
        out.push(singleton(Role::Controller, &self.controller));
        for (role, entries) in [(Role::Rollout, &self.rollout.placement), (Role::Reward, &self.reward.placement), (Role::Learner, &self.learner.placement)] {
            let mut rank = 0;
            for (i, p) in entries.iter().enumerate() {
                let devices: Vec<Device> = if p.gpus.is_empty() {
                    vec![Device::Cpu; p.actors.unwrap_or(1) as usize]
                } else {
                    p.gpus.iter().map(|&g| Device::Gpu(g)).collect()
                };
                for device in devices {
                    out.push(ActorSlot {
                        role,
                        rank,
                        node: p.node.clone(),
                        device,
                        process: p.process.clone(),
                        field: format!("{role}.placement[{i}]"),
                    });
                    rank += 1;
                }
            }
        }
        out.push(singleton(Role::WeightSync, &self.weight_sync));
        out
    }

    /// Checks names, devices, ranks and ports; the error names the offending field.
    pub fn validate(&self) -> Result<(), Invalid> {
        if self.nodes.is_empty() {
            return Err(Invalid::new("nodes", "at least one node is needed"));
        }
        let mut first: HashMap<&str, usize> = HashMap::with_capacity(self.nodes.len());
        for (i, n) in self.nodes.iter().enumerate() {
            if let Some(j) = first.insert(&n.name, i) {
                return Err(Invalid::new(format!("nodes[{i}].name"), format!("duplicate node \"{}\" (also nodes[{j}])", n.name)));
            }
            if n.gpus == 0 && n.gpu_type.is_some() {
                return Err(Invalid::new(format!("nodes[{i}].gpu_type"), format!("node \"{}\" has no GPUs", n.name)));
            }
        }
        self.check_env()?;
        self.faults.validate()?;
        let index = self.node_index();
        for (role, s) in [(Role::Controller, &self.controller), (Role::WeightSync, &self.weight_sync)] {
            self.check_node(&index, &format!("{role}.node"), &s.node)?;
        }
        let mut total = 2;
        for (role, entries) in [(Role::Rollout, &self.rollout.placement), (Role::Reward, &self.reward.placement), (Role::Learner, &self.learner.placement)] {
            if entries.is_empty() {
                return Err(Invalid::new(format!("{role}.placement"), "at least one entry is needed"));
            }
            for (i, p) in entries.iter().enumerate() {
                self.check_placement(&index, &format!("{role}.placement[{i}]"), p)?;
                total += p.gpus.len().max(p.actors.unwrap_or(1) as usize);
                if total > MAX_ACTORS {
                    return Err(Invalid::new(format!("{role}.placement[{i}]"), format!("a topology has at most {MAX_ACTORS} actors, this entry passes that")));
                }
            }
        }
        let actors = self.actors();
        let processes = process_keys(&actors);
        if processes.len() > MAX_PROCESSES {
            // The entry whose actor opens the first process past the bound.
            let (node, name) = &processes[MAX_PROCESSES];
            let field = actors.iter().find(|a| a.node == *node && process_name(a) == *name).map_or("nodes", |a| a.field.as_str());
            return Err(Invalid::new(
                field,
                format!("a topology has at most {MAX_PROCESSES} processes (each is started, watched and stopped on its own), this one has {}; share processes with `process = \"…\"`", processes.len()),
            ));
        }
        check_gpus_used_once(&actors, &index)?;
        self.check_learners(&actors)?;
        self.check_ports(&index, &processes, &actors)
    }

    fn check_node<'a>(&self, index: &HashMap<&str, &'a NodeSpec>, field: &str, name: &str) -> Result<&'a NodeSpec, Invalid> {
        index.get(name).copied().ok_or_else(|| {
            let mut known: Vec<&str> = self.nodes.iter().take(20).map(|n| n.name.as_str()).collect();
            if self.nodes.len() > known.len() {
                known.push("…");
            }
            Invalid::new(field, format!("unknown node \"{name}\" (nodes: {})", known.join(", ")))
        })
    }

    fn check_placement(&self, index: &HashMap<&str, &NodeSpec>, field: &str, p: &Placement) -> Result<(), Invalid> {
        let node = self.check_node(index, &format!("{field}.node"), &p.node)?;
        if !p.gpus.is_empty() && p.actors.is_some() {
            return Err(Invalid::new(format!("{field}.actors"), "give either gpus (one actor per GPU) or actors (CPU actors), not both"));
        }
        if p.actors == Some(0) {
            return Err(Invalid::new(format!("{field}.actors"), "must be at least 1"));
        }
        if let Some(n) = p.actors.filter(|&n| n > MAX_ACTORS_PER_PLACEMENT) {
            return Err(Invalid::new(
                format!("{field}.actors"),
                format!("at most {MAX_ACTORS_PER_PLACEMENT} CPU actors per entry (each is a thread with its own engine), got {n}"),
            ));
        }
        if let Some(&g) = p.gpus.iter().find(|&&g| g >= node.gpus) {
            let has = match node.gpus {
                0 => "has no GPUs".to_string(),
                n => format!("has {n} (0..={})", n - 1),
            };
            return Err(Invalid::new(format!("{field}.gpus"), format!("GPU {g} is beyond node \"{}\", which {has}", node.name)));
        }
        if p.process.as_deref().is_some_and(|s| s.is_empty() || s.contains(['/', ' '])) {
            return Err(Invalid::new(format!("{field}.process"), "a process name is non-empty, without '/' or spaces"));
        }
        Ok(())
    }

    fn check_learners(&self, actors: &[ActorSlot]) -> Result<(), Invalid> {
        let learners: Vec<&ActorSlot> = actors.iter().filter(|a| a.role == Role::Learner).collect();
        if self.learner.ranks as usize != learners.len() {
            let mut per_node: BTreeMap<&str, usize> = BTreeMap::new();
            for a in &learners {
                *per_node.entry(&a.node).or_default() += 1;
            }
            let detail: Vec<String> = per_node.iter().map(|(n, c)| format!("node \"{n}\": {c}")).collect();
            return Err(Invalid::new(
                "learner.ranks",
                format!(
                    "{} ranks need {} learner devices, the placement gives {} ({})",
                    self.learner.ranks,
                    self.learner.ranks,
                    learners.len(),
                    detail.join(", ")
                ),
            ));
        }
        let on_gpu = learners[0].device != Device::Cpu;
        if let Some(a) = learners.iter().find(|a| (a.device != Device::Cpu) != on_gpu) {
            return Err(Invalid::new(a.field.clone(), "learner ranks are all on GPUs or all on CPUs (one collective backend)"));
        }
        let mut shared: HashMap<(&str, &str), u32> = HashMap::new();
        for a in &learners {
            if let Some(p) = &a.process {
                if let Some(other) = shared.insert((&a.node, p), a.rank) {
                    return Err(Invalid::new(
                        format!("{}.process", a.field),
                        format!("process \"{p}\" on node \"{}\" would hold learner ranks {other} and {}; one rank per process", a.node, a.rank),
                    ));
                }
            }
        }
        Ok(())
    }

    fn check_ports(&self, index: &HashMap<&str, &NodeSpec>, processes: &[(&str, String)], actors: &[ActorSlot]) -> Result<(), Invalid> {
        let mut per_host: BTreeMap<&str, u32> = BTreeMap::new();
        for key in processes {
            *per_host.entry(&index[key.0].host).or_default() += 1;
        }
        let master_host = actors.iter().find(|a| a.role == Role::Learner).map(|a| &index[a.node.as_str()].host);
        let p = self.ports;
        for (host, &n) in &per_host {
            let mut ranges: Vec<(&str, u32, u32)> =
                vec![("ports.control", p.control.into(), n), ("ports.data", p.data.into(), n), ("ports.metrics", p.metrics.into(), n)];
            if master_host.is_some_and(|m| m == host) {
                // master: the learners' ring; master + 1: the weight-sync group's.
                ranges.push(("ports.master", p.master.into(), 2));
            }
            for (i, &(field, base, len)) in ranges.iter().enumerate() {
                let last = base + len - 1;
                if base == 0 || last > u16::MAX as u32 {
                    return Err(Invalid::new(field, format!("{n} processes on host \"{host}\" need ports {base}..={last}, within 1..=65535")));
                }
                if let Some(&(other, ob, ol)) = ranges[..i].iter().find(|&&(_, ob, ol)| base < ob + ol && ob < base + len) {
                    return Err(Invalid::new(
                        field,
                        format!("ports {base}..={last} on host \"{host}\" overlap {other} ({ob}..={})", ob + ol - 1),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The process each actor runs in, as `(node, process name)`, in order of first appearance.
pub(crate) fn process_keys(actors: &[ActorSlot]) -> Vec<(&str, String)> {
    let mut keys: Vec<(&str, String)> = Vec::new();
    let mut seen: HashSet<(&str, String)> = HashSet::with_capacity(actors.len());
    for a in actors {
        let key = (a.node.as_str(), process_name(a));
        if seen.insert(key.clone()) {
            keys.push(key);
        }
    }
    keys
}

/// The name of an actor's process on its node: the shared name, or `role-rank`.
pub fn process_name(a: &ActorSlot) -> String {
    a.process.clone().unwrap_or_else(|| format!("{}-{}", a.role, a.rank))
}

/// A GPU holds one actor, except on a node with `share_gpus`, where roles may
/// share it but two actors of one role (two learner ranks, two rollout actors) may not.
fn check_gpus_used_once(actors: &[ActorSlot], index: &HashMap<&str, &NodeSpec>) -> Result<(), Invalid> {
    let mut used: HashMap<(&str, u32, Option<Role>), &str> = HashMap::new();
    for a in actors {
        if let Device::Gpu(g) = a.device {
            let shared = index.get(a.node.as_str()).is_some_and(|n| n.share_gpus);
            if let Some(by) = used.insert((&a.node, g, shared.then_some(a.role)), &a.field) {
                let hint = if shared { " (share_gpus lets different roles share a GPU, not two actors of one role)" } else { " (set share_gpus = true on the node to let a rollout and a learner share it)" };
                return Err(Invalid::new(format!("{}.gpus", a.field), format!("GPU {g} of node \"{}\" is already used by {by}{hint}", a.node)));
            }
        }
    }
    Ok(())
}
