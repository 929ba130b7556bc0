//! `launcher bench grpo`: whole RL steps of one recipe in rlmesh and in
//! Hugging Face TRL's `GRPOTrainer(tools=…)` on the same work, in alternating
//! rounds; the ratio is the median of the rounds'.
//!
//! The same work on both sides:
//! - the same starting weights: the recipe's warm-up, made once and cached
//!   (`[sft] share`), then loaded by both;
//! - the same task prompts in the same order (rlmesh trains group g on
//!   training task g; TRL gets those tasks as its dataset, unshuffled);
//! - the same rendered prompts: every prompt TRL renders is compared byte for
//!   byte with rlmesh's own rendering, and the bench stops on a difference;
//! - the same tools and reward: the calculator and the process reward written
//!   once more in Python (tests/oracle/bench_grpo_trl.py), the reward checked
//!   against rlmesh's on every completion TRL generated;
//! - the same hyper-parameters, as far as TRL allows (the script lists the rest).
//!
//! A side's speed is its RL steps after the first over the seconds between the
//! first and the last step's end: start-up, the warm-up and evaluations are
//! outside it on both sides.
use crate::repo::{python, repo_root};
use crate::error::{CliError, CliResult, UsageContext};
use clap::Args;
use rlmesh_actors::controller::recipe::{EstimatorKind, Recipe, RewardKind};
use rlmesh_actors::controller::warm_start;
use rlmesh_comm::bench::median;
use rlmesh_core::tools::{ExecLimits, ToolRegistry};
use rlmesh_core::Task;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// RL steps/s the target asks of rlmesh against TRL's best configuration.
const TARGET_RATIO: f64 = 5.0;

/// Arguments of `launcher bench grpo`.
#[derive(Args)]
pub struct GrpoArgs {
    /// The recipe both sides run (its model, tasks, tools, reward and RL settings).
    #[arg(long, default_value = "configs/calculator-process.toml")]
    recipe: PathBuf,
    /// RL steps per side and round.
    #[arg(long, default_value_t = 20)]
    steps: u64,
    /// Rounds; each runs both sides, in alternating order.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Cores for each side (both run pinned to the first N; default: all).
    #[arg(long)]
    threads: Option<usize>,
    /// Warm-up steps of the cached starting checkpoint (default: the recipe's).
    #[arg(long)]
    sft_steps: Option<u64>,
    /// Also evaluate both sides' final policies (last round) on the recipe's held-out tasks, greedy, by rlmesh's verdict.
    #[arg(long)]
    to_quality: bool,
    /// Give TRL its default gradient checkpointing (by default it is off: TRL's fastest configuration on this work).
    #[arg(long)]
    peer_gradient_checkpointing: bool,
    /// Where the warm-up and the runs are kept (default: $RLMESH_CACHE or ~/.cache/rlmesh, then bench-grpo/).
    #[arg(long)]
    cache: Option<PathBuf>,
}

/// One side's figures in one round.
#[derive(Clone, Debug, Default)]
struct Side {
    steps_per_s: f64,
    tokens_per_s: f64,
    /// Mean seconds per step of each phase (ours: generate, tools, reward, train, sync).
    phases: Vec<(String, f64)>,
}

fn cache_root(a: &GrpoArgs) -> PathBuf {
    a.cache.clone().unwrap_or_else(|| {
        let base = std::env::var_os("RLMESH_CACHE").map(PathBuf::from).unwrap_or_else(|| {
            let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
            home.join(".cache/rlmesh")
        });
        base.join("bench-grpo")
    })
}

