//! How long opening a rollout's session takes (per-rollout stdio server: a
//! process start, `initialize` and the reset call; with `prestart`, only the
//! reset) against a shared server's open, and one call. `cargo run -p rlmesh-mcp --example open_latency -- PYTHON SERVER.py`
use rlmesh_mcp::{McpServer, ServerSpec, SessionMode};
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (py, file) = (&args[0], &args[1]);
    let n: usize = args.get(2).and_then(|n| n.parse().ok()).unwrap_or(8);
    for (mode, prestart) in [(SessionMode::Shared, 0), (SessionMode::PerRollout, 0), (SessionMode::PerRollout, n)] {
        let spec = ServerSpec { session: mode, prestart, reset_tool: Some("reset".into()), ..ServerSpec::stdio("bench", [py.as_str(), file.as_str(), "stdio"]) };
        let t = Instant::now();
        let server = McpServer::start(spec).unwrap();
        let start_ms = t.elapsed().as_secs_f64() * 1e3;
        // Let the spares start, as the first group's generation would.
        std::thread::sleep(std::time::Duration::from_secs(if prestart > 0 { 3 * n as u64 } else { 0 }));
        let mut opens = Vec::new();
        let mut calls = Vec::new();
        let mut sessions = Vec::new();
        for _ in 0..n {
            let t = Instant::now();
            let s = server.session(Some(&serde_json::json!({"start": 1}))).unwrap();
            opens.push(t.elapsed().as_secs_f64() * 1e3);
            let t = Instant::now();
            s.call("increment", &serde_json::json!({})).unwrap();
            calls.push(t.elapsed().as_secs_f64() * 1e3);
            sessions.push(s);
        }
        let med = |v: &mut Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        println!("{mode:?}, prestart {prestart}: start {start_ms:.0} ms, open median {:.1} ms (max {:.1}), call median {:.2} ms, {n} sessions", med(&mut opens), opens.last().unwrap(), med(&mut calls));
    }
}
