//! The GPU checks that `scripts/gpu-check.sh` runs on a CUDA machine, one
//! subcommand per check; each prints human lines and one JSON line starting
//! with `{"check":` that the script collects.
//!
//! ```text
//! gpu_check make-models OUT             # OUT/tiny, OUT/smollm2-shape (random weights, f32)
//! gpu_check greedy-match MODEL [N]      # CUDA f32 greedy tokens == CPU f32 greedy tokens (+ logits diff)
//! gpu_check generate --models A,B [--device cuda] [--dtypes bf16,f32] [--batch 1,8,32]
//!                    [--new-tokens 128] [--prompt-len 32] [--repeats 3]
//! gpu_check nccl-learner MODEL [--dtype f32]  # tch tensors through NcclComm (world 1) + a CUDA learner step
//!                                       # with the NCCL gradient all-reduce, gradients compared with steps without
//! gpu_check nccl-pair [--model DIR] [--mib 1,16,256] [--iters 5] [--timeout-ms 3000] [--deadline-s 75]
//!                                       # two NCCL ranks on one GPU (a host id each): results, bandwidth,
//!                                       # a stalled peer's timeout, the group rebuilt, learner steps on it:
//!                                       # float32, then bf16 with shard = "gradients" and checkpointing
//! gpu_check weight-sync [--model DIR] [--versions 3] [--transports ring,nccl] [--device cuda]
//!                                       # the weight-sync group between two processes: each transport's
//!                                       # pack / broadcast / load seconds, parameters identical after
//! gpu_check learner --model DIR [--batch 8] [--seq 512] [--iters 10] [--warmup 2] [--dtype bf16]
//!                   [--device cuda] [--python python3] [--script tests/oracle/loss_oracle.py]
//! ```
//!
//! Everything runs on the CPU too (`--device cpu`; `nccl-learner` and
//! `greedy-match` need a GPU), which is how it is tried before a device run.
#[path = "gpu_check_parts/pair_learners.rs"]
mod pair_learners;

use rlmesh_actors::learner::bench::{bench_config, peer_config, run_peer, synthetic_batch};
use rlmesh_actors::learner::Learner;
use rlmesh_actors::learner::actor::nccl_group;
use rlmesh_comm::{nccl, Buf, Collective, DType, NcclComm, NcclId, ReduceOp, RingComm, RingConfig};
use rlmesh_model::transformer::{causal_mask, positions_from_valid, Batch};
use rlmesh_model::{ModelConfig, SamplingParams, Transformer};
use serde_json::{json, Value};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Instant;
use tch::{Device, Kind, Tensor};

type Res<T> = Result<T, Box<dyn std::error::Error>>;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(cmd) = args.first().cloned() else {
        eprintln!("usage: gpu_check make-models|greedy-match|generate|nccl-learner|nccl-pair|weight-sync|learner ...");
        std::process::exit(2);
    };
    let rest = &args[1..];
    let r = match cmd.as_str() {
        "make-models" => make_models(rest),
        "greedy-match" => greedy_match(rest),
        "generate" => generate(rest),
        "nccl-learner" => nccl_learner(rest),
        "nccl-pair" => nccl_pair(rest),
        "weight-sync" => weight_sync(rest),
        "learner" => learner(rest),
        other => Err(format!("unknown subcommand {other:?}").into()),
    };
    if let Err(e) = r {
        eprintln!("gpu_check {cmd}: error: {e}");
        println!("{}", json!({"check": cmd, "ok": false, "error": e.to_string()}));
        std::process::exit(1);
    }
}

/// `--name value` options and positional arguments.
struct Opts {
    named: HashMap<String, String>,
    pos: Vec<String>,
}

impl Opts {
    fn parse(args: &[String]) -> Res<Opts> {
        let (mut named, mut pos) = (HashMap::new(), vec![]);
        let mut it = args.iter();
        while let Some(a) = it.next() {
            if let Some(k) = a.strip_prefix("--") {
                let v = it.next().ok_or_else(|| format!("--{k} needs a value"))?;
                named.insert(k.to_string(), v.clone());
            } else {
                pos.push(a.clone());
            }
        }
        Ok(Opts { named, pos })
    }
    fn get(&self, k: &str, default: &str) -> String {
        self.named.get(k).cloned().unwrap_or_else(|| default.to_string())
    }
    fn num(&self, k: &str, default: usize) -> Res<usize> {
        Ok(match self.named.get(k) {
            Some(v) => v.parse().map_err(|e| format!("--{k} {v}: {e}"))?,
            None => default,
        })
    }
    fn list(&self, k: &str, default: &str) -> Vec<String> {
        self.get(k, default).split(',').filter(|s| !s.is_empty()).map(str::to_string).collect()
    }
    fn device(&self) -> Res<Device> {
        match self.get("device", "cuda").as_str() {
            "cpu" => Ok(Device::Cpu),
            "cuda" => {
                if !tch::Cuda::is_available() {
                    return Err("--device cuda: libtorch sees no CUDA device".into());
                }
                Ok(Device::Cuda(0))
            }
            d => Err(format!("--device {d}: cpu or cuda").into()),
        }
    }
}

fn kind_of(name: &str) -> Res<Kind> {
    Ok(rlmesh_model::io::kind_from_name(name)?)
}

fn sync(device: Device) {
    if let Device::Cuda(i) = device {
        tch::Cuda::synchronize(i as i64);
    }
}



