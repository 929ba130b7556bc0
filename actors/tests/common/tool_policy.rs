//! A tiny Qwen2 policy taught, in the test process, to hold a few tool-calling
//! conversations, plus the tools and tasks those conversations use.
//!
//! The policy is a random 2-layer Qwen2 (hidden size 64) with SmolLM2's
//! tokenizer and the Qwen2.5 tool template, fine-tuned with Adam on the
//! assistant tokens of [`targets`] until teacher-forced greedy decoding
//! reproduces every one of them with a margin; the weights are trained once per
//! test process and every [`policy`] call gets its own copy.
use rlmesh_core::tools::{calculator, ExecLimits, Tool, ToolRegistry, ToolSpec};
use rlmesh_core::{Message, Task};
use rlmesh_model::score::pad_right;
use rlmesh_model::transformer::{causal_mask, positions_from_valid, Batch};
use rlmesh_model::{ModelConfig, Tokenizer, Transformer};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};
use tch::nn::OptimizerConfig;
use tch::{Device, Kind, Tensor};

/// Time limit of every tool call in the fixture registry.
pub const TOOL_TIMEOUT_MS: u64 = 200;

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// SmolLM2's tokenizer with the Qwen2.5 tool template.
pub fn tokenizer() -> Tokenizer {
    let out = Command::new(repo().join("scripts/prepare-models.sh")).output().expect("run scripts/prepare-models.sh");
    assert!(out.status.success(), "prepare-models failed: {}", String::from_utf8_lossy(&out.stderr));
    let models = PathBuf::from(String::from_utf8(out.stdout).unwrap().lines().last().unwrap().trim());
    let mut tk = Tokenizer::load(&models.join("smollm2-135m")).expect("load the SmolLM2 tokenizer");
    tk.set_chat_template(std::fs::read_to_string(repo().join("model/templates/qwen2.5-tools.jinja")).unwrap());
    tk
}

/// The calculator plus `wait`, a tool that never returns within the time limit.
pub fn registry() -> ToolRegistry {
    let limits = ExecLimits { timeout_ms: TOOL_TIMEOUT_MS, ..ExecLimits::default() };
    let mut r = ToolRegistry::from_names(&["calculator", "inventory"], limits).unwrap();
    let spec = ToolSpec {
        name: "wait".into(),
        description: "Waits for the outside world.".into(),
        parameters: json!({"type": "object", "properties": {}}),
    };
    r.add_tool(Tool::from_handler(
        spec,
        Arc::new(|_: &Value| {
            std::thread::sleep(Duration::from_secs(60));
            Ok("finally".into())
        }),
    ))
    .unwrap();
    r
}

/// A stateless task.
pub fn task(id: &str, prompt: &str, requires_tool: bool) -> Task {
    Task {
        id: id.into(),
        prompt: prompt.into(),
        requires_tool,
        allowed_tools: if requires_tool { vec![calculator::NAME.into()] } else { vec![] },
        gold_tool_calls: vec![],
        expected_answer: None,
        environment: None,
        env_state: None,
        ..Default::default()
    }
}

/// One `<tool_call>` block as the template writes it (`arguments` as Python's `json.dumps` writes them).
pub fn call(name: &str, arguments: &str) -> String {
    format!("<tool_call>\n{{\"name\": \"{name}\", \"arguments\": {arguments}}}\n</tool_call>")
}

