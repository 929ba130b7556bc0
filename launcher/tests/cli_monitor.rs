//! `launcher up` writes Prometheus discovery files for every process of a
//! run, and `launcher monitor` starts a real Prometheus (Debian's package) on
//! them: a live six-process run is scraped target by target, with its labels,
//! every dashboard panel's query returns data and every alert rule evaluates.
//! The dashboards are checked structurally (no Grafana server here).
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

/// Percent-encodes a PromQL query for a URL.
fn encode(q: &str) -> String {
    q.bytes().map(|b| if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) { (b as char).to_string() } else { format!("%{b:02X}") }).collect()
}

/// Every panel query of every dashboard in deploy/grafana/dashboards, as (dashboard/panel, expr, legend).
fn dashboard_queries() -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(repo().join("deploy/grafana/dashboards")).unwrap() {
        let path = e.unwrap().path();
        let d: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        for p in d["panels"].as_array().unwrap() {
            for t in p["targets"].as_array().unwrap() {
                out.push((format!("{}: {}", path.file_name().unwrap().to_string_lossy(), p["title"]), t["expr"].as_str().unwrap().to_string(), t["legendFormat"].as_str().unwrap_or("").to_string()));
            }
        }
    }
    out
}

/// The label names a template uses: `{{name}}` (Grafana legends) or `{{ $labels.name }}` (alert annotations).
fn placeholders(template: &str) -> Vec<String> {
    let mut out = vec![];
    let mut rest = template;
    while let Some(i) = rest.find("{{") {
        let Some(j) = rest[i..].find("}}") else { break };
        let inner = rest[i + 2..i + j].trim();
        let name = inner.strip_prefix("$labels.").unwrap_or(inner);
        if !name.starts_with('$') && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
            out.push(name.to_string());
        }
        rest = &rest[i + j + 2..];
    }
    out
}

/// An alert expression's operands without their thresholds: the series it
/// compares (`A > 0 and on (run) B < 0` gives `A` and `B`).
fn signals(expr: &str) -> Vec<String> {
    let mut parts = vec![];
    let (mut depth, mut start) = (0i32, 0usize);
    let b = expr.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'(' => depth += 1,
            b')' => depth -= 1,
            b'a' if depth == 0 && expr[i..].starts_with("and ") && i > 0 && b[i - 1] == b' ' => {
                parts.push(expr[start..i].to_string());
                // Skip `and` and an `on (…)` modifier.
                let mut k = i + 4;
                let tail = expr[k..].trim_start();
                if tail.starts_with("on (") {
                    k = expr.len() - tail.len() + tail.find(')').unwrap() + 1;
                }
                start = k;
                i = k;
                continue;
            }
            _ => {}
        }
        i += 1;
    }
    parts.push(expr[start..].to_string());
    parts
        .into_iter()
        .map(|p| {
            let mut p = p.trim().to_string();
            // A whole operand in parentheses: look inside.
            if p.starts_with('(') && p.ends_with(')') {
                p = p[1..p.len() - 1].to_string();
            }
            // Drop a trailing `OP number`, and a top-level `OP on (…) (…)` comparison.
            for op in [" >= ", " <= ", " == ", " > ", " < "] {
                let mut d = 0i32;
                let mut cut = None;
                for (k, c) in p.char_indices() {
                    match c {
                        '(' => d += 1,
                        ')' => d -= 1,
                        _ if d == 0 && p[k..].starts_with(op) => cut = Some(k),
                        _ => {}
                    }
                }
                if let Some(k) = cut {
                    p.truncate(k);
                    break;
                }
            }
            p.trim().to_string()
        })
        .collect()
}

#[test]
fn alert_signals_are_the_compared_series() {
    assert_eq!(signals("up{job=\"rlmesh\"} == 0"), ["up{job=\"rlmesh\"}"]);
    assert_eq!(signals("(max by (run) (deriv(a[30m])) > 0) and on (run) (max by (run) (deriv(b[30m])) < 0)"), ["max by (run) (deriv(a[30m]))", "max by (run) (deriv(b[30m]))"]);
    assert_eq!(signals("(q(0.9, x) > on (run) (max by (run) (b) - 0.5)) and on (run) max by (run) (b) > 0"), ["q(0.9, x)", "max by (run) (b)"]);
    assert_eq!(placeholders("{{process}} {{ $labels.role }} {{ $value }}"), ["process", "role"]);
}

