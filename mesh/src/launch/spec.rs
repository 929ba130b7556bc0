//! What to start ([`ProcessSpec`]), the signals a handle sends, how a
//! process ended, and what a dropped handle does.
use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use super::*;

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

    pub(crate) fn validate(&self) -> Result<()> {
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
pub(crate) fn remote_kill_script(pid: u32, start_time: &str, boot_id: &str, sig: &str) -> String {
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
