//! Loading and saving Hugging Face model directories (`config.json` +
//! `model.safetensors` or a sharded `model.safetensors.index.json`).
use crate::config::ModelConfig;
use crate::error::{io_err, ModelError, Result};
use crate::transformer::Transformer;
use safetensors::tensor::{Dtype, Metadata, TensorInfo};
use std::collections::HashMap;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
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
        model.load_weights(dir)?;
        Ok(model)
    }

    /// Fill the parameters from a model directory's weight files, one tensor at a
    /// time straight from the file (shape-checked; dtype converted): no copy of the
    /// file's tensors is held, so peak memory is the parameters plus at most one tensor.
    pub fn load_weights(&self, dir: &Path) -> Result<()> {
        let files = weight_files(dir)?;
        let shown = if files.len() == 1 { files[0].clone() } else { dir.join("model.safetensors.index.json") };
        let headers = files.iter().map(|f| read_header(f)).collect::<Result<Vec<_>>>()?;
        let vars = self.vs.variables();
        check_missing(&shown, &vars, |n| headers.iter().any(|(_, _, table)| table.info(n).is_some()))?;
        let mut scratch: Vec<u64> = vec![];
        tch::no_grad(|| -> Result<()> {
            for (path, (mut file, data_start, table)) in files.iter().zip(headers) {
                let mut entries: Vec<(String, &TensorInfo)> = table.tensors().into_iter().filter(|(n, _)| vars.contains_key(n)).collect();
                entries.sort_by_key(|(_, info)| info.data_offsets.0);
                for (name, info) in entries {
                    let var = &vars[&name];
                    let shape: Vec<i64> = info.shape.iter().map(|&d| d as i64).collect();
                    check_tensor(path, &name, &shape, file_kind(info.dtype), var)?;
                    let kind = file_kind(info.dtype).expect("checked");
                    let (begin, end) = info.data_offsets;
                    let bad = |message: String| ModelError::BadFile { path: path.clone(), message: format!("tensor {name}: {message}") };
                    if end - begin != var.numel() * kind.elt_size_in_bytes() {
                        return Err(bad(format!("{} bytes for shape {:?} of {:?}", end - begin, shape, info.dtype)));
                    }
                    file.seek(SeekFrom::Start(data_start + begin as u64)).map_err(io_err(path))?;
                    if kind == var.kind() && var.device() == Device::Cpu && var.is_contiguous() {
                        // SAFETY: `var` is a contiguous CPU tensor of exactly `end - begin` bytes, not aliased during the read.
                        let dst = unsafe { std::slice::from_raw_parts_mut(var.data_ptr() as *mut u8, end - begin) };
                        file.read_exact(dst).map_err(|e| bad(e.to_string()))?;
                    } else {
                        scratch.resize((end - begin).div_ceil(8), 0);
                        // SAFETY: the scratch buffer holds at least `end - begin` bytes (8-byte aligned).
                        let bytes = unsafe { std::slice::from_raw_parts_mut(scratch.as_mut_ptr() as *mut u8, end - begin) };
                        file.read_exact(bytes).map_err(|e| bad(e.to_string()))?;
                        // SAFETY: `src` borrows `bytes`, which outlives it (the copy below is synchronous).
                        let src = unsafe { Tensor::from_blob(bytes.as_ptr(), &shape, &[], kind, Device::Cpu) };
                        var.shallow_clone().copy_(&src);
                    }
                }
            }
            Ok(())
        })
    }

    /// Copy named tensors into the parameters (shape-checked; dtype converted).
    pub fn copy_from(&self, path: &Path, weights: &HashMap<String, Tensor>) -> Result<()> {
        let vars = self.vs.variables();
        check_missing(path, &vars, |n| weights.contains_key(n))?;
        let mut names: Vec<&String> = vars.keys().collect();
        names.sort();
        tch::no_grad(|| -> Result<()> {
            for name in names {
                let var = &vars[name];
                let src = &weights[name];
                let kind = matches!(src.kind(), Kind::Float | Kind::BFloat16 | Kind::Half | Kind::Double).then_some(src.kind()).ok_or(src.kind());
                check_tensor(path, name, &src.size(), kind, var)?;
                var.shallow_clone().copy_(&src.to_kind(var.kind()).to_device(var.device()));
            }
            Ok(())
        })
    }

    /// Save as a transformers-loadable directory (`config.json`, `model.safetensors`), atomically.
    pub fn save(&self, dir: &Path, kind: Option<Kind>) -> Result<()> {
        let kind = kind.unwrap_or(self.kind());
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let tensors: Vec<(String, Tensor)> = self.vs.variables().into_iter().collect();
        write_safetensors_as(&dir.join("model.safetensors"), &tensors, Some(kind))?;
        let config = serde_json::to_string_pretty(&self.config.to_json(kind_name(kind))).expect("config serialises");
        write_atomic(&dir.join("config.json"), config.as_bytes())
    }
}

