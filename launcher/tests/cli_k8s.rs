//! `launcher k8s`: the manifests are checked against the topology, and then
//! run without a cluster: each pod's container command and environment, as
//! the manifests give them, start as local processes (what a kubelet would
//! do), the ConfigMap's files standing in for its mount. There is no
//! Kubernetes API server here, and `kubectl apply --dry-run=client` needs one
//! for discovery, so the API server's own validation is not run.
mod common;

use common::*;
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// The documents of a manifests file (JSON documents separated by `---`, which is YAML).
fn docs(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path).unwrap().split("---\n").filter(|d| !d.trim().is_empty()).map(|d| serde_json::from_str(d).unwrap()).collect()
}

fn of_kind<'a>(docs: &'a [Value], kind: &str) -> Vec<&'a Value> {
    docs.iter().filter(|d| d["kind"] == kind).collect()
}

#[test]
fn h100x32_manifests_place_every_process_in_a_pod_with_its_gpus_and_the_plans_environment() {
    let tmp = tempfile::tempdir().unwrap();
    let out = launcher(&["k8s", "deploy/h100x32.toml", "--image", "registry.example/rlmesh:1", "--namespace", "rl", "--out", tmp.path().to_str().unwrap()]);
    assert_eq!(code(&out), 0, "{}", stderr(&out));
    let d = docs(&tmp.path().join("manifests.yaml"));
    let sets = of_kind(&d, "StatefulSet");
    let replicas: BTreeMap<&str, u64> = sets.iter().map(|s| (s["metadata"]["name"].as_str().unwrap(), s["spec"]["replicas"].as_u64().unwrap())).collect();
    assert_eq!(replicas, BTreeMap::from([("h100x32-control", 1), ("h100x32-learner", 16), ("h100x32-reward", 2), ("h100x32-rollout", 16)]));
    // A headless Service per StatefulSet, for stable pod names.
    let services: Vec<&str> = of_kind(&d, "Service").iter().filter(|s| s["spec"]["clusterIP"] == "None").map(|s| s["metadata"]["name"].as_str().unwrap()).collect();
    assert_eq!(services.len(), 4);
    for s in &sets {
        let name = s["metadata"]["name"].as_str().unwrap();
        assert!(services.contains(&name) && s["spec"]["serviceName"] == name);
        let c = &s["spec"]["template"]["spec"]["containers"][0];
        let gpus = c["resources"]["limits"]["nvidia.com/gpu"].as_u64().unwrap_or(0);
        assert_eq!(gpus, u64::from(name.ends_with("rollout") || name.ends_with("learner")), "{name}");
        // The cookie only through the Secret; the run directory on the shared claim.
        let env = c["env"].as_array().unwrap();
        assert!(env.iter().any(|e| e["name"] == "RLMESH_COOKIE" && e["valueFrom"]["secretKeyRef"]["name"] == "h100x32-cookie"));
        assert!(!c["command"].to_string().contains("cookie"));
        let vols = s["spec"]["template"]["spec"]["volumes"].to_string();
        assert!(vols.contains("rlmesh-runs") && vols.contains("h100x32-plan"), "{vols}");
    }
    // The plan in the ConfigMap: every process on its own pod, reached by its Service DNS name.
    let cm = of_kind(&d, "ConfigMap")[0];
    let plan: Value = serde_json::from_str(cm["data"]["plan.json"].as_str().unwrap()).unwrap();
    let procs = plan["processes"].as_array().unwrap();
    assert_eq!(procs.len(), 35);
    assert_eq!(plan["world_size"], 16);
    for p in procs {
        let node = p["node"].as_str().unwrap();
        let set = node.rsplit_once('-').unwrap().0;
        assert_eq!(p["host"].as_str().unwrap(), format!("{node}.{set}.rl.svc.cluster.local"));
        let gpu = p["roles"].as_array().unwrap().iter().any(|r| r == "rollout" || r == "learner");
        assert_eq!(p["env"]["CUDA_VISIBLE_DEVICES"], if gpu { "0" } else { "" }, "{node}");
        assert_eq!(p["env"]["RLMESH_CONTROLLER_ADDR"], "h100x32-control-0.h100x32-control.rl.svc.cluster.local:29500");
    }
    let ranks: Vec<u64> = procs.iter().filter_map(|p| p["env"]["RLMESH_RANK"].as_str()).map(|r| r.parse().unwrap()).collect();
    assert_eq!(ranks, (0..16).collect::<Vec<_>>());
    // The topology in the ConfigMap is the one `up --external` reads, and it plans the same.
    std::fs::write(tmp.path().join("t.toml"), cm["data"]["topology.toml"].as_str().unwrap()).unwrap();
    let again: Value = serde_json::from_str(&stdout(&launcher(&["plan", tmp.path().join("t.toml").to_str().unwrap(), "--json"]))).unwrap();
    assert_eq!(again["processes"].as_array().unwrap().iter().map(|p| &p["env"]).collect::<Vec<_>>(), procs.iter().map(|p| &p["env"]).collect::<Vec<_>>());
}

