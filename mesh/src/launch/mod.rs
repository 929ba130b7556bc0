//! Starting a process of a run on a host, and stopping only what was started.
//!
//! A [`Launcher`] targets one [`Host`]: this machine (the process is a local
//! child) or another machine reached through the **system** OpenSSH client
//! `ssh`, so that `~/.ssh/config`, keys, agents and `ProxyJump` work as users
//! expect. [`Host::resolve`] picks local for any of this machine's own
//! addresses (loopback, `localhost`, its hostname, every interface address).
//!
//! A remote start runs
//! `ssh [options] -T -o BatchMode=yes HOST -- sh -c '<script>'`, where the
//! script (built with [`sh_quote`]) reads the [`ProcessSpec::secret_env`]
//! values from ssh's **stdin** (never argv: a run's cookie is such a value),
//! exports the plain [`ProcessSpec::env`], changes directory, checks the
//! program exists, prints `rlmesh-launch pid <$$> <start time> <boot id> [<slurm step>]` and
//! `exec`s the program, whose stdin is `/dev/null`. Its stdout and stderr come
//! back through ssh into the [`ProcessSpec::log`] file on the launching
//! machine (or this process's stderr when there is none).
//!
//! The handle, [`Process`], knows the pid on its host. [`Process::signal`]
//! reaches only the process it started: locally the child is not yet reaped
//! (so its pid cannot be reused), remotely a fresh `ssh HOST kill` runs only
//! after `/proc/<pid>/stat`'s start time and the boot id still match what the
//! start recorded. A dropped handle stops its process ([`OnDrop::Kill`],
//! the default): `TERM`, a grace period, then `KILL`.
//!
//! The remote login shell must be POSIX-like (sh, dash, bash, ksh, zsh): it
//! parses the one `sh -c '…'` word. A remote process whose ssh client is killed
//! outright (the launcher itself `SIGKILL`ed) keeps running until it writes to
//! its closed output; `launcher down` (and stale-process clean-up before a
//! launch) is the safety net there.

mod host;
mod process;
mod spec;

pub use host::*;
pub use process::*;
pub use spec::*;

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use crate::slurm::SrunConfig;

/// What ssh's exit status 255 means: it could not connect (or lost the connection).
pub const SSH_CONNECTION_FAILED: i32 = 255;

/// The first line a remote start prints on stdout, before `exec`.
const PID_MARKER: &str = "rlmesh-launch pid ";

/// How much of a failed start's stderr an error quotes.
const STDERR_KEPT: usize = 4096;

/// Errors of starting, waiting for and signalling processes. Each names the
/// host and the command (never a secret: those are not part of it).
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The spec cannot be started as written (a bad env name, a secret with a newline, …).
    #[error("invalid process spec for `{command}`: {reason}")]
    InvalidSpec {
        /// The command as it would have run.
        command: String,
        /// What is wrong.
        reason: String,
    },
    /// ssh exited with 255: no connection to the host (or it was lost).
    #[error("{host}: ssh could not connect (exit 255) to run `{command}`: {stderr}")]
    Connect {
        /// The host as given.
        host: String,
        /// The command.
        command: String,
        /// What ssh said.
        stderr: String,
    },
    /// Spawning (the program, or the local `ssh` client) failed.
    #[error("{host}: cannot start `{command}`: {source}")]
    Spawn {
        /// The host.
        host: String,
        /// The command.
        command: String,
        /// The OS error.
        source: io::Error,
    },
    /// The remote side ended before reporting a pid (no such program, bad dir, …).
    #[error("{host}: `{command}` did not start ({status}): {stderr}")]
    StartFailed {
        /// The host.
        host: String,
        /// The command.
        command: String,
        /// How the remote start ended.
        status: String,
        /// What it said.
        stderr: String,
    },
    /// No pid within the start timeout.
    #[error("{host}: `{command}` reported no pid within {timeout:?}")]
    StartTimeout {
        /// The host.
        host: String,
        /// The command.
        command: String,
        /// The timeout.
        timeout: Duration,
    },
    /// The process already ended (or the pid now belongs to another process): not signalled.
    #[error("{host}: pid {pid} (`{command}`) is no longer the process that was started; not signalled")]
    NotRunning {
        /// The host.
        host: String,
        /// The pid recorded at start.
        pid: u32,
        /// The command.
        command: String,
    },
    /// Sending the signal failed.
    #[error("{host}: sending {signal} to pid {pid} (`{command}`) failed: {reason}")]
    Signal {
        /// The host.
        host: String,
        /// The pid.
        pid: u32,
        /// The command.
        command: String,
        /// The signal name.
        signal: &'static str,
        /// Why.
        reason: String,
    },
    /// Waiting for the process (or its ssh client) failed.
    #[error("{host}: waiting for `{command}` failed: {source}")]
    Wait {
        /// The host.
        host: String,
        /// The command.
        command: String,
        /// The OS error.
        source: io::Error,
    },
    /// The log file could not be opened.
    #[error("cannot open log file {path}: {source}")]
    Log {
        /// The path.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
}

