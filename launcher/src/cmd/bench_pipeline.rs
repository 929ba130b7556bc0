//! `launcher bench pipeline`: RL-phase steps/s of one recipe on two
//! topologies (by default `local`, every actor in one process, and
//! `local-procs`, the same job as six processes), run as real `launcher up`
//! jobs in alternating rounds; the ratio is the median of the rounds'.
//!
//! A round's speed is the RL steps after the first, over the seconds between
//! the first and the last step's record in `metrics.jsonl`: the warm-up, the
//! evaluations, start-up and the pipeline's fill are outside it.
//!
//! Every run starts its RL phase from the same weights: the bench writes the
//! recipe again with `[sft] share = true`, so the first run's warm-up is
//! stored beside the runs and every later run restores it. (Each run warming
//! up on its own made the topologies train different policies: two learner
//! ranks sum their gradients in another order, and after a short warm-up the
//! rollouts of two such policies differed by 35% in length.) The table also
//! shows each side's generated tokens per RL step, so a reader can see that
//! both sides did the same work.
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
    /// SFT warm-up steps before the RL phase, run once and shared by every run (so the rollouts look like a real run's).
    #[arg(long, default_value_t = 1200)]
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

/// One run's RL phase: steps/s and the mean generated tokens per step.
struct RlSpeed {
    steps_per_s: f64,
    tokens_per_step: f64,
}

fn rl_speed(run: &Path) -> CliResult<RlSpeed> {
    let path = run.join("metrics.jsonl");
    let text = std::fs::read_to_string(&path).usage(format!("reading {}", path.display()))?;
    let rows: Vec<Value> = text.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).collect();
    let secs: Vec<f64> = rows.iter().filter_map(|r| r["seconds"].as_f64()).collect();
    if secs.len() < 2 {
        return Err(anyhow::anyhow!("{}: fewer than 2 RL steps recorded", path.display()).into());
    }
    let tokens: Vec<f64> = rows.iter().filter_map(|r| r["generated_tokens"].as_f64()).collect();
    Ok(RlSpeed {
        steps_per_s: (secs.len() - 1) as f64 / (secs[secs.len() - 1] - secs[0]).max(1e-9),
        tokens_per_step: tokens.iter().sum::<f64>() / tokens.len().max(1) as f64,
    })
}

/// The recipe again, with `sft.steps` and `sft.share = true`, under the same
/// name (a recipe's name is its file's stem) in `root`.
fn shared_warm_up_recipe(recipe: &Path, sft_steps: u64, root: &Path) -> CliResult<PathBuf> {
    let text = std::fs::read_to_string(recipe).usage(format!("reading {}", recipe.display()))?;
    let mut doc: toml::Table = toml::from_str(&text).usage(format!("{}: not a TOML recipe", recipe.display()))?;
    let sft = doc.entry("sft").or_insert_with(|| toml::Value::Table(toml::Table::new()));
    let sft = sft.as_table_mut().ok_or_else(|| CliError::usage(anyhow::anyhow!("{}: `sft` is not a table", recipe.display())))?;
    sft.insert("steps".into(), toml::Value::Integer(sft_steps.min(i64::MAX as u64) as i64));
    sft.insert("share".into(), toml::Value::Boolean(true));
    let out = root.join(recipe.file_name().unwrap_or("recipe.toml".as_ref()));
    std::fs::write(&out, toml::to_string(&doc).expect("a TOML table serialises")).usage(format!("writing {}", out.display()))?;
    Ok(out)
}

fn one_run(recipe: &Path, a: &PipelineArgs, topology: &Path, run: &Path) -> CliResult<RlSpeed> {
    let log = run.with_extension("log");
    let out = Command::new(std::env::current_exe()?)
        .args(["up".as_ref(), topology.as_os_str(), "--recipe".as_ref(), recipe.as_os_str(), "--run-dir".as_ref(), run.as_os_str()])
        .args(["--max-steps", &a.rl_steps.to_string(), "--eval-limit", "8", "--metrics-addr", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).usage(format!("creating {}", log.display()))?)
        .status()
        .usage("starting launcher up")?;
    if !out.success() {
        return Err(failed_up(&topology.display().to_string(), out, &log));
    }
    rl_speed(run)
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
    let recipe = shared_warm_up_recipe(&a.recipe, a.sft_steps, &root)?;
    eprintln!("[bench pipeline] the first run warms up ({} SFT steps) and stores it; every later run starts from it", a.sft_steps);
    println!("round  {b:>12}  {c:>12}  ratio ({c}/{b}, RL steps/s)  tokens/step ({b}, {c})");
    let mut rows = vec![];
    for r in 0..a.rounds {
        let order = if r % 2 == 0 { [(&a.base, "base"), (&a.against, "against")] } else { [(&a.against, "against"), (&a.base, "base")] };
        let (mut base, mut against) = (None, None);
        for (topo, which) in order {
            eprintln!("[bench pipeline] round {}/{}: {} …", r + 1, a.rounds, topo.display());
            let s = one_run(&recipe, &a, topo, &root.join(format!("round{r}-{which}")))?;
            if which == "base" {
                base = Some(s);
            } else {
                against = Some(s);
            }
        }
        let (base, against) = (base.expect("ran"), against.expect("ran"));
        let ratio = against.steps_per_s / base.steps_per_s;
        println!(
            "{:>5}  {:>12.3}  {:>12.3}  {ratio:.3}  {:.0}, {:.0}",
            r + 1,
            base.steps_per_s,
            against.steps_per_s,
            base.tokens_per_step,
            against.tokens_per_step
        );
        rows.push(json!({
            "round": r + 1, "base_steps_per_s": base.steps_per_s, "against_steps_per_s": against.steps_per_s, "ratio": ratio,
            "base_tokens_per_step": base.tokens_per_step, "against_tokens_per_step": against.tokens_per_step,
        }));
    }
    let ratios: Vec<f64> = rows.iter().map(|r| r["ratio"].as_f64().unwrap_or(f64::NAN)).collect();
    let m = median(&ratios);
    println!("median ratio {c}/{b}: {m:.3} over {} rounds", a.rounds);
    println!("{}", json!({ "bench": "pipeline", "base": a.base, "against": a.against, "recipe": a.recipe, "sft_steps": a.sft_steps, "rounds": rows, "median_ratio": m }));
    if a.keep.is_none() {
        let _ = std::fs::remove_dir_all(&root);
    }
    Ok(())
}
