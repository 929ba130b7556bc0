//! The CPU backend: ranks are OS processes, linked in a ring of TCP
//! connections (each rank writes to its next rank and reads from its previous
//! one), found through a rendezvous at rank 0's address.
//!
//! ```no_run
//! use rlmesh_comm::{CollectiveExt, RingComm, RingConfig};
//! # fn main() -> Result<(), rlmesh_comm::CommError> {
//! // In each of 4 processes, with its own rank:
//! let rank = 0;
//! let mut comm = RingComm::connect(RingConfig::new(rank, 4, "127.0.0.1:29500").cookie("s3cret"))?;
//! let mut grads = vec![1.0f32; 1000];
//! comm.all_reduce_mean(&mut grads)?;
//! # Ok(()) }
//! ```

mod rendezvous;
mod ring;
pub mod shm;
pub mod wire;

pub use ring::{Pieces, RingAbort, RingComm, PIECE_BYTES};

use std::time::Duration;

/// Default bound on any single wait for a peer inside a collective.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// Default bound on the whole rendezvous.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(60);
/// Default pipelining block: each ring chunk moves in blocks of this many bytes.
pub const DEFAULT_BLOCK_BYTES: usize = 256 * 1024;
/// Environment variable read by [`RingConfig::new`] for the cookie.
pub const COOKIE_ENV: &str = "RLMESH_COMM_COOKIE";

/// How to join a CPU ring.
#[derive(Debug, Clone)]
pub struct RingConfig {
    /// This process's rank, `0..world`.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// Rank 0's rendezvous address, `host:port`; rank 0 listens there.
    pub addr: String,
    /// Shared secret every rank must present; guards against a wrong job's
    /// ranks joining (it is sent in clear: not a defence against attackers on the network).
    pub cookie: String,
    /// Bound on any single wait for a peer during a collective (a dead or stuck peer surfaces as an error after this).
    pub timeout: Duration,
    /// Bound on the whole rendezvous.
    pub connect_timeout: Duration,
    /// Pipelining granularity in bytes.
    pub block_bytes: usize,
    /// The address this rank's ring listener binds (its host's); `None`: the
    /// rendezvous's loopback when it is on loopback, else every interface.
    pub bind: Option<std::net::IpAddr>,
    /// Broadcast through a shared-memory segment when every rank can map it
    /// (all on one host; see [`shm`]); otherwise, or when false, along the ring.
    pub shared_memory: bool,
    /// A listener already bound to `addr`, which rank 0 accepts on instead of
    /// binding `addr` itself: whoever chose the port keeps it from the moment
    /// it was chosen, so no other program can take it in between.
    pub root_listener: Option<std::sync::Arc<std::net::TcpListener>>,
}

impl RingConfig {
    /// A configuration with defaults; the cookie comes from `RLMESH_COMM_COOKIE` or is `"rlmesh"`.
    pub fn new(rank: usize, world: usize, addr: impl Into<String>) -> Self {
        RingConfig {
            rank,
            world,
            addr: addr.into(),
            cookie: std::env::var(COOKIE_ENV).unwrap_or_else(|_| "rlmesh".to_string()),
            timeout: DEFAULT_TIMEOUT,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            block_bytes: DEFAULT_BLOCK_BYTES,
            bind: None,
            shared_memory: true,
            root_listener: None,
        }
    }

    /// Sets the shared cookie.
    pub fn cookie(mut self, cookie: impl Into<String>) -> Self {
        self.cookie = cookie.into();
        self
    }

    /// Sets the per-wait timeout of collectives.
    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = t;
        self
    }

    /// Sets the rendezvous timeout.
    pub fn connect_timeout(mut self, t: Duration) -> Self {
        self.connect_timeout = t;
        self
    }

    /// Sets the pipelining block size in bytes.
    pub fn block_bytes(mut self, b: usize) -> Self {
        self.block_bytes = b.max(64);
        self
    }

    /// Broadcasts through shared memory when every rank can (the default), or always along the ring.
    pub fn shared_memory(mut self, on: bool) -> Self {
        self.shared_memory = on;
        self
    }

    /// Rank 0 accepts on `listener` (bound to `addr`) rather than binding `addr` itself.
    pub fn root_listener(mut self, listener: std::net::TcpListener) -> Self {
        self.root_listener = Some(std::sync::Arc::new(listener));
        self
    }

    /// Binds this rank's ring listener to `ip` (its host's address) rather than every interface.
    pub fn bind(mut self, ip: Option<std::net::IpAddr>) -> Self {
        self.bind = ip;
        self
    }
}
