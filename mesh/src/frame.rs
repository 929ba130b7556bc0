//! Versioned, authenticated frames: the only thing that crosses a process
//! boundary on rlmesh's data plane.
//!
//! A frame is a fixed 48-byte header followed by a bincode payload:
//!
//! | bytes | field | |
//! |---|---|---|
//! | 0..4 | magic `RLMF` | not an rlmesh frame otherwise |
//! | 4..6 | wire protocol, little-endian | [`PROTOCOL`] |
//! | 6..8 | message kind | [`WireMessage::KIND`] |
//! | 8..24 | rlmesh version, ASCII, zero-padded | the sender's `CARGO_PKG_VERSION` |
//! | 24..32 | payload length | |
//! | 32..48 | MAC | BLAKE3 keyed with the run's cookie over bytes 0..32 and the payload, first 16 bytes |
//!
//! Decoding checks, in this order, the length, the magic, the protocol and
//! version, the kind, the declared length against the cap and the bytes
//! present, the MAC (a peer without the run's cookie is refused here), and only
//! then decodes the payload — with a bincode allocation limit, so a hostile
//! length prefix inside an authenticated payload is an error, not an abort.
//! Every failure is a [`FrameError`], never a panic.
use serde::de::DeserializeOwned;
use serde::Serialize;

/// The wire protocol of this build; a peer speaking another is refused.
pub const PROTOCOL: u16 = 1;
/// Header length in bytes.
pub const HEADER_BYTES: usize = 48;
const MAGIC: &[u8; 4] = b"RLMF";
const MAC_BYTES: usize = 16;
/// The most bytes a payload's length prefixes may claim while decoding (bincode's limit).
const DECODE_LIMIT: usize = 1 << 31;

/// A message type that travels in frames: one definition per wire message.
pub trait WireMessage: Serialize + DeserializeOwned + Send + 'static {
    /// Its kind number, unique across rlmesh's wire messages.
    const KIND: u16;
    /// Its name, for logs and errors.
    const NAME: &'static str;
}

/// Why a frame was refused.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    /// Shorter than a header, or fewer payload bytes than declared.
    #[error("truncated frame: {got} bytes, {need} needed")]
    Truncated {
        /// Bytes present.
        got: usize,
        /// Bytes the header requires.
        need: usize,
    },
    /// Does not start with rlmesh's magic.
    #[error("not an rlmesh frame (magic {found:02x?})")]
    NotRlmesh {
        /// The first bytes found.
        found: [u8; 4],
    },
    /// Another wire protocol or rlmesh version.
    #[error("peer speaks rlmesh {theirs} (wire protocol {their_protocol}); this is rlmesh {ours} (wire protocol {PROTOCOL})")]
    Version {
        /// The peer's version string.
        theirs: String,
        /// The peer's protocol.
        their_protocol: u16,
        /// Ours.
        ours: String,
    },
    /// Another message kind than the socket carries.
    #[error("unexpected message kind {got} (this socket carries {expected} = {name})")]
    Kind {
        /// Kind found.
        got: u16,
        /// Kind expected.
        expected: u16,
        /// Name of the expected message.
        name: &'static str,
    },
    /// Larger than the cap.
    #[error("frame of {bytes} bytes exceeds the cap of {cap} bytes")]
    TooLarge {
        /// Declared or actual payload size.
        bytes: u64,
        /// The cap.
        cap: u64,
    },
    /// More bytes than the header declares.
    #[error("frame carries {got} payload bytes, its header declares {declared}")]
    Length {
        /// Payload bytes present.
        got: usize,
        /// Declared.
        declared: u64,
    },
    /// The MAC does not match: the sender does not hold this run's cookie, or the bytes changed.
    #[error("frame not authenticated: wrong run cookie or corrupted bytes")]
    Unauthenticated,
    /// The payload does not decode as the message.
    #[error("{name} payload does not decode: {message}")]
    Payload {
        /// Message name.
        name: &'static str,
        /// Bincode's error.
        message: String,
    },
}

impl FrameError {
    /// A short stable label for counting refusals (`reason` label of a metric).
    pub fn reason(&self) -> &'static str {
        match self {
            FrameError::Truncated { .. } | FrameError::NotRlmesh { .. } | FrameError::Length { .. } => "malformed",
            FrameError::Version { .. } => "version",
            FrameError::Kind { .. } => "kind",
            FrameError::TooLarge { .. } => "too_large",
            FrameError::Unauthenticated => "unauthenticated",
            FrameError::Payload { .. } => "payload",
        }
    }
}

/// Every refusal reason [`FrameError::reason`] can give.
pub const FRAME_REFUSAL_REASONS: [&str; 6] = ["malformed", "version", "kind", "too_large", "unauthenticated", "payload"];

/// Every reason a peer's input is refused: the frame reasons, then
/// - `handshake`: a control session that never authenticated (a wrong cookie, or not rlmesh at all);
/// - `unexpected`: a valid message of a type the receiver does not take (here, or in its state);
/// - `unknown_peer`: a message from a name the run does not know;
/// - `duplicate`: a second process claiming a name (a rank) that a live process holds;
/// - `superseded`: a process the run has already replaced (started again) speaking up.
pub const REFUSAL_REASONS: [&str; 11] = ["malformed", "version", "kind", "too_large", "unauthenticated", "payload", "handshake", "unexpected", "unknown_peer", "duplicate", "superseded"];

