//! Loading and saving Hugging Face model directories (`config.json` +
//! `model.safetensors` or a sharded `model.safetensors.index.json`).
use crate::config::ModelConfig;
use crate::error::{io_err, ModelError, Result};
use crate::transformer::Transformer;
use safetensors::tensor::{Dtype, View};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use tch::{Device, Kind, Tensor};

/// Parse a dtype name as transformers writes it.
pub fn kind_from_name(name: &str) -> Result<Kind> {
    match name {
        "float32" | "f32" | "fp32" => Ok(Kind::Float),
        "bfloat16" | "bf16" => Ok(Kind::BFloat16),
        "float16" | "f16" | "fp16" => Ok(Kind::Half),
        other => Err(ModelError::Input(format!("unsupported dtype {other:?} (float32, bfloat16, float16)"))),
    }
}

/// The transformers name of a dtype.
pub fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::BFloat16 => "bfloat16",
        Kind::Half => "float16",
        _ => "float32",
    }
}

/// The weight files of a model directory (one file, or the shards of an index).
fn weight_files(dir: &Path) -> Result<Vec<PathBuf>> {
    let single = dir.join("model.safetensors");
    if single.exists() {
        return Ok(vec![single]);
    }
    let index = dir.join("model.safetensors.index.json");
    if !index.exists() {
        return Err(ModelError::MissingFile { path: single, what: "model weights (or model.safetensors.index.json)" });
    }
    let text = std::fs::read_to_string(&index).map_err(io_err(&index))?;
    let v: serde_json::Value = serde_json::from_str(&text)
        .map_err(|e| ModelError::BadFile { path: index.clone(), message: format!("not valid JSON: {e}") })?;
    let map = v.get("weight_map").and_then(|m| m.as_object()).ok_or_else(|| ModelError::BadFile {
        path: index.clone(),
        message: "field \"weight_map\": expected an object".into(),
    })?;
    let mut files: Vec<PathBuf> = map.values().filter_map(|f| f.as_str()).map(|f| dir.join(f)).collect();
    files.sort();
    files.dedup();
    for f in &files {
        if !f.exists() {
            return Err(ModelError::MissingFile { path: f.clone(), what: "weight shard named in the index" });
        }
    }
    Ok(files)
}

/// Read every tensor of a model directory, by name.
pub fn read_weights(dir: &Path) -> Result<(PathBuf, HashMap<String, Tensor>)> {
    let files = weight_files(dir)?;
    let mut all = HashMap::new();
    for f in &files {
        let tensors = Tensor::read_safetensors(f).map_err(|e| ModelError::BadFile { path: f.clone(), message: e.to_string() })?;
        all.extend(tensors);
    }
    let shown = if files.len() == 1 { files[0].clone() } else { dir.join("model.safetensors.index.json") };
    Ok((shown, all))
}

impl Transformer {
    /// Load a model directory onto `device`; `kind` overrides the stored dtype.
    pub fn load(dir: &Path, device: Device, kind: Option<Kind>) -> Result<Self> {
        let config = ModelConfig::load(dir)?;
        let kind = match kind {
            Some(k) => k,
            None => kind_from_name(&config.dtype).map_err(|e| ModelError::BadFile { path: dir.join("config.json"), message: e.to_string() })?,
        };
        let model = Transformer::new(config, device, kind);
        let (path, weights) = read_weights(dir)?;
        model.copy_from(&path, &weights)?;
        Ok(model)
    }

    /// Copy named tensors into the parameters (shape-checked; dtype converted).
    pub fn copy_from(&self, path: &Path, weights: &HashMap<String, Tensor>) -> Result<()> {
        let vars = self.vs.variables();
        let mut missing: Vec<&String> = vars.keys().filter(|n| !weights.contains_key(*n)).collect();
        missing.sort();
        if !missing.is_empty() {
            let shown: Vec<&str> = missing.iter().take(5).map(|s| s.as_str()).collect();
            let more = if missing.len() > 5 { format!(" (and {} more)", missing.len() - 5) } else { String::new() };
            return Err(ModelError::MissingTensors { path: path.to_path_buf(), names: format!("{}{more}", shown.join(", ")) });
        }
        let mut names: Vec<&String> = vars.keys().collect();
        names.sort();
        tch::no_grad(|| -> Result<()> {
            for name in names {
                let var = &vars[name];
                let src = &weights[name];
                if src.size() != var.size() {
                    return Err(ModelError::BadTensor {
                        path: path.to_path_buf(),
                        name: name.clone(),
                        message: format!("shape {:?} in the file, {:?} from config.json", src.size(), var.size()),
                    });
                }
                if !matches!(src.kind(), Kind::Float | Kind::BFloat16 | Kind::Half | Kind::Double) {
                    return Err(ModelError::BadTensor {
                        path: path.to_path_buf(),
                        name: name.clone(),
                        message: format!("dtype {:?} is not a floating-point type", src.kind()),
                    });
                }
                var.shallow_clone().copy_(&src.to_kind(var.kind()).to_device(var.device()));
            }
            Ok(())
        })
    }

    /// Save as a transformers-loadable directory (`config.json`, `model.safetensors`), atomically.
    pub fn save(&self, dir: &Path, kind: Option<Kind>) -> Result<()> {
        let kind = kind.unwrap_or(self.kind());
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let tensors: Vec<(String, Tensor)> = self.vs.variables().into_iter().map(|(n, t)| (n, t.detach().to_kind(kind))).collect();
        write_safetensors(&dir.join("model.safetensors"), &tensors)?;
        let config = serde_json::to_string_pretty(&self.config.to_json(kind_name(kind))).expect("config serialises");
        write_atomic(&dir.join("config.json"), config.as_bytes())
    }
}

/// Write `bytes` to `path` through a temporary file and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err(path))
}

struct HostTensor {
    dtype: Dtype,
    shape: Vec<usize>,
    bytes: Vec<u8>,
}

impl View for &HostTensor {
    fn dtype(&self) -> Dtype {
        self.dtype
    }
    fn shape(&self) -> &[usize] {
        &self.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Borrowed(&self.bytes)
    }
    fn data_len(&self) -> usize {
        self.bytes.len()
    }
}

fn to_host(t: &Tensor) -> Result<HostTensor> {
    let t = t.to_device(Device::Cpu).contiguous();
    let (dtype, size) = match t.kind() {
        Kind::Float => (Dtype::F32, 4),
        Kind::BFloat16 => (Dtype::BF16, 2),
        Kind::Half => (Dtype::F16, 2),
        Kind::Double => (Dtype::F64, 8),
        Kind::Int64 => (Dtype::I64, 8),
        Kind::Int => (Dtype::I32, 4),
        Kind::Uint8 => (Dtype::U8, 1),
        other => return Err(ModelError::Input(format!("cannot save dtype {other:?}"))),
    };
    let numel = t.numel();
    let mut bytes = vec![0u8; numel * size];
    t.f_copy_data_u8(&mut bytes, numel)?;
    Ok(HostTensor { dtype, shape: t.size().iter().map(|&d| d as usize).collect(), bytes })
}

/// Write named tensors as one safetensors file with `{"format": "pt"}` metadata, atomically.
pub fn write_safetensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    let host: BTreeMap<String, HostTensor> = tensors.iter().map(|(n, t)| Ok((n.clone(), to_host(t)?))).collect::<Result<_>>()?;
    let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    let bytes = safetensors::tensor::serialize(host.iter().map(|(n, t)| (n.as_str(), t)), Some(meta))
        .map_err(|e| ModelError::BadFile { path: path.to_path_buf(), message: e.to_string() })?;
    write_atomic(path, &bytes)
}
