//! The control plane: small messages between the processes of a run, over
//! `ractor_cluster`, hardened where it is known to be weak.
//!
//! `ractor_cluster` gives each process a node server (one TCP connection per
//! peer, authenticated with the run's cookie) and process groups that are
//! synced across nodes. Each [`ControlNode`] joins the group
//! `rlmesh-control/<its name>` with an inbox actor whose message type is plain
//! bytes, so nothing of ours is decoded by `ractor_cluster`'s `from_bytes`
//! (which may panic by contract). On top of it, rlmesh adds:
//!
//! - **our own versioned payloads**: every message is a [`crate::frame`]
//!   (rlmesh version, MAC keyed by the cookie, cap); a bad one decodes to an
//!   error that is counted by reason and named in the log, and the node keeps
//!   running;
//! - **a size cap** on every message, checked by the sender before it sends
//!   (a frame over `ractor_cluster`'s inbound limit would drop the whole
//!   session) and again by the receiver;
//! - **heartbeats with a deadline**: each node sends every peer a heartbeat
//!   every [`ControlConfig::heartbeat`]; a peer silent past
//!   [`ControlConfig::deadline`] is declared [`PeerEvent::Lost`] even while
//!   its TCP connection stays open (a stopped or wedged process);
//! - **bounded queues**: `ractor_cluster`'s writer queue is unbounded, so a
//!   sender may have at most [`ControlConfig::window`] messages to one peer
//!   that the peer has not consumed (acknowledgements ride on the
//!   heartbeats); past that, [`ControlNode::send`] says
//!   [`ControlError::Full`]. A message counts as received when the consumer
//!   takes it ([`ControlNode::recv`]), so a receiver holds at most `window`
//!   messages per peer, and its inbox never waits on a slow consumer: its
//!   heartbeats are read however busy it is.
//!
//! Sessions that open but never authenticate (a wrong cookie, or garbage on
//! the port) are counted and logged with the peer's address.
use crate::cookie::Cookie;
use crate::data_plane::DataPlaneStats;
use crate::frame::{FrameCodec, FrameError, WireMessage};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use ractor_cluster::node::{NodeEventSubscription, NodeServerSessionInformation};
use ractor_cluster::{NodeServer, NodeServerMessage};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

const GROUP_PREFIX: &str = "rlmesh-control/";

/// Settings of a control node.
#[derive(Clone, Debug)]
pub struct ControlConfig {
    /// Largest message payload in bytes (control messages are small; bulk goes on the data plane).
    pub cap: u64,
    /// Heartbeat interval.
    pub heartbeat: Duration,
    /// A peer silent this long is declared lost.
    pub deadline: Duration,
    /// Most unconsumed messages to one peer.
    pub window: u64,
    /// Capacity of the peer-event channel (messages are bounded by `window` per peer).
    pub queue: usize,
    /// The address peers know this node by (its host). ractor_cluster takes
    /// `host:port` as a node's identity and drops a session to a peer with
    /// the same one as a connection to itself, so processes on different
    /// hosts that share a port number must each give their own host.
    pub host: String,
}

impl Default for ControlConfig {
    fn default() -> Self {
        ControlConfig { cap: 1 << 20, heartbeat: Duration::from_millis(500), deadline: Duration::from_secs(5), window: 256, queue: 256, host: "127.0.0.1".into() }
    }
}

/// Why a control-plane call failed.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Starting the node server or an actor failed.
    #[error("control node {node}: {message}")]
    Start {
        /// This node.
        node: String,
        /// What failed.
        message: String,
    },
    /// Connecting to a peer failed.
    #[error("control node {node}: cannot connect to {addr}: {message}")]
    Connect {
        /// This node.
        node: String,
        /// The peer's address.
        addr: String,
        /// Why.
        message: String,
    },
    /// No process of that name has joined the control plane (yet).
    #[error("no control peer named {0:?}")]
    NoPeer(String),
    /// The peer has not acknowledged `window` messages: the bounded queue is full.
    #[error("control peer {peer}: {window} messages unacknowledged; the queue is full")]
    Full {
        /// The peer.
        peer: String,
        /// The window.
        window: u64,
    },
    /// The peer was declared lost (silent past the deadline).
    #[error("control peer {0} is lost (silent past the heartbeat deadline)")]
    Lost(String),
    /// The message could not be framed (e.g. over the cap).
    #[error(transparent)]
    Frame(#[from] FrameError),
}

