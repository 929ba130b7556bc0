//! A wrong peer is refused with a clear error, and a dead or silent peer is
//! an error within the timeout, never a hang.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use common::run_world;
use rlmesh_comm::cpu::wire;
use rlmesh_comm::testing::{free_loopback_addr, run_ranks};
use rlmesh_comm::worker::{WorkerArgs, WorkerOp};
use rlmesh_comm::ReduceOp;

#[test]
fn wrong_cookie_is_refused_on_both_sides() {
    let run = run_world(2, |rank, a| {
        a.connect_timeout = Duration::from_secs(2);
        if rank == 1 {
            a.cookie = "some-other-job".into();
        }
    });
    let (r0, r1) = (&run.outputs[0], &run.outputs[1]);
    assert!(!r0.success() && !r1.success());
    assert!(
        r1.stderr.contains("refused") && r1.stderr.contains("cookie mismatch") && r1.stderr.contains("rank 0"),
        "rank 1 should say rank 0 refused its cookie: {}",
        r1.stderr
    );
    assert!(
        r0.stderr.contains("did not register") && r0.stderr.contains("cookie mismatch"),
        "rank 0 should name the missing rank and the refusal: {}",
        r0.stderr
    );
    assert!(r0.elapsed < Duration::from_secs(8), "rank 0 waited {:?}", r0.elapsed);
}

#[test]
fn other_protocol_version_is_refused_with_the_reason() {
    let addr = free_loopback_addr();
    let addr2 = addr.clone();
    let client = std::thread::spawn(move || {
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut s = loop {
            match TcpStream::connect(&addr2) {
                Ok(s) => break s,
                Err(_) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(20)),
                Err(e) => panic!("rank 0 never listened: {e}"),
            }
        };
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut hello = Vec::new();
        hello.extend_from_slice(&wire::MAGIC);
        hello.extend_from_slice(&99u16.to_le_bytes());
        hello.extend_from_slice(&[0u8; 13]);
        s.write_all(&hello).unwrap();
        let reason = wire::read_verdict(&mut s).unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        reason
    });
    let outs = run_ranks(&common::worker(), 1, common::DEADLINE, |_| {
        // A world of 2 where only rank 0 is real: the test plays rank 1.
        let mut a = WorkerArgs::new(0, 2, addr.clone());
        a.connect_timeout = Duration::from_secs(2);
        a.to_args()
    })
    .unwrap();
    let reason = client.join().unwrap().expect("refused");
    assert!(reason.contains("protocol version 99"), "{reason}");
    assert!(!outs[0].success());
    assert!(outs[0].stderr.contains("protocol version 99"), "{}", outs[0].stderr);
}

#[test]
fn dead_peer_is_an_error_naming_it_within_the_timeout() {
    let timeout = Duration::from_secs(5);
    let run = run_world(3, |rank, a| {
        a.op = WorkerOp::AllReduce(ReduceOp::Sum);
        a.len = 100_000;
        a.iters = 50;
        a.timeout = timeout;
        if rank == 2 {
            a.die_after = Some(3);
        }
    });
    let all_err: String = run.outputs.iter().map(|o| o.stderr.clone()).collect();
    for o in &run.outputs[..2] {
        assert!(!o.success(), "rank {} should fail", o.rank);
        assert!(o.status.is_some(), "rank {} hung until killed", o.rank);
        assert!(o.elapsed < timeout + Duration::from_secs(3), "rank {} took {:?}", o.rank, o.elapsed);
    }
    assert!(all_err.contains("connection closed by rank 2"), "{all_err}");
}

#[test]
fn silent_peer_is_a_timeout_error() {
    let timeout = Duration::from_millis(1500);
    let run = run_world(3, |rank, a| {
        a.op = WorkerOp::AllReduce(ReduceOp::Sum);
        a.len = 1000;
        a.iters = 10;
        a.timeout = timeout;
        if rank == 1 {
            a.stall_after = Some(2);
        }
    });
    let all_err: String = run.outputs.iter().map(|o| o.stderr.clone()).collect();
    for o in [&run.outputs[0], &run.outputs[2]] {
        assert!(!o.success(), "rank {} should fail", o.rank);
        assert!(o.elapsed < timeout * 2 + Duration::from_secs(2), "rank {} took {:?}", o.rank, o.elapsed);
    }
    assert!(all_err.contains("timed out after 1.5s") && all_err.contains("rank 1"), "{all_err}");
}

