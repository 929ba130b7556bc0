//! The cache kept across turns: a row continued from the keys and values its
//! previous call left gives the tokens the per-turn path gives by prefilling
//! the whole conversation again, and the tokens transformers' `generate`
//! gives on that conversation; only the new tokens are prefilled.
mod common;

use common::*;
use rlmesh_model::fused::DecodeEngine;
use rlmesh_model::{KeptKv, OnUpdate, PrefillTokens, SamplingParams, Tokenizer, Transformer};
use serde_json::json;
use tch::Device;

/// Three chat prompts, the first twice (a group's two rollouts share its prefill).
fn prompts(tok: &Tokenizer) -> Vec<Vec<u32>> {
    ["What is 17 times 3?", "What is 17 times 3?", "Name a prime number above 20.", "Write one word about the sea."]
        .iter()
        .map(|p| tok.render_ids(&[json!({"role": "user", "content": p})], None, true).unwrap().1)
        .collect()
}

/// The next turn's context of each row: its prompt, its reply, a tool turn's tokens and a new generation prompt.
fn extend(tok: &Tokenizer, prompts: &[Vec<u32>], replies: &[Vec<u32>], turn: usize) -> Vec<Vec<u32>> {
    prompts
        .iter()
        .zip(replies)
        .enumerate()
        .map(|(i, (p, r))| {
            let glue = format!("\n<|im_start|>user\n<tool_response>\n{{\"result\": {}}}\n</tool_response><|im_end|>\n<|im_start|>assistant\n", 40 + 7 * i + turn);
            p.iter().chain(r).copied().chain(tok.encode(&glue).unwrap()).collect()
        })
        .collect()
}

fn greedy(n: usize) -> SamplingParams {
    SamplingParams { max_new_tokens: n, temperature: 0.0, ..Default::default() }
}

#[test]
fn kept_turns_equal_the_per_turn_path_and_transformers_on_smollm2() {
    let dir = smollm2();
    let model = Transformer::load(&dir, Device::Cpu, None).unwrap();
    let tok = Tokenizer::load(&dir).unwrap();
    let params = greedy(12);
    let mut ctx = prompts(&tok);
    let mut kept: Vec<Option<KeptKv>> = (0..ctx.len()).map(|_| None).collect();
    let (mut contexts, mut outputs) = (vec![], vec![]);
    for turn in 1..=3 {
        let before: Vec<usize> = kept.iter().map(|k| k.as_ref().map_or(0, |k| k.tokens().len())).collect();
        let (ours, counts) = model.generate_kept(&ctx, &mut kept, 0, OnUpdate::Keep, &params, None, DecodeEngine::Fused).unwrap();
        let again = model.generate_with(&ctx, &params, None, DecodeEngine::Fused).unwrap();
        for (i, (a, b)) in ours.iter().zip(&again).enumerate() {
            assert_eq!(a.tokens, b.tokens, "turn {turn}, row {i}: kept KV against the whole context prefilled again");
            let diff = a.logprobs.iter().zip(&b.logprobs).map(|(x, y)| (x - y).abs()).fold(0.0f32, f32::max);
            assert!(diff < 2e-3, "turn {turn}, row {i}: log-probs differ by {diff}");
        }
        // Only tokens after what each row kept were prefilled; the group's shared first prompt once.
        let expected = match turn {
            1 => ctx.iter().skip(1).map(Vec::len).sum::<usize>(),
            _ => ctx.iter().zip(&before).map(|(c, b)| c.len() - b).sum(),
        };
        assert_eq!(counts, PrefillTokens { new: expected, recomputed: 0 }, "turn {turn}");
        for (i, k) in kept.iter().enumerate() {
            let k = k.as_ref().unwrap();
            assert_eq!(k.tokens().len(), ctx[i].len() + ours[i].tokens.len() - 1, "row {i} keeps its context and every fed token");
            assert!(ctx[i].starts_with(&k.tokens()[..ctx[i].len()]));
        }
        contexts.extend(ctx.iter().cloned());
        outputs.extend(ours.iter().map(|c| c.tokens.clone()));
        let replies: Vec<Vec<u32>> = ours.into_iter().map(|c| c.tokens).collect();
        ctx = extend(&tok, &ctx, &replies, turn);
    }
    // transformers' greedy `generate` on every turn's whole context, one row at a time.
    let theirs = oracle(&["generate", "--model", &dir.display().to_string()], &json!({"prompts": contexts, "max_new_tokens": 12, "eos_token_id": []}));
    let theirs: Vec<Vec<u32>> = serde_json::from_value(theirs["tokens"].clone()).unwrap();
    assert_eq!(outputs, theirs, "every turn against transformers");
}

