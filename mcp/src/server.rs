//! A started tool server: its discovered tools, its sessions (one shared, or
//! one per rollout), restarts within its budget, and its place in the tool
//! registry as a [`ToolSource`].
use crate::connection::Connection;
use crate::error::McpError;
use crate::health::Health;
use crate::runtime::block_on;
use crate::spec::{ServerSpec, SessionMode};
use rlmesh_core::tools::tool::Handler;
use rlmesh_core::tools::{CallError, ExecLimits, Grader, SourceSession, Tool, ToolError, ToolRegistry, ToolSource, ToolSpec};
use rlmesh_core::Task;
use rmcp::model::JsonObject;
use serde_json::Value;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::Mutex;

/// A started MCP tool server. Cheap to share (`Arc`); the last handle (with
/// every session opened on it) ends its sessions and kills its children.
///
/// ```no_run
/// use rlmesh_mcp::{McpServer, ServerSpec};
/// let server = McpServer::start(ServerSpec::stdio("time", ["mcp-server-time"])).unwrap();
/// let session = server.session(None).unwrap();
/// let now = session.call("get_current_time", &serde_json::json!({"timezone": "Etc/UTC"})).unwrap();
/// ```
pub struct McpServer {
    inner: Arc<Inner>,
}

struct Inner {
    spec: ServerSpec,
    tools: Vec<ToolSpec>,
    health: Health,
    /// The one session of a shared server.
    shared: Option<Arc<Slot>>,
    /// Started connections waiting for a per-rollout session (`spec.prestart`).
    spares: std::sync::Mutex<Vec<Connection>>,
    /// Spares being started in the background.
    starting: AtomicUsize,
}

impl Inner {
    fn spares(&self) -> std::sync::MutexGuard<'_, Vec<Connection>> {
        self.spares.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A started spare whose server still runs.
    fn take_spare(&self) -> Option<Connection> {
        let mut spares = self.spares();
        std::iter::from_fn(|| spares.pop()).find(|c| !c.is_closed())
    }

    /// Starts spares in the background until `prestart` are ready or
    /// starting; not while the server is backing off or given up. A spare
    /// that fails to start counts against the budget.
    fn refill(self: &Arc<Self>) {
        while self.spares().len() + self.starting.load(Ordering::SeqCst) < self.spec.prestart {
            if self.health.admit(&self.spec.name).map_or(true, |wait| !wait.is_zero()) {
                return;
            }
            self.starting.fetch_add(1, Ordering::SeqCst);
            let (weak, spec) = (Arc::downgrade(self), self.spec.clone());
            crate::runtime::spawn(async move {
                let started = Connection::open(&spec).await;
                let Some(inner) = weak.upgrade() else { return };
                inner.starting.fetch_sub(1, Ordering::SeqCst);
                match started {
                    Ok(conn) => inner.spares().push(conn),
                    Err(e) => inner.health.failed(e.to_string()),
                }
            });
        }
    }
}

/// One MCP session of a server, restarted when it fails.
struct Slot {
    state: Mutex<SlotState>,
    /// A per-rollout session: replays its reset after a restart, and its state is then lost.
    per_rollout: bool,
    /// The reset tool's arguments (per-rollout sessions).
    reset: Option<JsonObject>,
    lost_state: AtomicBool,
}

enum SlotState {
    /// Not started yet.
    New,
    /// Running.
    Live(Arc<Connection>),
    /// Failed; the next call restarts it.
    Down,
}

impl Slot {
    fn new(per_rollout: bool, reset: Option<JsonObject>, state: SlotState) -> Self {
        Slot { state: Mutex::new(state), per_rollout, reset, lost_state: AtomicBool::new(false) }
    }

    /// The live connection; (re)starts it first when it is new, down, or its
    /// server exited since the last call (within the budget, after the back-off).
    async fn connection(&self, inner: &Inner) -> Result<Arc<Connection>, McpError> {
        let mut state = self.state.lock().await;
        let restart = match &*state {
            SlotState::Live(c) if !c.is_closed() => return Ok(c.clone()),
            SlotState::Live(c) => {
                let tail = c.stderr();
                let tail = if tail.is_empty() { String::new() } else { format!("; its stderr ends:\n{tail}") };
                inner.health.failed(format!("the server exited between calls{tail}"));
                true
            }
            SlotState::Down => true,
            SlotState::New => false,
        };
        *state = SlotState::Down;
        if restart && self.per_rollout {
            self.lost_state.store(true, Ordering::SeqCst);
        }
        tokio::time::sleep(inner.health.admit(&inner.spec.name)?).await;
        let conn = Arc::new(Connection::open(&inner.spec).await.inspect_err(|e| inner.health.failed(e.to_string()))?);
        if let (true, Some(tool), Some(args)) = (restart, &inner.spec.reset_tool, &self.reset) {
            let limit = inner.spec.timeout();
            match conn.call(tool, args.clone(), limit).await {
                Ok(_) | Err(McpError::Call { .. }) => {}
                Err(e) => {
                    inner.health.failed(e.to_string());
                    return Err(e);
                }
            }
        }
        *state = SlotState::Live(conn.clone());
        Ok(conn)
    }

