//! A started process ([`Process`]): its output copied to its log, waiting
//! for it, signalling only it, and the process groups that tie children to
//! their parent.
use std::fs::File;
use std::io::{self, Read, Write};
use std::process::{Child, Command, ExitStatus};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::*;

pub(crate) fn describe_status(s: ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (s.code(), s.signal()) {
        (Some(c), _) => format!("exit code {c}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => "unknown".into(),
    }
}

/// Copy `r` to the log file (or our stderr) until EOF; keep the first bytes in `kept`.
pub(crate) fn copy_out(mut r: impl Read, log: Option<File>, kept: Option<Arc<Mutex<Vec<u8>>>>) {
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
pub(crate) fn write_out(log: &mut Option<File>, bytes: &[u8]) {
    let _ = match log {
        Some(f) => f.write_all(bytes),
        None => io::stderr().write_all(bytes),
    };
}

/// A started process: its host, its pid there, and a way to wait for it and
/// signal it (and only it).
#[derive(Debug)]
pub struct Process {
    pub(super) host: Host,
    pub(super) command: String,
    pub(super) pid: u32,
    pub(super) start_time: String,
    pub(super) boot_id: String,
    /// Its Slurm step (`job.step`), when it runs as one.
    pub(super) step: Option<String>,
    /// The local child, or the local ssh client of a remote process.
    pub(super) child: Option<Child>,
    pub(super) exit: Option<Exit>,
    /// A signal was sent through this handle (so an [`Exit::Lost`] is that signal).
    pub(super) signalled: bool,
    pub(super) on_drop: OnDrop,
    pub(super) io_threads: Vec<JoinHandle<()>>,
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
