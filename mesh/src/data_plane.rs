//! The data plane: bulk messages (trajectory groups, scored groups) between
//! processes over ZeroMQ, never over the control channel.
//!
//! An [`Inbox`] binds a PULL socket and an [`Outbox`] connects a PUSH socket to
//! it; many outboxes may feed one inbox. Each socket lives on a dedicated OS
//! thread (libzmq sockets are not thread-safe, and no tensor or socket work
//! runs on tokio's workers) and is bridged to the actors by a bounded tokio
//! channel, so every queue is bounded end to end:
//!
//! - the caller's channel to the sending thread ([`DataPlaneConfig::queue`]);
//! - libzmq's send and receive queues (high-water marks,
//!   [`DataPlaneConfig::high_water_mark`]): a full queue blocks the sender
//!   instead of growing memory;
//! - the receiving thread's channel to the consumer (`queue` again).
//!
//! Every message is a [`frame`](crate::frame) carrying the rlmesh version and a
//! MAC keyed by the run's cookie. A frame that fails any check — garbage, a
//! peer of another version, a peer without the cookie, a frame over the cap —
//! is refused, counted by reason in [`DataPlaneStats`] and named in the log
//! with the peer's address, and the inbox keeps running. libzmq's own
//! `ZMQ_MAXMSGSIZE` is set to twice the cap plus the header: a peer that sends
//! more than that has its connection cut by libzmq before anything is
//! allocated (those never reach the counters).
use crate::frame::{FrameCodec, FrameError, WireMessage, HEADER_BYTES, REFUSAL_REASONS};
use std::marker::PhantomData;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// Socket and queue settings.
#[derive(Clone, Debug)]
pub struct DataPlaneConfig {
    /// libzmq's send/receive high-water mark, in messages.
    pub high_water_mark: i32,
    /// The bound channel between an actor and its socket thread, in messages.
    pub queue: usize,
    /// How often a socket thread looks at its stop flag.
    pub poll: Duration,
    /// How long a closing outbox keeps trying to deliver queued frames.
    pub linger: Duration,
    /// ZMTP heartbeat interval: a silent TCP peer is dropped after `3 ×` this.
    pub heartbeat: Duration,
}

impl Default for DataPlaneConfig {
    fn default() -> Self {
        DataPlaneConfig { high_water_mark: 64, queue: 64, poll: Duration::from_millis(50), linger: Duration::from_secs(2), heartbeat: Duration::from_secs(2) }
    }
}

/// Why a data-plane call failed.
#[derive(Debug, thiserror::Error)]
pub enum DataPlaneError {
    /// libzmq refused a socket call.
    #[error("{endpoint}: {what}: {source}")]
    Zmq {
        /// The endpoint.
        endpoint: String,
        /// The call.
        what: &'static str,
        /// libzmq's error.
        source: zmq::Error,
    },
    /// The socket thread could not be started.
    #[error("starting a data-plane socket thread: {0}")]
    Thread(std::io::Error),
    /// The message could not be framed (e.g. over the cap).
    #[error(transparent)]
    Frame(#[from] FrameError),
    /// The socket thread has stopped.
    #[error("{endpoint}: the data-plane socket is closed")]
    Closed {
        /// The endpoint.
        endpoint: String,
    },
    /// The bounded queue is full (only from `try_send`).
    #[error("{endpoint}: the send queue is full ({capacity} messages)")]
    Full {
        /// The endpoint.
        endpoint: String,
        /// Its capacity.
        capacity: usize,
    },
}

/// Counters of one socket: delivered messages and refused frames by reason.
#[derive(Debug, Default)]
pub struct DataPlaneStats {
    delivered: AtomicU64,
    refused: [AtomicU64; REFUSAL_REASONS.len()],
    /// When each reason was last logged, and how many refusals went unlogged since.
    logged: std::sync::Mutex<[(Option<Instant>, u64); REFUSAL_REASONS.len()]>,
}

/// A refusal reason is logged at most once per this interval (with a count of the ones in between).
const LOG_EVERY: Duration = Duration::from_secs(10);

impl DataPlaneStats {
    /// Messages delivered (inbox) or sent (outbox).
    pub fn delivered(&self) -> u64 {
        self.delivered.load(Ordering::Relaxed)
    }