    /// Calls `tool`; a timeout or a broken server takes the session down (its
    /// child killed) and counts against the budget.
    async fn call(&self, inner: &Inner, tool: &str, arguments: JsonObject) -> Result<String, McpError> {
        let conn = self.connection(inner).await?;
        match conn.call(tool, arguments, inner.spec.timeout()).await {
            r @ (Ok(_) | Err(McpError::Call { .. })) => {
                inner.health.succeeded();
                r
            }
            Err(e) => {
                let mut state = self.state.lock().await;
                // Count one failure per broken connection, however many calls saw it.
                if matches!(&*state, SlotState::Live(c) if Arc::ptr_eq(c, &conn)) {
                    conn.kill();
                    *state = SlotState::Down;
                    self.lost_state.fetch_or(self.per_rollout, Ordering::SeqCst);
                    inner.health.failed(e.to_string());
                }
                Err(e)
            }
        }
    }

    /// The reward tool's number; `Err` when the call fails or the rollout's
    /// state was lost to a restart.
    async fn reward(&self, inner: &Inner, tool: &str) -> Result<Option<f64>, McpError> {
        let lost = || McpError::StateLost { server: inner.spec.name.clone() };
        if self.lost_state.load(Ordering::SeqCst) {
            return Err(lost());
        }
        let text = self.call(inner, tool, JsonObject::new()).await?;
        if self.lost_state.load(Ordering::SeqCst) {
            return Err(lost());
        }
        parse_reward(&text).map_err(|reason| McpError::Call { server: inner.spec.name.clone(), tool: tool.to_string(), reason })
    }

    async fn pid(&self) -> Option<u32> {
        match &*self.state.lock().await {
            SlotState::Live(c) => c.pid(),
            _ => None,
        }
    }
}

/// A reward tool's result as a number: the text itself (`0.75`), a JSON
/// number, or a JSON object's `reward` or `score` field or its only numeric
/// field; `None` when it holds no number ("no grade"); `Err` for a non-finite one.
pub fn parse_reward(text: &str) -> Result<Option<f64>, String> {
    let text = text.trim();
    let number = match (text.parse::<f64>(), serde_json::from_str::<Value>(text)) {
        (Ok(x), _) => Some(x),
        (_, Ok(Value::Object(m))) => {
            let named = m.get("reward").or_else(|| m.get("score")).and_then(Value::as_f64);
            let numbers: Vec<f64> = m.values().filter_map(Value::as_f64).collect();
            named.or(if numbers.len() == 1 { Some(numbers[0]) } else { None })
        }
        _ => None,
    };
    match number {
        Some(x) if !x.is_finite() => Err(format!("the reward {text:?} is not a finite number")),
        x => Ok(x),
    }
}

/// One rollout's session of a server: calls, the reset observation, the reward.
pub struct McpSession {
    inner: Arc<Inner>,
    slot: Arc<Slot>,
    observation: Option<String>,
}

impl McpSession {
    /// Calls a tool with a JSON object of arguments (hidden tools included).
    pub fn call(&self, tool: &str, arguments: &Value) -> Result<String, McpError> {
        let Value::Object(arguments) = arguments.clone() else {
            let reason = "arguments must be a JSON object".to_string();
            return Err(McpError::Call { server: self.inner.spec.name.clone(), tool: tool.to_string(), reason });
        };
        let (inner, slot, tool) = (self.inner.clone(), self.slot.clone(), tool.to_string());
        block_on(async move { slot.call(&inner, &tool, arguments).await })
    }

    /// The reward tool's number (`None`: no reward tool, or it gave no number);
    /// `Err` when it failed, or when a restart lost this rollout's state.
    pub fn reward(&self) -> Result<Option<f64>, McpError> {
        let Some(tool) = self.inner.spec.reward_tool.clone() else { return Ok(None) };
        let (inner, slot) = (self.inner.clone(), self.slot.clone());
        block_on(async move { slot.reward(&inner, &tool).await })
    }

    /// What the reset tool said (trimmed; `None` when empty or without one).
    pub fn observation(&self) -> Option<&str> {
        self.observation.as_deref()
    }

    /// The process id of the session's child (a stdio server, while it runs).
    pub fn pid(&self) -> Option<u32> {
        let slot = self.slot.clone();
        block_on(async move { slot.pid().await })
    }

