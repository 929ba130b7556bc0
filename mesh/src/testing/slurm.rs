//! A real Slurm cluster on this one machine, for tests: one `slurmd` per
//! network-namespace host of a [`TestHosts`], a `slurmctld` on the bridge's
//! address and a private `munged`, all from Debian's packages (`slurmctld`,
//! `slurmd`, `slurm-client`, `munge`; `scripts/test` installs them as root).
//!
//! - **Own daemons, own names.** The fixture's munged has its own key and socket
//!   (`AuthInfo=socket=…`), its slurmctld its own port, cluster name, state and
//!   spool under the fixture's directory. It runs in a UTS namespace whose
//!   hostname is `ctl`, the `SlurmctldHost` of its `slurm.conf`, so nothing
//!   depends on this machine's hostname. Two test runs at once do not meet.
//! - **Nodes are hosts.** Node `hI` is [`TestHosts`]' `hI`: its slurmd runs
//!   inside that namespace (`nsenter --net`, then a private mount namespace
//!   with the host's `/etc/hosts` bound over the real one, and its own UTS
//!   hostname), so job steps on `hI` run with `hI`'s address and name. Not
//!   `ip netns exec`: it remounts `/sys`, and slurmd 22.05 then dies ("No
//!   filesystem mounted on /sys/fs/cgroup").
//! - **Or names that resolve nowhere** ([`NodeNames::Unresolvable`]): node
//!   `nI` (from 1) runs on host `I-1`, Slurm reaches it at that host's address
//!   (`NodeAddr`), its hostname is `nI`, and its `/etc/hosts` is this
//!   machine's, which knows no node name: as on cloud and dynamic clusters,
//!   where only Slurm knows the names.
//! - **Fake GPUs.** `gpus` per node as gres, backed by character devices
//!   (`mknod … c 1 3`) in the fixture's directory: `--gpus-per-node=2` then sets
//!   `CUDA_VISIBLE_DEVICES=0,1`, and asking for more than there are is refused.
//! - **Teardown** (also on a failed test): every job cancelled, the slurmds
//!   stopped in parallel (each takes about 2 s), then slurmctld and munged, then
//!   the hosts. Daemons of a fixture whose process died are stopped by the next
//!   [`TestSlurm::start`].
//!
//! Settings follow `shared/design/TEST-CLUSTERS.md`: `proctrack/linuxproc`,
//! `task/none`, `select/cons_tres`, no accounting, no `cgroup.conf`,
//! `SlurmdParameters=config_overrides` so nodes may claim more CPUs than exist.
use super::{setup_err, find_program, write_file, TestHosts, TestHostsError};
use std::fs;
use std::net::{Ipv4Addr, TcpListener};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

/// How long the daemons may take to answer.
const READY: Duration = Duration::from_secs(30);

/// How the nodes of a [`TestSlurm`] are named.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NodeNames {
    /// Node `hI` is host `hI`, and every node's `/etc/hosts` resolves the hosts' names.
    Hosts,
    /// Node `nI` (from 1) is host `I-1`, and no node name resolves on any node.
    Unresolvable,
}

/// A Slurm cluster of [`TestHosts`] nodes; torn down on drop.
#[derive(Debug)]
pub struct TestSlurm {
    dir: PathBuf,
    names: NodeNames,
    nodes: Vec<String>,
    conf: PathBuf,
    munged: Option<Child>,
    slurmctld: Option<Child>,
    slurmds: Vec<Child>,
    gpus: u32,
    setup_time: Duration,
    // Last: dropped after the daemons are stopped.
    hosts: TestHosts,
}

fn munge_ids() -> Option<(u32, u32)> {
    let name = std::ffi::CString::new("munge").ok()?;
    // SAFETY: getpwnam returns a pointer into static storage or null; read at once.
    let pw = unsafe { libc::getpwnam(name.as_ptr()) };
    if pw.is_null() {
        return None;
    }
    // SAFETY: non-null result of getpwnam.
    Some(unsafe { ((*pw).pw_uid, (*pw).pw_gid) })
}

fn sbin(prog: &str) -> Option<PathBuf> {
    find_program(prog, &[&format!("/usr/sbin/{prog}"), &format!("/sbin/{prog}")])
}

