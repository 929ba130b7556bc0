//! Test fixtures: hosts as Linux network namespaces.
//!
//! [`TestHosts::start`] makes N "hosts" `h0`, `h1`, … on this machine, each a
//! network namespace joined to a private bridge by a veth pair, with its own
//! address in a private /24 (`10.(200+k).y.0/24`, chosen so that concurrent
//! runs differ), `lo` up, **no default route** (nothing leaves the machine,
//! `ip_forward` is untouched), a per-namespace `/etc/hosts` so the hosts
//! resolve each other by name, and its own OpenSSH server (own host key,
//! listening on the namespace's address only, own UTS hostname). A throw-away
//! ed25519 client key, a generated `known_hosts` and an `ssh_config` make
//! `ssh -F <ssh_config> h1 …` work from the root namespace; the ssh servers
//! see the same files, so `h1` can reach `h2` as well.
//!
//! Names are unique per process and fixture (`rlmesh-<pid>x<n>-h<i>`,
//! bridge `rmb<pid>x<n>`), so two test runs at once do not collide. Dropping
//! the fixture (also on a failed or panicking test) kills the sshds and every
//! process left in the namespaces, deletes the namespaces, their veths and the
//! bridge, and removes `/etc/netns/<ns>` and the key directory. Leftovers of a
//! fixture whose process died without dropping it are removed by the next
//! [`TestHosts::start`].
//!
//! It needs root, `ip` (iproute2), `unshare`, `ssh`, `ssh-keygen` and `sshd`
//! (Debian's `openssh-server`). [`TestHosts::available`] says why not;
//! [`TestHosts::start_or_skip`] prints `SKIPPED: <reason>` for a test to return.
//!
//! Traffic goes only to the addresses this fixture created.
use std::collections::hash_map::DefaultHasher;
use std::fmt::Write as _;
use std::fs;
use std::hash::{Hash, Hasher};
use std::io;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

use crate::launch::{Host, SshConfig};

mod netns;
pub mod slurm;

use netns::*;

/// Prefix of every namespace this fixture makes.
const NS_PREFIX: &str = "rlmesh-";
/// Prefix of its bridges.
const BRIDGE_PREFIX: &str = "rmb";
/// First host's last octet: `h<i>` is `.(10+i)`, the bridge `.1`.
const FIRST_HOST: u8 = 10;
/// How long the sshds may take to answer.
const SSHD_READY: Duration = Duration::from_secs(10);

static COUNTER: AtomicU32 = AtomicU32::new(0);

/// Why the fixture cannot run, or what failed while setting it up.
#[derive(Debug, thiserror::Error)]
pub enum TestHostsError {
    /// This machine cannot create such hosts (not root, no `ip`, no `sshd`, …): skip.
    #[error("{0}")]
    Unavailable(String),
    /// A set-up step failed on a machine that should manage it: a real failure.
    #[error("test hosts: {step} failed: {detail}")]
    Setup {
        /// The step.
        step: String,
        /// Its output.
        detail: String,
    },
}

fn setup_err(step: impl Into<String>, detail: impl Into<String>) -> TestHostsError {
    TestHostsError::Setup { step: step.into(), detail: detail.into() }
}

/// One host of [`TestHosts`].
#[derive(Debug)]
struct TestHost {
    name: String,
    namespace: String,
    address: Ipv4Addr,
    /// The root namespace's end of its veth pair.
    veth: String,
    sshd: Option<Child>,
}

/// N hosts as network namespaces, each with its own sshd; torn down on drop.
#[derive(Debug)]
pub struct TestHosts {
    tag: String,
    dir: PathBuf,
    bridge: String,
    bridge_made: bool,
    net: [u8; 3],
    hosts: Vec<TestHost>,
    setup_time: Duration,
}

