//! The loss functions against hand-computed vectors and against the same
//! formulas in PyTorch (tests/oracle/loss_oracle.py) on the same tensors.
//! Aggregation weights and entropies are float32 by design; the rest runs in float64 here.
mod learner_common;

use learner_common::*;
use rlmesh_actors::learner::loss::{self, AdaptiveKl, BatchTotals};
use rlmesh_actors::learner::optim::lr_at;
use rlmesh_actors::learner::{Aggregation, ClipParams, KlEstimator, LrSchedule};
use serde_json::json;
use tch::{Kind, Tensor};

fn t(v: &[f64]) -> Tensor {
    Tensor::from_slice(v).view([1, v.len() as i64])
}

fn close(a: &Tensor, expected: &[f64], tol: f64, what: &str) {
    let got: Vec<f64> = Vec::try_from(a.to_kind(Kind::Double).reshape([-1])).unwrap();
    assert_eq!(got.len(), expected.len(), "{what}: length");
    for (i, (g, e)) in got.iter().zip(expected).enumerate() {
        assert!((g - e).abs() <= tol, "{what}[{i}]: got {g}, expected {e}");
    }
}

#[test]
fn ppo_clip_matches_hand_computed_values_and_gradients() {
    // ρ = [1.5, 0.5, 1.1, 3.0], A = [1, −1, 2, −1], ε_low 0.2, ε_high 0.28, dual clip c = 2:
    //  t0: −min(1.5·1, 1.28·1) = −1.28, clipped high (grad 0)
    //  t1: −min(−0.5, −0.8) = 0.8, clipped low (grad 0); dual: min(0.8, 2) = 0.8
    //  t2: −min(2.2, 2.2) = −2.2, not clipped: d/dlogp (−ρA) = −ρA = −2.2
    //  t3: −min(−3, −1.28) = 3 → dual clip min(3, 2·1) = 2 (constant, grad 0); not counted as clipped
    let logp = t(&[1.5f64.ln(), 0.5f64.ln(), 1.1f64.ln(), 3.0f64.ln()]).set_requires_grad(true);
    let zeros = t(&[0.0; 4]);
    let adv = t(&[1.0, -1.0, 2.0, -1.0]);
    let p = ClipParams { eps_low: 0.2, eps_high: 0.28, dual_clip: Some(2.0), tis_cap: None };
    let terms = loss::ppo_clip(&logp, &zeros, &adv, &p);
    close(&terms.loss, &[-1.28, 0.8, -2.2, 2.0], 1e-12, "loss");
    close(&terms.clipped.to_kind(Kind::Double), &[1.0, 1.0, 0.0, 0.0], 0.0, "clipped");
    terms.loss.sum(Kind::Double).backward();
    close(&logp.grad(), &[0.0, 0.0, -2.2, 0.0], 1e-12, "grad");

    // Truncated IS cap 2.5 instead of the dual clip: t3 → −min(−2.5, −1.28) = 2.5 (capped, grad 0).
    let p = ClipParams { dual_clip: None, tis_cap: Some(2.5), ..p };
    close(&loss::ppo_clip(&logp, &zeros, &adv, &p).loss, &[-1.28, 0.8, -2.2, 2.5], 1e-12, "tis");
}