#[test]
fn mismatched_calls_are_reported_not_mixed_up() {
    let run = run_world(2, |rank, a| {
        a.check = false;
        a.len = if rank == 0 { 100 } else { 200 };
    });
    let all_err: String = run.outputs.iter().map(|o| o.stderr.clone()).collect();
    assert!(run.outputs.iter().all(|o| !o.success()));
    assert!(all_err.contains("collective mismatch") && all_err.contains("all_reduce of 200 f32"), "{all_err}");
}

/// The cookie never travels on a command line (every user of the host reads
/// those): the flag is refused, naming the variable to use instead.
#[test]
fn a_cookie_flag_is_refused_for_the_environment_variable() {
    let outs = run_ranks(&common::worker(), 1, common::DEADLINE, |_| {
        let mut v = WorkerArgs::new(0, 1, free_loopback_addr()).to_args();
        v.extend(["--cookie".to_string(), "s3cret".to_string()]);
        v
    })
    .unwrap();
    assert!(!outs[0].success());
    assert!(outs[0].stderr.contains("RLMESH_COMM_COOKIE"), "{}", outs[0].stderr);
    assert!(!WorkerArgs::new(0, 1, "127.0.0.1:1").to_args().iter().any(|a| a.contains("cookie")));
}

/// An abort from another thread (the ring's `ncclCommAbort`) ends a collective
/// blocked on a silent peer at once, long before the timeout, on this rank and
/// on the peer through the closed links.
#[test]
fn an_abort_ends_a_blocked_collective_at_once_on_every_rank() {
    use rlmesh_comm::{Buf, Collective, RingComm, RingConfig};
    // Rank 0 is given its listener, bound before rank 1 starts dialling: a
    // port merely probed free can be taken before rank 0 binds it (seen once in CI).
    let (addr, listener) = rlmesh_comm::testing::reserved_loopback();
    let cfg = |rank| RingConfig::new(rank, 2, addr.clone()).cookie("abort-test").timeout(Duration::from_secs(60));
    let (c1, a2) = (cfg(1), cfg(0).root_listener(listener));
    let one = std::thread::spawn(move || {
        let mut comm = RingComm::connect(c1).unwrap();
        let abort = comm.abort_handle().unwrap();
        let t0 = Instant::now();
        let aborter = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(300));
            abort.abort();
        });
        // Rank 0 never sends: only the abort can end this wait.
        let mut buf = vec![0f32; 1024];
        let r = comm.broadcast(Buf::host(&mut buf), 0);
        aborter.join().unwrap();
        (r.is_err(), t0.elapsed())
    });
    let mut zero = RingComm::connect(a2).unwrap();
    let (failed, waited) = one.join().unwrap();
    assert!(failed, "the aborted broadcast returned Ok");
    assert!(waited < Duration::from_secs(5), "the abort took {waited:?} (timeout 60 s)");
    // The peer's next collective fails at once too: its links are closed.
    let t0 = Instant::now();
    let mut buf = vec![1f32; 1024];
    assert!(zero.all_reduce(Buf::host(&mut buf), rlmesh_comm::ReduceOp::Sum).is_err());
    assert!(t0.elapsed() < Duration::from_secs(5), "the peer waited {:?}", t0.elapsed());
}

/// A rendezvous port taken between its probe and rank 0's bind (here: held by
/// the test for the first try) fails that world with "Address already in
/// use"; the world runs again on another port and succeeds.
#[test]
fn a_world_whose_port_was_taken_runs_again_elsewhere() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_addr = taken.local_addr().unwrap().to_string();
    let tries = std::sync::Mutex::new(0usize);
    let outs = rlmesh_comm::testing::run_ranks_on_free_port(&common::worker(), 2, common::DEADLINE, |addr, rank| {
        let mut n = tries.lock().unwrap();
        if rank == 0 {
            *n += 1;
        }
        let addr = if *n == 1 { taken_addr.clone() } else { addr.to_string() };
        let mut a = WorkerArgs::new(rank, 2, addr);
        a.cookie = "test-cookie".into();
        a.connect_timeout = Duration::from_secs(2);
        (a.to_args(), a.env())
    })
    .unwrap();
    assert_eq!(*tries.lock().unwrap(), 2, "one failed world, then one on another port");
    for o in &outs {
        assert!(o.success(), "rank {} failed on the second port: {}", o.rank, o.stderr);
    }
    drop(taken);
}
