//! `score`, `render`, `advantages`, `reward`: the JSON contracts of CLI.md.
//!
//! Input sizes are bounded before anything is allocated for them, and every
//! refusal exits 2 naming the file (and line) and the bound:
//! - `advantages` and `render` read one JSON document, parsed whole: at most
//!   [`MAX_DOCUMENT_BYTES`];
//! - `score` and `reward` read JSONL line by line (streamed: memory does not
//!   grow with the number of lines): each line at most [`MAX_LINE_BYTES`];
//! - `score` refuses a sequence longer than the model's
//!   `max_position_embeddings`, and packs a batch only while its logits fit
//!   [`SCORE_BATCH_LOGIT_BYTES`].
use crate::error::{CliError, CliResult, UsageContext};
use clap::Args;
use rlmesh_core::offline::parse_json;
use serde_json::{json, Value};
use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};

/// Largest input of `advantages` and `render` (16 MiB). They parse one JSON
/// document whole, and a parsed tree costs up to ~16× its text (a 32-byte
/// value for a two-byte `0,`): 16 MiB keeps a parse near 256 MiB. A training
/// step's groups (64 rollouts of a few thousand tokens) take about 2 MiB.
pub const MAX_DOCUMENT_BYTES: u64 = 16 << 20;

/// Longest line of `score` and `reward` input (4 MiB): a 128k-token sequence
/// written as ids takes under 1 MiB, a long conversation to score far less.
pub const MAX_LINE_BYTES: u64 = 4 << 20;

/// Most bytes of logits (and their log-softmax) one `score` batch may need
/// (1 GiB): rows × longest sequence × vocabulary × 4 bytes × 2. A batch that
/// would need more is cut short; one sequence alone is always scored.
pub const SCORE_BATCH_LOGIT_BYTES: u64 = 1 << 30;

/// Most sequences per `score` batch (`--batch`).
pub const MAX_SCORE_BATCH: u64 = 4096;

fn refuse(message: String) -> CliError {
    CliError::usage(anyhow::anyhow!(message))
}

fn mib(bytes: u64) -> String {
    format!("{} MiB", bytes >> 20)
}

/// Reads one whole document (a file, or standard input for `-`) of at most `limit` bytes; `command` names who reads it.
pub(crate) fn read_document(path: &Path, limit: u64, command: &str) -> CliResult<String> {
    let shown = path.display();
    let too_big = |size: Option<u64>| {
        let size = size.map_or_else(String::new, |s| format!("{s} bytes, "));
        refuse(format!("{shown}: {size}more than the {} `{command}` reads (it parses its input whole)", mib(limit)))
    };
    let reader: Box<dyn Read> = if path == Path::new("-") {
        Box::new(std::io::stdin())
    } else {
        let f = std::fs::File::open(path).usage(format!("{shown}: cannot read"))?;
        if let Ok(m) = f.metadata() {
            if m.is_file() && m.len() > limit {
                return Err(too_big(Some(m.len())));
            }
        }
        Box::new(f)
    };
    let mut bytes = Vec::new();
    reader.take(limit + 1).read_to_end(&mut bytes).usage(format!("{shown}: cannot read"))?;
    if bytes.len() as u64 > limit {
        return Err(too_big(None));
    }
    String::from_utf8(bytes).map_err(|e| refuse(format!("{shown}: not UTF-8 text (byte {})", e.utf8_error().valid_up_to())))
}

