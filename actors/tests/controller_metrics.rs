//! `/metrics` is served over loopback and a real HTTP GET returns the named series.
use rlmesh_actors::metrics::{TARGET_LABELS, markdown_table, serve, Kind, Metrics, DEFINITIONS};
use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};

/// A raw HTTP/1.1 GET: `(status line, headers + body)`.
fn get(addr: SocketAddr, path: &str) -> (String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAccept: text/plain\r\n\r\n").unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    let (status, rest) = response.split_once("\r\n").unwrap();
    (status.to_string(), rest.to_string())
}

#[test]
fn metrics_endpoint_serves_the_named_series_over_loopback() {
    let m = Metrics::new();
    m.reward_component.with_label_values(&["format_ok"]).set(0.5);
    m.trajectory_success.with_label_values(&["eval"]).set(0.97);
    m.groups_trained_total.inc_by(3);
    m.groups_dropped_total.with_label_values(&["stale"]).inc();
    m.actor_restarts_total.with_label_values(&["rollout-0"]).inc();
    m.staleness.observe(1.0);
    m.learner_loss.set(-0.25);

    let server = serve(&m, "127.0.0.1:0").unwrap();
    let addr = server.local_addr();
    assert_ne!(addr.port(), 0, "port 0 binds an ephemeral port");

    let (status, rest) = get(addr, "/metrics");
    assert_eq!(status, "HTTP/1.1 200 OK");
    let (headers, body) = rest.split_once("\r\n\r\n").unwrap();
    assert!(headers.contains("Content-Type: text/plain; version=0.0.4"), "{headers}");
    assert!(headers.contains(&format!("Content-Length: {}", body.len())), "{headers}");
    for series in [
        "rlmesh_reward_component{component=\"format_ok\"} 0.5",
        "rlmesh_trajectory_success{split=\"eval\"} 0.97",
        "rlmesh_groups_trained_total 3",
        "rlmesh_groups_dropped_total{reason=\"stale\"} 1",
        "rlmesh_actor_restarts_total{actor=\"rollout-0\"} 1",
        "rlmesh_staleness_bucket{le=\"1\"} 1",
        "rlmesh_staleness_count 1",
        "rlmesh_learner_loss -0.25",
        "rlmesh_weight_sync_seconds_count 0",
        "# TYPE rlmesh_groups_trained_total counter",
    ] {
        assert!(body.lines().any(|l| l == series), "missing {series:?} in\n{body}");
    }

    // Values change between scrapes; other paths and methods are refused.
    m.groups_trained_total.inc();
    assert!(get(addr, "/metrics").1.contains("rlmesh_groups_trained_total 4"));
    assert_eq!(get(addr, "/").0, "HTTP/1.1 404 Not Found");
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(b"POST /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut r = String::new();
    s.read_to_string(&mut r).unwrap();
    assert!(r.starts_with("HTTP/1.1 405"), "{r}");

    drop(server);
    assert!(TcpStream::connect(addr).is_err(), "dropping the server closes the port");
}

#[test]
fn metric_definitions_are_unique_prefixed_registered_and_documented() {
    let names: HashSet<&str> = DEFINITIONS.iter().map(|d| d.name).collect();
    assert_eq!(names.len(), DEFINITIONS.len(), "names are unique");
    assert!(DEFINITIONS.iter().all(|d| d.name.starts_with("rlmesh_") && !d.help.is_empty()));
    assert!(DEFINITIONS.iter().filter(|d| d.kind == Kind::Counter).all(|d| d.name.ends_with("_total")));
    // Base units: a histogram of times is in seconds, a byte count in bytes; a
    // metric's own labels never clash with the labels every scrape target
    // carries (Prometheus would rename them `exported_*`); no id-like label.
    for d in DEFINITIONS {
        if d.kind == Kind::Histogram && d.help.starts_with("Seconds") || d.help.starts_with("Wall seconds") {
            assert!(d.name.ends_with("_seconds"), "{}: a time in seconds ends in _seconds", d.name);
        }
        if d.help.starts_with("Bytes") {
            assert!(d.name.ends_with("_bytes_total") || d.name.ends_with("_bytes"), "{}: bytes end in _bytes", d.name);
        }
        for l in d.labels {
            assert!(!TARGET_LABELS.contains(l), "{}: label {l} clashes with a target label ({TARGET_LABELS:?})", d.name);
            assert!(!["task", "task_id", "rollout", "group", "prompt_id", "step", "version", "pid"].contains(l), "{}: label {l} would be unbounded", d.name);
        }
    }

    // Single series appear at zero; labelled families once they have a child.
    let text = Metrics::new().encode();
    for d in DEFINITIONS.iter().filter(|d| d.labels.is_empty()) {
        assert!(text.contains(&format!("# TYPE {} {}", d.name, d.kind.as_str())), "{} not exported", d.name);
    }
    let exported: HashSet<String> = Metrics::new()
        .registry()
        .gather()
        .iter()
        .map(|f| f.name().to_string())
        .collect();
    assert!(exported.iter().all(|n| names.contains(n.as_str())), "every exported series is defined");

    let table = markdown_table();
    assert_eq!(table.lines().count(), 2 + DEFINITIONS.len());
    assert!(table.contains("| `rlmesh_reward_component` | gauge | `component` | Mean of each reward component"), "{table}");
    assert!(table.contains("| `rlmesh_actor_restarts_total` | counter | `actor` |"));
}

#[test]
fn every_metric_the_pipeline_needs_is_defined() {
    let names: HashSet<&str> = DEFINITIONS.iter().map(|d| d.name).collect();
    for n in [
        "rlmesh_reward_component",
        "rlmesh_reward_mean",
        "rlmesh_reward_std",
        "rlmesh_trajectory_success",
        "rlmesh_tool_call_rate",
        "rlmesh_unnecessary_tool_rate",
        "rlmesh_repeated_call_rate",
        "rlmesh_tokens_per_second",
        "rlmesh_staleness",
        "rlmesh_weight_sync_seconds",
        "rlmesh_learner_loss",
        "rlmesh_learner_kl",
        "rlmesh_learner_entropy",
        "rlmesh_learner_clip_fraction",
        "rlmesh_learner_grad_norm",
        "rlmesh_actor_restarts_total",
        "rlmesh_groups_dispatched_total",
        "rlmesh_groups_trained_total",
        "rlmesh_groups_dropped_total",
    ] {
        assert!(names.contains(n), "{n} is not defined");
    }
}

/// Kills the child process it owns when dropped.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The `prometheus` binary on PATH, if installed.
fn prometheus_binary() -> Option<std::path::PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| std::path::Path::new(d).join("prometheus")).find(|p| p.is_file())
}

