//! Fixtures for the CLI tests: the built binary and its output.
#![allow(dead_code)]
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Runs `launcher ARGS` in `cwd` (default: the repository root).
pub fn launcher_in(cwd: Option<&Path>, args: &[&str]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_launcher"));
    c.args(args).current_dir(cwd.map_or_else(repo, Path::to_path_buf));
    c.output().expect("run launcher")
}

/// Runs `launcher ARGS` from the repository root.
pub fn launcher(args: &[&str]) -> Output {
    launcher_in(None, args)
}

/// Standard output as text.
pub fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// Standard error as text.
pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// The exit code (panics when killed by a signal).
pub fn code(o: &Output) -> i32 {
    o.status.code().expect("exited")
}

/// The cached models directory (scripts/prepare-models.sh; SmolLM2-135M's tokenizer lives there).
pub fn models_dir() -> PathBuf {
    let out = Command::new(repo().join("scripts/prepare-models.sh")).output().expect("run scripts/prepare-models.sh");
    assert!(out.status.success(), "prepare-models failed: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8(out.stdout).unwrap().lines().last().unwrap().trim())
}

/// The kernel's range of ephemeral ports (`ip_local_port_range`): the source
/// ports of outgoing connections, which may take any of them at any time.
fn ephemeral_ports() -> (u32, u32) {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").unwrap_or_default();
    let v: Vec<u32> = text.split_whitespace().filter_map(|x| x.parse().ok()).collect();
    match v[..] {
        [lo, hi] if lo <= hi => (lo, hi),
        _ => (32768, 60999),
    }
}

/// Ports are reserved in aligned blocks of this many (see [`free_port_base`]).
const PORT_BLOCK: u32 = 64;

/// A base port `b` such that `b..b+n` are all free on 127.0.0.1 now and lie
/// outside the ephemeral range, so no outgoing connection (another test's, a
/// Prometheus scrape's) takes one of them before the run binds it.
///
/// A port found free here is bound later, by a child process, so two tests
/// running at once (threads of one binary, or two test runs) could pick the
/// same span in between and one run would fail with "Address already in use".
/// So each span is also reserved: it is made of aligned blocks of
/// [`PORT_BLOCK`] ports, and each block is taken with an exclusive `flock` on
/// `$TMPDIR/rlmesh-test-ports-UID/PORT.lock`, held until this test process exits.
/// A block another test holds, or with a port in use, is passed over.
pub fn free_port_base(n: u16) -> u16 {
    use std::net::TcpListener;
    static HELD: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());
    let (lo, hi) = ephemeral_ports();
    let blocks = u32::from(n).div_ceil(PORT_BLOCK).max(1);
    // Aligned block starts whose `blocks` blocks lie below or above the ephemeral range, from 10000.
    let starts: Vec<u32> = [(10000, lo), (hi + 1, 65536)]
        .into_iter()
        .flat_map(|(a, b)| (a.div_ceil(PORT_BLOCK)..).map(|k| k * PORT_BLOCK).take_while(move |s| s + blocks * PORT_BLOCK <= b))
        .collect();
    assert!(!starts.is_empty(), "no room for {n} ports outside the ephemeral range {lo}-{hi}");
    // One directory per user: another user's lock files could not be opened here.
    let uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").expect("/proc/self"));
    let dir = std::env::temp_dir().join(format!("rlmesh-test-ports-{uid}"));
    std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let seed = std::process::id() as u64 ^ std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    let first = (seed.wrapping_mul(6364136223846793005) >> 33) as usize % starts.len();
    for k in 0..starts.len() {
        let base = starts[(first + k) % starts.len()];
        let mut locks = vec![];
        for b in 0..blocks {
            let path = dir.join(format!("{}.lock", base + b * PORT_BLOCK));
            let file = std::fs::OpenOptions::new().create(true).truncate(false).write(true).open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            match file.try_lock() {
                Ok(()) => locks.push(file),
                Err(std::fs::TryLockError::WouldBlock) => break,
                Err(std::fs::TryLockError::Error(e)) => panic!("flock {}: {e}", path.display()),
            }
        }
        if locks.len() != blocks as usize {
            continue;
        }
        let base = base as u16;
        let held: Vec<_> = (0..n).map_while(|i| TcpListener::bind(("127.0.0.1", base + i)).ok()).collect();
        if held.len() == n as usize {
            HELD.lock().unwrap().extend(locks);
            return base;
        }
    }
    panic!("no {n} consecutive free ports outside the ephemeral range {lo}-{hi} that no other test holds");
}

