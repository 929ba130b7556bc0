//! One rank as a process: the worker that tests and benchmarks spawn N times on loopback.
//!
//! The standalone binary is `rlmesh-comm-worker`. Another binary (the
//! launcher) hosts the same worker by forwarding its arguments to
//! [`worker_main`], which returns the process's `ExitCode`; e.g. a hidden
//! subcommand `launcher comm-worker <flags>` whose handler is
//! `return rlmesh_comm::worker_main(std::env::args().skip(2))`, and a
//! [`crate::bench::WorkerCommand`] of `current_exe()` plus `"comm-worker"` for
//! [`crate::bench::bench_allreduce`] to spawn.
//!
//! Arguments (`--key value`; defaults in parentheses):
//!
//! | flag | meaning |
//! |---|---|
//! | `--rank R`, `--world N`, `--addr HOST:PORT` | place in the ring and rank 0's rendezvous address (required) |
//! | `--op OP` | `all-reduce-sum` (default), `all-reduce-mean`, `broadcast`, `reduce-scatter`, `all-gather`, `barrier`, `bucketed`, `sharded`, `weight-sync` |
//! | `--bytes B` / `--len L` | buffer size in bytes (1 MiB) or in elements (wins over `--bytes`) |
//! | `--dtype T` | `f32` (default), `f64`, `bf16` |
//! | `--iters K`, `--warmup W` | timed iterations (1) and untimed ones before them (0) |
//! | `--check` | verify every iteration's result against the expected values; exit 1 on a mismatch |
//! | `--root R` | broadcast root (0) |
//! | `--slices a,b,c` | slice lengths for `bucketed` (a fixed list of odd sizes) |
//! | `--bucket-bytes B` | bucket size for `bucketed`, `sharded` and `weight-sync` (25 MiB) |
//! | `--block-bytes B` | ring pipelining block (256 KiB) |
//! | `--timeout-ms T`, `--connect-timeout-ms T` | bound on each wait for a peer (60000) and on the rendezvous (60000) |
//! | `--out FILE` | write the final result bytes (little-endian) to FILE |
//! | `--json` | print a [`WorkerReport`] as one JSON line on stdout |
//! | `--random` | use [`random_value`] data (full-mantissa floats, so sums round and the ranks' bit-identity is meaningful) |
//! | `--die-after K`, `--stall-after K` | failure injection for tests: exit abruptly, or stop responding for twice the timeout, before iteration K |
//!
//! The shared cookie comes from `$RLMESH_COMM_COOKIE` (default "rlmesh"), never
//! from a flag: a command line is readable by every user of the host (`ps`).
//! [`WorkerArgs::env`] gives the variable to set on a spawned worker.
//!
//! Test data: element `i` of rank `r` is [`pattern`]`(r, i)` = `(i mod 17) + 20·r`
//! (small integers, so sums are exact in f32, f64 and bf16 for up to 4 ranks),
//! or with `--random` [`random_value`]`(r, i)`, checked within a tolerance.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use crate::bucket::{Bucketer, DEFAULT_BUCKET_BYTES};
use crate::buffer::{as_bytes, Bf16, Buf, DType, Element};
use crate::shard::{all_gather_sharded, reduce_scatter_sharded, ShardLayout};
use crate::collective::{Collective, CollectiveExt, ReduceOp};
use crate::cpu::{RingComm, RingConfig, DEFAULT_BLOCK_BYTES};
use crate::error::{CommError, Result};

/// Which collective the worker runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum WorkerOp {
    /// All-reduce with the given op.
    AllReduce(ReduceOp),
    /// Broadcast from `--root`.
    Broadcast,
    /// Reduce-scatter (sum).
    ReduceScatter,
    /// All-gather.
    AllGather,
    /// Barrier only.
    Barrier,
    /// Bucketed all-reduce (sum) over `--slices`.
    Bucketed,
    /// Sharded state ([`crate::shard`]): a reduce-scatter by bucket of
    /// `--bucket-bytes` (each rank's owned ranges checked against an all-reduce
    /// of the same data), everything not owned overwritten, then the all-gather
    /// by bucket: every rank ends with the all-reduce's result.
    Sharded,
    /// A weight sync: broadcast from `--root` in buckets of `--bucket-bytes`,
    /// each receiver digesting every bucket as it arrives and checking it
    /// against the root's digests.
    WeightSync,
}