/// What happened to a peer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PeerEvent {
    /// First heard from.
    Joined(String),
    /// Silent past the deadline.
    Lost(String),
    /// Heard from again after being lost.
    Back(String),
}

/// What [`ControlNode::next`] returns.
#[derive(Debug)]
pub enum Incoming<M> {
    /// A message and its sender.
    Message(String, M),
    /// Something happened to a peer.
    Peer(PeerEvent),
}

/// The envelope every control frame carries.
#[derive(Debug, Serialize, Deserialize)]
enum Envelope {
    /// Liveness, plus how many messages of the peer's this node has received (the ack).
    Heartbeat { from: String, received: u64 },
    /// An application message: a frame of the node's message type.
    Message { from: String, body: Vec<u8> },
}

impl WireMessage for Envelope {
    const KIND: u16 = 0x0100;
    const NAME: &'static str = "ControlEnvelope";
}

#[derive(Debug)]
struct PeerState {
    last_seen: Instant,
    lost: bool,
    sent: u64,
    acked: u64,
    received: u64,
}

struct Shared {
    name: String,
    codec: FrameCodec,
    cfg: ControlConfig,
    stats: DataPlaneStats,
    sessions_refused: AtomicU64,
    peers: Mutex<HashMap<String, PeerState>>,
    events: mpsc::Sender<PeerEvent>,
}

impl Shared {
    fn peer_heard(&self, from: &str) -> Option<PeerEvent> {
        let mut peers = self.peers.lock().expect("peers lock");
        let now = Instant::now();
        match peers.get_mut(from) {
            Some(p) => {
                p.last_seen = now;
                if p.lost {
                    p.lost = false;
                    eprintln!("[control] {}: peer {from} is back", self.name);
                    return Some(PeerEvent::Back(from.to_string()));
                }
                None
            }
            None => {
                peers.insert(from.to_string(), PeerState { last_seen: now, lost: false, sent: 0, acked: 0, received: 0 });
                Some(PeerEvent::Joined(from.to_string()))
            }
        }
    }

    fn event(&self, e: Option<PeerEvent>) {
        if let Some(e) = e {
            let _ = self.events.try_send(e);
        }
    }
}

/// The inbox actor: raw bytes in, our frames decoded here.
struct ControlInbox<M: WireMessage>(PhantomData<fn() -> M>);

struct InboxArgs<M> {
    shared: Arc<Shared>,
    tx: mpsc::UnboundedSender<(String, M)>,
}

impl<M: WireMessage> Actor for ControlInbox<M> {
    type Msg = Vec<u8>;
    type State = InboxArgs<M>;
    type Arguments = InboxArgs<M>;

    async fn pre_start(&self, _me: ActorRef<Vec<u8>>, args: InboxArgs<M>) -> Result<InboxArgs<M>, ActorProcessingErr> {
        Ok(args)
    }