    /// The server's tools, bound to this session, for the model.
    fn tools(&self) -> Vec<Tool> {
        let to_call_error = |e: McpError| match e {
            McpError::TimedOut { tool, ms, .. } => CallError::TimedOut { tool, ms },
            other => CallError::Tool(ToolError(other.for_model())),
        };
        self.inner
            .tools
            .iter()
            .map(|spec| {
                let (inner, slot, name) = (self.inner.clone(), self.slot.clone(), spec.name.clone());
                let handler: Handler = Arc::new(move |args: &Value| {
                    let arguments = args.as_object().cloned().unwrap_or_default();
                    let (inner, slot, name) = (inner.clone(), slot.clone(), name.clone());
                    block_on(async move { slot.call(&inner, &name, arguments).await }).map_err(to_call_error)
                });
                Tool::from_handler(spec.clone(), handler)
            })
            .collect()
    }
}

impl std::fmt::Debug for McpServer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let tools: Vec<&str> = self.inner.tools.iter().map(|t| t.name.as_str()).collect();
        f.debug_struct("McpServer").field("spec", &self.inner.spec).field("tools", &tools).finish_non_exhaustive()
    }
}

impl std::fmt::Debug for McpSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpSession").field("server", &self.inner.spec.name).field("observation", &self.observation).finish_non_exhaustive()
    }
}

impl McpServer {
    /// Starts (or reaches) the server, initializes it and discovers its
    /// tools, within its start limit. A shared server keeps this first
    /// session; a per-rollout one ends it (each rollout starts its own).
    pub fn start(spec: ServerSpec) -> Result<McpServer, McpError> {
        block_on(McpServer::start_async(spec))
    }

    async fn start_async(spec: ServerSpec) -> Result<McpServer, McpError> {
        spec.validate().map_err(|reason| McpError::Spec { server: spec.name.clone(), reason })?;
        let conn = Connection::open(&spec).await?;
        let listed = conn.list_tools(spec.start_timeout()).await.map_err(|e| match e {
            McpError::Tools { server, reason } => {
                let stderr = conn.stderr();
                McpError::Start { server, reason, stderr }
            }
            e => e,
        })?;
        let tools = discover(&spec, listed)?;
        let (shared, spares) = match (spec.session, spec.prestart) {
            (SessionMode::Shared, _) => (Some(Arc::new(Slot::new(false, None, SlotState::Live(Arc::new(conn))))), vec![]),
            // The first session started is the first spare.
            (SessionMode::PerRollout, 1..) => (None, vec![conn]),
            (SessionMode::PerRollout, 0) => (None, vec![]),
        };
        let health = Health::new(spec.max_restarts);
        let spares = std::sync::Mutex::new(spares);
        let inner = Arc::new(Inner { spec, tools, health, shared, spares, starting: AtomicUsize::new(0) });
        inner.refill();
        Ok(McpServer { inner })
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.inner.spec.name
    }

    /// Its description.
    pub fn spec(&self) -> &ServerSpec {
        &self.inner.spec
    }

    /// The tools offered to the model (without the reset and reward tools), in the server's order.
    pub fn tools(&self) -> &[ToolSpec] {
        &self.inner.tools
    }

    /// `Err(`[`McpError::BudgetExhausted`]`)` once the server is given up: the
    /// run should stop at a checkpoint.
    pub fn health(&self) -> Result<(), McpError> {
        self.inner.health.check(&self.inner.spec.name)
    }

    /// Opens a rollout's session: a fresh one (per-rollout servers) or the
    /// shared one, then the reset tool with `env_state` as its arguments
    /// (`{}` when `None`); a reset that fails fails the open.
    pub fn session(&self, env_state: Option<&Value>) -> Result<McpSession, McpError> {
        let name = &self.inner.spec.name;
        let reset = match env_state {
            None => JsonObject::new(),
            Some(Value::Object(m)) => m.clone(),
            Some(other) => {
                let reason = format!("env_state must be a JSON object (the reset tool's arguments), got {other}");
                return Err(McpError::Spec { server: name.clone(), reason });
            }
        };
        let per_rollout = self.inner.spec.session == SessionMode::PerRollout;
        let slot = match &self.inner.shared {
            Some(s) => s.clone(),
            None => {
                let state = self.inner.take_spare().map_or(SlotState::New, |c| SlotState::Live(Arc::new(c)));
                self.inner.refill();
                Arc::new(Slot::new(per_rollout, Some(reset.clone()), state))
            }
        };
        let (inner, s) = (self.inner.clone(), slot.clone());
        let observation = block_on(async move {
            match inner.spec.reset_tool.clone() {
                Some(tool) => s.call(&inner, &tool, reset).await.map(Some),
                None => s.connection(&inner).await.map(|_| None),
            }
        })?;
        let observation = observation.map(|o| o.trim().to_string()).filter(|o| !o.is_empty());
        Ok(McpSession { inner: self.inner.clone(), slot, observation })
    }

