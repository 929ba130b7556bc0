//! `launcher bench rollout`: multi-turn rollouts of a long-tailed task mix,
//! each turn continuing from the keys and values the rollout's earlier turns
//! left (the engine's `generate_kept`, what the tool loop runs) against
//! per-turn batching that prefills every conversation whole each turn (the
//! engine before, `generate`), in alternating rounds on the same prompts and seeds.
//!
//! The mix, per group of G rollouts of one prompt (rendered by the chat
//! template with the calculator's schema, as the tool loop renders it): a
//! quarter no-tool tasks (one turn), half one-call tasks (two turns), a
//! quarter three-call tasks (four turns). Every tool turn appends a tool
//! result and the next generation prompt to the rollout's context, as the
//! tool loop does. Sampling at temperature 0.7 stops at the model's stop
//! tokens, so answer lengths have a tail. An untrained checkpoint writes no
//! real calls, so the turns follow the task, not a parser.
//!
//! Reported per side: trajectories/s, generated tokens/s, the busy fraction
//! (the share of decode-step slots holding a live row: tokens generated over
//! the batch × steps of every call), and prefilled tokens per trajectory, new
//! and recomputed.
use super::bench::{peak_rss_mib, resolve_model};
use crate::error::{CliError, CliResult, UsageContext};
use clap::Args;
use rlmesh_comm::bench::median;
use rlmesh_core::tools::{ExecLimits, ToolRegistry};
use rlmesh_core::Task;
use rlmesh_model::fused::DecodeEngine;
use rlmesh_model::{KeptKv, OnUpdate, PrefillTokens, SamplingParams, Tokenizer, Transformer};
use serde_json::{json, Value};
use std::time::Instant;

/// Arguments of `launcher bench rollout`.
#[derive(Args, Clone)]
pub struct RolloutArgs {
    /// Model: "smollm2", "tiny" or a model directory.
    #[arg(long, default_value = "smollm2")]
    model: String,
    /// Groups (prompts) per batch.
    #[arg(long, default_value_t = 8)]
    groups: usize,
    /// Rollouts per group (G).
    #[arg(long, default_value_t = 8)]
    group_size: usize,
    /// Most tokens per turn.
    #[arg(long, default_value_t = 48)]
    max_new_tokens: usize,
    /// Alternations of (kept KV, per-turn); ratios are medians of the rounds'.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Intra-op threads (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
}

/// Questions of the mix; group g asks question g (mod the list).
const QUESTIONS: [&str; 8] = [
    "What is 17 times 3?",
    "Add 245 and 19, then divide by 4.",
    "Name a prime number above 20.",
    "What is 2 to the power of 10, minus 1000?",
    "Write one sentence about the sea.",
    "Compute 81 divided by 9, then add 12, then multiply by 3.",
    "What is 1234 minus 567?",
    "Say hello in French.",
];

/// Tool calls of group g's task: 0, 1, 1, 3 (a quarter no-tool, half one-call, a quarter three-call).
fn calls(g: usize) -> usize {
    [0, 1, 1, 3][g % 4]
}

/// One side's run of the whole mix: seconds, trajectories, generated tokens,
/// live decode slots and all slots, prefilled tokens.
#[derive(Default)]
struct Run {
    seconds: f64,
    trajectories: usize,
    generated: usize,
    busy: usize,
    slots: usize,
    prefill: PrefillTokens,
}

fn run_mix(model: &Transformer, tok: &Tokenizer, prompts: &[Vec<u32>], a: &RolloutArgs, keep: bool, seed: u64) -> CliResult<Run> {
    let rows = prompts.len();
    let mut ctx: Vec<Vec<u32>> = prompts.to_vec();
    let mut kept: Vec<Option<KeptKv>> = (0..rows).map(|_| None).collect();
    let mut computed = vec![0usize; rows];
    let mut run = Run { trajectories: rows, ..Run::default() };
    let stops = tok.stop_token_ids().to_vec();
    let t = Instant::now();
    for turn in 0..=3 {
        let live: Vec<usize> = (0..rows).filter(|&i| calls(i / a.group_size) >= turn).collect();
        if live.is_empty() {
            break;
        }
        let params = SamplingParams { max_new_tokens: a.max_new_tokens, temperature: 0.7, seed: seed + turn as u64, stop_token_ids: stops.clone(), ..Default::default() };
        let batch: Vec<Vec<u32>> = live.iter().map(|&i| ctx[i].clone()).collect();
        let out = if keep {
            let mut k: Vec<Option<KeptKv>> = live.iter().map(|&i| kept[i].take()).collect();
            let (out, counts) = model.generate_kept(&batch, &mut k, 0, OnUpdate::Keep, &params, Some(tok), DecodeEngine::from_env())?;
            live.iter().zip(k).for_each(|(&i, k)| kept[i] = k);
            run.prefill.add(counts);
            out
        } else {
            let mut seen = std::collections::HashSet::new();
            for (&i, p) in live.iter().zip(&batch) {
                if computed[i] > 0 || seen.insert(p) {
                    run.prefill.add(PrefillTokens::of(p.len(), computed[i], 0));
                }
            }
            model.generate(&batch, &params, Some(tok))?
        };
        let steps = out.iter().map(|c| c.tokens.len()).max().unwrap_or(0);
        run.slots += steps * live.len();
        for (&i, c) in live.iter().zip(&out) {
            run.generated += c.tokens.len();
            run.busy += c.tokens.len();
            computed[i] = ctx[i].len() + c.tokens.len().saturating_sub(1);
            ctx[i].extend(&c.tokens);
            if calls(i / a.group_size) > turn {
                let glue = format!("\n<|im_start|>user\n<tool_response>\n{{\"result\": {}}}\n</tool_response><|im_end|>\n<|im_start|>assistant\n", 17 + 3 * i + turn);
                ctx[i].extend(tok.encode(&glue)?);
            } else {
                kept[i] = None;
            }
        }
    }
    run.seconds = t.elapsed().as_secs_f64();
    Ok(run)
}

