//! `launcher bench NAME`: each benchmark measures rlmesh and its peer in the
//! same run and prints the ratio (medians over repeats; machines are noisy).
use crate::error::{CliError, CliResult, UsageContext};
use crate::repo::{models_dir, python, repo_root};
use clap::{Args, Subcommand};
use rlmesh_actors::learner::bench::{bench_learner_step, LearnerBench};
use rlmesh_actors::learner::bench_groups::{bench_groups, GroupsWorkload};
use rlmesh_actors::learner::bench_shard::{bench_sharded, ShardBenchConfig};
use rlmesh_actors::learner::Shard;
use rlmesh_comm::bench::{bench_allreduce, bench_weight_sync, BenchConfig, WorkerCommand};
use rlmesh_model::{SamplingParams, Transformer};
use serde_json::{json, Value};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

/// Arguments of `launcher bench`.
#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    which: Bench,
}

#[derive(Subcommand)]
enum Bench {
    /// Decode throughput vs transformers `generate` (tiny model and SmolLM2-135M; batch 1, 8, 32).
    Generate(GenerateArgs),
    /// Training tokens/s of one learner step vs the same step in PyTorch eager (tiny model and SmolLM2-135M); `--workload groups`: shared prefix, packed and padded layouts.
    Learner(LearnerArgs),
    /// CPU ring all-reduce bus bandwidth for 2–4 ranks vs the loopback copy bandwidth.
    Allreduce(AllreduceArgs),
    /// CPU weight sync (bucketed broadcast, XXH3 per bucket) from one sender to 1, 2 and 4 receiver processes vs the loopback copy bandwidth.
    WeightSync(WeightSyncArgs),
    /// Packing one policy version (float32 safetensors image, plus its bucket digests) vs `safetensors.torch.save` on the same weights.
    Pack(super::bench_pack::PackArgs),
    /// RL-phase steps/s of one recipe on local (one process) vs local-procs (six), in alternating rounds.
    Pipeline(super::bench_pipeline::PipelineArgs),
    /// Multi-turn rollouts of a long-tailed mix: the cache kept across turns vs per-turn batching (every turn prefilled whole), in alternating rounds.
    Rollout(super::bench_rollout::RolloutArgs),
    /// Whole RL steps of one recipe vs TRL's GRPOTrainer on the same work (weights, prompts, tools, reward), in alternating rounds.
    Grpo(super::bench_grpo::GrpoArgs),
}

#[derive(Args)]
struct WeightSyncArgs {
    /// Receiver process counts (plus one sender each).
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 2, 4])]
    receivers: Vec<usize>,
    /// Weight buffer sizes in MiB (the tiny policy is ~4 MiB in float32, SmolLM2-135M ~540 MiB).
    #[arg(long, value_delimiter = ',', default_values_t = vec![16, 256])]
    mib: Vec<usize>,
    /// Bucket size in MiB: each bucket is one broadcast, digested on arrival.
    /// 64 by default (slime sends 512 MiB buckets, verl 2 GiB): per-bucket
    /// barriers dominate small ones on a shared segment.
    #[arg(long, default_value_t = 64)]
    bucket_mib: usize,
    /// Timed iterations per configuration (the median is reported).
    #[arg(long, default_value_t = 5)]
    iters: usize,
    /// Untimed iterations first.
    #[arg(long, default_value_t = 1)]
    warmup: usize,
}

