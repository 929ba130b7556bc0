//! `launcher bench pack`: turning the learner's parameters into one policy
//! version, rlmesh's safetensors image (and the whole `pack`, image plus its
//! XXH3 bucket digests) against the image Python trainers make with
//! `safetensors.torch.save` on the same weights, in alternating rounds.
use crate::error::{CliError, CliResult, UsageContext};
use crate::repo::python;
use clap::Args;
use rlmesh_actors::weight_sync::image::pack;
use rlmesh_comm::bench::median;
use rlmesh_model::io::safetensors_image;
use rlmesh_model::Transformer;
use serde_json::json;
use std::time::Instant;
use tch::{Device, Kind, Tensor};

/// Arguments of `launcher bench pack`.
#[derive(Args)]
pub struct PackArgs {
    /// Models to measure: "tiny", "smollm2" or a model directory (default: tiny and smollm2).
    #[arg(long, value_delimiter = ',')]
    models: Vec<String>,
    /// Timed versions per side and round (the median is reported).
    #[arg(long, default_value_t = 5)]
    repeats: usize,
    /// Alternations of (rlmesh, the peer); the ratio is the median of the rounds'.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Intra-op threads for both sides (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
}

/// Seconds of each of `1 + repeats` calls of `f`, the first (untimed) dropped.
fn timed<T>(repeats: usize, mut f: impl FnMut() -> T) -> Vec<f64> {
    drop(f());
    (0..repeats)
        .map(|_| {
            let t = Instant::now();
            let out = f();
            let s = t.elapsed().as_secs_f64();
            drop(out);
            s
        })
        .collect()
}

/// Runs the benchmark: a table, then one JSON line.
pub fn pack_bench(a: PackArgs) -> CliResult {
    if a.repeats == 0 || a.rounds == 0 {
        return Err(CliError::usage(anyhow::anyhow!("--repeats, --rounds: at least 1")));
    }
    let threads = super::bench::threads_or_all(a.threads);
    tch::set_num_threads(threads as i32);
    let models = if a.models.is_empty() { vec!["tiny".to_string(), "smollm2".to_string()] } else { a.models.clone() };
    println!("bench pack: one version as a float32 safetensors image, {threads} threads, {} rounds of {} versions (ratio: median of the rounds')", a.rounds, a.repeats);
    println!("{:<10} {:>9} {:>12} {:>12} {:>14} {:>7} {:>10}", "model", "MB", "rlmesh s", "+digests s", "safetensors s", "ratio", "same file");
    let mut rows = vec![];
    for name in &models {
        let dir = super::bench::resolve_model(name)?;
        let model = Transformer::load(&dir, Device::Cpu, Some(Kind::Float)).usage("loading the model")?;
        let vars: Vec<(String, Tensor)> = model.vs.variables().into_iter().collect();
        let ours_image = || safetensors_image(&vars, Some(Kind::Float), None).expect("float32 tensors serialise");
        // The peer's last image, written once (untimed), to check that both sides made the same file.
        let peer_file = std::env::temp_dir().join(format!("rlmesh-bench-pack-{}-{}.safetensors", std::process::id(), rows.len()));
        let (mut image_s, mut pack_s, mut peer_s, mut ratios) = (vec![], vec![], vec![], vec![]);
        let mut same = None;
        for round in 0..a.rounds {
            let ours = median(&timed(a.repeats, ours_image));
            let whole = median(&timed(a.repeats, || pack(&model, 1)));
            let dir_s = dir.display().to_string();
            let mut args = vec!["tests/oracle/bench_pack.py", "--model", &dir_s];
            let (repeats, threads_s, out_s) = (a.repeats.to_string(), threads.to_string(), peer_file.display().to_string());
            args.extend(["--repeats", &repeats, "--threads", &threads_s]);
            if round == 0 {
                args.extend(["--out", &out_s]);
            }
            let peer = python(&args, None)?;
            let theirs: Vec<f64> = serde_json::from_value(peer["seconds"].clone()).map_err(|e| anyhow::anyhow!("the peer's seconds: {e} in {peer}"))?;
            let theirs = median(&theirs);
            if round == 0 {
                let file = std::fs::read(&peer_file).map_err(|e| anyhow::anyhow!("reading the peer's image {}: {e}", peer_file.display()))?;
                let _ = std::fs::remove_file(&peer_file);
                same = Some(file == ours_image());
            }
            eprintln!("  {name} round {}/{}: rlmesh image {ours:.4} s (pack with digests {whole:.4} s), safetensors.torch.save {theirs:.4} s", round + 1, a.rounds);
            image_s.push(ours);
            pack_s.push(whole);
            peer_s.push(theirs);
            ratios.push(theirs / ours);
        }
        let bytes = ours_image().len();
        let (i, p, t, r) = (median(&image_s), median(&pack_s), median(&peer_s), median(&ratios));
        let same = same.unwrap_or(false);
        println!("{:<10} {:>9.1} {:>12.4} {:>12.4} {:>14.4} {:>6.2}x {:>10}", name, bytes as f64 / 1e6, i, p, t, r, if same { "yes" } else { "NO" });
        rows.push(json!({"model": name, "bytes": bytes, "rlmesh_image_s": i, "rlmesh_pack_s": p, "peer_s": t, "ratio": r, "round_ratios": ratios,
                         "pack_ratio": t / p, "identical_image": same}));
    }
    println!("{}", json!({ "bench": "pack", "threads": threads, "peer": "safetensors.torch.save of named_parameters() in float32", "rows": rows }));
    Ok(())
}
