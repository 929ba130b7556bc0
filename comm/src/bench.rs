//! The CPU all-reduce benchmark: bus bandwidth of the ring for several world
//! sizes and buffer sizes, against the loopback copy bandwidth (one TCP
//! stream pushing the same bytes) measured in the same run.
//!
//! Bus bandwidth follows nccl-tests: `algbw = bytes / time`,
//! `busbw = algbw · 2(n−1)/n`, the rate each ring link actually carries, so
//! the ratio `busbw / loopback` says how close the ring comes to the
//! hardware's (here: the kernel's loopback) limit.
//!
//! Ranks are separate processes started from a [`WorkerCommand`]. The
//! launcher wires it up by spawning itself:
//!
//! ```no_run
//! use rlmesh_comm::bench::{bench_allreduce, BenchConfig, WorkerCommand};
//! // `launcher bench allreduce`:
//! let exe = std::env::current_exe().unwrap();
//! let report = bench_allreduce(&BenchConfig::new(WorkerCommand::new(exe).arg("comm-worker"))).unwrap();
//! println!("{}", report.to_table());
//! // …and `launcher comm-worker <flags>` runs
//! // `rlmesh_comm::worker_main(std::env::args().skip(2))`.
//! ```

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::{Duration, Instant};

use crate::buffer::DType;
use crate::collective::ReduceOp;
use crate::error::{CommError, Result};
pub use crate::testing::WorkerCommand;
use crate::testing::run_ranks_on_free_port;
use crate::worker::{WorkerArgs, WorkerOp, WorkerReport};

const MIB: usize = 1 << 20;

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchConfig {
    /// How to start a worker process.
    pub worker: WorkerCommand,
    /// World sizes.
    pub worlds: Vec<usize>,
    /// Buffer sizes in bytes (f32 elements).
    pub sizes: Vec<usize>,
    /// Timed iterations per (world, size); the median is reported.
    pub iters: usize,
    /// Untimed iterations first.
    pub warmup: usize,
    /// Ring pipelining block in bytes.
    pub block_bytes: usize,
    /// Bound on one (world, size) run.
    pub deadline: Duration,
}

impl BenchConfig {
    /// Worlds 2, 3, 4; sizes 1, 16, 64 MiB; 7 timed iterations after 2 warm-ups.
    pub fn new(worker: WorkerCommand) -> Self {
        BenchConfig {
            worker,
            worlds: vec![2, 3, 4],
            sizes: vec![MIB, 16 * MIB, 64 * MIB],
            iters: 7,
            warmup: 2,
            block_bytes: crate::cpu::DEFAULT_BLOCK_BYTES,
            deadline: Duration::from_secs(300),
        }
    }
}

/// One (world, size) measurement.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct AllReduceResult {
    /// World size.
    pub world: usize,
    /// Buffer size in bytes.
    pub bytes: usize,
    /// Median over iterations of the slowest rank's time, seconds.
    pub median_s: f64,
    /// Algorithm bandwidth, GB/s (bytes / time).
    pub algbw_gbps: f64,
    /// Bus bandwidth, GB/s (algbw · 2(n−1)/n).
    pub busbw_gbps: f64,
    /// Loopback copy bandwidth for the same size, GB/s.
    pub loopback_gbps: f64,
    /// busbw / loopback.
    pub ratio: f64,
}

/// The whole benchmark's result.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct BenchReport {
    /// Logical CPUs on this machine (ranks share them).
    pub cpus: usize,
    /// Loopback copy bandwidth per size: `(bytes, GB/s)`.
    pub loopback: Vec<(usize, f64)>,
    /// One entry per (world, size).
    pub results: Vec<AllReduceResult>,
}

impl BenchReport {
    /// A plain-text table.
    pub fn to_table(&self) -> String {
        let mut s = format!(
            "CPU ring all-reduce (f32, loopback TCP, {} CPUs), medians\n{:>5} {:>9} {:>10} {:>10} {:>10} {:>12} {:>7}\n",
            self.cpus, "world", "size", "time_ms", "algbw_GB/s", "busbw_GB/s", "loopback_GB/s", "ratio"
        );
        for r in &self.results {
            s.push_str(&format!(
                "{:>5} {:>6}MiB {:>10.2} {:>10.3} {:>10.3} {:>12.3} {:>7.2}\n",
                r.world,
                r.bytes / MIB,
                r.median_s * 1e3,
                r.algbw_gbps,
                r.busbw_gbps,
                r.loopback_gbps,
                r.ratio
            ));
        }
        s
    }
}

