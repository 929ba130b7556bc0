//! `launcher plan`: the three shipped topologies as a table and as JSON, and a bad file's located error.
mod common;

use common::*;
use serde_json::Value;
use std::collections::BTreeSet;

fn plan_json(file: &str) -> Value {
    let o = launcher(&["plan", file, "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    serde_json::from_str(&stdout(&o)).expect("plan --json prints JSON")
}

/// The learner ranks of a plan, from the actors and from the processes' RLMESH_RANK.
fn learner_ranks(plan: &Value) -> (BTreeSet<u64>, BTreeSet<String>) {
    let procs = plan["processes"].as_array().unwrap();
    let actors = procs.iter().flat_map(|p| p["actors"].as_array().unwrap()).filter(|a| a["role"] == "learner").map(|a| a["rank"].as_u64().unwrap()).collect();
    let env = procs.iter().filter_map(|p| p["env"]["RLMESH_RANK"].as_str().map(str::to_string)).collect();
    (actors, env)
}

#[test]
fn plan_prints_every_shipped_topology_as_table_and_json() {
    // (file, processes, learner world size, backend, nodes)
    for (file, processes, world, backend, nodes) in
        [("deploy/local.toml", 1, 1, "cpu", 1), ("deploy/local-procs.toml", 6, 2, "cpu", 1), ("deploy/slurm-cpu3.toml", 3, 1, "cpu", 3), ("deploy/dev-2gpu.toml", 3, 1, "nccl", 1), ("deploy/dev-1gpu.toml", 3, 1, "nccl", 1), ("deploy/h100x32.toml", 35, 16, "nccl", 4)]
    {
        let plan = plan_json(file);
        assert_eq!(plan["processes"].as_array().unwrap().len(), processes, "{file}");
        assert_eq!(plan["world_size"], world, "{file}");
        assert_eq!(plan["learner_backend"], backend, "{file}");
        let (ranks, env_ranks) = learner_ranks(&plan);
        assert_eq!(ranks, (0..world).collect(), "{file}: learner ranks");
        assert_eq!(env_ranks.len() as u64, world, "{file}: one RLMESH_RANK per learner process");

        let o = launcher(&["plan", file]);
        assert_eq!(code(&o), 0, "{}", stderr(&o));
        let table = stdout(&o);
        let first = table.lines().next().unwrap();
        assert!(first.starts_with(&format!("topology {}: {nodes} node(s), {processes} process(es), learner world size {world} ({backend} backend", plan["topology"].as_str().unwrap())), "{first}");
        let actors: usize = plan["processes"].as_array().unwrap().iter().map(|p| p["actors"].as_array().unwrap().len()).sum();
        assert_eq!(table.lines().count(), 2 + actors, "{file}: summary, header, one row per actor:\n{table}");
    }
}

#[test]
fn plan_of_a_bad_file_names_file_line_and_field_and_exits_2() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(repo().join("deploy/local.toml")).unwrap().replace("ranks = 1", "ranks = 3");
    let line = text.lines().position(|l| l.starts_with("ranks = 3")).unwrap() + 1;
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, text).unwrap();
    let o = launcher(&["plan", bad.to_str().unwrap()]);
    assert_eq!(code(&o), 2);
    let err = stderr(&o);
    assert!(err.contains(&format!("bad.toml:{line}: field \"learner.ranks\"")), "{err}");
    assert!(stdout(&o).is_empty(), "nothing planned on error");

    let o = launcher(&["plan", "deploy/missing.toml"]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("deploy/missing.toml"), "{}", stderr(&o));
}

