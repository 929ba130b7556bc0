//! Weight updates arrive digest-checked: a faithful image loads bit-for-bit, a
//! corrupted one is refused and leaves the receiver's weights untouched.
use rlmesh_actors::weight_sync::image::{apply, pack, DeviceImage, WeightError};
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
        servers: vec![],
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
        // An image that arrived on the GPU (an NCCL receiver's; a CPU tensor here) with a
        // bucket whose device digest differed is refused and counted the same way.
        let mut on_device = pack(&model(5), 8);
        let held = tch::Tensor::from_slice(&std::mem::take(&mut on_device.image));
        on_device.on_device = Some(DeviceImage::new(held, Some((3, 0xaa, 0xbb))));
        let refused = ractor::call!(actor, RolloutMsg::LoadWeights, on_device.clone()).unwrap();
        assert!(refused.as_ref().is_err_and(|e| e.contains("v8: digest mismatch in bucket 3") && e.contains("refused")), "{refused:?}");
        assert_eq!(metrics.weight_sync_digest_failures_total.get(), 2);
        on_device.on_device = Some(DeviceImage::new(on_device.on_device.unwrap().bytes.lock().unwrap().shallow_clone(), None));
        let ack = ractor::call!(actor, RolloutMsg::LoadWeights, on_device.clone()).unwrap().unwrap();
        assert_eq!((ack.version, ack.digest), (8, on_device.digest));
        assert_eq!(metrics.weight_sync_received_bytes_total.get(), (update.image.len() + on_device.buckets.len) as u64);
        actor.stop(None);
    });
}

fn free_addr() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().to_string()
}

/// The weight-sync group of three processes' members (threads here) on the
/// loopback ring: rank 0's version reaches both receivers with its digests,
/// and loads into a model exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_weight_sync_group_broadcasts_a_version_along_the_ring() {
    use rlmesh_actors::node::weights::{GroupSpec, WeightGroup};
    let addr = free_addr();
    let members: Vec<WeightGroup> = (0..3).map(|rank| WeightGroup::join(&GroupSpec { rank, world: 3, addr: addr.clone(), epoch: 0, nccl: false }, "test-cookie", None, None)).collect();
    // One sender, compared with itself below: libtorch's generator is shared by the
    // tests' threads, so a second `model(3)` need not draw the same weights.
    let sender = model(3);
    let update = pack(&sender, 7);
    let (a, b) = (members[1].receive(), members[2].receive());
    let sent = members[0].send(update.clone()).wait().await.unwrap();
    assert!(sent > 0.0);
    for got in [a.wait().await.unwrap(), b.wait().await.unwrap()] {
        assert_eq!((got.version, got.digest, &got.buckets, &got.image), (7, update.digest, &update.buckets, &update.image));
        let receiver = model(4);
        assert_eq!(apply(&receiver, &got).unwrap().digest, update.digest);
        let seqs = vec![vec![2u32, 4, 6]];
        assert_eq!(receiver.score(&seqs).unwrap(), sender.score(&seqs).unwrap());
    }
}

/// A group asked to move weights over NCCL where members cannot (here: no GPU)
/// fails on every member at once, saying how many cannot and why, instead of
/// leaving the others waiting in NCCL's bootstrap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_nccl_weight_group_whose_members_cannot_use_nccl_fails_on_every_member() {
    use rlmesh_actors::node::weights::{GroupSpec, WeightGroup};
    let addr = free_addr();
    let t = std::time::Instant::now();
    let members: Vec<WeightGroup> = (0..3).map(|rank| WeightGroup::join(&GroupSpec { rank, world: 3, addr: addr.clone(), epoch: 0, nccl: true }, "test-cookie", None, None)).collect();
    let (a, b) = (members[1].receive(), members[2].receive());
    let errors = [members[0].send(pack(&model(3), 1)).wait().await.unwrap_err(), a.wait().await.unwrap_err(), b.wait().await.unwrap_err()];
    for (rank, e) in errors.iter().enumerate() {
        assert!(e.contains(&format!("rank {rank}")) && e.contains("3 of 3 members cannot use NCCL") && e.contains("computes on the CPU"), "{e}");
    }
    assert!(t.elapsed() < std::time::Duration::from_secs(30), "failed at once, not after the group's timeout: {:?}", t.elapsed());
}

