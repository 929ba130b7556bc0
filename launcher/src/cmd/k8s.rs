//! `launcher k8s TOPOLOGY`: the Kubernetes manifests of a run.
//!
//! Every process of the plan becomes a pod of its own, grouped by kind into
//! one StatefulSet each (`<run>-control`, `<run>-rollout`, `<run>-learner`,
//! `<run>-reward`, …) with a headless Service of the same name, so pod
//! `<run>-rollout-3` is reached at `<run>-rollout-3.<run>-rollout.<namespace>.svc.cluster.local`.
//! The topology is rewritten onto those pods (one node per pod; a GPU process
//! gets GPUs `0..k` of its pod, requested as `nvidia.com/gpu: k`) and planned
//! again, so ranks, ports and environment come from the same `plan` as on
//! Slurm or ssh.
//!
//! - A ConfigMap `<run>-plan` holds that plan (`plan.json`) and topology
//!   (`topology.toml`). A node pod runs `launcher node --plan
//!   /etc/rlmesh/plan.json --node $(RLMESH_POD)` (its own name, from the
//!   downward API) and takes its environment from the plan; the controller pod
//!   runs `launcher up /etc/rlmesh/topology.toml --external`, which waits for
//!   the pods to join instead of starting them.
//! - A Secret `<run>-cookie` holds the run's cookie, which every pod reads as
//!   `RLMESH_COOKIE` (never on a command line).
//! - A PersistentVolumeClaim (`--volume-claim`, made by you) is mounted in
//!   every pod at `--mount`; the run directory lives there.
//!
//! The manifests are JSON documents separated by `---`: valid YAML, which
//! `kubectl apply -f` takes as it is.
use crate::error::{CliError, CliResult, UsageContext};
use clap::Args;
use rlmesh_actors::controller::plan::{plan, Plan, Process};
use rlmesh_actors::controller::topology::{Device, NodeSpec, Placement, Role, Singleton, Topology};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Where the ConfigMap is mounted in every pod.
const CONFIG_MOUNT: &str = "/etc/rlmesh";