/// Calls `each(line_number, line)` on every non-blank line of a JSONL input
/// (a file, or standard input for `-`), reading one line at a time; a line
/// longer than [`MAX_LINE_BYTES`] is refused.
pub(crate) fn for_each_line(path: &Path, mut each: impl FnMut(usize, &str) -> CliResult) -> CliResult {
    let shown = path.display();
    let mut reader: Box<dyn BufRead> = if path == Path::new("-") {
        Box::new(std::io::stdin().lock())
    } else {
        Box::new(std::io::BufReader::new(std::fs::File::open(path).usage(format!("{shown}: cannot read"))?))
    };
    let mut buf = Vec::new();
    for number in 1.. {
        buf.clear();
        let n = reader.by_ref().take(MAX_LINE_BYTES + 1).read_until(b'\n', &mut buf).usage(format!("{shown}:{number}: cannot read"))?;
        if n == 0 {
            return Ok(());
        }
        if buf.last() == Some(&b'\n') {
            buf.pop();
        }
        if buf.len() as u64 > MAX_LINE_BYTES {
            return Err(refuse(format!("{shown}:{number}: line longer than {}, the most one input line may have", mib(MAX_LINE_BYTES))));
        }
        let line = std::str::from_utf8(&buf).map_err(|e| refuse(format!("{shown}:{number}: not UTF-8 text (byte {})", e.valid_up_to())))?;
        if !line.trim().is_empty() {
            each(number, line)?;
        }
    }
    Ok(())
}

/// Arguments of `launcher score`.
#[derive(Args)]
pub struct ScoreArgs {
    /// Model directory (config.json + safetensors).
    #[arg(long)]
    model: PathBuf,
    /// JSONL file of {"token_ids": [...]} (or - for stdin).
    #[arg(long)]
    input: PathBuf,
    /// Most sequences scored per batch (1..=4096; fewer when their logits would pass 1 GiB).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(1..=MAX_SCORE_BATCH))]
    batch: u64,
}

/// `launcher score`.
pub fn score(a: ScoreArgs) -> CliResult {
    let model = rlmesh_model::Transformer::load(&a.model, tch::Device::Cpu, Some(tch::Kind::Float)).usage("loading the model")?;
    let limit = usize::try_from(model.config.max_position_embeddings).unwrap_or(usize::MAX);
    let vocab = model.config.vocab_size.max(1) as u64;
    let mut out = std::io::stdout().lock();
    let mut batch = Batch::default();
    for_each_line(&a.input, |number, line| {
        let where_ = format!("{}:{number}", a.input.display());
        let v = parse_json(line).usage(&where_)?;
        let ids: Vec<u32> = v
            .get("token_ids")
            .ok_or_else(|| refuse(format!("{where_}: field \"token_ids\": missing")))
            .and_then(|x| serde_json::from_value(x.clone()).usage(format!("{where_}: field \"token_ids\": expected an array of non-negative integers")))?;
        if ids.is_empty() {
            return Err(refuse(format!("{where_}: field \"token_ids\": empty")));
        }
        if ids.len() > limit {
            return Err(refuse(format!(
                "{where_}: field \"token_ids\": {} tokens, more than the model's limit of {limit} (max_position_embeddings)",
                ids.len()
            )));
        }
        model.check_ids(&ids).usage(format!("{where_}: field \"token_ids\""))?;
        let longest = batch.longest.max(ids.len()) as u64;
        let logit_bytes = (batch.seqs.len() as u64 + 1) * longest * vocab * 4 * 2;
        if !batch.seqs.is_empty() && (batch.seqs.len() as u64 >= a.batch || logit_bytes > SCORE_BATCH_LOGIT_BYTES) {
            batch.flush(&model, &a.input, &mut out)?;
        }
        batch.push(number, ids);
        Ok(())
    })?;
    batch.flush(&model, &a.input, &mut out)
}

/// Sequences waiting to be scored together.
#[derive(Default)]
struct Batch {
    seqs: Vec<Vec<u32>>,
    first_line: usize,
    last_line: usize,
    longest: usize,
}

impl Batch {
    fn push(&mut self, line: usize, ids: Vec<u32>) {
        if self.seqs.is_empty() {
            self.first_line = line;
        }
        self.last_line = line;
        self.longest = self.longest.max(ids.len());
        self.seqs.push(ids);
    }

