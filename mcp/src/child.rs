//! A stdio server's child process, which never outlives its owner.
//!
//! The child leads a process group of its own (so a wrapper such as `npx`,
//! `uv run` or a shell takes its own children down with it), is armed with
//! `PR_SET_PDEATHSIG` = `SIGKILL` (if this process dies, even by `SIGKILL`,
//! the kernel kills the child), and dropping the handle kills the whole group.
//! Its stderr is drained continuously (a full pipe would stall the server)
//! and its end kept for error messages.
use crate::spec::ServerSpec;
use std::io;
use std::process::Stdio;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::process::{ChildStdin, ChildStdout, Command};
use tokio::sync::watch;

/// How much of the child's stderr is kept, in bytes (the end of it).
const STDERR_KEPT: usize = 2048;

/// A running child: the process-group leader, and the end of its stderr.
pub(crate) struct Child {
    child: Mutex<tokio::process::Child>,
    pid: u32,
    stderr: Arc<Mutex<Vec<u8>>>,
    stderr_done: watch::Receiver<bool>,
}

/// A started child and the pipes MCP speaks on.
pub(crate) struct Spawned {
    pub(crate) child: Child,
    pub(crate) stdin: ChildStdin,
    pub(crate) stdout: ChildStdout,
}

/// Starts `argv` as described by `spec` (this process's environment without
/// the run's cookie, plus `spec.env`; `spec.cwd`), in its own process group,
/// killed when this process dies. Must run inside the crate's runtime.
pub(crate) fn spawn(spec: &ServerSpec, argv: &[String]) -> io::Result<Spawned> {
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..]).envs(&spec.env).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
    // The run's cookie (mesh::cookie's variables) is no business of a tool
    // server, whose tools the model drives (server-everything's `get-env` prints the environment).
    cmd.env_remove("RLMESH_COOKIE").env_remove("RLMESH_COOKIE_FILE");
    cmd.kill_on_drop(true).process_group(0);
    if let Some(dir) = &spec.cwd {
        cmd.current_dir(dir);
    }
    let parent = std::process::id();
    // SAFETY: between fork and exec the closure calls only async-signal-safe
    // functions (prctl, getppid, _exit) and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(io::Error::last_os_error());
            }
            // The parent died before the signal was armed: nobody would kill us later.
            if libc::getppid() as u32 != parent {
                libc::_exit(1);
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn()?;
    let pid = child.id().unwrap_or(0);
    let (stdin, stdout, mut err) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let (Some(stdin), Some(stdout), Some(mut err)) = (stdin, stdout, err.take()) else {
        return Err(io::Error::other("the child's pipes were not opened"));
    };
    let stderr = Arc::new(Mutex::new(Vec::new()));
    let (done_tx, stderr_done) = watch::channel(false);
    let kept = stderr.clone();
    tokio::spawn(async move {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = err.read(&mut buf).await {
            let mut k = kept.lock().unwrap_or_else(PoisonError::into_inner);
            k.extend_from_slice(&buf[..n]);
            let excess = k.len().saturating_sub(STDERR_KEPT);
            k.drain(..excess);
        }
        let _ = done_tx.send(true);
    });
    Ok(Spawned { child: Child { child: Mutex::new(child), pid, stderr, stderr_done }, stdin, stdout })
}

impl Child {
    /// The process id (and process-group id) of the child.
    pub(crate) fn pid(&self) -> u32 {
        self.pid
    }

    /// Whether the child has exited.
    pub(crate) fn exited(&self) -> bool {
        let mut c = self.child.lock().unwrap_or_else(PoisonError::into_inner);
        !matches!(c.try_wait(), Ok(None))
    }

    /// Kills the child's whole process group at once.
    pub(crate) fn kill(&self) {
        // SAFETY: killpg(2) on the group this child leads. Once the leader is
        // reaped its id could only name another group if a new process got
        // that id and made itself a group leader, after every member of ours died.
        unsafe { libc::killpg(self.pid as libc::pid_t, libc::SIGKILL) };
    }

    /// The end of its stderr so far (lossy UTF-8, trimmed to whole lines where it can).
    pub(crate) fn stderr(&self) -> String {
        let bytes = self.stderr.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let text = String::from_utf8_lossy(&bytes);
        let text = if bytes.len() >= STDERR_KEPT {
            text.split_once('\n').map_or(&*text, |(_, rest)| rest)
        } else {
            &text
        };
        text.trim().to_string()
    }

    /// The end of its stderr once the child is gone: kills the group, then
    /// waits (at most `wait`) for the pipe to close so the last lines are in.
    pub(crate) async fn final_stderr(&self, wait: Duration) -> String {
        self.kill();
        let mut done = self.stderr_done.clone();
        let _ = tokio::time::timeout(wait, done.wait_for(|d| *d)).await;
        self.stderr()
    }
}

impl Drop for Child {
    fn drop(&mut self) {
        self.kill();
    }
}
