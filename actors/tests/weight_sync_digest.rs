//! Weight updates arrive digest-checked: a faithful image loads bit-for-bit, a
//! corrupted one is refused and leaves the receiver's weights untouched.
use rlmesh_actors::weight_sync::{apply, pack, WeightError};
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
    assert_eq!(update.buckets, rlmesh_comm::digest::BucketDigests::of(&update.image, rlmesh_actors::weight_sync::WEIGHT_BUCKET_BYTES));
    assert_eq!(receiver.score(&seqs).unwrap(), before, "a refused update changes nothing");
    let ack = apply(&receiver, &update).unwrap();
    assert_eq!((ack.version, ack.digest), (4, update.digest));
    assert_eq!(receiver.score(&seqs).unwrap(), sender.score(&seqs).unwrap());
    // The wire format carries it unchanged.
    let back: rlmesh_actors::weight_sync::WeightUpdate = rlmesh_core::wire::decode(&rlmesh_core::wire::encode(&update).unwrap()).unwrap();
    assert_eq!(back, update);
}
