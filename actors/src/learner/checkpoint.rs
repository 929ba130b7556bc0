//! Checkpoints: `ROOT/step-NNNNNNNN/` holding the policy as a transformers
//! directory (`config.json`, `model.safetensors`), `value_head.safetensors`
//! (when trained), `optimizer.safetensors` (AdamW moments, float32 master
//! weights) and `state.json` (steps, RNG state, β, policy version, data
//! cursor, and a hash of every other file). `ROOT/latest` links the newest.
//!
//! A learner whose optimizer state is sharded across ranks (`shard`) writes
//! `optimizer-rankNNNNN.safetensors`, one per rank, each the rank's own state,
//! and `state.json` records their layout ([`ShardLayout`]); every rank calls
//! [`Learner::save_checkpoint`] then (rank 0 writes everything else), and the
//! directory must be one they all reach. A resumed learner takes each element
//! of its state from the file of the rank that owned it, so a run resumes on
//! another number of ranks, sharded or not.
//!
//! Writing is atomic: everything goes to a temporary directory, is fsynced,
//! and the directory is renamed into place (then `latest` is swapped by a
//! rename); a crash mid-write leaves the previous checkpoints intact. Only
//! the newest `keep_checkpoints` are kept. Resuming takes the newest
//! checkpoint whose files all match their hashes, warning about each one
//! skipped.
use super::config::LearnerConfig;
use super::error::{io_err, LearnerError, Result};
use super::parallel::hash_bytes;
use super::trainer::Learner;
use rlmesh_comm::{Collective, ShardLayout};
use rlmesh_model::io::write_safetensors;
use rlmesh_model::Transformer;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

/// What the pipeline stores with a checkpoint.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct CheckpointMeta {
    /// Policy version of the saved weights.
    pub policy_version: u64,
    /// Where the dataset reader stands (opaque to the learner).
    pub data_cursor: serde_json::Value,
}

/// `state.json`.
#[derive(Serialize, Deserialize)]
struct State {
    format: u32,
    train_steps: u64,
    optimizer_steps: u64,
    rng: u64,
    kl_coef: f64,
    meta: CheckpointMeta,
    params: Vec<String>,
    /// File name → hash (hex) of its bytes.
    files: BTreeMap<String, String>,
    /// The layout of sharded optimizer state (one file per rank); absent: `optimizer.safetensors`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    optimizer_shards: Option<ShardLayout>,
}

const FORMAT: u32 = 1;
const STATE: &str = "state.json";
const OPTIMIZER: &str = "optimizer.safetensors";
const VALUE_HEAD: &str = "value_head.safetensors";
/// The frozen reference policy's weights (only with a KL term).
const REFERENCE: &str = "reference.safetensors";

/// Rank `rank`'s optimizer state in a sharded checkpoint.
fn shard_file(rank: usize) -> String {
    format!("optimizer-rank{rank:05}.safetensors")
}

/// A learner restored from a checkpoint.
pub struct Resumed {
    /// The learner, ready for its next step.
    pub learner: Learner,
    /// The pipeline's record from the checkpoint.
    pub meta: CheckpointMeta,
    /// The checkpoint used.
    pub path: PathBuf,
    /// One line per newer checkpoint that was unusable and skipped.
    pub warnings: Vec<String>,
}

/// The checkpoints under `root`, newest first.
pub fn list_checkpoints(root: &Path) -> Vec<(u64, PathBuf)> {
    let mut found: Vec<(u64, PathBuf)> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let step = name.strip_prefix("step-")?.parse().ok()?;
            Some((step, e.path()))
        })
        .collect();
    found.sort_by_key(|b| std::cmp::Reverse(b.0));
    found
}

fn file_hash(path: &Path) -> Result<String> {
    let bytes = std::fs::read(path).map_err(io_err(path))?;
    Ok(format!("{:016x}", hash_bytes(0, &bytes)))
}

fn fsync(path: &Path) -> Result<()> {
    std::fs::File::open(path).and_then(|f| f.sync_all()).map_err(io_err(path))
}

