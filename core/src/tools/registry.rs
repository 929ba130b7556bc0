//! The registry of tools and environments a run offers (built from config),
//! and the per-rollout [`ToolSession`] the rollout loop drives.
//!
//! ```
//! use rlmesh_core::tools::{ExecLimits, ToolRegistry};
//! use rlmesh_core::Task;
//! let registry = ToolRegistry::from_names(&["calculator"], ExecLimits::default()).unwrap();
//! let task = Task { id: "t".into(), prompt: "Use the calculator to compute 17 * 24.".into(), requires_tool: true,
//!     allowed_tools: vec!["calculator".into()], gold_tool_calls: vec![], expected_answer: Some("408".into()),
//!     environment: None, env_state: None, ..Default::default() };
//! let mut session = registry.session(&task).unwrap();
//! let turn = session.parse("<tool_call>\n{\"name\": \"calculator\", \"arguments\": {\"operation\": \"multiply\", \"a\": 17, \"b\": 24}}\n</tool_call>");
//! let steps = session.execute(0, &turn.calls);
//! assert_eq!(steps[0].result, "408");
//! ```
use super::environment::{bind, Bound, Environment, Method};
use super::execute::{execute_calls, run_limited, ExecLimits};
use super::formats::ToolFormat;
use super::parse::{ParsedCall, ParsedTurn};
use super::tool::{Tool, ToolSpec};
use super::{calculator, inventory};
use crate::task::Task;
use crate::trajectory::Step;
use serde_json::Value;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

/// Names of the built-in stateless tools.
pub const BUILTIN_TOOLS: &[&str] = &[calculator::NAME];
/// Names of the built-in environments.
pub const BUILTIN_ENVIRONMENTS: &[&str] = &[inventory::NAME];

/// Errors building a registry or opening a session on a task.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum RegistryError {
    /// A configured name is neither a built-in tool nor a built-in environment.
    #[error("unknown tool or environment \"{0}\" (built-in tools: {tools}; built-in environments: {envs})", tools = BUILTIN_TOOLS.join(", "), envs = BUILTIN_ENVIRONMENTS.join(", "))]
    UnknownName(String),
    /// Two tools (or environments) share a name.
    #[error("\"{0}\" is registered twice")]
    Duplicate(String),
    /// The task names an environment the registry does not have.
    #[error("task \"{task}\": environment \"{environment}\" is not configured (configured: {configured})")]
    UnknownEnvironment {
        /// Task id.
        task: String,
        /// The environment it names.
        environment: String,
        /// Configured environments, comma-separated.
        configured: String,
    },
    /// The task allows a tool the session would not offer.
    #[error("task \"{task}\": allowed tool \"{tool}\" is not available (available: {available})")]
    UnavailableTool {
        /// Task id.
        task: String,
        /// The tool.
        tool: String,
        /// The tools its session offers, comma-separated.
        available: String,
    },
    /// The environment rejects the task (e.g. its `env_state`).
    #[error("task \"{task}\": {reason}")]
    InvalidTask {
        /// Task id.
        task: String,
        /// What is wrong.
        reason: String,
    },
    /// The environment's `reset` panicked or timed out.
    #[error("task \"{task}\": reset of environment \"{environment}\" failed: {reason}")]
    Reset {
        /// Task id.
        task: String,
        /// Environment name.
        environment: String,
        /// The panic message or the time-out.
        reason: String,
    },
}

struct EnvEntry {
    name: String,
    specs: Vec<ToolSpec>,
    check: fn(&Task) -> Result<(), String>,
    open: Arc<dyn Fn() -> Bound + Send + Sync>,
}

/// The tools and environments of a run, with the execution limits.
pub struct ToolRegistry {
    limits: ExecLimits,
    format: ToolFormat,
    tools: Vec<Tool>,
    environments: Vec<EnvEntry>,
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new(limits: ExecLimits) -> Self {
        ToolRegistry { limits, format: ToolFormat::default(), tools: Vec::new(), environments: Vec::new() }
    }

    /// The same registry, parsing calls in `format` (default: hermes).
    pub fn with_format(mut self, format: ToolFormat) -> Self {
        self.format = format;
        self
    }

    /// How the model writes its calls.
    pub fn format(&self) -> ToolFormat {
        self.format
    }

    /// A registry of built-in tools and environments named in config
    /// (e.g. `["calculator", "inventory"]`).
    pub fn from_names<S: AsRef<str>>(names: &[S], limits: ExecLimits) -> Result<Self, RegistryError> {
        let mut r = ToolRegistry::new(limits);
        for name in names.iter().map(AsRef::as_ref) {
            match name {
                calculator::NAME => r.add_tool(calculator::tool())?,
                inventory::NAME => r.add_environment(inventory::NAME, inventory::Inventory::default)?,
                other => return Err(RegistryError::UnknownName(other.to_string())),
            }
        }
        Ok(r)
    }

    /// Adds a stateless tool.
    pub fn add_tool(&mut self, tool: Tool) -> Result<(), RegistryError> {
        self.check_new_names(std::iter::once(tool.name()))?;
        self.tools.push(tool);
        Ok(())
    }

