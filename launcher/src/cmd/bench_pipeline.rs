//! `launcher bench pipeline`: RL-phase steps/s of one recipe on two
//! topologies (by default `local`, every actor in one process, and
//! `local-procs`, the same job as six processes), run as real `launcher up`
//! jobs in alternating rounds; the ratio is the median of the rounds'.
//!
//! A round's speed is the RL steps after the first, over the seconds between
//! the first and the last step's record in `metrics.jsonl`: the warm-up, the
//! evaluations, start-up and the pipeline's fill are outside it.
use crate::error::{CliError, CliResult, UsageContext};
use clap::Args;
use rlmesh_comm::bench::median;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// Arguments of `launcher bench pipeline`.
#[derive(Args)]
pub struct PipelineArgs {
    /// The baseline topology.
    #[arg(long, default_value = "deploy/local.toml")]
    base: PathBuf,
    /// The topology compared with it.
    #[arg(long, default_value = "deploy/local-procs.toml")]
    against: PathBuf,
    /// The recipe both run.
    #[arg(long, default_value = "configs/calculator-process.toml")]
    recipe: PathBuf,
    /// SFT warm-up steps before the RL phase (so the rollouts look like a real run's).
    #[arg(long, default_value_t = 300)]
    sft_steps: u64,
    /// RL steps timed per run.
    #[arg(long, default_value_t = 20)]
    rl_steps: u64,
    /// Rounds; each runs both topologies, in alternating order.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Keep the runs here (default: a temporary directory, removed after).
    #[arg(long)]
    keep: Option<PathBuf>,
}

/// One run's RL speed.
fn steps_per_s(run: &Path) -> CliResult<f64> {
    let path = run.join("metrics.jsonl");
    let text = std::fs::read_to_string(&path).usage(format!("reading {}", path.display()))?;
    let secs: Vec<f64> = text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()?["seconds"].as_f64()).collect();
    if secs.len() < 2 {
        return Err(anyhow::anyhow!("{}: fewer than 2 RL steps recorded", path.display()).into());
    }
    Ok((secs.len() - 1) as f64 / (secs[secs.len() - 1] - secs[0]).max(1e-9))
}

fn one_run(a: &PipelineArgs, topology: &Path, run: &Path) -> CliResult<f64> {
    let log = run.with_extension("log");
    let out = Command::new(std::env::current_exe()?)
        .args(["up".as_ref(), topology.as_os_str(), "--recipe".as_ref(), a.recipe.as_os_str(), "--run-dir".as_ref(), run.as_os_str()])
        .args(["--sft-steps", &a.sft_steps.to_string(), "--max-steps", &a.rl_steps.to_string(), "--eval-limit", "8", "--metrics-addr", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).usage(format!("creating {}", log.display()))?)
        .status()
        .usage("starting launcher up")?;
    if !out.success() {
        return Err(failed_up(&topology.display().to_string(), out, &log));
    }
    steps_per_s(run)
}

/// A failed `launcher up` child: its exit status and the last lines of its log.
pub(crate) fn failed_up(what: &str, status: std::process::ExitStatus, log: &Path) -> CliError {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let last: Vec<&str> = text.lines().rev().take(8).collect();
    anyhow::anyhow!("{what}: launcher up failed ({status}); the end of {}:\n{}", log.display(), last.into_iter().rev().collect::<Vec<_>>().join("\n")).into()
}

/// `launcher bench pipeline`.
pub fn pipeline(a: PipelineArgs) -> CliResult {
    if a.rounds == 0 || a.rl_steps < 3 {
        return Err(CliError::usage(anyhow::anyhow!("--rounds: at least 1; --rl-steps: at least 3")));
    }
    let root = a.keep.clone().unwrap_or_else(|| std::env::temp_dir().join(format!("rlmesh-bench-pipeline-{}", std::process::id())));
    std::fs::create_dir_all(&root).usage(format!("creating {}", root.display()))?;
    let name = |p: &Path| p.file_stem().map_or_else(|| p.display().to_string(), |s| s.to_string_lossy().into_owned());
    let (b, c) = (name(&a.base), name(&a.against));
    println!("round  {b:>12}  {c:>12}  ratio ({c}/{b}, RL steps/s)");
    let mut rows = vec![];
    for r in 0..a.rounds {
        let order = if r % 2 == 0 { [(&a.base, "base"), (&a.against, "against")] } else { [(&a.against, "against"), (&a.base, "base")] };
        let (mut base, mut against) = (0.0, 0.0);
        for (topo, which) in order {
            eprintln!("[bench pipeline] round {}/{}: {} …", r + 1, a.rounds, topo.display());
            let s = one_run(&a, topo, &root.join(format!("round{r}-{which}")))?;
            if which == "base" {
                base = s;
            } else {
                against = s;
            }
        }
        println!("{:>5}  {base:>12.3}  {against:>12.3}  {:.3}", r + 1, against / base);
        rows.push(json!({ "round": r + 1, "base_steps_per_s": base, "against_steps_per_s": against, "ratio": against / base }));
    }
    let ratios: Vec<f64> = rows.iter().map(|r| r["ratio"].as_f64().unwrap_or(f64::NAN)).collect();
    let m = median(&ratios);
    println!("median ratio {c}/{b}: {m:.3} over {} rounds", a.rounds);
    println!("{}", json!({ "bench": "pipeline", "base": a.base, "against": a.against, "recipe": a.recipe, "rounds": rows, "median_ratio": m }));
    if a.keep.is_none() {
        let _ = std::fs::remove_dir_all(&root);
    }
    Ok(())
}
