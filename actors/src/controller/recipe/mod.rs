//! Recipes (`configs/*.toml`): *what* a run trains.
//!
//! A recipe names the model, the task mix and tools, the reward, the
//! advantage estimator, the SFT warm-up and the RL loop's hyper-parameters:
//!
//! ```toml
//! reward = "process"            # "process" | "final_only" | "hierr"
//! tools = ["calculator"]
//!
//! [model]
//! path = "tiny"                 # "tiny": create a tiny model and tokenizer; else an HF directory
//!
//! [tasks]
//! size = 1024                   # training tasks
//! held_out = 200                # held-out tasks (≥ 100), same mix, never trained on
//! tool_fraction = 0.5
//! multi_step_fraction = 0.0
//! seed = 0
//!
//! [estimator]
//! name = "grpo"                 # "grpo" | "dr_grpo" | "rloo" | "slca" | "steptool" | "steptool_critic_free"
//!
//! [sft]
//! steps = 60
//! lr = 1e-3
//!
//! [rl]
//! steps = 40
//! lr = 1e-4
//! group_size = 8
//! groups_per_step = 8
//! mode = "one_step_off"         # "sync" | "one_step_off" | "async" (+ max_staleness)
//! dynamic_sampling = false      # true: drop groups whose advantages are all zero, draw others (max_draws)
//! ```
//!
//! Sizes have upper bounds, each with its reason ([`bounds`]).
//! Every field but `reward` and `tasks.size` has a default (`name`: the file's stem) (see each
//! field). Unknown fields are errors; [`Recipe::load`] names the file, line
//! and field of any problem.
//!
//! One file per table: [`model`], [`tasks`], [`tools`] (`[[tool_server]]`,
//! `[tool_limits]`), [`rewards`] (`[reward_weights]`, `[[reward_function]]`),
//! [`estimator`], [`sft`], [`learner`], [`rl`]; [`bounds`] holds the size
//! limits, each with its reason.
pub mod bounds;
mod checks;
pub mod estimator;
pub mod learner;
pub mod model;
pub mod rewards;
pub mod rl;
pub mod sft;
pub mod tasks;
pub mod tools;

use super::source::{self, ConfigError, Invalid};
use super::staleness::Mode;
pub use estimator::{Estimator, EstimatorKind, ScaleRewardsName};
pub use learner::LearnerSpec;
pub use model::ModelSpec;
pub use rl::{ModeName, Rl, DEFAULT_ASYNC_STALENESS, DEFAULT_MAX_DRAWS};
pub use sft::{Sft, SftMix};
pub use rewards::RewardFunctionSpec;
pub use tasks::TaskMix;
pub use tools::{ServerSpec, ToolLimits};
use rlmesh_core::advantage::grpo::ScaleRewards;
use rlmesh_core::dataset::{self, Columns, DatasetError, MixConfig, TaskFiles};
use rlmesh_core::tools::{calculator, inventory, registry};
use rlmesh_core::Task;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// What a run trains.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Recipe {
    /// The recipe's name, recorded in `summary.json` (default: the file's stem).
    #[serde(default)]
    pub name: String,
    /// Seed of model creation, SFT data and sampling (the task mix has its own).
    #[serde(default)]
    pub seed: u64,
    /// The reward that scores rollouts.
    pub reward: RewardKind,
    /// The judge of the final replies (SLCA's summary reward, HierR's total): `"rule"`
    /// (default: states the result, concise, grounded) or `"model"` (a frozen model).
    #[serde(default)]
    pub judge: JudgeName,
    /// The model judge's HF directory (default: SmolLM2-135M from the set-up).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge_model: Option<String>,
    /// Tools and environments the agent may call (default `["calculator"]`).
    #[serde(default = "default_tools")]
    pub tools: Vec<String>,
    /// The policy model.
    #[serde(default)]
    pub model: ModelSpec,
    /// The training and held-out tasks.
    pub tasks: TaskMix,
    /// MCP servers whose tools the agent may call (`[[tool_server]]`).
    #[serde(default, rename = "tool_server", skip_serializing_if = "Vec::is_empty")]
    pub tool_servers: Vec<ServerSpec>,
    /// What one tool call may take.
    #[serde(default)]
    pub tool_limits: ToolLimits,
    /// Weights of the rubric's components and of the reward functions (`[reward_weights]`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub reward_weights: BTreeMap<String, f64>,
    /// External verifiers added to the reward (`[[reward_function]]`).
    #[serde(default, rename = "reward_function", skip_serializing_if = "Vec::is_empty")]
    pub reward_functions: Vec<RewardFunctionSpec>,
    /// The advantage estimator and its loss parameters.
    #[serde(default)]
    pub estimator: Estimator,
    /// Supervised warm-up on noisy expert trajectories.
    #[serde(default)]
    pub sft: Sft,
    /// How the learner lays out and computes its batches.
    #[serde(default)]
    pub learner: LearnerSpec,
    /// The RL loop.
    #[serde(default)]
    pub rl: Rl,
    /// An agent program trained as it is (`[agent]`): each rollout runs it
    /// against the policy's OpenAI-compatible endpoint.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<crate::rollout::agent::AgentSpec>,
}

