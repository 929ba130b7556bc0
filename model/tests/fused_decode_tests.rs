//! The fused CPU decode step against libtorch's (`Transformer::hidden_states`) on
//! tiny random models written by transformers: hidden states step by step, and
//! whole generations (greedy and sampled, padded, shared prompts).
mod common;

use common::*;
use rlmesh_model::cache::KvCache;
use rlmesh_model::fused::{DecodeEngine, FusedDecoder};
use rlmesh_model::transformer::{causal_mask, positions_from_valid, Batch};
use rlmesh_model::{SamplingParams, Transformer};
use tch::{Device, Kind, Tensor};

/// Left-padded ids and validity for prompts.
fn left_pad(prompts: &[Vec<u32>]) -> (Tensor, Tensor) {
    let width = prompts.iter().map(Vec::len).max().unwrap();
    let (mut ids, mut valid) = (vec![0i64; prompts.len() * width], vec![false; prompts.len() * width]);
    for (i, p) in prompts.iter().enumerate() {
        for (j, &t) in p.iter().enumerate() {
            ids[i * width + width - p.len() + j] = t as i64;
            valid[i * width + width - p.len() + j] = true;
        }
    }
    let shape = [prompts.len() as i64, width as i64];
    (Tensor::from_slice(&ids).view(shape), Tensor::from_slice(&valid).view(shape))
}

/// Prefill `prompts` into a fresh cache (as `generate` does) and return it with the rows' last positions.
fn prefill(model: &Transformer, prompts: &[Vec<u32>], capacity: usize) -> (KvCache, Tensor, Vec<i64>) {
    let c = &model.config;
    let (ids, valid) = left_pad(prompts);
    let mut cache = KvCache::new(c.num_layers as usize, prompts.len() as i64, c.num_kv_heads, capacity, c.head_dim, Kind::Float, Device::Cpu);
    let batch = Batch { ids, positions: positions_from_valid(&valid), mask: causal_mask(&valid) };
    let _ = tch::no_grad(|| model.hidden_states(&batch, Some(&mut cache))).unwrap();
    let last = Vec::<i64>::try_from(positions_from_valid(&valid).select(1, valid.size()[1] - 1)).unwrap();
    (cache, valid, last)
}

/// Each fused step's final hidden states equal libtorch's step to float32 rounding,
/// with padding masked, grouped-query heads, biases on and off, odd sizes.
#[test]
fn fused_steps_match_libtorch_steps() {
    let dir = tempfile::tempdir().unwrap();
    for (arch, tied, bias, extra) in [("qwen2", false, true, vec![]), ("llama", true, false, vec!["--hidden", "64", "--heads", "4", "--kv-heads", "1"])] {
        let m = tiny_model(dir.path(), arch, tied, bias, 5, &extra);
        let model = Transformer::load(&m, Device::Cpu, None).unwrap();
        let prompts = sequences(&[7, 12, 3], 49152, 31);
        let steps = 20usize;
        let capacity = 12 + steps;
        let (mut ours_cache, valid, mut positions) = prefill(&model, &prompts, capacity);
        let (mut theirs_cache, _, _) = prefill(&model, &prompts, capacity);
        let mut fused = FusedDecoder::new(&model, &ours_cache, Some(&valid)).unwrap().expect("fused step applies on CPU float32");
        let b = prompts.len() as i64;
        let mut tokens: Vec<i64> = vec![101, 2002, 30003];
        let mut worst = 0.0f64;
        for step in 0..steps {
            positions.iter_mut().for_each(|p| *p += 1);
            let ours = fused.step(&tokens, &positions, &mut ours_cache).unwrap().shallow_clone();
            let s = (12 + step + 1) as i64;
            let slots = Tensor::cat(&[valid.shallow_clone(), Tensor::ones([b, s - 12], (Kind::Bool, Device::Cpu))], 1);
            let batch = Batch {
                ids: Tensor::from_slice(&tokens).view([b, 1]),
                positions: Tensor::from_slice(&positions).view([b, 1]),
                mask: slots.view([b, 1, 1, s]),
            };
            let theirs = tch::no_grad(|| model.hidden_states(&batch, Some(&mut theirs_cache))).unwrap().squeeze_dim(1);
            let scale = theirs.abs().max().double_value(&[]);
            let diff = (&ours - &theirs).abs().max().double_value(&[]) / scale;
            worst = worst.max(diff);
            // Feed libtorch's greedy tokens to both, so the sequences stay the same.
            let logits = theirs.linear::<Tensor>(&model.vs.variables()["model.embed_tokens.weight"], None);
            tokens = Vec::<i64>::try_from(logits.argmax(-1, false)).unwrap();
        }
        eprintln!("{arch}: largest relative difference over {steps} steps {worst:e}");
        assert!(worst < 1e-5, "{arch}: fused hidden states differ from libtorch's by {worst} (relative)");
        assert_eq!(ours_cache.len(), theirs_cache.len());
    }
}

