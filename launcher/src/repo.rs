//! The repository this binary was built from: its root, its scripts, the
//! project's Python (for the oracle and peer benchmarks) and the cached models.
use crate::error::{CliResult, UsageContext};
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The repository root (scripts/, tests/oracle/): `RLMESH_ROOT` or the source tree this binary was built from.
pub fn repo_root() -> PathBuf {
    std::env::var_os("RLMESH_ROOT").map(PathBuf::from).unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf())
}

/// Run a repository script and return its last stdout line.
pub fn script_output(script: &str, args: &[&str]) -> CliResult<String> {
    let out = Command::new(repo_root().join(script)).args(args).stderr(Stdio::inherit()).output().usage(format!("running {script}"))?;
    if !out.status.success() {
        return Err(anyhow::anyhow!("{script} failed ({})", out.status).into());
    }
    Ok(String::from_utf8_lossy(&out.stdout).lines().last().unwrap_or("").trim().to_string())
}

/// The cached models directory (created by scripts/prepare-models.sh).
pub fn models_dir() -> CliResult<PathBuf> {
    Ok(PathBuf::from(script_output("scripts/prepare-models.sh", &[])?))
}

/// Run the project's Python on a repository script with optional JSON stdin; parse the last line as JSON.
pub fn python(args: &[&str], stdin: Option<&Value>) -> CliResult<Value> {
    let mut child = Command::new(repo_root().join("scripts/py"))
        .args(args.iter().enumerate().map(|(i, a)| if i == 0 { repo_root().join(a).display().to_string() } else { a.to_string() }))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .usage("starting the project's Python (scripts/py)")?;
    let input = stdin.map(|v| v.to_string()).unwrap_or_default();
    child.stdin.take().expect("piped").write_all(input.as_bytes())?;
    let out = child.wait_with_output()?;
    if !out.status.success() {
        return Err(anyhow::anyhow!("python {} failed ({})", args[0], out.status).into());
    }
    let text = String::from_utf8_lossy(&out.stdout);
    Ok(serde_json::from_str(text.lines().last().unwrap_or("null"))?)
}