/// `tiny`: a 2-layer Qwen2 with the SmolLM2 vocabulary, weights ×4 so the policy is peaked
/// (greedy ties are then unlikely); `smollm2-shape`: SmolLM2-135M's exact shape, random weights.
fn make_models(args: &[String]) -> Res<()> {
    let o = Opts::parse(args)?;
    let out = PathBuf::from(o.pos.first().ok_or("make-models OUT")?);
    let tiny = json!({
        "architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "vocab_size": 49152, "hidden_size": 64,
        "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "tie_word_embeddings": true,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 2, "hidden_act": "silu", "dtype": "float32"
    });
    let smol = json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": 49152, "hidden_size": 576,
        "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9, "num_key_value_heads": 3,
        "head_dim": 64, "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "rope_theta": 100000.0,
        "tie_word_embeddings": true, "hidden_act": "silu", "bos_token_id": 1, "eos_token_id": 2, "dtype": "float32"
    });
    for (name, cfg, scale) in [("tiny", tiny, 4.0), ("smollm2-shape", smol, 1.0)] {
        let t = Instant::now();
        let config = ModelConfig::from_json(cfg, Path::new(name))?;
        tch::manual_seed(1);
        let model = Transformer::new(config, Device::Cpu, Kind::Float);
        if scale != 1.0 {
            tch::no_grad(|| {
                for (n, mut v) in model.vs.variables() {
                    if !n.contains("norm") {
                        let _ = v.g_mul_scalar_(scale);
                    }
                }
            });
        }
        let dir = out.join(name);
        model.save(&dir, None)?;
        let params: i64 = model.vs.variables().values().map(|v| v.numel() as i64).sum();
        println!("made {} ({params} parameters, f32) in {:.1}s", dir.display(), t.elapsed().as_secs_f64());
    }
    println!("{}", json!({"check": "make-models", "ok": true, "out": out}));
    Ok(())
}

/// Greedy tokens of the f32 model on CPU and on CUDA (left-padded prompts of
/// several lengths), and the largest logits difference of one forward pass.
fn greedy_match(args: &[String]) -> Res<()> {
    let o = Opts::parse(args)?;
    let dir = PathBuf::from(o.pos.first().ok_or("greedy-match MODEL [NEW_TOKENS]")?);
    let new_tokens: usize = o.pos.get(1).map(|s| s.parse()).transpose()?.unwrap_or(64);
    if !tch::Cuda::is_available() {
        return Err("libtorch sees no CUDA device".into());
    }
    let cpu = Transformer::load(&dir, Device::Cpu, Some(Kind::Float))?;
    let gpu = Transformer::load(&dir, Device::Cuda(0), Some(Kind::Float))?;
    let gpu_bf16 = Transformer::load(&dir, Device::Cuda(0), Some(Kind::BFloat16))?;
    let vocab = cpu.config.vocab_size as u64;
    let mut ps = rlmesh_model::generate::bench_prompts(6, 24, vocab, 5);
    for (i, p) in ps.iter_mut().enumerate() {
        p.truncate(4 + 4 * i); // lengths 4..24: exercises left padding
    }
    let params = SamplingParams { max_new_tokens: new_tokens, temperature: 0.0, ..Default::default() };
    let a = cpu.generate(&ps, &params, None)?;
    let b = gpu.generate(&ps, &params, None)?;
    let c = gpu_bf16.generate(&ps, &params, None)?;
    let mut first_mismatch = vec![];
    let mut equal = 0;
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        if x.tokens == y.tokens {
            equal += 1;
        } else {
            let at = x.tokens.iter().zip(&y.tokens).position(|(p, q)| p != q).unwrap_or(x.tokens.len().min(y.tokens.len()));
            first_mismatch.push(json!({"row": i, "at": at, "cpu": &x.tokens[..(at + 1).min(x.tokens.len())], "cuda": &y.tokens[..(at + 1).min(y.tokens.len())]}));
        }
    }
    let lp_diff = a.iter().zip(&b).flat_map(|(x, y)| x.logprobs.iter().zip(&y.logprobs).map(|(p, q)| (p - q).abs())).fold(0f32, f32::max);
    let (same_bf16, total) = a.iter().zip(&c).fold((0usize, 0usize), |(s, n), (x, y)| {
        (s + x.tokens.iter().zip(&y.tokens).filter(|(p, q)| p == q).count(), n + x.tokens.len())
    });
    // One forward pass over the padded batch: largest |logits_cpu − logits_cuda| at valid positions.
    let width = ps.iter().map(Vec::len).max().unwrap_or(1);
    let mut ids = vec![0i64; ps.len() * width];
    let mut valid = vec![false; ps.len() * width];
    for (i, p) in ps.iter().enumerate() {
        for (j, &t) in p.iter().enumerate() {
            ids[i * width + width - p.len() + j] = t as i64;
            valid[i * width + width - p.len() + j] = true;
        }
    }
    let shape = [ps.len() as i64, width as i64];
    let logits = |m: &Transformer| -> Res<Tensor> {
        let dev = m.device();
        let ids = Tensor::from_slice(&ids).view(shape).to_device(dev);
        let v = Tensor::from_slice(&valid).view(shape).to_device(dev);
        let batch = Batch { ids, positions: positions_from_valid(&v), mask: causal_mask(&v) };
        Ok(tch::no_grad(|| m.forward(&batch, None))?.to_device(Device::Cpu).to_kind(Kind::Float))
    };
    let (lc, lg) = (logits(&cpu)?, logits(&gpu)?);
    let vmask = Tensor::from_slice(&valid).view(shape).unsqueeze(-1);
    let logit_diff = (&lc - &lg).abs().masked_fill(&vmask.logical_not(), 0.0).max().double_value(&[]);
    let logit_scale = lc.abs().masked_fill(&vmask.logical_not(), 0.0).max().double_value(&[]);
    let ok = equal == ps.len();
    println!(
        "greedy f32 CPU vs CUDA ({}): {equal}/{} rows identical over {new_tokens} new tokens; max |logprob diff| {lp_diff:.2e}; \
         forward max |logit diff| {logit_diff:.2e} (max |logit| {logit_scale:.2}); CUDA bf16 agrees with CPU f32 on {same_bf16}/{total} tokens",
        dir.display(),
        ps.len()
    );
    println!(
        "{}",
        json!({"check": "greedy-match", "ok": ok, "model": dir, "rows": ps.len(), "rows_identical": equal, "new_tokens": new_tokens,
               "max_logprob_diff": lp_diff, "max_logit_diff": logit_diff, "max_abs_logit": logit_scale,
               "bf16_cuda_tokens_equal_cpu_f32": same_bf16, "tokens": total, "mismatches": first_mismatch})
    );
    if !ok {
        return Err(format!("CUDA greedy tokens differ from CPU on {} rows", ps.len() - equal).into());
    }
    Ok(())
}