/// Whole generations agree: greedy tokens equal and log-probs within 1e-5, and seeded
/// samples (temperature, top-k, top-p) with a group's shared prompt equal too.
#[test]
fn fused_generation_matches_libtorch_generation() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "qwen2", true, true, 8, &[]);
    let model = Transformer::load(&m, Device::Cpu, None).unwrap();
    let mut prompts = sequences(&[9, 4, 15], 49152, 3);
    prompts.push(prompts[0].clone());
    prompts.push(prompts[0].clone());
    let greedy = SamplingParams { max_new_tokens: 24, temperature: 0.0, ..Default::default() };
    let sampled = SamplingParams { max_new_tokens: 24, temperature: 0.9, top_k: 40, top_p: 0.95, seed: 17, ..Default::default() };
    for params in [greedy, sampled] {
        let ours = model.generate_with(&prompts, &params, None, DecodeEngine::Fused).unwrap();
        let theirs = model.generate_with(&prompts, &params, None, DecodeEngine::Tensor).unwrap();
        for (a, b) in ours.iter().zip(&theirs) {
            assert_eq!(a.tokens, b.tokens, "temperature {}", params.temperature);
            assert_eq!(a.finish, b.finish);
            for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
                assert!((x - y).abs() < 1e-5, "log-prob {x} vs {y}");
            }
        }
    }
}

/// Bad input to a fused step is an error, not a panic; where it does not apply, generation uses libtorch's step.
#[test]
fn fused_step_errors_and_fallback() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "llama", true, false, 2, &[]);
    let model = Transformer::load(&m, Device::Cpu, None).unwrap();
    let prompts = sequences(&[4, 4], 49152, 1);
    let (mut cache, _, positions) = prefill(&model, &prompts, 5);
    let mut fused = FusedDecoder::new(&model, &cache, None).unwrap().unwrap();
    let err = fused.step(&[1, 49152], &positions, &mut cache).unwrap_err().to_string();
    assert!(err.contains("49152") && err.contains("out of range"), "{err}");
    assert!(fused.step(&[1], &positions, &mut cache).is_err());
    fused.step(&[1, 2], &positions, &mut cache).unwrap();
    let err = fused.step(&[1, 2], &positions, &mut cache).unwrap_err().to_string();
    assert!(err.contains("KV cache holds 5 slots"), "{err}");
    let (mut other, _, _) = prefill(&model, &prompts[..1], 5);
    let err = fused.step(&[1, 2], &positions, &mut other).unwrap_err().to_string();
    assert!(err.contains("another shape"), "{err}");
    // bfloat16 weights: the fused step does not apply and generation uses libtorch's.
    let bf16 = Transformer::load(&m, Device::Cpu, Some(Kind::BFloat16)).unwrap();
    let (cache, _, _) = prefill(&model, &prompts, 8);
    assert!(FusedDecoder::new(&bf16, &cache, None).unwrap().is_none());
    let out = bf16.generate_with(&prompts, &SamplingParams { max_new_tokens: 3, temperature: 0.0, ..Default::default() }, None, DecodeEngine::Fused).unwrap();
    assert!(out.iter().all(|c| c.tokens.len() == 3));
}
