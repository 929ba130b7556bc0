//! The messages between the processes of a run: one definition each.
//!
//! [`ControlMsg`]s are small and travel on the control plane
//! (`mesh::control`, over ractor_cluster); [`DataMsg`]s carry trajectories,
//! batches and weights on the data plane (`mesh::data_plane`, ZeroMQ). Both
//! are `mesh::frame`s: versioned, capped, authenticated with the run cookie.
//!
//! Values whose types hold a `serde_json::Value` (tasks, trajectories,
//! checkpoint records) travel as [`Json`] bytes inside the bincode payload:
//! bincode cannot decode a self-describing value.
use crate::reward::RewardSpec;
use crate::learner::{CheckpointMeta, LearnerConfig, SftBatch, StepStats, TrainBatch};
use crate::rollout::RolloutConfig;
use super::weights::GroupSpec;
use crate::weight_sync::image::WeightAck;
use crate::weight_sync::parts::WeightPart;
use rlmesh_core::tools::ExecLimits;
use rlmesh_mesh::frame::WireMessage;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use std::path::PathBuf;

/// Largest control message (tasks of one request, small records).
pub const CONTROL_CAP: u64 = 4 << 20;
/// Largest data message (a batch, a request's groups, a part of a version:
/// `crate::weight_sync::parts`).
pub const DATA_CAP: u64 = 1 << 30;

/// A value as JSON bytes (see the module docs).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Json(pub Vec<u8>);

impl Json {
    /// Encodes `v`.
    pub fn of<T: Serialize>(v: &T) -> Json {
        Json(serde_json::to_vec(v).expect("plain data serialises"))
    }

    /// Decodes it as `T`; the error names `what`.
    pub fn get<T: DeserializeOwned>(&self, what: &str) -> Result<T, String> {
        serde_json::from_slice(&self.0).map_err(|e| format!("{what}: undecodable JSON payload: {e}"))
    }
}

/// What a node process says first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// Its pid on its host.
    pub pid: u32,
    /// Its host's name.
    pub host: String,
    /// Its start time (clock ticks since boot, /proc/PID/stat field 22).
    pub start_time: Option<u64>,
    /// Its data-plane endpoint (`tcp://host:port`).
    pub data: String,
    /// Cores it may run on.
    pub cores: usize,
}

/// What a node process hosts, sent by the controller after [`Hello`].
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeSetup {
    /// The model directory (the same path on every host: a shared filesystem).
    pub model_dir: PathBuf,
    /// libtorch intra-op threads.
    pub threads: i32,
    /// Cores to pin the process to (empty: leave it as started).
    pub cpus: Vec<usize>,
    /// The controller's data endpoint.
    pub controller_data: String,
    /// A rollout actor.
    pub rollout: Option<RolloutSetup>,
    /// A reward actor scoring with this function.
    pub reward: Option<RewardSpec>,
    /// A data-parallel learner rank.
    pub learner: Option<LearnerSetup>,
    /// Its place in the weight-sync group (rank 0: learner rank 0; the others: rollout processes).
    pub weights: Option<GroupSpec>,
}

/// A rollout actor's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RolloutSetup {
    /// Tools offered.
    pub tools: Vec<String>,
    /// MCP tool servers the process starts or reaches for itself.
    #[serde(default)]
    pub servers: Vec<rlmesh_mcp::ServerSpec>,
    /// Tool limits.
    pub limits: ExecLimits,
    /// Sampling and loop limits.
    pub config: RolloutConfig,
    /// The CUDA ordinal it generates on, inside its process; `None`: the CPU.
    #[serde(default)]
    pub cuda: Option<usize>,
}

/// A learner rank's settings.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LearnerSetup {
    /// Learner settings (the warm-up's first).
    pub config: LearnerConfig,
    /// Its rank.
    pub rank: u32,
    /// Ranks in all.
    pub world: u32,
    /// Rank 0's ring rendezvous, `host:port`.
    pub master: String,
    /// The CUDA ordinal it trains on, inside its process; `None`: the CPU.
    /// With GPUs the ranks all-reduce by NCCL (rank 0's unique id travels over the ring).
    #[serde(default)]
    pub cuda: Option<usize>,
}