/// The tensor kind of a floating-point safetensors dtype (the dtype itself otherwise).
fn file_kind(dtype: Dtype) -> std::result::Result<Kind, Dtype> {
    match dtype {
        Dtype::F32 => Ok(Kind::Float),
        Dtype::BF16 => Ok(Kind::BFloat16),
        Dtype::F16 => Ok(Kind::Half),
        Dtype::F64 => Ok(Kind::Double),
        other => Err(other),
    }
}

/// Opens a safetensors file and reads its header: the file positioned after it,
/// the offset where tensor data starts, and the tensor table.
fn read_header(path: &Path) -> Result<(File, u64, Metadata)> {
    let bad = |message: String| ModelError::BadFile { path: path.to_path_buf(), message };
    let mut file = File::open(path).map_err(io_err(path))?;
    let mut len = [0u8; 8];
    file.read_exact(&mut len).map_err(|e| bad(format!("no safetensors header: {e}")))?;
    let len = u64::from_le_bytes(len);
    if len > 100_000_000 {
        return Err(bad(format!("safetensors header of {len} bytes")));
    }
    let mut header = vec![0u8; len as usize];
    file.read_exact(&mut header).map_err(|e| bad(format!("truncated safetensors header: {e}")))?;
    let table: Metadata = serde_json::from_slice(&header).map_err(|e| bad(format!("bad safetensors header: {e}")))?;
    Ok((file, 8 + len, table))
}

/// Fails with the (first few, sorted) parameter names that `present` does not find.
fn check_missing(path: &Path, vars: &HashMap<String, Tensor>, present: impl Fn(&str) -> bool) -> Result<()> {
    let mut missing: Vec<&String> = vars.keys().filter(|n| !present(n)).collect();
    missing.sort();
    if missing.is_empty() {
        return Ok(());
    }
    let shown: Vec<&str> = missing.iter().take(5).map(|s| s.as_str()).collect();
    let more = if missing.len() > 5 { format!(" (and {} more)", missing.len() - 5) } else { String::new() };
    Err(ModelError::MissingTensors { path: path.to_path_buf(), names: format!("{}{more}", shown.join(", ")) })
}

/// Checks a stored tensor's shape and floating-point dtype (`Err`: the dtype it has) against its parameter.
fn check_tensor<K: std::fmt::Debug>(path: &Path, name: &str, shape: &[i64], kind: std::result::Result<Kind, K>, var: &Tensor) -> Result<()> {
    let bad = |message: String| Err(ModelError::BadTensor { path: path.to_path_buf(), name: name.to_string(), message });
    if shape != var.size().as_slice() {
        return bad(format!("shape {:?} in the file, {:?} from config.json", shape, var.size()));
    }
    if let Err(dtype) = kind {
        return bad(format!("dtype {dtype:?} is not a floating-point type"));
    }
    Ok(())
}

/// Write `bytes` to `path` through a temporary file and a rename.
pub fn write_atomic(path: &Path, bytes: &[u8]) -> Result<()> {
    let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
    std::fs::write(&tmp, bytes).map_err(io_err(&tmp))?;
    std::fs::rename(&tmp, path).map_err(io_err(path))
}

/// The safetensors dtype of a tensor kind, and its element size.
fn file_dtype(kind: Kind) -> Result<(Dtype, usize)> {
    Ok(match kind {
        Kind::Float => (Dtype::F32, 4),
        Kind::BFloat16 => (Dtype::BF16, 2),
        Kind::Half => (Dtype::F16, 2),
        Kind::Double => (Dtype::F64, 8),
        Kind::Int64 => (Dtype::I64, 8),
        Kind::Int => (Dtype::I32, 4),
        Kind::Uint8 => (Dtype::U8, 1),
        other => return Err(ModelError::Input(format!("cannot save dtype {other:?}"))),
    })
}

/// Where each tensor of a safetensors file goes: the file's first bytes (the
/// header's length and the header, padded with spaces to 8 bytes, as
/// `safetensors::serialize` writes them), then each tensor, in the file's
/// order (sorted by dtype, largest first, then by name), with the kind it is
/// stored in and its bytes; the file's total length.
struct Layout<'a> {
    head: Vec<u8>,
    tensors: Vec<(&'a Tensor, Kind, i64)>,
    len: usize,
}

