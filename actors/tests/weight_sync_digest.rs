//! Weight updates arrive digest-checked: a faithful image loads bit-for-bit, a
//! corrupted one is refused and leaves the receiver's weights untouched.
use rlmesh_actors::weight_sync::image::{apply, pack, WeightError};
use rlmesh_model::{ModelConfig, Transformer};
use serde_json::json;
use std::path::Path;
use tch::{Device, Kind};

fn model(seed: i64) -> Transformer {
    let cfg = json!({"architectures": ["LlamaForCausalLM"], "vocab_size": 40, "hidden_size": 16, "intermediate_size": 24,
                     "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "tie_word_embeddings": true});
    tch::manual_seed(seed);
    Transformer::new(ModelConfig::from_json(cfg, Path::new("config.json")).unwrap(), Device::Cpu, Kind::Float)
}

#[test]
fn updates_load_exactly_and_corruption_is_refused() {
    let (sender, receiver) = (model(1), model(2));
    let seqs = vec![vec![1u32, 5, 7, 9, 3]];
    assert_ne!(sender.score(&seqs).unwrap(), receiver.score(&seqs).unwrap());
    let update = pack(&sender, 4);
    let mut bad = update.clone();
    let mid = bad.image.len() - 7;
    bad.image[mid] ^= 0x40;
    let before = receiver.score(&seqs).unwrap();
    match apply(&receiver, &bad) {
        Err(e @ WeightError::Digest { version: 4, bucket: 0, .. }) => assert!(e.to_string().contains("bucket 0") && e.to_string().contains("refused"), "{e}"),
        other => panic!("a corrupted image must be refused, got {other:?}"),
    }
    // The per-bucket digests travel with the update and match a fresh digest of the image.
    assert_eq!(update.buckets, rlmesh_comm::digest::BucketDigests::of(&update.image, rlmesh_actors::weight_sync::image::WEIGHT_BUCKET_BYTES));
    assert_eq!(receiver.score(&seqs).unwrap(), before, "a refused update changes nothing");
    let ack = apply(&receiver, &update).unwrap();
    assert_eq!((ack.version, ack.digest), (4, update.digest));
    assert_eq!(receiver.score(&seqs).unwrap(), sender.score(&seqs).unwrap());
    // The wire format carries it unchanged.
    let back: rlmesh_actors::weight_sync::image::WeightUpdate = rlmesh_core::wire::decode(&rlmesh_core::wire::encode(&update).unwrap()).unwrap();
    assert_eq!(back, update);
}

/// The same refusal through a rollout actor: the version is refused with the
/// bucket named, counted on the process's `rlmesh_weight_sync_digest_failures_total`
/// (what the RlmeshDigestMismatch alert watches), and the next faithful version loads.
#[test]
fn a_rollout_actor_refuses_and_counts_a_corrupted_version() {
    use ractor::Actor;
    use rlmesh_actors::metrics::Metrics;
    use rlmesh_actors::rollout::actor::{RolloutActor, RolloutArgs, RolloutMsg};
    use std::sync::atomic::AtomicU64;
    use std::sync::Arc;
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf();
    let out = std::process::Command::new(root.join("scripts/prepare-models.sh")).output().unwrap();
    assert!(out.status.success());
    let tokenizer = Path::new(String::from_utf8(out.stdout).unwrap().trim().lines().last().unwrap()).join("smollm2-135m");
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("policy");
    model(3).save(&dir, None).unwrap();
    for f in ["tokenizer.json", "tokenizer_config.json"] {
        std::fs::copy(tokenizer.join(f), dir.join(f)).unwrap();
    }
    let metrics = Metrics::new();
    let args = RolloutArgs {
        model_dir: dir,
        tools: vec!["calculator".into()],
        limits: Default::default(),
        config: Default::default(),
        threads: 1,
        device: tch::Device::Cpu,
        panic_on_request: None,
        requests: Arc::new(AtomicU64::new(0)),
        metrics: Some(metrics.clone()),
        label: "rollout-0".into(),
    };
    let rt = tokio::runtime::Runtime::new().unwrap();
    rt.block_on(async {
        let (actor, _) = Actor::spawn(None, RolloutActor, args).await.unwrap();
        let update = pack(&model(4), 7);
        let mut bad = update.clone();
        let mid = bad.image.len() / 2;
        bad.image[mid] ^= 0x01;
        let refused = ractor::call!(actor, RolloutMsg::LoadWeights, bad).unwrap();
        assert!(refused.as_ref().is_err_and(|e| e.contains("digest mismatch") && e.contains("refused")), "{refused:?}");
        assert_eq!(metrics.weight_sync_digest_failures_total.get(), 1);
        assert_eq!(metrics.weight_sync_received_bytes_total.get(), 0, "a refused version's bytes are not counted");
        let ack = ractor::call!(actor, RolloutMsg::LoadWeights, update.clone()).unwrap().unwrap();
        assert_eq!((ack.version, ack.digest), (7, update.digest));
        assert_eq!(metrics.weight_sync_digest_failures_total.get(), 1, "a faithful version is not counted");
        assert_eq!(metrics.weight_sync_received_bytes_total.get(), update.image.len() as u64);
        actor.stop(None);
    });
}
