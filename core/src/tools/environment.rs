//! Stateful environments, as TRL's `environment_factory`: a fresh instance per
//! rollout, `reset(task)` may return an observation appended to the prompt, its
//! methods are the tools, and `get_reward` grades the final state.
use super::schema::ToolArgs;
use super::tool::{typed_args, CallError, Handler, Tool, ToolError, ToolSpec};
use crate::task::Task;
use serde_json::Value;
use std::sync::{Arc, Mutex, PoisonError};

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

/// A live environment instance: its bound tools and its grader.
pub(crate) struct Bound {
    /// The methods as tools sharing this instance's state.
    pub tools: Vec<Tool>,
    /// Reads `get_reward` (may block while a call holds the state; run it with a time limit).
    pub reward: Arc<dyn Fn() -> Option<f64> + Send + Sync>,
    /// Runs `reset` on the instance.
    pub reset: Box<dyn FnOnce(Task) -> Option<String> + Send>,
}

/// Binds a fresh instance's methods to its state (a mutex: a call that
/// panicked leaves the state as it was at the panic, as an exception would in Python).
pub(crate) fn bind<E: Environment>(env: E, methods: &Arc<Vec<Method<E>>>) -> Bound {
    let state = Arc::new(Mutex::new(env));
    let tools = (0..methods.len())
        .map(|i| {
            let spec = methods[i].spec.clone();
            let (state, methods) = (state.clone(), methods.clone());
            let handler: Handler = Arc::new(move |args: &Value| {
                let mut env = state.lock().unwrap_or_else(PoisonError::into_inner);
                (methods[i].run)(&mut env, args)
            });
            Tool::from_handler(spec, handler)
        })
        .collect();
    let for_reward = state.clone();
    Bound {
        tools,
        reward: Arc::new(move || for_reward.lock().unwrap_or_else(PoisonError::into_inner).get_reward()),
        reset: Box::new(move |task: Task| state.lock().unwrap_or_else(PoisonError::into_inner).reset(&task)),
    }
}