#[test]
fn kl_estimators_entropy_and_value_loss_match_hand_computed_values() {
    // logp = ln 1.5, ref = 0: k1 = 0.405465108, k2 = ½·0.164401954 = 0.082200977,
    // k3 = e^(−0.405465) + 0.405465 − 1 = 0.666666667 + 0.405465108 − 1 = 0.072131775.
    let logp = t(&[1.5f64.ln()]);
    let r = t(&[0.0]);
    close(&loss::kl_penalty(&logp, &r, KlEstimator::K1), &[0.405465108108], 1e-11, "k1");
    close(&loss::kl_penalty(&logp, &r, KlEstimator::K2), &[0.082200977], 1e-9, "k2");
    close(&loss::kl_penalty(&logp, &r, KlEstimator::K3), &[0.072131775], 1e-9, "k3");
    // Uniform over 4: H = ln 4 = 1.386294361.
    close(&loss::entropy(&Tensor::from_slice(&[0.25f64.ln(); 4]).view([1, 4])), &[4f64.ln()], 1e-6, "entropy");
    // v = 1.0, old 0.5, R 2: v_clip = 0.7, max((−1)², (−1.3)²)/2 = 0.845 (clipped branch: grad 0).
    // v = 0.6, old 0.5, R 2: inside the clip, (−1.4)²/2 = 0.98, grad v − R = −1.4.
    let v = t(&[1.0, 0.6]).set_requires_grad(true);
    let (vl, active) = loss::clipped_value_loss(&v, &t(&[0.5, 0.5]), &t(&[2.0, 2.0]), 0.2);
    close(&vl, &[0.845, 0.98], 1e-12, "value loss");
    close(&active.to_kind(Kind::Double), &[1.0, 0.0], 0.0, "value clip active");
    vl.sum(Kind::Double).backward();
    close(&v.grad(), &[0.0, -1.4], 1e-12, "value grad");
}

#[test]
fn aggregation_weights_adaptive_kl_and_schedule_match_hand_computed_values() {
    // mask [[0,1,1,1],[0,1,0,0]], B = 2, N = 4, L = 8:
    // grpo 1/(3·2) = 1/6 and 1/(1·2) = 1/2; bnpo/dapo 1/4; dr_grpo 1/(2·8) = 1/16.
    let mask = Tensor::from_slice(&[0.0, 1.0, 1.0, 1.0, 0.0, 1.0, 0.0, 0.0]).view([2, 4]);
    let totals = BatchTotals { sequences: 2.0, tokens: 4.0, max_completion_length: 8.0 };
    let w = |m| loss::token_weights(&mask, m, &totals);
    close(&w(Aggregation::Grpo), &[0.0, 1.0 / 6.0, 1.0 / 6.0, 1.0 / 6.0, 0.0, 0.5, 0.0, 0.0], 1e-7, "grpo");
    close(&w(Aggregation::Bnpo), &[0.0, 0.25, 0.25, 0.25, 0.0, 0.25, 0.0, 0.0], 1e-7, "bnpo");
    close(&w(Aggregation::Dapo), &[0.0, 0.25, 0.25, 0.25, 0.0, 0.25, 0.0, 0.0], 1e-7, "dapo");
    close(&w(Aggregation::DrGrpo), &[0.0, 0.0625, 0.0625, 0.0625, 0.0, 0.0625, 0.0, 0.0], 1e-7, "dr_grpo");
    // β 0.3, target 6, horizon 10000; KL 12 over 256 sequences: error clip(12/6 − 1) = 0.2,
    // β·(1 + 0.2·256/10000) = 0.3·1.00512 = 0.301536. KL 5.4: error −0.1 → 0.3·0.99744 = 0.299232.
    let mut c = AdaptiveKl { value: 0.3, target: 6.0, horizon: 10000.0 };
    c.update(12.0, 256.0);
    assert!((c.value - 0.301536).abs() < 1e-12, "{}", c.value);
    let mut c = AdaptiveKl { value: 0.3, target: 6.0, horizon: 10000.0 };
    c.update(5.4, 256.0);
    assert!((c.value - 0.299232).abs() < 1e-12, "{}", c.value);
    // Warm-up 10 to 1e-3, then cosine to step 110: 0, 5e-4, 1e-3, 5e-4 (half way), 0.
    let cos = LrSchedule::Cosine { total_steps: 110 };
    for (step, lr) in [(0, 0.0), (5, 5e-4), (10, 1e-3), (60, 5e-4), (110, 0.0)] {
        assert!((lr_at(1e-3, 10, cos, step) - lr).abs() < 1e-15, "step {step}");
    }
    assert_eq!(lr_at(1e-3, 10, LrSchedule::Constant, 500), 1e-3);
}