impl WorkerOp {
    /// The command-line spelling.
    pub fn name(self) -> &'static str {
        match self {
            WorkerOp::AllReduce(ReduceOp::Sum) => "all-reduce-sum",
            WorkerOp::AllReduce(ReduceOp::Mean) => "all-reduce-mean",
            WorkerOp::Broadcast => "broadcast",
            WorkerOp::ReduceScatter => "reduce-scatter",
            WorkerOp::AllGather => "all-gather",
            WorkerOp::Barrier => "barrier",
            WorkerOp::Bucketed => "bucketed",
            WorkerOp::Sharded => "sharded",
            WorkerOp::WeightSync => "weight-sync",
        }
    }

    fn parse(s: &str) -> Result<WorkerOp> {
        Ok(match s {
            "all-reduce-sum" | "allreduce" | "all-reduce" => WorkerOp::AllReduce(ReduceOp::Sum),
            "all-reduce-mean" => WorkerOp::AllReduce(ReduceOp::Mean),
            "broadcast" => WorkerOp::Broadcast,
            "reduce-scatter" => WorkerOp::ReduceScatter,
            "all-gather" => WorkerOp::AllGather,
            "barrier" => WorkerOp::Barrier,
            "bucketed" => WorkerOp::Bucketed,
            "sharded" => WorkerOp::Sharded,
            "weight-sync" => WorkerOp::WeightSync,
            other => return Err(CommError::Usage(format!("unknown --op {other:?}"))),
        })
    }
}

/// Slice lengths used by `--op bucketed` when `--slices` is not given: odd sizes, an empty one, and ones larger than small buckets.
pub const DEFAULT_SLICES: &[usize] = &[1, 3, 17, 0, 1000, 4097, 5, 65537, 31, 2, 12289];

/// The worker's parsed command line.
#[derive(Debug, Clone)]
pub struct WorkerArgs {
    /// This rank.
    pub rank: usize,
    /// World size.
    pub world: usize,
    /// Rank 0's rendezvous address.
    pub addr: String,
    /// The collective.
    pub op: WorkerOp,
    /// Buffer length in elements.
    pub len: usize,
    /// Element type.
    pub dtype: DType,
    /// Timed iterations.
    pub iters: usize,
    /// Untimed iterations before the timed ones.
    pub warmup: usize,
    /// Verify results.
    pub check: bool,
    /// Broadcast root.
    pub root: usize,
    /// Slice lengths for `bucketed`.
    pub slices: Vec<usize>,
    /// Bucket size in bytes for `bucketed`.
    pub bucket_bytes: usize,
    /// Ring pipelining block in bytes.
    pub block_bytes: usize,
    /// Shared cookie.
    pub cookie: String,
    /// Bound on each wait for a peer.
    pub timeout: Duration,
    /// Bound on the rendezvous.
    pub connect_timeout: Duration,
    /// Where to write the final result bytes.
    pub out: Option<PathBuf>,
    /// Print a JSON report line.
    pub json: bool,
    /// Use full-mantissa random data instead of small integers.
    pub random: bool,
    /// Exit abruptly before this iteration (tests).
    pub die_after: Option<usize>,
    /// Stop responding before this iteration (tests).
    pub stall_after: Option<usize>,
    /// `weight-sync` only: the last rank flips a byte of this bucket after receiving it (tests).
    pub corrupt_bucket: Option<usize>,
    /// Broadcast along the ring even when the ranks could share memory.
    pub ring_only: bool,
}

impl WorkerArgs {
    /// Defaults for the given place in the ring.
    pub fn new(rank: usize, world: usize, addr: impl Into<String>) -> Self {
        let cfg = RingConfig::new(rank, world, "");
        WorkerArgs {
            rank,
            world,
            addr: addr.into(),
            op: WorkerOp::AllReduce(ReduceOp::Sum),
            len: (1 << 20) / 4,
            dtype: DType::F32,
            iters: 1,
            warmup: 0,
            check: false,
            root: 0,
            slices: DEFAULT_SLICES.to_vec(),
            bucket_bytes: DEFAULT_BUCKET_BYTES,
            block_bytes: DEFAULT_BLOCK_BYTES,
            cookie: cfg.cookie,
            timeout: cfg.timeout,
            connect_timeout: cfg.connect_timeout,
            out: None,
            json: false,
            random: false,
            die_after: None,
            stall_after: None,
            corrupt_bucket: None,
            ring_only: false,
        }
    }

