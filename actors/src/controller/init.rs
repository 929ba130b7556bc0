//! Run set-up: the tiny policy the embedded default trains (created in Rust:
//! random weights, SmolLM2's tokenizer, the Qwen2.5-style tool template).
use rlmesh_model::{ModelConfig, Transformer};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use tch::{Device, Kind};

/// The tool-calling chat template shipped with rlmesh (Qwen2.5 style).
pub const TOOL_TEMPLATE: &str = include_str!("../../../model/templates/qwen2.5-tools.jinja");

/// Shape of the tiny policy.
#[derive(Clone, Copy, Debug)]
pub struct TinySpec {
    /// Residual width.
    pub hidden: i64,
    /// Decoder layers.
    pub layers: i64,
    /// Query heads.
    pub heads: i64,
    /// Key/value heads.
    pub kv_heads: i64,
    /// MLP width.
    pub intermediate: i64,
}

impl Default for TinySpec {
    fn default() -> Self {
        TinySpec { hidden: 128, layers: 4, heads: 4, kv_heads: 2, intermediate: 384 }
    }
}

/// Errors of run set-up.
#[derive(Debug, thiserror::Error)]
pub enum InitError {
    /// A tokenizer file could not be copied.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A tokenizer could not be trained or saved.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The model could not be built or saved.
    #[error(transparent)]
    Model(#[from] rlmesh_model::ModelError),
}

fn same_file(a: &Path, b: &Path) -> bool {
    matches!((a.canonicalize(), b.canonicalize()), (Ok(x), Ok(y)) if x == y)
}

/// Create a tiny Llama-architecture model with random weights (seeded) in `out`,
/// using the tokenizer files of `tokenizer_dir` and rlmesh's tool template.
pub fn create_tiny_model(out: &Path, tokenizer_dir: &Path, spec: TinySpec, seed: u64) -> Result<PathBuf, InitError> {
    let vocab = rlmesh_model::Tokenizer::load(tokenizer_dir)?.vocab_size() as i64;
    let config = json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
        "hidden_size": spec.hidden, "intermediate_size": spec.intermediate, "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads, "num_key_value_heads": spec.kv_heads, "head_dim": spec.hidden / spec.heads,
        "hidden_act": "silu", "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
        "tie_word_embeddings": true, "attention_bias": false, "mlp_bias": false,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "dtype": "float32"
    });
    let cfg = ModelConfig::from_json(config, &out.join("config.json"))?;
    tch::manual_seed(seed as i64);
    let model = Transformer::new(cfg, Device::Cpu, Kind::Float);
    model.save(out, None)?;
    for f in ["tokenizer.json", "tokenizer_config.json", "generation_config.json"] {
        let src = tokenizer_dir.join(f);
        if src.exists() && !same_file(&src, &out.join(f)) {
            std::fs::copy(&src, out.join(f)).map_err(|source| InitError::Io { path: src.clone(), source })?;
        }
    }
    let tmpl = out.join("chat_template.jinja");
    std::fs::write(&tmpl, TOOL_TEMPLATE).map_err(|source| InitError::Io { path: tmpl.clone(), source })?;
    Ok(out.to_path_buf())
}

/// Tokens the task tokenizer reserves: the chat markers (special, ids 0–2) and
/// the tool tags (plain added tokens, so they survive decoding as text).
pub const TASK_SPECIAL_TOKENS: [&str; 3] = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"];
/// See [`TASK_SPECIAL_TOKENS`].
pub const TASK_TAG_TOKENS: [&str; 4] = ["<tool_call>", "</tool_call>", "<tool_response>", "</tool_response>"];

fn added_tokens() -> Vec<tokenizers::AddedToken> {
    let special = TASK_SPECIAL_TOKENS.iter().map(|t| tokenizers::AddedToken::from(*t, true));
    let tags = TASK_TAG_TOKENS.iter().map(|t| tokenizers::AddedToken::from(*t, false).normalized(false));
    special.chain(tags).collect()
}

/// Digits a number token of the task tokenizer may hold (the recipe's `model.number_chunk`):
/// past 3, the 1,110 chunk tokens become 11,110 and outgrow the learned vocabulary.
pub const NUMBER_CHUNK_DIGITS: std::ops::RangeInclusive<u32> = 1..=3;