#[test]
fn losses_and_gradients_match_pytorch_on_random_tensors() {
    let mut r = Rng(5);
    let (b, n) = (3usize, 7usize);
    let mut rand = |lo: f64, hi: f64| (0..b * n).map(|_| lo + r.next() * (hi - lo)).collect::<Vec<f64>>();
    let logp = rand(-3.0, -0.5);
    let behaviour: Vec<f64> = logp.iter().zip(rand(-0.6, 0.6)).map(|(l, d)| l + d).collect();
    let refl: Vec<f64> = logp.iter().zip(rand(-0.5, 0.5)).map(|(l, d)| l + d).collect();
    let adv = rand(-1.5, 1.5);
    let (values, old, returns) = (rand(-1.0, 1.0), rand(-1.0, 1.0), rand(-2.0, 2.0));
    let mask: Vec<f64> = (0..b * n).map(|i| ((i % n) >= 2 && (i % 5) != 0) as u8 as f64).collect();
    let rows = |v: &[f64]| v.chunks(n).map(<[f64]>::to_vec).collect::<Vec<_>>();
    let clip = ClipParams { eps_low: 0.2, eps_high: 0.28, dual_clip: Some(3.0), tis_cap: Some(2.0) };
    let (beta, vclip, vcoef) = (0.04, 0.2, 0.1);
    let peer = rlmesh_actors::learner::bench::run_peer(
        &python(),
        &oracle_script(),
        "formulas",
        &json!({
            "logp": rows(&logp), "behaviour": rows(&behaviour), "ref": rows(&refl), "adv": rows(&adv), "mask": rows(&mask),
            "values": rows(&values), "old_values": rows(&old), "returns": rows(&returns),
            "config": {"clip": clip, "aggregation": "grpo", "max_completion_length": 9,
                       "kl": {"estimator": "k3", "beta": beta}, "value": {"clip": vclip, "coef": vcoef}}
        }),
    )
    .unwrap();
    let m = |v: &[f64]| Tensor::from_slice(v).view([b as i64, n as i64]);
    let lp = m(&logp).set_requires_grad(true);
    let vals = m(&values).set_requires_grad(true);
    let terms = loss::ppo_clip(&lp, &m(&behaviour), &m(&adv), &clip);
    assert!(max_diff(&terms.loss, &tensor2(&peer["pg"])) < 1e-12);
    assert!(max_diff(&terms.ratio, &tensor2(&peer["ratio"])) < 1e-12);
    assert!(max_diff(&terms.clipped.to_kind(Kind::Double), &tensor2(&peer["clipped"]).to_kind(Kind::Double)) == 0.0);
    for (est, key) in [(KlEstimator::K1, "k1"), (KlEstimator::K2, "k2"), (KlEstimator::K3, "k3")] {
        assert!(max_diff(&loss::kl_penalty(&lp, &m(&refl), est), &tensor2(&peer[key])) < 1e-12, "{key}");
    }
    let totals = BatchTotals { sequences: b as f64, tokens: mask.iter().sum(), max_completion_length: 9.0 };
    for (mode, key) in [(Aggregation::Grpo, "grpo"), (Aggregation::Bnpo, "bnpo"), (Aggregation::Dapo, "dapo"), (Aggregation::DrGrpo, "dr_grpo")] {
        assert!(max_diff(&loss::token_weights(&m(&mask), mode, &totals), &tensor2(&peer["weights"][key])) < 1e-8, "{key}");
    }
    let (vl, _) = loss::clipped_value_loss(&vals, &m(&old), &m(&returns), vclip);
    assert!(max_diff(&vl, &tensor2(&peer["value"])) < 1e-12);
    let w = loss::token_weights(&m(&mask), Aggregation::Grpo, &totals);
    let total = (&terms.loss * &w).sum(Kind::Double) + (loss::kl_penalty(&lp, &m(&refl), KlEstimator::K3) * &w).sum(Kind::Double) * beta
        + (&vl * &w).sum(Kind::Double) * vcoef;
    assert!((total.double_value(&[]) - peer["loss"].as_f64().unwrap()).abs() < 1e-7);
    total.backward();
    assert!(max_diff(&lp.grad(), &tensor2(&peer["grad_logp"])) < 1e-7);
    assert!(max_diff(&vals.grad(), &tensor2(&peer["grad_values"])) < 1e-7);
}