    async fn handle(&self, _me: ActorRef<Vec<u8>>, bytes: Vec<u8>, st: &mut InboxArgs<M>) -> Result<(), ActorProcessingErr> {
        let sh = &st.shared;
        // ractor_cluster does not say which session a message came from; the sender's name is inside the frame.
        let refuse = |e: FrameError| sh.stats.refuse(&e, || format!("[control] {}: refused a {}-byte message", sh.name, bytes.len()));
        match sh.codec.decode::<Envelope>(&bytes) {
            Err(e) => refuse(e),
            Ok(Envelope::Heartbeat { from, received }) => {
                let ev = sh.peer_heard(&from);
                if let Some(p) = sh.peers.lock().expect("peers lock").get_mut(&from) {
                    p.acked = p.acked.max(received.min(p.sent));
                }
                sh.event(ev);
            }
            Ok(Envelope::Message { from, body }) => match sh.codec.decode::<M>(&body) {
                Err(e) => refuse(e),
                Ok(m) => {
                    let ev = sh.peer_heard(&from);
                    sh.event(ev);
                    sh.stats.delivered_one();
                    // Never blocks, so heartbeats are read however slow the consumer is. The
                    // queue is still bounded: a message is acknowledged when it is consumed
                    // (`ControlNode::recv`), and each peer may have `window` unacknowledged.
                    let _ = st.tx.send((from, m));
                }
            },
        }
        Ok(())
    }
}

fn group(name: &str) -> String {
    format!("{GROUP_PREFIX}{name}")
}

/// The peer's inbox, if it has joined (a remote member of its group).
fn remote_inbox(name: &str) -> Option<ActorRef<Vec<u8>>> {
    ractor::pg::get_members(&group(name)).into_iter().find(|c| !c.get_id().is_local()).map(ActorRef::from)
}

fn heartbeat_to(sh: &Shared, peer: &str) {
    let received = sh.peers.lock().expect("peers lock").get(peer).map_or(0, |p| p.received);
    if let (Some(inbox), Ok(frame)) = (remote_inbox(peer), sh.codec.encode(&Envelope::Heartbeat { from: sh.name.clone(), received })) {
        let _ = inbox.cast(frame);
    }
}

/// Counts and logs sessions that open but never authenticate.
struct SessionWatch {
    shared: Arc<Shared>,
    authenticated: Mutex<HashSet<String>>,
}

impl NodeEventSubscription for SessionWatch {
    fn node_session_opened(&self, _s: NodeServerSessionInformation) {}
    fn node_session_authenticated(&self, s: NodeServerSessionInformation) {
        self.authenticated.lock().expect("sessions lock").insert(s.peer_addr);
    }
    fn node_session_disconnected(&self, s: NodeServerSessionInformation) {
        if !self.authenticated.lock().expect("sessions lock").remove(&s.peer_addr) {
            self.shared.sessions_refused.fetch_add(1, Ordering::Relaxed);
            eprintln!(
                "[control] {}: refused a session from {}: it never authenticated (wrong run cookie, another protocol, or garbage)",
                self.shared.name, s.peer_addr
            );
        }
    }
}

/// One process's place on the control plane, receiving messages of type `M`.
pub struct ControlNode<M: WireMessage> {
    shared: Arc<Shared>,
    server: ActorRef<NodeServerMessage>,
    inbox: ActorRef<Vec<u8>>,
    rx: mpsc::UnboundedReceiver<(String, M)>,
    events: mpsc::Receiver<PeerEvent>,
    beat: tokio::task::JoinHandle<()>,
}

impl<M: WireMessage> ControlNode<M> {
    /// Starts the node server on `port` (on every address) under the run's `cookie`, named `name`.
    pub async fn start(name: &str, port: u16, cookie: &Cookie, cfg: ControlConfig) -> Result<ControlNode<M>, ControlError> {
        Self::start_with_codec(name, port, cookie, FrameCodec::new(cookie.as_bytes(), cfg.cap), cfg).await
    }