impl TestSlurm {
    /// Can this machine run one? `Err` says why not (a skip).
    pub fn available() -> Result<(), TestHostsError> {
        TestHosts::available()?;
        for (p, pkg) in [("slurmctld", "slurmctld"), ("slurmd", "slurmd"), ("munged", "munge"), ("nsenter", "util-linux")] {
            if sbin(p).is_none() {
                return Err(TestHostsError::Unavailable(format!("`{p}` not found (install Debian's {pkg}; scripts/test does as root)")));
            }
        }
        for (p, pkg) in [("sbatch", "slurm-client"), ("srun", "slurm-client"), ("scontrol", "slurm-client"), ("squeue", "slurm-client"), ("scancel", "slurm-client"), ("munge", "munge")] {
            if find_program(p, &[]).is_none() {
                return Err(TestHostsError::Unavailable(format!("`{p}` not found on PATH (install Debian's {pkg})")));
            }
        }
        if munge_ids().is_none() {
            return Err(TestHostsError::Unavailable("no `munge` user (install Debian's munge)".into()));
        }
        Ok(())
    }

    /// [`TestSlurm::start`], or `None` after printing `SKIPPED: <reason>`.
    pub fn start_or_skip(nodes: usize, cpus: u32, gpus: u32) -> Option<TestSlurm> {
        Self::start_named_or_skip(nodes, cpus, gpus, NodeNames::Hosts)
    }

    /// [`TestSlurm::start_named`], or `None` after printing `SKIPPED: <reason>`.
    pub fn start_named_or_skip(nodes: usize, cpus: u32, gpus: u32, names: NodeNames) -> Option<TestSlurm> {
        match TestSlurm::start_named(nodes, cpus, gpus, names) {
            Ok(s) => Some(s),
            Err(TestHostsError::Unavailable(why)) => {
                println!("SKIPPED: {why}");
                None
            }
            Err(e) => panic!("{e}"),
        }
    }

    /// A cluster of `nodes` hosts `h0 …`, each claiming `cpus` CPUs and `gpus` fake GPUs,
    /// every node idle when it returns.
    pub fn start(nodes: usize, cpus: u32, gpus: u32) -> Result<TestSlurm, TestHostsError> {
        Self::start_named(nodes, cpus, gpus, NodeNames::Hosts)
    }

    /// [`TestSlurm::start`] with the nodes named as `names` says.
    pub fn start_named(nodes: usize, cpus: u32, gpus: u32, names: NodeNames) -> Result<TestSlurm, TestHostsError> {
        Self::available()?;
        let t0 = Instant::now();
        remove_stale();
        let hosts = TestHosts::start(nodes)?;
        let dir = hosts.dir().join("slurm");
        let node_names = (0..nodes)
            .map(|i| match names {
                NodeNames::Hosts => hosts.name(i).to_string(),
                NodeNames::Unresolvable => format!("n{}", i + 1),
            })
            .collect();
        let mut me = TestSlurm { conf: dir.join("etc/slurm.conf"), dir, names, nodes: node_names, munged: None, slurmctld: None, slurmds: vec![], gpus, setup_time: Duration::ZERO, hosts };
        me.build(cpus)?;
        me.setup_time = t0.elapsed();
        Ok(me)
    }

    fn build(&mut self, cpus: u32) -> Result<(), TestHostsError> {
        let d = self.dir.clone();
        for sub in ["etc", "state", "spool", "log", "run", "dev", "munge"] {
            fs::create_dir_all(d.join(sub)).map_err(|e| setup_err("mkdir", format!("{}: {e}", d.join(sub).display())))?;
        }
        // munged: own key and socket, as the munge user (it refuses root). The
        // socket's directory must be searchable by everyone.
        let (uid, gid) = munge_ids().expect("checked by available()");
        let m = d.join("munge");
        let mut key = vec![0u8; 1024];
        // SAFETY: getrandom fills the buffer it is given.
        if unsafe { libc::getrandom(key.as_mut_ptr().cast(), key.len(), 0) } != key.len() as isize {
            return Err(setup_err("munge key", std::io::Error::last_os_error().to_string()));
        }
        fs::write(m.join("key"), key).map_err(|e| setup_err("munge key", e.to_string()))?;
        let chown = |p: &Path, mode: u32| -> Result<(), TestHostsError> {
            use std::os::unix::fs::PermissionsExt;
            std::os::unix::fs::chown(p, Some(uid), Some(gid)).map_err(|e| setup_err("chown", format!("{}: {e}", p.display())))?;
            fs::set_permissions(p, fs::Permissions::from_mode(mode)).map_err(|e| setup_err("chmod", format!("{}: {e}", p.display())))
        };
        chown(&m, 0o755)?;
        chown(&m.join("key"), 0o600)?;
        let socket = m.join("socket");
        let munged = Command::new(sbin("munged").expect("checked"))
            .arg("-F")
            .arg(format!("--socket={}", socket.display()))
            .arg(format!("--key-file={}", m.join("key").display()))
            .arg(format!("--pid-file={}", m.join("pid").display()))
            .arg(format!("--log-file={}", m.join("log").display()))
            .arg(format!("--seed-file={}", m.join("seed").display()))
            .uid(uid)
            .gid(gid)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| setup_err("start munged", e.to_string()))?;
        self.munged = Some(munged);
        self.wait_for("munged", || socket.exists(), &m.join("log"))?;