    /// Frames refused for `reason` (one of [`REFUSAL_REASONS`]).
    pub fn refused(&self, reason: &str) -> u64 {
        REFUSAL_REASONS.iter().position(|r| *r == reason).map_or(0, |i| self.refused[i].load(Ordering::Relaxed))
    }

    /// Every refusal counter, by reason.
    pub fn refusals(&self) -> Vec<(&'static str, u64)> {
        REFUSAL_REASONS.iter().zip(&self.refused).map(|(r, c)| (*r, c.load(Ordering::Relaxed))).collect()
    }

    pub(crate) fn delivered_one(&self) {
        self.delivered.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a refused frame and logs it (`what` names the place and the peer), at most once per reason per 10 s.
    pub(crate) fn refuse(&self, e: &FrameError, what: impl FnOnce() -> String) {
        self.count(e.reason(), || format!("{} ({}): {e}", what(), e.reason()));
    }

    /// Counts input refused for `reason` (one of [`REFUSAL_REASONS`]; others are
    /// ignored) and logs `what` (the place, the peer and why), at most once per
    /// reason per 10 s. The process goes on serving.
    pub fn reject(&self, reason: &str, what: impl FnOnce() -> String) {
        self.count(reason, || format!("{} ({reason})", what()));
    }

    fn count(&self, reason: &str, line: impl FnOnce() -> String) {
        let Some(i) = REFUSAL_REASONS.iter().position(|r| *r == reason) else { return };
        self.refused[i].fetch_add(1, Ordering::Relaxed);
        let mut logged = self.logged.lock().expect("log lock");
        let (last, skipped) = &mut logged[i];
        if last.is_some_and(|t| t.elapsed() < LOG_EVERY) {
            *skipped += 1;
            return;
        }
        let more = if *skipped > 0 { format!(" ({} more like it since the last line)", *skipped) } else { String::new() };
        eprintln!("{}{more}", line());
        *last = Some(Instant::now());
        *skipped = 0;
    }
}

fn zerr<'a>(endpoint: &'a str, what: &'static str) -> impl FnOnce(zmq::Error) -> DataPlaneError + 'a {
    move |source| DataPlaneError::Zmq { endpoint: endpoint.to_string(), what, source }
}

fn ms(d: Duration) -> i32 {
    d.as_millis().min(i32::MAX as u128) as i32
}

fn socket(kind: zmq::SocketType, endpoint: &str, codec: &FrameCodec, cfg: &DataPlaneConfig) -> Result<zmq::Socket, DataPlaneError> {
    let ctx = zmq::Context::new();
    let s = ctx.socket(kind).map_err(zerr(endpoint, "socket"))?;
    let hard_cap = (codec.cap().saturating_mul(2).saturating_add(HEADER_BYTES as u64)).min(i64::MAX as u64) as i64;
    s.set_maxmsgsize(hard_cap).map_err(zerr(endpoint, "ZMQ_MAXMSGSIZE"))?;
    s.set_sndhwm(cfg.high_water_mark).map_err(zerr(endpoint, "ZMQ_SNDHWM"))?;
    s.set_rcvhwm(cfg.high_water_mark).map_err(zerr(endpoint, "ZMQ_RCVHWM"))?;
    s.set_rcvtimeo(ms(cfg.poll)).map_err(zerr(endpoint, "ZMQ_RCVTIMEO"))?;
    s.set_sndtimeo(ms(cfg.poll)).map_err(zerr(endpoint, "ZMQ_SNDTIMEO"))?;
    s.set_linger(ms(cfg.linger)).map_err(zerr(endpoint, "ZMQ_LINGER"))?;
    s.set_heartbeat_ivl(ms(cfg.heartbeat)).map_err(zerr(endpoint, "ZMQ_HEARTBEAT_IVL"))?;
    s.set_heartbeat_timeout(ms(cfg.heartbeat * 3)).map_err(zerr(endpoint, "ZMQ_HEARTBEAT_TIMEOUT"))?;
    Ok(s)
}

/// The receiving end: a bound PULL socket delivering decoded messages of type `M`.
pub struct Inbox<M: WireMessage> {
    rx: mpsc::Receiver<M>,
    endpoint: String,
    stats: Arc<DataPlaneStats>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl<M: WireMessage> Inbox<M> {
    /// Binds `endpoint` (e.g. `tcp://0.0.0.0:29600`, or port 0 for an ephemeral one).
    pub fn bind(endpoint: &str, codec: FrameCodec, cfg: &DataPlaneConfig) -> Result<Inbox<M>, DataPlaneError> {
        let s = socket(zmq::PULL, endpoint, &codec, cfg)?;
        s.bind(endpoint).map_err(zerr(endpoint, "bind"))?;
        let bound = s.get_last_endpoint().map_err(zerr(endpoint, "ZMQ_LAST_ENDPOINT"))?.unwrap_or_else(|_| endpoint.to_string());
        let (tx, rx) = mpsc::channel(cfg.queue.max(1));
        let stats = Arc::new(DataPlaneStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp, ep) = (stats.clone(), stop.clone(), bound.clone());
        let thread = std::thread::Builder::new()
            .name(format!("inbox-{}", M::NAME))
            .spawn(move || receive_loop::<M>(s, codec, tx, st, sp, ep))
            .map_err(DataPlaneError::Thread)?;
        Ok(Inbox { rx, endpoint: bound, stats, stop, thread: Some(thread) })
    }

    /// The endpoint actually bound (with the ephemeral port resolved).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// Its counters.
    pub fn stats(&self) -> Arc<DataPlaneStats> {
        self.stats.clone()
    }

    /// The next message (`None` once the socket thread has stopped).
    pub async fn recv(&mut self) -> Option<M> {
        self.rx.recv().await
    }

    /// The next message within `timeout`, from a thread outside the async runtime.
    pub fn recv_timeout(&mut self, timeout: Duration) -> Option<M> {
        let t0 = Instant::now();
        loop {
            match self.rx.try_recv() {
                Ok(m) => return Some(m),
                Err(mpsc::error::TryRecvError::Disconnected) => return None,
                Err(mpsc::error::TryRecvError::Empty) if t0.elapsed() >= timeout => return None,
                Err(mpsc::error::TryRecvError::Empty) => std::thread::sleep(Duration::from_millis(1)),
            }
        }
    }
}

impl<M: WireMessage> Drop for Inbox<M> {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        self.rx.close();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn receive_loop<M: WireMessage>(s: zmq::Socket, codec: FrameCodec, tx: mpsc::Sender<M>, stats: Arc<DataPlaneStats>, stop: Arc<AtomicBool>, endpoint: String) {
    while !stop.load(Ordering::Relaxed) {
        let mut msg = match s.recv_msg(0) {
            Ok(m) => m,
            Err(zmq::Error::EAGAIN) | Err(zmq::Error::EINTR) => continue,
            Err(e) => {
                eprintln!("[data-plane] {endpoint}: receive failed ({e}); inbox for {} stops", M::NAME);
                return;
            }
        };
        match codec.decode::<M>(&msg) {
            Ok(m) => {
                stats.delivered.fetch_add(1, Ordering::Relaxed);
                // A full queue waits here, so libzmq's queue and then the senders' block.
                let mut pending = Some(m);
                while let Some(m) = pending.take() {
                    match tx.try_send(m) {
                        Ok(()) => {}
                        Err(mpsc::error::TrySendError::Full(m)) if !stop.load(Ordering::Relaxed) => {
                            std::thread::sleep(Duration::from_millis(1));
                            pending = Some(m);
                        }
                        Err(_) => return,
                    }
                }
            }
            Err(e) => {
                let len = msg.len();
                let peer = msg.gets("Peer-Address").unwrap_or("unknown peer").to_string();
                stats.refuse(&e, || format!("[data-plane] {endpoint}: refused a {len}-byte frame from {peer}"));
            }
        }
    }
}

/// The sending end: a PUSH socket connected to an [`Inbox`].
pub struct Outbox<M: WireMessage> {
    tx: Option<mpsc::Sender<Vec<u8>>>,
    codec: FrameCodec,
    endpoint: String,
    capacity: usize,
    stats: Arc<DataPlaneStats>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    _m: PhantomData<fn(M)>,
}

impl<M: WireMessage> Outbox<M> {
    /// Connects to an inbox at `endpoint` (libzmq reconnects by itself if the peer restarts).
    pub fn connect(endpoint: &str, codec: FrameCodec, cfg: &DataPlaneConfig) -> Result<Outbox<M>, DataPlaneError> {
        let s = socket(zmq::PUSH, endpoint, &codec, cfg)?;
        s.connect(endpoint).map_err(zerr(endpoint, "connect"))?;
        let capacity = cfg.queue.max(1);
        let (tx, rx) = mpsc::channel(capacity);
        let stats = Arc::new(DataPlaneStats::default());
        let stop = Arc::new(AtomicBool::new(false));
        let (st, sp, ep, linger) = (stats.clone(), stop.clone(), endpoint.to_string(), cfg.linger);
        let thread = std::thread::Builder::new()
            .name(format!("outbox-{}", M::NAME))
            .spawn(move || send_loop(s, rx, st, sp, ep, linger))
            .map_err(DataPlaneError::Thread)?;
        Ok(Outbox { tx: Some(tx), codec, endpoint: endpoint.to_string(), capacity, stats, stop, thread: Some(thread), _m: PhantomData })
    }