/// The recipe both sides run: the user's, with the warm-up shared between the
/// bench's runs and `sft_steps` applied (the run's `--sft-steps` would turn sharing off).
fn bench_recipe(a: &GrpoArgs, recipes: &Path) -> CliResult<(PathBuf, Recipe)> {
    let text = std::fs::read_to_string(&a.recipe).usage(format!("reading {}", a.recipe.display()))?;
    let mut doc: toml::Table = toml::from_str(&text).usage(format!("{}: not TOML", a.recipe.display()))?;
    let sft = doc.entry("sft").or_insert_with(|| toml::Value::Table(Default::default()));
    let sft = sft.as_table_mut().ok_or_else(|| CliError::usage(anyhow::anyhow!("{}: [sft] is not a table", a.recipe.display())))?;
    sft.insert("share".into(), toml::Value::Boolean(true));
    if let Some(n) = a.sft_steps {
        sft.insert("steps".into(), toml::Value::Integer(i64::try_from(n).map_err(|_| CliError::usage(anyhow::anyhow!("--sft-steps: too large")))?));
    }
    std::fs::create_dir_all(recipes).usage(format!("creating {}", recipes.display()))?;
    let stem = a.recipe.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_else(|| "recipe".into());
    let path = recipes.join(format!("{stem}.toml"));
    std::fs::write(&path, toml::to_string(&doc).map_err(anyhow::Error::from)?).usage(format!("writing {}", path.display()))?;
    let recipe = Recipe::load(&path).map_err(CliError::usage)?;
    if recipe.estimator.name != EstimatorKind::Grpo || !recipe.tiny_model() {
        return Err(CliError::usage(anyhow::anyhow!(
            "{}: bench grpo compares GRPO on the tiny policy (estimator.name = \"grpo\", model.path = \"tiny\"), the work TRL's GRPOTrainer does",
            a.recipe.display()
        )));
    }
    if !matches!(recipe.reward, RewardKind::Process | RewardKind::FinalOnly) || recipe.tools != ["calculator"] || recipe.tasks.inventory {
        return Err(CliError::usage(anyhow::anyhow!(
            "{}: the Python side has the calculator and the process / final-only rewards only (tools = [\"calculator\"], no inventory tasks)",
            a.recipe.display()
        )));
    }
    Ok((path, recipe))
}

/// `launcher up` on the embedded topology, pinned to `cores` when given; its log goes to `RUN.log`.
fn up(recipe: &Path, run: &Path, extra: &[String], cores: Option<usize>) -> CliResult {
    let _ = std::fs::remove_dir_all(run);
    if let Some(parent) = run.parent() {
        std::fs::create_dir_all(parent).usage(format!("creating {}", parent.display()))?;
    }
    let log = run.with_extension("log");
    let exe = std::env::current_exe()?;
    let mut cmd = match cores {
        Some(n) => {
            let mut c = Command::new("taskset");
            c.args(["-c", &format!("0-{}", n - 1)]).arg(exe);
            c
        }
        None => Command::new(exe),
    };
    cmd.arg("up").arg(repo_root().join("deploy/local.toml")).arg("--recipe").arg(recipe).arg("--run-dir").arg(run);
    cmd.args(["--metrics-addr", "127.0.0.1:0"]).args(extra);
    let out = cmd
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).usage(format!("creating {}", log.display()))?)
        .status()
        .usage("starting launcher up")?;
    if !out.success() {
        return Err(super::bench_pipeline::failed_up(&run.display().to_string(), out, &log));
    }
    Ok(())
}

fn jsonl(path: &Path) -> CliResult<Vec<Value>> {
    let text = std::fs::read_to_string(path).usage(format!("reading {}", path.display()))?;
    Ok(text.lines().filter_map(|l| serde_json::from_str(l).ok()).collect())
}

/// Our side's figures from a run's `metrics.jsonl` (steps after the first).
fn ours_from_metrics(run: &Path) -> CliResult<Side> {
    let rows = jsonl(&run.join("metrics.jsonl"))?;
    if rows.len() < 2 {
        return Err(anyhow::anyhow!("{}: fewer than 2 RL steps recorded", run.display()).into());
    }
    let later = &rows[1..];
    let f = |r: &Value, k: &str| r[k].as_f64().unwrap_or(0.0);
    let secs: f64 = later.iter().map(|r| f(r, "step_seconds")).sum();
    let tokens: f64 = later.iter().map(|r| f(r, "generated_tokens")).sum();
    let n = later.len() as f64;
    let phases = ["generate", "tools", "reward", "train", "sync"].iter().map(|p| (p.to_string(), later.iter().map(|r| f(r, &format!("phase/{p}_seconds"))).sum::<f64>() / n)).collect();
    Ok(Side { steps_per_s: n / secs.max(1e-9), tokens_per_s: tokens / secs.max(1e-9), phases })
}