#[test]
fn another_version_is_recomputed_or_kept_as_asked() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "qwen2", false, true, 3, &[]);
    let model = Transformer::load(&m, Device::Cpu, None).unwrap();
    let first = sequences(&[9, 14, 5], 49152, 2);
    let params = greedy(6);
    let mut kept: Vec<Option<KeptKv>> = (0..3).map(|_| None).collect();
    let (out, _) = model.generate_kept(&first, &mut kept, 4, OnUpdate::Recompute, &params, None, DecodeEngine::Fused).unwrap();
    assert!(kept.iter().all(|k| k.as_ref().unwrap().version() == 4));
    let next: Vec<Vec<u32>> = first.iter().zip(&out).map(|(p, c)| p.iter().chain(&c.tokens).copied().chain([7, 8, 9]).collect()).collect();
    let reference = model.generate_with(&next, &params, None, DecodeEngine::Fused).unwrap();
    let fed: usize = first.iter().zip(&out).map(|(p, c)| p.len() + c.tokens.len() - 1).sum();
    let total: usize = next.iter().map(Vec::len).sum();
    for (on_update, recomputed) in [(OnUpdate::Recompute, fed), (OnUpdate::Keep, 0)] {
        // The version-4 caches made again for each mode.
        let mut k: Vec<Option<KeptKv>> = (0..3).map(|_| None).collect();
        let (o, _) = model.generate_kept(&first, &mut k, 4, OnUpdate::Keep, &params, None, DecodeEngine::Fused).unwrap();
        assert_eq!(o.iter().map(|c| &c.tokens).collect::<Vec<_>>(), out.iter().map(|c| &c.tokens).collect::<Vec<_>>());
        let (ours, counts) = model.generate_kept(&next, &mut k, 5, on_update, &params, None, DecodeEngine::Fused).unwrap();
        assert_eq!(counts, PrefillTokens { new: total - fed, recomputed }, "{on_update:?}");
        for (a, b) in ours.iter().zip(&reference) {
            assert_eq!(a.tokens, b.tokens, "{on_update:?}: the same weights, so the same tokens either way");
        }
        assert!(k.iter().all(|k| k.as_ref().unwrap().version() == 5), "what a call computed carries its version");
    }
}

#[test]
fn the_libtorch_decode_step_continues_kept_rows_too() {
    let dir = tempfile::tempdir().unwrap();
    let m = tiny_model(dir.path(), "llama", true, false, 8, &[]);
    let model = Transformer::load(&m, Device::Cpu, None).unwrap();
    let first = sequences(&[4, 11, 11, 7], 49152, 5);
    let params = SamplingParams { max_new_tokens: 8, temperature: 0.8, seed: 9, ..Default::default() };
    let mut kept: Vec<Option<KeptKv>> = (0..4).map(|_| None).collect();
    let (out, _) = model.generate_kept(&first, &mut kept, 0, OnUpdate::Keep, &params, None, DecodeEngine::Tensor).unwrap();
    let same = model.generate_with(&first, &params, None, DecodeEngine::Tensor).unwrap();
    assert_eq!(out, same, "a first turn is `generate` exactly, sampling included");
    let next: Vec<Vec<u32>> = first.iter().zip(&out).map(|(p, c)| p.iter().chain(&c.tokens).copied().chain([3, 5]).collect()).collect();
    let g = greedy(8);
    let (ours, counts) = model.generate_kept(&next, &mut kept, 0, OnUpdate::Keep, &g, None, DecodeEngine::Tensor).unwrap();
    let theirs = model.generate_with(&next, &g, None, DecodeEngine::Tensor).unwrap();
    assert_eq!(ours.iter().map(|c| &c.tokens).collect::<Vec<_>>(), theirs.iter().map(|c| &c.tokens).collect::<Vec<_>>());
    assert_eq!(counts.recomputed, 0);
    assert!(out.iter().all(|c| c.tokens.len() == 8));
    assert_eq!(counts.new, out.len() * (1 + 2), "each row's last sampled token and the two appended");
}
