//! `launcher bench allreduce`: ranks started as hidden `launcher comm-worker` processes, ratio against loopback.
mod common;

use common::*;
use serde_json::Value;

#[test]
fn bench_allreduce_runs_ranks_through_comm_worker_and_prints_the_ratio() {
    let o = launcher(&["bench", "allreduce", "--worlds", "2", "--mib", "1", "--iters", "2", "--warmup", "0"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.lines().any(|l| l.split_whitespace().take(2).eq(["2", "1MiB"])), "{out}");
    let report: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let r = &report["report"]["results"][0];
    let (busbw, loopback, ratio) = (r["busbw_gbps"].as_f64().unwrap(), r["loopback_gbps"].as_f64().unwrap(), r["ratio"].as_f64().unwrap());
    assert!(busbw > 0.0 && loopback > 0.0 && (ratio - busbw / loopback).abs() < 1e-9, "{r}");

    let o = launcher(&["bench", "allreduce", "--worlds", "1"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("--worlds: at least 2 ranks"), "{}", stderr(&o));
}