/// Result of this module.
pub type Result<T, E = LaunchError> = std::result::Result<T, E>;

/// Starts processes on one host.
#[derive(Clone, Debug)]
pub struct Launcher {
    host: Host,
    on_drop: OnDrop,
    start_timeout: Duration,
}

impl Launcher {
    /// A launcher for `host`, with kill-on-drop and a 30 s start timeout.
    pub fn new(host: Host) -> Self {
        Launcher { host, on_drop: OnDrop::default(), start_timeout: Duration::from_secs(30) }
    }

    /// A launcher for this machine.
    pub fn local() -> Self {
        Self::new(Host::Local)
    }

    /// A launcher for `name` through [`Host::resolve`].
    pub fn for_host(name: &str, ssh: SshConfig) -> Self {
        Self::new(Host::resolve(name, ssh))
    }

    /// The drop policy given to new handles.
    pub fn on_drop(mut self, p: OnDrop) -> Self {
        self.on_drop = p;
        self
    }

    /// How long a remote start may take to report its pid.
    pub fn start_timeout(mut self, t: Duration) -> Self {
        self.start_timeout = t;
        self
    }

    /// The host.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// Start `spec` on the host. Returns once the process runs and its pid is known.
    pub fn spawn(&self, spec: &ProcessSpec) -> Result<Process> {
        spec.validate()?;
        match &self.host {
            Host::Local => self.spawn_local(spec),
            Host::Ssh { destination, ssh } => {
                let cmd = ssh_command(ssh, destination, &spec.remote_script());
                self.spawn_remote(spec, cmd, &ssh.program)
            }
            Host::Slurm { srun } => {
                let cmd = srun_command(srun, &spec.remote_script());
                self.spawn_remote(spec, cmd, &srun.program)
            }
        }
    }

    /// Run `sh -c SCRIPT` on the host and collect its output (for short
    /// commands: probes, clean-ups). Remote: through ssh, stdin empty.
    pub fn run_script(&self, script: &str) -> Result<std::process::Output> {
        let (mut cmd, command) = match &self.host {
            Host::Local => {
                let mut c = Command::new("sh");
                c.arg("-c").arg(script);
                (c, "sh -c …".to_string())
            }
            Host::Ssh { destination, ssh } => (ssh_command(ssh, destination, script), "sh -c …".to_string()),
            Host::Slurm { srun } => (srun_command(srun, script), "srun … sh -c …".to_string()),
        };
        let out = cmd.stdin(Stdio::null()).output().map_err(|e| LaunchError::Spawn {
            host: self.host.name().into(),
            command: command.clone(),
            source: e,
        })?;
        if self.host.is_ssh() && out.status.code() == Some(SSH_CONNECTION_FAILED) {
            return Err(LaunchError::Connect {
                host: self.host.name().into(),
                command,
                stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
            });
        }
        Ok(out)
    }

    fn open_log(spec: &ProcessSpec) -> Result<Option<File>> {
        match &spec.log {
            None => Ok(None),
            Some(p) => OpenOptions::new()
                .create(true)
                .append(true)
                .open(p)
                .map(Some)
                .map_err(|e| LaunchError::Log { path: p.clone(), source: e }),
        }
    }