/// The reward that scores rollouts.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardKind {
    /// The seed's process-aware reward (tool choice, arguments, execution, answer, repeats).
    Process,
    /// Only format and final answer: the reward-hacking baseline.
    FinalOnly,
    /// SLCA-GRPO's HierR total: process reward of the calls plus the judged
    /// summary, −0.5 for a tool task answered without a call.
    Hierr,
}

/// The judge of the final replies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JudgeName {
    /// The rule rubric.
    #[default]
    Rule,
    /// A frozen model on the reward actor's own thread.
    Model,
}

fn default_tools() -> Vec<String> {
    vec![calculator::NAME.to_string()]
}

/// `~/…` and `${VAR}` in a path from the environment (`${RLMESH_CACHE}`
/// defaults to `~/.cache/rlmesh`, where the set-up puts its models), so a
/// recipe can name a model on any machine.
pub fn expand_path(p: &str) -> String {
    let home = std::env::var("HOME").unwrap_or_default();
    let var = |name: &str| match (std::env::var(name), name) {
        (Ok(v), _) if !v.is_empty() => v,
        (_, "RLMESH_CACHE") => format!("{home}/.cache/rlmesh"),
        _ => String::new(),
    };
    let mut out = match p.strip_prefix("~/") {
        Some(rest) => format!("{home}/{rest}"),
        None => String::new(),
    };
    let mut rest = if out.is_empty() { p } else { "" };
    while let Some(at) = rest.find("${") {
        let Some(end) = rest[at..].find('}') else { break };
        out.push_str(&rest[..at]);
        out.push_str(&var(&rest[at + 2..at + end]));
        rest = &rest[at + end + 1..];
    }
    out.push_str(rest);
    out
}

impl Recipe {
    /// Reads, parses and validates a recipe file; errors name the file, line and field.
    pub fn load(path: &Path) -> Result<Recipe, ConfigError> {
        source::load(path, Recipe::validate).map(|r| r.named_after(path))
    }

    /// Parses and validates recipe text (named `file` in errors; an unnamed recipe takes its stem).
    pub fn parse(file: &str, text: &str) -> Result<Recipe, ConfigError> {
        source::parse(file, text, Recipe::validate).map(|r| r.named_after(Path::new(file)))
    }

