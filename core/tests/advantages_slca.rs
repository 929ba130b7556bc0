//! SLCA-GRPO segments and advantages, by hand.
use rlmesh_core::advantage::slca::{slca_advantages, slca_segments, Segments, SlcaParams, SlcaRollout};
use rlmesh_core::Span;

fn r(mask: &[u8], process: f64, summary: f64, total: f64, no_call: bool) -> SlcaRollout<'_> {
    SlcaRollout { loss_mask: mask, process, summary, total, no_call }
}

fn assert_close(got: &[f32], want: &[f64]) {
    assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
    for (g, w) in got.iter().zip(want) {
        assert!((f64::from(*g) - w).abs() < 1e-6, "{got:?} vs {want:?}");
    }
}

#[test]
fn segments_from_the_mask() {
    let s = |start, end| Span { start, end };
    // two runs: the last is the summary, the first the process
    assert_eq!(slca_segments(&[0, 1, 1, 0, 1]), Segments { process: vec![s(1, 3)], summary: Some(s(4, 5)) });
    // one run: summary only
    assert_eq!(slca_segments(&[0, 1, 1]), Segments { process: vec![], summary: Some(s(1, 3)) });
    // no policy token: nothing
    assert_eq!(slca_segments(&[0, 0]), Segments { process: vec![], summary: None });
    // three runs: the first two together are the process segment
    assert_eq!(slca_segments(&[1, 0, 1, 0, 1]).process, vec![s(0, 1), s(2, 3)]);
}

#[test]
fn group_with_penalty_and_weights() {
    let (m0, m1, m2) = ([0, 1, 1, 0, 0, 1, 1, 1], [0, 1, 0, 1, 1], [0, 1, 1, 1]);
    let group = [r(&m0, 0.8, 0.75, 1.55, false), r(&m1, 0.4, 0.25, 0.65, false), r(&m2, 0.0, 0.9, -0.5, true)];
    let a = slca_advantages(&group, &SlcaParams { w_process: 2.0, w_summary: 0.5, norm_by_std: true });
    // process present in 0 and 1: p = [0.8, 0.4], mean 0.6, std sqrt(0.08/1) = 0.2828427125
    //   A_p = ±0.2/(0.2828427125 + 1e-6) · 2 = ±1.4142085624
    // summary present in all; rollout 2 penalised (no_call): q ← z = −0.5
    //   q = [0.75, 0.25, −0.5], mean 1/6, std sqrt(0.7916667/2) = 0.6291528696
    //   A_q = (q − 1/6)/(0.6291528696 + 1e-6) · 0.5 = [0.4635855881, 0.0662265126, −0.5298121007]
    let (p, q0, q1, q2) = (1.414_208_562_390_772_5, 0.463_585_588_131_831_2, 0.066_226_512_590_261_6, -0.529_812_100_722_092_7);
    assert_close(&a[0], &[0.0, p, p, 0.0, 0.0, q0, q0, q0]);
    assert_close(&a[1], &[0.0, -p, 0.0, q1, q1]);
    assert_close(&a[2], &[0.0, q2, q2, q2]);
}

#[test]
fn only_one_rollout_with_a_process_segment() {
    let (m0, m1) = ([1, 0, 1], [1, 1]);
    let a = slca_advantages(&[r(&m0, 0.9, 1.0, 1.9, false), r(&m1, 0.1, 0.0, 0.1, false)], &SlcaParams::default());
    // process present once → 0; summary q = [1, 0]: mean 0.5, std sqrt(0.5) → ±0.5/(0.7071068 + 1e-6) = ±0.7071058
    assert_close(&a[0], &[0.0, 0.0, 0.707_105_781_2]);
    assert_close(&a[1], &[-0.707_105_781_2, -0.707_105_781_2]);
}

#[test]
fn negative_total_overrides_process_and_summary() {
    let (m0, m1) = ([1, 0, 1], [1, 0, 1]);
    let a = slca_advantages(&[r(&m0, 0.9, 0.9, -0.2, false), r(&m1, 0.5, 0.5, 1.0, false)], &SlcaParams::default());
    // z < 0 on rollout 0: p ← 0, q ← −0.2
    // p = [0, 0.5]: mean 0.25, std 0.3535534 → ∓0.25/0.3535544 = ∓0.7071048
    // q = [−0.2, 0.5]: mean 0.15, std 0.4949747 → ∓0.35/0.4949757 = ∓0.7071054
    assert_close(&a[0], &[-0.707_104_781_2, 0.0, -0.707_105_352_6]);
    assert_close(&a[1], &[0.707_104_781_2, 0.0, 0.707_105_352_6]);
}

#[test]
fn mean_only_normalisation_and_empty_rollouts() {
    let (m0, m1, m2) = ([1, 0, 1], [1, 0, 1], [0, 0, 0]);
    let group = [r(&m0, 1.0, 0.2, 1.2, false), r(&m1, 0.0, 0.6, 0.6, false), r(&m2, 5.0, 5.0, 10.0, false)];
    let a = slca_advantages(&group, &SlcaParams { w_process: 1.0, w_summary: 1.0, norm_by_std: false });
    // rollout 2 has no policy token: absent from both means, all zeros
    // p = [1, 0] → ±0.5; q = [0.2, 0.6] → ∓0.2
    assert_close(&a[0], &[0.5, 0.0, -0.2]);
    assert_close(&a[1], &[-0.5, 0.0, 0.2]);
    assert_close(&a[2], &[0.0, 0.0, 0.0]);
}

#[test]
fn group_of_one_gets_zero() {
    let m = [1, 0, 1];
    assert_close(&slca_advantages(&[r(&m, 0.7, 0.7, 1.4, false)], &SlcaParams::default())[0], &[0.0, 0.0, 0.0]);
}