    /// Parses the flags (without the program name).
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<WorkerArgs> {
        let mut a = WorkerArgs::new(usize::MAX, 0, "");
        let mut bytes: Option<usize> = None;
        let mut len: Option<usize> = None;
        let mut it = args.into_iter();
        fn num<T: std::str::FromStr>(flag: &str, v: Option<String>) -> Result<T> {
            let v = v.ok_or_else(|| CommError::Usage(format!("{flag} needs a value")))?;
            v.parse().map_err(|_| CommError::Usage(format!("{flag}: cannot parse {v:?}")))
        }
        while let Some(flag) = it.next() {
            match flag.as_str() {
                "--rank" => a.rank = num(&flag, it.next())?,
                "--world" => a.world = num(&flag, it.next())?,
                "--addr" => a.addr = num(&flag, it.next())?,
                "--op" => a.op = WorkerOp::parse(&num::<String>(&flag, it.next())?)?,
                "--bytes" => bytes = Some(num(&flag, it.next())?),
                "--len" => len = Some(num(&flag, it.next())?),
                "--dtype" => {
                    let s: String = num(&flag, it.next())?;
                    a.dtype = s.parse().map_err(CommError::Usage)?
                }
                "--iters" => a.iters = num(&flag, it.next())?,
                "--warmup" => a.warmup = num(&flag, it.next())?,
                "--check" => a.check = true,
                "--root" => a.root = num(&flag, it.next())?,
                "--slices" => {
                    let s: String = num(&flag, it.next())?;
                    a.slices = s
                        .split(',')
                        .filter(|x| !x.is_empty())
                        .map(|x| x.trim().parse().map_err(|_| CommError::Usage(format!("--slices: bad length {x:?}"))))
                        .collect::<Result<_>>()?;
                }
                "--bucket-bytes" => a.bucket_bytes = num(&flag, it.next())?,
                "--block-bytes" => a.block_bytes = num(&flag, it.next())?,
                "--cookie" => return Err(CommError::Usage("--cookie: not a flag (every user of the host can read a command line); set RLMESH_COMM_COOKIE".into())),
                "--timeout-ms" => a.timeout = Duration::from_millis(num(&flag, it.next())?),
                "--connect-timeout-ms" => a.connect_timeout = Duration::from_millis(num(&flag, it.next())?),
                "--out" => a.out = Some(PathBuf::from(num::<String>(&flag, it.next())?)),
                "--json" => a.json = true,
                "--random" => a.random = true,
                "--die-after" => a.die_after = Some(num(&flag, it.next())?),
                "--stall-after" => a.stall_after = Some(num(&flag, it.next())?),
                "--corrupt-bucket" => a.corrupt_bucket = Some(num(&flag, it.next())?),
                "--ring-only" => a.ring_only = true,
                other => return Err(CommError::Usage(format!("unknown flag {other:?}"))),
            }
        }
        if a.rank == usize::MAX || a.world == 0 || a.addr.is_empty() {
            return Err(CommError::Usage("--rank, --world and --addr are required".into()));
        }
        a.len = match (len, bytes) {
            (Some(l), _) => l,
            (None, Some(b)) => b / a.dtype.size(),
            (None, None) => a.len,
        };
        Ok(a)
    }

