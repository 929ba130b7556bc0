//! NCCL on a real GPU, world size 1: all-reduce (sum, mean, bf16), broadcast,
//! reduce-scatter, all-gather and barrier on device pointers, plus timings.
//! Ignored by default: run with `cargo test -p rlmesh-comm --test nccl_gpu -- --ignored --nocapture`
//! on a machine with a CUDA GPU and `libnccl.so` on `LD_LIBRARY_PATH`.

use std::ffi::c_void;
use std::time::Instant;

use cudarc::driver::result as cu;
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
