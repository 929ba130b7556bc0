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
use std::collections::BTreeMap;
use std::ffi::CStr;
use std::fmt;
use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

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

/// How `ssh` is run: the fields a topology file can set per host. Every field
/// has a default, so `{}` is valid and means "plain `ssh HOST`".
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SshConfig {
    /// The ssh client program (default `ssh`, found on `PATH`).
    pub program: String,
    /// Login user (`-l`); default: ssh's own choice (config file, then the local user).
    pub user: Option<String>,
    /// Port (`-p`); default: ssh's own choice.
    pub port: Option<u16>,
    /// Identity file (`-i`).
    pub identity_file: Option<PathBuf>,
    /// An ssh config file used instead of `~/.ssh/config` (`-F`).
    pub config_file: Option<PathBuf>,
    /// `ConnectTimeout` in seconds (0: leave ssh's default).
    pub connect_timeout_s: u32,
    /// `ServerAliveInterval` in seconds (0: leave ssh's default), so a dead
    /// host ends the ssh client instead of hanging it.
    pub server_alive_interval_s: u32,
    /// Further `-o` options, each `Name=value` (e.g. `ProxyJump=bastion`,
    /// `ControlMaster=auto`).
    pub options: Vec<String>,
}

impl Default for SshConfig {
    fn default() -> Self {
        SshConfig {
            program: "ssh".into(),
            user: None,
            port: None,
            identity_file: None,
            config_file: None,
            connect_timeout_s: 10,
            server_alive_interval_s: 15,
            options: Vec::new(),
        }
    }
}

impl SshConfig {
    /// ssh's arguments up to and including the destination, then `--`.
    fn args(&self, destination: &str) -> Vec<String> {
        let mut a: Vec<String> = Vec::new();
        if let Some(f) = &self.config_file {
            a.push("-F".into());
            a.push(f.display().to_string());
        }
        a.push("-T".into());
        a.extend(["-o".into(), "BatchMode=yes".into()]);
        if self.connect_timeout_s > 0 {
            a.extend(["-o".into(), format!("ConnectTimeout={}", self.connect_timeout_s)]);
        }
        if self.server_alive_interval_s > 0 {
            a.extend(["-o".into(), format!("ServerAliveInterval={}", self.server_alive_interval_s)]);
        }
        for o in &self.options {
            a.push("-o".into());
            a.push(o.clone());
        }
        if let Some(u) = &self.user {
            a.push("-l".into());
            a.push(u.clone());
        }
        if let Some(p) = self.port {
            a.push("-p".into());
            a.push(p.to_string());
        }
        if let Some(i) = &self.identity_file {
            a.push("-i".into());
            a.push(i.display().to_string());
        }
        a.push(destination.to_string());
        a.push("--".into());
        a
    }
}

/// Where a process runs.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Host {
    /// This machine: a child process.
    Local,
    /// Another machine, through the system `ssh`.
    Ssh {
        /// The destination as ssh takes it: a name (possibly an alias of the
        /// ssh config), an address, or `user@host`.
        destination: String,
        /// How ssh is run.
        ssh: SshConfig,
    },
    /// A node of the Slurm allocation this process runs in: a job step
    /// started by `srun` (see [`crate::slurm`]).
    Slurm {
        /// The step's node, job and options.
        srun: SrunConfig,
    },
}

impl Host {
    /// The host for `name`: [`Host::Local`] when it is one of this machine's
    /// addresses or names ([`is_local_host`]), else [`Host::Ssh`]. No DNS
    /// look-up is made: a name that only ssh's config knows stays remote.
    pub fn resolve(name: &str, ssh: SshConfig) -> Host {
        if is_local_host(name) {
            Host::Local
        } else {
            Host::Ssh { destination: name.to_string(), ssh }
        }
    }

    /// A short name for messages.
    pub fn name(&self) -> &str {
        match self {
            Host::Local => "local",
            Host::Ssh { destination, .. } => destination,
            Host::Slurm { srun } => &srun.node,
        }
    }