/// TRL's figures from the script's answer (steps after the first).
fn theirs_from_answer(v: &Value) -> CliResult<Side> {
    let ends: Vec<f64> = serde_json::from_value(v["step_end_seconds"].clone()).map_err(|e| anyhow::anyhow!("TRL side: step_end_seconds: {e}"))?;
    let tokens: Vec<f64> = serde_json::from_value(v["generated_tokens"].clone()).map_err(|e| anyhow::anyhow!("TRL side: generated_tokens: {e}"))?;
    if ends.len() < 2 || tokens.len() != ends.len() {
        return Err(anyhow::anyhow!("TRL side: {} step times and {} token counts (at least 2 steps, one count each)", ends.len(), tokens.len()).into());
    }
    let secs = (ends[ends.len() - 1] - ends[0]).max(1e-9);
    let n = (ends.len() - 1) as f64;
    let phases = v["phase_seconds_after_first"].as_object().map(|o| o.iter().map(|(k, s)| (k.clone(), s.as_f64().unwrap_or(0.0) / n)).collect()).unwrap_or_default();
    Ok(Side { steps_per_s: n / secs, tokens_per_s: tokens[1..].iter().sum::<f64>() / secs, phases })
}

/// Every prompt TRL rendered must be rlmesh's rendering of the same task, byte for byte.
fn check_rendering(model_dir: &Path, tasks: &[Task], rendered: &Value) -> CliResult<usize> {
    let tokenizer = rlmesh_model::Tokenizer::load(model_dir).usage(format!("loading the tokenizer of {}", model_dir.display()))?;
    let registry = ToolRegistry::from_names(&["calculator".to_string()], ExecLimits::default()).map_err(|e| anyhow::anyhow!("{e}"))?;
    let theirs = rendered.as_array().ok_or_else(|| anyhow::anyhow!("TRL side: rendered_prompts is not a list"))?;
    if theirs.len() != tasks.len() {
        return Err(anyhow::anyhow!("TRL side rendered {} prompts for {} tasks", theirs.len(), tasks.len()).into());
    }
    for (i, (task, t)) in tasks.iter().zip(theirs).enumerate() {
        let ours = rlmesh_actors::rollout::prompt_text(&tokenizer, &registry, task, None).map_err(|e| anyhow::anyhow!("rendering task {}: {e}", task.id))?;
        let t = t.as_str().unwrap_or_default();
        if ours != t {
            let at = ours.bytes().zip(t.bytes()).take_while(|(a, b)| a == b).count();
            let around = |s: &str| s.get(at.saturating_sub(40)..(at + 40).min(s.len())).unwrap_or("").to_string();
            return Err(anyhow::anyhow!(
                "prompt {i} (task {}) renders differently at byte {at}: rlmesh {:?} / TRL {:?} — the two sides would not train on the same text",
                task.id,
                around(&ours),
                around(t)
            )
            .into());
        }
    }
    Ok(tasks.len())
}

/// Re-scores every completion TRL generated with rlmesh's reward (as `launcher
/// reward` does) and compares the Python port's total and components.
fn check_rewards(completions: &Path, kind: &str) -> CliResult<usize> {
    let rows = jsonl(completions)?;
    if rows.is_empty() {
        return Err(anyhow::anyhow!("{}: no completions to check the reward on", completions.display()).into());
    }
    let mut mismatches = vec![];
    for (i, r) in rows.iter().enumerate() {
        let line = json!({"reward": kind, "task": r["task"], "messages": r["messages"]}).to_string();
        let ours = rlmesh_core::offline::reward_json_line(&line).map_err(|e| anyhow::anyhow!("{}:{}: {e}", completions.display(), i + 1))?;
        let theirs = &r["python_reward"];
        let close = |a: &Value, b: &Value| match (a.as_f64(), b.as_f64()) {
            (Some(x), Some(y)) => (x - y).abs() <= 1e-9,
            _ => a.is_null() && b.is_null(),
        };
        let mut same = close(&ours["total"], &theirs["total"]);
        if let Some(comp) = ours["components"].as_object() {
            same &= comp.iter().all(|(k, v)| close(v, &theirs["components"][k]));
            same &= theirs["components"].as_object().is_some_and(|t| t.len() == comp.len());
        }
        if !same {
            mismatches.push(format!("line {}: rlmesh {} / python {}", i + 1, ours, theirs));
        }
    }
    if !mismatches.is_empty() {
        return Err(anyhow::anyhow!(
            "the Python reward differs from rlmesh's on {} of {} completions ({}); first: {}",
            mismatches.len(),
            rows.len(),
            completions.display(),
            mismatches[0]
        )
        .into());
    }
    Ok(rows.len())
}