    fn spawn_local(&self, spec: &ProcessSpec) -> Result<Process> {
        let mut cmd = Command::new(&spec.program);
        cmd.args(&spec.args).envs(&spec.env).envs(&spec.secret_env).stdin(Stdio::null());
        if let Some(d) = &spec.cwd {
            cmd.current_dir(d);
        }
        if let Some(f) = Self::open_log(spec)? {
            let f2 = f.try_clone().map_err(|e| LaunchError::Log { path: spec.log.clone().unwrap(), source: e })?;
            cmd.stdout(f).stderr(f2);
        } else {
            cmd.stdout(io::stderr()).stderr(Stdio::inherit());
        }
        let child = cmd.spawn().map_err(|e| LaunchError::Spawn {
            host: "local".into(),
            command: spec.command_line(),
            source: e,
        })?;
        Ok(Process {
            host: Host::Local,
            command: spec.command_line(),
            pid: child.id(),
            start_time: String::new(),
            boot_id: String::new(),
            step: None,
            child: Some(child),
            exit: None,
            signalled: false,
            on_drop: self.on_drop,
            io_threads: Vec::new(),
        })
    }

    /// A start through a client that runs [`ProcessSpec::remote_script`] on
    /// the host with our stdin forwarded (ssh, srun).
    fn spawn_remote(&self, spec: &ProcessSpec, mut cmd: Command, client: &str) -> Result<Process> {
        let command = spec.command_line();
        let destination = self.host.name();
        let mut log = Self::open_log(spec)?;
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(|e| LaunchError::Spawn {
            host: destination.to_string(),
            command: format!("{client} … {command}"),
            source: e,
        })?;
        // Secrets on stdin, one line each, then EOF.
        {
            let mut stdin = child.stdin.take().expect("piped");
            let mut buf = String::new();
            for v in spec.secret_env.values() {
                buf.push_str(v);
                buf.push('\n');
            }
            // A failed write means ssh already ended; its status says why.
            let _ = stdin.write_all(buf.as_bytes());
        }
        // stderr: copied to the log (or our stderr); its start kept for errors.
        let kept = Arc::new(Mutex::new(Vec::<u8>::new()));
        let stderr = child.stderr.take().expect("piped");
        let log_err = match &log {
            Some(f) => Some(f.try_clone().map_err(|e| LaunchError::Log { path: spec.log.clone().unwrap(), source: e })?),
            None => None,
        };
        let kept2 = Arc::clone(&kept);
        let t_err = thread::spawn(move || copy_out(stderr, log_err, Some(kept2)));
        // stdout: the pid line first, then the rest copied.
        let stdout = child.stdout.take().expect("piped");
        let (tx, rx) = mpsc::channel::<Option<String>>();
        let log_out = log.take();
        let t_out = thread::spawn(move || {
            let mut r = BufReader::new(stdout);
            let mut log_out = log_out;
            let mut line = Vec::new();
            loop {
                line.clear();
                match r.read_until(b'\n', &mut line) {
                    Ok(n) if n > 0 && line.starts_with(PID_MARKER.as_bytes()) => {
                        let _ = tx.send(Some(String::from_utf8_lossy(&line).into_owned()));
                        break;
                    }
                    // Printed before the marker (by the remote shell's rc files?): it belongs in the log.
                    Ok(n) if n > 0 => write_out(&mut log_out, &line),
                    _ => {
                        let _ = tx.send(None);
                        return;
                    }
                }
            }
            copy_out(r, log_out, None);
        });
        match rx.recv_timeout(self.start_timeout) {
            Ok(Some(line)) => {
                let mut it = line[PID_MARKER.len()..].split_whitespace();
                let pid = it.next().and_then(|p| p.parse::<u32>().ok());
                let start_time = it.next().unwrap_or("-").to_string();
                let boot_id = it.next().unwrap_or("-").to_string();
                let step = it.next().filter(|s| *s != "-").map(String::from);
                let Some(pid) = pid else {
                    let _ = child.kill();
                    let status = child.wait().ok();
                    return Err(start_error(&self.host, &command, status, &t_err, &kept));
                };
                Ok(Process {
                    host: self.host.clone(),
                    command,
                    pid,
                    start_time,
                    boot_id,
                    step,
                    child: Some(child),
                    exit: None,
                    signalled: false,
                    on_drop: self.on_drop,
                    io_threads: vec![t_out, t_err],
                })
            }
            Ok(None) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                let status = child.wait().ok();
                Err(start_error(&self.host, &command, status, &t_err, &kept))
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = child.kill();
                let _ = child.wait();
                Err(LaunchError::StartTimeout { host: destination.to_string(), command, timeout: self.start_timeout })
            }
        }
    }
}