/// Greedy generation throughput: end to end (prefill of `prompt_len` + `new_tokens` decode steps) and
/// decode alone, estimated as B·(N−1) / (t(N) − t(1)).
fn generate(args: &[String]) -> Res<()> {
    let o = Opts::parse(args)?;
    let device = o.device()?;
    let models = o.list("models", "");
    if models.is_empty() {
        return Err("--models DIR[,DIR]".into());
    }
    let dtypes = o.list("dtypes", "bf16,f32");
    let batches: Vec<usize> = o.list("batch", "1,8,32").iter().map(|b| b.parse()).collect::<Result<_, _>>()?;
    let (new_tokens, prompt_len, repeats) = (o.num("new-tokens", 128)?, o.num("prompt-len", 32)?, o.num("repeats", 3)?.max(1));
    if device == Device::Cpu {
        tch::set_num_threads(o.num("threads", 2)? as i32);
    }
    println!("generate on {device:?}: greedy, prompt {prompt_len} tokens, {new_tokens} new tokens, median of {repeats}");
    println!("{:<16} {:>5} {:>5} {:>14} {:>14} {:>11}", "model", "dtype", "batch", "e2e tok/s", "decode tok/s", "prefill ms");
    let mut rows = vec![];
    for m in &models {
        let dir = PathBuf::from(m);
        let name = dir.file_name().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
        for dt in &dtypes {
            let model = Transformer::load(&dir, device, Some(kind_of(dt)?))?;
            for &b in &batches {
                let ps = rlmesh_model::generate::bench_prompts(b, prompt_len, model.config.vocab_size as u64, 17 + b as u64);
                let p = |n| SamplingParams { max_new_tokens: n, temperature: 0.0, ..Default::default() };
                let time = |n: usize| -> Res<f64> {
                    sync(device);
                    let t = Instant::now();
                    let out = model.generate(&ps, &p(n), None)?;
                    sync(device);
                    let dt = t.elapsed().as_secs_f64();
                    if !out.iter().all(|c| c.tokens.len() == n) {
                        return Err("a sequence stopped early (no stop tokens were given)".into());
                    }
                    Ok(dt)
                };
                time(4)?; // warm-up (allocator, cuBLAS handles, kernels)
                let mut full = vec![];
                let mut one = vec![];
                for _ in 0..repeats {
                    one.push(time(1)?);
                    full.push(time(new_tokens)?);
                }
                let (tf, t1) = (rlmesh_comm::bench::median(&full), rlmesh_comm::bench::median(&one));
                let e2e = (b * new_tokens) as f64 / tf;
                let decode = (b * (new_tokens - 1)) as f64 / (tf - t1).max(1e-9);
                println!("{:<16} {:>5} {:>5} {:>14.1} {:>14.1} {:>11.2}", name, dt, b, e2e, decode, t1 * 1e3);
                rows.push(json!({"model": name, "dtype": dt, "batch": b, "e2e_tokens_per_s": e2e, "decode_tokens_per_s": decode,
                                 "prefill_plus_one_ms": t1 * 1e3, "full_s": full, "one_s": one}));
            }
        }
    }
    println!(
        "{}",
        json!({"check": "generate", "ok": true, "device": format!("{device:?}"), "new_tokens": new_tokens, "prompt_len": prompt_len,
               "repeats": repeats, "rows": rows})
    );
    Ok(())
}

fn cuda_buf(t: &Tensor, dtype: DType) -> Buf<'static> {
    // SAFETY: a contiguous CUDA tensor the caller keeps alive until the collective has been synchronized;
    // null = the legacy default stream, which libtorch computes on.
    unsafe { Buf::cuda(t.data_ptr(), t.numel(), dtype, std::ptr::null_mut()) }
}

