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
#[path = "gpu_check_parts/pair.rs"]
mod pair;
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
        "nccl-pair" => pair::nccl_pair(rest),
        "weight-sync" => pair::weight_sync(rest),
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
