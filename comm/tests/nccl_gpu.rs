//! NCCL on a real GPU, world size 1: all-reduce (sum, mean, bf16), broadcast,
//! reduce-scatter, all-gather and barrier on device pointers, plus timings;
//! and the device weight digest (WordMix64's CUDA kernel) against its CPU
//! reference, with its speed against a device-to-device copy of the same bytes.
//! Ignored by default: run with `cargo test -p rlmesh-comm --test nccl_gpu -- --ignored --nocapture`
//! on a machine with a CUDA GPU and `libnccl.so` on `LD_LIBRARY_PATH`.

use std::ffi::c_void;
use std::time::Instant;

use cudarc::driver::result as cu;
use rlmesh_comm::device_digest::{word_mix_digest, word_mix_finish, word_mix_sum, DeviceDigest};
use rlmesh_comm::{nccl, Bf16, Buf, Collective, DType, NcclComm, NcclId, ReduceOp};

fn upload<T: Copy>(host: &[T]) -> u64 {
    unsafe {
        let d = cu::malloc_sync(std::mem::size_of_val(host).max(4)).expect("cuMemAlloc");
        cu::memcpy_htod_sync(d, host).expect("upload");
        d
    }
}

fn download<T: Copy + Default>(d: u64, n: usize) -> Vec<T> {
    let mut v = vec![T::default(); n];
    unsafe { cu::memcpy_dtoh_sync(&mut v, d).expect("download") };
    v
}

fn buf(d: u64, n: usize, dtype: DType) -> Buf<'static> {
    unsafe { Buf::cuda(d as *mut c_void, n, dtype, std::ptr::null_mut()) }
}

#[test]
#[ignore = "needs a CUDA GPU and libnccl.so on LD_LIBRARY_PATH"]
fn nccl_world_of_one_on_gpu() {
    nccl::nccl_available().expect("CUDA and NCCL present");
    println!("NCCL version {}", nccl::nccl_version().unwrap());
    let id = NcclId::new().expect("unique id");
    let id = NcclId::from_bytes(&id.to_bytes()).unwrap();
    let mut comm = NcclComm::new(0, 0, 1, &id).expect("communicator");
    assert_eq!((comm.rank(), comm.world_size()), (0, 1));

    let n = 1001;
    let host: Vec<f32> = (0..n).map(|i| i as f32 * 0.5).collect();
    let d = upload(&host);
    comm.all_reduce(buf(d, n, DType::F32), ReduceOp::Sum).unwrap();
    comm.all_reduce(buf(d, n, DType::F32), ReduceOp::Mean).unwrap();
    comm.broadcast(buf(d, n, DType::F32), 0).unwrap();
    comm.synchronize(std::ptr::null_mut()).unwrap();
    assert_eq!(download::<f32>(d, n), host);
    comm.reduce_scatter(buf(d, 1000, DType::F32), ReduceOp::Sum).unwrap();
    comm.all_gather(buf(d, 1000, DType::F32)).unwrap();
    comm.barrier().unwrap();
    assert_eq!(download::<f32>(d, n), host);
    assert!(comm.broadcast(buf(d, n, DType::F32), 1).is_err(), "root outside the world");

    let hb: Vec<u16> = (0..n).map(|i| Bf16::from_f32(i as f32).0).collect();
    let db = upload(&hb);
    comm.all_reduce(buf(db, n, DType::Bf16), ReduceOp::Sum).unwrap();
    comm.synchronize(std::ptr::null_mut()).unwrap();
    assert_eq!(download::<u16>(db, n), hb);

    // Enqueue cost per call. With world size 1 an in-place collective moves
    // no data (NCCL returns after a no-op), so this is not a bandwidth.
    for &(bytes, iters) in &[(1usize << 20, 50), (64 << 20, 20), (256 << 20, 10)] {
        let elems = bytes / 4;
        let big = unsafe { cu::malloc_sync(bytes).unwrap() };
        for (name, op) in [("all_reduce", 0), ("broadcast", 1)] {
            let run = |comm: &mut NcclComm| {
                if op == 0 {
                    comm.all_reduce(buf(big, elems, DType::F32), ReduceOp::Sum).unwrap()
                } else {
                    comm.broadcast(buf(big, elems, DType::F32), 0).unwrap()
                }
            };
            run(&mut comm);
            comm.synchronize(std::ptr::null_mut()).unwrap();
            let t0 = Instant::now();
            for _ in 0..iters {
                run(&mut comm);
            }
            comm.synchronize(std::ptr::null_mut()).unwrap();
            let t = t0.elapsed().as_secs_f64() / iters as f64;
            println!("nccl {name} world 1 (in place), {:>4} MiB: {:.2} us/call", bytes >> 20, t * 1e6);
        }
        unsafe { cu::free_sync(big).unwrap() };
    }
    unsafe {
        cu::free_sync(d).unwrap();
        cu::free_sync(db).unwrap();
    }
}

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed;
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            (x >> 56) as u8
        })
        .collect()
}

