//! `[estimator]`: the advantage estimator and the policy-loss parameters.
use super::checks::{positive, unit};
use super::source::Invalid;
use serde::{Deserialize, Serialize};

/// Advantage estimators of the RL loop: scalar (GRPO family), per segment (SLCA), per step (StepTool).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EstimatorKind {
    /// GRPO (TRL semantics).
    Grpo,
    /// Dr.GRPO: GRPO without the σ division.
    DrGrpo,
    /// REINFORCE leave-one-out.
    Rloo,
    /// SLCA-GRPO: the process advantage on tool-call turns, the summary advantage on the final reply.
    Slca,
    /// StepTool: step rewards on each turn's last token, KL in the reward, GAE over a value head.
    Steptool,
    /// StepTool without a critic: step returns normalised within the group.
    SteptoolCriticFree,
}

impl EstimatorKind {
    /// The name a recipe spells.
    pub fn as_str(self) -> &'static str {
        match self {
            EstimatorKind::Grpo => "grpo",
            EstimatorKind::DrGrpo => "dr_grpo",
            EstimatorKind::Rloo => "rloo",
            EstimatorKind::Slca => "slca",
            EstimatorKind::Steptool => "steptool",
            EstimatorKind::SteptoolCriticFree => "steptool_critic_free",
        }
    }
}

/// Which σ divides GRPO's centred rewards.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScaleRewardsName {
    /// σ of the group.
    Group,
    /// σ of the batch.
    Batch,
    /// No division.
    None,
}

/// The advantage estimator and the policy-loss parameters.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Estimator {
    /// The estimator (default `grpo`).
    #[serde(default = "default_estimator")]
    pub name: EstimatorKind,
    /// GRPO's σ (default `group`; Dr.GRPO: `none`, the only value it takes; RLOO: not used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub scale_rewards: Option<ScaleRewardsName>,
    /// PPO clip ε of the importance ratio (default 0.2).
    #[serde(default = "default_clip_eps")]
    pub clip_eps: f64,
    /// β of the KL penalty to the reference policy, the policy after the warm-up
    /// (default 0: no reference). GRPO family and SLCA: `+ β·KL` (k3) in the loss;
    /// `steptool`: `−β·(logp − ref)` in each token's reward, β the initial value of
    /// the adaptive controller.
    #[serde(default)]
    pub kl_coef: f64,
    /// `slca`: weight of the normalised process advantage (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub w_process: Option<f64>,
    /// `slca`: weight of the normalised summary advantage (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub w_summary: Option<f64>,
    /// `slca`: divide by the standard deviation after centring (default true).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub norm_by_std: Option<bool>,
    /// `steptool`, `steptool_critic_free`: discount γ (default 0.99).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gamma: Option<f64>,
    /// `steptool`: GAE λ (default 0.95).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lam: Option<f64>,
    /// `steptool`, `steptool_critic_free`: multiply step i's reward by `K − 1 − i` as
    /// the upstream code does (zeroes the final IsSolved reward; default false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_weighting: Option<bool>,
    /// `steptool`: the adaptive KL controller's target KL per sequence (default 6).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl_target: Option<f64>,
}

/// The estimators that use each optional `[estimator]` field.
const ESTIMATOR_FIELDS: &[(&str, &[EstimatorKind])] = &[
    ("w_process", &[EstimatorKind::Slca]),
    ("w_summary", &[EstimatorKind::Slca]),
    ("norm_by_std", &[EstimatorKind::Slca]),
    ("gamma", &[EstimatorKind::Steptool, EstimatorKind::SteptoolCriticFree]),
    ("lam", &[EstimatorKind::Steptool]),
    ("upstream_weighting", &[EstimatorKind::Steptool, EstimatorKind::SteptoolCriticFree]),
    ("kl_target", &[EstimatorKind::Steptool]),
    ("scale_rewards", &[EstimatorKind::Grpo, EstimatorKind::DrGrpo]),
];

fn default_estimator() -> EstimatorKind {
    EstimatorKind::Grpo
}
fn default_clip_eps() -> f64 {
    0.2
}

impl Default for Estimator {
    fn default() -> Self {
        Estimator {
            name: default_estimator(),
            scale_rewards: None,
            clip_eps: default_clip_eps(),
            kl_coef: 0.0,
            w_process: None,
            w_summary: None,
            norm_by_std: None,
            gamma: None,
            lam: None,
            upstream_weighting: None,
            kl_target: None,
        }
    }
}

impl Estimator {
    /// Checks the estimator's fields and that each optional one is used by the chosen estimator.
    pub(super) fn validate(&self) -> Result<(), Invalid> {
        let e = self;
        let given = [
            ("w_process", e.w_process.is_some()),
            ("w_summary", e.w_summary.is_some()),
            ("norm_by_std", e.norm_by_std.is_some()),
            ("gamma", e.gamma.is_some()),
            ("lam", e.lam.is_some()),
            ("upstream_weighting", e.upstream_weighting.is_some()),
            ("kl_target", e.kl_target.is_some()),
            ("scale_rewards", e.scale_rewards.is_some()),
        ];
        for (field, set) in given {
            let users = ESTIMATOR_FIELDS.iter().find(|(f, _)| *f == field).map_or(&[][..], |(_, u)| *u);
            if set && !users.contains(&e.name) {
                let names: Vec<&str> = users.iter().map(|k| k.as_str()).collect();
                return Err(Invalid::new(
                    format!("estimator.{field}"),
                    format!("only {} {} it, and this recipe's estimator is {}; remove it", names.join(" and "), if names.len() == 1 { "uses" } else { "use" }, e.name.as_str()),
                ));
            }
        }
        if let (EstimatorKind::DrGrpo, Some(s)) = (e.name, e.scale_rewards) {
            if s != ScaleRewardsName::None {
                return Err(Invalid::new("estimator.scale_rewards", "dr_grpo does not scale rewards: only \"none\""));
            }
        }
        for (field, v) in [("w_process", e.w_process), ("w_summary", e.w_summary)] {
            if let Some(v) = v {
                if !(v >= 0.0 && v.is_finite()) {
                    return Err(Invalid::new(format!("estimator.{field}"), format!("must be ≥ 0, got {v}")));
                }
            }
        }
        for (field, v) in [("gamma", e.gamma), ("lam", e.lam)] {
            if let Some(v) = v {
                unit(&format!("estimator.{field}"), v)?;
            }
        }
        if let Some(t) = e.kl_target {
            positive("estimator.kl_target", t)?;
        }
        if !(e.clip_eps > 0.0 && e.clip_eps < 1.0) {
            return Err(Invalid::new("estimator.clip_eps", format!("must be in (0, 1), got {}", e.clip_eps)));
        }
        if !(e.kl_coef >= 0.0 && e.kl_coef.is_finite()) {
            return Err(Invalid::new("estimator.kl_coef", format!("must be ≥ 0, got {}", e.kl_coef)));
        }
        Ok(())
    }
}
