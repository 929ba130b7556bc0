//! Hosts: where a process runs (this machine or one reached by ssh), what
//! counts as this machine, shell quoting for remote scripts, and shipping a
//! file to a host.
use std::ffi::CStr;
use std::fmt;
use std::fs::File;
use std::io;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use serde::{Deserialize, Serialize};

use crate::slurm::SrunConfig;

use super::*;

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
    pub(crate) fn args(&self, destination: &str) -> Vec<String> {
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
pub(crate) fn hostname() -> Option<String> {
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

pub(crate) fn valid_env_name(n: &str) -> bool {
    let mut b = n.bytes();
    matches!(b.next(), Some(c) if c.is_ascii_alphabetic() || c == b'_')
        && b.all(|c| c.is_ascii_alphanumeric() || c == b'_')
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
