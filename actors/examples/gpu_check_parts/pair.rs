//! `gpu_check`'s checks of two processes on one GPU: `nccl-pair` (two NCCL
//! ranks, a host id each: results, bandwidth, a stalled peer's timeout, the
//! group rebuilt, learner steps on it) and `weight-sync` (the weight-sync
//! group between two processes, host path and NCCL), and how the pair is run.
use super::*;
/// Two NCCL ranks on this one GPU, each in its own process (`NCCL_HOSTID` differs per
/// process, so NCCL takes them for two hosts and joins them over its socket transport on
/// loopback; with one host id it refuses two ranks on one device). Checks all-reduce and
/// broadcast results, times them against a device-local copy of the same bytes, then
/// stalls rank 1 so that rank 0's collective times out: rank 0 must return an error
/// within the deadline (its communicator aborted, its drop quiet), and both ranks must
/// rebuild a working communicator from a second unique id (epoch 2).
pub(crate) fn nccl_pair(args: &[String]) -> Res<()> {
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
pub(crate) fn weight_sync(args: &[String]) -> Res<()> {
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
        Some(dir) => super::pair_learners::pair_learner_steps(Path::new(dir), dev, comm)?,
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