#[test]
fn dashboards_are_valid_with_unique_ids_the_provisioned_datasource_and_a_unit_and_description_per_panel() {
    let prov = std::fs::read_to_string(repo().join("deploy/grafana/provisioning/datasources/rlmesh.yml")).unwrap();
    let uid = prov.lines().find_map(|l| l.trim().strip_prefix("uid: ")).unwrap().trim().to_string();
    let mut uids = std::collections::HashSet::new();
    let mut n = 0;
    for e in std::fs::read_dir(repo().join("deploy/grafana/dashboards")).unwrap() {
        let path = e.unwrap().path();
        let d: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(uids.insert(d["uid"].as_str().unwrap().to_string()), "{}: dashboard uid used twice", path.display());
        let mut ids = std::collections::HashSet::new();
        for p in d["panels"].as_array().unwrap() {
            let title = p["title"].as_str().unwrap();
            assert!(ids.insert(p["id"].as_u64().unwrap()), "{}: panel id {} twice", path.display(), p["id"]);
            assert_eq!(p["datasource"]["uid"], uid.as_str(), "{title}");
            assert!(p["description"].as_str().is_some_and(|s| s.len() > 20), "{title}: says what it shows");
            assert!(p["fieldConfig"]["defaults"]["unit"].as_str().is_some_and(|u| !u.is_empty()), "{title}: has a unit");
            for t in p["targets"].as_array().unwrap() {
                assert_eq!(t["datasource"]["uid"], uid.as_str(), "{title}");
                assert!(t["expr"].as_str().unwrap().contains("$run") , "{title}: filters by the run");
            }
            n += 1;
        }
    }
    assert_eq!(uids.len(), 5, "overview, rollout, learner, weight sync, faults");
    assert!(n >= 20, "{n} panels");
    println!("NOTE: no Grafana server can be installed here (not in Debian's or the registries this project uses); the dashboards are checked structurally, and every query against a real Prometheus in the live-run test");
}

