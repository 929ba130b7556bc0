//! A rollout's total over named reward functions: TRL's NaN-aware weighted
//! sum, where "does not apply" is left out and "could not score" makes the
//! rollout unscorable — never 0.
use rlmesh_core::reward::combine::combine_rewards;
use rlmesh_core::reward::functions::{combine_row, combine_scores, RewardFunction, Score, Unscorable};

fn functions() -> Vec<RewardFunction> {
    vec![RewardFunction::new("process", 1.0), RewardFunction::new("verifier:math", 0.5), RewardFunction::new("env:files", 2.0)]
}

#[test]
fn values_add_with_their_weights_and_not_applicable_is_left_out() {
    let f = functions();
    assert_eq!(combine_row(&f, &[Score::Value(0.4), Score::Value(1.0), Score::Value(0.25)]), Ok(0.4 + 0.5 + 0.5));
    assert_eq!(combine_row(&f, &[Score::Value(0.4), Score::NotApplicable, Score::Value(0.25)]), Ok(0.9));
    // A NaN value is TRL's None.
    assert_eq!(combine_row(&f, &[Score::Value(0.4), Score::Value(f64::NAN), Score::NotApplicable]), Ok(0.4));
    // No function applies: NaN (a zero advantage later), as in TRL — not unscorable.
    assert!(combine_row(&f, &[Score::NotApplicable, Score::NotApplicable, Score::NotApplicable]).unwrap().is_nan());
}

#[test]
fn the_same_sum_as_combine_rewards() {
    let f = functions();
    let rows = [[Some(0.1), None, Some(1.0)], [None, Some(3.0), None], [Some(-1.0), Some(2.0), Some(0.5)]];
    let weights: Vec<f64> = f.iter().map(|f| f.weight).collect();
    for row in rows {
        let scores: Vec<Score> = row.iter().map(|v| Score::from(*v)).collect();
        assert_eq!(combine_row(&f, &scores).unwrap(), combine_rewards(&[row.to_vec()], &weights)[0]);
    }
}

#[test]
fn a_failed_function_makes_the_rollout_unscorable_whatever_the_others_say() {
    let f = functions();
    let failed = Score::Unscorable { reason: "the verifier process exited (signal 9)".into() };
    let r = combine_row(&f, &[Score::Value(1.0), failed.clone(), Score::Value(1.0)]);
    assert_eq!(r, Err(Unscorable { function: "verifier:math".into(), reason: "the verifier process exited (signal 9)".into() }));
    let r = combine_row(&f, &[Score::NotApplicable, Score::NotApplicable, failed]);
    assert!(r.is_err(), "unscorable even where nothing else applies");
    let r = combine_row(&f, &[Score::Value(f64::INFINITY), Score::NotApplicable, Score::NotApplicable]);
    assert_eq!(r.unwrap_err().reason, "not a finite number (inf)");
}

#[test]
fn statistics_per_function_leave_out_what_did_not_score() {
    let f = functions();
    let rows = vec![
        vec![Score::Value(1.0), Score::Value(0.0), Score::NotApplicable],
        vec![Score::Value(0.0), Score::Unscorable { reason: "timed out".into() }, Score::NotApplicable],
        vec![Score::Value(0.5), Score::Value(1.0), Score::NotApplicable],
    ];
    let c = combine_scores(&f, &rows);
    assert_eq!(c.unscorable(), 1);
    assert_eq!(c.totals[0], Ok(1.0));
    assert!(c.totals[1].is_err());
    assert_eq!(c.stats[0].mean, 0.5);
    assert_eq!(c.stats[1].mean, 0.5, "the failed value is not a 0");
    assert!((c.stats[1].std - 0.5f64.sqrt()).abs() < 1e-12);
    assert!(c.stats[2].mean.is_nan() && c.stats[2].std.is_nan());
    assert_eq!(combine_scores(&f, &[]).stats.len(), 3);
}
