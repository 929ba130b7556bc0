//! Stateful environments, as TRL's `environment_factory`: a fresh instance per
//! rollout, `reset(task)` may return an observation appended to the prompt, its
//! methods are the tools, and `get_reward` grades the final state.
use super::execute::{run_limited, ExecLimits};
use super::schema::ToolArgs;
use super::source::{Grader, SourceSession, ToolSource};
use super::tool::{typed_args, CallError, Handler, Tool, ToolError, ToolSpec};
use crate::task::Task;
use serde_json::Value;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// A stateful environment; one instance lives for one rollout.
pub trait Environment: Send + 'static {
    /// The tools this environment offers (its methods).
    fn methods() -> Vec<Method<Self>>
    where
        Self: Sized;
    /// Checks that a task can run here (e.g. its `env_state`); used when loading tasks.
    fn check_task(task: &Task) -> Result<(), String>
    where
        Self: Sized;
    /// Starts a rollout on `task`; the returned text is appended to the prompt.
    fn reset(&mut self, task: &Task) -> Option<String>;
    /// Grades the environment's state at the end of the rollout (`None`: no grade).
    fn get_reward(&self) -> Option<f64>;
}

type MethodFn<E> = Box<dyn Fn(&mut E, &Value) -> Result<String, CallError> + Send + Sync>;

/// One tool of an environment: its spec and the method that runs it.
pub struct Method<E> {
    /// Name, description and schema.
    pub spec: ToolSpec,
    run: MethodFn<E>,
}

impl<E: 'static> Method<E> {
    /// A method from a typed function of the state and the arguments.
    pub fn new<A: ToolArgs + 'static>(
        name: &str,
        description: &str,
        f: fn(&mut E, A) -> Result<String, ToolError>,
    ) -> Self {
        let tool = name.to_string();
        let run: MethodFn<E> = Box::new(move |env: &mut E, args: &Value| Ok(f(env, typed_args(&tool, args)?)?));
        Method { spec: ToolSpec::new::<A>(name, description), run }
    }
}

/// A built-in environment as a [`ToolSource`]: a fresh instance per rollout.
pub(crate) struct EnvSource<E> {
    name: String,
    methods: Arc<Vec<Method<E>>>,
    factory: Box<dyn Fn() -> E + Send + Sync>,
}

impl<E: Environment> EnvSource<E> {
    /// The environment `name`, whose instances `factory` makes.
    pub(crate) fn new(name: &str, factory: impl Fn() -> E + Send + Sync + 'static) -> Self {
        EnvSource { name: name.to_string(), methods: Arc::new(E::methods()), factory: Box::new(factory) }
    }
}

impl<E: Environment> ToolSource for EnvSource<E> {
    fn name(&self) -> &str {
        &self.name
    }

    fn specs(&self) -> Vec<ToolSpec> {
        self.methods.iter().map(|m| m.spec.clone()).collect()
    }

    fn check_task(&self, task: &Task) -> Result<(), String> {
        E::check_task(task)
    }

    /// Binds a fresh instance's methods to its state (a mutex: a call that
    /// panicked leaves the state as it was at the panic, as an exception would
    /// in Python) and runs `reset` with the time limit; the grader reads
    /// `get_reward` with the same limit (a call may still hold the state).
    fn open(&self, task: &Task, limits: &ExecLimits) -> Result<SourceSession, String> {
        let state = Arc::new(Mutex::new((self.factory)()));
        let tools = (0..self.methods.len())
            .map(|i| {
                let spec = self.methods[i].spec.clone();
                let (state, methods) = (state.clone(), self.methods.clone());
                let handler: Handler = Arc::new(move |args: &Value| (methods[i].run)(&mut lock(&state), args));
                Tool::from_handler(spec, handler)
            })
            .collect();
        let timeout = Duration::from_millis(limits.timeout_ms);
        let (for_reset, task) = (state.clone(), task.clone());
        let observation = run_limited(&self.name, timeout, move || lock(&for_reset).reset(&task)).map_err(|e| e.to_string())?;
        let grader: Grader = Arc::new(move || {
            let state = state.clone();
            run_limited("get_reward", timeout, move || lock(&state).get_reward()).map_err(|e| e.to_string())
        });
        Ok(SourceSession { tools, observation, grader: Some(grader) })
    }
}

fn lock<E>(state: &Mutex<E>) -> std::sync::MutexGuard<'_, E> {
    state.lock().unwrap_or_else(PoisonError::into_inner)
}