    /// Scores and prints the batch. A libtorch failure (it panics, e.g. when
    /// an allocation fails) is an error naming the lines, not a crash.
    fn flush(&mut self, model: &rlmesh_model::Transformer, input: &Path, out: &mut impl Write) -> CliResult {
        if self.seqs.is_empty() {
            return Ok(());
        }
        let quiet = std::panic::take_hook();
        std::panic::set_hook(Box::new(|_| {}));
        let scored = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| model.score(&self.seqs)));
        std::panic::set_hook(quiet);
        let lines = format!("{}:{}..={}", input.display(), self.first_line, self.last_line);
        let scored = match scored {
            Ok(r) => r.map_err(|e| anyhow::anyhow!("{lines}: scoring: {e}"))?,
            Err(panic) => {
                let why = panic.downcast_ref::<String>().map(String::as_str).or_else(|| panic.downcast_ref::<&str>().copied()).unwrap_or("a panic");
                let first = why.lines().next().unwrap_or(why);
                return Err(anyhow::anyhow!("{lines}: libtorch failed scoring {} sequences of up to {} tokens (try a smaller --batch): {first}", self.seqs.len(), self.longest).into());
            }
        };
        for lp in scored {
            writeln!(out, "{}", json!({ "logprobs": lp }))?;
        }
        *self = Batch::default();
        Ok(())
    }
}

/// Arguments of `launcher render`.
#[derive(Args)]
pub struct RenderArgs {
    /// Model directory (tokenizer.json + chat template).
    #[arg(long)]
    model: PathBuf,
    /// JSON file: {"messages": [...], "tools": [...], "add_generation_prompt": bool} (or - for stdin).
    #[arg(long)]
    input: PathBuf,
}

/// Roles every chat template is expected to render.
const STANDARD_ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

/// `launcher render`.
pub fn render(a: RenderArgs) -> CliResult {
    let file = a.input.display();
    let text = read_document(&a.input, MAX_DOCUMENT_BYTES, "render")?;
    let req = parse_json(&text).usage(&file)?;
    let messages = req
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| refuse(format!("{file}: field \"messages\": expected an array")))?;
    for (i, m) in messages.iter().enumerate() {
        if m.get("role").and_then(Value::as_str).is_none() {
            return Err(refuse(format!("{file}: field \"messages[{i}].role\": expected a string")));
        }
    }
    let tools = match req.get("tools") {
        None | Some(Value::Null) => None,
        Some(Value::Array(t)) => Some(t.as_slice()),
        Some(_) => return Err(refuse(format!("{file}: field \"tools\": expected an array"))),
    };
    let add = req.get("add_generation_prompt").and_then(Value::as_bool).unwrap_or(false);
    let tok = rlmesh_model::Tokenizer::load(&a.model).usage("loading the tokenizer")?;
    for (i, m) in messages.iter().enumerate() {
        let role = m["role"].as_str().unwrap_or_default();
        if !STANDARD_ROLES.contains(&role) && template_drops(&tok, m) {
            return Err(refuse(format!(
                "{file}: field \"messages[{i}].role\": \"{role}\" is a role this model's chat template does not render (the message would be dropped); expected one of {}",
                STANDARD_ROLES.join(", ")
            )));
        }
    }
    let (text, ids) = tok.render_ids(messages, tools, add).usage(format!("{file}: rendering the chat template"))?;
    println!("{}", json!({"text": text, "token_ids": ids}));
    Ok(())
}

/// Whether the chat template renders a conversation the same with `message`
/// after a user turn as without it: the message would silently disappear.
fn template_drops(tok: &rlmesh_model::Tokenizer, message: &Value) -> bool {
    let user = json!({"role": "user", "content": "."});
    match (tok.render(std::slice::from_ref(&user), None, false), tok.render(&[user, message.clone()], None, false)) {
        (Ok(without), Ok(with)) => without == with,
        _ => false,
    }
}

