//! Fixtures shared by the model tests: the project's Python (transformers as
//! the oracle), tiny random models made by transformers at test time, and the
//! SmolLM2-135M conversion the set-up caches.
#![allow(dead_code)]
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The repository root.
pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// Directory holding cached models (SmolLM2-135M), prepared on first use.
pub fn models_dir() -> PathBuf {
    let out = Command::new(repo().join("scripts/prepare-models.sh")).output().expect("run scripts/prepare-models.sh");
    assert!(out.status.success(), "prepare-models failed: {}", String::from_utf8_lossy(&out.stderr));
    PathBuf::from(String::from_utf8(out.stdout).unwrap().lines().last().unwrap().trim())
}

/// The converted SmolLM2-135M-Instruct directory.
pub fn smollm2() -> PathBuf {
    models_dir().join("smollm2-135m")
}

/// Run a subcommand of tests/oracle/hf_oracle.py with JSON on stdin; parse its JSON output.
pub fn oracle(args: &[&str], input: &Value) -> Value {
    let mut child = Command::new(repo().join("scripts/py"))
        .arg(repo().join("tests/oracle/hf_oracle.py"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn the oracle");
    child.stdin.take().unwrap().write_all(input.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "oracle {:?} failed: {}", args, String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    serde_json::from_str(text.lines().last().expect("oracle printed nothing")).expect("oracle JSON")
}

/// A tiny random model written by transformers (with SmolLM2's tokenizer and the Qwen2.5 tool template).
pub fn tiny_model(dir: &Path, arch: &str, tied: bool, bias: bool, seed: u64, extra: &[&str]) -> PathBuf {
    let out = dir.join(format!("{arch}-t{}-b{}-s{seed}", tied as u8, bias as u8));
    let tok = smollm2();
    let template = repo().join("model/templates/qwen2.5-tools.jinja");
    let mut args = vec![
        "make-tiny".to_string(),
        "--out".into(),
        out.display().to_string(),
        "--arch".into(),
        arch.into(),
        "--tied".into(),
        (tied as u8).to_string(),
        "--bias".into(),
        (bias as u8).to_string(),
        "--seed".into(),
        seed.to_string(),
        "--tokenizer".into(),
        tok.display().to_string(),
        "--template".into(),
        template.display().to_string(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    oracle(&refs, &Value::Null);
    out
}

/// Largest absolute difference between two ragged arrays of floats.
pub fn max_abs_diff(a: &[Vec<f32>], b: &Value) -> f64 {
    let b: Vec<Vec<f64>> = serde_json::from_value(b.clone()).unwrap();
    assert_eq!(a.len(), b.len(), "number of sequences");
    let mut worst = 0.0f64;
    for (x, y) in a.iter().zip(&b) {
        assert_eq!(x.len(), y.len(), "sequence length");
        for (p, q) in x.iter().zip(y) {
            worst = worst.max((*p as f64 - q).abs());
        }
    }
    worst
}

/// Deterministic pseudo-random token sequences (splitmix64), ids in 3..vocab.
pub fn sequences(lens: &[usize], vocab: u32, seed: u64) -> Vec<Vec<u32>> {
    let mut s = seed;
    let mut next = || {
        s = s.wrapping_add(0x9E3779B97F4A7C15);
        let mut z = s;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
        z ^ (z >> 31)
    };
    lens.iter().map(|&n| (0..n).map(|_| 3 + (next() % (vocab as u64 - 3)) as u32).collect()).collect()
}
