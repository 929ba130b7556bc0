//! The NCCL backend builds without CUDA and fails cleanly at run time when
//! CUDA or NCCL is missing: an error, never a panic.

use rlmesh_comm::{nccl_available, Buf, CommError, NcclComm, NcclId, RingComm, Collective, ReduceOp, DType};

#[test]
fn nccl_backend_without_cuda_is_an_error_not_a_panic() {
    let available = nccl_available();
    if available.is_ok() {
        eprintln!("CUDA and NCCL are present here; nothing to check for the absent case");
        return;
    }
    let msg = available.unwrap_err().to_string();
    eprintln!("{msg}");
    assert!(msg.contains("NCCL backend unavailable"), "{msg}");
    assert!(matches!(NcclId::new(), Err(CommError::NcclUnavailable(_))));
    let id = NcclId::from_bytes(&[0u8; 128]).unwrap();
    let err = NcclComm::new(0, 0, 1, &id).expect_err("no CUDA here");
    assert!(matches!(err, CommError::NcclUnavailable(_)), "{err}");
}

#[test]
fn nccl_id_round_trips_through_bytes_and_rejects_wrong_lengths() {
    let bytes: Vec<u8> = (0..128).map(|i| i as u8).collect();
    let id = NcclId::from_bytes(&bytes).unwrap();
    assert_eq!(id.to_bytes().to_vec(), bytes);
    assert!(NcclId::from_bytes(&bytes[..100]).is_err());
}

#[test]
fn cpu_ring_refuses_device_buffers() {
    let mut comm = RingComm::single();
    let buf = unsafe { Buf::cuda(8 as *mut _, 4, DType::F32, std::ptr::null_mut()) };
    let err = comm.all_reduce(buf, ReduceOp::Sum).unwrap_err();
    assert!(matches!(err, CommError::WrongMemory { .. }), "{err}");
}