/// The error of a remote start that ended before its pid line.
fn start_error(
    host: &Host,
    command: &str,
    status: Option<ExitStatus>,
    t_err: &JoinHandle<()>,
    kept: &Mutex<Vec<u8>>,
) -> LaunchError {
    // Give the stderr copier a moment to take the last words.
    let deadline = Instant::now() + Duration::from_millis(500);
    while !t_err.is_finished() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(10));
    }
    let stderr = String::from_utf8_lossy(&kept.lock().unwrap()).trim().to_string();
    match status.and_then(|s| s.code()) {
        Some(SSH_CONNECTION_FAILED) if host.is_ssh() => LaunchError::Connect { host: host.name().into(), command: command.into(), stderr },
        _ => LaunchError::StartFailed {
            host: host.name().into(),
            command: command.into(),
            status: status.map_or("unknown".into(), describe_status),
            stderr,
        },
    }
}

/// `ssh [config] DEST -- sh -c 'SCRIPT'` (ssh joins its remote words with
/// spaces and hands them to the login shell, so the script is one quoted word).
fn ssh_command(ssh: &SshConfig, destination: &str, script: &str) -> Command {
    let mut c = Command::new(&ssh.program);
    c.args(ssh.args(destination));
    c.arg(format!("sh -c {}", sh_quote(script)));
    c
}

/// `srun [options] -- sh -c SCRIPT` (srun passes its words to the task as they are).
fn srun_command(srun: &SrunConfig, script: &str) -> Command {
    let mut c = Command::new(&srun.program);
    c.args(srun.args());
    c.args(["sh", "-c", script]);
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting() {
        assert_eq!(sh_quote("abc"), "abc");
        assert_eq!(sh_quote(""), "''");
        assert_eq!(sh_quote("a b"), "'a b'");
        assert_eq!(sh_quote("it's"), "'it'\\''s'");
    }

    #[test]
    fn local_hosts() {
        assert!(is_local_host("localhost"));
        assert!(is_local_host("127.0.0.5"));
        assert!(is_local_host("::1"));
        assert!(is_local_host("root@[::1]"));
        assert!(is_local_host("user@127.0.0.1"));
        if let Some(h) = hostname() {
            assert!(is_local_host(&h));
        }
        for a in local_addresses() {
            assert!(is_local_host(&a.to_string()), "{a}");
        }
        // A documentation address (TEST-NET-3) is not this machine's; nothing is sent to it.
        assert!(!is_local_host("203.0.113.7"));
        assert!(!is_local_host("some-ssh-alias"));
    }

    #[test]
    fn ssh_config_defaults_and_serde() {
        let c: SshConfig = serde_json::from_str("{}").unwrap();
        assert_eq!(c, SshConfig::default());
        let c: SshConfig =
            serde_json::from_str(r#"{"user":"u","port":2222,"options":["ProxyJump=b"]}"#).unwrap();
        let a = c.args("h");
        assert!(a.windows(2).any(|w| w == ["-p", "2222"]));
        assert!(a.windows(2).any(|w| w == ["-l", "u"]));
        assert!(a.windows(2).any(|w| w == ["-o", "ProxyJump=b"]));
        assert!(a.windows(2).any(|w| w == ["-o", "BatchMode=yes"]));
        assert_eq!(&a[a.len() - 2..], ["h", "--"]);
        assert!(serde_json::from_str::<SshConfig>(r#"{"usr":"u"}"#).is_err());
    }

    #[test]
    fn spec_validation() {
        let mut s = ProcessSpec::new("true", Vec::<String>::new());
        s.secret_env.insert("K".into(), "a\nb".into());
        assert!(matches!(s.validate(), Err(LaunchError::InvalidSpec { .. })));
        let mut s = ProcessSpec::new("true", Vec::<String>::new());
        s.env.insert("BAD NAME".into(), "x".into());
        assert!(s.validate().is_err());
    }
}
