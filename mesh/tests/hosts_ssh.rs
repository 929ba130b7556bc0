//! Hosts as network namespaces (mesh::testing::TestHosts) reached over real
//! ssh, and mesh::launch starting, signalling and stopping processes there.
//! Where namespaces cannot be created, each test prints SKIPPED and passes.
use std::path::Path;
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use rlmesh_mesh::launch::{Exit, Host, LaunchError, Launcher, ProcessSpec, Signal, SshConfig};
use rlmesh_mesh::testing::TestHosts;

fn ok(out: Output) -> String {
    assert!(
        out.status.success(),
        "{}: {}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn ip_output(args: &[&str]) -> String {
    String::from_utf8(Command::new("ip").args(args).output().unwrap().stdout).unwrap()
}

/// Every process's argv on this machine (the namespaces share its pid namespace).
fn all_cmdlines() -> Vec<String> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if e.file_name().to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
                v.push(String::from_utf8_lossy(&c).replace('\0', " "));
            }
        }
    }
    v
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "))
}

#[test]
fn three_hosts_reached_by_name_over_ssh() {
    let Some(hosts) = TestHosts::start_or_skip(3) else { return };
    eprintln!("3 hosts on {} set up in {:?}", hosts.subnet(), hosts.setup_time());
    assert_eq!(hosts.names(), ["h0", "h1", "h2"]);
    for i in 0..3 {
        let out = ok(hosts.ssh(i).args(["--", "hostname; ip -o -4 addr show"]).output().unwrap());
        let mut lines = out.lines();
        assert_eq!(lines.next(), Some(hosts.name(i)), "{out}");
        assert!(out.contains(&format!("inet {}/24", hosts.address(i))), "{out}");
        for j in (0..3).filter(|&j| j != i) {
            assert!(!out.contains(&format!("inet {}/", hosts.address(j))), "h{j}'s address seen in h{i}: {out}");
        }
        // Only the /24 route: no default route out of the namespace.
        assert!(!ip_output(&["-n", hosts.namespace(i), "route", "show"]).contains("default"));
    }
    // Names resolve inside the hosts, and a host reaches another by name.
    let out = ok(hosts.ssh(1).args(["--", "getent hosts h2"]).output().unwrap());
    assert!(out.contains(&hosts.address(2).to_string()), "{out}");
    let cfg = hosts.ssh_config_path();
    let out = ok(hosts
        .ssh(0)
        .args(["--", &format!("ssh -F {} h2 hostname", cfg.display())])
        .output()
        .unwrap());
    assert_eq!(out.trim(), "h2");
}

