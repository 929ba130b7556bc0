//! The process layer of a distributed run: what crosses between processes,
//! what a node process hosts, and how the controller starts and talks to them.
//!
//! - [`wire`] — the control and data messages (one definition each);
//! - [`serve`] — `launcher node`: a process hosting rollout, reward or learner actors;
//! - [`fleet`] — the controller's side: starting the plan's processes
//!   (`mesh::launch`: children, ssh or srun), the handshake, hosting, and the
//!   router that hands each reply to the call waiting for it;
//! - [`link`] — what the router, proxies, keeper and publisher share: the
//!   calls waiting for replies, the started processes, the lost ones;
//! - [`proxies`] — the proxy actors that stand for remote actors behind the
//!   same messages as local ones;
//! - [`publisher`] — the weight-sync group's sender, forming the group again
//!   when its members change;
//! - [`keeper`] — the processes kept up: a lost rollout or reward process is
//!   started again, within a restart budget;
//! - [`chaos`] — `--chaos`: processes of a role killed at random times;
//! - [`weights`] — the weight-sync group: learner rank 0 (or the controller)
//!   broadcasting each version to the rollout processes.
//!
//! The run driver ([`crate::controller::run`]) sees actor references only:
//! whether an actor is in its process or on another host is decided here.
pub mod chaos;
pub mod fleet;
pub mod keeper;
pub mod link;
pub mod proxies;
pub mod publisher;
pub mod serve;
mod nccl_weights;
pub mod weights;
pub mod wire;

use crate::metrics::Metrics;
use rlmesh_mesh::data_plane::{DataPlaneConfig, DataPlaneStats, Outbox};
use rlmesh_mesh::frame::FrameCodec;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use wire::DataMsg;

/// Outboxes to other processes' data ports, opened on first use.
#[derive(Clone)]
pub(crate) struct Outboxes {
    pub(crate) codec: FrameCodec,
    pub(crate) open: Arc<Mutex<HashMap<String, Arc<Outbox<DataMsg>>>>>,
}

impl Outboxes {
    pub(crate) fn to(&self, endpoint: &str) -> Result<Arc<Outbox<DataMsg>>, String> {
        let mut open = self.open.lock().expect("outboxes lock");
        if let Some(o) = open.get(endpoint) {
            return Ok(o.clone());
        }
        let o = Arc::new(Outbox::connect(endpoint, self.codec.clone(), &DataPlaneConfig::default()).map_err(|e| e.to_string())?);
        open.insert(endpoint.to_string(), o.clone());
        Ok(o)
    }

    /// Sends `msg` to `endpoint`; a failure is logged and returned.
    pub(crate) async fn send(&self, endpoint: &str, msg: DataMsg) -> Result<(), String> {
        let out = self.to(endpoint).map_err(|e| format!("cannot open the data plane to {endpoint}: {e}"))?;
        out.send(&msg).await.map_err(|e| format!("sending to {endpoint} failed: {e}")).inspect_err(|e| eprintln!("[data] {e}"))
    }
}


/// Copies the mesh's refusal counters into the process's metrics (they only grow).
#[derive(Default)]
pub(crate) struct RefusalMirror {
    seen: HashMap<(&'static str, &'static str), u64>,
}

impl RefusalMirror {
    pub(crate) fn copy(&mut self, m: &Metrics, plane: &'static str, stats: &DataPlaneStats) {
        for (reason, n) in stats.refusals() {
            let prev = self.seen.entry((plane, reason)).or_default();
            if n > *prev {
                m.peer_rejected_total.with_label_values(&[plane, reason]).inc_by(n - *prev);
                *prev = n;
            }
        }
    }
}

/// How many times `launcher up` started the run again after a lost learner
/// rank (set on each start again; node processes started locally inherit it).
pub const LEARNER_RESTARTS_ENV: &str = "RLMESH_LEARNER_RESTARTS";

/// Fault injection for tests, `RANK:STEP`: learner rank RANK shuts its ring
/// down before its STEP-th policy step (counted in its process) and stays
/// alive; on the run's first start only.
pub const RING_FAULT_ENV: &str = "RLMESH_FAULT_LEARNER_RING_ABORT_AT";
