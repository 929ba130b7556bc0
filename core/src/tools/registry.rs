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
use super::environment::{EnvSource, Environment};
use super::execute::{execute_calls, ExecLimits};
use super::formats::ToolFormat;
use super::parse::{ParsedCall, ParsedTurn};
use super::schema::check_schema;
use super::source::{Grader, ToolSource};
use super::tool::{Tool, ToolSpec};
use super::{calculator, inventory};
use crate::task::Task;
use crate::trajectory::Step;
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

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
    /// The environment's (or tool source's) `reset` failed: it panicked, timed out, or its server failed.
    #[error("task \"{task}\": reset of environment \"{environment}\" failed: {reason}")]
    Reset {
        /// Task id.
        task: String,
        /// Environment name.
        environment: String,
        /// The panic message, the time-out, or the server's error.
        reason: String,
    },
    /// A tool source cannot be added (a name clash, a bad schema) or can no
    /// longer serve (see [`ToolRegistry::health`]).
    #[error("tool source \"{name}\": {reason}")]
    Source {
        /// The source's name.
        name: String,
        /// What is wrong.
        reason: String,
    },
}

/// A registered [`ToolSource`] with its specs (read once).
struct SourceEntry {
    source: Arc<dyn ToolSource>,
    specs: Vec<ToolSpec>,
    /// Opened on every rollout (an added source); else only on tasks that
    /// name it as their `environment` (a built-in environment).
    always: bool,
}

/// The tools and environments of a run, with the execution limits.
pub struct ToolRegistry {
    limits: ExecLimits,
    format: ToolFormat,
    tools: Vec<Tool>,
    sources: Vec<SourceEntry>,
}

impl ToolRegistry {
    /// An empty registry.
    pub fn new(limits: ExecLimits) -> Self {
        ToolRegistry { limits, format: ToolFormat::default(), tools: Vec::new(), sources: Vec::new() }
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
        if let Some(n) = self.taken(std::iter::once(tool.name()), None).next() {
            return Err(RegistryError::Duplicate(n.0.to_string()));
        }
        self.tools.push(tool);
        Ok(())
    }

    /// Adds an environment; `factory` makes a fresh instance for every rollout
    /// of a task that names it.
    pub fn add_environment<E, F>(&mut self, name: &str, factory: F) -> Result<(), RegistryError>
    where
        E: Environment,
        F: Fn() -> E + Send + Sync + 'static,
    {
        let source = EnvSource::new(name, factory);
        if self.sources.iter().any(|e| e.source.name() == name) {
            return Err(RegistryError::Duplicate(name.to_string()));
        }
        let specs = source.specs();
        if let Some(n) = self.taken(specs.iter().map(|s| s.name.as_str()), Some(name)).next() {
            return Err(RegistryError::Duplicate(n.0.to_string()));
        }
        self.sources.push(SourceEntry { source: Arc::new(source), specs, always: false });
        Ok(())
    }

    /// Adds a tool source opened on every rollout (a tool server). Its name
    /// and tool names must be new, and every tool's parameter schema usable
    /// ([`check_schema`]); the error names the source.
    pub fn add_source(&mut self, source: Arc<dyn ToolSource>) -> Result<(), RegistryError> {
        let name = source.name().to_string();
        let err = |reason: String| RegistryError::Source { name: name.clone(), reason };
        if self.sources.iter().any(|e| e.source.name() == name) {
            return Err(err("a tool source of this name is already registered".into()));
        }
        let specs = source.specs();
        if let Some((tool, owner)) = self.taken(specs.iter().map(|s| s.name.as_str()), Some(&name)).next() {
            let owner = match owner {
                Some(o) if o == name => "this source".to_string(),
                Some(o) => format!("\"{o}\""),
                None => "the built-in tools".to_string(),
            };
            return Err(err(format!("tool \"{tool}\" is also offered by {owner}")));
        }
        for spec in &specs {
            check_schema(&spec.parameters).map_err(|e| err(format!("tool \"{}\": bad parameter schema: {e}", spec.name)))?;
        }
        self.sources.push(SourceEntry { source, specs, always: true });
        Ok(())
    }