#[derive(Args)]
struct LearnerArgs {
    /// Models to measure: "tiny", "smollm2" or a model directory (default: tiny and smollm2).
    #[arg(long, value_delimiter = ',')]
    models: Vec<String>,
    /// Device: cpu (float32) or cuda (bfloat16).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
    device: String,
    /// Sequences per step.
    #[arg(long, default_value_t = 4)]
    batch: usize,
    /// Tokens per sequence (the first quarter is prompt, outside the loss mask).
    #[arg(long, default_value_t = 128)]
    seq_len: usize,
    /// Timed steps per side (the median is reported).
    #[arg(long, default_value_t = 5)]
    iters: usize,
    /// Untimed steps per side first.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
    /// Intra-op threads for both sides (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Alternations of (rlmesh's steps, the peer's steps); the ratio is the median of the rounds'.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Give the peer torch.optim.AdamW(fused=True) instead of its CPU default.
    #[arg(long)]
    peer_fused_adamw: bool,
    /// `uniform`: --batch sequences of --seq-len tokens; `groups`: G rollouts per prompt with a
    /// long shared prompt and long-tailed completions, in four layouts (shared prefix, packed,
    /// padded, PyTorch eager padded as TRL pads).
    #[arg(long, default_value = "uniform", value_parser = ["uniform", "groups"])]
    workload: String,
    /// `groups`: prompt groups per step.
    #[arg(long, default_value_t = 4)]
    groups: usize,
    /// `groups`: rollouts per group (G).
    #[arg(long, default_value_t = 8)]
    group_size: usize,
    /// `groups`: tokens of the shared prompt.
    #[arg(long, default_value_t = 300)]
    prompt_len: usize,
    /// `groups`: shortest and longest completion, in tokens.
    #[arg(long, value_delimiter = ',', default_values_t = vec![20, 200])]
    completion: Vec<usize>,
    /// `groups`: computed tokens per packed micro-batch.
    #[arg(long, default_value_t = 4096)]
    micro_batch_tokens: usize,
    /// Instead of the PyTorch peer: this sharding's step (`[learner] shard`) against the
    /// unsharded one, each as `--ranks` processes on the CPU ring, in the same run.
    #[arg(long, value_parser = ["optimizer", "gradients"])]
    shard: Option<String>,
    /// With `--shard`: rank processes per side (at least 2).
    #[arg(long, default_value_t = 2)]
    ranks: usize,
}

#[derive(Args)]
struct AllreduceArgs {
    /// World sizes (ranks are processes on this machine).
    #[arg(long, value_delimiter = ',', default_values_t = vec![2, 3, 4])]
    worlds: Vec<usize>,
    /// Buffer sizes in MiB.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 16, 64])]
    mib: Vec<usize>,
    /// Timed iterations per configuration (the median is reported).
    #[arg(long, default_value_t = 7)]
    iters: usize,
    /// Untimed iterations first.
    #[arg(long, default_value_t = 2)]
    warmup: usize,
}

#[derive(Args)]
struct GenerateArgs {
    /// Models to measure: "tiny", "smollm2" or a model directory (default: tiny and smollm2).
    #[arg(long, value_delimiter = ',')]
    models: Vec<String>,
    /// Batch sizes.
    #[arg(long, value_delimiter = ',', default_values_t = vec![1, 8, 32])]
    batch: Vec<usize>,
    /// Tokens generated per sequence.
    #[arg(long, default_value_t = 128)]
    new_tokens: usize,
    /// Prompt length in tokens.
    #[arg(long, default_value_t = 32)]
    prompt_len: usize,
    /// Timed repeats per configuration and round.
    #[arg(long, default_value_t = 3)]
    repeats: usize,
    /// Alternations of (rlmesh, transformers) per configuration; the ratio is the median of the rounds'.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Intra-op threads for both systems (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// Internal: measure one configuration in this process and print JSON.
    #[arg(long, hide = true)]
    one: Option<PathBuf>,
}

/// Dispatch a benchmark.
pub fn run(a: BenchArgs) -> CliResult {
    match a.which {
        Bench::Generate(g) => generate(g),
        Bench::Learner(l) => learner(l),
        Bench::Allreduce(r) => allreduce(r),
        Bench::WeightSync(w) => weight_sync(w),
        Bench::Pack(p) => super::bench_pack::pack_bench(p),
        Bench::Pipeline(p) => super::bench_pipeline::pipeline(p),
        Bench::Grpo(g) => super::bench_grpo::grpo(g),
        Bench::Rollout(r) => super::bench_rollout::rollout(r),
    }
}

pub(super) fn threads_or_all(threads: Option<usize>) -> usize {
    threads.unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1))
}

