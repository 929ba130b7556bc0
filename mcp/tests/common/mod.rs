//! Fixtures for the MCP tests: where the Python `mcp` package, the test
//! servers and `@modelcontextprotocol/server-everything` are, a Streamable
//! HTTP server process killed on drop, and what /proc says about processes.
#![allow(dead_code)]
use rlmesh_core::Task;
use rlmesh_mcp::ServerSpec;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Prints `SKIPPED: <why>` and returns from the test when `$e` is `None`.
#[macro_export]
macro_rules! require {
    ($e:expr) => {
        match $e {
            Some(v) => v,
            None => return,
        }
    };
}

/// The Python with the `mcp` package (`$RLMESH_PYTHON`, set by scripts/env.sh, else `python3`).
pub fn python() -> Option<String> {
    let py = std::env::var("RLMESH_PYTHON").unwrap_or_else(|_| "python3".into());
    let ok = Command::new(&py)
        .args(["-c", "import mcp.server.mcpserver, mcp_server_time"])
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        println!("SKIPPED: {py} lacks the mcp and mcp-server-time packages (scripts/setup-python.sh installs them)");
        return None;
    }
    Some(py)
}

/// `tests/servers/<name>`.
pub fn server_file(name: &str) -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/servers").join(name).display().to_string()
}

/// A stdio spec of the test server (`tests/servers/tools_server.py`).
pub fn tools_server(py: &str, name: &str) -> ServerSpec {
    ServerSpec::stdio(name, [py.to_string(), server_file("tools_server.py"), "stdio".into()])
}

/// A stdio spec of the bare server publishing `tools` (JSON).
pub fn raw_server(py: &str, name: &str, tools: serde_json::Value) -> ServerSpec {
    ServerSpec::stdio(name, [py.to_string(), server_file("raw_server.py"), tools.to_string()])
}

/// server-everything's entry point (`$RLMESH_MCP_EVERYTHING`, else the npm
/// cache scripts/setup-npm.sh fills), with `node` on the path.
pub fn everything() -> Option<String> {
    let entry = std::env::var("RLMESH_MCP_EVERYTHING").map(PathBuf::from).unwrap_or_else(|_| {
        let cache = std::env::var("RLMESH_CACHE")
            .map(PathBuf::from)
            .unwrap_or_else(|_| PathBuf::from(std::env::var("HOME").unwrap_or_default()).join(".cache/rlmesh"));
        cache.join("npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js")
    });
    let node = Command::new("node").arg("--version").stdout(Stdio::null()).status().is_ok_and(|s| s.success());
    if !node || !entry.is_file() {
        println!("SKIPPED: node or {} is missing (scripts/setup-npm.sh installs it)", entry.display());
        return None;
    }
    Some(entry.display().to_string())
}

/// A server process started by a test: its own process group, killed on drop
/// (also when the test fails).
pub struct ServerProcess {
    child: std::process::Child,
    /// The URL it serves MCP at.
    pub url: String,
    _dir: tempfile::TempDir,
}

impl ServerProcess {
    /// Starts `command` (with `{port_file}` replaced by a file it writes its
    /// port to, or `{port}` by a free port) and waits until it accepts connections.
    pub fn start(command: &[&str], path: &str) -> ServerProcess {
        let dir = tempfile::tempdir().unwrap();
        let port_file = dir.path().join("port");
        let fixed = command.iter().any(|a| a.contains("{port}")).then(free_port);
        let args: Vec<String> = command
            .iter()
            .map(|a| a.replace("{port_file}", &port_file.display().to_string()).replace("{port}", &fixed.unwrap_or(0).to_string()))
            .collect();
        let mut cmd = Command::new(&args[0]);
        cmd.args(&args[1..]).stdout(Stdio::null()).stderr(Stdio::null()).process_group(0);
        if let Some(p) = fixed {
            cmd.env("PORT", p.to_string());
        }
        let child = cmd.spawn().unwrap();
        let mut server = ServerProcess { child, url: String::new(), _dir: dir };
        let deadline = Instant::now() + Duration::from_secs(30);
        let port = loop {
            let port = fixed.or_else(|| std::fs::read_to_string(&port_file).ok().and_then(|p| p.trim().parse().ok()));
            if let Some(p) = port.filter(|p| std::net::TcpStream::connect(("127.0.0.1", *p)).is_ok()) {
                break p;
            }
            assert!(server.child.try_wait().unwrap().is_none(), "the server {args:?} exited");
            assert!(Instant::now() < deadline, "the server {args:?} did not listen within 30 s");
            std::thread::sleep(Duration::from_millis(50));
        };
        server.url = format!("http://127.0.0.1:{port}{path}");
        server
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        // SAFETY: killpg(2) on the group this test's child leads (not yet reaped).
        unsafe { libc::killpg(self.child.id() as libc::pid_t, libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// A port nobody listens on now (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// The state letter of a process (`R`, `S`, `Z`, …), `None` when it is gone.
pub fn proc_state(pid: u32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?.1.trim_start().chars().next()
}

/// Whether a process runs: it exists and is not a zombie, or its leader is a
/// zombie while other threads still exit (a killed multi-threaded Python shows
/// `Z` before its pipes close and before its parent can reap it).
pub fn alive(pid: u32) -> bool {
    match proc_state(pid) {
        None => false,
        Some('Z') => std::fs::read_dir(format!("/proc/{pid}/task")).is_ok_and(|d| d.count() > 1),
        Some(_) => true,
    }
}

/// The live (not zombie) processes of process group `pgid`.
pub fn group_members(pgid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
        let Some((_, rest)) = stat.rsplit_once(')') else { continue };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() > 2 && fields[0] != "Z" && fields[2].parse() == Ok(pgid) {
            out.push(pid);
        }
    }
    out
}

/// Waits up to `limit` for `f` to hold.
pub fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    f()
}

/// A task with an id and an `env_state`, no environment named.
pub fn task(id: &str, env_state: Option<serde_json::Value>) -> Task {
    Task {
        id: id.into(),
        prompt: "p".into(),
        requires_tool: true,
        allowed_tools: vec![],
        gold_tool_calls: vec![],
        expected_answer: None,
        environment: None,
        env_state,
        ..Task::default()
    }
}

/// A `<tool_call>` block calling `name` with `args`.
pub fn call(name: &str, args: serde_json::Value) -> String {
    format!("<tool_call>\n{}\n</tool_call>", serde_json::json!({"name": name, "arguments": args}))
}