#[test]
#[ignore = "needs a CUDA GPU and libnvrtc on LD_LIBRARY_PATH"]
fn device_digest_matches_the_cpu_reference_and_is_timed() {
    let mut dd = DeviceDigest::new(0).expect("CUDA and NVRTC present");
    let stream = std::ptr::null_mut();
    for (i, &n) in [0usize, 1, 7, 8, 9, 1000, 4093, 1 << 20, (1 << 20) + 3, (64 << 20) + 5].iter().enumerate() {
        let host = random_bytes(n, i as u64 + 1);
        let d = upload(&host);
        let got = unsafe { dd.digest(d, n, stream) }.unwrap();
        assert_eq!(got, word_mix_digest(&host), "{n} bytes: device digest differs from the CPU reference");
        if n >= 4096 {
            // Pieces hashed separately on the device add up to the whole.
            let cut = (n / 2) & !7;
            let a = unsafe { dd.enqueue_sum(d, cut, 0, stream).and_then(|_| dd.read_sum(stream)) }.unwrap();
            let b = unsafe { dd.enqueue_sum(d + cut as u64, n - cut, (cut / 8) as u64, stream).and_then(|_| dd.read_sum(stream)) }.unwrap();
            assert_eq!(a, word_mix_sum(&host[..cut], 0));
            assert_eq!(word_mix_finish(a.wrapping_add(b), n as u64), got);
        }
        unsafe { cu::free_sync(d).unwrap() };
    }
    assert!(unsafe { dd.digest(1, 8, stream) }.is_err(), "a misaligned pointer is refused");

    // Speed: the kernel over 256 MiB against a device-to-device copy of the
    // same bytes (the fastest any transfer could deliver them), alternating.
    let bytes = 256usize << 20;
    let src = unsafe { cu::malloc_sync(bytes).unwrap() };
    let dst = unsafe { cu::malloc_sync(bytes).unwrap() };
    unsafe { cu::memset_d8_sync(src, 0x5a, bytes).unwrap() };
    let iters = 20;
    let (mut td, mut tc) = (Vec::new(), Vec::new());
    for round in 0..6 {
        let t0 = Instant::now();
        for _ in 0..iters {
            unsafe { dd.enqueue_sum(src, bytes, 0, stream).unwrap() };
        }
        dd.read_sum(stream).unwrap();
        let t_digest = t0.elapsed().as_secs_f64() / iters as f64;
        let t0 = Instant::now();
        for _ in 0..iters {
            unsafe { cu::memcpy_dtod_async(dst, src, bytes, stream as _).unwrap() };
        }
        unsafe { cu::stream::synchronize(stream as _).unwrap() };
        let t_copy = t0.elapsed().as_secs_f64() / iters as f64;
        if round > 0 {
            td.push(t_digest);
            tc.push(t_copy);
        }
    }
    td.sort_by(f64::total_cmp);
    tc.sort_by(f64::total_cmp);
    let (t_digest, t_copy) = (td[td.len() / 2], tc[tc.len() / 2]);
    let share = t_digest / (t_digest + t_copy);
    println!(
        "{{\"check\": \"device_digest\", \"ok\": true, \"mib\": 256, \"digest_gbps\": {:.1}, \"dtod_copy_gbps\": {:.1}, \"share_if_moved_at_copy_speed\": {:.4}}}",
        bytes as f64 / t_digest / 1e9,
        bytes as f64 / t_copy / 1e9,
        share
    );
    unsafe {
        cu::free_sync(src).unwrap();
        cu::free_sync(dst).unwrap();
    }
}