/// Held-out greedy trajectory success of a policy directory, by rlmesh's
/// verdict: a run of the recipe that starts from it and trains nothing.
fn held_out_success(recipe: &Path, policy: &Path, run: &Path, cores: Option<usize>) -> CliResult<f64> {
    let text = std::fs::read_to_string(recipe).usage(format!("reading {}", recipe.display()))?;
    let mut doc: toml::Table = toml::from_str(&text).map_err(anyhow::Error::from)?;
    let model = doc.entry("model").or_insert_with(|| toml::Value::Table(Default::default()));
    if let Some(m) = model.as_table_mut() {
        m.clear();
        m.insert("path".into(), toml::Value::String(policy.display().to_string()));
    }
    if let Some(s) = doc.get_mut("sft").and_then(|s| s.as_table_mut()) {
        s.insert("steps".into(), toml::Value::Integer(0));
        s.insert("share".into(), toml::Value::Boolean(false));
    }
    let path = run.with_extension("toml");
    std::fs::write(&path, toml::to_string(&doc).map_err(anyhow::Error::from)?).usage(format!("writing {}", path.display()))?;
    up(&path, run, &["--max-steps".into(), "0".into()], cores)?;
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(run.join("summary.json"))?)?;
    summary["trajectory_success"].as_f64().ok_or_else(|| anyhow::anyhow!("{}: no trajectory_success", run.join("summary.json").display()).into())
}

