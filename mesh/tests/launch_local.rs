//! mesh::launch on this machine: local children, shell quoting through a real `sh`.
use std::process::Command;
use std::time::{Duration, Instant};

use rlmesh_mesh::launch::{
    is_local_host, remote_signal_script, sh_join, sh_quote, Exit, Host, LaunchError, Launcher, OnDrop,
    ProcessSpec, Signal, SshConfig,
};

const NASTY: &[&str] = &[
    "",
    " ",
    "plain",
    "two words",
    "it's",
    "''",
    "'",
    "\"double\"",
    "back\\slash\\",
    "\\'",
    "$HOME",
    "${PATH}",
    "$(echo pwned)",
    "`echo pwned`",
    "a;b&c|d",
    "*",
    "?[a-z]",
    "~",
    "~root",
    "-n",
    "--",
    "#comment",
    "!bang",
    "new\nline",
    "tab\there",
    "trailing\n",
    "\r\n",
    "ünïcødé ✓",
    "a=b",
    "%s %d",
    "{a,b}",
    "<in >out 2>&1",
    "\u{7f}\u{1}",
];

fn sh_args(script: &str, args: &[&str]) -> Vec<String> {
    let out = Command::new("sh").arg("-c").arg(script).arg("sh").args(args).output().unwrap();
    assert!(out.status.success(), "{script}: {}", String::from_utf8_lossy(&out.stderr));
    // printf '%s\0' gives each word NUL-terminated.
    let s = String::from_utf8(out.stdout).unwrap();
    let mut v: Vec<String> = s.split('\0').map(String::from).collect();
    assert_eq!(v.pop().as_deref(), Some(""));
    v
}

#[test]
fn quoting_round_trips_through_sh() {
    for s in NASTY {
        let words = sh_args(&format!("printf '%s\\0' {}", sh_quote(s)), &[]);
        assert_eq!(words, vec![s.to_string()], "quoted as {}", sh_quote(s));
    }
    // All at once, as one joined line.
    let words = sh_args(&format!("printf '%s\\0' {}", sh_join(NASTY)), &[]);
    assert_eq!(words, NASTY.iter().map(|s| s.to_string()).collect::<Vec<_>>());
    // Two levels, as ssh does it: the login shell parses `sh -c 'SCRIPT'`, sh runs SCRIPT.
    let inner = format!("printf '%s\\0' {}", sh_join(NASTY));
    let outer = format!("sh -c {}", sh_quote(&inner));
    let words = sh_args(&outer, &[]);
    assert_eq!(words, NASTY.iter().map(|s| s.to_string()).collect::<Vec<_>>());
}