/// Arguments of `launcher advantages`.
#[derive(Args)]
pub struct AdvantagesArgs {
    /// JSON file with estimator, params and groups (or - for stdin; at most 16 MiB).
    #[arg(long)]
    input: PathBuf,
}

/// `launcher advantages`.
pub fn advantages(a: AdvantagesArgs) -> CliResult {
    let text = read_document(&a.input, MAX_DOCUMENT_BYTES, "advantages")?;
    let out = parse_json(&text).and_then(|v| rlmesh_core::offline::advantages_json(&v)).usage(a.input.display())?;
    println!("{out}");
    Ok(())
}

/// Arguments of `launcher reward`.
#[derive(Args)]
pub struct RewardArgs {
    /// JSONL file, one scoring request per line (or - for stdin; lines of at most 4 MiB).
    #[arg(long)]
    input: PathBuf,
    /// Score as this recipe's run does: its rubric under `[reward_weights]`, its
    /// `[[reward_function]]` verifiers and its tool servers' grades, combined as
    /// live. Lines are then `{"task", "trajectory"}`, as `--record-batches`
    /// writes them to `RUN_DIR/scored.jsonl`.
    #[arg(long)]
    recipe: Option<PathBuf>,
}

/// `launcher reward --recipe`: one line `{"task", "trajectory"}` scored by the
/// recipe's reward functions, `{"total", "functions", "components"}` out
/// (`"total": null` with `"unscorable"` when a function could not score it).
fn reward_with_recipe(input: &Path, file: &Path) -> CliResult {
    use rlmesh_actors::controller::recipe::Recipe;
    use rlmesh_actors::reward::{RewardSpec, Scorer};
    let recipe = Recipe::load(file).map_err(|e| CliError::usage(anyhow::anyhow!(e)))?;
    let spec = RewardSpec::of(&recipe, Path::new(&recipe.model.path));
    let scorer = Scorer::new(&spec).map_err(|e| CliError::usage(anyhow::anyhow!("{}: the reward functions: {e}", file.display())))?;
    let mut out = std::io::stdout().lock();
    for_each_line(input, |number, line| {
        let at = || format!("{}:{number}", input.display());
        let v = parse_json(line).usage(at())?;
        let field = |name: &str| v.get(name).cloned().ok_or_else(|| CliError::usage(anyhow::anyhow!("{}: field \"{name}\" is missing (lines are {{\"task\", \"trajectory\"}}, as RUN_DIR/scored.jsonl holds them)", at())));
        let task: rlmesh_core::Task = serde_json::from_value(field("task")?).usage(format!("{}: field \"task\"", at()))?;
        let trajectory: rlmesh_core::Trajectory = serde_json::from_value(field("trajectory")?).usage(format!("{}: field \"trajectory\"", at()))?;
        let scored = scorer.score(rlmesh_core::Group { group_id: 0, task, trajectories: vec![trajectory], failed: None, earlier_segments: vec![] });
        let s = &scored.scores[0];
        let functions: serde_json::Map<String, Value> = s.functions.iter().map(|(n, v)| (n.clone(), json!(v))).collect();
        let components: serde_json::Map<String, Value> = s.components.iter().map(|(n, v)| (n.clone(), json!(v))).collect();
        let mut row = json!({"total": s.total.is_finite().then_some(s.total), "functions": functions, "components": components});
        if let Some(why) = &scored.unscorable {
            row["unscorable"] = json!(why);
        }
        writeln!(out, "{row}")?;
        Ok(())
    })
}

/// `launcher reward`.
pub fn reward(a: RewardArgs) -> CliResult {
    if let Some(recipe) = &a.recipe {
        return reward_with_recipe(&a.input, recipe);
    }
    let mut out = std::io::stdout().lock();
    for_each_line(&a.input, |number, line| {
        let v = rlmesh_core::offline::reward_json_line(line).usage(format!("{}:{number}", a.input.display()))?;
        writeln!(out, "{v}")?;
        Ok(())
    })
}