/// The tasks of the taught conversations and the text of each assistant turn.
pub fn targets() -> Vec<(Task, Vec<String>)> {
    let calc = |op: &str, a: i64, b: i64| call("calculator", &format!("{{\"operation\": \"{op}\", \"a\": {a}, \"b\": {b}}}"));
    vec![
        (task("calc", "Use the calculator to compute 17 * 24.", true), vec![calc("multiply", 17, 24), "The answer is 408.".into()]),
        (
            task("parallel", "Use the calculator to add 1 and 2 and to raise 2 to the power 3.", true),
            vec![format!("{}\n{}", calc("add", 1, 2), calc("power", 2, 3)), calc("add", 1, 2), "1 + 2 = 3 and 2 ** 3 = 8.".into()],
        ),
        (
            task("broken", "Call the broken tools.", true),
            vec![
                format!(
                    "<tool_call>\n{{\"name\": \"calculator\", \"arguments\": {{\"a\": 1}}\n</tool_call>\n{}\n{}",
                    call("search", "{\"query\": \"weather\"}"),
                    call("wait", "{}")
                ),
                "Done.".into(),
            ],
        ),
        (task("hello", "Reply with exactly: hello", false), vec!["hello".into()]),
    ]
}

/// The prompt messages a rollout of a stateless task without a system prompt starts from.
pub fn prompt_of(task: &Task) -> Vec<Message> {
    vec![Message::user(task.prompt.clone())]
}

/// The tool schemas a rollout of `task` sees.
pub fn tools_of(task: &Task) -> Vec<Value> {
    registry().session(task).unwrap().schemas()
}

/// The conversation after the prompt when the model writes `turns`, with the tool results of the real tools.
pub fn conversation(task: &Task, turns: &[String]) -> Vec<Message> {
    let registry = registry();
    let mut session = registry.session(task).unwrap();
    let mut messages = vec![];
    for (k, text) in turns.iter().enumerate() {
        let turn = session.parse(text);
        messages.push(turn.message());
        if k + 1 < turns.len() {
            let steps = session.execute(k, &turn.calls);
            messages.extend(steps.into_iter().map(|s| Message::tool(s.name, s.result)));
        }
    }
    messages
}

fn values(messages: &[Message]) -> Vec<Value> {
    messages.iter().map(|m| serde_json::to_value(m).unwrap()).collect()
}

/// The whole conversation rendered by the template and tokenised in one piece,
/// with mask 1 on each assistant turn's tokens up to and including its `<|im_end|>`.
pub fn render_with_mask(tk: &Tokenizer, prompt: &[Message], messages: &[Message], tools: &[Value]) -> (Vec<u32>, Vec<u8>) {
    let im_end = tk.token_to_id("<|im_end|>").unwrap();
    let all: Vec<Message> = prompt.iter().chain(messages).cloned().collect();
    let (_, ids) = tk.render_ids(&values(&all), Some(tools), false).unwrap();
    let mut mask = vec![0u8; ids.len()];
    for k in (0..all.len()).filter(|&k| all[k].role == "assistant") {
        let (_, before) = tk.render_ids(&values(&all[..k]), Some(tools), true).unwrap();
        let (_, upto) = tk.render_ids(&values(&all[..=k]), Some(tools), false).unwrap();
        assert!(upto.starts_with(&before) && ids.starts_with(&upto), "the template re-tokenises earlier turns at message {k}");
        let end = upto.iter().rposition(|&t| t == im_end).unwrap();
        mask[before.len()..=end].iter_mut().for_each(|m| *m = 1);
    }
    (ids, mask)
}

fn config() -> ModelConfig {
    let raw = json!({
        "architectures": ["Qwen2ForCausalLM"], "vocab_size": 49152, "hidden_size": 64, "intermediate_size": 128,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 2048,
        "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": true, "bos_token_id": 1, "eos_token_id": 2
    });
    ModelConfig::from_json(raw, Path::new("<tiny tool policy>")).unwrap()
}

/// Least logit margin (taught token minus the best other, over the whole vocabulary) the trained policy must reach.
const MARGIN: f64 = 1.0;
const MAX_STEPS: usize = 400;

/// Least margin of the taught tokens in `logits` `[N, V']` (targets are column indices).
fn least_margin(logits: &Tensor, targets: &Tensor) -> f64 {
    tch::no_grad(|| {
        let target = logits.gather(1, &targets.unsqueeze(1), false).squeeze_dim(1);
        let others = logits.scatter_value(1, &targets.unsqueeze(1), f64::NEG_INFINITY).amax(&[1i64][..], false);
        (target - others).min().double_value(&[])
    })
}

