//! The crate's one error type. Each error names the server; those about a
//! child process quote the end of its stderr.
use rlmesh_core::tools::RegistryError;

/// Why a tool server could not be used.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum McpError {
    /// The description is wrong (see [`ServerSpec::validate`](crate::ServerSpec::validate)).
    #[error("tool server \"{server}\": {reason}")]
    Spec {
        /// Server name.
        server: String,
        /// The field and what is wrong with it.
        reason: String,
    },
    /// It could not be started or reached, or did not complete `initialize`.
    #[error("tool server \"{server}\" could not start: {reason}{}", stderr_tail(stderr))]
    Start {
        /// Server name.
        server: String,
        /// What failed.
        reason: String,
        /// The end of the child's stderr (empty for an HTTP server).
        stderr: String,
    },
    /// Its tools are unusable: it lists none, lacks a configured hidden tool.
    #[error("tool server \"{server}\": {reason}")]
    Tools {
        /// Server name.
        server: String,
        /// What is wrong.
        reason: String,
    },
    /// A call did not return within the limit (the server is then restarted).
    #[error("tool server \"{server}\": \"{tool}\" timed out after {ms} ms")]
    TimedOut {
        /// Server name.
        server: String,
        /// The tool called.
        tool: String,
        /// The limit in milliseconds.
        ms: u64,
    },
    /// The server failed mid-call: it died, or its connection broke (it is then restarted).
    #[error("tool server \"{server}\" failed during \"{tool}\": {reason}{}", stderr_tail(stderr))]
    Died {
        /// Server name.
        server: String,
        /// The tool called.
        tool: String,
        /// What broke.
        reason: String,
        /// The end of the child's stderr (empty for an HTTP server).
        stderr: String,
    },
    /// The server answered the call with an error (a JSON-RPC error or
    /// `isError`); the server itself is fine.
    #[error("tool server \"{server}\": \"{tool}\" failed: {reason}")]
    Call {
        /// Server name.
        server: String,
        /// The tool called.
        tool: String,
        /// The server's message.
        reason: String,
    },
    /// A per-rollout session was restarted mid-rollout: the rollout's state
    /// is gone, so its reward cannot be read (the rollout is unscorable).
    #[error("tool server \"{server}\": this rollout's session was restarted, so its state is lost")]
    StateLost {
        /// Server name.
        server: String,
    },
    /// Past its restart budget: the server is given up for the rest of the
    /// run, and every call reports this. A run should stop at a checkpoint.
    #[error("tool server \"{server}\" is given up after {failures} failures in a row (max_restarts = {max_restarts}); the last: {last}")]
    BudgetExhausted {
        /// Server name.
        server: String,
        /// Failures in a row.
        failures: u32,
        /// The budget.
        max_restarts: u32,
        /// The last failure.
        last: String,
    },
    /// The tool registry refused the server's tools (a name clash with
    /// another server or a built-in, a bad schema); names the server.
    #[error(transparent)]
    Registry(#[from] RegistryError),
}

impl McpError {
    /// True for [`McpError::BudgetExhausted`]: the run cannot go on with this server.
    pub fn is_fatal(&self) -> bool {
        matches!(self, McpError::BudgetExhausted { .. })
    }

    /// The text a model sees in its tool message: what happened to its call,
    /// without the server's stderr (that is for the operator, in the error itself).
    pub fn for_model(&self) -> String {
        match self {
            McpError::Call { reason, .. } => reason.clone(),
            McpError::Died { server, tool, reason, .. } => {
                format!("tool server \"{server}\" failed during \"{tool}\" ({reason}); it is being restarted")
            }
            McpError::Start { server, reason, .. } => format!("tool server \"{server}\" could not be restarted: {reason}"),
            McpError::BudgetExhausted { server, .. } => format!("tool server \"{server}\" is unavailable"),
            other => other.to_string(),
        }
    }
}

fn stderr_tail(stderr: &str) -> String {
    match stderr.trim() {
        "" => String::new(),
        t => format!("; its stderr ends:\n{t}"),
    }
}
