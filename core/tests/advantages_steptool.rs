//! StepTool: reward placement, KL, GAE, whitening, upstream weighting, critic-free, by hand.
use rlmesh_core::advantage::steptool::{
    add_kl_penalty, critic_free_advantages, gae, place_step_rewards, steptool_advantages, StepToolParams, StepToolRollout,
};
use rlmesh_core::advantage::AdvantageError;

const MASK: [u8; 6] = [0, 1, 1, 0, 1, 1];

fn assert_close(got: &[f64], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((g - w).abs() < 1e-6, "{got:?} vs {want:?}");
    }
}

#[test]
fn step_rewards_go_on_the_last_token_of_each_action() {
    // actions: tokens 1..3 and 4..6 → rewards on tokens 2 and 5
    assert_eq!(place_step_rewards(&MASK, &[0.5, 1.0], false), Ok(vec![0.0, 0.0, 0.5, 0.0, 0.0, 1.0]));
    // upstream weighting (K − 1 − i) with K = 2: [0.5·1, 1.0·0] — the final reward vanishes
    assert_eq!(place_step_rewards(&MASK, &[0.5, 1.0], true), Ok(vec![0.0, 0.0, 0.5, 0.0, 0.0, 0.0]));
    assert_eq!(place_step_rewards(&MASK, &[1.0], false), Err(AdvantageError::StepCount { actions: 2, rewards: 1 }));
    // no policy token: nothing to credit
    assert_eq!(place_step_rewards(&[0, 0], &[1.0], false), Ok(vec![0.0, 0.0]));
}

#[test]
fn kl_enters_the_reward_on_policy_tokens() {
    let mut r = vec![0.0, 0.0, 0.5, 0.0, 0.0, 1.0];
    let logp = [9.0, -1.0, -2.0, 9.0, -0.5, -0.1];
    let refp = [0.0, -1.2, -1.9, 0.0, -0.5, -0.6];
    add_kl_penalty(&mut r, &MASK, &logp, &refp, 0.1);
    // −0.1·(logp − ref): t1 −0.1·0.2 = −0.02, t2 −0.1·(−0.1) = +0.01, t4 0, t5 −0.1·0.5 = −0.05; t0, t3 untouched
    assert_close(&r, &[0.0, -0.02, 0.51, 0.0, 0.0, 0.95]);
}

#[test]
fn gae_by_hand() {
    let rewards = [0.0, 0.0, 0.5, 0.0, 0.0, 1.0];
    let values = [9.0, 0.1, 0.2, 9.0, 0.3, 0.4]; // 9s lie outside the mask and count as 0
    let (a, ret) = gae(&rewards, &values, &MASK, 0.5, 0.5);
    // γ = λ = 0.5, γλ = 0.25; V = [0, .1, .2, 0, .3, .4]
    // t5: δ = 1 − 0.4 = 0.6                       A5 = 0.6
    // t4: δ = 0.5·0.4 − 0.3 = −0.1                A4 = −0.1 + 0.25·0.6 = 0.05
    // t3: δ = 0.5·0.3 − 0 = 0.15                  A3 = 0.15 + 0.25·0.05 = 0.1625
    // t2: δ = 0.5 + 0.5·0 − 0.2 = 0.3             A2 = 0.3 + 0.25·0.1625 = 0.340625
    // t1: δ = 0.5·0.2 − 0.1 = 0                   A1 = 0.25·0.340625 = 0.08515625
    // t0: δ = 0.5·0.1 − 0 = 0.05                  A0 = 0.05 + 0.25·0.08515625 = 0.0712890625
    assert_close(&a, &[0.071_289_062_5, 0.085_156_25, 0.340_625, 0.1625, 0.05, 0.6]);
    // returns = A + V on policy tokens
    assert_close(&ret, &[0.0, 0.185_156_25, 0.540_625, 0.0, 0.35, 1.0]);
}

#[test]
fn whitened_advantages_and_returns() {
    let rewards = [0.0, 0.0, 0.5, 0.0, 0.0, 1.0];
    let values = [9.0f32, 0.1, 0.2, 9.0, 0.3, 0.4];
    let empty_mask = [0u8, 0];
    let batch = [
        StepToolRollout { loss_mask: &MASK, token_rewards: &rewards, values: &values, logprobs: None },
        StepToolRollout { loss_mask: &empty_mask, token_rewards: &[0.0, 0.0], values: &[1.0, 1.0], logprobs: None },
    ];
    let out = steptool_advantages(&batch, &StepToolParams { gamma: 0.5, lam: 0.5, kl_coef: 0.0, upstream_weighting: false }).unwrap();
    // masked A = [0.08515625, 0.340625, 0.05, 0.6]: mean 0.2689453125, var_unbiased 0.0654835510
    // (A − mean)/sqrt(var + 1e-8) = [−0.7182134, 0.2801109, −0.8555975, 1.2937001]
    let adv: Vec<f64> = out.advantages[0].iter().map(|x| f64::from(*x)).collect();
    assert_close(&adv, &[0.0, -0.718_213_4, 0.280_110_9, 0.0, -0.855_597_5, 1.293_700_1]);
    let ret: Vec<f64> = out.returns[0].iter().map(|x| f64::from(*x)).collect();
    assert_close(&ret, &[0.0, 0.185_156_25, 0.540_625, 0.0, 0.35, 1.0]);
    // the rollout with no policy token gets zeros
    assert_eq!(out.advantages[1], vec![0.0, 0.0]);
    assert_eq!(out.returns[1], vec![0.0, 0.0]);
}

#[test]
fn lengths_must_match_the_mask() {
    let batch = [StepToolRollout { loss_mask: &MASK, token_rewards: &[0.0; 6], values: &[0.0; 5], logprobs: None }];
    assert_eq!(
        steptool_advantages(&batch, &StepToolParams::default()),
        Err(AdvantageError::Length { field: "values", expected: 6, got: 5 })
    );
}

#[test]
fn critic_free_normalises_step_returns_in_the_group() {
    let (m0, m1, m2) = ([1u8, 1, 0, 1], [0u8, 1, 1], [0u8, 0]);
    let group: [(&[u8], &[f64]); 3] = [(&m0, &[0.5, 1.0]), (&m1, &[0.0]), (&m2, &[])];
    let a = critic_free_advantages(&group, 0.5, false).unwrap();
    // γ = 0.5. rollout 0: G1 = 1.0, G0 = 0.5 + 0.5·1.0 = 1.0; rollout 1: G0 = 0; rollout 2: no step
    // pool [1, 1, 0]: mean 2/3, std sqrt(1/3) = 0.5773503
    // (1 − 2/3)/(0.5773503 + 1e-4) = 0.5772503; (0 − 2/3)/0.5774503 = −1.1545006
    let (hi, lo) = (0.577_250_3_f32, -1.154_500_6_f32);
    let near = |got: &[f32], want: &[f32]| got.iter().zip(want).all(|(g, w)| (g - w).abs() < 1e-5) && got.len() == want.len();
    assert!(near(&a[0], &[hi, hi, 0.0, hi]), "{:?}", a[0]);
    assert!(near(&a[1], &[0.0, lo, lo]), "{:?}", a[1]);
    assert_eq!(a[2], vec![0.0, 0.0]);
}
