//! Properties of every estimator: no credit outside the loss mask, SLCA keeps its segments apart, GRPO groups sum to 0.
use proptest::prelude::*;
use rlmesh_core::advantage::grpo::{grpo_advantages, ScaleRewards};
use rlmesh_core::advantage::slca::{slca_advantages, slca_segments, SlcaParams, SlcaRollout};
use rlmesh_core::offline::advantages_json;
use serde_json::{json, Value};

/// One rollout: loss mask, a reward (None: unscorable), a second score, a flag.
type Rollout = (Vec<u8>, Option<f64>, f64, bool);

fn mask() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(0u8..=1, 0..12)
}

fn group() -> impl Strategy<Value = Vec<Rollout>> {
    prop::collection::vec((mask(), prop::option::of(-2.0f64..2.0), -2.0f64..2.0, any::<bool>()), 1..6)
}

fn check_zero_outside(out: &Value, groups: &[Vec<Rollout>]) -> Result<(), TestCaseError> {
    for (g, group) in groups.iter().enumerate() {
        for (i, (m, ..)) in group.iter().enumerate() {
            let adv = out["advantages"][g][i].as_array().unwrap();
            prop_assert_eq!(adv.len(), m.len());
            for (a, bit) in adv.iter().zip(m) {
                if *bit == 0 {
                    prop_assert_eq!(a.as_f64(), Some(0.0));
                }
            }
        }
    }
    Ok(())
}

proptest! {
    #[test]
    fn advantages_are_zero_outside_the_loss_mask(groups in prop::collection::vec(group(), 1..4), estimator in 0usize..6) {
        let rollouts: Vec<Vec<Value>> = groups
            .iter()
            .map(|g| {
                g.iter()
                    .map(|(m, r, s, flag)| {
                        let runs = rlmesh_core::advantage::mask_runs(m).len();
                        json!({
                            "loss_mask": m, "rewards": [r], "process": s, "summary": r.unwrap_or(0.0), "total": s + r.unwrap_or(0.0),
                            "no_call": flag, "step_rewards": vec![*s; runs],
                            "values": vec![0.1 * s; m.len()], "logprobs": vec![-1.0; m.len()], "ref_logprobs": vec![-1.5; m.len()]
                        })
                    })
                    .collect()
            })
            .collect();
        let (name, params) = [
            ("grpo", json!({"scale_rewards": "group"})),
            ("grpo", json!({"scale_rewards": "batch"})),
            ("dr_grpo", json!({})),
            ("rloo", json!({})),
            ("slca", json!({"w_process": 0.7})),
            ("steptool", json!({"kl_coef": 0.2})),
        ][estimator].clone();
        let out = advantages_json(&json!({"estimator": name, "params": params, "groups": rollouts})).unwrap();
        check_zero_outside(&out, &groups)?;
        if name == "steptool" {
            let as_returns = json!({"advantages": out["returns"]});
            check_zero_outside(&as_returns, &groups)?;
        }
    }

    #[test]
    fn slca_keeps_process_and_summary_advantages_apart(group in group(), w in 0.1f64..3.0) {
        let rollouts: Vec<SlcaRollout<'_>> = group
            .iter()
            .map(|(m, r, s, flag)| SlcaRollout { loss_mask: m, process: *s, summary: r.unwrap_or(0.5), total: s + 0.1, no_call: *flag })
            .collect();
        // with w_summary = 0 no summary token carries anything; with w_process = 0 no process token does
        let no_summary = slca_advantages(&rollouts, &SlcaParams { w_process: w, w_summary: 0.0, norm_by_std: true });
        let no_process = slca_advantages(&rollouts, &SlcaParams { w_process: 0.0, w_summary: w, norm_by_std: true });
        for (i, (m, ..)) in group.iter().enumerate() {
            let seg = slca_segments(m);
            if let Some(s) = seg.summary {
                prop_assert!(no_summary[i][s.start..s.end].iter().all(|a| *a == 0.0));
            }
            for s in &seg.process {
                prop_assert!(no_process[i][s.start..s.end].iter().all(|a| *a == 0.0));
            }
            // and each segment carries one value throughout
            let both = slca_advantages(&rollouts, &SlcaParams::default());
            for span in seg.process.iter().chain(seg.summary.iter()) {
                let first = both[i][span.start];
                prop_assert!(both[i][span.start..span.end].iter().all(|a| *a == first));
            }
        }
    }

    #[test]
    fn grpo_group_advantages_sum_to_zero(rewards in prop::collection::vec(-5.0f64..5.0, 2..10), scale in 0usize..2) {
        let sigma = rlmesh_core::reward::combine::nanstd(&rewards);
        prop_assume!(sigma > 1e-6);
        let scale = [ScaleRewards::Group, ScaleRewards::None][scale];
        let a = grpo_advantages(&[rewards], scale);
        let sum: f64 = a[0].iter().sum();
        prop_assert!(sum.abs() < 1e-9, "sum {}", sum);
    }
}