/// `launcher bench learner`: rlmesh_actors' learner-step benchmark on each model.
fn learner(l: LearnerArgs) -> CliResult {
    let (device, kind) = match l.device.as_str() {
        "cuda" if !tch::Cuda::is_available() => return Err(CliError::usage(anyhow::anyhow!("--device cuda: no CUDA device visible to libtorch"))),
        "cuda" => (tch::Device::Cuda(0), tch::Kind::BFloat16),
        _ => (tch::Device::Cpu, tch::Kind::Float),
    };
    if l.batch == 0 || l.seq_len < 2 || l.iters == 0 || l.rounds == 0 {
        return Err(CliError::usage(anyhow::anyhow!("--batch, --iters, --rounds: at least 1; --seq-len: at least 2")));
    }
    let models = if l.models.is_empty() { vec!["tiny".to_string(), "smollm2".to_string()] } else { l.models.clone() };
    let python = std::env::var_os("RLMESH_PYTHON").map(PathBuf::from).unwrap_or_else(|| repo_root().join("scripts/py"));
    let groups = (l.workload == "groups").then(|| GroupsWorkload {
        groups: l.groups,
        group_size: l.group_size,
        prompt_len: l.prompt_len,
        completion: (l.completion.first().copied().unwrap_or(20), l.completion.get(1).copied().unwrap_or(200)),
        micro_batch_tokens: l.micro_batch_tokens,
        ..Default::default()
    });
    if let Some(w) = &groups {
        if w.groups == 0 || w.group_size == 0 || w.prompt_len == 0 || l.completion.len() != 2 || w.completion.0 < 2 || w.completion.0 > w.completion.1 || w.micro_batch_tokens < 2 {
            return Err(CliError::usage(anyhow::anyhow!(
                "--groups, --group-size, --prompt-len: at least 1; --completion: two lengths MIN,MAX with 2 <= MIN <= MAX; --micro-batch-tokens: at least 2"
            )));
        }
    }
    if let Some(shard) = &l.shard {
        return learner_sharded(&l, shard, &models);
    }
    let mut reports = vec![];
    for name in &models {
        let bench = LearnerBench {
            model_dir: resolve_model(name)?,
            python: python.clone(),
            script: repo_root().join("tests/oracle/loss_oracle.py"),
            batch_size: l.batch,
            seq_len: l.seq_len,
            prompt_len: l.seq_len / 4,
            iters: l.iters,
            warmup: l.warmup,
            threads: threads_or_all(l.threads) as i32,
            device,
            kind,
            rounds: l.rounds,
            peer_fused_adamw: l.peer_fused_adamw,
        };
        match &groups {
            Some(w) => reports.push(json!(bench_groups(&bench, w)?)),
            None => reports.push(json!(bench_learner_step(&bench)?)),
        }
    }
    println!("{}", json!({ "bench": "learner", "workload": l.workload, "reports": reports }));
    Ok(())
}

/// `launcher bench learner --shard MODE`: the sharded step against the unsharded one, as
/// `launcher learner-rank` processes (rlmesh_actors::learner::bench_shard).
fn learner_sharded(l: &LearnerArgs, shard: &str, models: &[String]) -> CliResult {
    if l.ranks < 2 || l.device != "cpu" {
        return Err(CliError::usage(anyhow::anyhow!("--shard: --ranks at least 2, on --device cpu (the CPU ring)")));
    }
    let shard = if shard == "optimizer" { Shard::Optimizer } else { Shard::Gradients };
    let work = tempfile::tempdir()?;
    let cores = threads_or_all(l.threads);
    let cfg = ShardBenchConfig {
        command: WorkerCommand::new(std::env::current_exe()?).arg("learner-rank"),
        ranks: l.ranks,
        shard,
        config: rlmesh_actors::learner::bench::bench_config(l.batch),
        batch: l.batch,
        seq_len: l.seq_len,
        warmup: l.warmup,
        iters: l.iters,
        threads: (cores / l.ranks).max(1) as i32,
    };
    let mut reports = vec![];
    for name in models {
        let r = bench_sharded(&resolve_model(name)?, &cfg, work.path()).map_err(|e| anyhow::anyhow!(e))?;
        eprintln!(
            "{name}: {} ranks, shard {} {:.0} tokens/s vs none {:.0} ({:.2}x); optimizer bytes per rank {:?} vs {:?}; largest loss difference {:.1e} of the largest loss",
            r.ranks, r.sharded.shard, r.sharded.tokens_per_s, r.none.tokens_per_s, r.ratio, r.sharded.optimizer_bytes, r.none.optimizer_bytes, r.loss_rel_diff
        );
        reports.push(json!(r));
    }
    println!("{}", json!({ "bench": "learner", "workload": "sharded", "reports": reports }));
    Ok(())
}