    /// [`ControlNode::start`] with a given codec (e.g. one claiming another rlmesh version, in tests).
    pub async fn start_with_codec(name: &str, port: u16, cookie: &Cookie, codec: FrameCodec, cfg: ControlConfig) -> Result<ControlNode<M>, ControlError> {
        let fail = |message: String| ControlError::Start { node: name.to_string(), message };
        let (etx, events) = mpsc::channel(cfg.queue.max(1));
        let shared = Arc::new(Shared {
            name: name.to_string(),
            codec,
            cfg: cfg.clone(),
            stats: DataPlaneStats::default(),
            sessions_refused: AtomicU64::new(0),
            peers: Mutex::new(HashMap::new()),
            events: etx,
        });
        // Twice the cap plus room for the envelope and ractor's own framing: a
        // larger frame drops the session inside ractor_cluster, before allocation.
        let ns = NodeServer::new(port, cookie.to_hex(), name.to_string(), cfg.host.clone(), None, None).with_max_inbound_frame_size(cfg.cap.saturating_mul(2).saturating_add(4096));
        let (server, _) = Actor::spawn(None, ns, ()).await.map_err(|e| fail(format!("node server on port {port}: {e}")))?;
        server
            .cast(NodeServerMessage::SubscribeToEvents {
                id: "rlmesh-session-watch".into(),
                subscription: Box::new(SessionWatch { shared: shared.clone(), authenticated: Mutex::new(HashSet::new()) }),
            })
            .map_err(|e| fail(e.to_string()))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let (inbox, _) = Actor::spawn(None, ControlInbox::<M>(PhantomData), InboxArgs { shared: shared.clone(), tx }).await.map_err(|e| fail(format!("inbox: {e}")))?;
        ractor::pg::join(group(name), vec![inbox.get_cell()]);
        let sh = shared.clone();
        let beat = tokio::spawn(async move {
            let mut tick = tokio::time::interval(sh.cfg.heartbeat);
            loop {
                tick.tick().await;
                for g in ractor::pg::which_groups() {
                    if let Some(peer) = g.strip_prefix(GROUP_PREFIX) {
                        if peer != sh.name && remote_inbox(peer).is_some() {
                            heartbeat_to(&sh, peer);
                        }
                    }
                }
                let mut lost = vec![];
                for (peer, p) in sh.peers.lock().expect("peers lock").iter_mut() {
                    if !p.lost && p.last_seen.elapsed() > sh.cfg.deadline {
                        p.lost = true;
                        lost.push(peer.clone());
                    }
                }
                for peer in lost {
                    eprintln!("[control] {}: peer {peer} lost: silent for more than {:?}", sh.name, sh.cfg.deadline);
                    sh.event(Some(PeerEvent::Lost(peer)));
                }
            }
        });
        Ok(ControlNode { shared, server, inbox, rx, events, beat })
    }

    /// This node's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Connects to the node server at `addr` (`host:port`); peers' groups sync by themselves afterwards.
    pub async fn connect(&self, addr: &str) -> Result<(), ControlError> {
        ractor_cluster::client_connect(&self.server, addr).await.map_err(|e| ControlError::Connect { node: self.shared.name.clone(), addr: addr.to_string(), message: format!("{e:?}") })
    }

