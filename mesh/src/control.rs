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
//!
//! **One process per name.** Each start of a process is an *incarnation*
//! with a ractor node name of its own (`NAME~PID.NONCE@HOST`), so
//! `ractor_cluster` never elects between two sessions claiming one name (its
//! election could drop the live process's session in favour of a stranger's).
//! A peer's name is bound to the first incarnation heard under it; a second
//! one claiming it is refused (`duplicate`), logged with its address, and its
//! session closed, and messages to the name go to the bound incarnation only.
//! [`ControlSender::forget`] (the process was started again) retires the
//! bound incarnation: if it speaks up later it is refused as `superseded`.
//!
//! **What `ractor_cluster` gets wrong, and what we do about it.**
//! - A node re-announces the process-group members it learned from one
//!   session to its other sessions under their *remote* pids, as if they were
//!   its own actors; sent to, such a member delivers to whatever actor holds
//!   that pid on the relaying node. Only a member on a direct session whose
//!   node is an incarnation of the peer's name is used, and every envelope
//!   names its receiver: a frame that lands elsewhere is refused.
//! - Remote actor ids are numbered per node server, so two control nodes in
//!   one process can give different peers' actors the same id, and one
//!   session's end removes the other's group members. One control node per
//!   process is the rule (tests that play several peers spawn processes, or
//!   keep the extra ones unauthenticated); the groups live in a scope of the
//!   run's own, so two runs in one process do not share them.
use crate::cookie::Cookie;
use crate::data_plane::DataPlaneStats;
use crate::frame::{FrameCodec, FrameError, WireMessage};
use ractor::{Actor, ActorProcessingErr, ActorRef};
use ractor_cluster::node::{NodeEventSubscription, NodeServerSessionInformation};
use ractor_cluster::NodeSessionMessage;
use ractor_cluster::{NodeServer, NodeServerMessage};
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, HashSet};
use std::marker::PhantomData;
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
    /// The address the node server listens on (`None`: every address).
    pub listen: Option<std::net::IpAddr>,
}