/// The `[ports]` table of a topology whose every base has `n` free ports after it.
pub fn free_ports_table(n: u16) -> String {
    let b = free_port_base(4 * n);
    format!("[ports]\ncontrol = {}\ndata = {}\nmetrics = {}\nmaster = {}\n", b, b + n, b + 2 * n, b + 3 * n)
}

/// The lines of a JSONL file.
pub fn jsonl(path: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())).lines().map(|l| serde_json::from_str(l).unwrap()).collect()
}

/// A run's ledger: how many times each group was trained, and how many dispatches there were.
pub fn ledger_counts(run: &Path) -> (std::collections::HashMap<u64, usize>, usize) {
    let mut trained = std::collections::HashMap::new();
    let mut dispatched = 0;
    for e in jsonl(&run.join("ledger.jsonl")) {
        match e["event"].as_str() {
            Some("trained") => *trained.entry(e["group"].as_u64().unwrap()).or_default() += 1,
            Some("dispatch") => dispatched += 1,
            _ => {}
        }
    }
    (trained, dispatched)
}

/// The command lines of the processes in `pids` that run `launcher` (none once a run has left a host).
pub fn launcher_processes(pids: &[u32]) -> Vec<String> {
    pids.iter()
        .filter_map(|p| std::fs::read(format!("/proc/{p}/cmdline")).ok().map(|c| (p, String::from_utf8_lossy(&c).replace('\0', " "))))
        .filter(|(_, c)| c.contains("launcher"))
        .map(|(p, c)| format!("{p}: {c}"))
        .collect()
}

/// A shipped topology (`deploy/NAME.toml`) copied into `dir` with its `[ports]`
/// table on ports free now, so two test runs at once do not meet.
pub fn shipped_on_free_ports(name: &str, dir: &Path) -> PathBuf {
    let shipped = std::fs::read_to_string(repo().join(format!("deploy/{name}.toml"))).unwrap();
    let start = shipped.find("[ports]").unwrap();
    let end = start + shipped[start..].find("\n\n").unwrap();
    let path = dir.join(format!("{name}.toml"));
    std::fs::write(&path, format!("{}{}{}", &shipped[..start], free_ports_table(8), &shipped[end..])).unwrap();
    path
}

/// The ledger, replayed: a group is trained at most once between rollbacks (a
/// resume rolls back the steps after its checkpoint), and at the end every
/// dispatched group is trained exactly once.
pub fn assert_trained_once_replayed(run: &Path) {
    let mut trained: std::collections::HashMap<u64, u64> = Default::default();
    let mut dispatched = std::collections::HashSet::new();
    for e in jsonl(&run.join("ledger.jsonl")) {
        match e["event"].as_str().unwrap() {
            "dispatch" => {
                dispatched.insert(e["group"].as_u64().unwrap());
            }
            "trained" => {
                let g = e["group"].as_u64().unwrap();
                assert!(trained.insert(g, e["step"].as_u64().unwrap()).is_none(), "{}: group {g} trained twice", run.display());
            }
            "rollback" => {
                let s = e["step"].as_u64().unwrap();
                trained.retain(|_, step| *step <= s);
            }
            _ => {}
        }
    }
    assert!(!dispatched.is_empty(), "{}: nothing dispatched", run.display());
    let missing: Vec<&u64> = dispatched.iter().filter(|g| !trained.contains_key(g)).collect();
    if !missing.is_empty() {
        // Each missing group's own lines, and what the run logged, to tell a drop's reason from a loss.
        let lines: Vec<String> = jsonl(&run.join("ledger.jsonl"))
            .into_iter()
            .filter(|e| e["group"].as_u64().is_some_and(|g| missing.contains(&&g)) || e["event"] == "rollback")
            .map(|e| e.to_string())
            .collect();
        let log = std::fs::read_to_string(run.parent().unwrap().join("up.log")).unwrap_or_default();
        panic!("{}: dispatched, never trained: {missing:?}\nledger lines of those groups:\n{}\nup.log:\n{log}", run.display(), lines.join("\n"));
    }
}