/// A byte-level BPE tokenizer for the task domain, learned from `texts`.
///
/// Numbers split into chunks of up to `digits` (1–3, the recipe's
/// `model.number_chunk`) digits from the left (with 3, `75922` is `759` `22`),
/// and every string of one to `digits` digits is a token of its own
/// (added after training, on top of `vocab_size`), so copying an operand or a
/// result is copying one or two tokens that rarely repeat inside a number —
/// a copy head cannot lose its place the way it does in a run of single
/// digits. Nothing else splits words: the fixed template text (system prompt,
/// tool schema, JSON glue) merges into a few long tokens, which keeps the tiny
/// policy's sequences short. Bytes never seen in training still encode (the
/// byte alphabet is complete).
pub fn train_task_tokenizer<S: AsRef<str> + Send>(texts: impl Iterator<Item = S> + Send, vocab_size: usize, digits: u32) -> Result<tokenizers::Tokenizer, InitError> {
    use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
    use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
    use tokenizers::models::TrainerWrapper;
    use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
    use tokenizers::pre_tokenizers::{byte_level::ByteLevel, sequence::Sequence, PreTokenizerWrapper};
    use tokenizers::SplitDelimiterBehavior;
    let train_err = |e: tokenizers::Error| InitError::Tokenizer(e.to_string());
    if !NUMBER_CHUNK_DIGITS.contains(&digits) {
        let (lo, hi) = (NUMBER_CHUNK_DIGITS.start(), NUMBER_CHUNK_DIGITS.end());
        return Err(InitError::Tokenizer(format!("number chunks of {lo} to {hi} digits, got {digits}")));
    }
    let mut tok = tokenizers::Tokenizer::new(BPE::default());
    let chunks = Split::new(SplitPattern::Regex(format!(r"\d{{1,{digits}}}")), SplitDelimiterBehavior::Isolated, false).map_err(train_err)?;
    tok.with_pre_tokenizer(Some(Sequence::new(vec![
        PreTokenizerWrapper::Split(chunks),
        PreTokenizerWrapper::ByteLevel(ByteLevel::new(false, false, false)),
    ])));
    tok.with_decoder(Some(ByteLevelDecoder::new(false, false, false)));
    let added = added_tokens();
    tok.add_special_tokens(&added[..TASK_SPECIAL_TOKENS.len()]);
    tok.add_tokens(&added[TASK_SPECIAL_TOKENS.len()..]);
    let mut trainer = TrainerWrapper::BpeTrainer(
        BpeTrainerBuilder::new()
            .vocab_size(vocab_size)
            .min_frequency(2)
            .show_progress(false)
            .special_tokens(added)
            .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
            .build(),
    );
    tok.train(&mut trainer, texts).map_err(train_err)?;
    with_digit_chunks(&tok, digits)
}

/// `tok` with every string of one to `digits` digits in its vocabulary, taken whole
/// (`ignore_merges`: a pre-token found in the vocabulary is one token).
fn with_digit_chunks(tok: &tokenizers::Tokenizer, digits: u32) -> Result<tokenizers::Tokenizer, InitError> {
    let err = |e: String| InitError::Tokenizer(e);
    let mut json: Value = serde_json::from_str(&tok.to_string(false).map_err(|e| err(e.to_string()))?).map_err(|e| err(e.to_string()))?;
    let model = json.get_mut("model").and_then(Value::as_object_mut).ok_or_else(|| err("no BPE model".into()))?;
    model.insert("ignore_merges".into(), Value::Bool(true));
    let vocab = model.get_mut("vocab").and_then(Value::as_object_mut).ok_or_else(|| err("no BPE vocabulary".into()))?;
    let mut next = vocab.values().filter_map(Value::as_u64).max().map_or(0, |m| m + 1);
    for width in 1..=digits {
        for n in 0..10u32.pow(width) {
            let chunk = format!("{n:0w$}", w = width as usize);
            if !vocab.contains_key(&chunk) {
                vocab.insert(chunk, json!(next));
                next += 1;
            }
        }
    }
    json.to_string().parse::<tokenizers::Tokenizer>().map_err(|e| err(e.to_string()))
}

