//! `gpu_check nccl-pair`'s learner steps on the pair's NCCL group (two
//! processes on one GPU): one float32 unsharded step, as before, then the
//! 7B-class configuration on the same group — `dtype = "bf16"` with float32
//! master weights, `shard = "gradients"` (reduce-scatter, AdamW state split
//! in two) and `checkpoint_activations` — for a few timed steps. Both ranks'
//! parameter digests must agree after each, and each rank holds half the
//! optimizer state the unsharded learner held.
use rlmesh_actors::learner::bench::{bench_config, synthetic_batch};
use rlmesh_actors::learner::{Learner, LearnerConfig, Precision, Shard};
use rlmesh_comm::{Collective, NcclComm};
use rlmesh_model::Transformer;
use serde_json::{json, Value};
use std::path::Path;
use std::time::Instant;
use tch::{Device, Kind};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

/// Timed steps of the sharded bf16 learner.
const SHARDED_STEPS: usize = 3;

/// Runs both learners on `comm` and reports them as JSON fields of the rank's line.
pub fn pair_learner_steps(model_dir: &Path, dev: Device, comm: NcclComm) -> Res<Value> {
    let model = Transformer::load(model_dir, dev, Some(Kind::Float))?;
    let batch = synthetic_batch(model.config.vocab_size, 8, 64, 16, 1);
    let mut plain = Learner::new(model, bench_config(8), Some(Box::new(comm) as Box<dyn Collective>))?;
    let loss = plain.train_step(&batch)?.loss;
    let digest = format!("{:016x}", plain.parameter_digest()?);
    let whole = plain.optimizer_state_bytes();
    println!("learner step, world 2 on one GPU: loss {loss:.6}, parameter digest {digest}");
    let comm = plain.take_comm();
    drop(plain);

    let config = LearnerConfig { dtype: Some(Precision::Bf16), shard: Shard::Gradients, checkpoint_activations: true, ..bench_config(8) };
    let model = Transformer::load(model_dir, dev, Some(config.precision_on(dev).kind()))?;
    let mut sharded = Learner::new(model, config, comm)?;
    let (mut losses, mut seconds, mut digests) = (vec![], vec![], vec![]);
    for _ in 0..SHARDED_STEPS {
        let t = Instant::now();
        let stats = sharded.train_step(&batch)?;
        seconds.push(t.elapsed().as_secs_f64());
        losses.push(stats.loss);
        digests.push(format!("{:016x}", sharded.parameter_digest()?));
    }
    let held = sharded.optimizer_state_bytes();
    // The same weights and batch: the first bf16 loss is the float32 one up to bf16 rounding.
    let first_close = ((losses[0] - loss) / loss.abs().max(1e-3)).abs() < 0.02;
    println!(
        "bf16 + shard gradients + checkpointing: losses {losses:.5?}, step seconds {seconds:.3?}, optimizer state {held} bytes (unsharded float32 {whole})"
    );
    Ok(json!({"learner_loss": loss, "learner_digest": digest, "sharded_losses": losses, "sharded_step_s": seconds,
              "sharded_digests": digests, "optimizer_bytes": held, "optimizer_bytes_unsharded": whole, "sharded_first_loss_close": first_close}))
}
