//! `launcher monitor RUN_DIR`: a local Prometheus on the run's discovery
//! files (`RUN_DIR/prometheus/prometheus.yml`, written by `up`), its data in
//! `RUN_DIR/prometheus/data`. It runs in the foreground until interrupted: once
//! the files are checked, this process becomes Prometheus.
use crate::error::{CliError, CliResult, UsageContext};
use clap::Args;
use rlmesh_actors::controller::discovery;
use std::path::PathBuf;

/// Arguments of `launcher monitor`.
#[derive(Args)]
pub struct MonitorArgs {
    /// The run directory.
    run_dir: PathBuf,
    /// Where Prometheus serves its web UI and API.
    #[arg(long, default_value = "127.0.0.1:9090")]
    listen: String,
    /// The Prometheus binary (default: `prometheus` on PATH).
    #[arg(long)]
    prometheus: Option<PathBuf>,
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?).map(|d| d.join(name)).find(|p| p.is_file())
}

/// `launcher monitor`.
pub fn run(a: MonitorArgs) -> CliResult {
    let config = a.run_dir.join(discovery::DIR).join("prometheus.yml");
    if !config.is_file() {
        return Err(CliError::usage(anyhow::anyhow!("{}: no such file; `launcher up` writes it when a run starts (is {} a run directory?)", config.display(), a.run_dir.display())));
    }
    let binary = a.prometheus.clone().or_else(|| on_path("prometheus")).ok_or_else(|| {
        CliError::usage(anyhow::anyhow!("no `prometheus` on PATH: install it (Debian: apt-get install prometheus) or pass --prometheus PATH; {} works with any Prometheus", config.display()))
    })?;
    std::net::TcpListener::bind(&a.listen).usage(format!("--listen {}", a.listen))?;
    let data = a.run_dir.join(discovery::DIR).join("data");
    println!("Prometheus for {} at http://{}/ (targets: http://{}/targets; config {})", a.run_dir.display(), a.listen, a.listen, config.display());
    // This process becomes Prometheus (same pid), so whatever stops it (Ctrl-C, a
    // signal, a test's kill) stops Prometheus, which is never left behind.
    use std::os::unix::process::CommandExt;
    let err = std::process::Command::new(&binary)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!("--storage.tsdb.path={}", data.display()))
        .arg(format!("--web.listen-address={}", a.listen))
        .arg("--log.level=warn")
        .exec();
    Err(CliError::from(anyhow::anyhow!("starting {}: {err}", binary.display())))
}
