//! The system underneath the test hosts: programs found on PATH, `ip`
//! commands, the processes in a namespace, the address ranges already in use,
//! and the removal of a dead fixture's leftovers.
use std::fs;
use std::io::{self, Read};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use super::*;

/// Find `prog` on PATH (or at one of `extra` paths).
pub(super) fn find_program(prog: &str, extra: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .map(|d| d.join(prog))
        .chain(extra.iter().map(PathBuf::from))
        .find(|p| p.is_file())
}

pub(super) fn sshd_program() -> Option<PathBuf> {
    find_program("sshd", &["/usr/sbin/sshd", "/usr/local/sbin/sshd", "/sbin/sshd"])
}

/// Run a command, returning its output if it succeeded.
pub(super) fn run(step: &str, cmd: &mut Command) -> Result<Output, TestHostsError> {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .map_err(|e| setup_err(step, format!("{cmd:?}: {e}")))?;
    if out.status.success() {
        Ok(out)
    } else {
        Err(setup_err(step, format!("{cmd:?}: {}: {}", out.status, String::from_utf8_lossy(&out.stderr).trim())))
    }
}

/// Run `ip ARGS`; a permission error means this machine cannot make test hosts (skip).
pub(super) fn run_or_unavailable(step: &str, args: &[&str]) -> Result<(), TestHostsError> {
    let o = ip(args).stdin(Stdio::null()).output().map_err(|e| setup_err(step, e.to_string()))?;
    if o.status.success() {
        return Ok(());
    }
    let err = String::from_utf8_lossy(&o.stderr).trim().to_string();
    if err.contains("Operation not permitted") || err.contains("Permission denied") {
        return Err(TestHostsError::Unavailable(format!(
            "cannot create network namespaces and interfaces here (`{step}` says: {err}); \
             a container without CAP_SYS_ADMIN / CAP_NET_ADMIN?"
        )));
    }
    Err(setup_err(step, err))
}

pub(super) fn ip(args: &[&str]) -> Command {
    let mut c = Command::new("ip");
    c.args(args);
    c
}

/// Run `ip ARGS`, ignoring failure (teardown).
pub(super) fn ip_quiet(args: &[&str]) {
    let _ = ip(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).status();
}

pub(super) fn pid_alive(pid: u32) -> bool {
    // SAFETY: signal 0 only checks for existence.
    let rc = unsafe { libc::kill(pid as libc::pid_t, 0) };
    rc == 0 || io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// The pids in namespace `ns` (`ip netns pids`).
pub(super) fn netns_pids(ns: &str) -> Vec<u32> {
    ip(&["netns", "pids", ns])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).split_whitespace().filter_map(|p| p.parse().ok()).collect())
        .unwrap_or_default()
}

/// Every IPv4 network (address/prefix) of the root namespace's interfaces and routes.
pub(super) fn used_networks() -> Vec<(String, u32, u8)> {
    let mut out = Vec::new();
    if let Ok(o) = ip(&["-o", "-4", "addr", "show"]).stdin(Stdio::null()).output() {
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            let w: Vec<&str> = line.split_whitespace().collect();
            let dev = w.get(1).copied().unwrap_or("").to_string();
            if let Some(i) = w.iter().position(|x| *x == "inet") {
                if let Some((a, p)) = w.get(i + 1).and_then(|c| parse_cidr(c)) {
                    out.push((dev, a, p));
                }
            }
        }
    }
    if let Ok(o) = ip(&["-o", "-4", "route", "show", "table", "all"]).stdin(Stdio::null()).output() {
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            let first = line.split_whitespace().next().unwrap_or("");
            let first = if ["local", "broadcast", "unicast"].contains(&first) {
                line.split_whitespace().nth(1).unwrap_or("")
            } else {
                first
            };
            if first == "default" {
                continue;
            }
            let dev = line
                .split_whitespace()
                .skip_while(|w| *w != "dev")
                .nth(1)
                .unwrap_or("")
                .to_string();
            let c = if first.contains('/') { first.to_string() } else { format!("{first}/32") };
            if let Some((a, p)) = parse_cidr(&c) {
                out.push((dev, a, p));
            }
        }
    }
    out
}