impl TestHosts {
    /// Can this machine create test hosts? `Err` says why not.
    pub fn available() -> Result<(), TestHostsError> {
        let no = |s: &str| Err(TestHostsError::Unavailable(s.to_string()));
        if !cfg!(target_os = "linux") {
            return no("network namespaces need Linux");
        }
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return no("creating network namespaces needs root (run the tests as root)");
        }
        if !Path::new("/proc/self/ns/net").exists() {
            return no("this kernel has no network namespaces (/proc/self/ns/net missing)");
        }
        for (p, pkg) in [("ip", "iproute2"), ("unshare", "util-linux"), ("ssh", "openssh-client"), ("ssh-keygen", "openssh-client")] {
            if find_program(p, &[]).is_none() {
                return Err(TestHostsError::Unavailable(format!("`{p}` not found on PATH (install {pkg})")));
            }
        }
        if sshd_program().is_none() {
            return no("`sshd` not found (install openssh-server; scripts/test does as root)");
        }
        Ok(())
    }

    /// [`TestHosts::start`], or `None` after printing `SKIPPED: <reason>` when
    /// this machine cannot create them. A set-up failure on a machine that
    /// can is a panic, not a skip.
    pub fn start_or_skip(n: usize) -> Option<TestHosts> {
        match TestHosts::start(n) {
            Ok(h) => Some(h),
            Err(TestHostsError::Unavailable(why)) => {
                println!("SKIPPED: {why}");
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// Create `n` hosts (`h0` … `h<n-1>`, at most 200) with their sshds
    /// answering. On failure everything made so far is removed.
    pub fn start(n: usize) -> Result<TestHosts, TestHostsError> {
        Self::available()?;
        if n == 0 || n > 200 {
            return Err(setup_err("start", format!("{n} hosts: between 1 and 200")));
        }
        let t0 = Instant::now();
        remove_stale();
        let pid = std::process::id();
        let c = COUNTER.fetch_add(1, Ordering::Relaxed) % 0x1000;
        let tag = format!("{pid:x}x{c:x}");
        let dir = std::env::temp_dir().join(format!("rlmesh-testhosts-{tag}"));
        let _ = fs::remove_dir_all(&dir);
        fs::create_dir_all(dir.join("keys")).map_err(|e| setup_err("mkdir", format!("{}: {e}", dir.display())))?;
        let mut me = TestHosts {
            bridge: format!("{BRIDGE_PREFIX}{tag}"),
            tag,
            dir,
            bridge_made: false,
            net: [0; 3],
            hosts: Vec::new(),
            setup_time: Duration::ZERO,
        };
        // From here on, Drop cleans up whatever was made.
        me.build(n)?;
        me.setup_time = t0.elapsed();
        Ok(me)
    }

    fn build(&mut self, n: usize) -> Result<(), TestHostsError> {
        let sshd = sshd_program().expect("checked by available()");
        // Keys first, in parallel with the network (ssh-keygen takes a few ms each).
        let keys = self.dir.join("keys");
        let mut keygens: Vec<(String, Child)> = Vec::new();
        let mut keygen = |file: PathBuf, comment: String| -> Result<(), TestHostsError> {
            let child = Command::new("ssh-keygen")
                .args(["-q", "-t", "ed25519", "-N", "", "-C", &comment, "-f"])
                .arg(&file)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .map_err(|e| setup_err("ssh-keygen", e.to_string()))?;
            keygens.push((file.display().to_string(), child));
            Ok(())
        };
        keygen(keys.join("id_ed25519"), "rlmesh-test-client".into())?;
        for i in 0..n {
            keygen(keys.join(format!("h{i}_host_ed25519_key")), format!("h{i}"))?;
        }

        // The bridge, on a /24 that nothing else here uses.
        run_or_unavailable("ip link add bridge", &["link", "add", &self.bridge, "type", "bridge"])?;
        self.bridge_made = true;
        self.net = self.claim_subnet()?;
        run("ip link set bridge up", &mut ip(&["link", "set", &self.bridge, "up"]))?;

        // /etc/hosts of every namespace.
        let mut hosts_file = String::from("127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n");
        let _ = writeln!(hosts_file, "{} gw", self.gateway());
        let names: Vec<(String, Ipv4Addr)> = (0..n)
            .map(|i| (format!("h{i}"), self.addr(FIRST_HOST + i as u8)))
            .collect();
        for (name, a) in &names {
            let _ = writeln!(hosts_file, "{a} {name}");
        }

        for (i, (name, address)) in names.iter().enumerate() {
            let namespace = format!("{NS_PREFIX}{}-h{i}", self.tag);
            let veth = format!("rm{}v{i}", self.tag);
            assert!(veth.len() <= 15 && self.bridge.len() <= 15, "interface names too long: {veth} {}", self.bridge);
            run_or_unavailable("ip netns add", &["netns", "add", &namespace])?;
            self.hosts.push(TestHost {
                name: name.clone(),
                namespace: namespace.clone(),
                address: *address,
                veth: veth.clone(),
                sshd: None,
            });
            let cidr = format!("{address}/24");
            run(
                "ip link add veth",
                &mut ip(&["link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &namespace]),
            )?;
            run("ip link set veth master", &mut ip(&["link", "set", &veth, "master", &self.bridge, "up"]))?;
            run("ip -n link set lo up", &mut ip(&["-n", &namespace, "link", "set", "lo", "up"]))?;
            run("ip -n addr add", &mut ip(&["-n", &namespace, "addr", "add", &cidr, "dev", "eth0"]))?;
            run("ip -n link set eth0 up", &mut ip(&["-n", &namespace, "link", "set", "eth0", "up"]))?;
            let etc = PathBuf::from("/etc/netns").join(&namespace);
            let mut made = fs::create_dir_all(&etc);
            for _ in 0..5 {
                // Another fixture's teardown may rmdir /etc/netns between our mkdirs.
                if made.is_ok() {
                    break;
                }
                made = fs::create_dir_all(&etc);
            }
            made.map_err(|e| setup_err("mkdir /etc/netns", format!("{}: {e}", etc.display())))?;
            write_file(&etc.join("hosts"), &hosts_file)?;
        }

        for (file, child) in keygens {
            let out = child.wait_with_output().map_err(|e| setup_err("ssh-keygen", e.to_string()))?;
            if !out.status.success() {
                return Err(setup_err("ssh-keygen", format!("{file}: {}", String::from_utf8_lossy(&out.stderr))));
            }
        }
        fs::copy(keys.join("id_ed25519.pub"), keys.join("authorized_keys"))
            .map_err(|e| setup_err("authorized_keys", e.to_string()))?;

        // sshd per namespace: own host key, own address, own hostname (UTS namespace).
        fs::create_dir_all("/run/sshd").map_err(|e| setup_err("mkdir /run/sshd", e.to_string()))?;
        let mut known = String::new();
        let mut config = String::new();
        for i in 0..n {
            let (name, address, namespace) =
                (self.hosts[i].name.clone(), self.hosts[i].address, self.hosts[i].namespace.clone());
            let h = TestHost { name, address, namespace, veth: String::new(), sshd: None };
            let h = &h;
            let key = keys.join(format!("{}_host_ed25519_key", h.name));
            let pubkey = fs::read_to_string(key.with_extension("pub"))
                .map_err(|e| setup_err("read host key", e.to_string()))?;
            let pubkey: Vec<&str> = pubkey.split_whitespace().take(2).collect();
            let _ = writeln!(known, "{},{} {}", h.name, h.address, pubkey.join(" "));
            let cfg = self.dir.join(format!("sshd_config_{}", h.name));
            write_file(
                &cfg,
                &format!(
                    "ListenAddress {addr}:22\n\
                     HostKey {key}\n\
                     PidFile none\n\
                     AuthorizedKeysFile {ak}\n\
                     PermitRootLogin prohibit-password\n\
                     PubkeyAuthentication yes\n\
                     PasswordAuthentication no\n\
                     KbdInteractiveAuthentication no\n\
                     StrictModes no\n\
                     UsePAM no\n\
                     UseDNS no\n\
                     PrintMotd no\n\
                     PrintLastLog no\n\
                     MaxStartups 100:30:200\n\
                     MaxSessions 100\n\
                     AcceptEnv LANG LC_* RUST_* RLMESH_*\n\
                     Subsystem sftp internal-sftp\n",
                    addr = h.address,
                    key = key.display(),
                    ak = keys.join("authorized_keys").display(),
                ),
            )?;
            let log = self.dir.join(format!("sshd_{}.log", h.name));
            let child = Command::new("ip")
                .args(["netns", "exec", &h.namespace, "unshare", "--uts", "--mount", "--", "sh", "-c"])
                // A /dev/shm of its own, as a real host has: what its sessions start cannot map another host's segments.
                .arg("mount -t tmpfs -o mode=1777 rlmesh-test-shm /dev/shm && hostname \"$1\" && exec \"$2\" -D -f \"$3\" -E \"$4\"")
                .arg("sh")
                .arg(&h.name)
                .arg(&sshd)
                .arg(&cfg)
                .arg(&log)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| setup_err("start sshd", e.to_string()))?;
            self.hosts[i].sshd = Some(child);
            let _ = write!(
                config,
                "Host {name} {addr}\n  HostName {addr}\n  Port 22\n  User root\n  IdentityFile {id}\n  IdentitiesOnly yes\n  \
                 UserKnownHostsFile {kh}\n  GlobalKnownHostsFile /dev/null\n  StrictHostKeyChecking yes\n  \
                 BatchMode yes\n  ConnectTimeout 5\n  LogLevel ERROR\n\n",
                name = h.name,
                addr = h.address,
                id = keys.join("id_ed25519").display(),
                kh = keys.join("known_hosts").display(),
            );
        }
        write_file(&keys.join("known_hosts"), &known)?;
        write_file(&self.ssh_config_path(), &config)?;

        // Wait until every sshd sends its banner.
        let deadline = Instant::now() + SSHD_READY;
        for i in 0..n {
            loop {
                let h = &mut self.hosts[i];
                if let Some(Some(status)) = h.sshd.as_mut().map(|c| c.try_wait().ok().flatten()) {
                    let log = fs::read_to_string(self.dir.join(format!("sshd_{}.log", h.name))).unwrap_or_default();
                    return Err(setup_err(format!("sshd on {}", h.name), format!("exited ({status}): {}", log.trim())));
                }
                if banner(SocketAddr::from((h.address, 22))) {
                    break;
                }
                if Instant::now() > deadline {
                    return Err(setup_err(format!("sshd on {}", h.name), format!("no answer within {SSHD_READY:?}")));
                }
                thread::sleep(Duration::from_millis(10));
            }
        }
        Ok(())
    }

    /// Pick a free `10.(200+k).y.0/24`, put `.1` on the bridge, and check no
    /// other interface took the same network meanwhile.
    fn claim_subnet(&self) -> Result<[u8; 3], TestHostsError> {
        let mut hasher = DefaultHasher::new();
        (std::process::id(), &self.tag, SystemTime::now()).hash(&mut hasher);
        let total: u32 = 50 * 256;
        let start = (hasher.finish() % total as u64) as u32;
        for step in 0..total {
            let idx = (start + step) % total;
            let net = [10u8, 200 + (idx / 256) as u8, (idx % 256) as u8];
            let base = u32::from(Ipv4Addr::new(net[0], net[1], net[2], 0));
            if used_networks().iter().any(|(_, a, p)| overlaps(*a, *p, base, 24)) {
                continue;
            }
            let gw = format!("{}.{}.{}.1/24", net[0], net[1], net[2]);
            run("ip addr add bridge", &mut ip(&["addr", "add", &gw, "dev", &self.bridge]))?;
            let clash = used_networks()
                .iter()
                .any(|(dev, a, p)| dev != &self.bridge && overlaps(*a, *p, base, 24));
            if !clash {
                return Ok(net);
            }
            ip_quiet(&["addr", "del", &gw, "dev", &self.bridge]);
        }
        Err(setup_err("choose a subnet", "no free /24 in 10.200.0.0-10.249.255.0"))
    }

    fn addr(&self, last: u8) -> Ipv4Addr {
        Ipv4Addr::new(self.net[0], self.net[1], self.net[2], last)
    }

    /// How many hosts.
    pub fn len(&self) -> usize {
        self.hosts.len()
    }

    /// Never true: a fixture has at least one host.
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// Host `i`'s name (`h<i>`), as the ssh config and every namespace's `/etc/hosts` know it.
    pub fn name(&self, i: usize) -> &str {
        &self.hosts[i].name
    }

    /// All host names.
    pub fn names(&self) -> Vec<String> {
        self.hosts.iter().map(|h| h.name.clone()).collect()
    }

    /// Host `i`'s address.
    pub fn address(&self, i: usize) -> Ipv4Addr {
        self.hosts[i].address
    }

    /// Host `i`'s network namespace (for `ip netns exec`).
    pub fn namespace(&self, i: usize) -> &str {
        &self.hosts[i].namespace
    }

    /// The bridge's name (in the root namespace).
    pub fn bridge(&self) -> &str {
        &self.bridge
    }

    /// The bridge's address: the root namespace's address on the hosts' network (name `gw`).
    pub fn gateway(&self) -> Ipv4Addr {
        self.addr(1)
    }

    /// The hosts' network, e.g. `10.213.7.0/24`.
    pub fn subnet(&self) -> String {
        format!("{}/24", self.addr(0))
    }

    /// Host `i`'s sshd pid.
    pub fn sshd_pid(&self, i: usize) -> Option<u32> {
        self.hosts[i].sshd.as_ref().map(Child::id)
    }

    /// The fixture's private directory (keys, configs, sshd logs).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The ssh config to pass with `ssh -F`.
    pub fn ssh_config_path(&self) -> PathBuf {
        self.dir.join("ssh_config")
    }

    /// The throw-away client key.
    pub fn identity_file(&self) -> PathBuf {
        self.dir.join("keys").join("id_ed25519")
    }

    /// An [`SshConfig`] that reaches these hosts by name.
    pub fn ssh_config(&self) -> SshConfig {
        SshConfig { config_file: Some(self.ssh_config_path()), ..SshConfig::default() }
    }

    /// Host `i` as a [`Host`] for [`crate::launch::Launcher`].
    pub fn host(&self, i: usize) -> Host {
        Host::Ssh { destination: self.hosts[i].name.clone(), ssh: self.ssh_config() }
    }

    /// `ssh -F <config> h<i>`: add `--` and the remote command.
    pub fn ssh(&self, i: usize) -> Command {
        let mut c = Command::new("ssh");
        c.arg("-F").arg(self.ssh_config_path()).arg(&self.hosts[i].name);
        c
    }

    /// `ip netns exec <ns>`: add the program and its arguments to run inside host `i` without ssh.
    pub fn exec_in(&self, i: usize) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.hosts[i].namespace]);
        c
    }

    /// The pids inside host `i`'s namespace.
    pub fn pids(&self, i: usize) -> Vec<u32> {
        netns_pids(&self.hosts[i].namespace)
    }

    /// Cut host `i` off the network (its `eth0` down).
    pub fn cut(&self, i: usize) -> io::Result<()> {
        ip(&["-n", &self.hosts[i].namespace, "link", "set", "eth0", "down"]).status().map(|_| ())
    }

    /// Undo [`TestHosts::cut`].
    pub fn restore(&self, i: usize) -> io::Result<()> {
        ip(&["-n", &self.hosts[i].namespace, "link", "set", "eth0", "up"]).status().map(|_| ())
    }

    /// How long [`TestHosts::start`] took.
    pub fn setup_time(&self) -> Duration {
        self.setup_time
    }

    fn teardown(&mut self) {
        // sshds first (they would start new sessions), then anything left inside.
        for h in &mut self.hosts {
            if let Some(mut c) = h.sshd.take() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
        let namespaces: Vec<String> = self.hosts.iter().map(|h| h.namespace.clone()).collect();
        kill_in_namespaces(&namespaces);
        // Deleting our end removes the pair now; `ip netns del` alone leaves it to
        // the kernel's asynchronous namespace clean-up.
        for h in &self.hosts {
            ip_quiet(&["link", "del", &h.veth]);
        }
        for ns in &namespaces {
            ip_quiet(&["netns", "del", ns]);
            let _ = fs::remove_dir_all(Path::new("/etc/netns").join(ns));
        }
        if self.bridge_made {
            ip_quiet(&["link", "del", &self.bridge]);
        }
        let _ = fs::remove_dir("/etc/netns"); // only if empty: others may use it
        let _ = fs::remove_dir_all(&self.dir);
        self.hosts.clear();
    }
}

impl Drop for TestHosts {
    fn drop(&mut self) {
        self.teardown();
    }
}