        // Fake GPUs.
        for g in 0..self.gpus {
            let p = d.join(format!("dev/nvidia{g}"));
            let c = std::ffi::CString::new(p.display().to_string()).expect("no NUL");
            // SAFETY: mknod on a path we own; device 1:3 is /dev/null's.
            let rc = unsafe { libc::mknod(c.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) };
            if rc != 0 {
                return Err(setup_err("mknod fake GPU", format!("{}: {}", p.display(), std::io::Error::last_os_error())));
            }
        }

        let port = free_port(self.hosts.gateway())?;
        let n = self.hosts.len();
        let addrs: Vec<String> = (0..n).map(|i| self.hosts.address(i).to_string()).collect();
        let gres = if self.gpus > 0 { format!(" Gres=gpu:{}", self.gpus) } else { String::new() };
        let mut conf = format!(
            "ClusterName=rl{tag}\n\
             SlurmctldHost=ctl({gw})\n\
             SlurmctldPort={port}\n\
             SlurmdPort=6818\n\
             SlurmUser=root\n\
             SlurmdUser=root\n\
             AuthType=auth/munge\n\
             AuthInfo=socket={socket}\n\
             CredType=cred/munge\n\
             MailProg=/bin/true\n\
             StateSaveLocation={d}/state\n\
             SlurmdSpoolDir={d}/spool/%n\n\
             SlurmctldPidFile={d}/run/slurmctld.pid\n\
             SlurmdPidFile={d}/run/slurmd-%n.pid\n\
             SlurmctldLogFile={d}/log/slurmctld.log\n\
             SlurmdLogFile={d}/log/slurmd-%n.log\n\
             ProctrackType=proctrack/linuxproc\n\
             TaskPlugin=task/none\n\
             JobAcctGatherType=jobacct_gather/none\n\
             AccountingStorageType=accounting_storage/none\n\
             MpiDefault=none\n\
             SelectType=select/cons_tres\n\
             SelectTypeParameters=CR_Core\n\
             ReturnToService=2\n\
             SlurmdParameters=config_overrides\n\
             SlurmdTimeout=30\n\
             KillWait=5\n\
             GresTypes=gpu\n",
            tag = self.hosts.tag,
            gw = self.hosts.gateway(),
            socket = socket.display(),
            d = d.display(),
        );
        for (name, a) in self.nodes.iter().zip(&addrs) {
            conf.push_str(&format!(
                "NodeName={name} NodeAddr={a} CPUs={cpus} Boards=1 SocketsPerBoard=1 CoresPerSocket={cpus} ThreadsPerCore=1 RealMemory=1000{gres} State=UNKNOWN\n"
            ));
        }
        conf.push_str("PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n");
        write_file(&self.conf, &conf)?;
        if self.gpus > 0 {
            write_file(&d.join("etc/gres.conf"), &format!("Name=gpu File={}/dev/nvidia[0-{}]\n", d.display(), self.gpus - 1))?;
        }

        // slurmctld, in a UTS namespace named as its SlurmctldHost.
        let ctld = Command::new("unshare")
            .args(["--uts", "--", "sh", "-c", "hostname ctl && exec \"$0\" -D -f \"$1\""])
            .arg(sbin("slurmctld").expect("checked"))
            .arg(&self.conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| setup_err("start slurmctld", e.to_string()))?;
        self.slurmctld = Some(ctld);
        let conf_path = self.conf.clone();
        self.wait_for("slurmctld", || client(&conf_path, "scontrol", &["ping"]).is_some_and(|o| o.contains("UP")), &d.join("log/slurmctld.log"))?;