/// The TCP addresses process `pid` listens on, read from /proc (its own
/// network namespace's tables, so a process on a test host shows that host's).
pub fn listening_addresses(pid: u32) -> Vec<std::net::SocketAddr> {
    use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
    let inodes: std::collections::HashSet<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| d.flatten().filter_map(|e| std::fs::read_link(e.path()).ok()).filter_map(|l| l.to_str()?.strip_prefix("socket:[")?.strip_suffix(']').map(String::from)).collect())
        .unwrap_or_default();
    let mut out = vec![];
    for (table, v6) in [("tcp", false), ("tcp6", true)] {
        let text = std::fs::read_to_string(format!("/proc/{pid}/net/{table}")).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            // local_address, state 0A (LISTEN), inode
            if f.len() < 10 || f[3] != "0A" || !inodes.contains(f[9]) {
                continue;
            }
            let (ip, port) = f[1].split_once(':').unwrap();
            let port = u16::from_str_radix(port, 16).unwrap();
            let ip: IpAddr = if v6 {
                let b: Vec<u8> = (0..16).map(|i| u8::from_str_radix(&ip[2 * i..2 * i + 2], 16).unwrap()).collect();
                // The kernel prints each 32-bit word in host (little-endian) order.
                let mut o = [0u8; 16];
                for w in 0..4 {
                    for k in 0..4 {
                        o[4 * w + k] = b[4 * w + 3 - k];
                    }
                }
                let a = Ipv6Addr::from(o);
                a.to_ipv4_mapped().map_or(IpAddr::V6(a), IpAddr::V4)
            } else {
                IpAddr::V4(Ipv4Addr::from(u32::from_str_radix(ip, 16).unwrap().swap_bytes()))
            };
            out.push(SocketAddr::new(ip, port));
        }
    }
    out
}

/// Every listener of `pid` is on `host` (the topology's address), none on every interface.
pub fn assert_listens_only_on(pid: u32, host: &str) {
    let addrs = listening_addresses(pid);
    assert!(!addrs.is_empty(), "process {pid} listens nowhere (or /proc is unreadable)");
    let want: std::net::IpAddr = host.parse().unwrap();
    for a in &addrs {
        assert_eq!(a.ip(), want, "process {pid} listens on {a}, not only on its host {host}: {addrs:?}");
    }
}

/// A live run to throw bad input at: the controller and the learner in `main`,
/// a rollout process and a reward process, on free ports of 127.0.0.1.
pub struct Target {
    pub child: std::process::Child,
    pub run: PathBuf,
    pub log: PathBuf,
    pub metrics: String,
    pub ports: String,
    pub cookie: rlmesh_mesh::cookie::Cookie,
}

impl Target {
    pub fn start(tmp: &Path, name: &str, steps: u32) -> Target {
        let recipe = format!(
            "reward = \"process\"\n[tasks]\nsize = 64\nheld_out = 100\n[sft]\nsteps = 150\nbatch_size = 16\ntasks = 1024\n\
             [rl]\nsteps = {steps}\ngroup_size = 4\ngroups_per_step = 3\nmax_turns = 2\nmax_new_tokens = 24\nmode = \"sync\"\n"
        );
        let recipe_path = tmp.join(format!("{name}-recipe.toml")).to_str().unwrap().to_string();
        std::fs::write(&recipe_path, recipe).unwrap();
        let ports = free_ports_table(8);
        let text = format!(
            "name = \"{name}\"\n[[nodes]]\nname = \"local\"\nhost = \"127.0.0.1\"\n{ports}\n\
             [controller]\nnode = \"local\"\nprocess = \"main\"\n[weight_sync]\nnode = \"local\"\nprocess = \"main\"\n\
             [rollout]\nplacement = [{{ node = \"local\", actors = 1 }}]\n[reward]\nplacement = [{{ node = \"local\", actors = 1, process = \"reward\" }}]\n\
             [learner]\nranks = 1\nplacement = [{{ node = \"local\", actors = 1, process = \"main\" }}]\n"
        );
        let topo = tmp.join(format!("{name}.toml"));
        std::fs::write(&topo, text).unwrap();
        let run = tmp.join(format!("run-{name}"));
        let metrics = format!("127.0.0.1:{}", free_port_base(1));
        let log = tmp.join(format!("{name}.log"));
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_launcher"))
            .current_dir(repo())
            .args(["up", topo.to_str().unwrap(), "--recipe", &recipe_path, "--run-dir", run.to_str().unwrap(), "--metrics-addr", &metrics, "--eval-limit", "8"])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        // The run is up once its status names its processes.
        let t0 = std::time::Instant::now();
        while !std::fs::read_to_string(run.join("status.json")).is_ok_and(|s| s.contains("local/reward")) {
            assert!(t0.elapsed() < std::time::Duration::from_secs(120), "the run never started: {}", std::fs::read_to_string(&log).unwrap_or_default());
            assert!(child.try_wait().unwrap().is_none(), "the run ended early: {}", std::fs::read_to_string(&log).unwrap_or_default());
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
        let cookie = rlmesh_mesh::cookie::Cookie::read_private(&run.join("cookie")).unwrap();
        Target { child, run, log, metrics, ports, cookie }
    }

    /// The port base `key` of the topology's `[ports]`.
    pub fn base(&self, key: &str) -> u16 {
        self.ports.lines().find(|l| l.starts_with(key)).unwrap().rsplit(' ').next().unwrap().parse().unwrap()
    }

    /// The `key` port of the process named `name` (the i-th process of the host: base + i).
    pub fn port_of(&self, name: &str, key: &str) -> u16 {
        let status: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(self.run.join("status.json")).unwrap()).unwrap();
        let i = status["processes"].as_array().unwrap().iter().position(|p| p["name"] == name).unwrap();
        self.base(key) + i as u16
    }
}

