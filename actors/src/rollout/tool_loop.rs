//! The batched tool loop: one `generate` call per turn over every live
//! rollout, each continuing from the keys and values its previous turn left
//! (`RolloutConfig::keep_kv`), or prefilled whole each turn.
use super::conversation::Conversation;
use super::{RolloutConfig, RolloutError};
use rlmesh_core::tools::{ParsedCall, ToolRegistry};
use rlmesh_core::{Group, Step, Task, Trajectory};
use rlmesh_model::fused::DecodeEngine;
use rlmesh_model::{Completion, KeptKv, ModelError, OnUpdate, PrefillTokens, SamplingParams, Tokenizer, Transformer};

/// Samples `cfg.group_size` trajectories for each `(group id, task)`, every
/// generated token stamped with policy `version`; groups come back in the order of `tasks`.
pub fn rollout_groups(
    model: &Transformer,
    tokenizer: &Tokenizer,
    registry: &ToolRegistry,
    tasks: &[(u64, Task)],
    cfg: &RolloutConfig,
    version: u64,
    seed: u64,
) -> Result<Vec<Group>, RolloutError> {
    rollout_groups_timed(model, tokenizer, registry, tasks, cfg, version, seed).map(|(groups, _)| groups)
}

/// Wall seconds a tool loop spent outside generation.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ToolLoopTiming {
    /// Executing tool calls and appending their results to the contexts (the
    /// rollouts of a turn side by side, so this is wall time, not the calls' sum).
    pub tools_seconds: f64,
    /// Tokens the engine prefilled, new and recomputed (a group's shared prompt once).
    pub prefill: PrefillTokens,
}

/// [`rollout_groups`], also returning where the wall time went.
pub fn rollout_groups_timed(
    model: &Transformer,
    tokenizer: &Tokenizer,
    registry: &ToolRegistry,
    tasks: &[(u64, Task)],
    cfg: &RolloutConfig,
    version: u64,
    seed: u64,
) -> Result<(Vec<Group>, ToolLoopTiming), RolloutError> {
    let all: Vec<&Task> = tasks.iter().map(|(_, t)| t).collect();
    let mut timing = ToolLoopTiming::default();
    let mut trajectories = rollouts(model, tokenizer, registry, &all, cfg, version, seed, &mut timing)?.into_iter();
    let groups = tasks
        .iter()
        .map(|(group_id, task)| Group { group_id: *group_id, task: task.clone(), trajectories: trajectories.by_ref().take(cfg.group_size).collect(), failed: None, earlier_segments: vec![] })
        .collect();
    Ok((groups, timing))
}

/// Runs the tool loop once on a user prompt (what `launcher chat` shows),
/// whatever `cfg.group_size`; the tokens carry policy version 0.
pub fn chat(
    model: &Transformer,
    tokenizer: &Tokenizer,
    registry: &ToolRegistry,
    prompt: &str,
    cfg: &RolloutConfig,
    seed: u64,
) -> Result<Trajectory, RolloutError> {
    let task = Task {
        id: "chat".into(),
        prompt: prompt.into(),
        requires_tool: false,
        allowed_tools: vec![],
        gold_tool_calls: vec![],
        expected_answer: None,
        environment: None,
        env_state: None,
        ..Default::default()
    };
    let cfg = RolloutConfig { group_size: 1, ..cfg.clone() };
    let mut out = rollouts(model, tokenizer, registry, &[&task], &cfg, 0, seed, &mut ToolLoopTiming::default())?;
    Ok(out.pop().expect("one task with group size 1 gives one trajectory"))
}

/// The text a rollout of `task` starts from: the chat template over the
/// user prompt (and its environment's observation) with the session's tool
/// schemas and the generation prompt, exactly as the tool loop renders it.
pub fn prompt_text(tokenizer: &Tokenizer, registry: &ToolRegistry, task: &Task, system_prompt: Option<&str>) -> Result<String, RolloutError> {
    Ok(Conversation::open(tokenizer, registry, task, 0, system_prompt)?.rendered_prompt().to_string())
}