impl Learner {
    /// Writes a checkpoint of this learner under `root` and returns its directory.
    /// Call it on every rank: with unsharded state rank 0 writes it alone (the
    /// ranks hold the same state) and the others return at once; with sharded
    /// state each rank writes its own optimizer file, then rank 0 the rest.
    pub fn save_checkpoint(&mut self, root: &Path, meta: &CheckpointMeta) -> Result<PathBuf> {
        let name = format!("step-{:08}", self.train_steps);
        let dest = root.join(&name);
        let (rank, world) = self.rank();
        let sharded = self.optim.layout.world > 1;
        if !sharded && rank != 0 {
            return Ok(dest);
        }
        // The ranks of a sharded learner share the temporary directory: rank 0 makes it first.
        let tmp = if sharded { root.join(format!(".tmp-{name}-of-{world}")) } else { root.join(format!(".tmp-{name}-{}", std::process::id())) };
        if rank == 0 {
            std::fs::create_dir_all(root).map_err(io_err(root))?;
            if tmp.exists() {
                std::fs::remove_dir_all(&tmp).map_err(io_err(&tmp))?;
            }
            std::fs::create_dir_all(&tmp).map_err(io_err(&tmp))?;
        }
        if sharded {
            self.barrier()?;
            let file = tmp.join(shard_file(rank));
            write_safetensors(&file, &self.optim.state())?;
            fsync(&file)?;
            self.barrier()?;
        }
        if rank == 0 {
            self.write_rank0(root, &tmp, &dest, meta, sharded)?;
        }
        if sharded {
            // No rank goes on (and, say, resumes) before the checkpoint is in place.
            self.barrier()?;
        }
        Ok(dest)
    }

    /// Rank 0's part of a checkpoint: the model and everything but other ranks' optimizer
    /// files into `tmp`, `state.json` with every file's hash, then `tmp` renamed to `dest`.
    fn write_rank0(&self, root: &Path, tmp: &Path, dest: &Path, meta: &CheckpointMeta, sharded: bool) -> Result<()> {
        self.model.save(tmp, None)?;
        if let Some(v) = &self.value_head {
            write_safetensors(&tmp.join(VALUE_HEAD), &v.named())?;
        }
        if let Some(r) = self.reference() {
            let mut named: Vec<(String, Tensor)> = r.vs.variables().into_iter().collect();
            named.sort_by(|a, b| a.0.cmp(&b.0));
            write_safetensors(&tmp.join(REFERENCE), &named)?;
        }
        if !sharded {
            write_safetensors(&tmp.join(OPTIMIZER), &self.optim.state())?;
        }
        let mut files = BTreeMap::new();
        for entry in std::fs::read_dir(tmp).map_err(io_err(tmp))? {
            let path = entry.map_err(io_err(tmp))?.path();
            fsync(&path)?;
            files.insert(path.file_name().expect("file").to_string_lossy().into_owned(), file_hash(&path)?);
        }
        let state = State {
            format: FORMAT,
            train_steps: self.train_steps,
            optimizer_steps: self.optim.step,
            rng: self.rng,
            kl_coef: self.kl_coef,
            meta: meta.clone(),
            params: self.params.names.clone(),
            files,
            optimizer_shards: sharded.then_some(self.optim.layout),
        };
        let state_path = tmp.join(STATE);
        std::fs::write(&state_path, serde_json::to_vec_pretty(&state).expect("state serialises")).map_err(io_err(&state_path))?;
        fsync(&state_path)?;
        fsync(tmp)?;
        if dest.exists() {
            std::fs::remove_dir_all(dest).map_err(io_err(dest))?;
        }
        std::fs::rename(tmp, dest).map_err(io_err(dest))?;
        let name = dest.file_name().expect("step directory").to_string_lossy().into_owned();
        let link_tmp = root.join(format!(".latest-{}", std::process::id()));
        let _ = std::fs::remove_file(&link_tmp);
        std::os::unix::fs::symlink(&name, &link_tmp).map_err(io_err(&link_tmp))?;
        std::fs::rename(&link_tmp, root.join("latest")).map_err(io_err(root.join("latest")))?;
        fsync(root)?;
        for (_, old) in list_checkpoints(root).into_iter().skip(self.config.keep_checkpoints.max(1)) {
            std::fs::remove_dir_all(&old).map_err(io_err(&old))?;
        }
        Ok(())
    }

    /// Restores the newest usable checkpoint under `root` onto `device`
    /// (`kind` overrides the stored parameter dtype), skipping corrupt ones with a warning.
    pub fn resume(root: &Path, config: LearnerConfig, device: Device, kind: Option<Kind>, comm: Option<Box<dyn Collective>>) -> Result<Resumed> {
        let mut warnings = Vec::new();
        let mut tried = Vec::new();
        for (_, path) in list_checkpoints(root) {
            match Loaded::read(&path, device, kind, config.value.is_some(), config.kl.is_some()) {
                Ok(loaded) => {
                    let (learner, meta) = loaded.into_learner(&path, config, comm)?;
                    return Ok(Resumed { learner, meta, path, warnings });
                }
                Err(e) => {
                    let w = format!("warning: checkpoint {} is unusable ({e}); trying an earlier one", path.display());
                    eprintln!("{w}");
                    tried.push(format!("{}: {e}", path.display()));
                    warnings.push(w);
                }
            }
        }
        Err(LearnerError::NoCheckpoint {
            dir: root.to_path_buf(),
            tried: if tried.is_empty() { "no step-* directories".into() } else { tried.join("; ") },
        })
    }
}