/// `launcher bench grpo`.
pub fn grpo(a: GrpoArgs) -> CliResult {
    if a.rounds == 0 || a.steps < 2 {
        return Err(CliError::usage(anyhow::anyhow!("--rounds: at least 1; --steps: at least 2")));
    }
    let all = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(2);
    let threads = a.threads.unwrap_or(all);
    if threads == 0 || threads > all {
        return Err(CliError::usage(anyhow::anyhow!("--threads: 1..={all} (the cores this process may use)")));
    }
    let pin = (threads < all).then_some(threads);
    let root = cache_root(&a);
    let runs = root.join("runs");
    let (recipe_path, recipe) = bench_recipe(&a, &root.join("recipes"))?;
    let (train, held_out) = recipe.tasks().map_err(|e| CliError::usage(anyhow::anyhow!("{e}")))?;
    let n_tasks = (a.steps as usize) * recipe.rl.groups_per_step;
    let tasks: Vec<Task> = (0..n_tasks).map(|g| train[g % train.len()].clone()).collect();

    // The starting weights: the recipe's warm-up, made once.
    let warm = warm_start::shared_dir(&recipe, &runs.join("warmup"), threads as i32, 1);
    if !warm_start::is_stored(&warm) {
        eprintln!("[bench grpo] making the warm-up once ({} steps; cached in {}) …", recipe.sft.steps, warm.display());
        up(&recipe_path, &runs.join("warmup"), &["--max-steps".into(), "1".into(), "--eval-limit".into(), "8".into()], pin)?;
        if !warm_start::is_stored(&warm) {
            return Err(anyhow::anyhow!("the warm-up run ended without storing {}", warm.display()).into());
        }
    }
    eprintln!("[bench grpo] starting weights: {}", warm.display());

    let r = &recipe.rl;
    let e = &recipe.estimator;
    let scale = e.scale_rewards.map(|s| format!("{s:?}").to_lowercase()).unwrap_or_else(|| "group".into());
    // The reward as `launcher reward` and the Python port name it.
    let reward_kind = match recipe.reward {
        RewardKind::FinalOnly => "final_only",
        _ => "process",
    };
    let spec = |out: &Path, save: bool| {
        json!({
            "model_dir": warm, "out_dir": out, "threads": threads, "seed": recipe.seed, "steps": a.steps,
            "gradient_checkpointing": a.peer_gradient_checkpointing, "save_model": save,
            "group_size": r.group_size, "groups_per_step": r.groups_per_step, "lr": r.lr, "temperature": r.temperature,
            "max_turns": r.max_turns, "max_new_tokens": r.max_new_tokens, "clip_eps": e.clip_eps, "kl_coef": e.kl_coef,
            "scale_rewards": scale, "max_grad_norm": 1.0, "reward": reward_kind,
            "tools": recipe.tools, "tasks": tasks,
        })
    };
    println!(
        "bench grpo: {} — {} RL steps × {} groups × G = {}, {} turns of ≤ {} tokens, lr {}, {threads} threads, TRL gradient checkpointing {}; {} rounds (ratio: median of the rounds')",
        a.recipe.display(),
        a.steps,
        r.groups_per_step,
        r.group_size,
        r.max_turns,
        r.max_new_tokens,
        r.lr,
        if a.peer_gradient_checkpointing { "on (its default)" } else { "off (its fastest)" },
        a.rounds
    );
    println!("{:>5} {:>15} {:>13} {:>7} {:>14} {:>12}", "round", "rlmesh steps/s", "TRL steps/s", "ratio", "rlmesh tok/s", "TRL tok/s");
    let mut rows = vec![];
    let (mut ours_all, mut theirs_all) = (vec![], vec![]);
    let mut unequal = Value::Null;
    let mut checked = json!({});
    for round in 0..a.rounds {
        let last = round + 1 == a.rounds;
        let ours_first = round % 2 == 0;
        let (mut ours, mut theirs) = (Side::default(), Side::default());
        for side in if ours_first { ["rlmesh", "trl"] } else { ["trl", "rlmesh"] } {
            eprintln!("[bench grpo] round {}/{}: {side} …", round + 1, a.rounds);
            if side == "rlmesh" {
                let run = runs.join(format!("rlmesh-r{round}"));
                let limit = if a.to_quality && last { held_out.len() } else { 8 };
                up(&recipe_path, &run, &["--max-steps".into(), a.steps.to_string(), "--eval-limit".into(), limit.to_string()], pin)?;
                ours = ours_from_metrics(&run)?;
            } else {
                let out = runs.join(format!("trl-r{round}"));
                let _ = std::fs::remove_dir_all(&out);
                std::fs::create_dir_all(&out).usage(format!("creating {}", out.display()))?;
                let answer = python(&["tests/oracle/bench_grpo_trl.py"], Some(&spec(&out, a.to_quality && last)))?;
                if round == 0 {
                    let prompts = check_rendering(&warm, &tasks, &answer["rendered_prompts"])?;
                    eprintln!("[bench grpo] rendering: {prompts} prompts identical on both sides");
                    checked["rendered_prompts"] = json!(prompts);
                }
                let completions = PathBuf::from(answer["completions"].as_str().unwrap_or_default());
                let n = check_rewards(&completions, reward_kind)?;
                eprintln!("[bench grpo] reward: rlmesh and the Python port agree on all {n} TRL completions");
                checked["reward_completions"] = json!(checked["reward_completions"].as_u64().unwrap_or(0) + n as u64);
                unequal = answer["unequal"].clone();
                theirs = theirs_from_answer(&answer)?;
                if a.to_quality && last {
                    checked["trl_model"] = answer["model_dir"].clone();
                }
            }
        }
        let ratio = ours.steps_per_s / theirs.steps_per_s;
        println!("{:>5} {:>15.3} {:>13.3} {:>6.2}x {:>14.0} {:>12.0}", round + 1, ours.steps_per_s, theirs.steps_per_s, ratio, ours.tokens_per_s, theirs.tokens_per_s);
        rows.push(json!({"round": round + 1, "rlmesh_steps_per_s": ours.steps_per_s, "trl_steps_per_s": theirs.steps_per_s, "ratio": ratio,
                         "rlmesh_tokens_per_s": ours.tokens_per_s, "trl_tokens_per_s": theirs.tokens_per_s,
                         "rlmesh_phase_seconds": ours.phases.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
                         "trl_phase_seconds": theirs.phases.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>()}));
        ours_all.push(ours);
        theirs_all.push(theirs);
    }
    let m = |xs: Vec<f64>| median(&xs);
    let ratio = m(rows.iter().map(|r| r["ratio"].as_f64().unwrap_or(f64::NAN)).collect());
    let (o_sps, t_sps) = (m(ours_all.iter().map(|s| s.steps_per_s).collect()), m(theirs_all.iter().map(|s| s.steps_per_s).collect()));
    let (o_tps, t_tps) = (m(ours_all.iter().map(|s| s.tokens_per_s).collect()), m(theirs_all.iter().map(|s| s.tokens_per_s).collect()));
    println!("median {:>9.3} {:>13.3} {:>6.2}x {:>14.0} {:>12.0}", o_sps, t_sps, ratio, o_tps, t_tps);
    let phase_medians = |sides: &[Side]| -> Vec<(String, f64)> {
        let names: Vec<String> = sides.first().map(|s| s.phases.iter().map(|(k, _)| k.clone()).collect()).unwrap_or_default();
        names.into_iter().map(|k| {
            let v = m(sides.iter().filter_map(|s| s.phases.iter().find(|(n, _)| *n == k).map(|(_, v)| *v)).collect());
            (k, v)
        }).collect()
    };
    let (ours_ph, theirs_ph) = (phase_medians(&ours_all), phase_medians(&theirs_all));
    let show = |ph: &[(String, f64)]| ph.iter().map(|(k, v)| format!("{k} {v:.3}")).collect::<Vec<_>>().join(", ");
    println!("rlmesh seconds per step by phase (busy time; generation overlaps training in {:?} mode): {}", recipe.mode(), show(&ours_ph));
    if !theirs_ph.is_empty() {
        println!("TRL seconds per step by phase: {}", show(&theirs_ph));
    }
    if ratio < TARGET_RATIO {
        let (p, s) = ours_ph.iter().cloned().fold((String::new(), 0.0), |acc, (k, v)| if v > acc.1 { (k, v) } else { acc });
        println!("target {TARGET_RATIO:.1}x: missed by {:.2}x; rlmesh's largest phase is {p} ({s:.3} s of its {:.3} s per step)", TARGET_RATIO / ratio, 1.0 / o_sps);
    } else {
        println!("target {TARGET_RATIO:.1}x: met");
    }
    let mut quality = Value::Null;
    if a.to_quality {
        let ours: Value = serde_json::from_str(&std::fs::read_to_string(runs.join(format!("rlmesh-r{}", a.rounds - 1)).join("summary.json"))?)?;
        let ours = ours["trajectory_success"].as_f64().unwrap_or(f64::NAN);
        let trl_model = PathBuf::from(checked["trl_model"].as_str().ok_or_else(|| anyhow::anyhow!("TRL side saved no model"))?);
        eprintln!("[bench grpo] evaluating TRL's final policy on {} held-out tasks …", held_out.len());
        let theirs = held_out_success(&recipe_path, &trl_model, &runs.join("trl-eval"), pin)?;
        println!("held-out trajectory success after {} steps ({} tasks, greedy, rlmesh's verdict): rlmesh {:.1}%, TRL {:.1}%", a.steps, held_out.len(), 100.0 * ours, 100.0 * theirs);
        quality = json!({"rlmesh_trajectory_success": ours, "trl_trajectory_success": theirs, "held_out_tasks": held_out.len()});
    }
    println!(
        "{}",
        json!({"bench": "grpo", "recipe": a.recipe, "steps": a.steps, "threads": threads, "peer_gradient_checkpointing": a.peer_gradient_checkpointing,
               "rounds": rows, "median_ratio": ratio, "rlmesh_steps_per_s": o_sps, "trl_steps_per_s": t_sps,
               "rlmesh_tokens_per_s": o_tps, "trl_tokens_per_s": t_tps, "target_ratio": TARGET_RATIO, "checked": checked,
               "quality": quality, "unequal": unequal, "warmup": warm})
    );
    Ok(())
}