/// NCCL (world size 1) on libtorch's own CUDA tensors in the same process as libtorch (which loads its
/// own libnccl.so.2), then one CUDA learner step with the NCCL gradient all-reduce, compared with the same
/// step without a communicator: with one rank the sum is the identity, so the gradients must agree to
/// within libtorch's own run-to-run noise.
fn nccl_learner(args: &[String]) -> Res<()> {
    let o = Opts::parse(args)?;
    let dir = PathBuf::from(o.pos.first().ok_or("nccl-learner MODEL")?);
    let kind = kind_of(&o.get("dtype", "f32"))?;
    nccl::nccl_available()?;
    if !tch::Cuda::is_available() {
        return Err("libtorch sees no CUDA device".into());
    }
    let version = nccl::nccl_version()?;
    let dev = Device::Cuda(0);
    // Touch CUDA through libtorch first, as the learner does.
    let host: Vec<f32> = (0..4099).map(|i| i as f32 * 0.25 - 7.0).collect();
    let t = Tensor::from_slice(&host).to_device(dev);
    let id = NcclId::new()?;
    let mut comm = NcclComm::new(0, 0, 1, &id)?;
    comm.all_reduce(cuda_buf(&t, DType::F32), ReduceOp::Sum)?;
    comm.all_reduce(cuda_buf(&t, DType::F32), ReduceOp::Mean)?;
    comm.broadcast(cuda_buf(&t, DType::F32), 0)?;
    comm.synchronize(std::ptr::null_mut())?;
    let f32_ok = Vec::<f32>::try_from(&t.to_device(Device::Cpu))? == host;
    let tb = Tensor::from_slice(&host).to_kind(Kind::BFloat16).to_device(dev);
    let before = tb.to_device(Device::Cpu);
    comm.all_reduce(cuda_buf(&tb, DType::Bf16), ReduceOp::Sum)?;
    comm.synchronize(std::ptr::null_mut())?;
    let bf16_ok = tb.to_device(Device::Cpu).equal(&before);
    // Results consumed by a libtorch op right after the collective, without an explicit NCCL synchronize.
    let x = Tensor::ones([1 << 20], (Kind::Float, dev));
    comm.all_reduce(cuda_buf(&x, DType::F32), ReduceOp::Sum)?;
    let stream_ok = (x.sum(Kind::Float).double_value(&[]) - (1 << 20) as f64).abs() < 0.5;
    comm.barrier()?;
    println!("nccl {version} via rlmesh-comm on libtorch CUDA tensors: f32 sum/mean/broadcast {f32_ok}, bf16 sum {bf16_ok}, stream order {stream_ok}");

    // Learner step with the NCCL all-reduce, and twice without (the second run measures libtorch's own
    // run-to-run noise on CUDA: atomics in the embedding / index backward make it non-zero).
    let batch_size = 8;
    let model = Transformer::load(&dir, dev, Some(kind))?;
    let batch = synthetic_batch(model.config.vocab_size, batch_size, 64, 16, 1);
    let config = bench_config(batch_size);
    let step = |model: Transformer, comm: Option<Box<dyn Collective>>| -> Res<(f64, Vec<Tensor>, u64)> {
        let mut l = Learner::new(model, config.clone(), comm)?;
        let s = l.train_step(&batch)?;
        let grads = l.gradients().into_iter().map(|(_, g)| g.to_device(Device::Cpu).to_kind(Kind::Double)).collect();
        Ok((s.loss, grads, l.parameter_digest()?))
    };
    let (l1, g1, d1) = step(model, Some(Box::new(comm) as Box<dyn Collective>))?;
    let (l2, g2, d2) = step(Transformer::load(&dir, dev, Some(kind))?, None)?;
    let (l3, g3, d3) = step(Transformer::load(&dir, dev, Some(kind))?, None)?;
    let max_diff = |a: &[Tensor], b: &[Tensor]| a.iter().zip(b).map(|(x, y)| (x - y).abs().max().double_value(&[])).fold(0f64, f64::max);
    let scale = g2.iter().map(|g| g.abs().max().double_value(&[])).fold(0f64, f64::max);
    let (diff, noise) = (max_diff(&g1, &g2), max_diff(&g2, &g3));
    let learner_ok = diff <= (4.0 * noise).max(1e-5 * scale) && (l1 - l2).abs() <= 1e-5 * l2.abs().max(1.0);
    println!(
        "learner step on CUDA {}: loss with NCCL (world 1) {l1:.7}, without {l2:.7} / {l3:.7}; max |grad diff| with-vs-without {diff:.3e}, \
         without-vs-without {noise:.3e} (max |grad| {scale:.3e}); parameter digests {}: {}",
        rlmesh_model::io::kind_name(kind),
        if d1 == d2 && d2 == d3 { "all identical" } else if d2 == d3 { "NCCL run differs" } else { "differ run to run" },
        if learner_ok { "ok" } else { "MISMATCH" }
    );
    let ok = f32_ok && bf16_ok && stream_ok && learner_ok;
    println!(
        "{}",
        json!({"check": "nccl-learner", "ok": ok, "nccl_version": version, "f32": f32_ok, "bf16": bf16_ok, "stream_order": stream_ok,
               "learner_ok": learner_ok, "dtype": rlmesh_model::io::kind_name(kind), "loss_with": l1, "loss_without": [l2, l3],
               "grad_diff_with_vs_without": diff, "grad_diff_without_vs_without": noise, "grad_max": scale,
               "digest_with_eq_without": d1 == d2, "digest_without_eq_without": d2 == d3})
    );
    if !ok {
        return Err("an NCCL check failed".into());
    }
    Ok(())
}

/// Two NCCL ranks on this one GPU, each in its own process (`NCCL_HOSTID` differs per
/// process, so NCCL takes them for two hosts and joins them over its socket transport on
/// loopback; with one host id it refuses two ranks on one device). Checks all-reduce and
/// broadcast results, times them against a device-local copy of the same bytes, then
/// stalls rank 1 so that rank 0's collective times out: rank 0 must return an error
/// within the deadline (its communicator aborted, its drop quiet), and both ranks must
/// rebuild a working communicator from a second unique id (epoch 2).
fn nccl_pair(args: &[String]) -> Res<()> {
    let o = Opts::parse(args)?;
    if let Ok(rank) = std::env::var("RLMESH_PAIR_RANK") {
        return nccl_pair_rank(&o, rank.parse()?);
    }
    nccl::nccl_available()?;
    // One ring rendezvous per epoch (the learners' path: rank 0's NCCL id travels over the ring).
    let ports: Vec<String> = (0..2).map(|_| Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.to_string())).collect::<Res<_>>()?;
    let t0 = Instant::now();
    let deadline = std::time::Duration::from_secs(o.num("deadline-s", 75)? as u64);
    let (mut ok, reports) = run_pair("nccl-pair", args, &ports, deadline)?;
    let l: Vec<&Value> = reports.iter().map(|r| &r["learners"]).collect();
    let agree = |field: &str| l.len() == 2 && l[0][field] == l[1][field] && !l[0][field].is_null();
    let same = agree("learner_digest");
    let sharded_same = agree("sharded_digests");
    // Each of the two ranks holds half of bf16's float32 master weights and moments (12 bytes a
    // parameter, against the float32 learner's 8 of moments): 0.75 of the unsharded bytes, plus padding.
    let halved = l.iter().all(|x| x["optimizer_bytes"].as_f64().zip(x["optimizer_bytes_unsharded"].as_f64()).is_some_and(|(h, w)| h <= 0.75 * w + 4096.0));
    println!("learner parameters after one NCCL step: {}", if same { "identical on both ranks" } else { "DIFFER (or missing)" });
    println!("bf16 sharded learner: parameters {} on both ranks; optimizer state per rank halved: {halved}", if sharded_same { "identical" } else { "DIFFER (or missing)" });
    ok &= (same && sharded_same && halved) || !o.named.contains_key("model");
    println!("{}", json!({"check": "nccl-pair", "ok": ok, "seconds": t0.elapsed().as_secs_f64(), "learner_digests_equal": same, "sharded_digests_equal": sharded_same, "ranks": reports}));
    if !ok {
        return Err("a rank failed".into());
    }
    Ok(())
}