/// One (transport, receivers, size) weight-sync measurement.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct WeightSyncResult {
    /// How the bytes moved: `shm` (one shared segment, every rank on this host) or `ring` (TCP, relayed).
    pub transport: String,
    /// Receiving processes (the world is one more: the sender).
    pub receivers: usize,
    /// Buffer size in bytes.
    pub bytes: usize,
    /// Bucket size in bytes.
    pub bucket_bytes: usize,
    /// Median over iterations of the slowest rank's time, seconds.
    pub median_s: f64,
    /// Bytes delivered to each receiver per second, GB/s.
    pub gbps: f64,
    /// Loopback copy bandwidth for the same size, GB/s.
    pub loopback_gbps: f64,
    /// gbps / loopback.
    pub ratio: f64,
    /// Median over iterations of the slowest rank's time without digests, seconds.
    pub plain_s: f64,
    /// The digest's share of the sync time: the median over iterations of
    /// (time − plain time) / time, each iteration's pair run back to back.
    pub digest_share: f64,
    /// The fewest bytes any receiver hashed in a digested sync (each should
    /// hash all `bytes`).
    #[serde(default)]
    pub digested_bytes: usize,
}

/// The weight-sync benchmark's result.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct WeightSyncReport {
    /// Logical CPUs on this machine (the processes share them).
    pub cpus: usize,
    /// One entry per (receivers, size).
    pub results: Vec<WeightSyncResult>,
}

impl WeightSyncReport {
    /// A plain-text table.
    pub fn to_table(&self) -> String {
        let mut s = format!(
            "CPU weight sync (bucketed broadcast + XXH3 per bucket, {} CPUs), medians; ratio = GB/s to each receiver / loopback TCP copy; digest_share = median over iterations of (time - the same broadcast without digests) / time\n{:>9} {:>9} {:>9} {:>9} {:>10} {:>10} {:>8} {:>13} {:>7} {:>13}\n",
            self.cpus, "transport", "receivers", "size", "bucket", "time_ms", "plain_ms", "GB/s", "loopback_GB/s", "ratio", "digest_share"
        );
        for r in &self.results {
            s.push_str(&format!(
                "{:>9} {:>9} {:>6}MiB {:>6}MiB {:>10.2} {:>10.2} {:>8.3} {:>13.3} {:>7.2} {:>12.1}%\n",
                r.transport,
                r.receivers,
                r.bytes / MIB,
                r.bucket_bytes / MIB,
                r.median_s * 1e3,
                r.plain_s * 1e3,
                r.gbps,
                r.loopback_gbps,
                r.ratio,
                100.0 * r.digest_share
            ));
        }
        s
    }
}

/// Runs `world` worker processes with `edit` applied to each rank's arguments and collects their reports.
fn run_reports(cfg: &BenchConfig, world: usize, what: &str, edit: impl Fn(&mut WorkerArgs)) -> Result<Vec<WorkerReport>> {
    let outs = run_ranks_on_free_port(&cfg.worker, world, cfg.deadline, |addr, rank| {
        let mut a = WorkerArgs::new(rank, world, addr.to_string());
        a.iters = cfg.iters;
        a.warmup = cfg.warmup;
        a.block_bytes = cfg.block_bytes;
        a.json = true;
        edit(&mut a);
        (a.to_args(), a.env())
    })?;
    let mut reports: Vec<WorkerReport> = Vec::new();
    for o in &outs {
        let line = o.stdout.lines().rev().find(|l| l.starts_with('{'));
        match (o.success(), line.and_then(|l| serde_json::from_str::<WorkerReport>(l).ok())) {
            (true, Some(r)) => reports.push(r),
            _ => {
                return Err(CommError::Worker {
                    what: format!("rank {} of world {world}, {what}", o.rank),
                    detail: format!("status {:?}; stderr: {}", o.status, o.stderr.trim()),
                })
            }
        }
    }
    Ok(reports)
}

/// Per iteration, the slowest rank's value of `pick`.
fn slowest(reports: &[WorkerReport], iters: usize, pick: impl Fn(&WorkerReport, usize) -> f64) -> Vec<f64> {
    (0..iters).map(|i| reports.iter().map(|r| pick(r, i)).fold(0.0, f64::max)).collect()
}

/// Per iteration, the slowest rank's value of `pick`; then the median.
fn slowest_median(reports: &[WorkerReport], iters: usize, pick: impl Fn(&WorkerReport, usize) -> f64) -> f64 {
    median(&slowest(reports, iters, pick))
}