    /// Names the recipe after its file (unless named) and makes the files it names
    /// relative to the recipe's own directory absolute, so every process finds them.
    fn named_after(mut self, file: &Path) -> Recipe {
        if self.name.is_empty() {
            self.name = file.file_stem().map_or_else(String::new, |s| s.to_string_lossy().into_owned());
        }
        let base = file.parent().map(|p| if p.as_os_str().is_empty() { Path::new(".") } else { p }).and_then(|p| p.canonicalize().ok()).unwrap_or_default();
        let resolve = |p: &mut String| {
            let path = Path::new(p.as_str());
            if path.is_relative() && !base.as_os_str().is_empty() {
                *p = base.join(path).to_string_lossy().into_owned();
            }
        };
        self.model.path = expand_path(&self.model.path);
        if let Some(t) = self.model.chat_template.as_mut() {
            resolve(t);
        }
        for f in [self.tasks.file.as_mut(), self.tasks.held_out_file.as_mut(), self.sft.file.as_mut()].into_iter().flatten() {
            resolve(f);
        }
        // Programs run in the recipe's directory unless told otherwise, so `["python3", "tools.py"]` works.
        let dir = base.to_string_lossy().into_owned();
        for s in self.tool_servers.iter_mut().filter(|s| s.command.is_some() && s.cwd.is_none()) {
            s.cwd = Some(base.clone());
        }
        if let Some(a) = self.agent.as_mut() {
            a.cwd = Some(match a.cwd.take() {
                Some(c) if Path::new(&c).is_relative() => base.join(c).to_string_lossy().into_owned(),
                Some(c) => c,
                None => dir.clone(),
            });
        }
        for v in self.reward_functions.iter_mut().filter(|v| v.command.is_some()) {
            v.cwd = Some(match v.cwd.take() {
                Some(c) if Path::new(&c).is_relative() => base.join(c).to_string_lossy().into_owned(),
                Some(c) => c,
                None => dir.clone(),
            });
        }
        self
    }

    /// Whether the model is created (`model.path = "tiny"`) rather than loaded.
    pub fn tiny_model(&self) -> bool {
        self.model.path == "tiny"
    }

    /// The tiny model's shape (width, layers and heads from the recipe; MLP 3× wide).
    pub fn tiny_spec(&self) -> super::init::TinySpec {
        let h = self.model.hidden;
        super::init::TinySpec { hidden: h, layers: self.model.layers, heads: self.model.heads, kv_heads: self.model.kv_heads, intermediate: 3 * h }
    }

    /// The staleness mode of the RL loop.
    pub fn mode(&self) -> Mode {
        match self.rl.mode {
            ModeName::Sync => Mode::Sync,
            ModeName::OneStepOff => Mode::OneStepOff,
            ModeName::Async => Mode::Async { max_staleness: self.rl.max_staleness.unwrap_or(DEFAULT_ASYNC_STALENESS) },
        }
    }

    /// GRPO's σ choice for this estimator (`None` for those that do not scale a scalar reward).
    pub fn scale_rewards(&self) -> Option<ScaleRewards> {
        let name = match self.estimator.name {
            EstimatorKind::Grpo => self.estimator.scale_rewards.unwrap_or(ScaleRewardsName::Group),
            EstimatorKind::DrGrpo => ScaleRewardsName::None,
            _ => return None,
        };
        Some(match name {
            ScaleRewardsName::Group => ScaleRewards::Group,
            ScaleRewardsName::Batch => ScaleRewards::Batch,
            ScaleRewardsName::None => ScaleRewards::None,
        })
    }

    /// The tasks: `(training tasks, held-out tasks)`, disjoint; from the
    /// file (`held_out` rows split off with the recipe's seed) or generated.
    pub fn tasks(&self) -> Result<(Vec<Task>, Vec<Task>), DatasetError> {
        let t = &self.tasks;
        if let Some(file) = &t.file {
            let mut spec = TaskFiles::new(file);
            spec.columns = Columns::new(t.columns.clone())?;
            spec.held_out_file = t.held_out_file.as_ref().map(Into::into);
            spec.held_out = t.held_out.unwrap_or(0);
            let mut split = dataset::load_tasks(&spec, self.seed)?;
            if t.held_out.is_none() && t.held_out_file.is_none() {
                // Default: 200 rows or a fifth of the file, whichever is fewer.
                let n = (split.train.len() / 5).min(tasks::DEFAULT_HELD_OUT);
                let (train, held) = dataset::task_file::split_off(split.train, n, self.seed);
                split = dataset::TaskSplit { train, held_out: held };
            }
            if let Some(n) = t.size {
                split.train.truncate(n);
            }
            if split.held_out.is_empty() {
                return Err(DatasetError::Spec(format!("{file}: no held-out tasks (the run evaluates on them): set [tasks] held_out = N rows, or held_out_file")));
            }
            if split.train.is_empty() {
                return Err(DatasetError::File { file: file.clone(), message: "no training tasks are left after the held-out split".into() });
            }
            return Ok((split.train, split.held_out));
        }
        let cfg = MixConfig {
            size: t.size() + t.held_out_count(),
            tool_fraction: t.tool_fraction,
            multi_step_fraction: t.multi_step_fraction,
            inventory: t.inventory,
            three_step_fraction: t.three_step_fraction,
            seed: t.seed,
            drill_words: false,
        };
        let mut train = dataset::generate(&cfg)?;
        let held_out = train.split_off(t.size());
        Ok((train, held_out))
    }

