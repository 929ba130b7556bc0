//! `[reward_weights]` and `[[reward_function]]`: a run's reward as configuration.
//!
//! A rollout's total is TRL's `None`-aware weighted sum over its reward
//! functions ([`rlmesh_core::reward::functions`]):
//! - the built-in rubric (named after `reward`: `process`, `final_only`,
//!   `hierr`), weight 1, its components weighted as `[reward_weights]` says;
//! - `env:<server>` for each `[[tool_server]]` with a `reward_tool`, weight 1;
//! - `verifier:<name>` for each `[[reward_function]]`, with its `weight`.
//!
//! ```toml
//! [reward_weights]
//! process = 0.5            # the rubric as a whole (0: only the other functions)
//! final_correct = 0.6      # a rubric component
//! "env:files" = 1.0        # an environment's reward
//!
//! [[reward_function]]
//! name = "math"
//! command = ["python3", "verify.py"]   # JSON lines on stdin/stdout; or url = "http://…"
//! weight = 1.0
//! timeout_s = 30
//! ```
use super::source::Invalid;
use super::tools::ServerSpec;
use super::RewardKind;
use rlmesh_core::reward::functions::RewardFunction;
use rlmesh_core::reward::process::{RubricWeights, FINAL_ONLY_COMPONENTS, PROCESS_COMPONENTS};
use rlmesh_verifiers::VerifierSpec;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::Duration;

/// One `[[reward_function]]`: an external verifier.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardFunctionSpec {
    /// Its name (the function is `verifier:<name>` in metrics and the ledger).
    pub name: String,
    /// A program speaking JSON lines on stdin/stdout (relative to the recipe's directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub command: Option<Vec<String>>,
    /// Or a URL taking the same JSON by POST.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Its weight in the sum (default 1).
    #[serde(default = "one")]
    pub weight: f64,
    /// Seconds one request may take before the rollout is unscorable (default 30).
    #[serde(default = "default_timeout_s")]
    pub timeout_s: f64,
    /// Restarts of a command after a crash or a hang before it is given up (default 5).
    #[serde(default = "default_restarts")]
    pub max_restarts: u32,
    /// The command's working directory (default: the recipe's directory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cwd: Option<String>,
}

fn one() -> f64 {
    1.0
}
fn default_timeout_s() -> f64 {
    30.0
}
fn default_restarts() -> u32 {
    5
}

impl RewardFunctionSpec {
    /// The verifier it describes.
    pub fn verifier(&self) -> VerifierSpec {
        let mut v = match (&self.command, &self.url) {
            (Some(c), _) => VerifierSpec::command(self.name.clone(), c.clone()),
            (None, u) => VerifierSpec::url(self.name.clone(), u.clone().unwrap_or_default()),
        };
        v.weight = self.weight;
        v.timeout = Duration::from_secs_f64(self.timeout_s);
        v.max_restarts = self.max_restarts;
        v.cwd = self.cwd.as_ref().map(Into::into);
        v
    }
}

/// The rubric's name as a reward function.
pub fn rubric_name(kind: RewardKind) -> &'static str {
    match kind {
        RewardKind::Process => "process",
        RewardKind::FinalOnly => "final_only",
        RewardKind::Hierr => "hierr",
    }
}

/// The tool servers whose reward tool is a reward function (`env:<name>`).
pub fn env_sources(servers: &[ServerSpec]) -> Vec<String> {
    servers.iter().filter(|s| s.reward_tool.is_some()).map(|s| s.name.clone()).collect()
}

/// The reward function of a grade source: `agent` for an agent program's own
/// `reward` (`[agent]`), `env:<name>` for a tool server's reward tool.
pub fn grade_function(source: &str) -> String {
    match source {
        crate::rollout::agent_host::AGENT_FUNCTION => source.to_string(),
        s => format!("env:{s}"),
    }
}