    /// Is this [`Host::Local`]?
    pub fn is_local(&self) -> bool {
        matches!(self, Host::Local)
    }

    /// Is this [`Host::Ssh`]?
    pub fn is_ssh(&self) -> bool {
        matches!(self, Host::Ssh { .. })
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Every address of this machine's interfaces (getifaddrs), plus loopback.
pub fn local_addresses() -> Vec<IpAddr> {
    let mut out: Vec<IpAddr> = vec!["127.0.0.1".parse().unwrap(), "::1".parse().unwrap()];
    // SAFETY: getifaddrs fills a list we walk read-only and free once.
    unsafe {
        let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
        if libc::getifaddrs(&mut head) != 0 {
            return out;
        }
        let mut p = head;
        while !p.is_null() {
            let sa = (*p).ifa_addr;
            if !sa.is_null() {
                match (*sa).sa_family as i32 {
                    libc::AF_INET => {
                        let sin = &*(sa as *const libc::sockaddr_in);
                        out.push(IpAddr::from(u32::from_be(sin.sin_addr.s_addr).to_be_bytes()));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(sa as *const libc::sockaddr_in6);
                        out.push(IpAddr::from(sin6.sin6_addr.s6_addr));
                    }
                    _ => {}
                }
            }
            p = (*p).ifa_next;
        }
        libc::freeifaddrs(head);
    }
    out.sort();
    out.dedup();
    out
}

/// This machine's hostname (gethostname), if it has one.
fn hostname() -> Option<String> {
    let mut buf = [0u8; 256];
    // SAFETY: the buffer is ours and its length is given.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr() as *mut libc::c_char, buf.len()) };
    if rc != 0 {
        return None;
    }
    buf[buf.len() - 1] = 0;
    let s = CStr::from_bytes_until_nul(&buf).ok()?.to_str().ok()?.to_string();
    (!s.is_empty()).then_some(s)
}

/// Is `host` this machine? True for `localhost`, any loopback address
/// (127.0.0.0/8, ::1), any address of this machine's interfaces, and this
/// machine's hostname (full or short). A `user@` prefix and `[…]` brackets
/// are ignored. Names are not looked up in DNS.
pub fn is_local_host(host: &str) -> bool {
    let h = host.rsplit_once('@').map_or(host, |(_, h)| h);
    let h = h.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(h);
    if h.eq_ignore_ascii_case("localhost") || h.to_ascii_lowercase().ends_with(".localhost") {
        return true;
    }
    if let Ok(ip) = h.parse::<IpAddr>() {
        return ip.is_loopback() || local_addresses().contains(&ip);
    }
    match hostname() {
        Some(me) => {
            let short = me.split('.').next().unwrap_or(&me);
            h.eq_ignore_ascii_case(&me) || h.eq_ignore_ascii_case(short)
        }
        None => false,
    }
}

/// Quote `s` as one word for a POSIX shell: `'…'`, with each `'` written as
/// `'\''`. Words made only of safe characters are left bare.
pub fn sh_quote(s: &str) -> String {
    let safe = !s.is_empty()
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_./:=@%+,".contains(&b));
    if safe {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len() + 2);
    out.push('\'');
    for c in s.chars() {
        if c == '\'' {
            out.push_str("'\\''");
        } else {
            out.push(c);
        }
    }
    out.push('\'');
    out
}

/// `words` quoted and joined by spaces: one shell command line.
pub fn sh_join<S: AsRef<str>>(words: &[S]) -> String {
    words.iter().map(|w| sh_quote(w.as_ref())).collect::<Vec<_>>().join(" ")
}

fn valid_env_name(n: &str) -> bool {
    let mut b = n.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
}

/// What to start.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcessSpec {
    /// The program: a path, or a name found on the host's `PATH`.
    pub program: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Environment added to the inherited one (remote: the ssh session's).
    /// These may appear on a command line: put nothing secret here.
    pub env: BTreeMap<String, String>,
    /// Environment that must never appear on a command line (a run's
    /// cookie): locally set in the child's environment, remotely written to
    /// ssh's stdin and read by the remote shell. Values may not contain a
    /// newline or NUL.
    pub secret_env: BTreeMap<String, String>,
    /// Working directory on the host (default: the launcher's own locally,
    /// the login directory remotely).
    pub cwd: Option<PathBuf>,
    /// A file **on the launching machine** that receives the process's stdout
    /// and stderr (appended; created if missing). None: they go to this
    /// process's stderr.
    pub log: Option<PathBuf>,
}

impl ProcessSpec {
    /// A spec for `program` with `args`, nothing else set.
    pub fn new<S: Into<String>>(program: impl Into<String>, args: impl IntoIterator<Item = S>) -> Self {
        ProcessSpec {
            program: program.into(),
            args: args.into_iter().map(Into::into).collect(),
            ..Default::default()
        }
    }

    /// The command line, quoted, for messages (no environment, so no secret).
    pub fn command_line(&self) -> String {
        let mut w = vec![self.program.as_str()];
        w.extend(self.args.iter().map(String::as_str));
        sh_join(&w)
    }

    fn validate(&self) -> Result<()> {
        let bad = |reason: String| LaunchError::InvalidSpec { command: self.command_line(), reason };
        if self.program.is_empty() {
            return Err(bad("empty program".into()));
        }
        for (k, v) in self.env.iter().chain(self.secret_env.iter()) {
            if !valid_env_name(k) {
                return Err(bad(format!("environment name {k:?} is not a shell name")));
            }
            if v.contains('\0') {
                return Err(bad(format!("environment value of {k} contains NUL")));
            }
        }
        for (k, v) in &self.secret_env {
            if v.contains('\n') {
                return Err(bad(format!("secret value of {k} contains a newline")));
            }
            if self.env.contains_key(k) {
                return Err(bad(format!("{k} is both in env and secret_env")));
            }
        }
        if self.args.iter().any(|a| a.contains('\0')) || self.program.contains('\0') {
            return Err(bad("an argument contains NUL".into()));
        }
        Ok(())
    }

    /// The remote shell script (run as `sh -c SCRIPT`): secrets from stdin,
    /// env, cd, program check, pid line, exec.
    pub fn remote_script(&self) -> String {
        let mut s = String::from("exec 3<&0 </dev/null\n");
        for k in self.secret_env.keys() {
            // `read` takes one byte at a time from a pipe, so nothing past the line is consumed.
            s.push_str(&format!(
                "IFS= read -r {k} <&3 || {{ echo 'rlmesh-launch: secret {k} missing on stdin' >&2; exit 97; }}\nexport {k}\n"
            ));
        }
        s.push_str("exec 3<&-\n");
        for (k, v) in &self.env {
            s.push_str(&format!("export {k}={}\n", sh_quote(v)));
        }
        if let Some(d) = &self.cwd {
            let d = sh_quote(&d.display().to_string());
            s.push_str(&format!("cd -- {d} || {{ echo \"rlmesh-launch: cannot cd to \"{d} >&2; exit 96; }}\n"));
        }
        let prog = sh_quote(&self.program);
        s.push_str(&format!(
            "command -v -- {prog} >/dev/null 2>&1 || {{ echo \"rlmesh-launch: \"{prog}\": command not found\" >&2; exit 127; }}\n"
        ));
        // The pid, its start time (field 22 of stat, after the `(comm)`) and the boot id.
        s.push_str(concat!(
            "st=-; b=-\n",
            "if { IFS= read -r l </proc/$$/stat; } 2>/dev/null; then set -- ${l##*) }; st=${20:--}; fi\n",
            "{ IFS= read -r b </proc/sys/kernel/random/boot_id; } 2>/dev/null || b=-\n",
            "echo \"rlmesh-launch pid $$ $st $b ${SLURM_JOB_ID:+$SLURM_JOB_ID.${SLURM_STEP_ID:-}}\"\n",
        ));
        let mut w = vec![self.program.as_str()];
        w.extend(self.args.iter().map(String::as_str));
        s.push_str(&format!("exec {}\n", sh_join(&w)));
        s
    }
}

/// The script that signals `pid` on a remote host only if it is still the
/// process started there (same start time, same boot). Exit 0: signalled;
/// 3: gone or another process; other: `kill` failed.
pub fn remote_signal_script(pid: u32, start_time: &str, boot_id: &str, signal: Signal) -> String {
    remote_kill_script(pid, start_time, boot_id, signal.name())
}

/// [`remote_signal_script`] with `kill -<sig>`'s argument (`0`: only check).
fn remote_kill_script(pid: u32, start_time: &str, boot_id: &str, sig: &str) -> String {
    format!(
        concat!(
            "p={pid}; want={st}; wantb={b}\n",
            "{{ IFS= read -r l </proc/$p/stat; }} 2>/dev/null || exit 3\n",
            "set -- ${{l##*) }}\n",
            "[ \"${{20}}\" = \"$want\" ] || exit 3\n",
            "if [ \"$wantb\" != - ]; then IFS= read -r b </proc/sys/kernel/random/boot_id; [ \"$b\" = \"$wantb\" ] || exit 3; fi\n",
            "exec kill -{sig} $p\n"
        ),
        pid = pid,
        st = sh_quote(start_time),
        b = sh_quote(boot_id),
        sig = sig,
    )
}

/// The signals a handle can send.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM: please stop.
    Term,
    /// SIGKILL.
    Kill,
    /// SIGINT.
    Int,
    /// SIGHUP.
    Hup,
    /// SIGUSR1.
    Usr1,
    /// SIGUSR2.
    Usr2,
}

impl Signal {
    /// The name `kill -NAME` takes.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Term => "TERM",
            Signal::Kill => "KILL",
            Signal::Int => "INT",
            Signal::Hup => "HUP",
            Signal::Usr1 => "USR1",
            Signal::Usr2 => "USR2",
        }
    }

    /// The number on this machine.
    pub fn number(self) -> i32 {
        match self {
            Signal::Term => libc::SIGTERM,
            Signal::Kill => libc::SIGKILL,
            Signal::Int => libc::SIGINT,
            Signal::Hup => libc::SIGHUP,
            Signal::Usr1 => libc::SIGUSR1,
            Signal::Usr2 => libc::SIGUSR2,
        }
    }
}

