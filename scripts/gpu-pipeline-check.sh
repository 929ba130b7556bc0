#!/usr/bin/env bash
# The pipeline on a GPU, as scripts/gpu-check.sh runs it: deploy/dev-1gpu.toml (the rollout
# process and the learner both on GPU 0, weights between them by NCCL broadcast), a short
# sync recipe from the tiny model, then the run directory checked: every group trained once,
# four RL steps with gradients, both actors logged on CUDA, the weight-sync group formed over
# NCCL and versions received through it. Prints one {"check": ...} line.
#
#   scripts/gpu-pipeline-check.sh LAUNCHER [PYTHON]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
LAUNCHER=$1
PY=${2:-python3}
dir=/tmp/gpu-check-run
rm -rf "$dir" && mkdir -p "$dir"
cat >"$dir/recipe.toml" <<'TOML'
reward = "process"
[tasks]
size = 64
held_out = 100
[sft]
steps = 150
batch_size = 16
tasks = 1024
[rl]
steps = 4
group_size = 4
groups_per_step = 3
max_turns = 2
max_new_tokens = 24
mode = "sync"
TOML
t0=$(date +%s)
# scripts/gpu-check.sh build carries SmolLM2's tokenizer there (the job's models directory).
[ -d target/gpu-bin/cache/models ] && export RLMESH_CACHE="$PWD/target/gpu-bin/cache"
RLMESH_ROOT="$PWD" "$LAUNCHER" up deploy/dev-1gpu.toml --recipe "$dir/recipe.toml" --run-dir "$dir/run" \
  --metrics-addr 127.0.0.1:0 --eval-limit 16 ${GPU_PIPELINE_ARGS:-} || exit $?
cat "$dir"/run/logs/*.log 2>/dev/null | grep -E 'on Cuda|CUDA|NCCL|error' | head -n 30
"$PY" - "$dir/run" "$(( $(date +%s) - t0 ))" <<'PY'
import json, re, sys, pathlib
run, secs = pathlib.Path(sys.argv[1]), float(sys.argv[2])
rows = lambda f: [json.loads(l) for l in (run / f).read_text().splitlines() if l.strip()]
trained, dispatched, dropped = {}, set(), set()
for e in rows("ledger.jsonl"):
  g = e.get("group")
  if e["event"] == "dispatch": dispatched.add(g)
  elif e["event"] == "trained": trained[g] = trained.get(g, 0) + 1
  elif e["event"] == "dropped": dropped.add(g)
once = all(n == 1 for n in trained.values()) and dispatched <= set(trained) | dropped
metrics = rows("metrics.jsonl")
logs = "".join(p.read_text(errors="replace") for p in (run / "logs").glob("*.log"))
cuda = {k: re.search(k + r".* on Cuda\(0\)", logs) is not None for k in ("rollout actor", "learner rank 0")}
# The weight-sync group formed over NCCL and a rollout process received versions through it.
nccl = {"formed": "versions over NCCL, GPU to GPU" in logs, "versions_received": len(re.findall(r"\[weights\] v\d+: [0-9.]+ MB over NCCL", logs))}
summary = json.loads((run / "summary.json").read_text()) if (run / "summary.json").exists() else {}
ok = once and len(metrics) == 4 and all(cuda.values()) and all(m.get("grad_norm", 0) > 0 for m in metrics) and nccl["formed"] and nccl["versions_received"] >= 3
print(json.dumps({"check": "dev-1gpu", "ok": ok, "seconds": secs, "exactly_once": once, "groups_trained": len(trained),
                "rl_steps": len(metrics), "on_cuda": cuda, "weights_nccl": nccl, "loss": [m.get("loss") for m in metrics],
                "held_out": {k: v for k, v in summary.items() if "held" in k or "success" in k}}))
sys.exit(0 if ok else 1)
PY
