//! `launcher bench allreduce`: ranks started as hidden `launcher comm-worker` processes, ratio against loopback.
mod common;

use common::*;
use serde_json::Value;

#[test]
fn bench_allreduce_runs_ranks_through_comm_worker_and_prints_the_ratio() {
    let o = launcher(&["bench", "allreduce", "--worlds", "2", "--mib", "1", "--iters", "2", "--warmup", "0"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.lines().any(|l| l.split_whitespace().take(2).eq(["2", "1MiB"])), "{out}");
    let report: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let r = &report["report"]["results"][0];
    let (busbw, loopback, ratio) = (r["busbw_gbps"].as_f64().unwrap(), r["loopback_gbps"].as_f64().unwrap(), r["ratio"].as_f64().unwrap());
    assert!(busbw > 0.0 && loopback > 0.0 && (ratio - busbw / loopback).abs() < 1e-9, "{r}");

    let o = launcher(&["bench", "allreduce", "--worlds", "1"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("--worlds: at least 2 ranks"), "{}", stderr(&o));
}

/// `launcher bench weight-sync`: one sender and N receiver processes, digest share and ratio printed.
#[test]
fn bench_weight_sync_reports_bandwidth_ratio_and_digest_share() {
    let o = launcher(&["bench", "weight-sync", "--receivers", "1,2", "--mib", "2", "--bucket-mib", "1", "--iters", "2", "--warmup", "0"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    let report: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let rows = report["report"]["results"].as_array().unwrap();
    // Each receiver count through a shared segment (the ranks are on this host) and along the ring.
    let rows_seen: Vec<(u64, &str)> = rows.iter().map(|r| (r["receivers"].as_u64().unwrap(), r["transport"].as_str().unwrap())).collect();
    assert_eq!(rows_seen, [(1, "shm"), (1, "ring"), (2, "shm"), (2, "ring")]);
    for r in rows {
        let (gbps, loopback, ratio, share) = (r["gbps"].as_f64().unwrap(), r["loopback_gbps"].as_f64().unwrap(), r["ratio"].as_f64().unwrap(), r["digest_share"].as_f64().unwrap());
        assert!(gbps > 0.0 && loopback > 0.0 && (ratio - gbps / loopback).abs() < 1e-9, "{r}");
        // The share is what the digest adds over the same broadcast without
        // it (below 1; at 2 MiB and two iterations noise may make it negative).
        let (t, plain) = (r["median_s"].as_f64().unwrap(), r["plain_s"].as_f64().unwrap());
        assert!(t > 0.0 && plain > 0.0 && share.is_finite() && share < 1.0, "{r}");
        // What the share can no longer show through noise: every receiver
        // hashed every byte of the version.
        assert_eq!(r["digested_bytes"].as_u64(), Some(2 << 20), "{r}");
    }
    let o = launcher(&["bench", "weight-sync", "--receivers", "0"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("--receivers"), "{}", stderr(&o));
}

/// `launcher bench pack` alternates rlmesh's packing with `safetensors.torch.save` (the real
/// peer, in the set-up's Python) on the same weights; both must make the same file.
#[test]
fn bench_pack_alternates_rounds_with_safetensors_and_both_make_the_same_file() {
    let o = launcher(&["bench", "pack", "--models", "tiny", "--repeats", "2", "--rounds", "3", "--threads", "1"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    let report: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let row = &report["rows"][0];
    assert_eq!(row["identical_image"], true, "the peer's image differs from rlmesh's: {row}");
    let ratios: Vec<f64> = serde_json::from_value(row["round_ratios"].clone()).unwrap();
    assert_eq!(ratios.len(), 3, "{row}");
    let mut sorted = ratios.clone();
    sorted.sort_by(f64::total_cmp);
    assert_eq!(row["ratio"].as_f64().unwrap(), sorted[1], "{row}");
    let (image, pack, peer) = (row["rlmesh_image_s"].as_f64().unwrap(), row["rlmesh_pack_s"].as_f64().unwrap(), row["peer_s"].as_f64().unwrap());
    assert!(image > 0.0 && pack > 0.0 && peer > 0.0, "{row}");
    // The tiny test model's float32 parameters, plus the safetensors header.
    assert!(row["bytes"].as_u64().unwrap() > 4 * 100_000, "{row}");
    assert_eq!(stderr(&o).matches(" round ").count(), 3, "{}", stderr(&o));

    let o = launcher(&["bench", "pack", "--rounds", "0"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("--repeats, --rounds: at least 1"), "{}", stderr(&o));
}

/// `launcher bench generate` alternates rlmesh and transformers `generate` (the real peer,
/// in the set-up's Python) and reports the median of the rounds' ratios.
#[test]
fn bench_generate_alternates_rounds_with_transformers() {
    let o = launcher(&["bench", "generate", "--models", "tiny", "--batch", "2", "--new-tokens", "8", "--repeats", "1", "--rounds", "3", "--threads", "1"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    let report: Value = serde_json::from_str(out.lines().last().unwrap()).unwrap();
    let row = &report["rows"][0];
    let ratios: Vec<f64> = serde_json::from_value(row["round_ratios"].clone()).unwrap();
    assert_eq!(ratios.len(), 3, "{row}");
    let mut sorted = ratios.clone();
    sorted.sort_by(f64::total_cmp);
    assert_eq!(row["ratio"].as_f64().unwrap(), sorted[1], "{row}");
    assert!(row["rlmesh_tokens_per_s"].as_f64().unwrap() > 0.0 && row["transformers_tokens_per_s"].as_f64().unwrap() > 0.0, "{row}");
    assert_eq!(stderr(&o).matches("round ").count(), 3, "{}", stderr(&o));

    let o = launcher(&["bench", "generate", "--rounds", "0"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("--rounds, --repeats: at least 1"), "{}", stderr(&o));
}

/// `launcher bench learner` alternates rounds with the PyTorch eager step, which can be
/// given fused AdamW.
#[test]
fn bench_learner_alternates_rounds_and_can_give_the_peer_fused_adamw() {
    let o = launcher(&["bench", "learner", "--models", "tiny", "--batch", "2", "--seq-len", "16", "--iters", "1", "--warmup", "0", "--rounds", "2", "--threads", "1", "--peer-fused-adamw"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let report: Value = serde_json::from_str(stdout(&o).lines().last().unwrap()).unwrap();
    let r = &report["reports"][0];
    assert_eq!(r["round_ratios"].as_array().map(Vec::len), Some(2), "{r}");
    assert_eq!(r["peer_optimizer"], "torch.optim.AdamW(fused=True)", "{r}");
    assert!(r["ours_median_s"].as_f64().unwrap() > 0.0 && r["torch_median_s"].as_f64().unwrap() > 0.0, "{r}");
}

/// `launcher bench learner --shard gradients --ranks 2`: the sharded and the unsharded learner,
/// each as two hidden `launcher learner-rank` processes on the CPU ring, on the same batches: the
/// same losses, half the optimizer state per rank, both sides' tokens/s and their ratio.
#[test]
fn bench_learner_shard_times_sharded_against_unsharded_ranks() {
    let o = launcher(&["bench", "learner", "--models", "tiny", "--shard", "gradients", "--ranks", "2", "--batch", "4", "--seq-len", "32", "--iters", "2", "--warmup", "1", "--threads", "2"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let report: Value = serde_json::from_str(stdout(&o).lines().last().unwrap()).unwrap();
    let r = &report["reports"][0];
    let (none, sharded) = (&r["none"], &r["sharded"]);
    assert_eq!(sharded["shard"], "gradients", "{r}");
    let rate = |s: &Value| s["tokens_per_s"].as_f64().unwrap();
    assert!(rate(none) > 0.0 && rate(sharded) > 0.0 && (r["ratio"].as_f64().unwrap() - rate(sharded) / rate(none)).abs() < 1e-9, "{r}");
    assert_eq!(none["losses"].as_array().map(Vec::len), Some(3), "{r}");
    assert!(r["loss_rel_diff"].as_f64().unwrap() < 1e-5, "{r}");
    let bytes = |s: &Value| s["optimizer_bytes"].as_array().unwrap().iter().map(|b| b.as_u64().unwrap()).collect::<Vec<_>>();
    let (whole, half) = (bytes(none), bytes(sharded));
    assert!(half.iter().zip(&whole).all(|(h, w)| *h * 2 >= *w && *h * 2 <= *w + 64), "{half:?} vs {whole:?}");

    let o = launcher(&["bench", "learner", "--models", "tiny", "--shard", "gradients", "--ranks", "1"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("--ranks at least 2"), "{}", stderr(&o));
}

/// `launcher bench learner --workload groups`: the shared-prefix, packed and padded layouts and
/// the PyTorch peer on one grouped batch, each layout computing what its layout says.
#[test]
fn bench_learner_groups_times_four_layouts_and_the_shared_prompt_is_computed_once() {
    let args = ["bench", "learner", "--models", "tiny", "--workload", "groups", "--groups", "2", "--group-size", "4", "--prompt-len", "24"];
    let o = launcher(&[&args[..], &["--completion", "4,16", "--iters", "1", "--warmup", "0", "--rounds", "1", "--threads", "1"]].concat());
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let report: Value = serde_json::from_str(stdout(&o).lines().last().unwrap()).unwrap();
    let r = &report["reports"][0];
    let layouts: Vec<&str> = r["layouts"].as_array().unwrap().iter().map(|l| l["layout"].as_str().unwrap()).collect();
    assert_eq!(layouts, ["shared", "packed", "padded", "torch"], "{r}");
    let computed = |i: usize| r["layouts"][i]["computed_tokens"].as_u64().unwrap();
    let sequence_tokens = r["sequence_tokens"].as_u64().unwrap();
    assert_eq!(computed(1), sequence_tokens, "packed: every token once, no padding: {r}");
    assert_eq!(computed(0), sequence_tokens - 2 * 3 * 24, "shared: each group's 24-token prompt once instead of 4 times: {r}");
    assert!(computed(2) >= sequence_tokens && computed(3) >= sequence_tokens, "padded rows: {r}");
    for k in ["shared_over_padded", "packed_over_padded", "shared_over_torch"] {
        assert!(r[k].as_f64().unwrap() > 0.0, "{k}: {r}");
    }
    let bad = launcher(&[&args[..], &["--completion", "9,3"]].concat());
    assert_eq!(code(&bad), 2, "{}", stderr(&bad));
}

/// `launcher bench pipeline`: real `launcher up` runs of one topology in one
/// process and one of several processes, alternating; per-round speeds and the
/// median ratio printed.
#[test]
fn bench_pipeline_times_the_rl_phase_on_two_topologies_in_alternating_rounds() {
    let tmp = tempfile::tempdir().unwrap();
    let topo = |name: &str, rollout: &str| {
        let text = format!(
            "name = \"{name}\"\n[[nodes]]\nname = \"local\"\nhost = \"127.0.0.1\"\n{}\n[controller]\nnode = \"local\"\nprocess = \"main\"\n\
             [weight_sync]\nnode = \"local\"\nprocess = \"main\"\n[rollout]\nplacement = [{rollout}]\n\
             [reward]\nplacement = [{{ node = \"local\", actors = 1, process = \"main\" }}]\n\
             [learner]\nranks = 1\nplacement = [{{ node = \"local\", actors = 1, process = \"main\" }}]\n",
            free_ports_table(4)
        );
        let p = tmp.path().join(format!("{name}.toml"));
        std::fs::write(&p, text).unwrap();
        p.to_str().unwrap().to_string()
    };
    let (one, two) = (topo("one", r#"{ node = "local", actors = 1, process = "main" }"#), topo("two", r#"{ node = "local", actors = 2 }"#));
    let recipe = tmp.path().join("bench.toml");
    std::fs::write(&recipe, "reward = \"process\"\n[model]\nhidden = 32\nlayers = 1\n[tasks]\nsize = 64\nheld_out = 100\n[sft]\nsteps = 2\nbatch_size = 4\ntasks = 256\n[rl]\nsteps = 100\ngroup_size = 2\ngroups_per_step = 2\nmax_new_tokens = 16\n").unwrap();
    let keep = tmp.path().join("runs");
    let o = launcher(&["bench", "pipeline", "--base", &one, "--against", &two, "--recipe", recipe.to_str().unwrap(), "--sft-steps", "2", "--rl-steps", "4", "--rounds", "2", "--keep", keep.to_str().unwrap()]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let report: Value = serde_json::from_str(stdout(&o).lines().last().unwrap()).unwrap();
    let rounds = report["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 2);
    for r in rounds {
        let (b, a, ratio) = (r["base_steps_per_s"].as_f64().unwrap(), r["against_steps_per_s"].as_f64().unwrap(), r["ratio"].as_f64().unwrap());
        assert!(b > 0.0 && a > 0.0 && (ratio - a / b).abs() < 1e-9, "{r}");
    }
    let m = report["median_ratio"].as_f64().unwrap();
    assert!((m - 0.5 * (rounds[0]["ratio"].as_f64().unwrap() + rounds[1]["ratio"].as_f64().unwrap())).abs() < 1e-9);
    // Both topologies really ran: the second one's rollouts came from two other processes.
    assert!(keep.join("round0-against/logs/local_rollout-1.log").is_file());
    assert_eq!(std::fs::read_to_string(keep.join("round1-base/metrics.jsonl")).unwrap().lines().count(), 4);
    // One warm-up, shared: the first run stored it, every later run restored
    // it, so each RL phase starts from the same weights and its first step
    // (sampled from them, with placement-independent seeds, and trained in
    // dispatch order) is the same work: the same reward, loss and gradient.
    // (Its `generated_tokens` is not compared: that counts the answers that
    // arrived before the step, more of them when two processes generate.)
    let log = |run: &str| std::fs::read_to_string(keep.join(run).join("progress.log")).unwrap();
    assert!(!log("round0-base").contains("starting from the shared warm-up"), "{}", log("round0-base"));
    let first_step = |run: &str| -> Vec<Value> {
        let text = std::fs::read_to_string(keep.join(run).join("metrics.jsonl")).unwrap();
        let row: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
        ["reward_mean", "loss", "grad_norm"].iter().map(|k| row[*k].clone()).collect()
    };
    for run in ["round0-against", "round1-against", "round1-base"] {
        assert!(log(run).contains("starting from the shared warm-up"), "{run}: {}", log(run));
        assert_eq!(first_step(run), first_step("round0-base"), "{run}'s first RL step");
    }
    assert!(rounds[0]["base_tokens_per_step"].as_f64().unwrap() > 0.0, "{}", rounds[0]);

    let o = launcher(&["bench", "pipeline", "--rl-steps", "2"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("--rl-steps: at least 3"), "{}", stderr(&o));
}

/// `launcher bench grpo`: the same RL work in rlmesh (`launcher up`) and in the
/// real TRL GRPOTrainer (the set-up's Python), alternating; the bench checks
/// that both render the same prompts and score with the same reward, reuses
/// its cached warm-up, and with `--to-quality` evaluates both final policies.
#[test]
fn bench_grpo_runs_rlmesh_and_trl_on_the_same_work() {
    let tmp = tempfile::tempdir().unwrap();
    let recipe = tmp.path().join("tiny-grpo.toml");
    std::fs::write(
        &recipe,
        "reward = \"process\"\ntools = [\"calculator\"]\n[model]\nhidden = 32\nlayers = 1\n[tasks]\nsize = 64\nheld_out = 100\n\
         [sft]\nsteps = 20\nbatch_size = 4\ntasks = 256\n[rl]\ngroup_size = 2\ngroups_per_step = 2\nmax_turns = 3\nmax_new_tokens = 16\n",
    )
    .unwrap();
    let cache = tmp.path().join("cache");
    let args = |rounds: &str, quality: bool| {
        let mut v = vec!["bench", "grpo", "--recipe", recipe.to_str().unwrap(), "--steps", "2", "--rounds", rounds, "--threads", "1", "--cache", cache.to_str().unwrap()];
        if quality {
            v.push("--to-quality");
        }
        v.into_iter().map(String::from).collect::<Vec<_>>()
    };
    let run = |a: Vec<String>| launcher(&a.iter().map(String::as_str).collect::<Vec<_>>());
    let o = run(args("2", true));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stderr(&o).contains("making the warm-up once"), "{}", stderr(&o));
    let report: Value = serde_json::from_str(stdout(&o).lines().last().unwrap()).unwrap();
    let rounds = report["rounds"].as_array().unwrap();
    assert_eq!(rounds.len(), 2);
    for r in rounds {
        let (ours, theirs, ratio) = (r["rlmesh_steps_per_s"].as_f64().unwrap(), r["trl_steps_per_s"].as_f64().unwrap(), r["ratio"].as_f64().unwrap());
        assert!(ours > 0.0 && theirs > 0.0 && (ratio - ours / theirs).abs() < 1e-9, "{r}");
        assert!(r["rlmesh_tokens_per_s"].as_f64().unwrap() > 0.0 && r["trl_tokens_per_s"].as_f64().unwrap() > 0.0, "{r}");
        for p in ["generate", "tools", "reward", "train", "sync"] {
            assert!(r["rlmesh_phase_seconds"][p].as_f64().unwrap() >= 0.0, "{r}");
        }
    }
    // 2 steps × 2 groups: four prompts compared byte for byte; every TRL rollout re-scored by rlmesh.
    assert_eq!(report["checked"]["rendered_prompts"], 4, "{report}");
    assert_eq!(report["checked"]["reward_completions"], 2 * 2 * 2 * 2, "{report}");
    for k in ["rlmesh_trajectory_success", "trl_trajectory_success"] {
        let s = report["quality"][k].as_f64().unwrap();
        assert!((0.0..=1.0).contains(&s), "{report}");
    }
    assert_eq!(report["quality"]["held_out_tasks"], 100);
    assert!(!report["unequal"].as_array().unwrap().is_empty(), "the fields TRL cannot match are listed");
    // The second invocation starts from the cached warm-up.
    let o = run(args("1", false));
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(!stderr(&o).contains("making the warm-up"), "{}", stderr(&o));

    let o = launcher(&["bench", "grpo", "--steps", "1"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("--steps: at least 2"), "{}", stderr(&o));
    let o = launcher(&["bench", "grpo", "--recipe", "configs/multistep-slca.toml", "--cache", cache.to_str().unwrap()]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("compares GRPO"), "{}", stderr(&o));
}
