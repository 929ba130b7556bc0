//! A tool server described as data (a recipe's `[[tool_server]]` table), so
//! that any process on any host can build the same server from it.
//!
//! ```
//! let spec: rlmesh_mcp::ServerSpec = toml::from_str(r#"
//!     name = "files"
//!     command = ["python3", "tools.py"]
//!     session = "per_rollout"
//!     reset_tool = "reset"
//!     reward_tool = "get_reward"
//!     timeout_s = 30
//! "#).unwrap();
//! assert_eq!(spec.validate(), Ok(()));
//! assert_eq!(spec.max_restarts, 5);
//! ```
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// Who shares an MCP session.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SessionMode {
    /// One session for every rollout (a stateless server).
    #[default]
    Shared,
    /// A fresh session per rollout: its own child process (stdio) or its own
    /// HTTP session, reset on the task; the state of TRL's `environment_factory`.
    PerRollout,
}

/// One MCP tool server: how to reach it, its session mode, its hidden
/// reset and reward tools, and its limits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerSpec {
    /// Its name, in errors, metrics and the reward function `env:<name>`.
    pub name: String,
    /// Start it as a child speaking MCP on stdin/stdout: program and arguments.
    #[serde(default)]
    pub command: Option<Vec<String>>,
    /// Or reach it over Streamable HTTP at this URL (e.g. `http://127.0.0.1:8931/mcp`).
    #[serde(default)]
    pub url: Option<String>,
    /// Environment variables for the child, added to this process's own.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// The child's working directory (default: this process's).
    #[serde(default)]
    pub cwd: Option<PathBuf>,
    /// Shared, or a session per rollout.
    #[serde(default)]
    pub session: SessionMode,
    /// A tool called with the task's `env_state` (its arguments object, or
    /// `{}`) before the first turn; hidden from the model.
    #[serde(default)]
    pub reset_tool: Option<String>,
    /// A tool called after the last turn; its number (the text, or a number
    /// in its JSON) is the environment's reward; hidden from the model.
    #[serde(default)]
    pub reward_tool: Option<String>,
    /// Limit of one call, in seconds (a call past it fails and restarts the server).
    #[serde(default = "default_timeout_s")]
    pub timeout_s: f64,
    /// Limit of one start (spawn, `initialize`, `tools/list`), in seconds.
    #[serde(default = "default_start_timeout_s")]
    pub start_timeout_s: f64,
    /// Per-rollout sessions kept started ahead of need, so that opening a
    /// rollout's session waits only for its reset, not for a process to start
    /// (about a second for a Python server); the rollouts of a group open
    /// back to back, so the group size is a good value. 0: start on demand.
    #[serde(default)]
    pub prestart: usize,
    /// Failures in a row (a call timed out, the server died or would not
    /// start) after which the server is given up; each is followed by a
    /// restart after an exponential back-off. A call that succeeds resets the count.
    #[serde(default = "default_max_restarts")]
    pub max_restarts: u32,
}

fn default_timeout_s() -> f64 {
    30.0
}

fn default_start_timeout_s() -> f64 {
    60.0
}

fn default_max_restarts() -> u32 {
    5
}

