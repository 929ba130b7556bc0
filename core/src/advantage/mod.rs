//! Advantage estimators on per-token data: GRPO, Dr.GRPO, RLOO, SLCA-GRPO, StepTool GAE.
//!
//! Every estimator returns one `Vec<f32>` per rollout, as long as its loss
//! mask, and zero wherever the mask is 0 (prompt, template glue, tool
//! results): only policy tokens carry credit.
//!
//! - [`grpo`] — group-relative scalar advantages (GRPO with `scale_rewards`
//!   group/batch/none; Dr.GRPO is GRPO with `none`; RLOO), broadcast over the
//!   policy tokens.
//! - [`slca`] — SLCA-GRPO: the process advantage on tool-call tokens, the
//!   summary advantage on the final reply's tokens.
//! - [`steptool`] — StepTool: step rewards on the last token of each action,
//!   KL in the reward, GAE over a value head, whitening; and a critic-free
//!   variant.
//!
//! Shared steps live here: [`mask_runs`] (segments of a loss mask, used by
//! SLCA and StepTool), [`center_scale`] (group normalisation, used by GRPO,
//! SLCA and critic-free StepTool) and [`broadcast`].
use crate::reward::combine::nanmean;
use crate::trajectory::Span;

pub mod grpo;
pub mod slca;
pub mod steptool;

/// Errors of the estimators: inputs whose shapes do not fit together.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum AdvantageError {
    /// A per-token array is not as long as the loss mask.
    #[error("{field}: expected {expected} values (one per loss-mask entry), got {got}")]
    Length {
        /// The array.
        field: &'static str,
        /// The loss mask's length.
        expected: usize,
        /// The array's length.
        got: usize,
    },
    /// The number of step rewards differs from the number of actions in the loss mask.
    #[error("step_rewards: expected one per action ({actions} runs of 1s in the loss mask), got {rewards}")]
    StepCount {
        /// Runs of 1s in the loss mask.
        actions: usize,
        /// Step rewards given.
        rewards: usize,
    },
}

/// Maximal runs of non-zero entries of a loss mask (the mask binarised), in order.
pub fn mask_runs(mask: &[u8]) -> Vec<Span> {
    let mut runs = Vec::new();
    let mut start = None;
    for (i, &m) in mask.iter().enumerate() {
        match (m != 0, start) {
            (true, None) => start = Some(i),
            (false, Some(s)) => {
                runs.push(Span { start: s, end: i });
                start = None;
            }
            _ => {}
        }
    }
    if let Some(s) = start {
        runs.push(Span { start: s, end: mask.len() });
    }
    runs
}

/// A rollout's scalar advantage on every policy token, 0 elsewhere.
pub fn broadcast(mask: &[u8], value: f64) -> Vec<f32> {
    mask.iter().map(|&m| if m != 0 { value as f32 } else { 0.0 }).collect()
}

/// `x − nanmean(xs)`, divided by `σ + eps` when `scale = Some((σ, eps))`; NaN in or out → 0.
///
/// NaN marks a member that takes no part (unscorable, or without the segment);
/// with σ NaN (fewer than two members) every advantage is 0.
pub fn center_scale(xs: &[f64], scale: Option<(f64, f64)>) -> Vec<f64> {
    let mean = nanmean(xs);
    xs.iter()
        .map(|x| {
            let centred = x - mean;
            let a = match scale {
                Some((sigma, eps)) => centred / (sigma + eps),
                None => centred,
            };
            if a.is_nan() {
                0.0
            } else {
                a
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_of_a_mask() {
        let s = |start, end| Span { start, end };
        assert_eq!(mask_runs(&[0, 1, 1, 0, 0, 1, 2, 0, 1]), vec![s(1, 3), s(5, 7), s(8, 9)]);
        assert!(mask_runs(&[0, 0]).is_empty());
        assert!(mask_runs(&[]).is_empty());
    }

    #[test]
    fn center_scale_by_hand() {
        // mean = 2, σ = 1 → (1−2)/(1+0)=−1, NaN→0, (3−2)/1 = 1
        assert_eq!(center_scale(&[1.0, f64::NAN, 3.0], Some((1.0, 0.0))), vec![-1.0, 0.0, 1.0]);
        // one member: σ NaN → 0
        assert_eq!(center_scale(&[5.0], Some((f64::NAN, 1e-4))), vec![0.0]);
    }
}