/// The path an NCCL receiver takes, on the CPU: the image in a `Uint8` tensor
/// (there on the GPU, checked bucket by bucket as it arrived) loads through
/// views into it, exactly; a malformed image is refused by name, never a panic.
#[test]
fn an_image_held_in_a_tensor_loads_exactly_and_a_malformed_one_is_refused() {
    use rlmesh_actors::weight_sync::image::load_tensor;
    let (sender, receiver) = (model(5), model(6));
    let seqs = vec![vec![3u32, 1, 4, 1, 5]];
    let mut update = pack(&sender, 9);
    let held = tch::Tensor::from_slice(&update.image);
    update.on_device = Some(DeviceImage::new(held.shallow_clone(), None));
    let image = std::mem::take(&mut update.image);
    let ack = apply(&receiver, &update).unwrap();
    assert_eq!((ack.version, ack.digest), (9, update.digest));
    assert_eq!(receiver.score(&seqs).unwrap(), sender.score(&seqs).unwrap());

    let fresh = model(7);
    let before = fresh.score(&seqs).unwrap();
    let n = u64::from_le_bytes(image[..8].try_into().unwrap()) as usize;
    let refuse = |bytes: Vec<u8>, want: &str| {
        let e = load_tensor(&fresh, &tch::Tensor::from_slice(&bytes), 9, 0).unwrap_err().to_string();
        assert!(e.starts_with("weight update v9: ") && e.contains(want), "{want}: {e}");
    };
    refuse(image[..5].to_vec(), "has no safetensors header");
    refuse(image[..8 + n / 2].to_vec(), "safetensors header of");
    refuse(image[..image.len() - 4].to_vec(), "past the image's");
    refuse([&image[..], &[0u8; 8]].concat(), "the image at");
    let header = String::from_utf8(image[8..8 + n].to_vec()).unwrap();
    refuse([&image[..8], header.replacen("F32", "I32", 1).as_bytes(), &image[8 + n..]].concat(), "is not the next float32 tensor");
    let mut garbled = image.clone();
    garbled[8] = b'[';
    refuse(garbled, "safetensors header:");
    assert_eq!(fresh.score(&seqs).unwrap(), before, "a refused image changes nothing");
}