impl Default for ControlConfig {
    fn default() -> Self {
        ControlConfig { cap: 1 << 20, heartbeat: Duration::from_millis(500), deadline: Duration::from_secs(5), window: 256, queue: 256, host: "127.0.0.1".into(), listen: None }
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

/// The envelope every control frame carries: the sender's name and
/// incarnation, the receiver's name, then what it says.
#[derive(Debug, Serialize, Deserialize)]
struct Envelope {
    from: String,
    /// The sender's ractor node name (this start of the process).
    node: String,
    /// The name it is meant for: a frame delivered elsewhere is refused.
    to: String,
    body: Body,
}

#[derive(Debug, Serialize, Deserialize)]
enum Body {
    /// Liveness, plus how many messages of the peer's this node has received (the ack).
    Heartbeat { received: u64 },
    /// An application message: a frame of the node's message type.
    Message(Vec<u8>),
}

impl WireMessage for Envelope {
    const KIND: u16 = 0x0100;
    const NAME: &'static str = "ControlEnvelope";
}

#[derive(Debug)]
struct PeerState {
    /// The incarnation bound to the name (empty until it is first heard from).
    node: String,
    last_seen: Instant,
    lost: bool,
    sent: u64,
    acked: u64,
    received: u64,
}

impl PeerState {
    fn new(node: &str) -> PeerState {
        PeerState { node: node.to_string(), last_seen: Instant::now(), lost: false, sent: 0, acked: 0, received: 0 }
    }
}

/// An authenticated session with another node.
struct Session {
    /// The peer's ractor node name.
    name: String,
    addr: String,
    actor: ActorRef<NodeSessionMessage>,
}

struct Shared {
    name: String,
    /// The run's process-group scope (from its cookie): two runs, or a run and
    /// a test's peers, in one process never see each other's groups.
    scope: String,
    /// This incarnation's ractor node name, as peers see it.
    node: String,
    codec: FrameCodec,
    cfg: ControlConfig,
    stats: DataPlaneStats,
    peers: Mutex<HashMap<String, PeerState>>,
    /// Incarnations retired by [`ControlSender::forget`].
    retired: Mutex<HashSet<String>>,
    /// Authenticated sessions by ractor node id.
    sessions: Mutex<HashMap<u64, Session>>,
    events: mpsc::Sender<PeerEvent>,
}

/// Whether a message from a name and incarnation is taken.
enum Admission {
    Taken(Option<PeerEvent>),
    Refused,
}

impl Shared {
    /// Binds `from` to `node` on first contact; refuses another incarnation claiming a bound name, or a retired one.
    fn admit(&self, from: &str, node: &str) -> Admission {
        if self.retired.lock().expect("retired lock").contains(node) {
            self.refuse_peer("superseded", from, node, "it was started again since, under another incarnation");
            return Admission::Refused;
        }
        let mut peers = self.peers.lock().expect("peers lock");
        let p = match peers.get_mut(from) {
            None => {
                peers.insert(from.to_string(), PeerState::new(node));
                return Admission::Taken(Some(PeerEvent::Joined(from.to_string())));
            }
            Some(p) => p,
        };
        if p.node.is_empty() {
            p.node = node.to_string();
        } else if p.node != node {
            let holder = p.node.clone();
            drop(peers);
            self.refuse_peer("duplicate", from, node, &format!("{holder} holds that name"));
            return Admission::Refused;
        }
        p.last_seen = Instant::now();
        if p.lost {
            p.lost = false;
            eprintln!("[control] {}: peer {from} is back", self.name);
            return Admission::Taken(Some(PeerEvent::Back(from.to_string())));
        }
        Admission::Taken(None)
    }

    /// Counts and logs a refused incarnation, and closes its session.
    fn refuse_peer(&self, reason: &str, from: &str, node: &str, why: &str) {
        let session = self.sessions.lock().expect("sessions lock").values().find(|s| s.name == node).map(|s| (s.addr.clone(), s.actor.clone()));
        let addr = session.as_ref().map_or("an unknown address".to_string(), |(a, _)| a.clone());
        self.stats.reject(reason, || format!("[control] {}: refused {node} at {addr} claiming the name {from}: {why}; its session is closed", self.name));
        if let Some((_, actor)) = session {
            actor.stop(Some(format!("rlmesh: {reason} claim of {from}")));
        }
    }

    /// The peer's inbox: a member of its group on a direct session with an
    /// incarnation of that name (the one bound to the name, once there is one).
    ///
    /// `ractor_cluster` re-announces the group members it learned from one
    /// session to its other sessions under their remote pids, as if they were
    /// its own actors: a node with two peers shows each of them members that
    /// really are "the actor with that pid on me". Sent to, those deliver to
    /// whatever actor holds that pid there. Only members on a session whose
    /// node is an incarnation of `name` are real.
    fn remote_inbox(&self, name: &str) -> Option<ActorRef<Vec<u8>>> {
        let bound = self.peers.lock().expect("peers lock").get(name).map(|p| p.node.clone()).filter(|n| !n.is_empty());
        let sessions = self.sessions.lock().expect("sessions lock");
        let retired = self.retired.lock().expect("retired lock");
        let prefix = format!("{name}~");
        ractor::pg::get_scoped_members(&self.scope, &group(name))
            .into_iter()
            .filter(|c| !c.get_id().is_local())
            .find(|c| match sessions.get(&c.get_id().node()).map(|s| s.name.as_str()) {
                None => false,
                Some(n) if !n.starts_with(&prefix) || retired.contains(n) => false,
                Some(n) => bound.as_ref().map_or(true, |b| b == n),
            })
            .map(ActorRef::from)
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
        // ractor_cluster does not say which session a message came from: before the envelope
        // decodes, the log can only name the sessions open then.
        let refuse = |e: FrameError, who: &str| sh.stats.refuse(&e, || format!("[control] {}: refused a {}-byte message from {who}", sh.name, bytes.len()));
        let env = match sh.codec.decode::<Envelope>(&bytes) {
            Err(e) => {
                refuse(e, &sh.open_sessions());
                return Ok(());
            }
            Ok(env) => env,
        };
        if env.to != sh.name {
            sh.stats.reject("unexpected", || format!("[control] {}: refused a message from {} ({}) meant for {}", sh.name, env.from, env.node, env.to));
            return Ok(());
        }
        let ev = match sh.admit(&env.from, &env.node) {
            Admission::Refused => return Ok(()),
            Admission::Taken(ev) => ev,
        };
        sh.event(ev);
        match env.body {
            Body::Heartbeat { received } => {
                if let Some(p) = sh.peers.lock().expect("peers lock").get_mut(&env.from) {
                    p.acked = p.acked.max(received.min(p.sent));
                }
            }
            Body::Message(body) => match sh.codec.decode::<M>(&body) {
                Err(e) => refuse(e, &format!("{} ({})", env.from, env.node)),
                Ok(m) => {
                    sh.stats.delivered_one();
                    // Never blocks, so heartbeats are read however slow the consumer is. The
                    // queue is still bounded: a message is acknowledged when it is consumed
                    // (`ControlNode::recv`), and each peer may have `window` unacknowledged.
                    let _ = st.tx.send((env.from, m));
                }
            },
        }
        Ok(())
    }
}

fn group(name: &str) -> String {
    format!("{GROUP_PREFIX}{name}")
}

impl Shared {
    /// The addresses of the sessions open now, for a log line.
    fn open_sessions(&self) -> String {
        let addrs: Vec<String> = self.sessions.lock().expect("sessions lock").values().map(|s| s.addr.clone()).collect();
        format!("one of the authenticated sessions [{}]", addrs.join(", "))
    }

    fn envelope(&self, to: &str, body: Body) -> Result<Vec<u8>, FrameError> {
        self.codec.encode(&Envelope { from: self.name.clone(), node: self.node.clone(), to: to.to_string(), body })
    }
}

fn heartbeat_to(sh: &Shared, peer: &str) {
    let received = sh.peers.lock().expect("peers lock").get(peer).map_or(0, |p| p.received);
    if let (Some(inbox), Ok(frame)) = (sh.remote_inbox(peer), sh.envelope(peer, Body::Heartbeat { received })) {
        let _ = inbox.cast(frame);
    }
}

/// Keeps the authenticated sessions (ractor node id → name, address); counts
/// and logs sessions that close without ever authenticating.
struct SessionWatch {
    shared: Arc<Shared>,
}

impl NodeEventSubscription for SessionWatch {
    fn node_session_opened(&self, _s: NodeServerSessionInformation) {}
    fn node_session_authenticated(&self, s: NodeServerSessionInformation) {
        let name = s.peer_name.map(|n| n.name).unwrap_or_default();
        self.shared.sessions.lock().expect("sessions lock").insert(s.node_id, Session { name, addr: s.peer_addr, actor: s.actor });
    }
    fn node_session_disconnected(&self, s: NodeServerSessionInformation) {
        if self.shared.sessions.lock().expect("sessions lock").remove(&s.node_id).is_none() {
            let sh = &self.shared;
            sh.stats.reject("handshake", || {
                format!("[control] {}: refused a session from {}: it never authenticated (wrong run cookie, another protocol, or garbage)", sh.name, s.peer_addr)
            });
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
        // Unique per start: the pid, and the clock for two nodes of one process (tests).
        let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
        let incarnation = format!("{name}~{}.{nonce:x}", std::process::id());
        let run = blake3::hash(cookie.as_bytes());
        let shared = Arc::new(Shared {
            name: name.to_string(),
            scope: format!("rlmesh-run-{}", &run.to_hex()[..16]),
            node: format!("{incarnation}@{}", cfg.host),
            codec,
            cfg: cfg.clone(),
            stats: DataPlaneStats::default(),
            peers: Mutex::new(HashMap::new()),
            retired: Mutex::new(HashSet::new()),
            sessions: Mutex::new(HashMap::new()),
            events: etx,
        });
        // Twice the cap plus room for the envelope and ractor's own framing: a
        // larger frame drops the session inside ractor_cluster, before allocation.
        let mut ns = NodeServer::new(port, cookie.to_hex(), incarnation, cfg.host.clone(), None, None).with_max_inbound_frame_size(cfg.cap.saturating_mul(2).saturating_add(4096));
        if let Some(ip) = cfg.listen {
            ns = ns.with_listen_addr(ip);
        }
        let (server, _) = Actor::spawn(None, ns, ()).await.map_err(|e| fail(format!("node server on port {port}: {e}")))?;
        server
            .cast(NodeServerMessage::SubscribeToEvents {
                id: "rlmesh-session-watch".into(),
                subscription: Box::new(SessionWatch { shared: shared.clone() }),
            })
            .map_err(|e| fail(e.to_string()))?;
        let (tx, rx) = mpsc::unbounded_channel();
        let (inbox, _) = Actor::spawn(None, ControlInbox::<M>(PhantomData), InboxArgs { shared: shared.clone(), tx }).await.map_err(|e| fail(format!("inbox: {e}")))?;
        ractor::pg::join_scoped(shared.scope.clone(), group(name), vec![inbox.get_cell()]);
        let sh = shared.clone();
        let beat = tokio::spawn(async move {
            let mut tick = tokio::time::interval(sh.cfg.heartbeat);
            loop {
                tick.tick().await;
                for g in ractor::pg::which_scoped_groups(&sh.scope) {
                    if let Some(peer) = g.strip_prefix(GROUP_PREFIX) {
                        if peer != sh.name {
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
        while self.shared.remote_inbox(peer).is_none() {
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
        self.shared.remote_inbox(peer).ok_or_else(|| ControlError::NoPeer(peer.to_string()))?.cast(bytes).map_err(|_| ControlError::NoPeer(peer.to_string()))
    }

    /// The bytes [`ControlNode::send`] would put on the wire for `msg` to
    /// `peer`, for any wire message type (a seed for fuzzing a peer, or a
    /// message of the wrong type, with [`ControlNode::send_raw`]).
    pub fn frame<T: WireMessage>(&self, peer: &str, msg: &T) -> Result<Vec<u8>, ControlError> {
        Ok(self.shared.envelope(peer, Body::Message(self.shared.codec.encode(msg)?))?)
    }

    /// Sends `msg` under another name than this node's (tests of a duplicate claim).
    pub fn send_as_name(&self, claimed: &str, peer: &str, msg: &M) -> Result<(), ControlError> {
        let frame = self.shared.codec.encode(&Envelope { from: claimed.to_string(), node: self.shared.node.clone(), to: peer.to_string(), body: Body::Message(self.shared.codec.encode(msg)?) })?;
        self.send_raw(peer, frame)
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

    /// Refused input by reason (frames, handshakes, claims; see
    /// [`crate::frame::REFUSAL_REASONS`]), and messages delivered.
    pub fn stats(&self) -> &DataPlaneStats {
        &self.shared.stats
    }

    /// This incarnation's ractor node name (`NAME~PID.NONCE@HOST`).
    pub fn incarnation(&self) -> &str {
        &self.shared.node
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

    /// Forgets `peer`'s state (its send window, its loss) and retires its
    /// incarnation: a process started again under the same name joins as new,
    /// its message counts start at zero, and the old one is refused if it speaks up.
    pub fn forget(&self, peer: &str) {
        if let Some(p) = self.shared.peers.lock().expect("peers lock").remove(peer) {
            if !p.node.is_empty() {
                self.shared.retired.lock().expect("retired lock").insert(p.node);
            }
        }
    }

    /// Starts `peer`'s message counts again, keeping the incarnation bound to its name.
    pub fn reset(&self, peer: &str) {
        if let Some(p) = self.shared.peers.lock().expect("peers lock").get_mut(peer) {
            (p.sent, p.acked, p.received) = (0, 0, 0);
        }
    }

    /// Refused input by reason, as [`ControlNode::stats`].
    pub fn stats(&self) -> &DataPlaneStats {
        &self.shared.stats
    }

    /// How long ago `peer` was last heard from (`None`: never).
    pub fn last_heard(&self, peer: &str) -> Option<Duration> {
        self.shared.peers.lock().expect("peers lock").get(peer).map(|p| p.last_seen.elapsed())
    }
}

fn send_as<M: WireMessage>(shared: &Shared, peer: &str, msg: &M) -> Result<(), ControlError> {
    let frame = shared.envelope(peer, Body::Message(shared.codec.encode(msg)?))?;
    let inbox = shared.remote_inbox(peer).ok_or_else(|| ControlError::NoPeer(peer.to_string()))?;
    {
        let mut peers = shared.peers.lock().expect("peers lock");
        let p = peers.entry(peer.to_string()).or_insert_with(|| PeerState::new(""));
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