    /// Its counters.
    pub fn stats(&self) -> Arc<DataPlaneStats> {
        self.stats.clone()
    }

    fn sender(&self) -> &mpsc::Sender<Vec<u8>> {
        self.tx.as_ref().expect("open until dropped")
    }

    /// Queues a message, waiting while the queue is full.
    pub async fn send(&self, msg: &M) -> Result<(), DataPlaneError> {
        let frame = self.codec.encode(msg)?;
        self.sender().send(frame).await.map_err(|_| DataPlaneError::Closed { endpoint: self.endpoint.clone() })
    }

    /// Queues a message from a thread outside the async runtime, waiting while the queue is full.
    pub fn blocking_send(&self, msg: &M) -> Result<(), DataPlaneError> {
        let frame = self.codec.encode(msg)?;
        self.sender().blocking_send(frame).map_err(|_| DataPlaneError::Closed { endpoint: self.endpoint.clone() })
    }

    /// Queues a message, or says the queue is full.
    pub fn try_send(&self, msg: &M) -> Result<(), DataPlaneError> {
        let frame = self.codec.encode(msg)?;
        self.sender().try_send(frame).map_err(|e| match e {
            mpsc::error::TrySendError::Full(_) => DataPlaneError::Full { endpoint: self.endpoint.clone(), capacity: self.capacity },
            mpsc::error::TrySendError::Closed(_) => DataPlaneError::Closed { endpoint: self.endpoint.clone() },
        })
    }
}

impl<M: WireMessage> Drop for Outbox<M> {
    /// Closes the queue; the socket thread delivers what is queued for up to the linger time.
    fn drop(&mut self) {
        drop(self.tx.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn send_loop(s: zmq::Socket, mut rx: mpsc::Receiver<Vec<u8>>, stats: Arc<DataPlaneStats>, stop: Arc<AtomicBool>, endpoint: String, linger: Duration) {
    let mut closing_since: Option<Instant> = None;
    while let Some(frame) = rx.blocking_recv() {
        loop {
            match s.send(&frame[..], 0) {
                Ok(()) => {
                    stats.delivered.fetch_add(1, Ordering::Relaxed);
                    break;
                }
                // The high-water mark is reached (the peer is slow or away): wait, bounded.
                Err(zmq::Error::EAGAIN) | Err(zmq::Error::EINTR) => {
                    if stop.load(Ordering::Relaxed) || rx.is_closed() {
                        let since = *closing_since.get_or_insert_with(Instant::now);
                        if since.elapsed() >= linger {
                            eprintln!("[data-plane] {endpoint}: closing with undelivered frames (peer not reading)");
                            return;
                        }
                    }
                }
                Err(e) => {
                    eprintln!("[data-plane] {endpoint}: send failed ({e}); outbox stops");
                    return;
                }
            }
        }
    }
}