fn bincode_config() -> impl bincode::config::Config {
    bincode::config::standard().with_fixed_int_encoding().with_limit::<DECODE_LIMIT>()
}

/// Encodes and decodes frames for one run (its cookie) and one rlmesh version.
#[derive(Clone)]
pub struct FrameCodec {
    key: [u8; 32],
    version: [u8; 16],
    cap: u64,
}

impl std::fmt::Debug for FrameCodec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrameCodec").field("version", &version_str(&self.version)).field("cap", &self.cap).finish_non_exhaustive()
    }
}

fn version_bytes(v: &str) -> [u8; 16] {
    let mut out = [0u8; 16];
    let b = v.as_bytes();
    let n = b.len().min(16);
    out[..n].copy_from_slice(&b[..n]);
    out
}

fn version_str(v: &[u8; 16]) -> String {
    let end = v.iter().position(|&b| b == 0).unwrap_or(16);
    String::from_utf8_lossy(&v[..end]).chars().map(|c| if c.is_control() { '?' } else { c }).collect()
}

impl FrameCodec {
    /// A codec for this build, keyed by the run's cookie, refusing payloads over `cap` bytes.
    pub fn new(cookie: &[u8], cap: u64) -> FrameCodec {
        Self::for_version(cookie, cap, env!("CARGO_PKG_VERSION"))
    }

    /// A codec that claims another rlmesh version (a peer of another build, in tests).
    pub fn for_version(cookie: &[u8], cap: u64, version: &str) -> FrameCodec {
        FrameCodec { key: blake3::derive_key("rlmesh data-plane frame MAC v1", cookie), version: version_bytes(version), cap }
    }

    /// The payload cap in bytes.
    pub fn cap(&self) -> u64 {
        self.cap
    }

    fn mac(&self, head: &[u8], payload: &[u8]) -> [u8; MAC_BYTES] {
        let mut h = blake3::Hasher::new_keyed(&self.key);
        h.update(head);
        h.update(payload);
        let mut out = [0u8; MAC_BYTES];
        out.copy_from_slice(&h.finalize().as_bytes()[..MAC_BYTES]);
        out
    }