/// The weight-sync benchmark: for each size the loopback copy bandwidth, then
/// for each receiver count a bucketed broadcast from one sender process
/// (`cfg.worlds` holds the receiver counts), each bucket digested on arrival,
/// through a shared segment (the ranks are on this host) and along the TCP ring.
pub fn bench_weight_sync(cfg: &BenchConfig, bucket_bytes: usize) -> Result<WeightSyncReport> {
    let mut results = Vec::new();
    for &bytes in &cfg.sizes {
        let loop_gbps = loopback_copy_bandwidth(bytes, cfg.block_bytes, (cfg.iters + cfg.warmup).max(3))? / 1e9;
        for (&receivers, ring_only) in cfg.worlds.iter().flat_map(|r| [(r, false), (r, true)]) {
            let reports = run_reports(cfg, receivers + 1, &format!("{bytes} bytes"), |a| {
                a.op = WorkerOp::WeightSync;
                a.dtype = DType::F32;
                a.len = bytes / 4;
                a.bucket_bytes = bucket_bytes;
                a.ring_only = ring_only;
            })?;
            let shared = reports.iter().all(|r| r.shared_memory);
            if !ring_only && !shared {
                // The ranks could not share a segment: the ring row is the figure.
                continue;
            }
            let synced = slowest(&reports, cfg.iters, |r, i| r.times_s.get(i).copied().unwrap_or(f64::NAN));
            // The digest's share: what it adds to the sync, against the same
            // broadcast without it next to it in the same iteration, paired
            // iteration by iteration (it may come out slightly negative when
            // the cost is below the noise).
            let plain_each = slowest(&reports, cfg.iters, |r, i| r.plain_times_s.get(i).copied().unwrap_or(f64::NAN));
            let shares: Vec<f64> = synced.iter().zip(&plain_each).map(|(t, p)| (t - p) / t).collect();
            let (t, plain, share) = (median(&synced), median(&plain_each), median(&shares));
            let digested_bytes = reports.iter().filter(|r| r.rank != 0).map(|r| r.digested_bytes).min().unwrap_or(0);
            let gbps = bytes as f64 / t / 1e9;
            let transport = if shared { "shm" } else { "ring" }.to_string();
            results.push(WeightSyncResult { transport, receivers, bytes, bucket_bytes, median_s: t, gbps, loopback_gbps: loop_gbps, ratio: gbps / loop_gbps, plain_s: plain, digest_share: share, digested_bytes });
        }
    }
    Ok(WeightSyncReport { cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1), results })
}

/// Median of a non-empty list.
pub fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// Median bandwidth (bytes/s) of pushing `bytes` through one loopback TCP
/// stream between two threads, in writes of `block_bytes`, over `repeats` runs.
pub fn loopback_copy_bandwidth(bytes: usize, block_bytes: usize, repeats: usize) -> Result<f64> {
    let io = |e: std::io::Error| CommError::Worker {
        what: "loopback copy".into(),
        detail: e.to_string(),
    };
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io)?;
    let addr = listener.local_addr().map_err(io)?;
    let writer = std::thread::spawn(move || -> std::io::Result<()> {
        let mut s = TcpStream::connect(addr)?;
        s.set_nodelay(true)?;
        let src = vec![7u8; block_bytes.min(bytes).max(1)];
        let mut ack = [0u8; 1];
        for _ in 0..repeats {
            let mut left = bytes;
            while left > 0 {
                let n = left.min(src.len());
                s.write_all(&src[..n])?;
                left -= n;
            }
            s.read_exact(&mut ack)?;
        }
        Ok(())
    });
    let (mut s, _) = listener.accept().map_err(io)?;
    s.set_nodelay(true).map_err(io)?;
    s.set_read_timeout(Some(Duration::from_secs(60))).map_err(io)?;
    let mut dst = vec![0u8; bytes.max(1)];
    let mut rates = Vec::with_capacity(repeats);
    for _ in 0..repeats {
        let t0 = Instant::now();
        let mut got = 0;
        while got < bytes {
            let end = (got + block_bytes).min(bytes);
            s.read_exact(&mut dst[got..end]).map_err(io)?;
            got = end;
        }
        rates.push(bytes as f64 / t0.elapsed().as_secs_f64());
        s.write_all(&[1]).map_err(io)?;
    }
    writer
        .join()
        .map_err(|_| CommError::Worker { what: "loopback copy".into(), detail: "writer panicked".into() })?
        .map_err(io)?;
    Ok(median(&rates))
}

/// Runs the benchmark: for each size the loopback copy bandwidth, then for
/// each world size a ring all-reduce (sum, f32) in separate processes.
pub fn bench_allreduce(cfg: &BenchConfig) -> Result<BenchReport> {
    let mut loopback = Vec::new();
    for &bytes in &cfg.sizes {
        let bw = loopback_copy_bandwidth(bytes, cfg.block_bytes, (cfg.iters + cfg.warmup).max(3))?;
        loopback.push((bytes, bw / 1e9));
    }
    let mut results = Vec::new();
    for &world in &cfg.worlds {
        for (&bytes, &(_, loop_gbps)) in cfg.sizes.iter().zip(&loopback) {
            let reports = run_reports(cfg, world, &format!("{bytes} bytes"), |a| {
                a.op = WorkerOp::AllReduce(ReduceOp::Sum);
                a.dtype = DType::F32;
                a.len = bytes / 4;
            })?;
            let t = slowest_median(&reports, cfg.iters, |r, i| r.times_s.get(i).copied().unwrap_or(f64::NAN));
            let algbw = bytes as f64 / t / 1e9;
            let busbw = algbw * 2.0 * (world as f64 - 1.0) / world as f64;
            results.push(AllReduceResult {
                world,
                bytes,
                median_s: t,
                algbw_gbps: algbw,
                busbw_gbps: busbw,
                loopback_gbps: loop_gbps,
                ratio: busbw / loop_gbps,
            });
        }
    }
    Ok(BenchReport {
        cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        loopback,
        results,
    })
}