/// `cfg.group_size` rollouts of each task, task-major; the time spent on tools is added to `timing`.
#[allow(clippy::too_many_arguments)]
fn rollouts(
    model: &Transformer,
    tokenizer: &Tokenizer,
    registry: &ToolRegistry,
    tasks: &[&Task],
    cfg: &RolloutConfig,
    version: u64,
    seed: u64,
    timing: &mut ToolLoopTiming,
) -> Result<Vec<Trajectory>, RolloutError> {
    cfg.validate()?;
    let stop_ids = match cfg.sampling.stop_token_ids.is_empty() {
        true => tokenizer.stop_token_ids().to_vec(),
        false => cfg.sampling.stop_token_ids.clone(),
    };
    if stop_ids.is_empty() {
        return Err(RolloutError::NoStopToken);
    }
    let mut convs = Vec::with_capacity(tasks.len() * cfg.group_size);
    for task in tasks {
        for sample in 0..cfg.group_size {
            convs.push(Conversation::open(tokenizer, registry, task, sample, cfg.system_prompt.as_deref())?);
        }
    }
    let context = usize::try_from(model.config.max_position_embeddings).unwrap_or(usize::MAX);
    let mut kv = TurnKv::new(convs.len(), cfg.keep_kv);
    for turn in 1..=cfg.max_turns {
        // Who generates this turn, and how many tokens each may take.
        let mut live = Vec::new();
        for (i, c) in convs.iter_mut().enumerate() {
            if c.stop.is_some() {
                continue;
            }
            match c.room(cfg.max_tokens, context) {
                0 => c.stop = Some(rlmesh_core::StopReason::TokenBudget),
                room => live.push((i, room.min(cfg.sampling.max_new_tokens))),
            }
        }
        let Some(longest) = live.iter().map(|&(_, limit)| limit).max() else { break };
        let params = SamplingParams {
            max_new_tokens: longest,
            seed: turn_seed(seed, turn),
            stop_token_ids: stop_ids.clone(),
            ..cfg.sampling.clone()
        };
        let prefixes: Vec<Vec<u32>> = live.iter().map(|&(i, _)| convs[i].ids().to_vec()).collect();
        let rows: Vec<usize> = live.iter().map(|&(i, _)| i).collect();
        let completions = kv
            .generate(model, tokenizer, &rows, &prefixes, &params, version, &mut timing.prefill)
            .map_err(|source| RolloutError::Generate { turn, rollouts: live.len(), source })?;
        let mut pending: Vec<Option<Vec<ParsedCall>>> = (0..convs.len()).map(|_| None).collect();
        for (&(i, limit), completion) in live.iter().zip(completions) {
            pending[i] = convs[i].record_turn(completion, limit, version, tokenizer)?;
            if convs[i].stop.is_some() {
                kv.forget(i);
            }
        }
        let tools = std::time::Instant::now();
        let steps = execute_concurrently(&mut convs, pending);
        for (c, steps) in convs.iter_mut().zip(steps) {
            if let Some(steps) = steps {
                let room = c.room(cfg.max_tokens, context);
                c.append_results(steps, tokenizer, &stop_ids, cfg.max_turns, room)?;
            }
        }
        timing.tools_seconds += tools.elapsed().as_secs_f64();
    }
    convs.into_iter().map(|c| c.finish(tokenizer)).collect()
}

/// What each rollout's next turn continues from: the keys and values its
/// last turn left (with `keep`), or, prefilled whole each turn, how many of
/// its tokens had been computed (to count them as recomputed).
struct TurnKv {
    keep: bool,
    kept: Vec<Option<KeptKv>>,
    computed: Vec<usize>,
}

impl TurnKv {
    fn new(rollouts: usize, keep: bool) -> TurnKv {
        TurnKv { keep, kept: (0..rollouts).map(|_| None).collect(), computed: vec![0; rollouts] }
    }

    /// One turn of the rollouts `rows` (their whole contexts `prompts`), counting what was prefilled into `prefill`.
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &mut self,
        model: &Transformer,
        tokenizer: &Tokenizer,
        rows: &[usize],
        prompts: &[Vec<u32>],
        params: &SamplingParams,
        version: u64,
        prefill: &mut PrefillTokens,
    ) -> Result<Vec<Completion>, ModelError> {
        if self.keep {
            let mut kept: Vec<Option<KeptKv>> = rows.iter().map(|&i| self.kept[i].take()).collect();
            let (out, counts) = model.generate_kept(prompts, &mut kept, version, OnUpdate::Keep, params, Some(tokenizer), DecodeEngine::from_env())?;
            for (&i, k) in rows.iter().zip(kept) {
                self.kept[i] = k;
            }
            prefill.add(counts);
            return Ok(out);
        }
        // The engine prefills identical prompts once (a group's first turn).
        let mut seen = std::collections::HashSet::new();
        for (&i, p) in rows.iter().zip(prompts) {
            if self.computed[i] > 0 || seen.insert(p) {
                prefill.add(PrefillTokens::of(p.len(), self.computed[i], 0));
            }
        }
        let out = model.generate(prompts, params, Some(tokenizer))?;
        for ((&i, p), c) in rows.iter().zip(prompts).zip(&out) {
            self.computed[i] = p.len() + c.tokens.len().saturating_sub(1);
        }
        Ok(out)
    }

    /// A rollout that ended: its keys and values are let go.
    fn forget(&mut self, i: usize) {
        self.kept[i] = None;
    }
}

/// Executes each rollout's pending calls, the rollouts side by side (a
/// rollout's own calls run in order).
fn execute_concurrently(convs: &mut [Conversation], pending: Vec<Option<Vec<ParsedCall>>>) -> Vec<Option<Vec<Step>>> {
    std::thread::scope(|scope| {
        let running: Vec<_> = convs
            .iter_mut()
            .zip(pending)
            .map(|(c, calls)| calls.map(|calls| scope.spawn(move || c.execute(&calls))))
            .collect();
        running.into_iter().map(|h| h.map(|h| h.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic)))).collect()
    })
}

/// The sampler seed of one turn (splitmix64 of the rollout seed and the turn).
fn turn_seed(seed: u64, turn: usize) -> u64 {
    let mut z = seed.wrapping_add((turn as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}