        // One slurmd per host, inside its namespace; with resolvable names, the host's /etc/hosts over this machine's.
        for i in 0..n {
            let node = self.nodes[i].clone();
            fs::create_dir_all(d.join(format!("spool/{node}"))).map_err(|e| setup_err("mkdir spool", e.to_string()))?;
            let ns = self.hosts.namespace(i).to_string();
            let hosts_file = match self.names {
                NodeNames::Hosts => "mount --bind \"$0\" /etc/hosts && ",
                NodeNames::Unresolvable => "",
            };
            let c = Command::new("nsenter")
                .arg(format!("--net=/run/netns/{ns}"))
                .args(["--", "unshare", "--mount", "--uts", "--", "sh", "-c"])
                // A /dev/shm of its own, as a real host has: job steps here cannot map another host's segments.
                .arg(format!("{hosts_file}mount -t tmpfs -o mode=1777 rlmesh-test-shm /dev/shm && hostname \"$1\" && exec \"$2\" -D -f \"$3\""))
                .arg(format!("/etc/netns/{ns}/hosts"))
                .arg(&node)
                .arg(sbin("slurmd").expect("checked"))
                .arg(&self.conf)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| setup_err("start slurmd", e.to_string()))?;
            self.slurmds.push(c);
        }
        let want = n.to_string();
        self.wait_for(
            "every slurmd",
            || client(&conf_path, "sinfo", &["-h", "-t", "idle", "-o", "%D"]).is_some_and(|o| o.trim() == want),
            &d.join(format!("log/slurmd-{}.log", self.nodes[0])),
        )?;
        if self.names == NodeNames::Unresolvable {
            // What a job step on the node would find: no name lookup of a node's name succeeds there.
            for i in 0..n {
                let out = Command::new("nsenter").arg(format!("--net=/run/netns/{}", self.hosts.namespace(i))).args(["--", "getent", "hosts"]).args(&self.nodes).output().ok();
                if let Some(o) = out.filter(|o| !o.stdout.is_empty()) {
                    return Err(setup_err("unresolvable node names", format!("on {}, `getent hosts` finds {}", self.nodes[i], String::from_utf8_lossy(&o.stdout).trim())));
                }
            }
        }
        Ok(())
    }

    /// Poll `ready` until it holds; on a timeout the error quotes `log`.
    fn wait_for(&mut self, what: &str, mut ready: impl FnMut() -> bool, log: &Path) -> Result<(), TestHostsError> {
        let deadline = Instant::now() + READY;
        while !ready() {
            for c in self.munged.iter_mut().chain(self.slurmctld.iter_mut()).chain(self.slurmds.iter_mut()) {
                if let Ok(Some(st)) = c.try_wait() {
                    let text = fs::read_to_string(log).unwrap_or_default();
                    return Err(setup_err(format!("waiting for {what}"), format!("a daemon exited ({st}); {}: {}", log.display(), tail(&text))));
                }
            }
            if Instant::now() > deadline {
                let text = fs::read_to_string(log).unwrap_or_default();
                return Err(setup_err(format!("waiting for {what}"), format!("not ready within {READY:?}; {}: {}", log.display(), tail(&text))));
            }
            thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// The hosts the nodes run on (node `i` is host `i`).
    pub fn hosts(&self) -> &TestHosts {
        &self.hosts
    }

    /// Node `i`'s name, as Slurm knows it (`hI`, or `n(I+1)` with [`NodeNames::Unresolvable`]).
    pub fn node(&self, i: usize) -> &str {
        &self.nodes[i]
    }

    /// The cluster's `slurm.conf`: clients need `SLURM_CONF` set to it.
    pub fn conf(&self) -> &Path {
        &self.conf
    }

    /// Fake GPUs per node.
    pub fn gpus(&self) -> u32 {
        self.gpus
    }

    /// A command with `SLURM_CONF` pointing at this cluster.
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut c = Command::new(program);
        c.env("SLURM_CONF", &self.conf);
        c
    }

    /// A client command's stdout (`None` when it failed).
    pub fn client(&self, program: &str, args: &[&str]) -> Option<String> {
        client(&self.conf, program, args)
    }

    /// The state of job `id` now (`PENDING`, `RUNNING`, `COMPLETED`, …): from
    /// `squeue` while queued, then from `scontrol show job`.
    pub fn job_state(&self, id: &str) -> Option<String> {
        let out = self.client("scontrol", &["show", "job", id])?;
        out.split_whitespace().find_map(|w| w.strip_prefix("JobState=")).map(String::from)
    }

    /// Wait until job `id` has ended (its state is no longer pending, configuring,
    /// running or completing); its final state, or `None` after `timeout`.
    pub fn wait_job(&self, id: &str, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            match self.job_state(id) {
                Some(s) if !["PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED"].contains(&s.as_str()) => return Some(s),
                _ => thread::sleep(Duration::from_millis(200)),
            }
        }
        None
    }

    /// How long [`TestSlurm::start`] took, host set-up included.
    pub fn setup_time(&self) -> Duration {
        self.setup_time
    }

    /// The daemon log files, for a failing test to print.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        if let Ok(rd) = fs::read_dir(self.dir.join("log")) {
            for e in rd.flatten() {
                let text = fs::read_to_string(e.path()).unwrap_or_default();
                out.push_str(&format!("== {}\n{}\n", e.path().display(), tail(&text)));
            }
        }
        out
    }

    fn teardown(&mut self) {
        if self.slurmctld.is_some() {
            let _ = client(&self.conf, "scancel", &["--full", "--user=root"]);
            let deadline = Instant::now() + Duration::from_secs(5);
            while Instant::now() < deadline && client(&self.conf, "squeue", &["-h"]).is_some_and(|o| !o.trim().is_empty()) {
                thread::sleep(Duration::from_millis(100));
            }
        }
        // In parallel: each slurmd takes about 2 s to exit on TERM.
        stop_all(self.slurmds.drain(..).collect());
        stop_all(self.slurmctld.take().into_iter().collect());
        stop_all(self.munged.take().into_iter().collect());
    }
}

