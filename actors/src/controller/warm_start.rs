//! A warm-up shared between runs (`[sft] share = true`): recipes that differ
//! only after the warm-up (the estimator comparison) run it once.
//!
//! The key is a hash of everything the warm-up depends on: the model and
//! tokenizer spec, the tools, the task mix, the `[sft]` table, the seed and the
//! learner's thread count (a float result depends on it). The first run with a
//! key stores its after-warm-up model (weights, config, tokenizer) in
//! `<parent of RUN_DIR>/.warmups/<key>/`; later runs copy it into their own
//! `RUN_DIR/initial-model` and skip the warm-up. A store is written to a
//! temporary directory and renamed, so a reader never sees half of one.
use super::recipe::Recipe;
use serde_json::json;
use std::path::{Path, PathBuf};

/// The directory of the shared warm-up for `recipe` next to `run_dir`, on `threads` threads.
pub fn shared_dir(recipe: &Recipe, run_dir: &Path, threads: i32) -> PathBuf {
    let key = json!({
        "model": recipe.model, "tools": recipe.tools, "tasks": recipe.tasks, "sft": recipe.sft, "seed": recipe.seed, "threads": threads,
        // The value head (StepTool) is fresh after a shared warm-up either way: it is not part of the key.
    });
    let text = serde_json::to_string(&key).expect("recipe serialises");
    // FNV-1a 64: stable across builds and platforms.
    let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3));
    let parent = run_dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    parent.join(".warmups").join(format!("{hash:016x}"))
}

/// Whether a complete shared warm-up is stored in `shared`.
pub fn is_stored(shared: &Path) -> bool {
    shared.join("model.safetensors").is_file() && shared.join("config.json").is_file()
}

/// Copies the stored warm-up into `model_dir` (replacing its weights and config, keeping nothing else).
pub fn restore(shared: &Path, model_dir: &Path) -> std::io::Result<()> {
    if model_dir.exists() {
        std::fs::remove_dir_all(model_dir)?;
    }
    std::fs::create_dir_all(model_dir)?;
    for entry in std::fs::read_dir(shared)? {
        let path = entry?.path();
        if path.is_file() {
            std::fs::copy(&path, model_dir.join(path.file_name().expect("file")))?;
        }
    }
    Ok(())
}

/// Stores the after-warm-up model: the tokenizer files of `model_dir` with the
/// weights and config of the `checkpoint` written right after the warm-up.
/// A store that another run finished first is left as it is.
pub fn store(shared: &Path, model_dir: &Path, checkpoint: &Path) -> std::io::Result<()> {
    if is_stored(shared) {
        return Ok(());
    }
    let parent = shared.parent().expect("under .warmups");
    std::fs::create_dir_all(parent)?;
    let tmp = parent.join(format!(".tmp-{}-{}", shared.file_name().expect("key").to_string_lossy(), std::process::id()));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp)?;
    }
    std::fs::create_dir_all(&tmp)?;
    for entry in std::fs::read_dir(model_dir)? {
        let path = entry?.path();
        let name = path.file_name().expect("file").to_owned();
        if path.is_file() && name != "model.safetensors" && name != "config.json" {
            std::fs::copy(&path, tmp.join(&name))?;
        }
    }
    for name in ["model.safetensors", "config.json"] {
        std::fs::copy(checkpoint.join(name), tmp.join(name))?;
    }
    match std::fs::rename(&tmp, shared) {
        Ok(()) => Ok(()),
        // Another run stored it meanwhile.
        Err(_) if is_stored(shared) => std::fs::remove_dir_all(&tmp),
        Err(e) => Err(e),
    }
}