impl<'a> Layout<'a> {
    fn of(tensors: &'a [(String, Tensor)], kind: Option<Kind>, metadata: Option<HashMap<String, String>>) -> Result<Layout<'a>> {
        let mut planned = tensors
            .iter()
            .map(|(name, t)| {
                let k = kind.unwrap_or(t.kind());
                let (dtype, size) = file_dtype(k)?;
                let shape: Vec<usize> = t.size().iter().map(|&d| d as usize).collect();
                Ok((name, t, k, dtype, shape.iter().product::<usize>() * size, shape))
            })
            .collect::<Result<Vec<_>>>()?;
        planned.sort_by(|a, b| b.3.cmp(&a.3).then(a.0.cmp(b.0)));
        let mut offset = 0usize;
        let mut infos = Vec::with_capacity(planned.len());
        for (name, _, _, dtype, bytes, shape) in &planned {
            infos.push(((*name).clone(), TensorInfo { dtype: *dtype, shape: shape.clone(), data_offsets: (offset, offset + bytes) }));
            offset += bytes;
        }
        let meta = Metadata::new(metadata, infos).map_err(|e| ModelError::Input(format!("safetensors: {e}")))?;
        let mut header = serde_json::to_vec(&meta).map_err(|e| ModelError::Input(format!("safetensors header: {e}")))?;
        header.resize(header.len().next_multiple_of(8), b' ');
        let mut head = (header.len() as u64).to_le_bytes().to_vec();
        head.extend_from_slice(&header);
        let len = head.len() + offset;
        Ok(Layout { head, tensors: planned.into_iter().map(|(_, t, k, _, bytes, _)| (t, k, bytes as i64)).collect(), len })
    }

    /// Copies every tensor into its place in `dst` (a 1-D `Uint8` tensor of
    /// at least `len` bytes whose first `head.len()` bytes are written already):
    /// one copy each, converting the dtype and crossing devices as it goes.
    fn fill(&self, dst: &Tensor) -> Result<()> {
        let mut at = self.head.len() as i64;
        tch::no_grad(|| {
            for (t, k, bytes) in &self.tensors {
                let place = dst.f_narrow(0, at, *bytes)?.f_view_dtype(*k)?;
                place.f_view(t.size().as_slice())?.f_copy_(&t.detach())?;
                at += bytes;
            }
            Ok::<(), tch::TchError>(())
        })?;
        Ok(())
    }
}

/// Named tensors as the bytes of one safetensors file, each in `kind` (or in
/// its own dtype): the file `safetensors::serialize` writes (tensors sorted by
/// dtype, largest first, then by name; the header padded with spaces to 8
/// bytes), but every tensor is copied once, straight into its place in the
/// file. From a GPU that copy is the device-to-host copy itself; a dtype
/// change happens in the same copy.
pub fn safetensors_image(tensors: &[(String, Tensor)], kind: Option<Kind>, metadata: Option<HashMap<String, String>>) -> Result<Vec<u8>> {
    let layout = Layout::of(tensors, kind, metadata)?;
    // Zeroed by the allocator (fresh pages for a large file, no memset); every byte is written below.
    let mut image = vec![0u8; layout.len];
    image[..layout.head.len()].copy_from_slice(&layout.head);
    // SAFETY: `dst` views `image`, which outlives it; the copies into it are synchronous.
    let dst = unsafe { Tensor::from_blob(image.as_mut_ptr(), &[image.len() as i64], &[1], Kind::Uint8, Device::Cpu) };
    layout.fill(&dst)?;
    drop(dst);
    Ok(image)
}

/// [`safetensors_image`] built in a 1-D `Uint8` tensor on `device` instead
/// of host memory: the same bytes, with each tensor copied once within
/// that device (a GPU's parameters never pass through the host; only the
/// header, a few KB, is copied up).
pub fn safetensors_image_on(tensors: &[(String, Tensor)], kind: Option<Kind>, metadata: Option<HashMap<String, String>>, device: Device) -> Result<Tensor> {
    let layout = Layout::of(tensors, kind, metadata)?;
    let image = Tensor::f_empty([layout.len as i64], (Kind::Uint8, device))?;
    image.f_narrow(0, 0, layout.head.len() as i64)?.f_copy_(&Tensor::from_slice(&layout.head))?;
    layout.fill(&image)?;
    Ok(image)
}

/// Named tensors as the bytes of one safetensors file (copied to the host, in their own dtypes).
pub fn safetensors_bytes(tensors: &[(String, Tensor)], metadata: Option<HashMap<String, String>>) -> Result<Vec<u8>> {
    safetensors_image(tensors, None, metadata)
}

/// Write named tensors as one safetensors file with `{"format": "pt"}` metadata, atomically.
pub fn write_safetensors(path: &Path, tensors: &[(String, Tensor)]) -> Result<()> {
    write_safetensors_as(path, tensors, None)
}

/// [`write_safetensors`], every tensor in `kind` (or in its own dtype).
fn write_safetensors_as(path: &Path, tensors: &[(String, Tensor)], kind: Option<Kind>) -> Result<()> {
    let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
    let bytes = safetensors_image(tensors, kind, Some(meta)).map_err(|e| ModelError::BadFile { path: path.to_path_buf(), message: e.to_string() })?;
    write_atomic(path, &bytes)
}

#[cfg(test)]
mod tests {
    use super::*;
    use safetensors::tensor::{serialize, TensorView};

