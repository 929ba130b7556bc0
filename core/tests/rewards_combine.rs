//! TRL-style combination of several reward functions, by hand.
use rlmesh_core::reward::combine::{combine_rewards, nanmean, nanstd, per_function_stats, FunctionStats};

#[test]
fn nansum_with_weights_and_unscorable_rows() {
    let m = vec![vec![Some(1.0), None], vec![Some(0.5), Some(0.5)], vec![None, None]];
    let r = combine_rewards(&m, &[1.0, 2.0]);
    // row 0: 1·1 = 1; row 1: 1·0.5 + 2·0.5 = 1.5; row 2: all None → NaN
    assert_eq!(&r[..2], &[1.0, 1.5]);
    assert!(r[2].is_nan());
}

#[test]
fn per_function_mean_and_std() {
    let m = vec![vec![Some(1.0), None], vec![Some(0.5), Some(0.5)], vec![None, None]];
    let s = per_function_stats(&m);
    // f0: mean (1 + 0.5)/2 = 0.75, std sqrt((0.25² + 0.25²)/1) = sqrt(0.125)
    assert_eq!(s[0], FunctionStats { mean: 0.75, std: 0.125f64.sqrt() });
    // f1: one value → mean 0.5, std NaN
    assert_eq!(s[1].mean, 0.5);
    assert!(s[1].std.is_nan());
}

#[test]
fn nan_aware_statistics() {
    // [1, 3]: mean 2, std sqrt((1 + 1)/1) = sqrt(2)
    assert_eq!(nanmean(&[1.0, f64::NAN, 3.0]), 2.0);
    assert_eq!(nanstd(&[1.0, f64::NAN, 3.0]), 2f64.sqrt());
    assert!(nanmean(&[f64::NAN]).is_nan());
    assert!(nanstd(&[4.0]).is_nan());
}