/// `launcher bench allreduce`: rlmesh_comm's ring benchmark, ranks as `launcher comm-worker` processes.
fn allreduce(r: AllreduceArgs) -> CliResult {
    if r.worlds.iter().any(|&w| w < 2) || r.mib.contains(&0) || r.iters == 0 {
        return Err(CliError::usage(anyhow::anyhow!("--worlds: at least 2 ranks; --mib, --iters: at least 1")));
    }
    let mut cfg = BenchConfig::new(WorkerCommand::new(std::env::current_exe()?).arg("comm-worker"));
    cfg.worlds = r.worlds;
    cfg.sizes = r.mib.iter().map(|m| m << 20).collect();
    cfg.iters = r.iters;
    cfg.warmup = r.warmup;
    let report = bench_allreduce(&cfg)?;
    print!("{}", report.to_table());
    println!("{}", json!({ "bench": "allreduce", "report": report }));
    Ok(())
}

/// `launcher bench weight-sync`: one sender and N receivers as `launcher comm-worker` processes.
fn weight_sync(w: WeightSyncArgs) -> CliResult {
    if w.receivers.contains(&0) || w.mib.contains(&0) || w.bucket_mib == 0 || w.iters == 0 {
        return Err(CliError::usage(anyhow::anyhow!("--receivers, --mib, --bucket-mib, --iters: at least 1")));
    }
    if w.receivers.iter().any(|&r| r > 64) || w.mib.iter().any(|&m| m > 16 << 10) {
        return Err(CliError::usage(anyhow::anyhow!("--receivers: at most 64 processes; --mib: at most 16384 (16 GiB)")));
    }
    let mut cfg = BenchConfig::new(WorkerCommand::new(std::env::current_exe()?).arg("comm-worker"));
    cfg.worlds = w.receivers;
    cfg.sizes = w.mib.iter().map(|m| m << 20).collect();
    cfg.iters = w.iters;
    cfg.warmup = w.warmup;
    let report = bench_weight_sync(&cfg, w.bucket_mib << 20)?;
    print!("{}", report.to_table());
    println!("{}", json!({ "bench": "weight-sync", "report": report }));
    Ok(())
}

pub(super) fn resolve_model(name: &str) -> CliResult<PathBuf> {
    let models = models_dir()?;
    match name {
        "smollm2" => Ok(models.join("smollm2-135m")),
        "tiny" => {
            let dir = models.join("bench-tiny-qwen2");
            if !dir.join("model.safetensors").exists() {
                let tok = models.join("smollm2-135m");
                let dir_s = dir.display().to_string();
                let tok_s = tok.display().to_string();
                let tmpl = repo_root().join("model/templates/qwen2.5-tools.jinja").display().to_string();
                python(&["tests/oracle/hf_oracle.py", "make-tiny", "--out", &dir_s, "--arch", "qwen2", "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--intermediate", "128", "--layers", "2", "--tokenizer", &tok_s, "--template", &tmpl], None)?;
            }
            Ok(dir)
        }
        path => {
            let p = PathBuf::from(path);
            if !p.join("config.json").exists() {
                return Err(CliError::usage(anyhow::anyhow!("--models: {path:?} is neither tiny, smollm2 nor a model directory")));
            }
            Ok(p)
        }
    }
}

/// Peak resident memory of this process in MiB (VmHWM).
pub fn peak_rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok()))
        .map(|kb| kb / 1024.0)
        .unwrap_or(f64::NAN)
}

fn measure_ours(model_dir: &Path, prompts: &[Vec<u32>], g: &GenerateArgs, threads: usize) -> CliResult<Value> {
    tch::set_num_threads(threads as i32);
    let model = Transformer::load(model_dir, tch::Device::Cpu, Some(tch::Kind::Float)).usage("loading the model")?;
    let params = SamplingParams { max_new_tokens: g.new_tokens, temperature: 0.0, ..Default::default() };
    model.generate(prompts, &SamplingParams { max_new_tokens: 4, ..params.clone() }, None)?;
    let mut rates = vec![];
    for _ in 0..g.repeats {
        let t = Instant::now();
        let out = model.generate(prompts, &params, None)?;
        let dt = t.elapsed().as_secs_f64();
        assert!(out.iter().all(|c| c.tokens.len() == g.new_tokens));
        rates.push((prompts.len() * g.new_tokens) as f64 / dt);
    }
    Ok(json!({"tokens_per_s": rates, "peak_rss_mib": peak_rss_mib()}))
}