/// Runs this binary's `sub` as ranks 0 and 1, each in its own process with its own
/// `NCCL_HOSTID` (`RLMESH_PAIR_RANK`, and `RLMESH_PAIR_RINGS`: the ring addresses).
/// Each rank prints human lines and one `{"rank": ...}` JSON line; a rank still
/// running at the deadline is killed, so a hung collective costs the check its
/// deadline, never an orphan holding the GPU. Returns whether both succeeded, and
/// their reports.
fn run_pair(sub: &str, args: &[String], rings: &[String], deadline: std::time::Duration) -> Res<(bool, Vec<Value>)> {
    let exe = std::env::current_exe()?;
    let t0 = Instant::now();
    let logs = tempfile::tempdir()?;
    let mut children = (0..2)
        .map(|r| -> Res<_> {
            let log = logs.path().join(format!("rank{r}.out"));
            let child = std::process::Command::new(&exe)
                .arg(sub)
                .args(args)
                .env("RLMESH_PAIR_RANK", r.to_string())
                .env("RLMESH_PAIR_RINGS", rings.join(","))
                .env("NCCL_HOSTID", format!("rlmesh-pair-{r}"))
                .env("NCCL_SOCKET_IFNAME", std::env::var("NCCL_SOCKET_IFNAME").unwrap_or_else(|_| "lo".into()))
                .env("NCCL_IB_DISABLE", "1")
                .stdout(std::fs::File::create(&log)?)
                .spawn()?;
            Ok((child, log))
        })
        .collect::<Res<Vec<_>>>()?;
    let mut status = [None, None];
    while status.iter().any(Option::is_none) && t0.elapsed() < deadline {
        for (r, (c, _)) in children.iter_mut().enumerate() {
            if status[r].is_none() {
                status[r] = c.try_wait()?;
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let mut reports = vec![];
    let mut ok = true;
    for (r, (c, log)) in children.iter_mut().enumerate() {
        if status[r].is_none() {
            let _ = c.kill();
            let _ = c.wait();
            println!("[rank {r}] still running after {deadline:?}: killed");
        }
        let text = std::fs::read_to_string(log).unwrap_or_default();
        print!("{}", text.lines().filter(|l| !l.starts_with("{\"rank\"")).map(|l| format!("[rank {r}] {l}\n")).collect::<String>());
        let line = text.lines().find(|l| l.starts_with("{\"rank\""));
        let why = status[r].map_or("killed at the deadline".to_string(), |s| s.to_string());
        let v: Value = line.map(serde_json::from_str).transpose()?.unwrap_or(json!({"rank": r, "ok": false, "error": format!("no report ({why})")}));
        ok &= status[r].is_some_and(|s| s.success()) && v["ok"].as_bool() == Some(true);
        reports.push(v);
    }
    Ok((ok, reports))
}

/// The weight-sync group between two processes, as the pipeline runs it
/// (`node::weights`): rank 0 packs a model's parameters as a version and
/// broadcasts it, rank 1 receives, checks and loads it into its own model.
/// Each transport in turn, on its own ring: `ring` (the host path: shared
/// memory between the two processes, XXH3 hashed as it arrives, loaded from
/// the host) and `nccl` (the image copied to rank 0's GPU, broadcast by NCCL,
/// digested on rank 1's GPU and loaded from there). Rank 0 perturbs its model
/// before each version, so every version differs; after the last, both ranks'
/// parameters must be bit-identical (the digest of a fresh pack of each).
/// Then rank 1 stops receiving, and aborting rank 0's member must end its
/// blocked broadcast within 5 s (over NCCL: the wait polls the abort flag).
fn weight_sync(args: &[String]) -> Res<()> {
    let o = Opts::parse(args)?;
    if let Ok(rank) = std::env::var("RLMESH_PAIR_RANK") {
        return weight_sync_rank(&o, rank.parse()?);
    }
    let transports = o.list("transports", "ring,nccl");
    let rings: Vec<String> = transports.iter().map(|_| Ok(std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.to_string())).collect::<Res<_>>()?;
    let t0 = Instant::now();
    let (mut ok, reports) = run_pair("weight-sync", args, &rings, std::time::Duration::from_secs(o.num("deadline-s", 150)? as u64))?;
    let mut figures = vec![];
    for t in &transports {
        let (a, b) = (&reports[0][t.as_str()], &reports[1][t.as_str()]);
        let same = a["final_digest"].is_string() && a["final_digest"] == b["final_digest"];
        ok &= same;
        println!("{t}: parameters after the last version {}", if same { "identical on both ranks" } else { "DIFFER (or missing)" });
        figures.push(json!({"transport": t, "identical": same, "sender": a, "receiver": b}));
    }
    // Per version: rank 0's pack and broadcast, then rank 1's load; the median over versions.
    let per_version = |f: &Value| -> Option<f64> {
        let (s, r) = (f["sender"]["versions"].as_array()?, f["receiver"]["versions"].as_array()?);
        let mut t: Vec<f64> = s.iter().zip(r).map(|(a, b)| Some(a["pack_s"].as_f64()? + a["send_s"].as_f64()? + b["load_s"].as_f64()?)).collect::<Option<_>>()?;
        t.sort_by(f64::total_cmp);
        t.get(t.len() / 2).copied()
    };
    let seconds: Vec<Option<f64>> = figures.iter().map(per_version).collect();
    let at = |name: &str| transports.iter().position(|t| t == name).and_then(|i| seconds[i]);
    let ratio = at("ring").zip(at("nccl")).map(|(ring, nccl)| {
        println!("per version (pack + broadcast + load, median): ring {ring:.3}s, nccl {nccl:.3}s: nccl {:.2}x the host path", ring / nccl);
        ring / nccl
    });
    println!("{}", json!({"check": "weight-sync", "ok": ok, "seconds": t0.elapsed().as_secs_f64(), "per_version_s": seconds, "nccl_over_ring": ratio, "transports": figures}));
    if !ok {
        return Err("a rank failed, or the parameters differ".into());
    }
    Ok(())
}

fn weight_sync_rank(o: &Opts, rank: usize) -> Res<()> {
    use rlmesh_actors::node::weights::{GroupSpec, WeightGroup};
    use rlmesh_actors::weight_sync::image::{apply, pack, pack_on_device};
    let rings: Vec<String> = std::env::var("RLMESH_PAIR_RINGS")?.split(',').map(String::from).collect();
    let dir = PathBuf::from(o.get("model", "/tmp/gpu-check-models/smollm2-shape"));
    let dev = o.device()?;
    let versions = o.num("versions", 3)?.max(1) as u64;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let model = Transformer::load(&dir, dev, Some(Kind::Float))?;
    if rank == 1 {
        // Start from other weights, so that only the versions make the two equal.
        tch::no_grad(|| model.vs.variables().values().for_each(|v| {
            let _ = v.shallow_clone().g_mul_scalar_(0.5);
        }));
    }
    let cuda = matches!(dev, Device::Cuda(_)).then_some(0);
    let mut report = json!({"rank": rank, "ok": true, "bytes": 0});
    for (epoch, t) in o.list("transports", "ring,nccl").iter().enumerate() {
        let spec = GroupSpec { rank: rank as u32, world: 2, addr: rings[epoch].clone(), epoch: epoch as u32, nccl: t == "nccl" };
        let group = WeightGroup::join(&spec, "weight-sync-check", None, cuda);
        let mut rows = vec![];
        for v in 1..=versions {
            if rank == 0 {
                tch::no_grad(|| model.vs.variables().values().for_each(|p| {
                    let _ = p.shallow_clone().g_add_scalar_(1e-3 * v as f64);
                }));
                sync(dev);
                let t = Instant::now();
                // As a learner node publishes: into an NCCL group from its GPU, packed there.
                let on_gpu = group.over_nccl() && cuda.is_some();
                let update = if on_gpu { pack_on_device(&model, v) } else { pack(&model, v) };
                sync(dev);
                let pack_s = t.elapsed().as_secs_f64();
                let bytes = update.buckets.len;
                let send_s = rt.block_on(group.send(update).wait())?;
                report["bytes"] = json!(bytes);
                rows.push(json!({"version": v, "pack_s": pack_s, "packed_on_gpu": on_gpu, "send_s": send_s, "gb_s": bytes as f64 / 1e9 / send_s}));
            } else {
                let t = Instant::now();
                let update = rt.block_on(group.receive().wait())?;
                let receive_s = t.elapsed().as_secs_f64();
                let t = Instant::now();
                let ack = apply(&model, &update)?;
                sync(dev);
                let load_s = t.elapsed().as_secs_f64();
                report["bytes"] = json!(update.buckets.len);
                rows.push(json!({"version": ack.version, "receive_s": receive_s, "load_s": load_s, "from_gpu": update.on_device.is_some()}));
            }
        }
        let final_digest = format!("{:016x}", pack(&model, 0).digest);
        println!("{t}: {}", rows.iter().map(Value::to_string).collect::<Vec<_>>().join(" "));
        // A member gone mid-broadcast: rank 1 stops receiving, rank 0's next broadcast blocks,
        // and aborting rank 0's member (what the fleet does when it loses a member) must end
        // the wait at once, not at the group's 120 s timeout.
        let aborted = if rank == 0 {
            let pending = group.send(pack(&model, versions + 1));
            std::thread::sleep(std::time::Duration::from_secs(1));
            let asked = Instant::now();
            group.abort();
            let r = rt.block_on(pending.wait());
            let secs = asked.elapsed().as_secs_f64();
            println!("{t}: abort mid-broadcast ended the wait in {secs:.3}s: {}", r.as_ref().err().map_or("no error (the broadcast completed?)", String::as_str));
            report["ok"] = json!(report["ok"].as_bool() == Some(true) && r.is_err() && secs < 5.0);
            json!({"ended_s": secs, "failed": r.is_err()})
        } else {
            std::thread::sleep(std::time::Duration::from_secs(3));
            group.abort();
            Value::Null
        };
        report[t.as_str()] = json!({"versions": rows, "final_digest": final_digest, "abort": aborted});
    }
    println!("{report}");
    Ok(())
}

fn nccl_pair_rank(o: &Opts, rank: usize) -> Res<()> {
    let rings: Vec<String> = std::env::var("RLMESH_PAIR_RINGS")?.split(',').map(String::from).collect();
    let join = |addr: &str| -> Res<NcclComm> {
        let ring = RingComm::connect(RingConfig::new(rank, 2, addr.to_string()).cookie("nccl-pair"))?;
        Ok(nccl_group(ring, 0)?)
    };
    let timeout = std::time::Duration::from_millis(o.num("timeout-ms", 3000)? as u64);
    let mibs: Vec<usize> = o.list("mib", "1,16,256").iter().map(|m| m.parse()).collect::<Result<_, _>>()?;
    let iters = o.num("iters", 5)?.max(1);
    let dev = Device::Cuda(0);
    let _ = Tensor::zeros([1], (Kind::Float, dev));
    let t = Instant::now();
    let mut comm = join(&rings[0])?.with_timeout(timeout);
    let init_s = t.elapsed().as_secs_f64();
    let done = |c: &mut NcclComm| c.synchronize(std::ptr::null_mut());

    // Results: sum and mean of (rank+1)·x, broadcast from rank 1, bf16 sum.
    let n = 1 << 20;
    let x = Tensor::arange(n, (Kind::Float, dev)).remainder(97.0);
    let a = &x * (rank as f64 + 1.0);
    comm.all_reduce(cuda_buf(&a, DType::F32), ReduceOp::Sum)?;
    done(&mut comm)?;
    let sum_ok = a.equal(&(&x * 3.0));
    let m = &x * (rank as f64 + 1.0);
    comm.all_reduce(cuda_buf(&m, DType::F32), ReduceOp::Mean)?;
    done(&mut comm)?;
    let mean_ok = m.equal(&(&x * 1.5));
    let b = if rank == 1 { x.copy() } else { Tensor::zeros([n], (Kind::Float, dev)) };
    comm.broadcast(cuda_buf(&b, DType::F32), 1)?;
    done(&mut comm)?;
    let bcast_ok = b.equal(&x);
    let h = (&x * (rank as f64 + 1.0)).to_kind(Kind::BFloat16);
    comm.all_reduce(cuda_buf(&h, DType::Bf16), ReduceOp::Sum)?;
    done(&mut comm)?;
    let bf16_ok = h.equal(&(&x * 3.0).to_kind(Kind::BFloat16));
    println!("results: f32 sum {sum_ok}, mean {mean_ok}, broadcast {bcast_ok}, bf16 sum {bf16_ok} (init {init_s:.2}s)");

    // Bandwidth (algorithm bandwidth = bytes / time; for two ranks NCCL's bus bandwidth is the same).
    let mut rows = vec![];
    for &mib in &mibs {
        let bytes = mib << 20;
        let buf = Tensor::ones([(bytes / 4) as i64], (Kind::Float, dev));
        let dst = Tensor::empty([(bytes / 4) as i64], (Kind::Float, dev));
        let mut time = |f: &mut dyn FnMut(&mut NcclComm) -> Res<()>| -> Res<f64> {
            f(&mut comm)?;
            done(&mut comm)?;
            let mut ts = vec![];
            for _ in 0..iters {
                let t = Instant::now();
                f(&mut comm)?;
                done(&mut comm)?;
                ts.push(t.elapsed().as_secs_f64());
            }
            Ok(rlmesh_comm::bench::median(&ts))
        };
        let ar = time(&mut |c| Ok(c.all_reduce(cuda_buf(&buf, DType::F32), ReduceOp::Mean)?))?;
        let bc = time(&mut |c| Ok(c.broadcast(cuda_buf(&buf, DType::F32), 0)?))?;
        let mut cp = vec![];
        for _ in 0..iters + 1 {
            sync(dev);
            let t = Instant::now();
            dst.shallow_clone().copy_(&buf);
            sync(dev);
            cp.push(t.elapsed().as_secs_f64());
        }
        let cp = rlmesh_comm::bench::median(&cp[1..]);
        let gbs = |s: f64| bytes as f64 / s / 1e9;
        println!("{mib:>5} MiB: all-reduce {:.2} GB/s, broadcast {:.2} GB/s, device copy {:.1} GB/s", gbs(ar), gbs(bc), gbs(cp));
        rows.push(json!({"mib": mib, "all_reduce_s": ar, "broadcast_s": bc, "copy_s": cp, "all_reduce_gb_s": gbs(ar), "broadcast_gb_s": gbs(bc), "copy_gb_s": gbs(cp)}));
    }

    // Rank 1 stalls: it skips one all-reduce. Rank 0's must time out and abort, not hang.
    comm.barrier()?;
    let stall = Tensor::ones([1 << 16], (Kind::Float, dev));
    let (timed_out, waited) = if rank == 0 {
        let t = Instant::now();
        let r = comm.all_reduce(cuda_buf(&stall, DType::F32), ReduceOp::Sum).map_err(|e| e.to_string()).and_then(|_| done(&mut comm).map_err(|e| e.to_string()));
        let waited = t.elapsed().as_secs_f64();
        println!("stalled peer: {} after {waited:.2}s", r.as_ref().err().map_or("no error (WRONG)".to_string(), |e| e.clone()));
        let again = comm.all_reduce(cuda_buf(&stall, DType::F32), ReduceOp::Sum);
        println!("the next collective on the aborted communicator: {}", again.as_ref().err().map_or("accepted (WRONG)".into(), |e| e.to_string()));
        (r.is_err() && again.is_err(), waited)
    } else {
        std::thread::sleep(timeout + std::time::Duration::from_millis(500));
        (true, 0.0)
    };
    let t = Instant::now();
    drop(comm);
    let drop_s = t.elapsed().as_secs_f64();
    let bound_ok = rank != 0 || waited < timeout.as_secs_f64() + 2.0;

    // Epoch 2: a fresh communicator from the second id; the same sum must come out.
    let t = Instant::now();
    let mut comm = join(&rings[1])?.with_timeout(timeout);
    let a = &x * (rank as f64 + 1.0);
    comm.all_reduce(cuda_buf(&a, DType::F32), ReduceOp::Sum)?;
    done(&mut comm)?;
    let epoch2_ok = a.equal(&(&x * 3.0));
    let rebuild_s = t.elapsed().as_secs_f64();
    println!("timeout: aborted {timed_out} within bound {bound_ok}; drop {drop_s:.3}s; epoch 2 rebuilt in {rebuild_s:.2}s, sum {epoch2_ok}");
    // Learner steps on the epoch-2 group: both ranks reduce the same gradients, so their parameters must agree bit for bit.
    let learners = match o.named.get("model") {
        Some(dir) => pair_learners::pair_learner_steps(Path::new(dir), dev, comm)?,
        None => json!({}),
    };
    let learner_ok = !o.named.contains_key("model") || (learners["learner_loss"].as_f64().is_some_and(f64::is_finite) && learners["sharded_first_loss_close"] == true);
    let ok = sum_ok && mean_ok && bcast_ok && bf16_ok && timed_out && bound_ok && epoch2_ok && learner_ok;
    println!(
        "{}",
        json!({"rank": rank, "ok": ok, "init_s": init_s, "sum": sum_ok, "mean": mean_ok, "broadcast": bcast_ok, "bf16": bf16_ok,
               "timeout_s": timeout.as_secs_f64(), "timed_out": timed_out, "waited_s": waited, "drop_s": drop_s,
               "epoch2": epoch2_ok, "rebuild_s": rebuild_s, "bandwidth": rows, "learners": learners})
    );
    if !ok {
        return Err("a check failed".into());
    }
    Ok(())
}

/// One learner step (forward, GRPO loss with KL, backward, AdamW) timed as `bench_learner_step` times
/// it, then the PyTorch eager peer on the same weights and batch; a missing peer is reported, not fatal.
fn learner(args: &[String]) -> Res<()> {
    let o = Opts::parse(args)?;
    let device = o.device()?;
    let kind = kind_of(&o.get("dtype", if device == Device::Cpu { "f32" } else { "bf16" }))?;
    let dir = PathBuf::from(o.named.get("model").ok_or("--model DIR")?);
    let (b, t) = (o.num("batch", 8)?, o.num("seq", 512)?);
    let (iters, warmup) = (o.num("iters", 10)?.max(1), o.num("warmup", 2)?);
    let threads = o.num("threads", 2)? as i32;
    tch::set_num_threads(threads);
    let model = Transformer::load(&dir, device, Some(kind))?;
    let batch = synthetic_batch(model.config.vocab_size, b, t, t / 4, 1);
    let config = bench_config(b);
    let tokens = b * t;
    let mut learner = Learner::new(model, config.clone(), None)?;
    let mut times = vec![];
    let mut loss = 0.0;
    for i in 0..warmup + iters {
        sync(device);
        let t0 = Instant::now();
        let s = learner.train_step(&batch)?;
        sync(device);
        if i >= warmup {
            times.push(t0.elapsed().as_secs_f64());
        }
        loss = s.loss;
    }
    drop(learner);
    let ours = rlmesh_comm::bench::median(&times);
    let name = dir.file_name().map(|s| s.to_string_lossy().to_string()).unwrap_or_default();
    let dtype = rlmesh_model::io::kind_name(kind);
    let python = PathBuf::from(o.get("python", "python3"));
    let script = PathBuf::from(o.get("script", "tests/oracle/loss_oracle.py"));
    let peer = if o.get("peer", "1") == "0" {
        Err("skipped (--peer 0)".to_string())
    } else {
        run_peer(
            &python,
            &script,
            "bench",
            &json!({
                "model": dir, "batch": batch, "objective": "policy", "config": peer_config(&config),
                "iters": iters, "warmup": warmup, "threads": threads,
                "device": if device == Device::Cpu { "cpu" } else { "cuda" }, "dtype": dtype,
            }),
        )
        .map_err(|e| e.to_string())
        .and_then(|v: Value| v["median_s"].as_f64().ok_or_else(|| format!("peer output lacks median_s: {v}")))
    };
    let mut report = json!({"check": "learner", "ok": true, "model": name, "device": format!("{device:?}"), "dtype": dtype,
                            "batch": b, "seq_len": t, "tokens_per_step": tokens, "iters": iters, "loss": loss,
                            "ours_median_s": ours, "ours_tokens_per_s": tokens as f64 / ours, "ours_times_s": times});
    match &peer {
        Ok(torch) => {
            report["torch_median_s"] = json!(torch);
            report["torch_tokens_per_s"] = json!(tokens as f64 / torch);
            report["ratio"] = json!(torch / ours);
            println!(
                "learner step {name} [{device:?} {dtype}] {b}x{t} = {tokens} tokens: rlmesh {:.0} tok/s (median {ours:.4}s), \
                 PyTorch eager {:.0} tok/s (median {torch:.4}s), ratio {:.3}x",
                tokens as f64 / ours,
                tokens as f64 / torch,
                torch / ours
            );
        }
        Err(e) => {
            report["peer_error"] = json!(e);
            println!(
                "learner step {name} [{device:?} {dtype}] {b}x{t} = {tokens} tokens: rlmesh {:.0} tok/s (median {ours:.4}s); PyTorch peer failed: {e}",
                tokens as f64 / ours
            );
        }
    }
    println!("{report}");
    Ok(())
}