    /// The environment a spawned worker needs besides [`Self::to_args`]: the cookie.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![(crate::cpu::COOKIE_ENV, self.cookie.clone())]
    }

    /// The flags that reproduce these arguments, the cookie aside ([`Self::env`]), for spawning a worker.
    pub fn to_args(&self) -> Vec<String> {
        let mut v: Vec<String> = vec![
            "--rank".into(),
            self.rank.to_string(),
            "--world".into(),
            self.world.to_string(),
            "--addr".into(),
            self.addr.clone(),
            "--op".into(),
            self.op.name().into(),
            "--len".into(),
            self.len.to_string(),
            "--dtype".into(),
            self.dtype.name().into(),
            "--iters".into(),
            self.iters.to_string(),
            "--warmup".into(),
            self.warmup.to_string(),
            "--root".into(),
            self.root.to_string(),
            "--slices".into(),
            self.slices.iter().map(|s| s.to_string()).collect::<Vec<_>>().join(","),
            "--bucket-bytes".into(),
            self.bucket_bytes.to_string(),
            "--block-bytes".into(),
            self.block_bytes.to_string(),
            "--timeout-ms".into(),
            self.timeout.as_millis().to_string(),
            "--connect-timeout-ms".into(),
            self.connect_timeout.as_millis().to_string(),
        ];
        if self.check {
            v.push("--check".into());
        }
        if self.json {
            v.push("--json".into());
        }
        if self.random {
            v.push("--random".into());
        }
        if self.ring_only {
            v.push("--ring-only".into());
        }
        if let Some(o) = &self.out {
            v.push("--out".into());
            v.push(o.display().to_string());
        }
        if let Some(k) = self.die_after {
            v.push("--die-after".into());
            v.push(k.to_string());
        }
        if let Some(k) = self.stall_after {
            v.push("--stall-after".into());
            v.push(k.to_string());
        }
        if let Some(k) = self.corrupt_bucket {
            v.push("--corrupt-bucket".into());
            v.push(k.to_string());
        }
        v
    }
}

/// What one worker reports (as a JSON line with `--json`).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct WorkerReport {
    /// Rank.
    pub rank: usize,
    /// World size.
    pub world: usize,
    /// The collective's name.
    pub op: String,
    /// Element type.
    pub dtype: DType,
    /// Elements per buffer.
    pub len: usize,
    /// Seconds taken by each timed iteration (each preceded by a barrier).
    pub times_s: Vec<f64>,
    /// `weight-sync`: of each timed iteration, the seconds of the same
    /// broadcast without digests (run beside it, in alternating order).
    #[serde(default)]
    pub plain_times_s: Vec<f64>,
    /// `weight-sync`: bytes this rank hashed in its last digested sync (a
    /// receiver: every byte; the root: none, its digests come from packing).
    #[serde(default)]
    pub digested_bytes: usize,
    /// XXH3-64 of the final result bytes (equal across ranks for all-reduce).
    pub digest: String,
    /// Whether `--check` verified every iteration.
    pub checked: bool,
    /// Whether broadcasts went through shared memory (every rank on this host).
    #[serde(default)]
    pub shared_memory: bool,
}

/// Test data: element `i` of rank `r` is `(i mod 17) + 20·r`.
pub fn pattern(rank: usize, i: usize) -> f64 {
    (i % 17) as f64 + 20.0 * rank as f64
}

/// Random test data: a hash of `(r, i)` mapped to a float in `[-1000, 1000)` with a full mantissa.
pub fn random_value(rank: usize, i: usize) -> f64 {
    let mut z = ((rank as u64) << 40 ^ i as u64).wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 53) as f64 * 2000.0 - 1000.0
}

/// XXH3-64 of a buffer, hex: a digest to compare buffers across processes.
pub fn digest(bytes: &[u8]) -> String {
    format!("{:016x}", crate::digest::bucket_digest(bytes))
}