    /// Waits until the peer named `peer` has joined, for at most `timeout`.
    pub async fn wait_for_peer(&self, peer: &str, timeout: Duration) -> Result<(), ControlError> {
        let t0 = Instant::now();
        while remote_inbox(peer).is_none() {
            if t0.elapsed() > timeout {
                return Err(ControlError::NoPeer(peer.to_string()));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(())
    }

    /// A cloneable handle that sends as this node (for tasks other than the one receiving).
    pub fn sender(&self) -> ControlSender<M> {
        ControlSender { shared: self.shared.clone(), _m: PhantomData }
    }

    /// Sends `msg` to the peer named `peer`: refused over the cap, when the peer is lost, or when its window is full.
    pub fn send(&self, peer: &str, msg: &M) -> Result<(), ControlError> {
        send_as(&self.shared, peer, msg)
    }


    /// Sends raw bytes to a peer's inbox, bypassing framing (tests of the receiver's checks).
    pub fn send_raw(&self, peer: &str, bytes: Vec<u8>) -> Result<(), ControlError> {
        remote_inbox(peer).ok_or_else(|| ControlError::NoPeer(peer.to_string()))?.cast(bytes).map_err(|_| ControlError::NoPeer(peer.to_string()))
    }

    /// The next message and its sender.
    pub async fn recv(&mut self) -> Option<(String, M)> {
        let m = self.rx.recv().await;
        if let Some((from, _)) = &m {
            self.consumed(from);
        }
        m
    }

    /// Counts a message of `from` as received, and acknowledges every quarter window.
    fn consumed(&self, from: &str) {
        let sh = &self.shared;
        let ack_now = {
            let mut peers = sh.peers.lock().expect("peers lock");
            let Some(p) = peers.get_mut(from) else { return };
            p.received += 1;
            p.received % (sh.cfg.window / 4).max(1) == 0
        };
        if ack_now {
            heartbeat_to(sh, from);
        }
    }

    /// The next peer event.
    pub async fn next_event(&mut self) -> Option<PeerEvent> {
        self.events.recv().await
    }

    /// The next message or peer event, whichever comes first (`None`: the node stopped).
    pub async fn next(&mut self) -> Option<Incoming<M>> {
        tokio::select! {
            m = self.rx.recv() => m.map(|(from, msg)| {
                self.consumed(&from);
                Incoming::Message(from, msg)
            }),
            e = self.events.recv() => e.map(Incoming::Peer),
        }
    }

    /// Refused messages by reason, and messages delivered.
    pub fn stats(&self) -> &DataPlaneStats {
        &self.shared.stats
    }

    /// Sessions that opened but never authenticated.
    pub fn sessions_refused(&self) -> u64 {
        self.shared.sessions_refused.load(Ordering::Relaxed)
    }
}

impl<M: WireMessage> Drop for ControlNode<M> {
    fn drop(&mut self) {
        self.beat.abort();
        self.inbox.stop(None);
        self.server.stop(None);
    }
}

/// Sends as a [`ControlNode`] from another task: see [`ControlNode::sender`].
pub struct ControlSender<M: WireMessage> {
    shared: Arc<Shared>,
    _m: PhantomData<fn(M)>,
}

impl<M: WireMessage> Clone for ControlSender<M> {
    fn clone(&self) -> Self {
        ControlSender { shared: self.shared.clone(), _m: PhantomData }
    }
}

impl<M: WireMessage> ControlSender<M> {
    /// As [`ControlNode::send`].
    pub fn send(&self, peer: &str, msg: &M) -> Result<(), ControlError> {
        send_as(&self.shared, peer, msg)
    }

    /// This node's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Forgets `peer`'s state (its send window, its loss): a process started
    /// again under the same name joins as new, and its message counts start at zero.
    pub fn forget(&self, peer: &str) {
        self.shared.peers.lock().expect("peers lock").remove(peer);
    }

    /// How long ago `peer` was last heard from (`None`: never).
    pub fn last_heard(&self, peer: &str) -> Option<Duration> {
        self.shared.peers.lock().expect("peers lock").get(peer).map(|p| p.last_seen.elapsed())
    }
}

fn send_as<M: WireMessage>(shared: &Shared, peer: &str, msg: &M) -> Result<(), ControlError> {
    let body = shared.codec.encode(msg)?;
    let frame = shared.codec.encode(&Envelope::Message { from: shared.name.clone(), body })?;
    let inbox = remote_inbox(peer).ok_or_else(|| ControlError::NoPeer(peer.to_string()))?;
    {
        let mut peers = shared.peers.lock().expect("peers lock");
        let p = peers.entry(peer.to_string()).or_insert(PeerState { last_seen: Instant::now(), lost: false, sent: 0, acked: 0, received: 0 });
        if p.lost {
            return Err(ControlError::Lost(peer.to_string()));
        }
        if p.sent - p.acked >= shared.cfg.window {
            return Err(ControlError::Full { peer: peer.to_string(), window: shared.cfg.window });
        }
        p.sent += 1;
    }
    inbox.cast(frame).map_err(|_| ControlError::NoPeer(peer.to_string()))
}