#[test]
fn a_closed_pipe_ends_the_launcher_quietly() {
    // `launcher plan … | head -c0`: the reader is gone before the first write.
    use std::os::unix::process::ExitStatusExt;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_launcher"))
        .current_dir(repo())
        .args(["plan", "deploy/h100x32.toml", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!err.contains("panicked"), "{err}");
    assert_eq!(out.status.signal(), Some(13), "ended by SIGPIPE, not {:?}", out.status);
}

#[test]
fn an_unknown_instruction_set_cap_is_refused_with_exit_2() {
    let run = |isa: &str| {
        std::process::Command::new(env!("CARGO_BIN_EXE_launcher"))
            .args(["plan", "deploy/local.toml"])
            .current_dir(repo())
            .env("RLMESH_CPU_ISA", isa)
            .output()
            .expect("run launcher")
    };
    let o = run("sse9");
    assert_eq!(code(&o), 2, "{}", stderr(&o));
    assert!(stderr(&o).contains("RLMESH_CPU_ISA=\"sse9\"") && stderr(&o).contains("avx2"), "{}", stderr(&o));
    for ok in ["avx2", "baseline", "native", ""] {
        let o = run(ok);
        assert_eq!(code(&o), 0, "{ok}: {}", stderr(&o));
    }
}

/// `plan --recipe`: the bytes every process of the 32-GPU topology holds for the 7B recipe,
/// read from a config-only model directory (no weights), and why it does not fit today.
#[test]
fn plan_with_a_recipe_sizes_each_process_from_config_json_alone() {
    let o = launcher(&["plan", "deploy/h100x32.toml", "--recipe", "configs/qwen2.5-7b-h100x32.toml"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("memory plan: deploy/models/qwen2.5-7b (7.616 B parameters); learner: 16 rank(s), shard none, float32"), "{out}");
    // float32 and unsharded: 16 bytes a parameter, the largest item AdamW's moments.
    assert!(out.contains("does not fit: ") && out.contains("n2/learner-0 needs ") && out.contains("its largest item is optimizer state (56.7 GiB)"), "{out}");

    let o = launcher(&["plan", "deploy/h100x32.toml", "--recipe", "configs/qwen2.5-7b-h100x32.toml", "--json"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let v: Value = serde_json::from_str(&stdout(&o)).unwrap();
    assert_eq!(v["plan"]["world_size"], 16);
    let m = &v["memory"];
    let p = 7_615_616_512u64;
    assert_eq!(m["parameters"], p);
    let procs = m["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 32, "every GPU process: 16 rollout, 16 learner");
    let item = |proc: &str, what: &str| {
        let p = procs.iter().find(|x| x["process"] == proc).unwrap_or_else(|| panic!("{proc}"));
        p["items"].as_array().unwrap().iter().find(|i| i["what"] == what).map(|i| i["bytes"].as_u64().unwrap())
    };
    assert_eq!(item("n2/learner-0", "weights"), Some(4 * p));
    assert_eq!(item("n2/learner-0", "gradients"), Some(4 * p));
    assert_eq!(item("n2/learner-0", "optimizer state"), Some(8 * p));
    assert_eq!(item("n2/learner-0", "weight-sync image"), Some(4 * p), "rank 0 packs the version it publishes");
    assert_eq!(item("n2/learner-1", "weight-sync image"), None);
    assert!(item("n0/rollout-0", "KV cache").unwrap() > 0 && item("n0/rollout-0", "weight-sync receive buffer") == Some(4 * p));
    for q in procs {
        assert_eq!(q["capacity"], 81_559u64 << 20, "H100-80GB");
    }

    // A tiny recipe on the same GPUs fits.
    let o = launcher(&["plan", "deploy/h100x32.toml", "--recipe", "configs/calculator-process.toml"]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    assert!(stdout(&o).contains("fits: every GPU holds its processes\n"), "{}", stdout(&o));
    // A topology whose nodes name no gpu_type is planned, and said not to be checked.
    let o = launcher(&["plan", "deploy/dev-2gpu.toml", "--recipe", "configs/calculator-process.toml"]);
    assert!(stdout(&o).contains("(not checked: no memory size known for gpu_type (no gpu_type))"), "{}", stdout(&o));
}

/// `up` refuses a run whose plan does not fit its GPUs, exit 2, naming the process and
/// its largest item, before anything is started or written.
#[test]
fn up_refuses_a_plan_that_does_not_fit_the_gpus() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    let o = launcher(&["up", "deploy/h100x32.toml", "--recipe", "configs/qwen2.5-7b-h100x32.toml", "--dry-run", "--run-dir", run.to_str().unwrap()]);
    assert_eq!(code(&o), 2, "{}", stdout(&o));
    let err = stderr(&o);
    assert!(err.contains("configs/qwen2.5-7b-h100x32.toml on deploy/h100x32.toml: the run does not fit its GPUs' memory"), "{err}");
    assert!(err.contains("n2/learner-0 needs ") && err.contains("its largest item is optimizer state"), "{err}");
    assert!(err.contains("n0/rollout-0 needs ") && err.contains("its largest item is prefill activations"), "{err}");
    assert!(!run.exists(), "nothing written");
}

/// `[learner] shard = "full"` is refused by name, not ignored.
#[test]
fn unimplemented_learner_settings_are_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(repo().join("configs/qwen2.5-7b-h100x32.toml")).unwrap();
    let bad = dir.path().join("full.toml");
    std::fs::write(&bad, text.replace("shard = \"none\"", "shard = \"full\"")).unwrap();
    let o = launcher(&["plan", "deploy/h100x32.toml", "--recipe", bad.to_str().unwrap()]);
    assert_eq!(code(&o), 2);
    assert!(stderr(&o).contains("field \"learner.shard\": \"full\" (ZeRO-3: parameters split too) is not implemented yet"), "{}", stderr(&o));
}
