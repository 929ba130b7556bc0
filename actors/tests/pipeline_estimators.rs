//! Each estimator in the training loop, short, on multi-step tool tasks: the
//! batch the learner was sent (`--record-batches`) carries the advantages the
//! estimator defines, recomputed here from the reward actor's own rows
//! (`rollouts.jsonl`); StepTool's value loss falls; dynamic sampling drops
//! uniform groups within its budget; and the five runs share one warm-up.
use rlmesh_actors::controller::recipe::Recipe;
use rlmesh_actors::controller::run::{run, RunOptions, Summary};
use serde_json::Value;
use std::path::{Path, PathBuf};

fn tokenizer_dir() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let out = std::process::Command::new(root.join("scripts/prepare-models.sh")).output().unwrap();
    assert!(out.status.success());
    PathBuf::from(String::from_utf8(out.stdout).unwrap().trim().lines().last().unwrap()).join("smollm2-135m")
}

const STEPS: u64 = 10;

fn recipe(estimator: &str) -> Recipe {
    recipe_with(estimator, "")
}

fn recipe_with(estimator: &str, rl_extra: &str) -> Recipe {
    let text = format!(
        r#"
reward = "hierr"
tools = ["calculator", "inventory"]
[model]
vocab_size = 512
hidden = 64
layers = 2
heads = 2
kv_heads = 1
[tasks]
size = 64
held_out = 100
tool_fraction = 0.75
multi_step_fraction = 0.67
inventory = true
three_step_fraction = 0.5
[estimator]
{estimator}
[sft]
steps = 300
lr = 3e-3
batch_size = 16
tasks = 1024
share = true
[rl]
steps = {STEPS}
lr = 3e-4
group_size = 4
groups_per_step = 4
max_turns = 4
max_new_tokens = 40
mode = "sync"
{rl_extra}
"#
    );
    Recipe::parse("multistep-test.toml", &text).unwrap()
}

fn options(dir: &Path, recipe: Recipe) -> RunOptions {
    RunOptions {
        run_dir: dir.to_path_buf(),
        recipe,
        rollout_actors: 1,
        tokenizer_dir: tokenizer_dir(),
        max_steps: None,
        sft_steps: None,
        metrics_addr: "127.0.0.1:0".into(),
        panic_rollout_on_request: None,
        progress: false,
        eval_limit: Some(4),
        resume: false,
        fleet: None,
        record_batches: true,
    }
}

