//! `launcher up` writes Prometheus discovery files for every process of a
//! run, and `launcher monitor` starts a real Prometheus (Debian's package) on
//! them: a live six-process run is scraped target by target, with its labels.
//! Without `prometheus` / `promtool` on PATH the test prints SKIPPED.
mod common;

use common::*;
use serde_json::Value;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(name)).find(|p| p.is_file())
}

/// Kills the child it owns when dropped.
struct Guard(Child);
impl Drop for Guard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// GET a Prometheus API path; the JSON body.
fn api(addr: &str, path: &str) -> Option<Value> {
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut r = String::new();
    s.read_to_string(&mut r).ok()?;
    serde_json::from_str(r.split_once("\r\n\r\n")?.1).ok()
}

fn phase(run: &Path) -> Option<String> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(run.join("status.json")).ok()?).ok()?;
    v["phase"].as_str().map(String::from)
}

#[test]
fn a_real_prometheus_scrapes_every_process_of_a_live_run_through_the_generated_config() {
    let (Some(_), Some(promtool)) = (on_path("prometheus"), on_path("promtool")) else {
        println!("SKIPPED: no `prometheus` / `promtool` on PATH (Debian: apt-get install prometheus; scripts/test does as root)");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    let topo = shipped_on_free_ports("local-procs", tmp.path());
    let recipe = tmp.path().join("long.toml");
    std::fs::write(&recipe, "reward = \"process\"\n[tasks]\nsize = 64\nheld_out = 100\n[sft]\nsteps = 40\nbatch_size = 8\ntasks = 512\n[rl]\nsteps = 500\ngroup_size = 4\ngroups_per_step = 2\nmax_turns = 2\nmax_new_tokens = 24\n").unwrap();
    let run = tmp.path().join("run");
    let up = Command::new(env!("CARGO_BIN_EXE_launcher"))
        .current_dir(repo())
        .args(["up", topo.to_str().unwrap(), "--recipe", recipe.to_str().unwrap(), "--run-dir", run.to_str().unwrap(), "--metrics-addr", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(tmp.path().join("up.err")).unwrap())
        .spawn()
        .unwrap();
    let _up = Guard(up);
    let t0 = Instant::now();
    while phase(&run).as_deref() != Some("rl") {
        assert!(t0.elapsed() < Duration::from_secs(300), "no RL step: {}", std::fs::read_to_string(tmp.path().join("up.err")).unwrap_or_default());
        std::thread::sleep(Duration::from_millis(300));
    }

    // The generated files: one target per process, labelled; the config passes promtool.
    let targets: Value = serde_json::from_str(&std::fs::read_to_string(run.join("prometheus/targets.json")).unwrap()).unwrap();
    assert_eq!(targets.as_array().unwrap().len(), 6);
    let config = run.join("prometheus/prometheus.yml");
    let check = Command::new(&promtool).args(["check", "config", config.to_str().unwrap()]).output().unwrap();
    assert!(check.status.success(), "promtool: {}{}", String::from_utf8_lossy(&check.stdout), String::from_utf8_lossy(&check.stderr));

    // `launcher monitor` on an address free now.
    let listen = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let monitor = Command::new(env!("CARGO_BIN_EXE_launcher")).args(["monitor", run.to_str().unwrap(), "--listen", &listen]).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut monitor = Guard(monitor);
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(monitor.0.stdout.take().unwrap()), &mut line).unwrap();
    assert!(line.contains(&format!("http://{listen}/")), "{line}");

    // Every process scraped and up, with its role; the learner ranks and rollout processes apart.
    let t0 = Instant::now();
    let results = loop {
        let r = api(&listen, "/api/v1/query?query=up").map(|v| v["data"]["result"].as_array().cloned().unwrap_or_default()).unwrap_or_default();
        if r.len() == 6 && r.iter().all(|s| s["value"][1] == "1") {
            break r;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "not every target up: {r:?}");
        std::thread::sleep(Duration::from_millis(300));
    };
    let mut roles: Vec<(String, String)> = results.iter().map(|s| (s["metric"]["role"].as_str().unwrap().to_string(), s["metric"]["rank"].as_str().unwrap_or("-").to_string())).collect();
    roles.sort();
    let want = [("controller", "-"), ("learner", "0"), ("learner", "1"), ("reward", "-"), ("rollout", "0"), ("rollout", "1")];
    assert_eq!(roles, want.map(|(a, b)| (a.to_string(), b.to_string())));
    assert!(results.iter().all(|s| s["metric"]["run"] == "run"), "{results:?}");
    // A series the controller counts, stored by that Prometheus.
    let t0 = Instant::now();
    while api(&listen, "/api/v1/query?query=rlmesh_groups_trained_total%7Brole%3D%22controller%22%7D").is_none_or(|v| v["data"]["result"].as_array().is_none_or(|r| r.is_empty())) {
        assert!(t0.elapsed() < Duration::from_secs(30), "no rlmesh_groups_trained_total from the controller");
        std::thread::sleep(Duration::from_millis(300));
    }
    let down = launcher(&["down", "--run-dir", run.to_str().unwrap()]);
    assert_eq!(code(&down), 0, "{}", stderr(&down));

    // Without discovery files, monitor says what is missing.
    let o = launcher(&["monitor", tmp.path().to_str().unwrap()]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("prometheus.yml") && stderr(&o).contains("launcher up"), "{}", stderr(&o));
}