/// How a server is reached.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport<'a> {
    /// A child process: program and arguments.
    Stdio(&'a [String]),
    /// Streamable HTTP at this URL.
    Http(&'a str),
}

impl ServerSpec {
    /// A stdio server: `command` is the program and its arguments.
    pub fn stdio<S: Into<String>>(name: impl Into<String>, command: impl IntoIterator<Item = S>) -> Self {
        ServerSpec { command: Some(command.into_iter().map(Into::into).collect()), ..ServerSpec::bare(name.into()) }
    }

    /// A Streamable HTTP server at `url`.
    pub fn http(name: impl Into<String>, url: impl Into<String>) -> Self {
        ServerSpec { url: Some(url.into()), ..ServerSpec::bare(name.into()) }
    }

    fn bare(name: String) -> Self {
        ServerSpec {
            name,
            command: None,
            url: None,
            env: BTreeMap::new(),
            cwd: None,
            session: SessionMode::Shared,
            reset_tool: None,
            reward_tool: None,
            timeout_s: default_timeout_s(),
            start_timeout_s: default_start_timeout_s(),
            prestart: 0,
            max_restarts: default_max_restarts(),
        }
    }

    /// Checks the description: a name, exactly one of `command` (not empty)
    /// and `url` (http or https), positive finite limits, distinct hidden tools.
    /// The error names the field.
    pub fn validate(&self) -> Result<(), String> {
        if self.name.trim().is_empty() {
            return Err("name: must not be empty".into());
        }
        match (&self.command, &self.url) {
            (Some(_), Some(_)) => return Err("command, url: give one of them, not both".into()),
            (None, None) => return Err("command, url: give one of them (a program to start, or a server's URL)".into()),
            (Some(c), None) if c.first().is_none_or(|p| p.is_empty()) => {
                return Err("command: expected a program and its arguments, e.g. [\"python3\", \"tools.py\"]".into())
            }
            (None, Some(u)) if !(u.starts_with("http://") || u.starts_with("https://")) => {
                return Err(format!("url: expected an http:// or https:// URL, got \"{u}\""))
            }
            _ => {}
        }
        if self.url.is_some() && (!self.env.is_empty() || self.cwd.is_some()) {
            return Err("env, cwd: only for a server started with command".into());
        }
        for (field, s) in [("timeout_s", self.timeout_s), ("start_timeout_s", self.start_timeout_s)] {
            if !(s.is_finite() && s > 0.0) {
                return Err(format!("{field}: expected a positive number of seconds, got {s}"));
            }
        }
        if self.prestart > 0 && self.session != SessionMode::PerRollout {
            return Err("prestart: only for session = \"per_rollout\"".into());
        }
        if self.reset_tool.is_some() && self.reset_tool == self.reward_tool {
            return Err("reset_tool, reward_tool: must be two different tools".into());
        }
        Ok(())
    }

    /// How the server is reached (after [`ServerSpec::validate`]).
    pub fn transport(&self) -> Transport<'_> {
        match (&self.command, &self.url) {
            (Some(c), _) => Transport::Stdio(c),
            (None, Some(u)) => Transport::Http(u),
            (None, None) => Transport::Stdio(&[]),
        }
    }

    /// The limit of one call.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs_f64(self.timeout_s)
    }

    /// The limit of one start.
    pub fn start_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.start_timeout_s)
    }

    /// Whether `tool` is the reset or the reward tool (not offered to the model).
    pub fn is_hidden(&self, tool: &str) -> bool {
        self.reset_tool.as_deref() == Some(tool) || self.reward_tool.as_deref() == Some(tool)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_field() {
        let ok = ServerSpec::stdio("s", ["python3", "t.py"]);
        assert_eq!(ok.validate(), Ok(()));
        let mut both = ok.clone();
        both.url = Some("http://x/mcp".into());
        let cases = [
            (ServerSpec { name: " ".into(), ..ok.clone() }, "name: must not be empty"),
            (both, "command, url: give one of them, not both"),
            (ServerSpec { command: None, ..ok.clone() }, "command, url: give one of them (a program to start, or a server's URL)"),
            (ServerSpec::stdio("s", Vec::<String>::new()), "command: expected a program and its arguments, e.g. [\"python3\", \"tools.py\"]"),
            (ServerSpec::http("s", "ftp://x"), "url: expected an http:// or https:// URL, got \"ftp://x\""),
            (ServerSpec { timeout_s: 0.0, ..ok.clone() }, "timeout_s: expected a positive number of seconds, got 0"),
            (ServerSpec { start_timeout_s: f64::NAN, ..ok.clone() }, "start_timeout_s: expected a positive number of seconds, got NaN"),
            (ServerSpec { reset_tool: Some("r".into()), reward_tool: Some("r".into()), ..ok.clone() }, "reset_tool, reward_tool: must be two different tools"),
            (ServerSpec { prestart: 2, ..ok.clone() }, "prestart: only for session = \"per_rollout\""),
            (ServerSpec { cwd: Some("/".into()), ..ServerSpec::http("s", "http://x/mcp") }, "env, cwd: only for a server started with command"),
        ];
        for (spec, want) in cases {
            assert_eq!(spec.validate(), Err(want.to_string()), "{spec:?}");
        }
    }

    #[test]
    fn json_round_trip_with_defaults_and_unknown_fields_refused() {
        let spec: ServerSpec = serde_json::from_str(r#"{"name": "t", "url": "http://127.0.0.1:1/mcp", "session": "per_rollout"}"#).unwrap();
        assert_eq!(spec, ServerSpec { session: SessionMode::PerRollout, ..ServerSpec::http("t", "http://127.0.0.1:1/mcp") });
        assert_eq!(serde_json::from_value::<ServerSpec>(serde_json::to_value(&spec).unwrap()).unwrap(), spec);
        let e = serde_json::from_str::<ServerSpec>(r#"{"name": "t", "url": "http://x", "sesion": "shared"}"#).unwrap_err();
        assert!(e.to_string().starts_with("unknown field `sesion`"), "{e}");
    }
}