/// Write a task tokenizer's files into `out` (`tokenizer.json`, its config,
/// the generation config with `<|im_end|>` as end of turn, rlmesh's tool template).
pub fn save_task_tokenizer(tok: &tokenizers::Tokenizer, out: &Path) -> Result<(), InitError> {
    let io = |path: PathBuf| move |source| InitError::Io { path, source };
    std::fs::create_dir_all(out).map_err(io(out.to_path_buf()))?;
    let path = out.join("tokenizer.json");
    tok.save(&path, false).map_err(|e| InitError::Tokenizer(format!("{}: {e}", path.display())))?;
    let id = |t: &str| tok.token_to_id(t).expect("reserved token");
    let files = [
        (
            "tokenizer_config.json",
            json!({"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>", "unk_token": "<|endoftext|>",
                   "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 2048}),
        ),
        (
            "generation_config.json",
            json!({"bos_token_id": id("<|im_start|>"), "eos_token_id": id("<|im_end|>"), "pad_token_id": id("<|im_end|>")}),
        ),
    ];
    for (name, value) in files {
        let path = out.join(name);
        std::fs::write(&path, serde_json::to_string_pretty(&value).expect("json")).map_err(io(path.clone()))?;
    }
    let tmpl = out.join("chat_template.jinja");
    std::fs::write(&tmpl, TOOL_TEMPLATE).map_err(io(tmpl.clone()))
}

/// Build the task tokenizer for `tasks` into `out`: a byte-level bootstrap
/// renders every applicable expert strategy on every task (tools really run),
/// and the BPE of [`train_task_tokenizer`] is learned from those conversations
/// (a task whose tool session cannot open is left out).
pub fn build_task_tokenizer(out: &Path, tasks: &[rlmesh_core::Task], registry: &rlmesh_core::tools::ToolRegistry, vocab_size: usize, digits: u32) -> Result<(), InitError> {
    use crate::warmup::{expert_example, Strategy, WarmupError};
    let bootstrap = train_task_tokenizer(std::iter::empty::<&str>(), 0, digits)?;
    save_task_tokenizer(&bootstrap, out)?;
    let bytes = rlmesh_model::Tokenizer::load(out)?;
    let mut texts = Vec::with_capacity(tasks.len() * 2);
    'tasks: for task in tasks {
        let strategies: &[Strategy] = if task.requires_tool {
            &[Strategy::Correct, Strategy::AnswerWithoutTool, Strategy::WrongArguments, Strategy::RepeatedCall]
        } else {
            &[Strategy::Correct, Strategy::ToolOnNoToolTask]
        };
        for &s in strategies {
            let ex = match expert_example(&bytes, registry, task, s, None) {
                Ok(ex) => ex,
                // A task whose tools cannot open (its reset fails) is left out;
                // the run drops its groups, saying why.
                Err(WarmupError::Session { .. }) => continue 'tasks,
                Err(e) => return Err(InitError::Tokenizer(e.to_string())),
            };
            texts.push(bytes.decode(&ex.token_ids, false)?);
        }
    }
    let tok = train_task_tokenizer(texts.iter(), vocab_size, digits)?;
    save_task_tokenizer(&tok, out)
}

/// A view of the model directory `model` in `out` whose chat template is `template`:
/// every file of `model` linked (weights are not copied), `chat_template.jinja`
/// written from `template` (the tokenizer prefers it to `tokenizer_config.json`'s).
/// Every process of a run loads the policy from there, so they all render alike.
pub fn with_chat_template(model: &Path, template: &Path, out: &Path) -> Result<PathBuf, InitError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| InitError::Io { path, source }
    };
    let source = std::fs::read_to_string(template).map_err(io(template))?;
    std::fs::create_dir_all(out).map_err(io(out))?;
    let model = model.canonicalize().map_err(io(model))?;
    for entry in std::fs::read_dir(&model).map_err(io(&model))? {
        let entry = entry.map_err(io(&model))?;
        let (name, link) = (entry.file_name(), out.join(entry.file_name()));
        if name == "chat_template.jinja" || link.symlink_metadata().is_ok() {
            continue;
        }
        std::os::unix::fs::symlink(entry.path(), &link).map_err(io(&link))?;
    }
    let dest = out.join("chat_template.jinja");
    std::fs::write(&dest, source).map_err(io(&dest))?;
    Ok(out.to_path_buf())
}

/// Refuses a chat template that cannot carry the run's tool calls: it must render the
/// tools, be prefix-preserving over a tool round-trip and end assistant turns with a stop
/// token ([`rlmesh_model::template`]), and `format`'s parser must read back the calls it renders.
pub fn check_tool_template(tokenizer: &rlmesh_model::Tokenizer, format: rlmesh_core::tools::ToolFormat) -> Result<(), String> {
    use rlmesh_model::template;
    template::check_tool_template(tokenizer).map_err(|e| e.to_string())?;
    let turn = template::rendered_call(tokenizer).map_err(|e| e.to_string())?;
    let (name, arguments) = template::probe_call();
    let spec = rlmesh_core::tools::ToolSpec {
        name: name.to_string(),
        description: String::new(),
        parameters: serde_json::json!({"type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}),
    };
    let probe = rlmesh_core::tools::Tool::from_handler(spec, std::sync::Arc::new(|_: &serde_json::Value| Ok(String::new())));
    let parsed = format.parse(&turn, &[probe]);
    if parsed.calls.iter().any(|c| c.error.is_none() && c.name == name && c.arguments == arguments) {
        return Ok(());
    }
    Err(format!(
        "[model] tool_format = \"{}\" does not read the calls this chat template writes: a call to {name} renders as {turn:?} (choose the format the template writes: {})",
        format.name(),
        rlmesh_core::tools::ToolFormat::ALL.map(|f| f.name()).join(", ")
    ))
}
