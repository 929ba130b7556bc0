//! The CPU ring's wire messages, defined in one place: the handshake
//! ([`Hello`] and its reply), the rendezvous ring table, and the 24-byte
//! header that opens every collective. All integers little-endian.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::error::CommError;

/// First bytes of every handshake: "RLMC".
pub const MAGIC: [u8; 4] = *b"RLMC";
/// Version of this wire protocol; peers with another version are refused.
pub const PROTOCOL_VERSION: u16 = 1;
/// Longest cookie accepted (bytes); longer frames are refused, not read.
pub const MAX_COOKIE: usize = 1024;
/// Longest refusal reason or address string read from a peer.
const MAX_TEXT: usize = 4096;

/// Why a connection is made.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A rank registers its ring port with rank 0.
    Register = 1,
    /// A rank opens its ring link to the next rank.
    Ring = 2,
}

/// The handshake each side sends: who it is and the shared cookie.
#[derive(Debug, Clone)]
pub struct Hello {
    /// Why this connection is made.
    pub purpose: Purpose,
    /// World size the sender was started with.
    pub world: u32,
    /// Sender's rank.
    pub rank: u32,
    /// Sender's ring listener port (registration only, else 0).
    pub port: u16,
    /// The shared secret.
    pub cookie: Vec<u8>,
}

/// Maps a socket error to the crate error, naming the peer and the activity.
pub fn io_error(rank: usize, peer: usize, what: &str, e: io::Error, timeout: Duration) -> CommError {
    match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => CommError::Timeout {
            rank,
            peer,
            what: what.to_string(),
            timeout,
        },
        io::ErrorKind::UnexpectedEof
        | io::ErrorKind::ConnectionReset
        | io::ErrorKind::ConnectionAborted
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::NotConnected => CommError::PeerClosed {
            rank,
            peer,
            what: what.to_string(),
        },
        _ => CommError::Io {
            rank,
            peer,
            what: what.to_string(),
            source: e,
        },
    }
}

impl Hello {
    /// Encodes and sends.
    pub fn write_to(&self, w: &mut impl Write) -> io::Result<()> {
        let mut b = Vec::with_capacity(20 + self.cookie.len());
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        b.push(self.purpose as u8);
        b.extend_from_slice(&self.world.to_le_bytes());
        b.extend_from_slice(&self.rank.to_le_bytes());
        b.extend_from_slice(&self.port.to_le_bytes());
        b.extend_from_slice(&(self.cookie.len() as u16).to_le_bytes());
        b.extend_from_slice(&self.cookie);
        w.write_all(&b)
    }

    /// Reads one hello. `Ok(Err(reason))` for a well-formed frame that is not
    /// ours (bad magic, other protocol version, oversized cookie).
    pub fn read_from(r: &mut impl Read) -> io::Result<Result<Hello, String>> {
        let mut head = [0u8; 6];
        r.read_exact(&mut head)?;
        if head[..4] != MAGIC {
            return Ok(Err(format!(
                "not an rlmesh-comm peer (first bytes {:02x?}, expected {:02x?})",
                &head[..4],
                MAGIC
            )));
        }
        let version = u16::from_le_bytes([head[4], head[5]]);
        if version != PROTOCOL_VERSION {
            return Ok(Err(format!(
                "protocol version {version}, this rank speaks version {PROTOCOL_VERSION}"
            )));
        }
        let mut rest = [0u8; 13];
        r.read_exact(&mut rest)?;
        let purpose = match rest[0] {
            1 => Purpose::Register,
            2 => Purpose::Ring,
            p => return Ok(Err(format!("unknown connection purpose {p}"))),
        };
        let world = u32::from_le_bytes(rest[1..5].try_into().unwrap());
        let rank = u32::from_le_bytes(rest[5..9].try_into().unwrap());
        let port = u16::from_le_bytes(rest[9..11].try_into().unwrap());
        let cookie_len = u16::from_le_bytes(rest[11..13].try_into().unwrap()) as usize;
        if cookie_len > MAX_COOKIE {
            return Ok(Err(format!("cookie of {cookie_len} bytes exceeds the {MAX_COOKIE}-byte limit")));
        }
        let mut cookie = vec![0u8; cookie_len];
        r.read_exact(&mut cookie)?;
        Ok(Ok(Hello {
            purpose,
            world,
            rank,
            port,
            cookie,
        }))
    }
}

/// Compares cookies in time independent of where they differ.
pub fn cookie_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Writes a length-prefixed UTF-8 string.
pub fn write_text(w: &mut impl Write, s: &str) -> io::Result<()> {
    let b = s.as_bytes();
    let n = b.len().min(MAX_TEXT);
    w.write_all(&(n as u16).to_le_bytes())?;
    w.write_all(&b[..n])
}

