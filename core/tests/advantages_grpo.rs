//! GRPO (group/batch/none), Dr.GRPO and RLOO advantages, by hand.
use rlmesh_core::advantage::broadcast;
use rlmesh_core::advantage::grpo::{grpo_advantages, rloo_advantages, ScaleRewards};
use rlmesh_core::reward::combine::combine_rewards;


fn assert_close(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-9, "{got:?} vs {want:?}");
    }
}

#[test]
fn group_scaling() {
    // r = [1, 0, 0, 1]: μ = 0.5, σ = sqrt(4·0.25/3) = 0.5773502692
    // A = ±0.5 / (0.5773502692 + 1e-4) = ±0.8658754298
    let a = grpo_advantages(&[vec![1.0, 0.0, 0.0, 1.0]], ScaleRewards::Group);
    let x = 0.5 / ((1.0f64 / 3.0).sqrt() + 1e-4);
    assert_close(&a[0], &[x, -x, -x, x]);
    assert!((x - 0.865_875_429_760_701_6).abs() < 1e-12);
}

#[test]
fn group_of_one_and_equal_rewards_give_zero() {
    // one member: σ NaN → A NaN → 0
    assert_eq!(grpo_advantages(&[vec![0.7]], ScaleRewards::Group), vec![vec![0.0]]);
    // all equal: σ = 0 → (0.5 − 0.5)/(0 + 1e-4) = 0
    assert_eq!(grpo_advantages(&[vec![0.5, 0.5, 0.5]], ScaleRewards::Group), vec![vec![0.0, 0.0, 0.0]]);
    // RLOO group of one → 0
    assert_eq!(rloo_advantages(&[vec![0.7]]), vec![vec![0.0]]);
}

#[test]
fn unscorable_rollouts_take_no_part() {
    // rewards per function: [[1], [None], [0]] → r = [1, NaN, 0]
    let r = combine_rewards(&[vec![Some(1.0)], vec![None], vec![Some(0.0)]], &[1.0]);
    // μ = 0.5, σ = sqrt((0.25 + 0.25)/1) = 0.7071067812 → A = ±0.5/(0.7071067812 + 1e-4) = ±0.7070067953; NaN → 0
    let a = grpo_advantages(std::slice::from_ref(&r), ScaleRewards::Group);
    assert_close(&a[0], &[0.707_006_795_326_683_4, 0.0, -0.707_006_795_326_683_4]);
    // RLOO: 1 − mean{0} = 1, 0 − mean{1} = −1
    assert_close(&rloo_advantages(&[r])[0], &[1.0, 0.0, -1.0]);
}

#[test]
fn batch_scaling_uses_the_batch_std() {
    // batch r = [1, 0, 3, 3]: mean 1.75, Σ(dev²) = 0.5625 + 3.0625 + 1.5625 + 1.5625 = 6.75, σ = sqrt(6.75/3) = 1.5
    // group 0: μ = 0.5 → ±0.5/1.5001 = ±0.3333111126; group 1: μ = 3 → 0
    let a = grpo_advantages(&[vec![1.0, 0.0], vec![3.0, 3.0]], ScaleRewards::Batch);
    assert_close(&a[0], &[0.333_311_112_592_493_85, -0.333_311_112_592_493_85]);
    assert_close(&a[1], &[0.0, 0.0]);
}

#[test]
fn dr_grpo_only_centres() {
    // Dr.GRPO = scale none: r − μ = [0.5, −0.5, −0.5, 0.5]
    assert_close(&grpo_advantages(&[vec![1.0, 0.0, 0.0, 1.0]], ScaleRewards::None)[0], &[0.5, -0.5, -0.5, 0.5]);
}

#[test]
fn rloo_leave_one_out() {
    // A_0 = 1 − (0 + 0 + 1)/3 = 2/3; A_1 = 0 − (1 + 0 + 1)/3 = −2/3
    let a = rloo_advantages(&[vec![1.0, 0.0, 0.0, 1.0]]);
    assert_close(&a[0], &[2.0 / 3.0, -2.0 / 3.0, -2.0 / 3.0, 2.0 / 3.0]);
}

#[test]
fn weighted_functions_then_group() {
    // rows [1, 0.5], [0, None], weights [1, 2] → r = [1 + 1, 0] = [2, 0]
    // μ = 1, σ = sqrt(2) → A = ±1/(1.4142135624 + 1e-4) = ±0.7070567847
    let r = combine_rewards(&[vec![Some(1.0), Some(0.5)], vec![Some(0.0), None]], &[1.0, 2.0]);
    assert_close(&grpo_advantages(&[r], ScaleRewards::Group)[0], &[0.707_056_784_721_831_4, -0.707_056_784_721_831_4]);
}

#[test]
fn negative_rewards_are_centred_like_any_other() {
    // r = [−1, −0.5]: μ = −0.75, σ = sqrt(2·0.0625) = 0.3535533906 → ∓0.25/0.3536533906 = ∓0.7069067
    let a = grpo_advantages(&[vec![-1.0, -0.5]], ScaleRewards::Group);
    let x = 0.25 / (0.125f64.sqrt() + 1e-4);
    assert_close(&a[0], &[-x, x]);
}

#[test]
fn broadcast_puts_the_advantage_on_policy_tokens_only() {
    assert_eq!(broadcast(&[0, 1, 1, 0, 1], 0.5), vec![0.0, 0.5, 0.5, 0.0, 0.5]);
    // a rollout with no policy tokens gets nothing
    assert_eq!(broadcast(&[0, 0], 0.5), vec![0.0, 0.0]);
    assert!(broadcast(&[], 0.5).is_empty());
}