/// Control-plane messages (a call's `id` pairs it with its answer).
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum ControlMsg {
    /// Node → controller, once connected.
    Hello(Hello),
    /// Controller → node: what to host ([`NodeSetup`] as JSON).
    Setup(Json),
    /// Node → controller: the setup's outcome.
    Ready(Result<(), String>),
    /// Controller → rollout node: generate a request ([`crate::rollout::actor::RolloutRequest`]
    /// as JSON) and send the groups to the data endpoint `reward`.
    Generate { id: u64, reward: String, request: Json },
    /// Controller → rollout node: receive the next version from the weight-sync group and load it.
    Receive { id: u64 },
    /// Rollout node → controller: the outcome of [`DataMsg::Weights`] or [`ControlMsg::Receive`] `id`.
    WeightsLoaded { id: u64, result: Result<WeightAck, String> },
    /// Controller → node: leave.
    Stop,
    /// Controller → rollout node: leave the weight-sync group and join it
    /// again at `spec.epoch` (its members changed). Later
    /// [`ControlMsg::Receive`]s receive from the new group. With `abort`
    /// (a member was lost), the old group's collective is aborted first, so a
    /// receipt blocked on the lost member fails at once.
    Regroup { spec: GroupSpec, abort: bool },
}

impl WireMessage for ControlMsg {
    const KIND: u16 = 0x0200;
    const NAME: &'static str = "ControlMsg";
}

impl ControlMsg {
    /// The variant's name, for a log line (never the contents: they may be large or secret).
    pub fn name(&self) -> &'static str {
        match self {
            ControlMsg::Hello(_) => "Hello",
            ControlMsg::Setup(_) => "Setup",
            ControlMsg::Ready(_) => "Ready",
            ControlMsg::Generate { .. } => "Generate",
            ControlMsg::Receive { .. } => "Receive",
            ControlMsg::WeightsLoaded { .. } => "WeightsLoaded",
            ControlMsg::Stop => "Stop",
            ControlMsg::Regroup { .. } => "Regroup",
        }
    }
}

/// A call on a learner rank (every rank gets every call; batches are sharded by rank).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum LearnerCall {
    /// One supervised step.
    Sft(SftBatch),
    /// One policy-gradient step.
    Train(TrainBatch),
    /// New settings.
    Configure(LearnerConfig),
    /// The weights as a version (rank 0 answers with [`DataMsg::Snapshot`]).
    Snapshot(u64),
    /// A checkpoint under the root (rank 0 writes).
    Checkpoint(PathBuf, CheckpointMeta),
    /// Resume from the newest checkpoint under the root.
    Resume(PathBuf, LearnerConfig),
    /// Rank 0 only: broadcast the weights as a version to the weight-sync group.
    Publish(u64),
    /// Rank 0 only: form the weight-sync group again (as [`ControlMsg::Regroup`]);
    /// later publications go to the new one. Not answered.
    Regroup {
        /// Its place in the new group.
        spec: GroupSpec,
        /// Abort the old group's collective first.
        abort: bool,
    },
}

/// What a learner call returned.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum LearnerOut {
    /// A step's statistics.
    Stats(StepStats),
    /// Done, nothing to return.
    Done,
    /// A checkpoint's directory.
    Path(PathBuf),
    /// The record of the checkpoint resumed from.
    Meta(CheckpointMeta),
    /// Seconds rank 0 spent broadcasting a version.
    Published(f64),
}

/// Data-plane messages (a call's `id` pairs it with its answer).
#[allow(missing_docs)]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub enum DataMsg {
    /// Controller → rollout node: the next part of a policy version to load
    /// (a version is sent as its parts in order; digest-checked once all are in).
    Weights { id: u64, part: WeightPart },
    /// Rollout node → reward node (or the controller): a request's groups
    /// ([`crate::rollout::actor::RolloutResult`] as JSON).
    Groups { id: u64, result: Result<Json, String> },
    /// Reward node → controller: a request's scored groups
    /// ([`crate::rollout::actor::RolloutResult`] with `scored` set, as JSON).
    Scored { id: u64, result: Result<Json, String> },
    /// Controller → every learner rank.
    Learner { id: u64, call: Json },
    /// Learner rank → controller: the outcome of call `id` ([`LearnerOut`] as JSON).
    LearnerDone { id: u64, rank: u32, result: Result<Json, String> },
    /// Learner rank 0 → controller: the next part of the weights asked for by call `id`.
    Snapshot { id: u64, part: WeightPart },
}

impl WireMessage for DataMsg {
    const KIND: u16 = 0x0201;
    const NAME: &'static str = "DataMsg";
}

impl DataMsg {
    /// The variant's name, for a log line.
    pub fn name(&self) -> &'static str {
        match self {
            DataMsg::Weights { .. } => "Weights",
            DataMsg::Groups { .. } => "Groups",
            DataMsg::Scored { .. } => "Scored",
            DataMsg::Learner { .. } => "Learner",
            DataMsg::LearnerDone { .. } => "LearnerDone",
            DataMsg::Snapshot { .. } => "Snapshot",
        }
    }
}