fn jsonl(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// One trained sequence with the reward actor's row for it.
struct Trained {
    group: u64,
    mask: Vec<u8>,
    advantages: Vec<f64>,
    rewards: Option<Vec<f64>>,
    row: Value,
}

/// The sequences of every step, matched with the rows written for them (same order).
fn trained(dir: &Path) -> Vec<Trained> {
    let rows = jsonl(&dir.join("rollouts.jsonl"));
    let batches = jsonl(&dir.join("batches.jsonl"));
    assert_eq!(batches.len() as u64, STEPS);
    let seqs: Vec<&Value> = batches.iter().flat_map(|b| b["sequences"].as_array().unwrap()).collect();
    assert_eq!(seqs.len(), rows.len());
    let nums = |v: &Value| v.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect::<Vec<f64>>();
    seqs.into_iter()
        .zip(rows)
        .map(|(s, row)| Trained {
            group: s["group"].as_u64().unwrap(),
            mask: s["loss_mask"].as_array().unwrap().iter().map(|x| x.as_u64().unwrap() as u8).collect(),
            advantages: nums(&s["advantages"]),
            rewards: (!s["rewards"].is_null()).then(|| nums(&s["rewards"])),
            row,
        })
        .collect()
}

/// Maximal runs of 1s: `(start, end)`.
fn runs(mask: &[u8]) -> Vec<(usize, usize)> {
    let mut out = vec![];
    let mut i = 0;
    while i < mask.len() {
        if mask[i] == 0 {
            i += 1;
            continue;
        }
        let s = i;
        while i < mask.len() && mask[i] != 0 {
            i += 1;
        }
        out.push((s, i));
    }
    out
}

/// `(x − mean)/(std_unbiased + eps)` over the `Some` members; fewer than 2 → 0.
fn normalise(xs: &[Option<f64>], eps: f64) -> Vec<f64> {
    let present: Vec<f64> = xs.iter().flatten().copied().collect();
    if present.len() < 2 {
        return vec![0.0; xs.len()];
    }
    let n = present.len() as f64;
    let mean = present.iter().sum::<f64>() / n;
    let std = (present.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / (n - 1.0)).sqrt();
    xs.iter().map(|x| x.map_or(0.0, |x| (x - mean) / (std + eps))).collect()
}

fn groups(seqs: &[Trained]) -> Vec<Vec<&Trained>> {
    let mut out: Vec<Vec<&Trained>> = vec![];
    for s in seqs {
        match out.last_mut() {
            Some(g) if g[0].group == s.group => g.push(s),
            _ => out.push(vec![s]),
        }
    }
    out
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-4 * (1.0 + b.abs())
}

fn check_grpo(seqs: &[Trained]) {
    for g in groups(seqs) {
        let want = normalise(&g.iter().map(|s| Some(s.row["total_reward"].as_f64().unwrap())).collect::<Vec<_>>(), 1e-4);
        for (s, w) in g.iter().zip(want) {
            for (a, m) in s.advantages.iter().zip(&s.mask) {
                assert!(close(*a, if *m == 1 { w } else { 0.0 }), "grpo: advantage {a}, expected {w} (mask {m})");
            }
        }
    }
}

fn check_slca(seqs: &[Trained]) {
    let mut with_process = 0;
    for g in groups(seqs) {
        // Penalty (no call: z < 0): p ← 0, q ← z.
        let z = |s: &Trained| s.row["total_reward"].as_f64().unwrap();
        let p: Vec<Option<f64>> = g
            .iter()
            .map(|s| (runs(&s.mask).len() >= 2).then(|| if z(s) < 0.0 { 0.0 } else { s.row["process_segment_reward"].as_f64().unwrap() }))
            .collect();
        let q: Vec<Option<f64>> =
            g.iter().map(|s| (!runs(&s.mask).is_empty()).then(|| if z(s) < 0.0 { z(s) } else { s.row["summary_segment_reward"].as_f64().unwrap() })).collect();
        let (ap, aq) = (normalise(&p, 1e-6), normalise(&q, 1e-6));
        if p.iter().flatten().count() < 2 {
            assert!(ap.iter().all(|a| *a == 0.0));
        }
        for (i, s) in g.iter().enumerate() {
            let r = runs(&s.mask);
            with_process += usize::from(r.len() >= 2);
            let mut want = vec![0.0; s.mask.len()];
            if let Some((&(ss, se), process)) = r.split_last() {
                for &(a, b) in process {
                    want[a..b].iter_mut().for_each(|x| *x = ap[i]);
                }
                want[ss..se].iter_mut().for_each(|x| *x = aq[i]);
            }
            for (t, (a, w)) in s.advantages.iter().zip(&want).enumerate() {
                assert!(close(*a, *w), "slca: token {t}: advantage {a}, expected {w}");
            }
        }
    }
    eprintln!("slca: {with_process} of {} trained rollouts have a tool-call segment", seqs.len());
    assert!(with_process > 0, "no trained rollout had a tool-call segment: the check saw only summaries");
}

fn check_critic_free(seqs: &[Trained]) {
    for g in groups(seqs) {
        // Discounted step returns, normalised over all steps of the group (eps 1e-4).
        let returns: Vec<Vec<f64>> = g
            .iter()
            .map(|s| {
                let r: Vec<f64> = s.row["step_rewards"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
                let mut acc = 0.0;
                let mut g: Vec<f64> = r.iter().rev().map(|x| {
                    acc = x + 0.99 * acc;
                    acc
                }).collect();
                g.reverse();
                g
            })
            .collect();
        let flat: Vec<Option<f64>> = returns.iter().flatten().map(|x| Some(*x)).collect();
        let mut norm = normalise(&flat, 1e-4).into_iter();
        for (s, ret) in g.iter().zip(&returns) {
            let r = runs(&s.mask);
            assert_eq!(r.len(), ret.len(), "one step reward per turn");
            for (a, b) in r {
                let w = norm.next().unwrap();
                for t in a..b {
                    assert!(close(s.advantages[t], w), "critic-free: token {t}: {} vs {w}", s.advantages[t]);
                }
            }
            assert!(s.advantages.iter().zip(&s.mask).all(|(a, m)| *m == 1 || *a == 0.0));
        }
    }
}

fn check_steptool(seqs: &[Trained], dir: &Path) {
    let mut nonzero = 0;
    for s in seqs {
        let rewards = s.rewards.as_ref().expect("steptool sends per-token rewards");
        let steps: Vec<f64> = s.row["step_rewards"].as_array().unwrap().iter().map(|x| x.as_f64().unwrap()).collect();
        let r = runs(&s.mask);
        assert_eq!(r.len(), steps.len(), "one step reward per turn");
        let mut want = vec![0.0; s.mask.len()];
        for ((_, end), v) in r.iter().zip(&steps) {
            want[end - 1] = *v;
        }
        for (t, (a, w)) in rewards.iter().zip(&want).enumerate() {
            assert!(close(*a, *w), "steptool: token {t}: reward {a}, expected {w}");
        }
        nonzero += steps.iter().filter(|x| **x != 0.0).count();
    }
    assert!(nonzero > 0, "every step reward was 0: nothing to learn a value from");
    let losses: Vec<f64> = jsonl(&dir.join("metrics.jsonl")).iter().map(|r| r["value_loss"].as_f64().expect("value_loss in every step row")).collect();
    assert_eq!(losses.len() as u64, STEPS);
    let half = losses.len() / 2;
    let (first, last) = (losses[..half].iter().sum::<f64>() / half as f64, losses[half..].iter().sum::<f64>() / (losses.len() - half) as f64);
    eprintln!("steptool: value losses {losses:?}, {nonzero} non-zero step rewards");
    assert!(last < first, "the value loss did not fall: {losses:?}");
}

/// Dynamic sampling, `max_draws` = 3 with 4 groups a step: the ledger drops
/// at most 8 groups ("uniform") before each step; a step that stayed within
/// that budget (as did the one before it) trains only groups with a non-zero advantage; each group is
/// trained or dropped exactly once; and the trained advantages are GRPO's.
fn check_dynamic_sampling(dir: &Path, seqs: &[Trained]) {
    let mut before_step: Vec<usize> = vec![0; STEPS as usize + 1];
    let mut pending = 0;
    let mut ends: std::collections::HashMap<u64, usize> = Default::default();
    for e in jsonl(&dir.join("ledger.jsonl")) {
        match e["event"].as_str().unwrap() {
            "dropped" => {
                assert_eq!(e["reason"], "uniform", "{e}");
                pending += 1;
                *ends.entry(e["group"].as_u64().unwrap()).or_default() += 1;
            }
            "trained" => {
                let step = e["step"].as_u64().unwrap() as usize;
                before_step[step] += std::mem::take(&mut pending);
                *ends.entry(e["group"].as_u64().unwrap()).or_default() += 1;
            }
            _ => {}
        }
    }
    assert!(ends.values().all(|n| *n == 1), "a group trained or dropped twice: {ends:?}");
    let budget = (3 - 1) * 4;
    assert!(before_step.iter().all(|n| *n <= budget), "drops per step over the budget of {budget}: {before_step:?}");
    let dropped: usize = before_step.iter().sum();
    eprintln!("dynamic sampling: uniform groups dropped before each step {before_step:?}");
    assert!(dropped > 0, "no group was uniform: the check saw nothing to drop");
    let batches = jsonl(&dir.join("batches.jsonl"));
    let mut informative_steps = 0;
    for (b, step) in batches.iter().zip(1..) {
        // Past the budget, uniform groups are trained as they come: in that
        // step, or (left over in the queue) in the next.
        if before_step[step] == budget || before_step[step - 1] == budget {
            continue;
        }
        informative_steps += 1;
        let mut by_group: std::collections::BTreeMap<u64, f64> = Default::default();
        for s in b["sequences"].as_array().unwrap() {
            let top = s["advantages"].as_array().unwrap().iter().map(|a| a.as_f64().unwrap().abs()).fold(0.0, f64::max);
            let e = by_group.entry(s["group"].as_u64().unwrap()).or_default();
            *e = e.max(top);
        }
        assert!(by_group.values().all(|top| *top > 1e-6), "step {step} trained a group with all-zero advantages: {by_group:?}");
    }
    assert!(informative_steps > 0, "every step spent its budget: the check saw no filtered step");
    check_grpo(seqs);
}

#[test]
fn each_estimator_trains_on_its_own_advantages_after_one_shared_warm_up() {
    let root = tempfile::tempdir().unwrap();
    let rt = tokio::runtime::Runtime::new().unwrap();
    let estimators = [
        ("grpo", "name = \"grpo\""),
        ("slca", "name = \"slca\"\nw_process = 1.0\nw_summary = 1.0"),
        ("steptool", "name = \"steptool\"\nkl_coef = 0.3\ngamma = 0.99\nlam = 0.95"),
        ("critic_free", "name = \"steptool_critic_free\"\ngamma = 0.99"),
        ("dynamic", "name = \"grpo\""),
    ];
    let mut after_warmup = vec![];
    for (i, (name, table)) in estimators.iter().enumerate() {
        let dir = root.path().join(name);
        let r = if *name == "dynamic" { recipe_with(table, "dynamic_sampling = true\nmax_draws = 3") } else { recipe(table) };
        let summary: Summary = rt.block_on(run(options(&dir, r))).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(summary.steps, STEPS);
        let log = std::fs::read_to_string(dir.join("progress.log")).unwrap();
        assert_eq!(log.contains("starting from the shared warm-up"), i > 0, "{name}: {log}");
        after_warmup.push(summary.after_warmup.clone());
        let seqs = trained(&dir);
        match *name {
            "grpo" => check_grpo(&seqs),
            "slca" => check_slca(&seqs),
            "steptool" => check_steptool(&seqs, &dir),
            "dynamic" => check_dynamic_sampling(&dir, &seqs),
            _ => check_critic_free(&seqs),
        }
    }
    // The same warm-up: the same policy before RL, so the same greedy figures.
    assert!(after_warmup.windows(2).all(|w| w[0] == w[1]), "{after_warmup:?}");
    assert_eq!(std::fs::read_dir(root.path().join(".warmups")).unwrap().count(), 1);
}
