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
