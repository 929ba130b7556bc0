//! Shared helpers: run a world of `rlmesh-comm-worker` processes and read their results.
#![allow(dead_code)]

use std::path::PathBuf;
use std::time::Duration;

use rlmesh_comm::testing::{run_ranks_on_free_port, RankOutput, WorkerCommand};
use rlmesh_comm::worker::{WorkerArgs, WorkerOp};
use rlmesh_comm::{Bf16, DType};

/// The worker binary cargo built for these tests.
pub fn worker() -> WorkerCommand {
    WorkerCommand::new(env!("CARGO_BIN_EXE_rlmesh-comm-worker"))
}

/// Every wait in these tests is bounded by this.
pub const DEADLINE: Duration = Duration::from_secs(30);

/// The test's own copy of the documented data formula: element `i` of rank `r`.
pub fn value(r: usize, i: usize) -> f64 {
    (i % 17) as f64 + 20.0 * r as f64
}

/// Decodes little-endian result bytes of `dtype` to f64.
pub fn decode(dtype: DType, bytes: &[u8]) -> Vec<f64> {
    match dtype {
        DType::F32 => bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap()) as f64).collect(),
        DType::F64 => bytes.chunks_exact(8).map(|c| f64::from_le_bytes(c.try_into().unwrap())).collect(),
        DType::Bf16 => bytes
            .chunks_exact(2)
            .map(|c| Bf16(u16::from_le_bytes(c.try_into().unwrap())).to_f32() as f64)
            .collect(),
    }
}

/// What one world run produced.
pub struct Run {
    pub outputs: Vec<RankOutput>,
    /// Each rank's `--out` bytes.
    pub results: Vec<Vec<u8>>,
    _dir: tempfile::TempDir,
}

impl Run {
    /// Panics with every rank's stderr unless all ranks succeeded.
    pub fn assert_ok(&self) {
        for o in &self.outputs {
            assert!(o.success(), "rank {} failed ({:?}): {}", o.rank, o.status, o.stderr);
        }
    }

    /// Asserts all ranks' result bytes are identical, and returns rank 0's as f64.
    pub fn identical(&self, dtype: DType) -> Vec<f64> {
        for (r, b) in self.results.iter().enumerate() {
            assert!(b == &self.results[0], "rank {r}'s result differs bitwise from rank 0's");
        }
        decode(dtype, &self.results[0])
    }
}

/// Runs `world` workers; `edit(rank, &mut args)` customises each rank's
/// arguments (on another port when the probed one was taken, see
/// [`run_ranks_on_free_port`]).
pub fn run_world(world: usize, edit: impl Fn(usize, &mut WorkerArgs)) -> Run {
    let dir = tempfile::tempdir().expect("temp dir");
    let paths: Vec<PathBuf> = (0..world).map(|r| dir.path().join(format!("rank{r}.bin"))).collect();
    let outputs = run_ranks_on_free_port(&worker(), world, DEADLINE, |addr, rank| {
        let mut a = WorkerArgs::new(rank, world, addr.to_string());
        a.cookie = "test-cookie".into();
        a.timeout = Duration::from_secs(10);
        a.connect_timeout = Duration::from_secs(10);
        a.block_bytes = 1024;
        a.check = true;
        a.out = Some(paths[rank].clone());
        edit(rank, &mut a);
        (a.to_args(), a.env())
    })
    .expect("spawn workers");
    let results = paths.iter().map(|p| std::fs::read(p).unwrap_or_default()).collect();
    Run { outputs, results, _dir: dir }
}

/// Runs one op with the given dtype and length on `world` ranks.
pub fn run_op(world: usize, op: WorkerOp, dtype: DType, len: usize) -> Run {
    run_world(world, |_, a| {
        a.op = op;
        a.dtype = dtype;
        a.len = len;
        a.iters = 2;
    })
}