/// Waits up to 60 s for `q` to return series; returns them.
fn wait_for_data(listen: &str, q: &str, what: &str) -> Vec<Value> {
    let t0 = Instant::now();
    loop {
        let r = api(listen, &format!("/api/v1/query?query={}", encode(q)));
        if let Some(a) = r.as_ref().and_then(|v| v["data"]["result"].as_array()).filter(|a| !a.is_empty()) {
            return a.clone();
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "{what}: `{q}` returns nothing: {r:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
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
    assert!(std::fs::read_to_string(&config).unwrap().contains("rules.yml"), "the run's config loads the alert rules");
    let rules = repo().join("deploy/prometheus/rules.yml");
    let rules_test = repo().join("deploy/prometheus/rules_test.yml");
    for args in [vec!["check", "config", config.to_str().unwrap()], vec!["check", "rules", rules.to_str().unwrap()], vec!["test", "rules", rules_test.to_str().unwrap()]] {
        let check = Command::new(&promtool).args(&args).output().unwrap();
        assert!(check.status.success(), "promtool {args:?}: {}{}", String::from_utf8_lossy(&check.stdout), String::from_utf8_lossy(&check.stderr));
    }

    // `launcher monitor` on an address free now.
    let listen = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().to_string();
    let monitor = Command::new(env!("CARGO_BIN_EXE_launcher")).args(["monitor", run.to_str().unwrap(), "--listen", &listen]).stdout(Stdio::piped()).stderr(Stdio::null()).spawn().unwrap();
    let mut monitor = Guard(monitor);
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(monitor.0.stdout.take().unwrap()), &mut line).unwrap();
    assert!(line.contains(&format!("http://{listen}/")), "{line}");
    // `monitor` became Prometheus (same pid): stopping it leaves no Prometheus behind.
    let t0 = Instant::now();
    let mut cmdline = Vec::new();
    while t0.elapsed() < Duration::from_secs(10) && !String::from_utf8_lossy(&cmdline).contains("--web.listen-address=") {
        std::thread::sleep(Duration::from_millis(20));
        cmdline = std::fs::read(format!("/proc/{}/cmdline", monitor.0.id())).unwrap_or_default();
    }
    assert!(String::from_utf8_lossy(&cmdline).contains("--web.listen-address="), "the monitor's pid runs Prometheus itself: {:?}", String::from_utf8_lossy(&cmdline));

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

    // Every panel of every dashboard returns data from this Prometheus, each
    // series with the labels its legend names.
    let panels = dashboard_queries();
    assert!(panels.len() >= 20, "{} panel queries", panels.len());
    for (where_, expr, legend) in &panels {
        let q = expr.replace("$run", "run").replace("$__rate_interval", "1m");
        let result = wait_for_data(&listen, &q, where_);
        for name in placeholders(legend) {
            assert!(result.iter().all(|s| s["metric"].get(&name).is_some()), "{where_}: legend `{legend}` names {name}, which `{q}` does not return: {result:?}");
        }
    }
    // Every alert rule is loaded from the generated config and evaluates without error.
    let t0 = Instant::now();
    loop {
        let v = api(&listen, "/api/v1/rules").unwrap_or_default();
        let rules: Vec<Value> = v["data"]["groups"].as_array().map(|g| g.iter().flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default()).collect()).unwrap_or_default();
        let evaluated = rules.iter().filter(|r| r["health"] == "ok" && !r["lastEvaluation"].as_str().unwrap_or("0001").starts_with("0001")).count();
        if rules.len() == 11 && evaluated == 11 {
            // Each rule's compared series return data, with the labels its annotations name.
            for r in &rules {
                let (name, query) = (r["name"].as_str().unwrap(), r["query"].as_str().unwrap());
                let annotations: String = r["annotations"].as_object().unwrap().values().filter_map(Value::as_str).collect::<Vec<_>>().join(" ");
                for (k, signal) in signals(query).iter().enumerate() {
                    let result = wait_for_data(&listen, signal, &format!("alert {name}"));
                    if k == 0 {
                        for label in placeholders(&annotations) {
                            assert!(result.iter().all(|s| s["metric"].get(&label).is_some()), "alert {name}: its annotations name {label}, which `{signal}` does not return: {result:?}");
                        }
                    }
                }
            }
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "rules not all loaded and healthy: {rules:?}");
        std::thread::sleep(Duration::from_millis(500));
    }
    // `launcher report` reads the same figures as the dashboards: at every scrape
    // of the RL phase, the controller's gauges equal the report's curve at that step.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
    let range = |q: &str| -> Vec<(f64, f64)> {
        let end = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        let path = format!("/api/v1/query_range?query={}&start={}&end={}&step=1", encode(q), now - 300.0, end);
        let v = api(&listen, &path).unwrap_or_default();
        let values = v["data"]["result"][0]["values"].as_array().cloned().unwrap_or_default();
        values.iter().map(|p| (p[0].as_f64().unwrap(), p[1].as_str().unwrap().parse::<f64>().unwrap())).collect()
    };
    // At least three scrapes inside RL (every 5 s): wait for them.
    let t0 = Instant::now();
    let steps = loop {
        let steps = range("rlmesh_learner_step{role=\"controller\"}");
        let distinct: std::collections::BTreeSet<u64> = steps.iter().map(|(_, s)| *s as u64).filter(|s| *s > 0).collect();
        if distinct.len() >= 3 {
            break steps;
        }
        assert!(t0.elapsed() < Duration::from_secs(60), "fewer than 3 scrapes in RL: {distinct:?}");
        std::thread::sleep(Duration::from_secs(1));
    };
    let report = launcher(&["report", run.to_str().unwrap(), "--json"]);
    assert_eq!(code(&report), 0, "{}", stderr(&report));
    let report: Value = serde_json::from_str(&stdout(&report)).unwrap();
    let curves = &report["runs"][0]["curves"];
    let mut compared = std::collections::BTreeSet::new();
    for (gauge, curve) in [("rlmesh_trajectory_success{role=\"controller\",split=\"train\"}", "trajectory_success"), ("rlmesh_reward_mean{role=\"controller\"}", "reward_mean"), ("rlmesh_unnecessary_tool_rate{role=\"controller\",split=\"train\"}", "unnecessary_tool_rate")] {
        let by_step: std::collections::HashMap<u64, f64> = curves[curve].as_array().unwrap_or_else(|| panic!("report has no {curve}: {report}")).iter().map(|p| (p[0].as_f64().unwrap() as u64, p[1].as_f64().unwrap())).collect();
        let values: std::collections::HashMap<u64, f64> = range(gauge).into_iter().map(|(t, v)| (t as u64, v)).collect();
        for (t, step) in &steps {
            let (Some(value), Some(want)) = (values.get(&(*t as u64)).copied(), by_step.get(&(*step as u64)).filter(|_| *step > 0.0)) else { continue };
            assert!((want - value).abs() <= 1e-12 * want.abs().max(1.0), "{gauge} at RL step {step}: Prometheus {value}, launcher report {want}");
            compared.insert(*step as u64);
        }
    }
    assert!(compared.len() >= 3, "report and dashboards compared at only {compared:?}");
    let down = launcher(&["down", "--run-dir", run.to_str().unwrap()]);
    assert_eq!(code(&down), 0, "{}", stderr(&down));

    // Without discovery files, monitor says what is missing.
    let o = launcher(&["monitor", tmp.path().to_str().unwrap()]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("prometheus.yml") && stderr(&o).contains("launcher up"), "{}", stderr(&o));
}