/// `pack` writes each parameter straight into its place in the image; the
/// image must be, byte for byte, the file the safetensors crate itself
/// serialises from the same float32 tensors (the independent oracle), for a
/// float32 model and for a bfloat16 one (widened to float32 as it is copied).
#[test]
fn a_packed_image_is_the_file_safetensors_writes() {
    let cfg = json!({"architectures": ["LlamaForCausalLM"], "vocab_size": 40, "hidden_size": 16, "intermediate_size": 24,
                     "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "tie_word_embeddings": false});
    for kind in [Kind::Float, Kind::BFloat16] {
        tch::manual_seed(3);
        let m = Transformer::new(ModelConfig::from_json(cfg.clone(), Path::new("config.json")).unwrap(), Device::Cpu, kind);
        let vars: Vec<(String, tch::Tensor)> = m.vs.variables().into_iter().map(|(n, t)| (n, t.detach().to_kind(Kind::Float))).collect();
        assert!(vars.len() > 10, "{} tensors", vars.len());
        let host: Vec<(String, Vec<usize>, Vec<u8>)> = vars
            .iter()
            .map(|(n, t)| {
                let mut b = vec![0u8; 4 * t.numel()];
                t.contiguous().copy_data_u8(&mut b, t.numel());
                (n.clone(), t.size().iter().map(|&d| d as usize).collect(), b)
            })
            .collect();
        let views = host.iter().map(|(n, s, b)| (n.as_str(), safetensors::tensor::TensorView::new(safetensors::tensor::Dtype::F32, s.clone(), b).unwrap()));
        let oracle = safetensors::tensor::serialize(views, None).unwrap();
        let update = pack(&m, 1);
        assert_eq!(update.image.len(), oracle.len(), "{kind:?}");
        assert!(update.image == oracle, "{kind:?}: the packed image differs from safetensors' serialisation");
        // It loads into a float32 model as the same parameters.
        let same = Transformer::new(ModelConfig::from_json(cfg.clone(), Path::new("config.json")).unwrap(), Device::Cpu, Kind::Float);
        apply(&same, &update).unwrap();
        for (n, t) in &vars {
            assert!(same.vs.variables()[n].equal(t), "{kind:?}: {n} after loading");
        }
    }
}

/// The image an NCCL group's learner packs on its own device (here the CPU,
/// through the same code a GPU takes): the same bytes as a host pack, none of
/// them in host memory, no digest until the link computes it on the device;
/// loaded as it is, it gives the sender's parameters; brought down for a ring
/// (`to_host`), it is exactly the host pack, digests included.
#[test]
fn an_image_packed_on_the_device_is_the_host_pack_and_loads_exactly() {
    use rlmesh_actors::weight_sync::image::{pack_on_device, WEIGHT_BUCKET_BYTES};
    let sender = model(8);
    let seqs = vec![vec![2u32, 7, 1, 8, 2]];
    let host = pack(&sender, 5);
    let dev = pack_on_device(&sender, 5);
    let held = dev.on_device.as_ref().expect("the image stays on the device");
    assert!(dev.image.is_empty() && held.mismatch.is_none() && dev.digest == 0 && dev.buckets.digests.is_empty(), "{dev:?}");
    assert_eq!((dev.version, dev.buckets.len, dev.buckets.bucket_bytes), (5, host.image.len(), WEIGHT_BUCKET_BYTES));
    {
        let t = held.bytes.lock().unwrap();
        assert_eq!((t.kind(), t.device(), t.numel()), (Kind::Uint8, sender.device(), host.image.len()));
        let mut bytes = vec![0u8; t.numel()];
        t.copy_data_u8(&mut bytes, t.numel());
        assert!(bytes == host.image, "the device image differs from the host pack");
    }
    let receiver = model(9);
    assert_ne!(receiver.score(&seqs).unwrap(), sender.score(&seqs).unwrap());
    assert_eq!(apply(&receiver, &dev).unwrap().version, 5);
    assert_eq!(receiver.score(&seqs).unwrap(), sender.score(&seqs).unwrap());
    assert_eq!(dev.clone().to_host(), host);
    assert_eq!(host.clone().to_host(), host, "a host update is left as it is");
}

/// A learner that packed on its device but whose group sends along the ring
/// (its members are not all on GPUs): the ring brings the image down and sends
/// the host pack's bytes and digests.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_image_goes_along_the_ring_as_the_host_pack() {
    use rlmesh_actors::node::weights::{GroupSpec, WeightGroup};
    use rlmesh_actors::weight_sync::image::pack_on_device;
    let addr = free_addr();
    let members: Vec<WeightGroup> = (0..2).map(|rank| WeightGroup::join(&GroupSpec { rank, world: 2, addr: addr.clone(), epoch: 0, nccl: false }, "test-cookie", None, None)).collect();
    assert!(!members[0].over_nccl());
    let sender = model(10);
    let host = pack(&sender, 2);
    let got = members[1].receive();
    members[0].send(pack_on_device(&sender, 2)).wait().await.unwrap();
    let got = got.wait().await.unwrap();
    assert_eq!((got.version, got.digest, &got.buckets, &got.image), (2, host.digest, &host.buckets, &host.image));
    let receiver = model(11);
    assert_eq!(apply(&receiver, &got).unwrap().digest, host.digest);
}