/// How a process ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// It exited with this code.
    Code(i32),
    /// It was killed by this signal (local processes).
    Signal(i32),
    /// A remote process whose ssh ended with 255 after it had started: it was
    /// killed by a signal, or the connection was lost (ssh does not tell which).
    Lost,
}

impl Exit {
    /// Exited with code 0.
    pub fn success(self) -> bool {
        self == Exit::Code(0)
    }
}

impl fmt::Display for Exit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Exit::Code(c) => write!(f, "exit code {c}"),
            Exit::Signal(s) => write!(f, "killed by signal {s}"),
            Exit::Lost => f.write_str("killed by a signal or connection lost"),
        }
    }
}

/// What a dropped [`Process`] does to a process still running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnDrop {
    /// `TERM`, wait up to `grace`, then `KILL` (the default, 3 s).
    Kill {
        /// How long to wait after `TERM`.
        grace: Duration,
    },
    /// Leave it running (the handle forgets it).
    Leave,
}

impl Default for OnDrop {
    fn default() -> Self {
        OnDrop::Kill { grace: Duration::from_secs(3) }
    }
}

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

fn describe_status(s: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => "unknown".into(),
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

/// Copy `r` to the log file (or our stderr) until EOF; keep the first bytes in `kept`.
fn copy_out(mut r: impl Read, log: Option<File>, kept: Option<Arc<Mutex<Vec<u8>>>>) {
    let mut buf = [0u8; 8192];
    let mut log = log;
    loop {
        let n = match r.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if let Some(k) = &kept {
            let mut k = k.lock().unwrap();
            let room = STDERR_KEPT.saturating_sub(k.len());
            k.extend_from_slice(&buf[..n.min(room)]);
        }
        write_out(&mut log, &buf[..n]);
    }
}

/// Write to the log file, or this process's stderr when there is none.
fn write_out(log: &mut Option<File>, bytes: &[u8]) {
    let _ = match log {
        Some(f) => f.write_all(bytes),
        None => io::stderr().write_all(bytes),
    };
}

/// A started process: its host, its pid there, and a way to wait for it and
/// signal it (and only it).
#[derive(Debug)]
pub struct Process {
    host: Host,
    command: String,
    pid: u32,
    start_time: String,
    boot_id: String,
    /// Its Slurm step (`job.step`), when it runs as one.
    step: Option<String>,
    /// The local child, or the local ssh client of a remote process.
    child: Option<Child>,
    exit: Option<Exit>,
    /// A signal was sent through this handle (so an [`Exit::Lost`] is that signal).
    signalled: bool,
    on_drop: OnDrop,
    io_threads: Vec<JoinHandle<()>>,
}

impl Process {
    /// The pid on its host.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The host it runs on.
    pub fn host(&self) -> &Host {
        &self.host
    }

    /// The command line (quoted).
    pub fn command(&self) -> &str {
        &self.command
    }

    /// Remote: the start time (`/proc/<pid>/stat` field 22) recorded at start, `-` if unknown.
    pub fn start_time(&self) -> &str {
        &self.start_time
    }

    /// Its Slurm step id (`job.step`), when it was started as one.
    pub fn slurm_step(&self) -> Option<&str> {
        self.step.as_deref()
    }

    /// Change what dropping this handle does.
    pub fn set_on_drop(&mut self, p: OnDrop) {
        self.on_drop = p;
    }

    fn map_status(&self, s: ExitStatus) -> Exit {
        use std::os::unix::process::ExitStatusExt;
        match (s.code(), s.signal()) {
            (Some(SSH_CONNECTION_FAILED), _) if self.host.is_ssh() => Exit::Lost,
            (Some(c), _) => Exit::Code(c),
            (None, Some(sig)) if self.host.is_local() => Exit::Signal(sig),
            // The local ssh or srun client itself was killed.
            (None, _) => Exit::Lost,
        }
    }

    fn finish(&mut self, s: ExitStatus) -> Exit {
        let e = self.map_status(s);
        self.exit = Some(e);
        for t in self.io_threads.drain(..) {
            let _ = t.join();
        }
        e
    }

    /// Wait until it ends.
    pub fn wait(&mut self) -> Result<Exit> {
        if let Some(e) = self.exit {
            return Ok(e);
        }
        let child = self.child.as_mut().expect("child while not exited");
        let s = child.wait().map_err(|e| LaunchError::Wait {
            host: self.host.name().into(),
            command: self.command.clone(),
            source: e,
        })?;
        Ok(self.finish(s))
    }

    /// Has it ended? (Does not block.)
    pub fn try_wait(&mut self) -> Result<Option<Exit>> {
        if let Some(e) = self.exit {
            return Ok(Some(e));
        }
        let child = self.child.as_mut().expect("child while not exited");
        match child.try_wait() {
            Ok(Some(s)) => Ok(Some(self.finish(s))),
            Ok(None) => Ok(None),
            Err(e) => Err(LaunchError::Wait { host: self.host.name().into(), command: self.command.clone(), source: e }),
        }
    }

    /// Wait up to `timeout`; `None` if still running.
    pub fn wait_timeout(&mut self, timeout: Duration) -> Result<Option<Exit>> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(e) = self.try_wait()? {
                return Ok(Some(e));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            thread::sleep(Duration::from_millis(20));
        }
    }

    /// Send `sig` to the process this handle started, and only to it: an
    /// ended process (or, remotely, a pid now held by another process) is
    /// not signalled and gives [`LaunchError::NotRunning`].
    pub fn signal(&mut self, sig: Signal) -> Result<()> {
        let not_running = |p: &Process| LaunchError::NotRunning {
            host: p.host.name().into(),
            pid: p.pid,
            command: p.command.clone(),
        };
        match self.try_wait()? {
            None => {}
            // The ssh client ended with 255: the process may outlive a lost
            // connection, and the remote check below keeps the signal safe.
            Some(Exit::Lost) if self.host.is_ssh() => {}
            Some(_) => return Err(not_running(self)),
        }
        self.signalled = true;
        match &self.host {
            Host::Local => {
                // Not reaped yet (try_wait said running), so the pid is still our child's.
                // SAFETY: kill(2) with our child's pid.
                let rc = unsafe { libc::kill(self.pid as libc::pid_t, sig.number()) };
                if rc == 0 {
                    Ok(())
                } else {
                    Err(LaunchError::Signal {
                        host: "local".into(),
                        pid: self.pid,
                        command: self.command.clone(),
                        signal: sig.name(),
                        reason: io::Error::last_os_error().to_string(),
                    })
                }
            }
            // srun forwards a signal to its step's task; KILL (which srun cannot
            // catch) ends the step through Slurm instead.
            Host::Slurm { .. } if sig == Signal::Kill => {
                let step = self.step.clone();
                self.kill_client();
                match step {
                    Some(s) => crate::slurm::cancel(&[s], None).map_err(|e| LaunchError::Signal {
                        host: self.host.name().into(),
                        pid: self.pid,
                        command: self.command.clone(),
                        signal: sig.name(),
                        reason: e.to_string(),
                    }),
                    None => Ok(()),
                }
            }
            Host::Slurm { .. } => {
                let srun = self.child.as_ref().map_or(0, Child::id);
                // SAFETY: kill(2) on our own srun child, not yet reaped (try_wait said running).
                let rc = unsafe { libc::kill(srun as libc::pid_t, sig.number()) };
                if rc == 0 {
                    Ok(())
                } else {
                    Err(LaunchError::Signal {
                        host: self.host.name().into(),
                        pid: self.pid,
                        command: self.command.clone(),
                        signal: sig.name(),
                        reason: io::Error::last_os_error().to_string(),
                    })
                }
            }
            Host::Ssh { .. } => {
                let out = self.remote_kill(sig.name())?;
                match out.status.code() {
                    Some(0) => Ok(()),
                    Some(3) => Err(not_running(self)),
                    _ => Err(LaunchError::Signal {
                        host: self.host.name().into(),
                        pid: self.pid,
                        command: self.command.clone(),
                        signal: sig.name(),
                        reason: format!(
                            "{}: {}",
                            describe_status(out.status),
                            String::from_utf8_lossy(&out.stderr).trim()
                        ),
                    }),
                }
            }
        }
    }

    /// Run the checked `kill -<arg>` on the remote host.
    fn remote_kill(&self, arg: &'static str) -> Result<std::process::Output> {
        if self.start_time == "-" {
            return Err(LaunchError::Signal {
                host: self.host.name().into(),
                pid: self.pid,
                command: self.command.clone(),
                signal: arg,
                reason: "the host has no /proc, so the pid cannot be checked".into(),
            });
        }
        Launcher::new(self.host.clone()).run_script(&remote_kill_script(self.pid, &self.start_time, &self.boot_id, arg))
    }

    /// Is it still running? Locally: not yet exited. Remotely: while its ssh
    /// client runs, yes; after an [`Exit::Lost`], the host is asked (same
    /// pid, same start time), since a lost connection does not end it.
    pub fn is_running(&mut self) -> Result<bool> {
        match self.try_wait()? {
            None => Ok(true),
            Some(Exit::Lost) if self.host.is_ssh() => Ok(self.remote_kill("0")?.status.code() == Some(0)),
            Some(_) => Ok(false),
        }
    }

    /// Stop a remote process whose ssh client already ended (connection lost).
    fn stop_detached(&mut self, grace: Duration) -> Result<Exit> {
        for (sig, wait) in [(Signal::Term, grace), (Signal::Kill, Duration::from_secs(5))] {
            match self.signal(sig) {
                Ok(()) => {}
                Err(LaunchError::NotRunning { .. }) => return Ok(Exit::Lost),
                Err(e) => return Err(e),
            }
            let deadline = Instant::now() + wait;
            while Instant::now() < deadline {
                if !self.is_running()? {
                    return Ok(Exit::Lost);
                }
                thread::sleep(Duration::from_millis(100));
            }
        }
        Ok(Exit::Lost)
    }

    /// Stop it: `TERM`, wait up to `grace`, then `KILL`; then wait for it.
    /// A remote process whose connection was lost is signalled through a new one.
    pub fn stop(&mut self, grace: Duration) -> Result<Exit> {
        match self.try_wait()? {
            None => {}
            Some(Exit::Lost) if self.host.is_ssh() => return self.stop_detached(grace),
            // srun was killed: its step may outlive it, so Slurm ends it.
            Some(e @ Exit::Lost) => {
                if let Some(s) = self.step.clone() {
                    let _ = crate::slurm::cancel(&[s], None);
                }
                return Ok(e);
            }
            Some(e) => return Ok(e),
        }
        match self.signal(Signal::Term) {
            Ok(()) | Err(LaunchError::NotRunning { .. }) => {}
            Err(e) => {
                self.kill_client();
                return Err(e);
            }
        }
        if let Some(e) = self.wait_timeout(grace)? {
            return Ok(e);
        }
        match self.signal(Signal::Kill) {
            Ok(()) | Err(LaunchError::NotRunning { .. }) => {}
            Err(e) => {
                self.kill_client();
                return Err(e);
            }
        }
        if let Some(e) = self.wait_timeout(Duration::from_secs(5))? {
            return Ok(e);
        }
        self.kill_client();
        self.wait()
    }

    /// Kill the local child / ssh client outright.
    fn kill_client(&mut self) {
        if let Some(c) = self.child.as_mut() {
            let _ = c.kill();
        }
    }

    /// Give up on a process that cannot be reached: kill this machine's side
    /// only (a local child itself; for a remote one, its ssh or srun client),
    /// without a signal through a new connection, which would wait for a host
    /// that is gone. A remote rlmesh node cut off this way leaves by itself once
    /// its controller is silent past the heartbeat deadline.
    pub fn abandon(mut self) {
        self.kill_client();
        if let Some(c) = self.child.as_mut() {
            let _ = c.wait();
        }
        self.on_drop = OnDrop::Leave;
    }

    /// Forget the process: it keeps running, and this handle no longer stops it.
    pub fn leave_running(mut self) {
        self.on_drop = OnDrop::Leave;
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        match self.exit {
            None => {}
            // Not our own signal: perhaps a lost connection with the process still there.
            Some(Exit::Lost) if !self.signalled && !self.host.is_local() => {}
            Some(_) => return,
        }
        match self.on_drop {
            OnDrop::Leave => {}
            OnDrop::Kill { grace } => {
                if self.stop(grace).is_err() {
                    self.kill_client();
                    if let Some(c) = self.child.as_mut() {
                        let _ = c.wait();
                    }
                }
            }
        }
    }
}