impl Drop for TestSlurm {
    fn drop(&mut self) {
        self.teardown();
        // `hosts` drops next: anything left in the namespaces (slurmstepd, tasks) is killed there.
    }
}

/// TERM each child, wait up to 10 s for all, then KILL the rest.
fn stop_all(mut children: Vec<Child>) {
    for c in &children {
        // SAFETY: kill(2) on our own, not yet reaped, child.
        unsafe { libc::kill(c.id() as libc::pid_t, libc::SIGTERM) };
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline && children.iter_mut().any(|c| matches!(c.try_wait(), Ok(None))) {
        thread::sleep(Duration::from_millis(50));
    }
    for c in &mut children {
        let _ = c.kill();
        let _ = c.wait();
    }
}

fn client(conf: &Path, program: &str, args: &[&str]) -> Option<String> {
    let o = Command::new(program).args(args).env("SLURM_CONF", conf).stdin(Stdio::null()).stderr(Stdio::null()).output().ok()?;
    o.status.success().then(|| String::from_utf8_lossy(&o.stdout).into_owned())
}

fn tail(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(15)..].join("\n")
}

/// A port nothing listens on at `addr` now.
fn free_port(addr: Ipv4Addr) -> Result<u16, TestHostsError> {
    TcpListener::bind((addr, 0)).and_then(|l| l.local_addr()).map(|a| a.port()).map_err(|e| setup_err("choose a port", e.to_string()))
}

/// Stop the root-namespace daemons (slurmctld, munged) of fixtures whose
/// process is gone: a daemon's command line names its fixture's directory,
/// `rlmesh-testhosts-<pid>x<n>/slurm/`, and so the pid that made it.
fn remove_stale() {
    let Ok(procs) = fs::read_dir("/proc") else { return };
    for p in procs.flatten() {
        let Some(pid) = p.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else { continue };
        let cmd = String::from_utf8_lossy(&fs::read(p.path().join("cmdline")).unwrap_or_default()).into_owned();
        let Some(at) = cmd.find("rlmesh-testhosts-") else { continue };
        let rest = &cmd[at + "rlmesh-testhosts-".len()..];
        let Some((tag, after)) = rest.split_once('/') else { continue };
        if !after.starts_with("slurm/") {
            continue;
        }
        let owner = tag.split_once('x').and_then(|(o, _)| u32::from_str_radix(o, 16).ok());
        if owner.is_some_and(|o| !super::pid_alive(o)) {
            // SAFETY: kill(2) on a daemon whose command line names a dead fixture's directory.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
    }
}