/// Arguments of `launcher k8s`.
#[derive(Args)]
pub struct K8sArgs {
    /// Topology file (deploy/*.toml).
    deploy: PathBuf,
    /// The container image: rlmesh built, with its models (`launcher` on PATH).
    #[arg(long, value_parser = image_reference)]
    image: String,
    /// Recipe file, as a path inside the image (relative to --workdir).
    #[arg(long, default_value = "configs/calculator-process.toml")]
    recipe: String,
    /// The run's name: prefix of every object (lowercase letters, digits, '-'; default: the topology's name).
    #[arg(long)]
    name: Option<String>,
    /// Kubernetes namespace.
    #[arg(long, default_value = "default")]
    namespace: String,
    /// The PersistentVolumeClaim (ReadWriteMany) holding run directories.
    #[arg(long, default_value = "rlmesh-runs")]
    volume_claim: String,
    /// Where the claim is mounted in every pod; the run directory is MOUNT/NAME.
    #[arg(long, default_value = "/runs")]
    mount: PathBuf,
    /// The image's working directory.
    #[arg(long, default_value = "/opt/rlmesh")]
    workdir: String,
    /// Plan every GPU actor on the CPU instead.
    #[arg(long, value_parser = ["cpu"])]
    device: Option<String>,
    /// Every pod's address as the others reach it, instead of its Service DNS
    /// name (pods then share one address and get ports apart): for running the
    /// manifests' commands without a cluster, as the tests do.
    #[arg(long)]
    address: Option<String>,
    /// Write manifests.yaml, plan.json and topology.toml into this directory instead of printing the manifests.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// `--image`: a reference registries take, by the grammar of container tools
/// (distribution/reference, as `oci-spec` parses it):
/// `[HOST[:PORT]/]NAME[:TAG][@ALGORITHM:HEX]`.
fn image_reference(s: &str) -> Result<String, String> {
    oci_spec::distribution::Reference::try_from(s).map(|_| s.to_string()).map_err(|e| {
        format!(
            "not a container image reference ({e}): expected [HOST[:PORT]/]NAME[:TAG][@ALGORITHM:HEX], \
             NAME's parts lowercase letters and digits joined by '.', '_', '__' or '-', TAG up to 128 of \
             letters, digits, '_', '.' and '-' not starting with '.' or '-', e.g. registry.example/rlmesh:1"
        )
    })
}

/// A process's kind: its name without the node and a trailing `-<index>` (`n0/rollout-3` → `rollout`).
fn kind(p: &Process) -> String {
    let short = p.name.rsplit('/').next().unwrap_or(&p.name);
    let base = match short.rsplit_once('-') {
        Some((b, i)) if !b.is_empty() && i.chars().all(|c| c.is_ascii_digit()) => b,
        _ => short,
    };
    dns_label(base)
}

/// Lowercase letters, digits and '-' (a DNS-1123 label).
fn dns_label(s: &str) -> String {
    let l: String = s.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    l.trim_matches('-').to_string()
}

/// One pod of the run: its process in the original plan, its StatefulSet and name.
struct Pod {
    process: Process,
    set: String,
    name: String,
    gpus: u32,
}

/// The topology on pods: one node per process, named after its pod.
fn on_pods(t: &Topology, original: &Plan, run: &str, namespace: &str, address: Option<&str>) -> (Topology, Vec<Pod>) {
    let mut per_set: BTreeMap<String, usize> = BTreeMap::new();
    let pods: Vec<Pod> = original
        .processes
        .iter()
        .map(|p| {
            let set = format!("{run}-{}", kind(p));
            let n = per_set.entry(set.clone()).or_default();
            let pod = Pod { process: p.clone(), name: format!("{set}-{n}"), set, gpus: p.actors.iter().filter(|a| a.device != Device::Cpu).count() as u32 };
            *n += 1;
            pod
        })
        .collect();
    let mut k = t.clone();
    k.nodes = pods
        .iter()
        .map(|pod| NodeSpec {
            name: pod.name.clone(),
            host: address.map_or_else(|| format!("{}.{}.{namespace}.svc.cluster.local", pod.name, pod.set), str::to_string),
            gpus: pod.gpus,
            gpu_type: None,
            share_gpus: false,
        })
        .collect();
    let short = |p: &Process| p.name.rsplit('/').next().unwrap_or(&p.name).to_string();
    let place = |role: Role| -> Vec<Placement> {
        // One entry per actor, in the role's index order, in its own pod and process.
        let mut actors: Vec<(u32, &Pod, u32)> = Vec::new();
        for pod in &pods {
            let mut gpu = 0;
            for a in &pod.process.actors {
                let local = if a.device == Device::Cpu {
                    u32::MAX
                } else {
                    gpu += 1;
                    gpu - 1
                };
                if a.role == role {
                    actors.push((a.rank, pod, local));
                }
            }
        }
        actors.sort_by_key(|(rank, _, _)| *rank);
        actors
            .into_iter()
            .map(|(_, pod, local)| Placement {
                node: pod.name.clone(),
                gpus: if local == u32::MAX { vec![] } else { vec![local] },
                actors: (local == u32::MAX).then_some(1),
                process: Some(short(&pod.process)),
            })
            .collect()
    };
    let single = |role: Role| -> Singleton {
        let pod = pods.iter().find(|p| p.process.actors.iter().any(|a| a.role == role)).expect("the plan has it");
        Singleton { node: pod.name.clone(), process: Some(short(&pod.process)) }
    };
    k.controller = single(Role::Controller);
    k.weight_sync = single(Role::WeightSync);
    k.rollout.placement = place(Role::Rollout);
    k.reward.placement = place(Role::Reward);
    k.learner.placement = place(Role::Learner);
    (k, pods)
}

/// `launcher k8s`.
pub fn run(a: K8sArgs) -> CliResult {
    let topology = Topology::load(&a.deploy).map_err(CliError::usage)?;
    let topology = if a.device.is_some() { topology.on_cpu() } else { topology };
    let run = dns_label(a.name.as_deref().unwrap_or(&topology.name));
    if run.is_empty() || run.len() > 40 {
        return Err(CliError::usage(anyhow::anyhow!("--name {run:?}: 1 to 40 lowercase letters, digits or '-' (it prefixes every object's name)")));
    }
    let original = plan(&topology);
    let (ktopo, pods) = on_pods(&topology, &original, &run, &a.namespace, a.address.as_deref());
    ktopo.validate().map_err(|e| CliError::from(anyhow::anyhow!("the topology on pods does not validate ({}: {}); please report this", e.field, e.message)))?;
    let kplan = plan(&ktopo);
    let topo_text = toml::to_string(&ktopo).map_err(|e| CliError::from(anyhow::anyhow!("writing the pods' topology: {e}")))?;
    let plan_text = serde_json::to_string_pretty(&kplan)?;
    let cookie = rlmesh_mesh::cookie::Cookie::generate().map_err(|e| CliError::from(anyhow::anyhow!("{e}")))?.to_hex();
    let run_dir = a.mount.join(&run);
    let labels = |set: &str| json!({"app.kubernetes.io/name": "rlmesh", "app.kubernetes.io/instance": run, "rlmesh/set": set});

    let mut docs: Vec<Value> = vec![
        json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("{run}-cookie"), "namespace": a.namespace, "labels": labels("")},
               "type": "Opaque", "stringData": {"cookie": cookie}}),
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": format!("{run}-plan"), "namespace": a.namespace, "labels": labels("")},
               "data": {"plan.json": plan_text, "topology.toml": topo_text}}),
    ];
    let mut sets: Vec<&str> = pods.iter().map(|p| p.set.as_str()).collect();
    sets.dedup();
    for set in sets {
        let members: Vec<&Pod> = pods.iter().filter(|p| p.set == set).collect();
        let first = members[0];
        let planned = kplan.processes.iter().find(|p| p.node == first.name).expect("planned");
        let controller = planned.roles.contains(&Role::Controller);
        let gpus = members.iter().map(|p| p.gpus).max().unwrap_or(0);
        let command: Vec<String> = if controller {
            let mut c = vec!["launcher".to_string(), "up".into(), format!("{CONFIG_MOUNT}/topology.toml"), "--external".into(), "--recipe".into(), a.recipe.clone(), "--run-dir".into(), run_dir.display().to_string()];
            c.extend(["--metrics-addr".to_string(), format!("0.0.0.0:{}", planned.ports.metrics)]);
            c
        } else {
            vec!["launcher".into(), "node".into(), "--plan".into(), format!("{CONFIG_MOUNT}/plan.json"), "--node".into(), "$(RLMESH_POD)".into()]
        };
        let ports = json!([
            {"name": "control", "containerPort": planned.ports.control},
            {"name": "data", "containerPort": planned.ports.data},
            {"name": "metrics", "containerPort": planned.ports.metrics},
        ]);
        let mut resources = json!({});
        if gpus > 0 {
            resources = json!({"limits": {"nvidia.com/gpu": gpus}});
        }
        docs.push(json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": set, "namespace": a.namespace, "labels": labels(set)},
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": true, "selector": labels(set), "ports": ports.as_array().unwrap().iter().map(|p| json!({"name": p["name"], "port": p["containerPort"]})).collect::<Vec<_>>()}}));
        docs.push(json!({"apiVersion": "apps/v1", "kind": "StatefulSet", "metadata": {"name": set, "namespace": a.namespace, "labels": labels(set)},
            "spec": {
                "serviceName": set,
                "replicas": members.len(),
                "podManagementPolicy": "Parallel",
                "selector": {"matchLabels": labels(set)},
                "template": {
                    "metadata": {"labels": labels(set)},
                    "spec": {
                        "restartPolicy": "Always",
                        "containers": [{
                            "name": "rlmesh",
                            "image": a.image,
                            "workingDir": a.workdir,
                            "command": command,
                            "env": [
                                {"name": "RLMESH_POD", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
                                {"name": "RLMESH_COOKIE", "valueFrom": {"secretKeyRef": {"name": format!("{run}-cookie"), "key": "cookie"}}},
                                {"name": "RLMESH_JOIN_TIMEOUT_S", "value": "900"},
                            ],
                            "ports": ports,
                            "resources": resources,
                            "volumeMounts": [{"name": "plan", "mountPath": CONFIG_MOUNT, "readOnly": true}, {"name": "runs", "mountPath": a.mount.display().to_string()}],
                        }],
                        "volumes": [{"name": "plan", "configMap": {"name": format!("{run}-plan")}}, {"name": "runs", "persistentVolumeClaim": {"claimName": a.volume_claim}}],
                    }
                }
            }}));
    }
    let text: String = docs.iter().map(|d| format!("---\n{}\n", serde_json::to_string_pretty(d).expect("json"))).collect();
    match &a.out {
        None => print!("{text}"),
        Some(dir) => {
            std::fs::create_dir_all(dir).usage(format!("--out {}", dir.display()))?;
            for (f, t) in [("manifests.yaml", &text), ("plan.json", &plan_text), ("topology.toml", &topo_text)] {
                std::fs::write(dir.join(f), t).usage(format!("writing {}", dir.join(f).display()))?;
            }
            // The manifests hold the run's cookie.
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(dir.join("manifests.yaml"), std::fs::Permissions::from_mode(0o600));
            eprintln!("wrote {} objects for {} pods to {}: `kubectl apply -f {}`", docs.len(), pods.len(), dir.join("manifests.yaml").display(), dir.join("manifests.yaml").display());
        }
    }
    Ok(())
}