/// Entry point of the worker process: parses `args` (without the program
/// name), runs, prints errors to stderr, returns the exit code (0 ok, 1 a
/// collective or check failed, 2 bad usage).
pub fn worker_main(args: impl IntoIterator<Item = String>) -> ExitCode {
    let args = match WorkerArgs::parse(args) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    match run_worker(&args) {
        Ok(report) => {
            if args.json {
                println!("{}", serde_json::to_string(&report).expect("report serialises"));
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("rlmesh-comm-worker rank {}: error: {e}", args.rank);
            ExitCode::from(1)
        }
    }
}

/// A weight-sync receiver's sink: hashes each piece (fused into the copy out
/// of a shared segment), first flipping a byte of the piece that starts
/// bucket `corrupt` (`--corrupt-bucket`, on the last rank): corruption in
/// transit, so that piece is copied plainly, flipped, then hashed.
struct SyncSink {
    hasher: crate::digest::BucketHasher,
    corrupt: bool,
}

impl crate::cpu::Pieces for SyncSink {
    fn passed(&mut self, piece: &mut [u8]) {
        if std::mem::take(&mut self.corrupt) {
            piece[0] ^= 0x01;
        }
        self.hasher.update(piece);
    }

    fn copy(&mut self, dst: &mut [u8], src: &[u8]) {
        if self.corrupt {
            dst.copy_from_slice(src);
            self.passed(dst);
        } else {
            self.hasher.copy_in(dst, src);
        }
    }
}

/// One weight sync of `data` from the root, as a run does it: the root sends
/// the buckets as they are, its digests `packed` beforehand (a learner
/// digests an image when it packs it); each receiver digests (XXH3) every
/// piece as it arrives, fused into the copy out of the shared segment (see
/// [`RingComm::broadcast_bytes_with`]); then the root's digests are broadcast
/// and compared (in a run they travel in the version's header).
/// `--corrupt-bucket` flips a byte of that bucket as it arrives at the last
/// rank, before it is hashed: corruption in transit. Returns the bytes this
/// rank hashed.
fn weight_sync<T: Element>(args: &WorkerArgs, comm: &mut RingComm, data: &mut [T], packed: Option<Vec<u64>>) -> Result<usize> {
    let per = (args.bucket_bytes / T::DTYPE.size()).max(1);
    if let Some(digests) = packed {
        plain_sync(args, comm, data)?;
        let mut roots: Vec<f64> = digests.iter().map(|d| f64::from_bits(*d)).collect();
        comm.broadcast_slice(&mut roots, args.root)?;
        return Ok(0);
    }
    let corrupts = args.rank + 1 == args.world;
    let mut sink = SyncSink { hasher: crate::digest::BucketHasher::new(per * T::DTYPE.size()), corrupt: false };
    for (b, bucket) in data.chunks_mut(per).enumerate() {
        sink.corrupt = corrupts && args.corrupt_bucket == Some(b);
        comm.broadcast_bytes_with(crate::buffer::as_bytes_mut(bucket), args.root, &mut sink)?;
    }
    let hashed = sink.hasher.len();
    let ours = sink.hasher.finish().digests;
    let mut roots: Vec<f64> = ours.iter().map(|d| f64::from_bits(*d)).collect();
    comm.broadcast_slice(&mut roots, args.root)?;
    if let Some(b) = ours.iter().zip(&roots).position(|(o, r)| *o != r.to_bits()) {
        return Err(CommError::Worker {
            what: format!("rank {} weight-sync digest", args.rank),
            detail: format!("bucket {b} of {}: received {:016x}, the root sent {:016x}; this version is refused", ours.len(), ours[b], roots[b].to_bits()),
        });
    }
    Ok(hashed)
}

/// The same bytes moved as [`weight_sync`] moves them, bucket by bucket, with
/// no digest: the baseline the digest's cost is measured against.
fn plain_sync<T: Element>(args: &WorkerArgs, comm: &mut RingComm, data: &mut [T]) -> Result<()> {
    let per = (args.bucket_bytes / T::DTYPE.size()).max(1);
    for bucket in data.chunks_mut(per) {
        comm.broadcast_bytes_with(crate::buffer::as_bytes_mut(bucket), args.root, &mut |_: &mut [u8]| ())?;
    }
    Ok(())
}

/// How far a result may be from the expected one: exact for the integer pattern;
/// with random data the ring's summation order differs from ours, so rounding is allowed.
fn tolerance<T: Element>(args: &WorkerArgs) -> f64 {
    match (args.random, T::DTYPE) {
        (false, _) => 0.0,
        (true, DType::F64) => 1e-9,
        (true, DType::F32) => 1e-2,
        (true, DType::Bf16) => 64.0,
    }
}

/// `--op sharded`: see [`WorkerOp::Sharded`].
fn sharded<T: Element>(args: &WorkerArgs, comm: &mut RingComm, data: &mut Vec<T>) -> Result<()> {
    let len = data.len();
    let layout = ShardLayout::new(len, args.world, args.bucket_bytes / T::DTYPE.size() / args.world);
    let mut reference = data.clone();
    comm.all_reduce_slice(&mut reference, ReduceOp::Sum)?;
    data.resize(layout.padded(), T::from_f64(0.0));
    reduce_scatter_sharded(comm, Buf::host(&mut data[..]), &layout, ReduceOp::Sum)?;
    let mut owned = vec![false; len];
    for (a, n) in layout.owned(args.rank) {
        owned[a..a + n].iter_mut().for_each(|o| *o = true);
        if let Some(i) = (a..a + n).find(|&i| (data[i].to_f64() - reference[i].to_f64()).abs() > tolerance::<T>(args)) {
            return Err(CommError::Worker {
                what: format!("rank {} sharded reduce-scatter", args.rank),
                detail: format!("owned element {i} is {:?}, the all-reduce gave {:?}", data[i], reference[i]),
            });
        }
    }
    for (d, _) in data.iter_mut().zip(&owned).filter(|(_, o)| !**o) {
        *d = T::from_f64(-1.0);
    }
    all_gather_sharded(comm, Buf::host(&mut data[..]), &layout)?;
    data.truncate(len);
    Ok(())
}

/// Joins the ring and runs the worker's iterations; returns its report.
pub fn run_worker(args: &WorkerArgs) -> Result<WorkerReport> {
    let cfg = RingConfig::new(args.rank, args.world, args.addr.clone())
        .cookie(args.cookie.clone())
        .timeout(args.timeout)
        .connect_timeout(args.connect_timeout)
        .block_bytes(args.block_bytes)
        .shared_memory(!args.ring_only);
    let mut comm = RingComm::connect(cfg)?;
    match args.dtype {
        DType::F32 => run_typed::<f32>(args, &mut comm),
        DType::F64 => run_typed::<f64>(args, &mut comm),
        DType::Bf16 => run_typed::<Bf16>(args, &mut comm),
    }
}

/// Element `i` of rank `r` under the chosen data (pattern or random).
fn value(args: &WorkerArgs, r: usize, i: usize) -> f64 {
    if args.random {
        random_value(r, i)
    } else {
        pattern(r, i)
    }
}

/// The elements this rank starts an iteration with.
fn initial<T: Element>(args: &WorkerArgs, len: usize) -> Vec<T> {
    let (r, p) = (args.rank, args.world);
    match args.op {
        // Only this rank's chunk is meaningful before an all-gather.
        WorkerOp::AllGather => {
            let m = len / p;
            (0..len)
                .map(|i| if i / m.max(1) == r && m > 0 { T::from_f64(value(args, r, i)) } else { T::from_f64(-1.0) })
                .collect()
        }
        _ => (0..len).map(|i| T::from_f64(value(args, r, i))).collect(),
    }
}

/// The elements every rank must hold after the collective (the part that `--out` writes).
fn expected<T: Element>(args: &WorkerArgs, len: usize) -> Vec<T> {
    let p = args.world;
    let sum = |i: usize| (0..p).fold(T::from_f64(0.0), |acc, q| acc.add(T::from_f64(value(args, q, i))));
    match args.op {
        WorkerOp::AllReduce(ReduceOp::Sum) | WorkerOp::Bucketed | WorkerOp::Sharded => (0..len).map(sum).collect(),
        WorkerOp::AllReduce(ReduceOp::Mean) => (0..len).map(|i| sum(i).div(p)).collect(),
        WorkerOp::Broadcast | WorkerOp::WeightSync => (0..len).map(|i| T::from_f64(value(args, args.root, i))).collect(),
        WorkerOp::ReduceScatter => {
            let m = len / p;
            (args.rank * m..(args.rank + 1) * m).map(sum).collect()
        }
        WorkerOp::AllGather => {
            let m = len / p;
            (0..len).map(|i| T::from_f64(value(args, i / m, i))).collect()
        }
        WorkerOp::Barrier => Vec::new(),
    }
}

fn run_typed<T: Element>(args: &WorkerArgs, comm: &mut RingComm) -> Result<WorkerReport> {
    let len = if args.op == WorkerOp::Bucketed { args.slices.iter().sum() } else { args.len };
    let mut data: Vec<T> = initial(args, len);
    let want: Vec<T> = if args.check { expected(args, len) } else { Vec::new() };
    let mut bucketer = Bucketer::<T>::new(args.bucket_bytes);
    let mut times = Vec::with_capacity(args.iters);
    let mut plain_times = Vec::new();
    let mut digested_bytes = 0;
    let mut result: Vec<T> = Vec::new();
    for it in 0..args.warmup + args.iters {
        if args.die_after == Some(it) {
            eprintln!("rlmesh-comm-worker rank {}: exiting abruptly before iteration {it} (--die-after)", args.rank);
            std::process::exit(3);
        }
        if args.stall_after == Some(it) {
            eprintln!("rlmesh-comm-worker rank {}: stalling before iteration {it} (--stall-after)", args.rank);
            std::thread::sleep(args.timeout * 2);
            std::process::exit(4);
        }
        if it > 0 {
            data.clear();
            data.extend(initial::<T>(args, len));
        }
        comm.barrier()?;
        let t0 = Instant::now();
        let mut t0_override: Option<f64> = None;
        match args.op {
            WorkerOp::AllReduce(op) => comm.all_reduce_slice(&mut data, op)?,
            WorkerOp::Broadcast => comm.broadcast_slice(&mut data, args.root)?,
            WorkerOp::ReduceScatter => comm.reduce_scatter_slice(&mut data, ReduceOp::Sum)?,
            WorkerOp::AllGather => comm.all_gather_slice(&mut data)?,
            WorkerOp::Barrier => comm.barrier()?,
            WorkerOp::Bucketed => {
                let mut rest: &mut [T] = &mut data;
                let mut slices: Vec<&mut [T]> = Vec::with_capacity(args.slices.len());
                for &n in &args.slices {
                    let (head, tail) = rest.split_at_mut(n);
                    slices.push(head);
                    rest = tail;
                }
                bucketer.all_reduce(comm, &mut slices, ReduceOp::Sum)?;
            }
            WorkerOp::Sharded => sharded(args, comm, &mut data)?,
            WorkerOp::WeightSync => {
                // Plain first on even iterations, so neither order is favoured
                // (and a one-iteration corruption drill ends on the digested sync).
                let plain = |comm: &mut RingComm, data: &mut Vec<T>| -> Result<f64> {
                    comm.barrier()?;
                    let t = Instant::now();
                    plain_sync(args, comm, data)?;
                    Ok(t.elapsed().as_secs_f64())
                };
                let before = if it % 2 == 0 { Some(plain(comm, &mut data)?) } else { None };
                let packed = (args.rank == args.root).then(|| {
                    let bytes = crate::buffer::as_bytes(&data);
                    crate::digest::BucketDigests::of(bytes, (args.bucket_bytes / T::DTYPE.size()).max(1) * T::DTYPE.size()).digests
                });
                comm.barrier()?;
                let t = Instant::now();
                digested_bytes = weight_sync(args, comm, &mut data, packed)?;
                let synced = t.elapsed().as_secs_f64();
                let plain_s = match before {
                    Some(p) => p,
                    None => plain(comm, &mut data)?,
                };
                if it >= args.warmup {
                    plain_times.push(plain_s);
                }
                t0_override = Some(synced);
            }
        }
        let dt = t0_override.take().unwrap_or_else(|| t0.elapsed().as_secs_f64());
        if it >= args.warmup {
            times.push(dt);
        }
        result = match args.op {
            WorkerOp::ReduceScatter => {
                let m = len / args.world;
                data[args.rank * m..(args.rank + 1) * m].to_vec()
            }
            WorkerOp::Barrier => Vec::new(),
            _ => data.clone(),
        };
        if args.check {
            let tol = tolerance::<T>(args);
            if let Some(i) = (0..want.len()).find(|&i| (result[i].to_f64() - want[i].to_f64()).abs() > tol) {
                return Err(CommError::Worker {
                    what: format!("rank {} {} check", args.rank, args.op.name()),
                    detail: format!(
                        "iteration {it}: element {i} is {:?}, expected {:?} ({} elements)",
                        result[i],
                        want[i],
                        want.len()
                    ),
                });
            }
        }
    }
    let bytes = as_bytes(&result);
    if let Some(path) = &args.out {
        std::fs::write(path, bytes).map_err(|e| CommError::Worker {
            what: format!("rank {}", args.rank),
            detail: format!("cannot write {}: {e}", path.display()),
        })?;
    }
    Ok(WorkerReport {
        rank: args.rank,
        world: args.world,
        op: args.op.name().into(),
        dtype: T::DTYPE,
        len,
        times_s: times,
        plain_times_s: plain_times,
        digested_bytes,
        digest: digest(bytes),
        checked: args.check,
        shared_memory: comm.shares_memory(),
    })
}