#[test]
fn a_real_prometheus_server_scrapes_the_endpoint() {
    let Some(binary) = prometheus_binary() else {
        eprintln!("SKIPPED: no `prometheus` on PATH (apt-get install prometheus)");
        return;
    };
    let m = Metrics::new();
    m.groups_trained_total.inc_by(3);
    m.reward_component.with_label_values(&["format_ok"]).set(0.5);
    let server = serve(&m, "127.0.0.1:0").unwrap();

    let dir = tempfile::tempdir().unwrap();
    let web = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: rlmesh\n    static_configs:\n      - targets: ['{}']\n",
            server.local_addr()
        ),
    )
    .unwrap();
    let _prometheus = Child(
        std::process::Command::new(binary)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={web}"))
            .arg("--log.level=warn")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap(),
    );

    // PromQL: rlmesh_reward_component{component="format_ok"} and the counter, as Prometheus stored them.
    let queries = [("rlmesh_groups_trained_total", "\"3\"]"), ("rlmesh_reward_component%7Bcomponent%3D%22format_ok%22%7D", "\"0.5\"]")];
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    for (query, value) in queries {
        loop {
            let body = TcpStream::connect(web).ok().map(|mut s| {
                let _ = write!(s, "GET /api/v1/query?query={query} HTTP/1.1\r\nHost: {web}\r\nConnection: close\r\n\r\n");
                let mut r = String::new();
                let _ = s.read_to_string(&mut r);
                r
            });
            if body.as_deref().is_some_and(|b| b.contains("\"status\":\"success\"") && b.contains(value)) {
                break;
            }
            assert!(std::time::Instant::now() < deadline, "Prometheus never stored {query} = {value}; last answer: {body:?}");
            std::thread::sleep(std::time::Duration::from_millis(250));
        }
    }
}

/// The README's metric table is the one generated from the definitions, word for word.
#[test]
fn the_readme_metric_table_is_the_generated_one() {
    let readme = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../README.md")).unwrap();
    let table = markdown_table();
    assert!(readme.contains(&table), "README.md's metric table differs from metrics::markdown_table(); paste this one:\n{table}");
}

/// Tool calls and turns of trained rollouts, counted by hand: a known tool
/// keeps its name, any other is `other`; failed calls are errors.
#[test]
fn tool_calls_and_turns_are_counted_per_tool_with_a_bounded_label_set() {
    let step = |name: &str, ok: bool, ms: f64| {
        serde_json::json!({"turn": 0, "index": 0, "name": name, "arguments": {}, "result": "1", "success": ok, "error": null, "latency_ms": ms, "repeated": false})
    };
    let trajectory = |steps: Vec<serde_json::Value>, assistant_turns: usize| -> rlmesh_core::Trajectory {
        let mut messages = vec![serde_json::json!({"role": "user", "content": "q"})];
        for _ in 0..assistant_turns {
            messages.push(serde_json::json!({"role": "assistant", "content": "a"}));
            messages.push(serde_json::json!({"role": "tool", "content": "1"}));
        }
        serde_json::from_value(serde_json::json!({
            "task_id": "t", "sample_index": 0, "prompt_len": 1, "rendered_prompt": "", "token_ids": [1], "loss_mask": [0], "logprobs": [0.0],
            "versions": [0], "segments": [], "summary": null, "steps": steps, "format_errors": [], "messages": messages,
            "completion": "", "final_answer": "", "stop_reason": "answered"
        }))
        .unwrap()
    };
    let m = Metrics::new();
    let tools = vec!["calculator".to_string()];
    m.zero_tool_series(&tools);
    let ts = [trajectory(vec![step("calculator", true, 2.0), step("calculator", false, 4.0)], 3), trajectory(vec![step("web_search", false, 1.0)], 2), trajectory(vec![], 1)];
    m.observe_rollouts(ts.iter(), &tools);
    let calls = |tool: &str, outcome: &str| m.tool_calls_total.with_label_values(&[tool, outcome]).get();
    assert_eq!((calls("calculator", "ok"), calls("calculator", "error"), calls("other", "error"), calls("other", "ok")), (1, 1, 1, 0));
    let latency = m.tool_call_seconds.with_label_values(&["calculator"]);
    assert_eq!(latency.get_sample_count(), 2);
    assert!((latency.get_sample_sum() - 0.006).abs() < 1e-12);
    assert_eq!(m.turns_per_trajectory.get_sample_count(), 3);
    assert_eq!(m.turns_per_trajectory.get_sample_sum(), 6.0);
    // Only the allowed tools and `other` ever appear as labels.
    let text = m.encode();
    assert!(!text.contains("web_search"), "an unknown tool name must not become a label");
}
