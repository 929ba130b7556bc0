//! One rank of a CPU collective group, for tests and benchmarks.
//!
//! `rlmesh-comm-worker --rank R --world N --addr HOST:PORT [flags]` runs one
//! rank (flags: `rlmesh_comm::worker`); `rlmesh-comm-worker bench [--quick]`
//! runs the all-reduce benchmark, spawning ranks of this same binary, and
//! prints the table and the JSON report.
use std::process::ExitCode;

use rlmesh_comm::bench::{bench_allreduce, BenchConfig, WorkerCommand};

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("bench") {
        return bench(&args[1..]);
    }
    rlmesh_comm::worker_main(args)
}

fn bench(args: &[String]) -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("cannot find this executable: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut cfg = BenchConfig::new(WorkerCommand::new(exe));
    if args.iter().any(|a| a == "--quick") {
        cfg.sizes = vec![1 << 20, 4 << 20];
        cfg.iters = 3;
        cfg.warmup = 1;
    }
    match bench_allreduce(&cfg) {
        Ok(report) => {
            print!("{}", report.to_table());
            println!("{}", serde_json::to_string(&report).expect("report serialises"));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("bench failed: {e}");
            ExitCode::FAILURE
        }
    }
}