/// A checkpoint read and verified, before it becomes a learner.
struct Loaded {
    state: State,
    model: Transformer,
    value_head: Option<Vec<(String, Tensor)>>,
    reference: Option<Vec<(String, Tensor)>>,
}

impl Loaded {
    fn read(path: &Path, device: Device, kind: Option<Kind>, value_head: bool, reference: bool) -> Result<Loaded> {
        let bad = |message: String| LearnerError::Checkpoint { path: path.to_path_buf(), message };
        let state_path = path.join(STATE);
        let text = std::fs::read(&state_path).map_err(io_err(&state_path))?;
        let state: State = serde_json::from_slice(&text).map_err(|e| bad(format!("{STATE}: {e}")))?;
        if state.format != FORMAT {
            return Err(bad(format!("{STATE}: format {}, expected {FORMAT}", state.format)));
        }
        for (file, hash) in &state.files {
            let got = file_hash(&path.join(file))?;
            if &got != hash {
                return Err(bad(format!("{file}: content hash {got}, {STATE} records {hash} (corrupt or partly written)")));
            }
        }
        let read = |file: &str| Tensor::read_safetensors(path.join(file)).map_err(|e| bad(format!("{file}: {e}")));
        let value = if value_head { Some(read(VALUE_HEAD)?) } else { None };
        // A learner with KL had a reference model, or took reference log-probs with each batch.
        let reference = if reference && path.join(REFERENCE).exists() { Some(read(REFERENCE)?) } else { None };
        if !path.join(OPTIMIZER).exists() && state.optimizer_shards.is_none() {
            return Err(bad(format!("{OPTIMIZER} missing")));
        }
        Ok(Loaded { model: Transformer::load(path, device, kind)?, value_head: value, reference, state })
    }

    fn into_learner(self, path: &Path, config: LearnerConfig, comm: Option<Box<dyn Collective>>) -> Result<(Learner, CheckpointMeta)> {
        let mut learner = Learner::new(self.model, config, comm)?;
        if learner.params.names != self.state.params {
            return Err(LearnerError::Checkpoint {
                path: path.to_path_buf(),
                message: "the trained parameters differ from the learner's (value head configured differently?)".into(),
            });
        }
        if let (Some(head), Some(saved)) = (&learner.value_head, &self.value_head) {
            for (name, var) in head.vs.variables() {
                let src = saved.iter().find(|(n, _)| *n == name).map(|(_, t)| t).ok_or_else(|| LearnerError::Checkpoint {
                    path: path.join(VALUE_HEAD),
                    message: format!("tensor {name} missing"),
                })?;
                tch::no_grad(|| var.shallow_clone().copy_(src));
            }
        }
        if let Some(saved) = &self.reference {
            let r = Transformer::new(learner.model.config.clone(), learner.model.device(), learner.model.kind());
            for (name, var) in r.vs.variables() {
                let src = saved.iter().find(|(n, _)| *n == name).map(|(_, t)| t).ok_or_else(|| LearnerError::Checkpoint {
                    path: path.join(REFERENCE),
                    message: format!("tensor {name} missing"),
                })?;
                tch::no_grad(|| var.shallow_clone().copy_(src));
            }
            learner.set_reference(r);
        }
        // The saved optimizer state, one file or one per rank of the saving run, read as this rank needs it.
        let total = learner.optim.layout.total;
        let (saved, file): (ShardLayout, fn(usize) -> String) = match self.state.optimizer_shards {
            Some(layout) => (layout, shard_file),
            None => (ShardLayout::whole(total), |_| OPTIMIZER.to_string()),
        };
        let read = |rank: usize| Tensor::read_safetensors(path.join(file(rank))).map_err(|e| LearnerError::Checkpoint { path: path.join(file(rank)), message: e.to_string() });
        learner.optim.load_state(&saved, read, self.state.optimizer_steps, path)?;
        learner.rng = self.state.rng;
        learner.kl_coef = self.state.kl_coef;
        learner.train_steps = self.state.train_steps;
        Ok((learner, self.state.meta))
    }
}