    /// Adds an environment; `factory` makes a fresh instance for every rollout.
    pub fn add_environment<E, F>(&mut self, name: &str, factory: F) -> Result<(), RegistryError>
    where
        E: Environment,
        F: Fn() -> E + Send + Sync + 'static,
    {
        if self.environments.iter().any(|e| e.name == name) {
            return Err(RegistryError::Duplicate(name.to_string()));
        }
        let methods: Arc<Vec<Method<E>>> = Arc::new(E::methods());
        let specs: Vec<ToolSpec> = methods.iter().map(|m| m.spec.clone()).collect();
        self.check_new_names(specs.iter().map(|s| s.name.as_str()))?;
        let open = Arc::new(move || bind(factory(), &methods));
        self.environments.push(EnvEntry { name: name.to_string(), specs, check: E::check_task, open });
        Ok(())
    }

    fn check_new_names<'a>(&self, names: impl Iterator<Item = &'a str>) -> Result<(), RegistryError> {
        let mut taken: HashSet<&str> = self.tools.iter().map(Tool::name).collect();
        taken.extend(self.environments.iter().flat_map(|e| e.specs.iter().map(|s| s.name.as_str())));
        for n in names {
            if !taken.insert(n) {
                return Err(RegistryError::Duplicate(n.to_string()));
            }
        }
        Ok(())
    }

    /// The execution limits.
    pub fn limits(&self) -> &ExecLimits {
        &self.limits
    }

    fn environment(&self, task: &Task) -> Result<Option<&EnvEntry>, RegistryError> {
        let Some(name) = &task.environment else { return Ok(None) };
        match self.environments.iter().find(|e| &e.name == name) {
            Some(e) => Ok(Some(e)),
            None => Err(RegistryError::UnknownEnvironment {
                task: task.id.clone(),
                environment: name.clone(),
                configured: self.environments.iter().map(|e| e.name.as_str()).collect::<Vec<_>>().join(", "),
            }),
        }
    }

    /// The specs a session on `task` offers: the stateless tools, then the
    /// task's environment's methods.
    pub fn specs_for(&self, task: &Task) -> Result<Vec<ToolSpec>, RegistryError> {
        let env = self.environment(task)?;
        let mut specs: Vec<ToolSpec> = self.tools.iter().map(|t| (*t.spec).clone()).collect();
        specs.extend(env.into_iter().flat_map(|e| e.specs.iter().cloned()));
        Ok(specs)
    }

    /// Checks that a task can run here: its environment exists and accepts
    /// it, and every allowed tool is offered.
    pub fn check_task(&self, task: &Task) -> Result<(), RegistryError> {
        if let Some(env) = self.environment(task)? {
            (env.check)(task).map_err(|reason| RegistryError::InvalidTask { task: task.id.clone(), reason })?;
        }
        let specs = self.specs_for(task)?;
        for tool in &task.allowed_tools {
            if !specs.iter().any(|s| &s.name == tool) {
                let available = specs.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ");
                return Err(RegistryError::UnavailableTool { task: task.id.clone(), tool: tool.clone(), available });
            }
        }
        Ok(())
    }

    /// Opens a rollout on `task`: a fresh environment instance (reset on the
    /// task, with the time limit) and the tools.
    pub fn session(&self, task: &Task) -> Result<ToolSession, RegistryError> {
        let mut session = ToolSession {
            tools: self.tools.clone(),
            limits: self.limits,
            format: self.format,
            seen: HashSet::new(),
            observation: None,
            reward: None,
        };
        if let Some(env) = self.environment(task)? {
            let bound = (env.open)();
            let (reset, t) = (bound.reset, task.clone());
            let timeout = Duration::from_millis(self.limits.timeout_ms);
            session.observation = run_limited(&env.name, timeout, move || reset(t)).map_err(|e| RegistryError::Reset {
                task: task.id.clone(),
                environment: env.name.clone(),
                reason: e.to_string(),
            })?;
            session.tools.extend(bound.tools);
            session.reward = Some(bound.reward);
        }
        Ok(session)
    }
}

/// The tools of one rollout: parses turns, executes calls with the limits,
/// remembers earlier calls (repeats), and grades the environment at the end.
pub struct ToolSession {
    tools: Vec<Tool>,
    limits: ExecLimits,
    format: ToolFormat,
    seen: HashSet<(String, String)>,
    observation: Option<String>,
    reward: Option<Arc<dyn Fn() -> Option<f64> + Send + Sync>>,
}

impl ToolSession {
    /// The environment's `reset` observation, to append to the prompt.
    pub fn observation(&self) -> Option<&str> {
        self.observation.as_deref()
    }
    /// The tools this rollout offers.
    pub fn tools(&self) -> &[Tool] {
        &self.tools
    }
    /// The tool schemas for the chat template's `tools=` argument.
    pub fn schemas(&self) -> Vec<Value> {
        self.tools.iter().map(|t| t.spec.json_schema()).collect()
    }
    /// Parses one assistant turn, in the registry's tool-call format, against this rollout's tools.
    pub fn parse(&self, text: &str) -> ParsedTurn {
        self.format.parse(text, &self.tools)
    }
    /// Executes the calls of assistant turn `turn` in order: one [`Step`] per
    /// call; each step's `result` is the content of its tool message.
    pub fn execute(&mut self, turn: usize, calls: &[ParsedCall]) -> Vec<Step> {
        execute_calls(&self.tools, &self.limits, &mut self.seen, turn, calls)
    }
    /// The environment's `get_reward` (with the time limit); `None` without an
    /// environment, when it gives no grade, or when it panics or hangs.
    pub fn reward(&self) -> Option<f64> {
        let f = self.reward.clone()?;
        run_limited("get_reward", Duration::from_millis(self.limits.timeout_ms), move || f()).ok().flatten()
    }
}
