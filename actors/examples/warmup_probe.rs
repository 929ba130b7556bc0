//! Probe: how well does SFT on expert trajectories teach the tiny policy the calculator?
//! usage: [THREADS=n HEADS=n KV_HEADS=n SEED=n VOCAB=n PACK=0|1 MICRO=n] warmup_probe TOKENIZER_DIR|task STEPS [hidden layers lr batch]
//! Trains on correct demonstrations only, then reports greedy success on 100 held-out
//! tasks of the mix and on 100 of the one template that reverses the operands
//! ("subtract X from Y": a = Y, b = X).
use rlmesh_actors::controller::init::{create_tiny_model, TinySpec};
use rlmesh_actors::learner::{AdamWConfig, Learner, LearnerConfig, SftBatch, SftSequence};
use rlmesh_actors::rollout::{rollout_groups, RolloutConfig};
use rlmesh_actors::warmup::{expert_example, Strategy};
use rlmesh_core::analysis::trajectory_outcome;
use rlmesh_core::dataset::{generate, MixConfig};
use rlmesh_core::tools::{ExecLimits, ToolRegistry};
use rlmesh_model::{SamplingParams, Tokenizer, Transformer};
use std::time::Instant;

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let tokdir = std::path::PathBuf::from(&a[1]);
    let steps: usize = a[2].parse().unwrap();
    let hidden: i64 = a.get(3).map(|s| s.parse().unwrap()).unwrap_or(128);
    let layers: i64 = a.get(4).map(|s| s.parse().unwrap()).unwrap_or(4);
    let lr: f64 = a.get(5).map(|s| s.parse().unwrap()).unwrap_or(2e-3);
    let bs: usize = a.get(6).map(|s| s.parse().unwrap()).unwrap_or(16);
    if let Ok(n) = std::env::var("THREADS") {
        tch::set_num_threads(n.parse().unwrap());
    }
    let dir = tempfile::tempdir().unwrap();
    let reg = ToolRegistry::from_names(&["calculator"], ExecLimits::default()).unwrap();
    let tasks = generate(&MixConfig { size: 1200, tool_fraction: 0.5, multi_step_fraction: 0.0, inventory: false, three_step_fraction: 0.0, seed: 1, drill_words: false }).unwrap();
    let (_, test) = tasks.split_at(1000);
    let held: std::collections::HashSet<String> = test.iter().map(rlmesh_core::dataset::task_key).collect();
    let pool = generate(&MixConfig { size: 16384, tool_fraction: 0.5, multi_step_fraction: 0.0, inventory: false, three_step_fraction: 0.0, seed: 2, drill_words: false }).unwrap();
    let train: Vec<_> = pool.into_iter().filter(|t| !held.contains(&rlmesh_core::dataset::task_key(t))).collect();
    let train = &train[..];
    let tokdir = if tokdir.to_str() == Some("task") {
        let vocab: usize = std::env::var("VOCAB").ok().map(|v| v.parse().unwrap()).unwrap_or(1024);
        let t0 = Instant::now();
        rlmesh_actors::controller::init::build_task_tokenizer(dir.path(), &train[..2048], &reg, vocab, std::env::var("CHUNK").ok().map(|v| v.parse().unwrap()).unwrap_or(3)).unwrap();
        eprintln!("task tokenizer (vocab {vocab}) in {:.1}s", t0.elapsed().as_secs_f64());
        dir.path().to_path_buf()
    } else {
        tokdir
    };
    let heads: i64 = std::env::var("HEADS").ok().map(|v| v.parse().unwrap()).unwrap_or(4);
    let kv_heads: i64 = std::env::var("KV_HEADS").ok().map(|v| v.parse().unwrap()).unwrap_or(2);
    let spec = TinySpec { hidden, layers, heads, kv_heads, intermediate: hidden * 3 };
    let seed: u64 = std::env::var("SEED").ok().map(|v| v.parse().unwrap()).unwrap_or(0);
    let m = create_tiny_model(dir.path(), &tokdir, spec, seed).unwrap();
    let tok = Tokenizer::load(&m).unwrap();
    let model = Transformer::load(&m, tch::Device::Cpu, None).unwrap();
    let t0 = Instant::now();
    let examples: Vec<SftSequence> = train
        .iter()
        .map(|t| {
            let e = expert_example(&tok, &reg, t, Strategy::Correct, None).unwrap();
            SftSequence { token_ids: e.token_ids, loss_mask: e.loss_mask }
        })
        .collect();
    let mean_len = examples.iter().map(|e| e.token_ids.len()).sum::<usize>() as f64 / examples.len() as f64;
    eprintln!("built {} examples in {:.1}s; mean len {mean_len:.1}; vocab {}", examples.len(), t0.elapsed().as_secs_f64(), tok.vocab_size());
    eprintln!("example: {:?}", examples[0].token_ids.iter().map(|&i| tok.decode(&[i], false).unwrap()).collect::<Vec<_>>());
    let pack_sft = std::env::var("PACK").map_or(true, |v| v != "0");
    let micro: usize = std::env::var("MICRO").ok().map(|v| v.parse().unwrap()).unwrap_or(bs);
    let cfg = LearnerConfig { optim: AdamWConfig { lr, ..Default::default() }, micro_batch_size: micro, pack_sft, warmup_steps: 10, schedule: rlmesh_actors::learner::LrSchedule::Cosine { total_steps: steps as u64 }, ..Default::default() };
    let mut learner = Learner::new(model, cfg, None).unwrap();
    let t0 = Instant::now();
    for s in 0..steps {
        let batch = SftBatch { sequences: (0..bs).map(|i| examples[(s * bs + i) % examples.len()].clone()).collect() };
        let st = learner.sft_step(&batch).unwrap();
        if s % 20 == 0 || s + 1 == steps {
            eprintln!("step {s} loss {:.4} {:.2}s", st.loss, t0.elapsed().as_secs_f64());
        }
    }
    let rc = RolloutConfig { group_size: 1, max_turns: 3, max_tokens: 200, sampling: SamplingParams { max_new_tokens: 60, temperature: 0.0, ..Default::default() }, ..Default::default() };
    // 100 held-out tasks of the mix, then 100 of the one template that reverses the operands ("subtract X from Y").
    let reversed: Vec<rlmesh_core::Task> = generate(&MixConfig { size: 40000, tool_fraction: 1.0, multi_step_fraction: 0.0, inventory: false, three_step_fraction: 0.0, seed: 3, drill_words: false })
        .unwrap()
        .into_iter()
        .filter(|t| t.prompt.contains(" from ") && !held.contains(&rlmesh_core::dataset::task_key(t)) && !train.iter().any(|u| u.prompt == t.prompt))
        .take(100)
        .collect();
    let tasks: Vec<(u64, rlmesh_core::Task)> = test.iter().take(100).chain(reversed.iter()).cloned().enumerate().map(|(i, t)| (i as u64, t)).collect();
    let t0 = Instant::now();
    let groups = rollout_groups(learner.model(), &tok, &reg, &tasks, &rc, 0, 0).unwrap();
    let ok = |gs: &[rlmesh_core::Group]| gs.iter().filter(|g| trajectory_outcome(&g.task, &g.trajectories[0]).success).count();
    eprintln!("eval {:.1}s: success {}/100 on the mix, {}/{} on subtract-from", t0.elapsed().as_secs_f64(), ok(&groups[..100]), ok(&groups[100..]), groups.len() - 100);
    let failed = groups.iter().filter(|g| !trajectory_outcome(&g.task, &g.trajectories[0]).success);
    for g in failed.take(6) {
        eprintln!("---- {} (expected {:?})\n{}", g.task.prompt, g.task.expected_answer, g.trajectories[0].completion);
    }
}
