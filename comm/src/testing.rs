//! Fixtures for running a world of worker processes on loopback: used by the
//! integration tests and by [`crate::bench`].

use std::io::Read;
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::error::{CommError, Result};

/// How to start one worker process: a program and the arguments that come
/// before the worker's own flags (e.g. `["comm-worker"]` for a launcher subcommand).
#[derive(Debug, Clone)]
pub struct WorkerCommand {
    /// The executable.
    pub program: PathBuf,
    /// Arguments placed before the worker flags.
    pub prefix: Vec<String>,
}

impl WorkerCommand {
    /// A command running `program` with no prefix arguments.
    pub fn new(program: impl Into<PathBuf>) -> Self {
        WorkerCommand { program: program.into(), prefix: Vec::new() }
    }

    /// Adds a prefix argument (e.g. the launcher's worker subcommand).
    pub fn arg(mut self, a: impl Into<String>) -> Self {
        self.prefix.push(a.into());
        self
    }
}

/// A finished worker process.
#[derive(Debug)]
pub struct RankOutput {
    /// Its rank.
    pub rank: usize,
    /// Exit status (`None` when it was killed at the deadline).
    pub status: Option<ExitStatus>,
    /// Everything it printed on stdout.
    pub stdout: String,
    /// Everything it printed on stderr.
    pub stderr: String,
    /// Time from spawn to exit (or to the kill).
    pub elapsed: Duration,
}

impl RankOutput {
    /// True when the process exited with status 0.
    pub fn success(&self) -> bool {
        self.status.map(|s| s.success()).unwrap_or(false)
    }
}

/// A loopback address with a port that was free a moment ago.
///
/// Drawn below Linux's ephemeral range (32768–60999), so that it cannot be
/// taken meanwhile by the ring listeners of concurrently running workers,
/// which bind port 0.
pub fn free_loopback_addr() -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0)
        ^ ((std::process::id() as u64) << 32)
        ^ COUNTER.fetch_add(0x9e37_79b9, Ordering::Relaxed);
    let mut x = seed | 1;
    for _ in 0..1000 {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        let port = 20_000 + (x % 12_000) as u16;
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return format!("127.0.0.1:{port}");
        }
    }
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral loopback port");
    format!("127.0.0.1:{}", l.local_addr().expect("local addr").port())
}

/// A loopback listener on a port the kernel chose, and its address: give the
/// listener to rank 0 ([`crate::RingConfig::root_listener`]) and the address to
/// every rank, and no other program can take the port in between, as it can
/// with [`free_loopback_addr`].
pub fn reserved_loopback() -> (String, TcpListener) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral loopback port");
    let addr = format!("127.0.0.1:{}", l.local_addr().expect("local addr").port());
    (addr, l)
}

/// [`run_ranks_env`] on a rendezvous address probed free
/// ([`free_loopback_addr`]); `args_for(addr, rank)` gives each rank its
/// arguments and environment. Rank 0 binds the port a moment after the probe:
/// when another program took it in between (a rank reports "Address already
/// in use"), the world runs again on another port, three times in all.
pub fn run_ranks_on_free_port(
    cmd: &WorkerCommand,
    world: usize,
    deadline: Duration,
    args_for: impl Fn(&str, usize) -> (Vec<String>, Vec<(&'static str, String)>),
) -> Result<Vec<RankOutput>> {
    let mut tries = 0;
    loop {
        let addr = free_loopback_addr();
        let outputs = run_ranks_env(cmd, world, deadline, |rank| args_for(&addr, rank))?;
        tries += 1;
        if tries == 3 || !outputs.iter().any(|o| o.stderr.contains("Address already in use")) {
            return Ok(outputs);
        }
        eprintln!("the rendezvous port {addr} was taken between its probe and its bind; running the world again on another");
    }
}

/// Spawns one worker per rank with `args_for(rank)`, waits for all of them,
/// and kills any still running at `deadline` after the start.
pub fn run_ranks(cmd: &WorkerCommand, world: usize, deadline: Duration, args_for: impl Fn(usize) -> Vec<String>) -> Result<Vec<RankOutput>> {
    run_ranks_env(cmd, world, deadline, |rank| (args_for(rank), vec![]))
}

/// [`run_ranks`] where `args_for(rank)` also gives environment variables to
/// set (a cookie, which must not be on a command line).
pub fn run_ranks_env(
    cmd: &WorkerCommand,
    world: usize,
    deadline: Duration,
    args_for: impl Fn(usize) -> (Vec<String>, Vec<(&'static str, String)>),
) -> Result<Vec<RankOutput>> {
    let start = Instant::now();
    let mut children: Vec<(usize, Child)> = Vec::with_capacity(world);
    for rank in 0..world {
        let (args, env) = args_for(rank);
        let child = Command::new(&cmd.program)
            .args(&cmd.prefix)
            .args(args)
            .envs(env)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| {
                for (_, c) in children.iter_mut() {
                    let _ = c.kill();
                    let _ = c.wait();
                }
                CommError::Worker {
                    what: format!("rank {rank}"),
                    detail: format!("cannot start {}: {e}", cmd.program.display()),
                }
            })?;
        children.push((rank, child));
    }
    // Drain pipes on threads so a chatty worker never blocks on a full pipe.
    let mut readers = Vec::new();
    for (_, c) in children.iter_mut() {
        let mut out = c.stdout.take().expect("piped stdout");
        let mut err = c.stderr.take().expect("piped stderr");
        readers.push((
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = out.read_to_string(&mut s);
                s
            }),
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = err.read_to_string(&mut s);
                s
            }),
        ));
    }
    let mut finished: Vec<Option<(Option<ExitStatus>, Duration)>> = vec![None; world];
    loop {
        for (i, (_, c)) in children.iter_mut().enumerate() {
            if finished[i].is_none() {
                if let Ok(Some(st)) = c.try_wait() {
                    finished[i] = Some((Some(st), start.elapsed()));
                }
            }
        }
        if finished.iter().all(|f| f.is_some()) {
            break;
        }
        if start.elapsed() > deadline {
            for (i, (_, c)) in children.iter_mut().enumerate() {
                if finished[i].is_none() {
                    let _ = c.kill();
                    let _ = c.wait();
                    finished[i] = Some((None, start.elapsed()));
                }
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    Ok(children
        .into_iter()
        .zip(readers)
        .zip(finished)
        .map(|(((rank, _), (o, e)), f)| {
            let (status, elapsed) = f.expect("every rank finished or was killed");
            RankOutput {
                rank,
                status,
                stdout: o.join().unwrap_or_default(),
                stderr: e.join().unwrap_or_default(),
                elapsed,
            }
        })
        .collect())
}