    /// The shared session's child process id (a shared stdio server, while it runs).
    pub fn pid(&self) -> Option<u32> {
        let slot = self.inner.shared.clone()?;
        block_on(async move { slot.pid().await })
    }
}

/// The offered tools from a `tools/list`: the reset and reward tools must be
/// there and are left out, and at least one tool must remain.
fn discover(spec: &ServerSpec, listed: Vec<rmcp::model::Tool>) -> Result<Vec<ToolSpec>, McpError> {
    let err = |reason: String| McpError::Tools { server: spec.name.clone(), reason };
    let names: Vec<&str> = listed.iter().map(|t| t.name.as_ref()).collect();
    for (field, tool) in [("reset_tool", &spec.reset_tool), ("reward_tool", &spec.reward_tool)] {
        if let Some(t) = tool.as_deref().filter(|t| !names.contains(t)) {
            return Err(err(format!("{field} \"{t}\" is not among its tools ({})", names.join(", "))));
        }
    }
    let tools: Vec<ToolSpec> = listed
        .iter()
        .filter(|t| !spec.is_hidden(&t.name))
        .map(|t| ToolSpec {
            name: t.name.to_string(),
            description: t.description.as_deref().map(str::to_string).or_else(|| t.title.clone()).unwrap_or_default(),
            parameters: Value::Object((*t.input_schema).clone()),
        })
        .collect();
    if tools.is_empty() {
        let besides = if listed.is_empty() { "" } else { " besides its reset and reward tools" };
        return Err(err(format!("lists no tools{besides}")));
    }
    Ok(tools)
}

impl ToolSource for McpServer {
    fn name(&self) -> &str {
        &self.inner.spec.name
    }

    fn specs(&self) -> Vec<ToolSpec> {
        self.inner.tools.clone()
    }

    fn check_task(&self, task: &Task) -> Result<(), String> {
        match reset_arguments(self.name(), task) {
            Some(s) if !s.is_object() => Err(format!("env_state: expected an object (the arguments of {}'s reset tool)", self.name())),
            _ => Ok(()),
        }
    }

    /// The task's `env_state` goes to this server's reset tool when the task
    /// names no environment or names this server.
    fn open(&self, task: &Task, _: &ExecLimits) -> Result<SourceSession, String> {
        let session = self.session(reset_arguments(self.name(), task)).map_err(|e| e.to_string())?;
        let tools = session.tools();
        let observation = session.observation.clone();
        let grader: Option<Grader> = self.inner.spec.reward_tool.is_some().then(|| {
            let g: Grader = Arc::new(move || session.reward().map_err(|e| e.to_string()));
            g
        });
        Ok(SourceSession { tools, observation, grader })
    }

    fn health(&self) -> Result<(), String> {
        McpServer::health(self).map_err(|e| e.to_string())
    }

    fn starts_a_process_per_session(&self) -> bool {
        self.inner.spec.session == SessionMode::PerRollout && self.inner.spec.url.is_none()
    }
}

fn reset_arguments<'a>(server: &str, task: &'a Task) -> Option<&'a Value> {
    match task.environment.as_deref() {
        None => task.env_state.as_ref(),
        Some(e) if e == server => task.env_state.as_ref(),
        Some(_) => None,
    }
}

/// Starts every server (at the same time) and adds each to `registry` as a
/// tool source, in order. The first failure is returned, naming its server
/// (a clash of tool names or a bad schema comes as [`McpError::Registry`]);
/// the servers not added are stopped, and those added before it stay in the
/// registry (drop it to stop them).
pub fn register(registry: &mut ToolRegistry, specs: &[ServerSpec]) -> Result<Vec<Arc<McpServer>>, McpError> {
    let started = block_on({
        let specs = specs.to_vec();
        async move {
            let mut set = tokio::task::JoinSet::new();
            for (i, spec) in specs.into_iter().enumerate() {
                set.spawn(async move { (i, McpServer::start_async(spec).await) });
            }
            let mut out: Vec<(usize, Result<McpServer, McpError>)> = set.join_all().await;
            out.sort_by_key(|(i, _)| *i);
            out
        }
    });
    let mut servers = Vec::with_capacity(started.len());
    for (_, s) in started {
        servers.push(Arc::new(s?));
    }
    for s in &servers {
        registry.add_source(s.clone())?;
    }
    Ok(servers)
}