/// Sets up `cmd` for a helper process the run owns outright (a verifier, a
/// tool server): it leads a process group of its own, so
/// [`kill_group`] reaches it and everything it starts, and on Linux it gets
/// `SIGKILL` when the thread that spawns it ends (`PR_SET_PDEATHSIG`), so it
/// cannot outlive a parent that is killed outright.
///
/// The signal follows the spawning *thread*, not the process: spawn from a
/// thread that lives as long as the child should. [`Launcher`]'s own local
/// children do not use this: they may be left running on purpose
/// ([`OnDrop::Leave`]) and are started from short-lived threads.
pub fn own_group_tied_to_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    #[cfg(target_os = "linux")]
    {
        // SAFETY: getpid is async-signal-safe; the value is read before fork.
        let parent = unsafe { libc::getpid() };
        // SAFETY: between fork and exec the closure only calls the
        // async-signal-safe prctl, getppid and raise.
        unsafe {
            cmd.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The parent died before prctl took effect: do not run orphaned.
                if libc::getppid() != parent {
                    libc::raise(libc::SIGKILL);
                }
                Ok(())
            });
        }
    }
}

/// Sends `sig` to every process of the group `pgid` (a child started with
/// [`own_group_tied_to_parent`] leads the group named by its pid). A group
/// that no longer exists is not an error.
pub fn kill_group(pgid: u32, sig: Signal) -> io::Result<()> {
    // pgid 0 would mean our own group and 1 init's: refused.
    if pgid <= 1 {
        return Err(io::Error::new(io::ErrorKind::InvalidInput, format!("process group {pgid}")));
    }
    // SAFETY: killpg(2) on a group this process created.
    let rc = unsafe { libc::killpg(pgid as libc::pid_t, sig.number()) };
    match rc {
        0 => Ok(()),
        _ => match io::Error::last_os_error() {
            e if e.raw_os_error() == Some(libc::ESRCH) => Ok(()),
            e => Err(e),
        },
    }
}

