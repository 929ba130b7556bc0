//! A rollout process that missed versions is sent the current one over the
//! data plane (controller → node, and learner rank 0 → controller), whose
//! messages are capped at `DATA_CAP` (1 GiB). A wide random model of over
//! 1 GiB in float32 crosses a real data-plane connection under that cap as
//! `DataMsg::Weights` parts, is put together and digest-checked as its parts
//! arrive, and loads into another model bit for bit.
use rlmesh_actors::learner::parallel::digest_tensors;
use rlmesh_actors::node::wire::{DataMsg, DATA_CAP};
use rlmesh_actors::weight_sync::image::{apply, pack};
use rlmesh_actors::weight_sync::parts::{parts, Assemblies, WEIGHT_PART_BYTES};
use rlmesh_mesh::data_plane::{DataPlaneConfig, Inbox, Outbox};
use rlmesh_mesh::frame::FrameCodec;
use rlmesh_model::{ModelConfig, Transformer};
use serde_json::json;
use std::path::Path;
use std::time::{Duration, Instant};
use tch::{Device, Kind};

/// 281 M parameters (a 270 k × 1024 tied embedding and one small layer): 1.13 GB in float32.
fn wide_model(seed: i64) -> Transformer {
    let cfg = json!({"architectures": ["Qwen2ForCausalLM"], "vocab_size": 270_000, "hidden_size": 1024, "intermediate_size": 256,
                     "num_hidden_layers": 1, "num_attention_heads": 8, "num_key_value_heads": 8, "tie_word_embeddings": true});
    tch::manual_seed(seed);
    Transformer::new(ModelConfig::from_json(cfg, Path::new("config.json")).unwrap(), Device::Cpu, Kind::Float)
}

fn digest(model: &Transformer) -> u64 {
    let mut vars: Vec<_> = model.vs.variables().into_iter().collect();
    vars.sort_by(|a, b| a.0.cmp(&b.0));
    digest_tensors(&vars).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_version_over_the_data_message_cap_arrives_in_parts_and_verifies() {
    let (update, sent_digest) = {
        let sender = wide_model(1);
        (pack(&sender, 9), digest(&sender))
    };
    assert!(update.image.len() as u64 > DATA_CAP, "the image ({} bytes) is over one data message's cap", update.image.len());
    let codec = FrameCodec::new(b"catch-up test cookie", DATA_CAP);
    // Short queues: the test holds less in flight (a run uses the defaults).
    let cfg = DataPlaneConfig { high_water_mark: 4, queue: 4, ..DataPlaneConfig::default() };
    let mut inbox: Inbox<DataMsg> = Inbox::bind("tcp://127.0.0.1:0", codec.clone(), &cfg).unwrap();
    let outbox: Outbox<DataMsg> = Outbox::connect(inbox.endpoint(), codec, &cfg).unwrap();
    let t0 = Instant::now();
    let send = tokio::spawn(async move {
        let mut n = 0;
        for part in parts(&update, WEIGHT_PART_BYTES) {
            outbox.send(&DataMsg::Weights { id: 5, part }).await.unwrap();
            n += 1;
        }
        (n, update.digest, outbox)
    });

    let receiver = wide_model(2);
    assert_ne!(digest(&receiver), sent_digest);
    let mut assembling = Assemblies::default();
    let mut received = 0;
    let whole = loop {
        let msg = tokio::time::timeout(Duration::from_secs(120), inbox.recv()).await.expect("the next part within 2 min").expect("inbox open");
        let DataMsg::Weights { id: 5, part } = msg else { panic!("expected a weights part, got {}", msg.name()) };
        assert!(part.bytes.len() <= WEIGHT_PART_BYTES);
        received += 1;
        if let Some(u) = assembling.receive(5, part).unwrap() {
            break u;
        }
    };
    let (sent, digest_sent, _outbox) = send.await.unwrap();
    assert_eq!(received, sent);
    assert!(sent > 16, "{sent} parts");
    let arrived = whole.arrived.as_ref().expect("digested as the parts arrived");
    assert_eq!(arrived.digests.digests.len(), whole.buckets.digests.len());
    let ack = apply(&receiver, &whole).unwrap();
    assert_eq!((ack.version, ack.digest), (9, digest_sent));
    assert_eq!(digest(&receiver), sent_digest, "the receiver holds the sender's parameters");
    eprintln!(
        "{:.2} GB in {sent} parts of ≤ {} MiB in {:.1} s (hashing as they arrived {:.2} s)",
        whole.image.len() as f64 / 1e9,
        WEIGHT_PART_BYTES >> 20,
        t0.elapsed().as_secs_f64(),
        arrived.seconds
    );
}