/// `--image` takes what registries take (distribution/reference's grammar);
/// anything else is refused with exit 2 before a manifest is written.
#[test]
fn a_malformed_image_reference_is_refused_and_writes_no_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    let digest = format!("sha256:{}", "0123456789abcdef".repeat(4));
    let k8s = |image: &str, out: &Path| launcher(&["k8s", "deploy/local-procs.toml", "--image", image, "--out", out.to_str().unwrap()]);
    let long_tag = format!("rlmesh:{}", "t".repeat(129));
    for bad in ["bad image name!", "Rlmesh:1", "registry.example/Team/rlmesh", "rlmesh:", "rlmesh:-rc1", "rlmesh@sha256:abc", "/rlmesh", "rlmesh//x", "rlmesh_:1", "", long_tag.as_str()] {
        let out = tmp.path().join("bad");
        let o = k8s(bad, &out);
        assert_eq!(code(&o), 2, "{bad:?} was taken: {}", stderr(&o));
        assert!(stderr(&o).contains("--image") && stderr(&o).contains("not a container image reference"), "{bad:?}: {}", stderr(&o));
        assert!(!out.exists(), "{bad:?}: manifests written");
    }
    let with_digest = format!("ghcr.io/org/app@{digest}");
    let tag_and_digest = format!("registry.example/rlmesh:1@{digest}");
    for (i, good) in ["unused", "registry.example/rlmesh:1", "localhost:5000/team/rl-mesh_x__y.z:v1.2-RC_3", "Registry.Example:443/a/b/c", with_digest.as_str(), tag_and_digest.as_str()].iter().enumerate() {
        let out = tmp.path().join(format!("good-{i}"));
        let o = k8s(good, &out);
        assert_eq!(code(&o), 0, "{good:?}: {}", stderr(&o));
        assert!(std::fs::read_to_string(out.join("manifests.yaml")).unwrap().contains(&format!("\"image\": \"{good}\"")), "{good:?}");
    }
}

