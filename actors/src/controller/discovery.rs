//! Prometheus discovery for a run: `RUN_DIR/prometheus/targets.json` (file_sd)
//! and `RUN_DIR/prometheus/prometheus.yml`, which scrapes it.
//!
//! Every process of the run serves `/metrics` (the controller's on its metrics
//! address, each `launcher node` on its host and planned metrics port); each
//! is one target, labelled with the run, its process, host, primary role
//! (the first of its actors' roles: `controller` for the controller's own
//! process) and, for a learner or rollout process, its rank. The labels are
//! bounded by the plan's size: no task or rollout id is a label.
//!
//! `launcher monitor RUN_DIR` starts a local Prometheus on the config; any
//! other Prometheus can take `targets.json` through its own `file_sd_configs`.
use super::plan::Plan;
use super::topology::Role;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// The folder of a run directory with its Prometheus files.
pub const DIR: &str = "prometheus";

/// One scrape target: `host:port` and its labels.
pub fn targets(run: &str, plan: Option<&Plan>, controller_metrics: &str) -> Value {
    let mut out = Vec::new();
    let Some(plan) = plan else {
        // One process: every role in it.
        return json!([{"targets": [controller_metrics], "labels": {"run": run, "process": "main", "role": "controller"}}]);
    };
    for p in &plan.processes {
        let role = p.roles.first().copied().unwrap_or(Role::Controller);
        let addr = if p.roles.contains(&Role::Controller) { controller_metrics.to_string() } else { format!("{}:{}", p.host, p.ports.metrics) };
        let mut labels = json!({"run": run, "process": p.name, "host": p.host, "role": role.as_str()});
        if let Some(a) = p.actors.iter().find(|a| matches!(a.role, Role::Learner | Role::Rollout)) {
            labels["rank"] = json!(a.rank.to_string());
        }
        out.push(json!({"targets": [addr], "labels": labels}));
    }
    Value::Array(out)
}

/// Writes `targets.json` (atomically: Prometheus re-reads it on change) and
/// `prometheus.yml` into `RUN_DIR/prometheus/`; returns the config's path.
pub fn write(run_dir: &Path, run: &str, plan: Option<&Plan>, controller_metrics: &str, rules: Option<&Path>) -> std::io::Result<PathBuf> {
    let dir = run_dir.join(DIR);
    std::fs::create_dir_all(&dir)?;
    let dir = std::path::absolute(&dir)?;
    let targets_path = dir.join("targets.json");
    let tmp = dir.join(format!("targets.json.tmp.{}", std::process::id()));
    std::fs::write(&tmp, serde_json::to_string_pretty(&targets(run, plan, controller_metrics)).expect("json"))?;
    std::fs::rename(&tmp, &targets_path)?;
    let quote = |p: &Path| serde_json::to_string(&p.display().to_string()).expect("json");
    let mut yml = format!(
        "# Written by `launcher up` for the run in {run_dir}; `launcher monitor {run_dir}` starts a Prometheus on it.\n\
         global:\n  scrape_interval: 5s\n  evaluation_interval: 5s\n  external_labels:\n    rlmesh_run: {run_q}\n\
         scrape_configs:\n  - job_name: rlmesh\n    file_sd_configs:\n      - files: [{targets}]\n        refresh_interval: 5s\n",
        run_dir = run_dir.display(),
        run_q = serde_json::to_string(run).expect("json"),
        targets = quote(&targets_path),
    );
    if let Some(r) = rules {
        yml.push_str(&format!("rule_files: [{}]\n", quote(&std::path::absolute(r)?)));
    }
    let config = dir.join("prometheus.yml");
    std::fs::write(&config, yml)?;
    Ok(config)
}