pub(super) fn parse_cidr(c: &str) -> Option<(u32, u8)> {
    let (a, p) = c.split_once('/')?;
    let a: Ipv4Addr = a.parse().ok()?;
    let p: u8 = p.parse().ok()?;
    (p <= 32).then_some((u32::from(a), p))
}

pub(super) fn overlaps(a: u32, pa: u8, b: u32, pb: u8) -> bool {
    let p = pa.min(pb);
    let mask = if p == 0 { 0 } else { u32::MAX << (32 - p) };
    a & mask == b & mask
}

pub(super) fn write_file(path: &Path, text: &str) -> Result<(), TestHostsError> {
    fs::write(path, text).map_err(|e| setup_err("write", format!("{}: {e}", path.display())))
}

/// TERM everything in `namespaces`, then KILL what is left after a moment.
pub(super) fn kill_in_namespaces(namespaces: &[String]) {
    let signal_all = |sig: i32| -> bool {
        let mut any = false;
        for ns in namespaces {
            for p in netns_pids(ns) {
                any = true;
                // SAFETY: kill(2) on a pid that `ip netns pids` lists in our own namespace.
                unsafe { libc::kill(p as libc::pid_t, sig) };
            }
        }
        any
    };
    if !signal_all(libc::SIGTERM) {
        return;
    }
    let deadline = Instant::now() + Duration::from_millis(1000);
    while Instant::now() < deadline {
        thread::sleep(Duration::from_millis(20));
        if namespaces.iter().all(|ns| netns_pids(ns).is_empty()) {
            return;
        }
    }
    signal_all(libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_millis(1000);
    while Instant::now() < deadline && !namespaces.iter().all(|ns| netns_pids(ns).is_empty()) {
        thread::sleep(Duration::from_millis(20));
    }
}

/// Remove the namespaces, bridges and directories of fixtures whose process is gone.
pub(super) fn remove_stale() {
    let Ok(o) = ip(&["netns", "list"]).stdin(Stdio::null()).stderr(Stdio::null()).output() else { return };
    let dead = |tag: &str| {
        tag.split_once('x')
            .and_then(|(p, _)| u32::from_str_radix(p, 16).ok())
            .is_some_and(|p| !pid_alive(p))
    };
    let mut stale_ns = Vec::new();
    let mut stale_tags = Vec::new();
    for line in String::from_utf8_lossy(&o.stdout).lines() {
        let ns = line.split_whitespace().next().unwrap_or("");
        let Some(rest) = ns.strip_prefix(NS_PREFIX) else { continue };
        let Some((tag, _)) = rest.rsplit_once("-h") else { continue };
        if dead(tag) {
            stale_ns.push(ns.to_string());
            if !stale_tags.contains(&tag.to_string()) {
                stale_tags.push(tag.to_string());
            }
        }
    }
    if let Ok(o) = ip(&["-o", "link", "show", "type", "bridge"]).stdin(Stdio::null()).output() {
        for line in String::from_utf8_lossy(&o.stdout).lines() {
            let name = line.split_whitespace().nth(1).unwrap_or("").trim_end_matches(':');
            if let Some(tag) = name.strip_prefix(BRIDGE_PREFIX) {
                if dead(tag) && !stale_tags.contains(&tag.to_string()) {
                    stale_tags.push(tag.to_string());
                }
            }
        }
    }
    if stale_ns.is_empty() && stale_tags.is_empty() {
        return;
    }
    kill_in_namespaces(&stale_ns);
    for ns in &stale_ns {
        ip_quiet(&["netns", "del", ns]);
        let _ = fs::remove_dir_all(Path::new("/etc/netns").join(ns));
    }
    for tag in &stale_tags {
        ip_quiet(&["link", "del", &format!("{BRIDGE_PREFIX}{tag}")]);
        let _ = fs::remove_dir_all(std::env::temp_dir().join(format!("rlmesh-testhosts-{tag}")));
    }
}

/// Does an SSH server answer at `addr` (its banner starts with `SSH-`)?
pub(super) fn banner(addr: SocketAddr) -> bool {
    let Ok(mut s) = TcpStream::connect_timeout(&addr, Duration::from_millis(200)) else { return false };
    let _ = s.set_read_timeout(Some(Duration::from_millis(500)));
    let mut b = [0u8; 4];
    s.read_exact(&mut b).is_ok() && &b == b"SSH-"
}