/// Copy the local file `local` to `remote` on the host through ssh's stdin
/// (written to a temporary name, then renamed, mode 0755; missing directories
/// are made). On [`Host::Local`] the file is copied unless both paths are the
/// same file. Use it when hosts do not share the install path.
pub fn ship(host: &Host, local: &Path, remote: &Path) -> Result<()> {
    let command = format!("ship {} to {}", local.display(), remote.display());
    let io_err = |e: io::Error| LaunchError::Spawn { host: host.name().into(), command: command.clone(), source: e };
    match host {
        Host::Local => {
            let same = match (std::fs::canonicalize(local), std::fs::canonicalize(remote)) {
                (Ok(a), Ok(b)) => a == b,
                _ => false,
            };
            if !same {
                let tmp = remote.with_extension("rlmesh-tmp");
                if let Some(d) = remote.parent() {
                    std::fs::create_dir_all(d).map_err(io_err)?;
                }
                std::fs::copy(local, &tmp).map_err(io_err)?;
                use std::os::unix::fs::PermissionsExt;
                std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).map_err(io_err)?;
                std::fs::rename(&tmp, remote).map_err(io_err)?;
            }
            Ok(())
        }
        Host::Ssh { destination, ssh } => {
            let r = sh_quote(&remote.display().to_string());
            let script = format!(
                "set -e; t={r}.rlmesh-tmp.$$; mkdir -p -- \"$(dirname -- {r})\"; cat > \"$t\"; chmod 0755 \"$t\"; mv -f -- \"$t\" {r}"
            );
            let mut f = File::open(local).map_err(io_err)?;
            let mut c = ssh_command(ssh, destination, &script);
            let mut child =
                c.stdin(Stdio::piped()).stdout(Stdio::null()).stderr(Stdio::piped()).spawn().map_err(io_err)?;
            let mut stdin = child.stdin.take().expect("piped");
            let copied = io::copy(&mut f, &mut stdin);
            drop(stdin);
            let out = child.wait_with_output().map_err(io_err)?;
            let stderr = String::from_utf8_lossy(&out.stderr).trim().to_string();
            match out.status.code() {
                Some(0) if copied.is_ok() => Ok(()),
                Some(SSH_CONNECTION_FAILED) => Err(LaunchError::Connect { host: destination.clone(), command, stderr }),
                _ => Err(LaunchError::StartFailed {
                    host: destination.clone(),
                    command,
                    status: describe_status(out.status),
                    stderr,
                }),
            }
        }
        // The nodes of an allocation share the job's filesystem, or Slurm's own
        // `sbcast` ships files; rlmesh does not copy behind the scheduler's back.
        Host::Slurm { srun } => Err(LaunchError::InvalidSpec {
            command,
            reason: format!("node {} is a Slurm node: install rlmesh on a shared filesystem, or copy it with `sbcast`", srun.node),
        }),
    }
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