    /// A frame of `kind` around raw payload bytes (already encoded).
    pub fn seal(&self, kind: u16, payload: &[u8]) -> Result<Vec<u8>, FrameError> {
        if payload.len() as u64 > self.cap {
            return Err(FrameError::TooLarge { bytes: payload.len() as u64, cap: self.cap });
        }
        let mut out = Vec::with_capacity(HEADER_BYTES + payload.len());
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&PROTOCOL.to_le_bytes());
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&self.version);
        out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
        let mac = self.mac(&out[..32], payload);
        out.extend_from_slice(&mac);
        out.extend_from_slice(payload);
        Ok(out)
    }

    /// Encodes a message into a frame.
    pub fn encode<M: WireMessage>(&self, msg: &M) -> Result<Vec<u8>, FrameError> {
        let payload = bincode::serde::encode_to_vec(msg, bincode_config()).map_err(|e| FrameError::Payload { name: M::NAME, message: e.to_string() })?;
        self.seal(M::KIND, &payload)
    }

    /// Checks a frame's header, length and MAC and returns its payload bytes.
    pub fn open<'a>(&self, frame: &'a [u8], kind: u16, name: &'static str) -> Result<&'a [u8], FrameError> {
        if frame.len() < HEADER_BYTES {
            return Err(FrameError::Truncated { got: frame.len(), need: HEADER_BYTES });
        }
        let magic: [u8; 4] = frame[0..4].try_into().expect("4 bytes");
        if &magic != MAGIC {
            return Err(FrameError::NotRlmesh { found: magic });
        }
        let protocol = u16::from_le_bytes([frame[4], frame[5]]);
        let their_version: [u8; 16] = frame[8..24].try_into().expect("16 bytes");
        if protocol != PROTOCOL || their_version != self.version {
            return Err(FrameError::Version { theirs: version_str(&their_version), their_protocol: protocol, ours: version_str(&self.version) });
        }
        let got_kind = u16::from_le_bytes([frame[6], frame[7]]);
        if got_kind != kind {
            return Err(FrameError::Kind { got: got_kind, expected: kind, name });
        }
        let declared = u64::from_le_bytes(frame[24..32].try_into().expect("8 bytes"));
        if declared > self.cap {
            return Err(FrameError::TooLarge { bytes: declared, cap: self.cap });
        }
        let payload = &frame[HEADER_BYTES..];
        if (payload.len() as u64) < declared {
            return Err(FrameError::Truncated { got: frame.len(), need: HEADER_BYTES + declared as usize });
        }
        if payload.len() as u64 > declared {
            return Err(FrameError::Length { got: payload.len(), declared });
        }
        let mac = self.mac(&frame[..32], payload);
        // Constant-time comparison: the MAC is a secret-dependent value.
        if mac.iter().zip(&frame[32..48]).fold(0u8, |acc, (a, b)| acc | (a ^ b)) != 0 {
            return Err(FrameError::Unauthenticated);
        }
        Ok(payload)
    }

    /// Decodes a frame into a message, checking everything first.
    pub fn decode<M: WireMessage>(&self, frame: &[u8]) -> Result<M, FrameError> {
        let payload = self.open(frame, M::KIND, M::NAME)?;
        let (msg, used) = bincode::serde::decode_from_slice(payload, bincode_config()).map_err(|e| FrameError::Payload { name: M::NAME, message: e.to_string() })?;
        if used != payload.len() {
            return Err(FrameError::Payload { name: M::NAME, message: format!("{} trailing bytes", payload.len() - used) });
        }
        Ok(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Probe {
        id: u64,
        tokens: Vec<u32>,
        logprobs: Vec<f32>,
        text: String,
    }
    impl WireMessage for Probe {
        const KIND: u16 = 0xfff0;
        const NAME: &'static str = "Probe";
    }

    fn probe() -> Probe {
        Probe { id: 7, tokens: (0..100).collect(), logprobs: vec![-0.5; 100], text: "ünïcode".into() }
    }

    #[test]
    fn a_frame_round_trips() {
        let c = FrameCodec::new(b"cookie", 1 << 20);
        let f = c.encode(&probe()).unwrap();
        assert_eq!(c.decode::<Probe>(&f).unwrap(), probe());
    }

    #[test]
    fn each_defect_is_refused_with_its_reason() {
        let c = FrameCodec::new(b"cookie", 1 << 20);
        let good = c.encode(&probe()).unwrap();
        let reason = |bytes: &[u8]| c.decode::<Probe>(bytes).unwrap_err().reason();
        assert_eq!(reason(&good[..10]), "malformed");
        assert_eq!(reason(&good[..good.len() - 1]), "malformed");
        let mut longer = good.clone();
        longer.push(0);
        assert_eq!(reason(&longer), "malformed");
        let mut magic = good.clone();
        magic[0] = b'X';
        assert_eq!(reason(&magic), "malformed");
        assert_eq!(reason(&FrameCodec::for_version(b"cookie", 1 << 20, "0.0.1").encode(&probe()).unwrap()), "version");
        assert_eq!(reason(&FrameCodec::new(b"another cookie", 1 << 20).encode(&probe()).unwrap()), "unauthenticated");
        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(reason(&flipped), "unauthenticated");
        assert_eq!(reason(&c.seal(1, b"x").unwrap()), "kind");
        let big = FrameCodec::new(b"cookie", 1 << 30).seal(Probe::KIND, &vec![0u8; (1 << 20) + 1]).unwrap();
        assert!(matches!(c.decode::<Probe>(&big).unwrap_err(), FrameError::TooLarge { bytes, cap } if bytes == (1 << 20) + 1 && cap == 1 << 20));
        // Authenticated but not a Probe: a length prefix claiming 2^60 elements.
        let mut hostile = vec![0u8; 8];
        hostile.extend_from_slice(&(1u64 << 60).to_le_bytes());
        assert_eq!(reason(&c.seal(Probe::KIND, &hostile).unwrap()), "payload");
        let e = c.decode::<Probe>(&FrameCodec::for_version(b"cookie", 1 << 20, "9.9.9").encode(&probe()).unwrap()).unwrap_err();
        assert_eq!(e.to_string(), format!("peer speaks rlmesh 9.9.9 (wire protocol 1); this is rlmesh {} (wire protocol 1)", env!("CARGO_PKG_VERSION")));
    }

    #[test]
    fn sealing_over_the_cap_is_refused_at_the_sender() {
        let c = FrameCodec::new(b"k", 16);
        assert!(matches!(c.seal(1, &[0u8; 17]), Err(FrameError::TooLarge { bytes: 17, cap: 16 })));
    }

    /// Random bytes and every single-byte mutation of good frames decode to an
    /// error or the message, never a panic.
    #[test]
    fn arbitrary_bytes_never_panic() {
        let c = FrameCodec::new(b"cookie", 1 << 16);
        let good = c.encode(&probe()).unwrap();
        let mut state = 0x1234_5678_9abc_def0u64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for _ in 0..2000 {
            let n = (next() % 600) as usize;
            let bytes: Vec<u8> = (0..n).map(|_| next() as u8).collect();
            let _ = c.decode::<Probe>(&bytes);
            let mut m = good.clone();
            let i = (next() as usize) % m.len();
            m[i] = next() as u8;
            let _ = c.decode::<Probe>(&m);
        }
        // Authenticated garbage payloads reach bincode and must still not panic.
        for _ in 0..2000 {
            let n = (next() % 64) as usize;
            let bytes: Vec<u8> = (0..n).map(|_| next() as u8).collect();
            let _ = c.decode::<Probe>(&c.seal(Probe::KIND, &bytes).unwrap());
        }
    }
}
