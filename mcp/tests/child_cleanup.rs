//! No tool-server process outlives its owner: dropping a session kills its
//! child's whole process group, and when the owner process is killed outright
//! its child dies with it (the parent-death signal) and a server below it
//! exits at the end of its stdin.
mod common;
use common::*;
use rlmesh_mcp::{McpServer, ServerSpec, SessionMode};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

/// A stdio server behind a shell that also leaves a `sleep` in its process group.
fn wrapped(py: &str) -> ServerSpec {
    let script = format!("sleep 600 & exec {py} {} stdio", server_file("tools_server.py"));
    ServerSpec { session: SessionMode::PerRollout, ..ServerSpec::stdio("wrapped", ["sh", "-c", &script]) }
}

#[test]
fn dropping_a_session_kills_its_process_group() {
    let py = require!(python());
    let server = McpServer::start(wrapped(&py)).unwrap();
    let session = server.session(None).unwrap();
    let pid = session.pid().unwrap();
    assert_eq!(session.call("pid", &serde_json::json!({})).unwrap(), pid.to_string(), "the shell exec'd the server");
    let members = group_members(pid);
    assert_eq!(members.len(), 2, "the server and its sleep: {members:?}");
    drop(session);
    assert!(eventually(Duration::from_secs(5), || group_members(pid).is_empty()), "left: {:?}", group_members(pid));
    drop(server);
}

/// The pids of live processes whose command line holds `marker`.
fn with_marker(marker: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        if alive(pid) && String::from_utf8_lossy(&cmdline).contains(marker) {
            out.push(pid);
        }
    }
    out
}

#[test]
fn dropping_a_server_kills_its_prestarted_sessions_and_open_ones() {
    let py = require!(python());
    let marker = format!("marker-{}-prestart", std::process::id());
    let spec = ServerSpec {
        session: SessionMode::PerRollout,
        prestart: 2,
        ..ServerSpec::stdio("spares", [py.as_str(), &server_file("tools_server.py"), "stdio", &marker])
    };
    let server = McpServer::start(spec).unwrap();
    assert!(eventually(Duration::from_secs(30), || with_marker(&marker).len() == 2), "two spares: {:?}", with_marker(&marker));
    let a = server.session(None).unwrap();
    let b = server.session(None).unwrap();
    assert_ne!(a.pid(), b.pid());
    assert!(eventually(Duration::from_secs(30), || with_marker(&marker).len() == 4), "two open, two spares: {:?}", with_marker(&marker));
    drop(server);
    assert_eq!(a.call("add", &serde_json::json!({"a": 1})).unwrap(), "1", "open sessions outlive the server's handle");
    drop((a, b));
    assert!(eventually(Duration::from_secs(5), || with_marker(&marker).is_empty()), "left: {:?}", with_marker(&marker));
}

/// Run by the test below in a child test process: starts a server, prints
/// its pid, then waits to be killed.
#[test]
fn orphan_helper() {
    if std::env::var("RLMESH_MCP_ORPHAN_HELPER").is_err() {
        return;
    }
    let py = python().unwrap();
    // The server runs under a shell that does not exec it: the shell is the
    // child (armed with the parent-death signal), the server its child.
    let script = format!("{py} {} stdio; true", server_file("tools_server.py"));
    let server = McpServer::start(ServerSpec::stdio("nested", ["sh", "-c", &script])).unwrap();
    assert_eq!(group_members(server.pid().unwrap()).len(), 2);
    println!("server-pid {}", server.pid().unwrap());
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
fn a_child_dies_with_its_owner_even_when_the_owner_is_killed() {
    let _py = require!(python());
    let mut owner = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "orphan_helper", "--nocapture", "--test-threads=1"])
        .env("RLMESH_MCP_ORPHAN_HELPER", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    struct Reap(std::process::Child);
    impl Drop for Reap {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let stdout = owner.stdout.take().unwrap();
    let owner = Reap(owner);
    let pid: u32 = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|l| l.rsplit_once("server-pid ").map(|(_, p)| p.trim().parse().unwrap()))
        .expect("the helper prints the server's pid");
    assert!(alive(pid));
    // SAFETY: kill(2) on the helper process this test started.
    unsafe { libc::kill(owner.0.id() as i32, libc::SIGKILL) };
    // The shell dies with its owner; the server, a grandchild, reads the end
    // of its stdin (the owner's side of the pipe is gone) and exits, as MCP's
    // stdio lifecycle has it.
    let gone = eventually(Duration::from_secs(10), || group_members(pid).is_empty());
    let left = group_members(pid);
    // SAFETY: killpg(2) on the group the helper's server led: clean up before asserting.
    unsafe { libc::killpg(pid as i32, libc::SIGKILL) };
    assert!(gone, "left after the owner was killed: {left:?}");
}