/// The run's reward functions, in the order their scores are combined:
/// the rubric, the environments' rewards (of `env_sources`), the verifiers.
pub fn reward_functions(kind: RewardKind, weights: &BTreeMap<String, f64>, env_sources: &[String], verifiers: &[RewardFunctionSpec]) -> Vec<RewardFunction> {
    let weight = |name: &str| weights.get(name).copied().unwrap_or(1.0);
    let rubric = rubric_name(kind);
    let mut fs = vec![RewardFunction::new(rubric, weight(rubric))];
    for s in env_sources {
        let name = grade_function(s);
        fs.push(RewardFunction::new(name.clone(), weight(&name)));
    }
    fs.extend(verifiers.iter().map(|v| RewardFunction::new(format!("verifier:{}", v.name), v.weight)));
    fs
}

/// The rubric's component weights out of `[reward_weights]`.
pub fn rubric_weights(weights: &BTreeMap<String, f64>) -> RubricWeights {
    RubricWeights(weights.iter().filter(|(k, _)| !k.contains(':') && !["process", "final_only", "hierr"].contains(&k.as_str())).map(|(k, v)| (k.clone(), *v)).collect())
}

/// Checks `[reward_weights]` keys against what the run has, and each
/// `[[reward_function]]`; errors name the field.
pub(super) fn validate(kind: RewardKind, weights: &BTreeMap<String, f64>, servers: &[ServerSpec], agent: bool, verifiers: &[RewardFunctionSpec]) -> Result<(), Invalid> {
    let components: &[&str] = match kind {
        RewardKind::Process => &PROCESS_COMPONENTS,
        RewardKind::FinalOnly => &FINAL_ONLY_COMPONENTS,
        RewardKind::Hierr => &[],
    };
    let rubric = rubric_name(kind);
    let mut envs: Vec<String> = env_sources(servers).iter().map(|s| format!("env:{s}")).collect();
    if agent {
        envs.push(crate::rollout::agent_host::AGENT_FUNCTION.to_string());
    }
    for (k, w) in weights {
        let field = format!("reward_weights.{k}");
        if !w.is_finite() {
            return Err(Invalid::new(field, format!("must be a finite number, got {w}")));
        }
        if k != rubric && !components.contains(&k.as_str()) && !envs.contains(k) {
            let mut known: Vec<String> = vec![rubric.to_string()];
            known.extend(components.iter().map(|c| c.to_string()));
            known.extend(envs.iter().cloned());
            let why = if k.starts_with("verifier:") { " (a verifier's weight is its [[reward_function]] weight)" } else { "" };
            return Err(Invalid::new(field, format!("unknown reward function or component{why} (known: {})", known.join(", "))));
        }
    }
    for (i, v) in verifiers.iter().enumerate() {
        let f = |k: &str| format!("reward_function[{i}].{k}");
        if v.name.trim().is_empty() {
            return Err(Invalid::new(f("name"), "must not be empty"));
        }
        if verifiers[..i].iter().any(|o| o.name == v.name) {
            return Err(Invalid::new(f("name"), format!("\"{}\" is already the name of another reward function", v.name)));
        }
        match (&v.command, &v.url) {
            (Some(_), Some(_)) | (None, None) => return Err(Invalid::new(f("command"), "give one of command (a program) and url (an http:// endpoint)")),
            (Some(c), None) if c.first().is_none_or(|p| p.is_empty()) => return Err(Invalid::new(f("command"), "expected a program and its arguments, e.g. [\"python3\", \"verify.py\"]")),
            (None, Some(u)) if !(u.starts_with("http://") || u.starts_with("https://")) => return Err(Invalid::new(f("url"), format!("expected an http:// or https:// URL, got \"{u}\""))),
            _ => {}
        }
        if !v.weight.is_finite() {
            return Err(Invalid::new(f("weight"), format!("must be a finite number, got {}", v.weight)));
        }
        if !(v.timeout_s.is_finite() && v.timeout_s > 0.0) {
            return Err(Invalid::new(f("timeout_s"), format!("expected a positive number of seconds, got {}", v.timeout_s)));
        }
    }
    Ok(())
}
