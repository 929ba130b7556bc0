//! Combining several reward functions the way TRL's GRPO trainer does, NaN-aware.
//!
//! Each function gives a value or `None` per rollout: a matrix (N, F) with
//! NaN for `None`. A rollout's reward is `nansum(w ⊙ row)`; a row where every
//! function is `None` is unscorable (NaN), and the advantage estimators turn
//! it into a zero advantage. Mean and standard deviation per function are
//! logged.
//!
//! ```
//! use rlmesh_core::reward::combine::combine_rewards;
//! let r = combine_rewards(&[vec![Some(1.0), None], vec![None, None]], &[0.5, 2.0]);
//! assert_eq!(r[0], 0.5);
//! assert!(r[1].is_nan());
//! ```

/// Mean and standard deviation of one reward function over a batch.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FunctionStats {
    /// `nanmean` over the rollouts it scored (NaN when it scored none).
    pub mean: f64,
    /// `nanstd`, Bessel-corrected (NaN with fewer than 2 values).
    pub std: f64,
}

/// Weighted NaN-aware sum per row; NaN for a row where every function is `None`.
///
/// # Panics
/// When a row's length differs from `weights`' length.
pub fn combine_rewards(matrix: &[Vec<Option<f64>>], weights: &[f64]) -> Vec<f64> {
    matrix
        .iter()
        .map(|row| {
            assert_eq!(row.len(), weights.len(), "one weight per reward function");
            if row.iter().all(Option::is_none) {
                f64::NAN
            } else {
                row.iter().zip(weights).filter_map(|(v, w)| v.map(|v| v * w)).sum()
            }
        })
        .collect()
}

/// Mean of the non-NaN values (NaN when there are none).
pub fn nanmean(xs: &[f64]) -> f64 {
    let (sum, n) = xs.iter().filter(|x| !x.is_nan()).fold((0.0, 0usize), |(s, n), x| (s + x, n + 1));
    if n == 0 {
        f64::NAN
    } else {
        sum / n as f64
    }
}

/// Bessel-corrected standard deviation of the non-NaN values (NaN with fewer than 2).
pub fn nanstd(xs: &[f64]) -> f64 {
    let present: Vec<f64> = xs.iter().copied().filter(|x| !x.is_nan()).collect();
    if present.len() < 2 {
        return f64::NAN;
    }
    let mean = nanmean(&present);
    let var = present.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / (present.len() - 1) as f64;
    var.sqrt()
}

/// Mean and std of each reward function (column) over the batch.
pub fn per_function_stats(matrix: &[Vec<Option<f64>>]) -> Vec<FunctionStats> {
    let columns = matrix.first().map_or(0, Vec::len);
    (0..columns)
        .map(|f| {
            let col: Vec<f64> = matrix.iter().map(|row| row.get(f).copied().flatten().unwrap_or(f64::NAN)).collect();
            FunctionStats { mean: nanmean(&col), std: nanstd(&col) }
        })
        .collect()
}