#[test]
fn remote_script_runs_under_sh_with_env_cwd_and_secrets() {
    // The script ssh would run, run here by sh with the secrets on stdin.
    let dir = tempfile::tempdir().unwrap();
    let mut spec = ProcessSpec::new("sh", ["-c", "printf '%s\\0' \"$@\" \"$PLAIN\" \"$SECRET\" \"$(pwd)\"", "x"]);
    spec.args.extend(NASTY.iter().map(|s| s.to_string()));
    spec.env.insert("PLAIN".into(), "it's $HOME `x`".into());
    spec.secret_env.insert("SECRET".into(), " s3cr3t \\ 'q' ".into());
    spec.cwd = Some(dir.path().to_path_buf());
    let script = spec.remote_script();
    assert!(!script.contains("s3cr3t"), "a secret in the script");
    let mut child = Command::new("sh")
        .arg("-c")
        .arg(&script)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child.stdin.take().unwrap().write_all(b" s3cr3t \\ 'q' \n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    let text = String::from_utf8(out.stdout).unwrap();
    let (first, rest) = text.split_once('\n').unwrap();
    let f: Vec<&str> = first.split(' ').collect();
    assert_eq!(&f[..2], ["rlmesh-launch", "pid"]);
    assert!(f[2].parse::<u32>().is_ok());
    assert!(f[3].parse::<u64>().is_ok(), "start time {first}");
    let mut words: Vec<&str> = rest.split('\0').collect();
    assert_eq!(words.pop(), Some(""));
    let n = NASTY.len();
    assert_eq!(&words[..n], NASTY);
    assert_eq!(words[n], "it's $HOME `x`");
    assert_eq!(words[n + 1], " s3cr3t \\ 'q' ");
    assert_eq!(words[n + 2], std::fs::canonicalize(dir.path()).unwrap().to_str().unwrap());
}

#[test]
fn remote_script_reports_missing_program_and_dir() {
    for (prog, cwd, code) in [("no-such-program-rlmesh", None, 127), ("true", Some("/no/such/dir"), 96)] {
        let mut spec = ProcessSpec::new(prog, Vec::<String>::new());
        spec.cwd = cwd.map(Into::into);
        let out = Command::new("sh").arg("-c").arg(spec.remote_script()).output().unwrap();
        assert_eq!(out.status.code(), Some(code), "{prog}");
        assert!(out.stdout.is_empty(), "a pid line before failing");
    }
}

#[test]
fn signal_script_checks_start_time() {
    // A local `sleep` stands in for the remote process; the script runs under sh.
    let mut child = Command::new("sleep").arg("30").spawn().unwrap();
    let pid = child.id();
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let rest = &stat[stat.rfind(") ").unwrap() + 2..];
    let start = rest.split(' ').nth(19).unwrap().to_string();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap().trim().to_string();
    let run = |st: &str, b: &str| {
        Command::new("sh").arg("-c").arg(remote_signal_script(pid, st, b, Signal::Term)).status().unwrap().code()
    };
    assert_eq!(run("1", &boot), Some(3), "wrong start time must not signal");
    assert_eq!(run(&start, "00000000-0000-0000-0000-000000000000"), Some(3), "wrong boot id must not signal");
    assert!(child.try_wait().unwrap().is_none(), "signalled although it did not match");
    assert_eq!(run(&start, &boot), Some(0));
    let st = child.wait().unwrap();
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(st.signal(), Some(15), "SIGTERM");
    // Gone: not signalled.
    assert_eq!(run(&start, &boot), Some(3));
}

#[test]
fn local_spawn_wait_and_exit_codes() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("p.log");
    let mut spec = ProcessSpec::new("sh", ["-c", "echo out; echo err >&2; echo \"$A $S\"; pwd; exit 7"]);
    spec.env.insert("A".into(), "plain".into());
    spec.secret_env.insert("S".into(), "hidden".into());
    spec.cwd = Some(dir.path().into());
    spec.log = Some(log.clone());
    let mut p = Launcher::local().spawn(&spec).unwrap();
    assert!(p.pid() > 0);
    assert!(p.host().is_local());
    assert_eq!(p.wait().unwrap(), Exit::Code(7));
    assert_eq!(p.wait().unwrap(), Exit::Code(7), "wait twice");
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("out\n") && text.contains("err\n") && text.contains("plain hidden\n"), "{text}");
    assert!(text.contains(dir.path().file_name().unwrap().to_str().unwrap()), "{text}");
    // Signalling an ended process is refused.
    assert!(matches!(p.signal(Signal::Term), Err(LaunchError::NotRunning { .. })));
}

#[test]
fn local_signal_and_stop() {
    let mut p = Launcher::local().spawn(&ProcessSpec::new("sleep", ["30"])).unwrap();
    assert_eq!(p.try_wait().unwrap(), None);
    p.signal(Signal::Term).unwrap();
    assert_eq!(p.wait().unwrap(), Exit::Signal(15));

    // stop(): TERM ignored, so KILL after the grace.
    let mut p = Launcher::local()
        .spawn(&ProcessSpec::new("sh", ["-c", "trap '' TERM; sleep 30 & wait; sleep 30"]))
        .unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let t = Instant::now();
    assert_eq!(p.stop(Duration::from_millis(300)).unwrap(), Exit::Signal(9));
    assert!(t.elapsed() < Duration::from_secs(5));
}

fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default().contains(") Z ")
}

#[test]
fn local_kill_on_drop_and_leave() {
    let p = Launcher::local().spawn(&ProcessSpec::new("sleep", ["30"])).unwrap();
    let pid = p.pid();
    assert!(alive(pid));
    drop(p);
    assert!(!alive(pid), "dropped handle left its process running");

    let p = Launcher::local().on_drop(OnDrop::Leave).spawn(&ProcessSpec::new("sleep", ["30"])).unwrap();
    let pid = p.pid();
    drop(p);
    assert!(alive(pid));
    // Clean up the one we left: it is still our unreaped child, so the pid is its own.
    let _ = Command::new("kill").arg(pid.to_string()).status();
}

#[test]
fn local_errors_name_the_command() {
    let e = Launcher::local().spawn(&ProcessSpec::new("/no/such/rlmesh-program", ["a b"])).unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("local") && msg.contains("/no/such/rlmesh-program 'a b'"), "{msg}");
    let mut spec = ProcessSpec::new("true", Vec::<String>::new());
    spec.env.insert("1BAD".into(), "x".into());
    assert!(matches!(Launcher::local().spawn(&spec), Err(LaunchError::InvalidSpec { .. })));
}

#[test]
fn local_addresses_start_locally() {
    for h in ["localhost", "127.0.0.1", "127.1.2.3", "::1"] {
        assert!(is_local_host(h), "{h}");
        assert_eq!(Host::resolve(h, SshConfig::default()), Host::Local);
    }
    assert!(matches!(Host::resolve("an-ssh-alias", SshConfig::default()), Host::Ssh { .. }));
    // A local launch through an address of this machine needs no ssh.
    let mut p = Launcher::for_host("127.0.0.1", SshConfig::default()).spawn(&ProcessSpec::new("true", Vec::<String>::new())).unwrap();
    assert!(p.wait().unwrap().success());
}

/// A stand-in for `ssh` that runs the remote command with the local `sh`,
/// as a login shell would, after printing `banner` (as remote rc files may).
fn fake_ssh(dir: &std::path::Path, name: &str, body: &str) -> SshConfig {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    SshConfig { program: p.to_str().unwrap().to_string(), ..SshConfig::default() }
}

#[test]
fn ssh_path_with_a_stand_in_client() {
    let dir = tempfile::tempdir().unwrap();
    // Everything up to `--` is ssh's; the one word after it goes to the login shell.
    let ssh = fake_ssh(
        dir.path(),
        "ssh-banner",
        "while [ \"$1\" != -- ]; do shift; done; shift\necho 'Welcome to a chatty host'\nexec sh -c \"$1\"",
    );
    let host = Host::Ssh { destination: "fake".into(), ssh };
    let log = dir.path().join("p.log");
    let mut spec = ProcessSpec::new("sh", ["-c", "echo \"$SECRET|$@\"", "x", "it's", "$(x)"]);
    spec.secret_env.insert("SECRET".into(), "hush".into());
    spec.log = Some(log.clone());
    let mut p = Launcher::new(host.clone()).spawn(&spec).unwrap();
    assert!(p.pid() > 0 && p.start_time() != "-");
    assert_eq!(p.wait().unwrap(), Exit::Code(0));
    assert_eq!(std::fs::read_to_string(&log).unwrap(), "Welcome to a chatty host\nhush|it's $(x)\n");

    // ssh's 255 before the process started is a connection error naming host and command.
    let ssh = fake_ssh(dir.path(), "ssh-refused", "echo 'ssh: connect to host fake port 22: Connection refused' >&2; exit 255");
    let e = Launcher::new(Host::Ssh { destination: "fake".into(), ssh })
        .spawn(&ProcessSpec::new("prog", ["arg"]))
        .unwrap_err();
    assert!(matches!(e, LaunchError::Connect { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("fake") && msg.contains("prog arg") && msg.contains("Connection refused"), "{msg}");
}
