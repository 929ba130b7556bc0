//! A run directory's owner: an exclusive `flock` on `RUN_DIR/.lock`, held by the
//! live job for its whole life and released by the kernel when it exits, however
//! it exits. The file holds the owner's pid, for messages and for `launcher down`.
//!
//! `launcher up` takes the lock before it touches a directory: a directory whose
//! lock is held belongs to a live run and is refused; an old run is set aside
//! (renamed to `<dir>.prev-<unix seconds>`) only while the new job holds its lock,
//! so nobody else is writing into it.
use super::error::{io, RunError};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The lock file's name inside the run directory.
pub const LOCK_FILE: &str = ".lock";

/// Why a run directory could not be locked.
#[derive(Debug, thiserror::Error)]
pub enum LockError {
    /// Another process holds the lock: a run is live in the directory.
    #[error("{dir}: a live run owns this directory (pid {}); stop it first (`launcher down --run-dir {dir}`) or pick another --run-dir", pid.map_or_else(|| "unknown".to_string(), |p| p.to_string()))]
    Held {
        /// The run directory.
        dir: String,
        /// The owner's pid, as written in the lock file.
        pid: Option<u32>,
    },
    /// The lock file could not be opened, locked or written.
    #[error("{path}: {source}")]
    Io {
        /// The lock file.
        path: PathBuf,
        /// The OS error.
        source: std::io::Error,
    },
}

/// The lock on one run directory; released when dropped (or when the process ends).
#[derive(Debug)]
pub struct RunDirLock {
    /// Held open: the lock lives as long as this descriptor.
    _held: File,
    path: PathBuf,
}

/// Tries for a short while: a `launcher status` probing the lock holds it for microseconds.
const TRIES: u32 = 5;

impl RunDirLock {
    /// Locks `dir` (which must exist) for this process, writing our pid into the lock file.
    pub fn acquire(dir: &Path) -> Result<RunDirLock, LockError> {
        let path = dir.join(LOCK_FILE);
        let io = |source| LockError::Io { path: path.clone(), source };
        let mut file = OpenOptions::new().read(true).write(true).create(true).truncate(false).open(&path).map_err(io)?;
        for attempt in 0..TRIES {
            if try_lock(&file).map_err(io)? {
                file.set_len(0).map_err(io)?;
                file.rewind().map_err(io)?;
                write!(file, "{}", std::process::id()).map_err(io)?;
                return Ok(RunDirLock { _held: file, path });
            }
            if attempt + 1 < TRIES {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        Err(LockError::Held { dir: dir.display().to_string(), pid: read_pid(&mut file) })
    }

    /// The pid holding `dir`'s lock, or `None` when nobody does (or there is no lock file).
    /// Creates nothing.
    pub fn holder(dir: &Path) -> Result<Option<u32>, LockError> {
        let path = dir.join(LOCK_FILE);
        let mut file = match File::open(&path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(LockError::Io { path, source }),
        };
        for _ in 0..TRIES {
            if try_lock(&file).map_err(|source| LockError::Io { path: path.clone(), source })? {
                // Nobody held it; ours goes with `file`.
                return Ok(None);
            }
            if let Some(pid) = read_pid(&mut file) {
                return Ok(Some(pid));
            }
            // Held, but the owner has not written its pid yet.
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(Some(0))
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// `flock(LOCK_EX | LOCK_NB)`: `Ok(false)` when another open file holds it.
fn try_lock(file: &File) -> std::io::Result<bool> {
    // SAFETY: flock on a file descriptor we own; no memory is passed.
    let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    if e.raw_os_error() == Some(libc::EWOULDBLOCK) {
        Ok(false)
    } else {
        Err(e)
    }
}

fn read_pid(file: &mut File) -> Option<u32> {
    let mut text = String::new();
    file.rewind().ok()?;
    file.read_to_string(&mut text).ok()?;
    text.trim().parse().ok()
}

/// A fresh run never appends to an earlier run's ledger and logs: a `dir` holding
/// anything but its lock file and its Slurm submission (`slurm/`) is renamed to `<dir>.prev-<unix seconds>` (returned)
/// before the run starts. Call it holding `dir`'s lock ([`claim_run_dir`] does).
pub fn set_aside_previous_run(dir: &Path) -> Result<Option<PathBuf>, RunError> {
    // `slurm/` holds the submission of the job running this (its script and Slurm's output file).
    let occupied = std::fs::read_dir(dir).map(|d| d.flatten().any(|e| e.file_name() != super::run_dir::LOCK_FILE && e.file_name() != "slurm")).unwrap_or(false);
    if !occupied {
        return Ok(None);
    }
    let secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut name = dir.as_os_str().to_owned();
    name.push(format!(".prev-{secs}"));
    let mut target = PathBuf::from(name);
    let mut n = 1;
    while target.exists() {
        let mut alt = target.as_os_str().to_owned();
        alt.push(format!("-{n}"));
        target = PathBuf::from(alt);
        n += 1;
    }
    std::fs::rename(dir, &target).map_err(io(dir))?;
    Ok(Some(target))
}

/// Takes `dir` for a new job: refused when a live run holds its lock; otherwise,
/// for a fresh run, an earlier run in it is set aside (see [`set_aside_previous_run`])
/// while we hold its lock, and `dir` is created anew. The lock is the job's for its life.
pub fn claim_run_dir(dir: &Path, resume: bool) -> Result<(RunDirLock, Option<PathBuf>), RunError> {
    let lock = |d: &Path| {
        RunDirLock::acquire(d).map_err(|e| match e {
            LockError::Held { .. } => RunError::Refused(e.to_string()),
            LockError::Io { path, source } => RunError::Io { path, source },
        })
    };
    if !dir.is_dir() {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
        return Ok((lock(dir)?, None));
    }
    let old = lock(dir)?;
    if resume {
        return Ok((old, None));
    }
    let Some(previous) = set_aside_previous_run(dir)? else { return Ok((old, None)) };
    drop(old);
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    Ok((lock(dir)?, Some(previous)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_held_lock_names_its_owner_and_is_free_once_dropped() {
        let dir = tempfile::tempdir().unwrap();
        assert_eq!(RunDirLock::holder(dir.path()).unwrap(), None);
        assert!(!dir.path().join(LOCK_FILE).exists(), "probing creates nothing");
        let lock = RunDirLock::acquire(dir.path()).unwrap();
        // Another open file description conflicts, even in the same process.
        assert_eq!(RunDirLock::holder(dir.path()).unwrap(), Some(std::process::id()));
        match RunDirLock::acquire(dir.path()) {
            Err(LockError::Held { pid, .. }) => assert_eq!(pid, Some(std::process::id())),
            other => panic!("{other:?}"),
        }
        drop(lock);
        assert_eq!(RunDirLock::holder(dir.path()).unwrap(), None);
        RunDirLock::acquire(dir.path()).unwrap();
    }
}