    /// Those of `names` (the tools `owner` brings; `None`: a stateless tool)
    /// already taken by a tool, a source, or an earlier name of the list,
    /// each with the source holding it (`None`: a stateless tool).
    fn taken<'a>(
        &'a self,
        names: impl Iterator<Item = &'a str>,
        owner: Option<&'a str>,
    ) -> impl Iterator<Item = (&'a str, Option<&'a str>)> {
        let mut owners: HashMap<&str, Option<&str>> = self.tools.iter().map(|t| (t.name(), None)).collect();
        for e in &self.sources {
            owners.extend(e.specs.iter().map(|s| (s.name.as_str(), Some(e.source.name()))));
        }
        names.filter_map(move |n| owners.insert(n, owner).map(|held| (n, held)))
    }

    /// The execution limits.
    pub fn limits(&self) -> &ExecLimits {
        &self.limits
    }

    /// `Err` naming the first source that can no longer serve (e.g. a tool
    /// server past its restart budget): the run should stop at a checkpoint.
    pub fn health(&self) -> Result<(), RegistryError> {
        for e in &self.sources {
            e.source.health().map_err(|reason| RegistryError::Source { name: e.source.name().to_string(), reason })?;
        }
        Ok(())
    }

    /// The sources a rollout of `task` opens, in registration order: every
    /// added source, and the environment the task names.
    fn sources_for(&self, task: &Task) -> Result<Vec<&SourceEntry>, RegistryError> {
        if let Some(name) = &task.environment {
            if !self.sources.iter().any(|e| e.source.name() == name) {
                return Err(RegistryError::UnknownEnvironment {
                    task: task.id.clone(),
                    environment: name.clone(),
                    configured: self.sources.iter().map(|e| e.source.name()).collect::<Vec<_>>().join(", "),
                });
            }
        }
        Ok(self.sources.iter().filter(|e| e.always || task.environment.as_deref() == Some(e.source.name())).collect())
    }

    /// Whether opening a session on some task starts a process (see
    /// [`ToolSource::starts_a_process_per_session`]).
    pub fn sessions_start_processes(&self) -> bool {
        self.sources.iter().any(|e| e.source.starts_a_process_per_session())
    }

    /// The specs a session on `task` offers: the stateless tools, then the
    /// tools of the sources it opens.
    pub fn specs_for(&self, task: &Task) -> Result<Vec<ToolSpec>, RegistryError> {
        let mut specs: Vec<ToolSpec> = self.tools.iter().map(|t| (*t.spec).clone()).collect();
        specs.extend(self.sources_for(task)?.into_iter().flat_map(|e| e.specs.iter().cloned()));
        Ok(specs)
    }

    /// Checks that a task can run here: its environment exists, every source
    /// it opens accepts it, and every allowed tool is offered.
    pub fn check_task(&self, task: &Task) -> Result<(), RegistryError> {
        for e in self.sources_for(task)? {
            e.source.check_task(task).map_err(|reason| RegistryError::InvalidTask { task: task.id.clone(), reason })?;
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

    /// Opens a rollout on `task`: the stateless tools, and a fresh session
    /// of every source it opens (reset on the task); their observations join
    /// in order. A source that cannot open fails the whole session (those
    /// already opened are closed).
    pub fn session(&self, task: &Task) -> Result<ToolSession, RegistryError> {
        let mut session = ToolSession {
            tools: self.tools.clone(),
            limits: self.limits,
            format: self.format,
            seen: HashSet::new(),
            observation: None,
            graders: Vec::new(),
        };
        let mut observations = Vec::new();
        for e in self.sources_for(task)? {
            let opened = e.source.open(task, &self.limits).map_err(|reason| RegistryError::Reset {
                task: task.id.clone(),
                environment: e.source.name().to_string(),
                reason,
            })?;
            session.tools.extend(opened.tools);
            observations.extend(opened.observation);
            if let Some(g) = opened.grader {
                session.graders.push((e.source.name().to_string(), g));
            }
        }
        session.observation = (!observations.is_empty()).then(|| observations.join("\n\n"));
        Ok(session)
    }
}

/// The tools of one rollout: parses turns, executes calls with the limits,
/// remembers earlier calls (repeats), and grades the sources at the end.
pub struct ToolSession {
    tools: Vec<Tool>,
    limits: ExecLimits,
    format: ToolFormat,
    seen: HashSet<(String, String)>,
    observation: Option<String>,
    graders: Vec<(String, Grader)>,
}

impl ToolSession {
    /// The sources' `reset` observations, to append to the prompt.
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
    /// Every grading source's grade of the rollout, by source name, in order:
    /// `Ok(None)` when it gives none, `Err` when it could not grade (it
    /// panicked, hung, or its server failed), which makes the rollout
    /// unscorable rather than 0.
    pub fn grades(&self) -> Vec<(String, Result<Option<f64>, String>)> {
        self.graders.iter().map(|(name, g)| (name.clone(), g())).collect()
    }
    /// The first grading source's grade (the task's environment's `get_reward`);
    /// `None` without one, when it gives no grade, or when it could not grade.
    pub fn reward(&self) -> Option<f64> {
        self.graders.first().and_then(|(_, g)| g().ok().flatten())
    }
}