/// Kills the pods' processes when dropped (a failing test leaves nothing).
struct Pods(Vec<(String, Child)>);
impl Drop for Pods {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

#[test]
fn the_manifests_commands_run_the_job_like_a_kubelet_would() {
    let tmp = tempfile::tempdir().unwrap();
    let topo = shipped_on_free_ports("local-procs", tmp.path());
    let recipe = tmp.path().join("k8s-test.toml");
    std::fs::write(&recipe, "reward = \"process\"\n[tasks]\nsize = 64\nheld_out = 100\n[sft]\nsteps = 40\nbatch_size = 8\ntasks = 512\n[rl]\nsteps = 3\ngroup_size = 4\ngroups_per_step = 2\nmax_turns = 2\nmax_new_tokens = 24\n").unwrap();
    let out_dir = tmp.path().join("k8s");
    let mount = tmp.path().join("runs");
    let o = launcher(&[
        "k8s", topo.to_str().unwrap(), "--image", "unused", "--name", "kt", "--recipe", recipe.to_str().unwrap(),
        "--address", "127.0.0.1", "--mount", mount.to_str().unwrap(), "--out", out_dir.to_str().unwrap(),
    ]);
    assert_eq!(code(&o), 0, "{}", stderr(&o));
    let d = docs(&out_dir.join("manifests.yaml"));
    // The ConfigMap's files, where a pod would mount them.
    let cm = of_kind(&d, "ConfigMap")[0];
    let etc = tmp.path().join("etc-rlmesh");
    std::fs::create_dir_all(&etc).unwrap();
    for (k, v) in cm["data"].as_object().unwrap() {
        std::fs::write(etc.join(k), v.as_str().unwrap()).unwrap();
    }
    let cookie = of_kind(&d, "Secret")[0]["stringData"]["cookie"].as_str().unwrap().to_string();
    std::fs::create_dir_all(&mount).unwrap();

    // Start every replica of every StatefulSet from its container spec.
    let mut pods = Pods(Vec::new());
    for s in of_kind(&d, "StatefulSet") {
        let set = s["metadata"]["name"].as_str().unwrap();
        let c = &s["spec"]["template"]["spec"]["containers"][0];
        for i in 0..s["spec"]["replicas"].as_u64().unwrap() {
            let pod = format!("{set}-{i}");
            let words: Vec<String> = c["command"]
                .as_array()
                .unwrap()
                .iter()
                .map(|w| w.as_str().unwrap().replace("/etc/rlmesh", etc.to_str().unwrap()).replace("$(RLMESH_POD)", &pod))
                .collect();
            assert_eq!(words[0], "launcher");
            let mut cmd = Command::new(env!("CARGO_BIN_EXE_launcher"));
            cmd.args(&words[1..]).current_dir(repo()).env_remove("RLMESH_COOKIE_FILE");
            for e in c["env"].as_array().unwrap() {
                let name = e["name"].as_str().unwrap();
                let value = match (&e["value"], &e["valueFrom"]) {
                    (Value::String(v), _) => v.clone(),
                    (_, f) if f["fieldRef"]["fieldPath"] == "metadata.name" => pod.clone(),
                    (_, f) if f["secretKeyRef"]["key"] == "cookie" => cookie.clone(),
                    other => panic!("an env entry this test cannot fill: {other:?}"),
                };
                cmd.env(name, value);
            }
            cmd.stdout(std::fs::File::create(tmp.path().join(format!("{pod}.log"))).unwrap());
            cmd.stderr(std::fs::File::create(tmp.path().join(format!("{pod}.err"))).unwrap());
            pods.0.push((pod, cmd.spawn().unwrap()));
        }
    }
    assert_eq!(pods.0.len(), 6);
    // The controller pod's `up --external` finishes the run; every other pod leaves with it.
    let t0 = Instant::now();
    let logs = |pods: &Pods| pods.0.iter().map(|(p, _)| format!("== {p}\n{}", std::fs::read_to_string(tmp.path().join(format!("{p}.err"))).unwrap_or_default())).collect::<Vec<_>>().join("\n");
    loop {
        let mut all = true;
        for (pod, c) in &mut pods.0 {
            match c.try_wait().unwrap() {
                Some(st) => assert!(st.success(), "{pod} failed: {st}\n{}", std::fs::read_to_string(tmp.path().join(format!("{pod}.err"))).unwrap_or_default()),
                None => all = false,
            }
        }
        if all {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(600), "pods still running:\n{}", logs(&pods));
        std::thread::sleep(Duration::from_millis(200));
    }
    let run = mount.join("kt");
    let (trained, dispatched) = ledger_counts(&run);
    assert!(!trained.is_empty() && trained.len() <= dispatched && trained.values().all(|&n| n == 1), "{trained:?} of {dispatched}");
    let summary: Value = serde_json::from_str(&std::fs::read_to_string(run.join("summary.json")).unwrap()).unwrap();
    assert_eq!(summary["steps"], 3);
    let controller_log = std::fs::read_to_string(tmp.path().join("kt-control-0.err")).unwrap();
    assert!(controller_log.contains("externally started processes to join"), "{controller_log}");
}