/// Reads a length-prefixed UTF-8 string.
pub fn read_text(r: &mut impl Read) -> io::Result<String> {
    let mut n = [0u8; 2];
    r.read_exact(&mut n)?;
    let n = u16::from_le_bytes(n) as usize;
    if n > MAX_TEXT {
        return Err(io::Error::new(io::ErrorKind::InvalidData, "text frame too long"));
    }
    let mut b = vec![0u8; n];
    r.read_exact(&mut b)?;
    Ok(String::from_utf8_lossy(&b).into_owned())
}

/// Reply to a hello: accepted (followed by the acceptor's own hello) or refused with a reason.
pub fn write_verdict(w: &mut impl Write, refusal: Option<&str>) -> io::Result<()> {
    match refusal {
        None => w.write_all(&[0u8]),
        Some(reason) => {
            w.write_all(&[1u8])?;
            write_text(w, reason)
        }
    }
}

/// Reads a verdict: `Ok(None)` accepted, `Ok(Some(reason))` refused.
pub fn read_verdict(r: &mut impl Read) -> io::Result<Option<String>> {
    let mut v = [0u8; 1];
    r.read_exact(&mut v)?;
    match v[0] {
        0 => Ok(None),
        1 => read_text(r).map(Some),
        other => Ok(Some(format!("malformed verdict byte {other}"))),
    }
}

/// The ring table rank 0 hands out: every rank's ring listener address.
pub fn write_table(w: &mut impl Write, addrs: &[SocketAddr]) -> io::Result<()> {
    w.write_all(&(addrs.len() as u32).to_le_bytes())?;
    for a in addrs {
        write_text(w, &a.to_string())?;
    }
    Ok(())
}

/// Reads the ring table.
pub fn read_table(r: &mut impl Read, world: usize) -> io::Result<Vec<SocketAddr>> {
    let mut n = [0u8; 4];
    r.read_exact(&mut n)?;
    let n = u32::from_le_bytes(n) as usize;
    if n != world {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("ring table has {n} entries, expected {world}"),
        ));
    }
    (0..n)
        .map(|_| {
            let s = read_text(r)?;
            s.parse()
                .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("bad address {s:?}: {e}")))
        })
        .collect()
}

/// Which collective a header announces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// All-reduce.
    AllReduce = 1,
    /// Broadcast.
    Broadcast = 2,
    /// Reduce-scatter.
    ReduceScatter = 3,
    /// All-gather.
    AllGather = 4,
    /// Barrier.
    Barrier = 5,
    /// Broadcast of raw bytes (`RingComm::broadcast_bytes_with`; `len` counts bytes).
    BroadcastBytes = 6,
}

/// The header each rank sends its next rank before a collective's data, so
/// that mismatched calls are caught instead of mixing up bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpHeader {
    /// The collective.
    pub op: u8,
    /// Element type code.
    pub dtype: u8,
    /// Reduce op code (0 when none).
    pub reduce: u8,
    /// Broadcast root (0 when none).
    pub root: u32,
    /// Element count.
    pub len: u64,
    /// Sequence number of this collective on the communicator.
    pub seq: u64,
}

/// Byte length of an encoded [`OpHeader`].
pub const HEADER_LEN: usize = 24;

impl OpHeader {
    /// Encodes to 24 bytes.
    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0] = 0xC0;
        b[1] = self.op;
        b[2] = self.dtype;
        b[3] = self.reduce;
        b[4..8].copy_from_slice(&self.root.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..24].copy_from_slice(&self.seq.to_le_bytes());
        b
    }

    /// Decodes; `None` when the marker byte is wrong (the streams are out of step).
    pub fn decode(b: &[u8; HEADER_LEN]) -> Option<OpHeader> {
        if b[0] != 0xC0 {
            return None;
        }
        Some(OpHeader {
            op: b[1],
            dtype: b[2],
            reduce: b[3],
            root: u32::from_le_bytes(b[4..8].try_into().unwrap()),
            len: u64::from_le_bytes(b[8..16].try_into().unwrap()),
            seq: u64::from_le_bytes(b[16..24].try_into().unwrap()),
        })
    }

    /// Human-readable form for mismatch errors.
    pub fn describe(&self) -> String {
        let op = match self.op {
            1 => "all_reduce",
            2 => "broadcast",
            3 => "reduce_scatter",
            4 => "all_gather",
            5 => "barrier",
            6 => "broadcast",
            _ => "unknown op",
        };
        let dtype = match self.op {
            6 => "bytes",
            _ => crate::buffer::DType::from_code(self.dtype).map(|d| d.name()).unwrap_or("?"),
        };
        let mut s = format!("#{} {op} of {} {dtype}", self.seq, self.len);
        match (self.op, self.reduce) {
            (2 | 6, _) => s.push_str(&format!(" from root {}", self.root)),
            (_, 1) => s.push_str(" (sum)"),
            (_, 2) => s.push_str(" (mean)"),
            _ => {}
        }
        s
    }
}

/// Sets the options every ring socket gets: no Nagle delay, bounded reads and writes.
pub fn tune(stream: &TcpStream, timeout: Duration) -> io::Result<()> {
    stream.set_nodelay(true)?;
    stream.set_read_timeout(Some(timeout))?;
    stream.set_write_timeout(Some(timeout))
}
