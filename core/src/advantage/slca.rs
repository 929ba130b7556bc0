//! SLCA-GRPO: segment-level credit — process advantage on tool-call tokens, summary advantage on the final reply.
//!
//! Segments come from the binarised loss mask ([`slca_segments`]): no run of
//! 1s → nothing; one run → it is the summary; k ≥ 2 runs → the last is the
//! summary and the earlier ones together are the process segment.
//!
//! Per rollout: `p` process reward, `q` summary reward, `z` total score, `n`
//! no-call flag. Penalty override: where `n` or `z < 0`, `p ← 0` and `q ← z`.
//! `p` is normalised over the group members that have a process segment, `q`
//! over those with a summary segment: fewer than 2 → 0, else
//! `(x − mean)/(std_unbiased + 1e-6)` (`x − mean` without `norm_by_std`); then
//! multiplied by `w_process`, `w_summary`.
use super::{broadcast, center_scale, mask_runs};
use crate::reward::combine::nanstd;
use crate::trajectory::Span;

/// The `eps` added to the standard deviation.
pub const SLCA_EPS: f64 = 1e-6;

/// One rollout as SLCA reads it.
#[derive(Clone, Copy, Debug)]
pub struct SlcaRollout<'a> {
    /// Loss mask (non-zero = policy token).
    pub loss_mask: &'a [u8],
    /// Process reward `p` (HierR).
    pub process: f64,
    /// Summary reward `q`.
    pub summary: f64,
    /// Total score `z`.
    pub total: f64,
    /// No-call flag `n`.
    pub no_call: bool,
}

/// Weights and normalisation of SLCA.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SlcaParams {
    /// Multiplies the normalised process advantage.
    pub w_process: f64,
    /// Multiplies the normalised summary advantage.
    pub w_summary: f64,
    /// Divide by `std_unbiased + 1e-6` (else only subtract the mean).
    pub norm_by_std: bool,
}

impl Default for SlcaParams {
    fn default() -> Self {
        SlcaParams { w_process: 1.0, w_summary: 1.0, norm_by_std: true }
    }
}

/// A rollout's SLCA segments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Segments {
    /// The runs that form the process (tool-call) segment; empty when absent.
    pub process: Vec<Span>,
    /// The summary run, when there is any policy token.
    pub summary: Option<Span>,
}

/// The segments of a loss mask.
pub fn slca_segments(mask: &[u8]) -> Segments {
    let mut runs = mask_runs(mask);
    let summary = runs.pop();
    Segments { process: runs, summary }
}

/// Per-token SLCA advantages of one group.
pub fn slca_advantages(group: &[SlcaRollout<'_>], params: &SlcaParams) -> Vec<Vec<f32>> {
    let segments: Vec<Segments> = group.iter().map(|r| slca_segments(r.loss_mask)).collect();
    let penalised = |r: &SlcaRollout<'_>| r.no_call || r.total < 0.0;
    let p: Vec<f64> = group
        .iter()
        .zip(&segments)
        .map(|(r, s)| match (s.process.is_empty(), penalised(r)) {
            (true, _) => f64::NAN,
            (false, true) => 0.0,
            (false, false) => r.process,
        })
        .collect();
    let q: Vec<f64> = group
        .iter()
        .zip(&segments)
        .map(|(r, s)| match (s.summary.is_none(), penalised(r)) {
            (true, _) => f64::NAN,
            (false, true) => r.total,
            (false, false) => r.summary,
        })
        .collect();
    let normalise = |xs: &[f64], w: f64| -> Vec<f64> {
        let scale = params.norm_by_std.then(|| (nanstd(xs), SLCA_EPS));
        center_scale(xs, scale).into_iter().map(|a| a * w).collect()
    };
    let (ap, aq) = (normalise(&p, params.w_process), normalise(&q, params.w_summary));
    group
        .iter()
        .zip(&segments)
        .enumerate()
        .map(|(i, (r, s))| {
            let mut out = vec![0.0f32; r.loss_mask.len()];
            for span in &s.process {
                out[span.start..span.end].copy_from_slice(&broadcast(&r.loss_mask[span.start..span.end], ap[i]));
            }
            if let Some(span) = s.summary {
                out[span.start..span.end].copy_from_slice(&broadcast(&r.loss_mask[span.start..span.end], aq[i]));
            }
            out
        })
        .collect()
}