/// `launcher bench rollout`.
pub fn rollout(a: RolloutArgs) -> CliResult {
    if a.rounds == 0 || a.groups == 0 || a.group_size == 0 {
        return Err(CliError::usage(anyhow::anyhow!("--rounds, --groups, --group-size: at least 1")));
    }
    let threads = a.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    tch::set_num_threads(threads as i32);
    let dir = resolve_model(&a.model)?;
    let model = Transformer::load(&dir, tch::Device::Cpu, Some(tch::Kind::Float)).usage("loading the model")?;
    let tok = Tokenizer::load(&dir).usage("loading the tokenizer")?;
    let registry = ToolRegistry::from_names(&["calculator"], ExecLimits::default()).map_err(|e| CliError::usage(anyhow::anyhow!("{e}")))?;
    let mut prompts = vec![];
    for g in 0..a.groups {
        let task = Task { id: format!("q{g}"), prompt: QUESTIONS[g % QUESTIONS.len()].into(), allowed_tools: vec!["calculator".into()], ..Default::default() };
        let text = rlmesh_actors::rollout::prompt_text(&tok, &registry, &task, None).map_err(|e| CliError::usage(anyhow::anyhow!("{e}")))?;
        let ids = tok.encode(&text)?;
        prompts.extend(std::iter::repeat_n(ids, a.group_size));
    }
    println!(
        "bench rollout: {} groups × G={}, {} tokens a turn at most, turns 1/2/2/4 by group, {threads} threads, {} alternating rounds; prompt {} tokens",
        a.groups, a.group_size, a.max_new_tokens, a.rounds, prompts[0].len()
    );
    // Untimed: the first call's allocations and MKL's start-up.
    run_mix(&model, &tok, &prompts[..a.group_size], &RolloutArgs { groups: 1, max_new_tokens: 4, ..a.clone() }, true, 1)?;
    let (mut kept, mut per_turn) = (vec![], vec![]);
    for round in 0..a.rounds {
        let seed = 1000 + round as u64;
        let order = if round % 2 == 0 { [true, false] } else { [false, true] };
        for keep in order {
            let r = run_mix(&model, &tok, &prompts, &a, keep, seed)?;
            if keep { kept.push(r) } else { per_turn.push(r) }
        }
    }
    let side = |runs: &[Run]| -> Value {
        let m = |f: &dyn Fn(&Run) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
        json!({
            "trajectories_per_s": m(&|r| r.trajectories as f64 / r.seconds),
            "generated_tokens_per_s": m(&|r| r.generated as f64 / r.seconds),
            "busy_fraction": m(&|r| r.busy as f64 / r.slots.max(1) as f64),
            "prefill_new_per_trajectory": m(&|r| r.prefill.new as f64 / r.trajectories as f64),
            "prefill_recomputed_per_trajectory": m(&|r| r.prefill.recomputed as f64 / r.trajectories as f64),
            "seconds": runs.iter().map(|r| r.seconds).collect::<Vec<_>>(),
        })
    };
    let ratios: Vec<f64> = kept.iter().zip(&per_turn).map(|(k, p)| (k.trajectories as f64 / k.seconds) / (p.trajectories as f64 / p.seconds)).collect();
    let (k, p) = (side(&kept), side(&per_turn));
    let f = |v: &Value, key: &str| v[key].as_f64().unwrap_or(f64::NAN);
    println!("{:<22} {:>10} {:>10} {:>6} {:>14} {:>14}", "engine", "traj/s", "tok/s", "busy", "new pf/traj", "recomp pf/traj");
    for (name, v) in [("kept KV (now)", &k), ("per-turn (before)", &p)] {
        println!(
            "{name:<22} {:>10.2} {:>10.1} {:>6.2} {:>14.1} {:>14.1}",
            f(v, "trajectories_per_s"),
            f(v, "generated_tokens_per_s"),
            f(v, "busy_fraction"),
            f(v, "prefill_new_per_trajectory"),
            f(v, "prefill_recomputed_per_trajectory")
        );
    }
    println!("ratio (trajectories/s, kept / per-turn): {:.2}× (rounds {:?})", median(&ratios), ratios.iter().map(|r| (r * 100.0).round() / 100.0).collect::<Vec<_>>());
    println!("{}", json!({"bench": "rollout", "model": a.model, "threads": threads, "groups": a.groups, "group_size": a.group_size, "max_new_tokens": a.max_new_tokens,
        "kept": k, "per_turn": p, "ratio": median(&ratios), "round_ratios": ratios, "peak_rss_mib": peak_rss_mib()}));
    Ok(())
}
