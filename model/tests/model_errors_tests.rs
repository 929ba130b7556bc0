//! Bad input to the model gets a clear error that names the problem, never a panic.
use rlmesh_model::{ModelConfig, ModelError, SamplingParams, Transformer};
use serde_json::json;
use std::path::Path;
use tch::{Device, Kind};

fn config() -> serde_json::Value {
    json!({"architectures": ["LlamaForCausalLM"], "vocab_size": 50, "hidden_size": 16, "intermediate_size": 24,
           "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1, "rms_norm_eps": 1e-6,
           "max_position_embeddings": 64, "tie_word_embeddings": false, "dtype": "float32"})
}

fn saved(dir: &Path) -> std::path::PathBuf {
    let cfg = ModelConfig::from_json(config(), Path::new("config.json")).unwrap();
    let m = Transformer::new(cfg, Device::Cpu, Kind::Float);
    let out = dir.join("m");
    m.save(&out, None).unwrap();
    out
}

fn set_config(dir: &Path, v: serde_json::Value) {
    std::fs::write(dir.join("config.json"), v.to_string()).unwrap();
}

#[test]
fn missing_files_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let err = Transformer::load(dir.path(), Device::Cpu, None).err().unwrap();
    assert!(matches!(err, ModelError::MissingFile { .. }) && err.to_string().contains("config.json"), "{err}");
    let m = saved(dir.path());
    std::fs::remove_file(m.join("model.safetensors")).unwrap();
    let err = Transformer::load(&m, Device::Cpu, None).err().unwrap();
    assert!(err.to_string().contains("model.safetensors"), "{err}");
    let err = rlmesh_model::Tokenizer::load(&m).err().unwrap();
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
}

#[test]
fn unknown_architecture_and_bad_json_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let m = saved(dir.path());
    let mut c = config();
    c["architectures"] = json!(["MambaForCausalLM"]);
    set_config(&m, c);
    let err = Transformer::load(&m, Device::Cpu, None).err().unwrap();
    assert!(err.to_string().contains("MambaForCausalLM") && err.to_string().contains("LlamaForCausalLM"), "{err}");
    std::fs::write(m.join("config.json"), "{not json").unwrap();
    let err = Transformer::load(&m, Device::Cpu, None).err().unwrap();
    assert!(err.to_string().contains("not valid JSON"), "{err}");
    let mut c = config();
    c.as_object_mut().unwrap().remove("hidden_size");
    set_config(&m, c);
    let err = Transformer::load(&m, Device::Cpu, None).err().unwrap();
    assert!(err.to_string().contains("\"hidden_size\": missing"), "{err}");
}

#[test]
fn a_config_that_lies_about_shapes_names_the_tensor() {
    let dir = tempfile::tempdir().unwrap();
    let m = saved(dir.path());
    let mut c = config();
    c["intermediate_size"] = json!(32);
    set_config(&m, c);
    let err = Transformer::load(&m, Device::Cpu, None).err().unwrap();
    let text = err.to_string();
    assert!(matches!(err, ModelError::BadTensor { .. }) && text.contains("model.layers.0.mlp.down_proj.weight: shape [16, 24] in the file, [16, 32] from config.json"), "{text}");
    // More layers than the file holds: the missing tensors are listed.
    let mut c = config();
    c["num_hidden_layers"] = json!(2);
    set_config(&m, c);
    let err = Transformer::load(&m, Device::Cpu, None).err().unwrap();
    assert!(matches!(err, ModelError::MissingTensors { .. }) && err.to_string().contains("model.layers.1."), "{err}");
}

#[test]
fn wrong_dtypes_are_errors() {
    let dir = tempfile::tempdir().unwrap();
    let m = saved(dir.path());
    let mut c = config();
    c["dtype"] = json!("int8");
    set_config(&m, c);
    let err = Transformer::load(&m, Device::Cpu, None).err().unwrap();
    assert!(err.to_string().contains("int8"), "{err}");
    // Integer tensors in the weights file.
    set_config(&m, config());
    let cfg = ModelConfig::from_json(config(), Path::new("config.json")).unwrap();
    let model = Transformer::new(cfg, Device::Cpu, Kind::Float);
    let tensors: Vec<(String, tch::Tensor)> = model.vs.variables().into_iter().map(|(n, t)| (n, t.to_kind(Kind::Int64))).collect();
    rlmesh_model::io::write_safetensors(&m.join("model.safetensors"), &tensors).unwrap();
    let err = Transformer::load(&m, Device::Cpu, None).err().unwrap();
    assert!(err.to_string().contains("not a floating-point type"), "{err}");
}

#[test]
fn bad_prompts_are_errors() {
    let cfg = ModelConfig::from_json(config(), Path::new("config.json")).unwrap();
    let m = Transformer::new(cfg, Device::Cpu, Kind::Float);
    let p = SamplingParams { max_new_tokens: 4, temperature: 0.0, ..Default::default() };
    let err = m.generate(&[vec![]], &p, None).err().unwrap();
    assert!(err.to_string().contains("prompt 0 is empty"), "{err}");
    let err = m.generate(&[vec![1, 2, 50]], &p, None).err().unwrap();
    assert!(err.to_string().contains("token id 50 is out of range (vocab_size 50)"), "{err}");
    let err = m.score(&[vec![3, 4], vec![]]).err().unwrap();
    assert!(err.to_string().contains("sequence 1 is empty"), "{err}");
    let err = m.generate(&[vec![1; 64]], &p, None).err().unwrap();
    assert!(err.to_string().contains("does not fit the context"), "{err}");
    let err = m.generate(&[vec![1]], &SamplingParams { top_p: 0.0, ..p.clone() }, None).err().unwrap();
    assert!(err.to_string().contains("bad sampling parameters"), "{err}");
    // Sharded index naming a missing shard.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("s");
    m.save(&out, None).unwrap();
    std::fs::remove_file(out.join("model.safetensors")).unwrap();
    std::fs::write(out.join("model.safetensors.index.json"), json!({"weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}}).to_string()).unwrap();
    let err = Transformer::load(&out, Device::Cpu, None).err().unwrap();
    assert!(err.to_string().contains("model-00001-of-00002.safetensors"), "{err}");
}
