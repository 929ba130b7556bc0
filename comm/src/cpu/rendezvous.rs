//! Rendezvous: rank 0 listens on the agreed address, every other rank
//! registers the port of its own ring listener there, rank 0 hands out the
//! table of ring addresses, and each rank links to its next rank and accepts
//! its previous one. Every connection starts with a two-way [`Hello`]
//! (magic, protocol version, world size, rank, cookie): a wrong peer is
//! refused with the reason, and both sides can name it.

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::{Duration, Instant};

use super::wire::{self, Hello, Purpose};
use super::RingConfig;
use crate::error::{CommError, Result};

/// The two links of one rank in the ring.
pub(crate) struct RingLinks {
    /// Connection to rank `(rank + 1) % world` (we write to it).
    pub next: TcpStream,
    /// Connection from rank `(rank + world - 1) % world` (we read from it).
    pub prev: TcpStream,
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(50))
}

/// Resolves `host:port` to one socket address.
pub(crate) fn resolve(rank: usize, addr: &str) -> Result<SocketAddr> {
    addr.to_socket_addrs()
        .map_err(|e| CommError::Rendezvous {
            rank,
            addr: addr.to_string(),
            reason: format!("cannot resolve address: {e}"),
        })?
        .next()
        .ok_or_else(|| CommError::Rendezvous {
            rank,
            addr: addr.to_string(),
            reason: "address resolves to nothing".into(),
        })
}

/// Checks a peer's hello against this rank's configuration.
fn check_hello(cfg: &RingConfig, h: &Hello, purpose: Purpose, expected_rank: Option<usize>) -> std::result::Result<(), String> {
    if !wire::cookie_eq(&h.cookie, cfg.cookie.as_bytes()) {
        return Err("cookie mismatch (the peer was started with a different shared cookie)".into());
    }
    if h.purpose != purpose {
        return Err(format!("unexpected connection purpose {:?}, expected {purpose:?}", h.purpose));
    }
    if h.world as usize != cfg.world {
        return Err(format!("peer runs with world size {}, this rank with {}", h.world, cfg.world));
    }
    if h.rank as usize >= cfg.world {
        return Err(format!("peer claims rank {} outside 0..{}", h.rank, cfg.world));
    }
    if let Some(r) = expected_rank {
        if h.rank as usize != r {
            return Err(format!("peer claims rank {}, expected rank {r}", h.rank));
        }
    }
    Ok(())
}

fn hello(cfg: &RingConfig, purpose: Purpose, port: u16) -> Hello {
    Hello {
        purpose,
        world: cfg.world as u32,
        rank: cfg.rank as u32,
        port,
        cookie: cfg.cookie.as_bytes().to_vec(),
    }
}

/// Connector side, first half: connect (retrying while the listener is not
/// up yet) and send our hello. The reply is read by [`finish_greeting`], so
/// that a rank can serve its own acceptor in between (the ring links are
/// made by every rank at once).
fn connect_and_hello(cfg: &RingConfig, target: SocketAddr, purpose: Purpose, port: u16, expected_rank: usize, deadline: Instant) -> Result<TcpStream> {
    let mut stream = loop {
        match TcpStream::connect_timeout(&target, remaining(deadline).min(Duration::from_secs(2))) {
            Ok(s) => break s,
            Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => {
                return Err(CommError::Rendezvous {
                    rank: cfg.rank,
                    addr: target.to_string(),
                    reason: format!("could not connect to rank {expected_rank} within {:?}: {e}", cfg.connect_timeout),
                })
            }
        }
    };
    let io = |e: io::Error| wire::io_error(cfg.rank, expected_rank, "sending the handshake to", e, cfg.connect_timeout);
    wire::tune(&stream, remaining(deadline)).map_err(io)?;
    hello(cfg, purpose, port).write_to(&mut stream).map_err(io)?;
    Ok(stream)
}