/// Teaches a fresh tiny policy the [`targets`]: cross-entropy on the assistant
/// tokens with Adam, the softmax taken over the tokens the conversations use
/// (cheap); done when the margin over the whole vocabulary exceeds [`MARGIN`].
fn train() -> HashMap<String, Tensor> {
    let start = Instant::now();
    // One intra-op thread: these tensors gain little from a second one and lose
    // a lot to spinning threads when the cores are shared.
    tch::set_num_threads(1);
    let tk = tokenizer();
    let (seqs, masks): (Vec<Vec<u32>>, Vec<Vec<u8>>) = targets()
        .iter()
        .map(|(task, turns)| render_with_mask(&tk, &prompt_of(task), &conversation(task, turns), &tools_of(task)))
        .unzip();
    tch::manual_seed(0);
    let model = Transformer::new(config(), Device::Cpu, Kind::Float);
    let padded = pad_right(&seqs, Device::Cpu);
    let width = padded.ids.size()[1];
    let mut used: Vec<u32> = seqs.concat();
    used.sort_unstable();
    used.dedup();
    // Row of the flattened hidden states that predicts each taught token, and the token.
    let (rows, targets): (Vec<i64>, Vec<u32>) = masks
        .iter()
        .zip(&seqs)
        .enumerate()
        .flat_map(|(b, (mask, ids))| (1..ids.len()).filter(move |&t| mask[t] == 1).map(move |t| (b as i64 * width + t as i64 - 1, ids[t])))
        .unzip();
    let local: Vec<i64> = targets.iter().map(|t| used.binary_search(t).unwrap() as i64).collect();
    let (rows, local) = (Tensor::from_slice(&rows), Tensor::from_slice(&local));
    let targets = Tensor::from_slice(&targets.iter().map(|&t| t as i64).collect::<Vec<_>>());
    let used = Tensor::from_slice(&used.iter().map(|&t| t as i64).collect::<Vec<_>>());
    let batch = Batch { ids: padded.ids.shallow_clone(), positions: positions_from_valid(&padded.valid), mask: causal_mask(&padded.valid) };
    let embed = model.vs.variables()["model.embed_tokens.weight"].shallow_clone();
    let mut opt = tch::nn::Adam::default().build(&model.vs, 1e-2).unwrap();
    let mut report = String::new();
    for step in 0..MAX_STEPS {
        let hidden = model.hidden_states(&batch, None).unwrap().view([-1, model.config.hidden_size]).index_select(0, &rows);
        let logits = hidden.matmul(&embed.index_select(0, &used).tr());
        let loss = logits.cross_entropy_for_logits(&local);
        if least_margin(&logits, &local) > MARGIN {
            let full = least_margin(&tch::no_grad(|| hidden.matmul(&embed.tr())), &targets);
            report = format!("step {step}: loss {:.4}, least margin {full:.2}", loss.double_value(&[]));
            if full > MARGIN {
                eprintln!("tool policy trained in {:.1} s ({report}, {} taught tokens)", start.elapsed().as_secs_f64(), targets.size()[0]);
                return model.vs.variables();
            }
        }
        opt.backward_step(&loss);
    }
    panic!("the tiny policy did not learn the target conversations in {MAX_STEPS} steps (last full check: {report})");
}

/// A copy of the trained policy (trained on first use in this process).
pub fn policy() -> Transformer {
    static WEIGHTS: OnceLock<Mutex<HashMap<String, Tensor>>> = OnceLock::new();
    let weights = WEIGHTS.get_or_init(|| Mutex::new(train())).lock().unwrap();
    let model = Transformer::new(config(), Device::Cpu, Kind::Float);
    model.copy_from(Path::new("<trained tool policy>"), &weights).unwrap();
    model
}