/// The ledger shows every dispatched group trained exactly once.
pub fn assert_trained_once(run: &Path) {
    let (trained, dispatched) = ledger_counts(run);
    assert!(dispatched > 0, "{}: nothing dispatched", run.display());
    assert_eq!(trained.len(), dispatched, "{}: every dispatched group is trained", run.display());
    assert!(trained.values().all(|&n| n == 1), "{}: a group trained twice: {trained:?}", run.display());
}

/// No `launcher node` of this run is left.
pub fn assert_no_nodes_left(run: &Path) {
    let status: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(run.join("status.json")).unwrap()).unwrap();
    for p in status["processes"].as_array().unwrap().iter().skip(1) {
        let pid = p["pid"].as_u64().unwrap();
        let alive = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.contains("node"));
        assert!(!alive, "{} (pid {pid}) outlived its run", p["name"]);
    }
}

pub fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n").unwrap();
    let mut body = String::new();
    s.read_to_string(&mut body).unwrap();
    body
}

pub fn series(text: &str, prefix: &str) -> f64 {
    text.lines().filter(|l| l.starts_with(prefix)).filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok()).sum()
}

/// The logs hold no step or rollout twice, and none is missing: `metrics.jsonl`
/// has steps 1..=`steps` once each in order, and `rollouts.jsonl` one row per
/// trained rollout (`rows_per_step` = groups per step × group size).
pub fn assert_logged_once(run: &Path, steps: u64, rows_per_step: u64) {
    let logged: Vec<u64> = jsonl(&run.join("metrics.jsonl")).iter().map(|r| r["step"].as_u64().unwrap()).collect();
    assert_eq!(logged, (1..=steps).collect::<Vec<_>>(), "{}: every step logged once, in order", run.display());
    let rows = jsonl(&run.join("rollouts.jsonl")).len() as u64;
    assert_eq!(rows, steps * rows_per_step, "{}: one rollouts.jsonl row per trained rollout ({steps} steps × {rows_per_step})", run.display());
}

/// Calculator tasks in the task-file format (`answer`, `tools`), no gold calls.
pub fn tasks_file(path: &Path, n: usize) {
    use std::io::Write;
    let mut f = std::fs::File::create(path).unwrap();
    for i in 0..n {
        let (a, b) = (3 + i * 7 % 50, 11 + i * 13 % 40);
        writeln!(f, "{}", serde_json::json!({"id": format!("sum-{i}"), "prompt": format!("What is {a} plus {b}?"), "answer": (a + b).to_string(), "tools": ["calculator"]})).unwrap();
    }
}

/// `launcher up` on the embedded topology with `recipe` written to `dir/recipe.toml`, evaluating 2 tasks.
pub fn up_recipe(dir: &Path, recipe: &str, run: &Path) -> Output {
    let path = dir.join("recipe.toml");
    std::fs::write(&path, recipe).unwrap();
    launcher(&["up", "deploy/local.toml", "--recipe", path.to_str().unwrap(), "--run-dir", run.to_str().unwrap(), "--metrics-addr", "127.0.0.1:0", "--eval-limit", "2"])
}