/// Connector side, second half: read the verdict and the acceptor's hello, check it.
fn finish_greeting(cfg: &RingConfig, mut stream: TcpStream, purpose: Purpose, expected_rank: usize, deadline: Instant) -> Result<TcpStream> {
    let peer_name = match stream.peer_addr() {
        Ok(a) => format!("rank {expected_rank} at {a}"),
        Err(_) => format!("rank {expected_rank}"),
    };
    let io = |e: io::Error| match e.kind() {
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => CommError::Rendezvous {
            rank: cfg.rank,
            addr: peer_name.clone(),
            reason: format!("no handshake reply from rank {expected_rank} within {:?}", cfg.connect_timeout),
        },
        _ => wire::io_error(cfg.rank, expected_rank, "waiting for the handshake reply of", e, cfg.connect_timeout),
    };
    stream.set_read_timeout(Some(remaining(deadline))).map_err(io)?;
    if let Some(reason) = wire::read_verdict(&mut stream).map_err(io)? {
        return Err(CommError::Refused { rank: cfg.rank, peer: peer_name, reason });
    }
    let theirs = match Hello::read_from(&mut stream).map_err(io)? {
        Ok(h) => h,
        Err(reason) => return Err(CommError::Refused { rank: cfg.rank, peer: peer_name, reason }),
    };
    check_hello(cfg, &theirs, purpose, Some(expected_rank)).map_err(|reason| CommError::Refused {
        rank: cfg.rank,
        peer: peer_name,
        reason,
    })?;
    Ok(stream)
}

/// Acceptor side: accept connections until one passes the handshake for
/// `purpose` (and `expected_rank`, if given). Wrong peers are refused and
/// remembered for the timeout error.
struct Acceptor<'a> {
    cfg: &'a RingConfig,
    listener: &'a TcpListener,
    refusals: Vec<String>,
}

impl<'a> Acceptor<'a> {
    fn new(cfg: &'a RingConfig, listener: &'a TcpListener) -> io::Result<Self> {
        listener.set_nonblocking(true)?;
        Ok(Acceptor { cfg, listener, refusals: Vec::new() })
    }