fn generate(g: GenerateArgs) -> CliResult {
    let threads = threads_or_all(g.threads);
    if let Some(dir) = &g.one {
        let input: Value = serde_json::from_reader(std::io::stdin())?;
        let prompts: Vec<Vec<u32>> = serde_json::from_value(input["prompts"].clone())?;
        println!("{}", measure_ours(dir, &prompts, &g, threads)?);
        return Ok(());
    }
    let models = if g.models.is_empty() { vec!["tiny".to_string(), "smollm2".to_string()] } else { g.models.clone() };
    if g.rounds == 0 || g.repeats == 0 {
        return Err(CliError::usage(anyhow::anyhow!("--rounds, --repeats: at least 1")));
    }
    println!(
        "bench generate: greedy, {} new tokens, prompt {} tokens, {threads} threads, {} rounds of {} repeats (ratio: median of the rounds')",
        g.new_tokens, g.prompt_len, g.rounds, g.repeats
    );
    println!("{:<10} {:>5} {:>14} {:>16} {:>7} {:>13} {:>13}", "model", "batch", "rlmesh tok/s", "transformers", "ratio", "rlmesh MiB", "hf MiB");
    let mut rows = vec![];
    for name in &models {
        let dir = resolve_model(name)?;
        let cfg = rlmesh_model::ModelConfig::load(&dir).usage("reading config.json")?;
        for &b in &g.batch {
            let input = json!({ "prompts": rlmesh_model::generate::bench_prompts(b, g.prompt_len, cfg.vocab_size as u64, 17 + b as u64) });
            let rate = |v: &Value| rlmesh_comm::bench::median(&serde_json::from_value::<Vec<f64>>(v["tokens_per_s"].clone()).unwrap_or_default());
            let (mut o, mut t, mut ratios, mut rss) = (vec![], vec![], vec![], (0.0f64, 0.0f64));
            // Alternating the two sides cancels most of a shared machine's drift between them.
            for _ in 0..g.rounds {
                let ours = self_child(&dir, &g, threads, &input)?;
                let theirs = python(
                    &["tests/oracle/bench_generate.py", "--model", &dir.display().to_string(), "--new-tokens", &g.new_tokens.to_string(), "--threads", &threads.to_string(), "--repeats", &g.repeats.to_string()],
                    Some(&input),
                )?;
                let (ours_rate, theirs_rate) = (rate(&ours), rate(&theirs));
                o.push(ours_rate);
                t.push(theirs_rate);
                ratios.push(ours_rate / theirs_rate);
                if g.rounds > 1 {
                    eprintln!("  {name} batch {b} round {}/{}: rlmesh {ours_rate:.1} tok/s, transformers {theirs_rate:.1} tok/s", ratios.len(), g.rounds);
                }
                rss.0 = rss.0.max(ours["peak_rss_mib"].as_f64().unwrap_or(f64::NAN));
                rss.1 = rss.1.max(theirs["peak_rss_mib"].as_f64().unwrap_or(f64::NAN));
            }
            let median = rlmesh_comm::bench::median;
            let (o, t, ratio) = (median(&o), median(&t), median(&ratios));
            println!("{:<10} {:>5} {:>14.1} {:>16.1} {:>6.2}x {:>13.0} {:>13.0}", name, b, o, t, ratio, rss.0, rss.1);
            rows.push(json!({"model": name, "batch": b, "rlmesh_tokens_per_s": o, "transformers_tokens_per_s": t, "ratio": ratio, "round_ratios": ratios,
                             "rlmesh_peak_rss_mib": rss.0, "transformers_peak_rss_mib": rss.1}));
        }
    }
    println!("{}", json!({ "bench": "generate", "threads": threads, "rows": rows }));
    Ok(())
}

/// Measure one configuration in a fresh child process of this binary (so peak memory is per configuration).
fn self_child(dir: &Path, g: &GenerateArgs, threads: usize, input: &Value) -> CliResult<Value> {
    let exe = std::env::current_exe()?;
    let mut child = Command::new(exe)
        .args(["bench", "generate", "--one", &dir.display().to_string(), "--new-tokens", &g.new_tokens.to_string(), "--repeats", &g.repeats.to_string(), "--threads", &threads.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()?;
    child.stdin.take().expect("piped").write_all(input.to_string().as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(anyhow::anyhow!("bench child failed ({})", out.status).into());
    }
    Ok(serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or("null"))?)
}