    /// The warm-up's task pool (`sft.tasks` of the same mix, another seed),
    /// without any task of `held_out`.
    pub fn sft_tasks(&self, held_out: &[Task]) -> Result<Vec<Task>, DatasetError> {
        let t = &self.tasks;
        let cfg = MixConfig {
            size: self.sft.tasks,
            tool_fraction: t.tool_fraction,
            multi_step_fraction: t.multi_step_fraction,
            inventory: t.inventory,
            three_step_fraction: t.three_step_fraction,
            seed: t.seed ^ 0x5f7_5eed,
            drill_words: self.sft.drill_words,
        };
        let held: std::collections::HashSet<String> = held_out.iter().map(dataset::task_key).collect();
        Ok(dataset::generate(&cfg)?.into_iter().filter(|task| !held.contains(&dataset::task_key(task))).collect())
    }

    /// Checks ranges and cross-field rules; the error names the offending field.
    pub fn validate(&self) -> Result<(), Invalid> {
        self.validate_tools()?;
        if self.judge_model.is_some() && self.judge != JudgeName::Model {
            return Err(Invalid::new("judge_model", "only a model judge (judge = \"model\") uses it; remove it"));
        }
        self.model.validate()?;
        self.tasks.validate()?;
        tools::validate_servers(&self.tool_servers, &self.tools)?;
        self.tool_limits.validate()?;
        rewards::validate(self.reward, &self.reward_weights, &self.tool_servers, self.agent.is_some(), &self.reward_functions)?;
        self.estimator.validate()?;
        self.sft.validate()?;
        if self.tasks.from_file() && self.sft.steps > 0 && self.sft.file.is_none() {
            return Err(Invalid::new("sft.file", "the expert warm-up writes conversations for generated tasks only: with [tasks] file, give the warm-up's conversations (sft.file = \"sft.jsonl\") or set sft.steps = 0"));
        }
        self.learner.validate()?;
        if let Some(a) = &self.agent {
            a.validate().map_err(|(field, why)| Invalid::new(format!("agent.{field}"), why))?;
        }
        self.rl.validate()
    }

    fn validate_tools(&self) -> Result<(), Invalid> {
        let known: Vec<&str> = registry::BUILTIN_TOOLS.iter().chain(registry::BUILTIN_ENVIRONMENTS).copied().collect();
        for (i, name) in self.tools.iter().enumerate() {
            if !known.contains(&name.as_str()) {
                return Err(Invalid::new(format!("tools[{i}]"), format!("unknown tool \"{name}\" (known: {})", known.join(", "))));
            }
            if self.tools[..i].contains(name) {
                return Err(Invalid::new(format!("tools[{i}]"), format!("\"{name}\" is listed twice")));
            }
        }
        let has = |n: &str| self.tools.iter().any(|t| t == n);
        if self.tasks.from_file() {
            // A file's tasks name the tools they allow; they are checked against
            // the built-in tools and the servers' once the servers are up.
            return Ok(());
        }
        if self.tasks.tool_fraction > 0.0 && !has(calculator::NAME) {
            return Err(Invalid::new("tools", "tool tasks (tasks.tool_fraction > 0) need \"calculator\""));
        }
        if self.tasks.inventory && !has(inventory::NAME) {
            return Err(Invalid::new("tasks.inventory", "inventory tasks need \"inventory\" in tools"));
        }
        Ok(())
    }
}