    /// Next accepted, greeted connection: `(stream, peer address, their hello)`,
    /// or `None` at the deadline.
    fn accept(&mut self, purpose: Purpose, expected_rank: Option<usize>, deadline: Instant) -> Option<(TcpStream, SocketAddr, Hello)> {
        loop {
            match self.listener.accept() {
                Ok((mut s, peer)) => {
                    let _ = s.set_nonblocking(false);
                    if wire::tune(&s, remaining(deadline).min(Duration::from_secs(5))).is_err() {
                        continue;
                    }
                    let verdict = match Hello::read_from(&mut s) {
                        Ok(Ok(h)) => check_hello(self.cfg, &h, purpose, expected_rank).map(|_| h),
                        Ok(Err(reason)) => Err(reason),
                        Err(e) => Err(format!("handshake read failed: {e}")),
                    };
                    match verdict {
                        Ok(h) => {
                            let mine = hello(self.cfg, purpose, 0);
                            if wire::write_verdict(&mut s, None).and_then(|_| mine.write_to(&mut s)).is_ok() {
                                return Some((s, peer, h));
                            }
                            self.refusals.push(format!("{peer}: connection dropped during handshake"));
                        }
                        Err(reason) => {
                            let _ = wire::write_verdict(&mut s, Some(&reason));
                            self.refusals.push(format!("{peer}: {reason}"));
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::Interrupted => {
                    if Instant::now() >= deadline {
                        return None;
                    }
                    std::thread::sleep(Duration::from_millis(2));
                }
                Err(_) => {
                    if Instant::now() >= deadline {
                        return None;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
            }
        }
    }

    fn refusal_note(&self) -> String {
        if self.refusals.is_empty() {
            String::new()
        } else {
            format!("; refused {} connection(s): {}", self.refusals.len(), self.refusals.join("; "))
        }
    }
}

/// Runs the rendezvous for `cfg` (world size ≥ 2) and returns this rank's ring links.
pub(crate) fn rendezvous(cfg: &RingConfig) -> Result<RingLinks> {
    let rank = cfg.rank;
    let world = cfg.world;
    let deadline = Instant::now() + cfg.connect_timeout;
    let root = resolve(rank, &cfg.addr)?;
    let rdv_err = |reason: String| CommError::Rendezvous {
        rank,
        addr: cfg.addr.clone(),
        reason,
    };

    // Our own ring listener: on this host's address when the caller knows it;
    // else on loopback when the rendezvous is on loopback, else on every
    // interface (the handshake keeps strangers out).
    let bind_ip = if let Some(ip) = cfg.bind {
        ip
    } else if root.ip().is_loopback() {
        root.ip()
    } else if root.is_ipv4() {
        IpAddr::V4(Ipv4Addr::UNSPECIFIED)
    } else {
        IpAddr::V6(Ipv6Addr::UNSPECIFIED)
    };
    let ring_listener = TcpListener::bind((bind_ip, 0)).map_err(|e| rdv_err(format!("cannot open ring listener: {e}")))?;
    let ring_port = ring_listener.local_addr().map_err(|e| rdv_err(e.to_string()))?.port();

    let table: Vec<SocketAddr> = if rank == 0 {
        let listener = match &cfg.root_listener {
            Some(l) => l.try_clone().map_err(|e| rdv_err(format!("rank 0 cannot use its given listener: {e}")))?,
            None => TcpListener::bind(root).map_err(|e| rdv_err(format!("rank 0 cannot listen: {e}")))?,
        };
        let mut acceptor = Acceptor::new(cfg, &listener).map_err(|e| rdv_err(e.to_string()))?;
        let mut registered: Vec<Option<(TcpStream, SocketAddr)>> = (0..world).map(|_| None).collect();
        let mut my_ip = if root.ip().is_unspecified() { None } else { Some(root.ip()) };
        let mut missing = world - 1;
        while missing > 0 {
            let Some((stream, peer, h)) = acceptor.accept(Purpose::Register, None, deadline) else {
                let absent: Vec<String> = (1..world).filter(|r| registered[*r].is_none()).map(|r| r.to_string()).collect();
                return Err(rdv_err(format!(
                    "rank(s) {} of world {world} did not register within {:?}{}",
                    absent.join(", "),
                    cfg.connect_timeout,
                    acceptor.refusal_note()
                )));
            };
            let r = h.rank as usize;
            if r == 0 || registered[r].is_some() {
                acceptor.refusals.push(format!("{peer}: duplicate registration for rank {r}"));
                continue;
            }
            if my_ip.is_none() {
                my_ip = stream.local_addr().ok().map(|a| a.ip());
            }
            registered[r] = Some((stream, SocketAddr::new(peer.ip(), h.port)));
            missing -= 1;
        }
        let my_ip = my_ip.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
        let table: Vec<SocketAddr> = (0..world)
            .map(|r| match &registered[r] {
                None => SocketAddr::new(my_ip, ring_port),
                Some((_, a)) => *a,
            })
            .collect();
        for (r, slot) in registered.iter_mut().enumerate().skip(1) {
            let (stream, _) = slot.as_mut().expect("all registered");
            wire::write_table(stream, &table)
                .map_err(|e| wire::io_error(rank, r, "sending the ring table to", e, cfg.connect_timeout))?;
        }
        table
    } else {
        let control = connect_and_hello(cfg, root, Purpose::Register, ring_port, 0, deadline)?;
        let mut control = finish_greeting(cfg, control, Purpose::Register, 0, deadline)?;
        control
            .set_read_timeout(Some(remaining(deadline)))
            .map_err(|e| rdv_err(e.to_string()))?;
        wire::read_table(&mut control, world).map_err(|e| match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => rdv_err(format!(
                "rank 0 did not send the ring table within {:?} (are all {world} ranks started?)",
                cfg.connect_timeout
            )),
            _ => wire::io_error(rank, 0, "reading the ring table from", e, cfg.connect_timeout),
        })?
    };

    // Link the ring: every rank connects forward and sends its hello (the
    // peer's listen backlog and socket buffer hold both), then greets the
    // rank behind it, then reads the reply from the rank ahead.
    let next_rank = (rank + 1) % world;
    let prev_rank = (rank + world - 1) % world;
    let next = connect_and_hello(cfg, table[next_rank], Purpose::Ring, 0, next_rank, deadline)?;
    let mut acceptor = Acceptor::new(cfg, &ring_listener).map_err(|e| rdv_err(e.to_string()))?;
    let Some((prev, _, _)) = acceptor.accept(Purpose::Ring, Some(prev_rank), deadline) else {
        return Err(rdv_err(format!(
            "rank {prev_rank} did not link to this rank within {:?}{}",
            cfg.connect_timeout,
            acceptor.refusal_note()
        )));
    };
    let next = finish_greeting(cfg, next, Purpose::Ring, next_rank, deadline)?;
    wire::tune(&next, cfg.timeout).map_err(|e| wire::io_error(rank, next_rank, "configuring the link to", e, cfg.timeout))?;
    wire::tune(&prev, cfg.timeout).map_err(|e| wire::io_error(rank, prev_rank, "configuring the link from", e, cfg.timeout))?;
    Ok(RingLinks { next, prev })
}