#[test]
fn launch_over_ssh_secret_signal_stop_and_errors() {
    let Some(hosts) = TestHosts::start_or_skip(3) else { return };
    let dir = tempfile::tempdir().unwrap();

    // A secret reaches the remote process through ssh's stdin, never argv.
    let secret = format!("rlmesh-secret-{}-{:?}", std::process::id(), Instant::now());
    let log = dir.path().join("h1.log");
    let mut spec = ProcessSpec::new(
        "sh",
        ["-c", "echo \"host=$(hostname) plain=$PLAIN secret=$RLMESH_TEST_SECRET cwd=$(pwd)\"; exec sleep 30"],
    );
    spec.env.insert("PLAIN".into(), "it's plain".into());
    spec.secret_env.insert("RLMESH_TEST_SECRET".into(), secret.clone());
    spec.cwd = Some("/tmp".into());
    spec.log = Some(log.clone());
    let launcher = Launcher::new(hosts.host(1));
    let t = Instant::now();
    let mut p = launcher.spawn(&spec).unwrap();
    eprintln!("remote spawn took {:?}", t.elapsed());
    assert!(hosts.pids(1).contains(&p.pid()), "pid {} not in h1's namespace", p.pid());
    assert!(!hosts.pids(2).contains(&p.pid()));
    let deadline = Instant::now() + Duration::from_secs(10);
    let text = loop {
        let t = std::fs::read_to_string(&log).unwrap_or_default();
        if t.contains("secret=") || Instant::now() > deadline {
            break t;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(text.contains(&format!("host=h1 plain=it's plain secret={secret} cwd=/tmp")), "{text}");
    let leaked: Vec<String> = all_cmdlines().into_iter().filter(|c| c.contains(&secret)).collect();
    assert!(leaked.is_empty(), "secret in argv: {leaked:?}");
    // The remote process has it in its environment. The echo above runs just
    // before `exec sleep`; while that exec is under way the kernel shows an
    // empty environ, so wait for the exec to finish before reading it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::read(format!("/proc/{}/cmdline", p.pid())).unwrap_or_default().starts_with(b"sleep\0")
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    let env = std::fs::read(format!("/proc/{}/environ", p.pid())).unwrap();
    assert!(String::from_utf8_lossy(&env).contains(&format!("RLMESH_TEST_SECRET={secret}")));

    // Signal through the handle: only that process, then it is gone.
    let pid = p.pid();
    p.signal(Signal::Term).unwrap();
    let exit = p.wait_timeout(Duration::from_secs(10)).unwrap().expect("TERM did not stop it");
    assert_eq!(exit, Exit::Lost, "ssh reports a remote death by signal as 255");
    assert!(!alive(pid));
    assert!(matches!(p.signal(Signal::Term), Err(LaunchError::NotRunning { .. })));

    // Exit codes come back.
    let mut p = launcher.spawn(&ProcessSpec::new("sh", ["-c", "exit 3"])).unwrap();
    assert_eq!(p.wait().unwrap(), Exit::Code(3));

    // A pid that no longer matches the recorded start time is not signalled.
    let mut p = launcher.spawn(&ProcessSpec::new("sleep", ["30"])).unwrap();
    let pid = p.pid();
    let out = Launcher::new(hosts.host(1))
        .run_script(&rlmesh_mesh::launch::remote_signal_script(pid, "1", "-", Signal::Kill))
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    assert!(alive(pid));

    // stop() and kill-on-drop reach the remote process.
    assert_eq!(p.stop(Duration::from_secs(5)).unwrap(), Exit::Lost);
    assert!(!alive(pid));
    let p = Launcher::new(hosts.host(2)).spawn(&ProcessSpec::new("sleep", ["30"])).unwrap();
    let pid = p.pid();
    assert!(hosts.pids(2).contains(&pid));
    let t = Instant::now();
    drop(p);
    eprintln!("remote kill-on-drop took {:?}", t.elapsed());
    assert!(!alive(pid), "dropped handle left its remote process running");

    // Errors: a missing program, a host with nothing listening.
    let e = launcher.spawn(&ProcessSpec::new("no-such-program-rlmesh", ["x"])).unwrap_err();
    assert!(matches!(e, LaunchError::StartFailed { .. }), "{e}");
    assert!(e.to_string().contains("h1") && e.to_string().contains("no-such-program-rlmesh"), "{e}");
    let closed = Host::Ssh {
        destination: hosts.name(0).to_string(),
        ssh: SshConfig { port: Some(9), connect_timeout_s: 3, ..hosts.ssh_config() },
    };
    let t = Instant::now();
    let e = Launcher::new(closed).spawn(&ProcessSpec::new("true", Vec::<String>::new())).unwrap_err();
    let msg = e.to_string();
    assert!(matches!(e, LaunchError::Connect { .. }), "{msg}");
    assert!(msg.contains("h0") && msg.contains("exit 255") && msg.contains("refused"), "{msg}");
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[test]
fn teardown_leaves_nothing_even_after_a_panic() {
    if let Err(e) = TestHosts::available() {
        println!("SKIPPED: {e}");
        return;
    }
    struct Seen {
        namespaces: Vec<String>,
        bridge: String,
        sshd: Vec<u32>,
        stray: u32,
        dir: std::path::PathBuf,
        subnet: String,
    }
    let make = || {
        let hosts = TestHosts::start(2).unwrap();
        // A process left behind inside a host, as a crashed test would leave it.
        let out = ok(hosts.ssh(1).args(["--", "nohup sleep 300 >/dev/null 2>&1 </dev/null & echo $!"]).output().unwrap());
        let stray: u32 = out.trim().parse().unwrap();
        assert!(alive(stray));
        let seen = Seen {
            namespaces: (0..2).map(|i| hosts.namespace(i).to_string()).collect(),
            bridge: hosts.bridge().to_string(),
            sshd: (0..2).map(|i| hosts.sshd_pid(i).unwrap()).collect(),
            stray,
            dir: hosts.dir().to_path_buf(),
            subnet: hosts.subnet(),
        };
        (hosts, seen)
    };
    let check = |s: &Seen| {
        let netns = ip_output(&["netns", "list"]);
        for ns in &s.namespaces {
            assert!(!netns.contains(ns.as_str()), "namespace {ns} left: {netns}");
            assert!(!Path::new("/etc/netns").join(ns).exists());
        }
        let links = ip_output(&["-o", "link", "show"]);
        assert!(!links.contains(&format!(" {}:", s.bridge)), "bridge {} left", s.bridge);
        let veth = format!(" rm{}v", &s.bridge[3..]);
        assert!(!links.contains(&veth), "veth {veth}* left: {links}");
        for &p in s.sshd.iter().chain([&s.stray]) {
            assert!(!alive(p), "pid {p} left running");
        }
        assert!(!s.dir.exists());
    };

    // Two at once do not collide; a plain drop cleans up.
    let (a, sa) = make();
    let (b, sb) = make();
    assert_ne!(sa.subnet, sb.subnet);
    assert_ne!(sa.bridge, sb.bridge);
    let t = Instant::now();
    drop(a);
    eprintln!("teardown of 2 hosts with a stray process took {:?}", t.elapsed());
    check(&sa);
    drop(b);
    check(&sb);

    // A panicking test still tears down.
    let (tx, rx) = std::sync::mpsc::channel();
    let r = std::thread::spawn(move || {
        let (_hosts, seen) = make();
        tx.send(seen).unwrap();
        panic!("a failing test");
    })
    .join();
    assert!(r.is_err());
    check(&rx.recv().unwrap());
}

#[test]
fn three_hosts_set_up_and_torn_down_in_seconds() {
    let t = Instant::now();
    let Some(hosts) = TestHosts::start_or_skip(3) else { return };
    let setup = t.elapsed();
    // Every sshd really answers ssh.
    for i in 0..3 {
        assert_eq!(ok(hosts.ssh(i).args(["--", "hostname"]).output().unwrap()).trim(), hosts.name(i));
    }
    let t = Instant::now();
    drop(hosts);
    let teardown = t.elapsed();
    eprintln!("3 hosts: set-up {setup:?}, teardown {teardown:?}");
    assert!(setup < Duration::from_secs(10), "set-up took {setup:?}");
    assert!(teardown < Duration::from_secs(10), "teardown took {teardown:?}");
}

#[test]
fn lost_connection_then_stopped_through_a_new_one() {
    let Some(hosts) = TestHosts::start_or_skip(2) else { return };
    let mut ssh = hosts.ssh_config();
    ssh.server_alive_interval_s = 1;
    ssh.connect_timeout_s = 2;
    ssh.options.push("ServerAliveCountMax=1".into());
    let host = Host::Ssh { destination: hosts.name(1).to_string(), ssh };
    let mut p = Launcher::new(host.clone()).spawn(&ProcessSpec::new("sleep", ["60"])).unwrap();
    let pid = p.pid();
    hosts.cut(1).unwrap();
    let exit = p.wait_timeout(Duration::from_secs(15)).unwrap().expect("ssh did not notice the cut");
    assert_eq!(exit, Exit::Lost);
    assert!(alive(pid), "a lost connection ended the remote process");
    // While cut, asking is a connection error, not a wrong answer.
    let e = p.is_running().unwrap_err();
    assert!(matches!(e, LaunchError::Connect { .. }), "{e}");
    hosts.restore(1).unwrap();
    assert!(p.is_running().unwrap(), "still there after the link came back");
    assert_eq!(p.stop(Duration::from_secs(5)).unwrap(), Exit::Lost);
    assert!(!alive(pid));
    assert!(!p.is_running().unwrap());
}

#[test]
fn ship_a_program_then_run_it() {
    let Some(hosts) = TestHosts::start_or_skip(1) else { return };
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("tool.sh");
    std::fs::write(&src, "#!/bin/sh\necho \"tool on $(hostname): $*\"\n").unwrap();
    let dest = dir.path().join("remote dir/bin/tool");
    rlmesh_mesh::launch::ship(&hosts.host(0), &src, &dest).unwrap();
    // The namespaces share this filesystem, so the copy is visible here too.
    assert_eq!(std::fs::read(&dest).unwrap(), std::fs::read(&src).unwrap());
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(std::fs::metadata(&dest).unwrap().permissions().mode() & 0o777, 0o755);
    let log = dir.path().join("tool.log");
    let mut spec = ProcessSpec::new(dest.to_str().unwrap(), ["a b", "c"]);
    spec.log = Some(log.clone());
    let mut p = Launcher::new(hosts.host(0)).spawn(&spec).unwrap();
    assert_eq!(p.wait().unwrap(), Exit::Code(0));
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "tool on h0: a b c\n");
    // Locally, too.
    let dest2 = dir.path().join("local-tool");
    rlmesh_mesh::launch::ship(&Host::Local, &src, &dest2).unwrap();
    assert_eq!(std::fs::read(&dest2).unwrap(), std::fs::read(&src).unwrap());
}

/// Run by `leftovers_of_a_killed_run_are_removed` in a child process: make
/// hosts, say their names, then wait to be killed (so Drop never runs).
#[test]
fn helper_make_hosts_and_wait_to_be_killed() {
    if std::env::var_os("RLMESH_TESTHOSTS_HELPER").is_none() {
        return;
    }
    let hosts = TestHosts::start(2).unwrap();
    println!("HOSTS {} {} {} {}", hosts.namespace(0), hosts.namespace(1), hosts.bridge(), hosts.sshd_pid(0).unwrap());
    std::thread::sleep(Duration::from_secs(60));
}

#[test]
fn leftovers_of_a_killed_run_are_removed() {
    if let Err(e) = TestHosts::available() {
        println!("SKIPPED: {e}");
        return;
    }
    use std::io::BufRead;
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "helper_make_hosts_and_wait_to_be_killed", "--nocapture", "--test-threads=1"])
        .env("RLMESH_TESTHOSTS_HELPER", "1")
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let line = lines.find_map(|l| l.ok().filter(|l| l.contains("HOSTS "))).expect("helper gave no hosts");
    let w: Vec<&str> = line[line.find("HOSTS ").unwrap() + 6..].split_whitespace().collect();
    let (ns0, ns1, bridge, sshd): (&str, &str, &str, u32) = (w[0], w[1], w[2], w[3].parse().unwrap());
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(ip_output(&["netns", "list"]).contains(ns0), "the killed run left nothing to clean");
    assert!(alive(sshd));
    // The next fixture removes what the dead one left.
    let hosts = TestHosts::start(1).unwrap();
    let netns = ip_output(&["netns", "list"]);
    assert!(!netns.contains(ns0) && !netns.contains(ns1), "{netns}");
    assert!(!ip_output(&["-o", "link", "show"]).contains(&format!(" {bridge}:")));
    assert!(!alive(sshd), "the dead run's sshd still runs");
    drop(hosts);
}