    /// The file safetensors itself writes from the tensors' host bytes: the oracle.
    fn oracle(tensors: &[(String, Tensor)], metadata: Option<HashMap<String, String>>) -> Vec<u8> {
        let host: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = tensors
            .iter()
            .map(|(n, t)| {
                let (dtype, size) = file_dtype(t.kind()).unwrap();
                let mut b = vec![0u8; size * t.numel()];
                t.contiguous().copy_data_u8(&mut b, t.numel());
                (n.clone(), dtype, t.size().iter().map(|&d| d as usize).collect(), b)
            })
            .collect();
        serialize(host.iter().map(|(n, d, s, b)| (n.as_str(), TensorView::new(*d, s.clone(), b).unwrap())), metadata).unwrap()
    }

    #[test]
    fn an_image_is_the_file_safetensors_writes_for_every_dtype_shape_and_metadata() {
        tch::manual_seed(7);
        let f = Tensor::randn([3, 5], (Kind::Float, Device::Cpu));
        let tensors: Vec<(String, Tensor)> = vec![
            ("z.weight".into(), f.shallow_clone()),
            ("a.bf16".into(), Tensor::randn([7], (Kind::Float, Device::Cpu)).to_kind(Kind::BFloat16)),
            ("m.step".into(), Tensor::from_slice(&[42i64])),
            ("m.scalar".into(), Tensor::from(2.5f64)),
            ("b.bytes".into(), Tensor::from_slice(&[1u8, 2, 3])),
            ("c.empty".into(), Tensor::zeros([0, 4], (Kind::Float, Device::Cpu))),
            ("d.half".into(), Tensor::randn([2, 3], (Kind::Float, Device::Cpu)).to_kind(Kind::Half)),
            ("e.transposed".into(), f.transpose(0, 1)),
        ];
        let meta: HashMap<String, String> = [("format".to_string(), "pt".to_string())].into();
        assert!(safetensors_image(&tensors, None, Some(meta.clone())).unwrap() == oracle(&tensors, Some(meta)));
        assert!(safetensors_image(&tensors, None, None).unwrap() == oracle(&tensors, None));
        // One dtype for all: each tensor converted as it is copied.
        let floats: Vec<(String, Tensor)> = tensors.iter().map(|(n, t)| (n.clone(), t.to_kind(Kind::Float))).collect();
        assert!(safetensors_image(&tensors, Some(Kind::Float), None).unwrap() == oracle(&floats, None));
        // A dtype safetensors cannot hold is an error, not a panic.
        let bad = vec![("x".to_string(), Tensor::from_slice(&[true]))];
        assert!(safetensors_image(&bad, None, None).unwrap_err().to_string().contains("cannot save dtype"));
        // Built in a tensor on a device (here the CPU, through the same code a GPU takes): the same file.
        let on = safetensors_image_on(&tensors, Some(Kind::Float), None, Device::Cpu).unwrap();
        assert_eq!((on.kind(), on.size()), (Kind::Uint8, vec![oracle(&floats, None).len() as i64]));
        let mut bytes = vec![0u8; on.numel()];
        on.copy_data_u8(&mut bytes, on.numel());
        assert!(bytes == oracle(&floats, None));
        assert!(safetensors_image_on(&bad, None, None, Device::Cpu).unwrap_err().to_string().contains("cannot save dtype"));
    }
}
