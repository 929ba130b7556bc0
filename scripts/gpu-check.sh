#!/usr/bin/env bash
# GPU checks for rlmesh, as one prepared run on a CUDA machine (docs/gpu-check.md has the figures).
#
#   scripts/gpu-check.sh build   # here: build the binaries into target/gpu-bin (stripped, ~3.5 MB)
#   scripts/gpu-check.sh         # on the GPU machine, from the repository root, with target/gpu-bin carried
#
# What it runs, cheapest and most important first, each section under a timeout
# and all of them under GPU_CHECK_BUDGET_S (default 330 s):
#   1. environment: GPU, driver, python3's torch / transformers, the libnccl used
#   2. NCCL at world size 1 through rlmesh-comm: comm/tests/nccl_gpu.rs (all-reduce sum/mean/bf16,
#      broadcast, reduce-scatter, all-gather, barrier on device pointers; enqueue cost per call),
#      and the device weight digest (WordMix64 compiled by NVRTC) against its CPU reference,
#      timed against a device-to-device copy of the same 256 MiB
#   3. gpu_check make-models: a tiny Qwen2 and a SmolLM2-135M-shaped model with random weights
#      (SmolLM2's 538 MB of weights cannot be carried to the machine)
#   3b. gpu_check nccl-pair: two NCCL ranks on the one GPU (a host id each): results, bandwidth, a
#       stalled peer's timeout and abort, the group rebuilt, learner steps on it: float32, then
#       bf16 with float32 masters, shard = "gradients" and checkpoint_activations (3 timed steps;
#       both ranks' digests equal, each rank's optimizer state halved)
#   3c. scripts/gpu-pipeline-check.sh: launcher up deploy/dev-1gpu.toml, weights over NCCL
#   3d. gpu_check weight-sync: the weight-sync group between two processes at SmolLM2 size,
#       the host path and NCCL, parameters bit-identical after
#   4. gpu_check nccl-learner: NcclComm on libtorch CUDA tensors in one process with libtorch, and a CUDA
#      f32 learner step with the NCCL gradient all-reduce vs the same step without a communicator
#   5. gpu_check greedy-match: CUDA f32 greedy tokens == CPU f32 greedy tokens (tiny model)
#   6. gpu_check learner: learner step tokens/s on CUDA bf16 vs the PyTorch eager peer
#      (tests/oracle/loss_oracle.py bench) on the same weights and batch; 6b. launcher bench learner
#      --workload groups on CUDA bf16 (shared prefix, packed, padded, PyTorch eager)
#   7. gpu_check generate: greedy generation tokens/s, bf16 and f32, batch 1/8/32
#   8. scripts/gpu-generate-peer.py: transformers generate on the same weights/prompts, same figures
#
# The binaries' rpath names this machine's venv; on the GPU machine libtorch comes
# from python3's torch (LD_LIBRARY_PATH), and cudarc's `libnccl.so` is a link to the
# libnccl.so.2 that torch itself loads (comm/src/nccl.rs explains why it must be that one).
# Output: stdout, and under $OUT (when set, else /tmp/gpu-check): gpu-check.log and
# summary.jsonl (one JSON line per check).
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
BIN=target/gpu-bin

if [ "${1:-}" = build ]; then
  set -e
  source scripts/env.sh
  # CARGO_TARGET_DIR may point elsewhere (e.g. a shared target dir); strip replaces debug=0.
  TD="${CARGO_TARGET_DIR:-target}"
  cargo build --release -p rlmesh-actors --example gpu_check
  exe=$(cargo test --release -p rlmesh-comm --test nccl_gpu --no-run --message-format=json 2>/dev/null |
        python3 -c 'import sys,json
for l in sys.stdin:
    m=json.loads(l)
    if m.get("reason")=="compiler-artifact" and m.get("executable") and m["target"]["name"]=="nccl_gpu": print(m["executable"])' | tail -n 1)
  mkdir -p "$BIN"
  strip -o "$BIN/gpu_check" "$TD/release/examples/gpu_check"
  strip -o "$BIN/nccl_gpu" "$exe"
  cargo build --release -p launcher
  strip -o "$BIN/launcher" "$TD/release/launcher"
  # The pipeline check needs SmolLM2's tokenizer and config, not its 538 MB of weights
  # (the GPU machine cannot convert them: it has no network for the set-up's venv).
  models=$(scripts/prepare-models.sh)
  mkdir -p "$BIN/cache/models/smollm2-135m"
  (cd "$models/smollm2-135m" && cp .ready chat_template.jinja config.json generation_config.json tokenizer.json tokenizer_config.json "$OLDPWD/$BIN/cache/models/smollm2-135m/")
  ls -la "$BIN"
  exit 0
fi

OUTDIR="${OUT:-/tmp/gpu-check}"
mkdir -p "$OUTDIR"
LOG="$OUTDIR/gpu-check.log"
SUM="$OUTDIR/summary.jsonl"
: >"$LOG"
: >"$SUM"
START=$(date +%s)
DEADLINE=$((START + ${GPU_CHECK_BUDGET_S:-330}))
PY="${PYTHON:-python3}"
MODELS=/tmp/gpu-check-models
FAILED=()

say() { echo "$@" | tee -a "$LOG"; }

# section NAME SECONDS CMD...: runs CMD under min(SECONDS, time left), logs, collects {"check": lines.
section() {
  local name=$1 want=$2
  shift 2
  # GPU_CHECK_ONLY="a b": run only the sections named (a rerun of what failed).
  if [ -n "${GPU_CHECK_ONLY:-}" ] && [[ " $GPU_CHECK_ONLY " != *" $name "* ]]; then
    return
  fi
  local left=$((DEADLINE - $(date +%s) - 3))
  local t=$((want < left ? want : left))
  say ""
  say "=== $name (limit ${t}s, $(( $(date +%s) - START ))s elapsed) ==="
  if [ "$t" -lt 10 ]; then
    say "SKIPPED $name: out of time"
    echo "{\"check\": \"$name\", \"ok\": false, \"skipped\": \"out of time\"}" >>"$SUM"
    FAILED+=("$name(skipped)")
    return
  fi
  local s0=$(date +%s)
  timeout -k 5 "$t" "$@" 2>&1 | tee -a "$LOG" | tee /dev/stderr | grep '^{"check"' >>"$SUM"
  local rc=${PIPESTATUS[0]}
  say "--- $name: rc=$rc in $(( $(date +%s) - s0 ))s"
  echo "{\"section\": \"$name\", \"rc\": $rc, \"seconds\": $(( $(date +%s) - s0 ))}" >>"$SUM"
  if [ "$rc" -ne 0 ]; then
    FAILED+=("$name(rc=$rc)")
  fi
}

# --- 1. environment
TORCH_DIR=$("$PY" -c 'import torch,os;print(os.path.dirname(torch.__file__))' 2>/dev/null)
if [ -z "$TORCH_DIR" ]; then
  say "FATAL: $PY has no torch"
  exit 1
fi
SITE=$(dirname "$TORCH_DIR")
NCCL2="$SITE/nvidia/nccl/lib/libnccl.so.2"
[ -f "$NCCL2" ] || NCCL2=$(find "$SITE/nvidia" -name 'libnccl.so.2' 2>/dev/null | head -n 1)
mkdir -p /tmp/rlmesh-nccl
[ -n "$NCCL2" ] && ln -sf "$NCCL2" /tmp/rlmesh-nccl/libnccl.so
# NVRTC for the device digest's kernel: the wheel's libnvrtc.so.1x, under the
# plain name cudarc also tries; its folder too, for libnvrtc-builtins.
NVRTC=$(find "$SITE/nvidia" -name 'libnvrtc.so.1*' ! -name '*builtins*' 2>/dev/null | sort | head -n 1)
[ -n "$NVRTC" ] && ln -sf "$NVRTC" /tmp/rlmesh-nccl/libnvrtc.so
export LD_LIBRARY_PATH="/tmp/rlmesh-nccl:$TORCH_DIR/lib${NVRTC:+:$(dirname "$NVRTC")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export RUST_BACKTRACE=1 NCCL_DEBUG="${NCCL_DEBUG:-WARN}"
{
  echo "=== environment"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>&1
  "$PY" -c 'import sys,torch,transformers;print("python", sys.version.split()[0], "| torch", torch.__version__, "cuda", torch.version.cuda, "| transformers", transformers.__version__, "| gpu", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None, "| torch nccl", ".".join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else None)' 2>&1
  echo "libnccl.so -> ${NCCL2:-NOT FOUND}"
  echo "libnvrtc.so -> ${NVRTC:-NOT FOUND}"
  echo "LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
  ldd "$BIN/gpu_check" | grep -E 'not found|libtorch\.so|libnccl' || true
  nproc
} 2>&1 | tee -a "$LOG"

# --- 2. NCCL at world size 1 (the ignored test, run as its prebuilt binary)
section nccl_gpu 90 "$BIN/nccl_gpu" --ignored --nocapture --test-threads=1

# --- 3. models (random weights, made by rlmesh's Transformer::new + save)
section make-models 120 "$BIN/gpu_check" make-models "$MODELS"
TINY=$MODELS/tiny
SMOL=$MODELS/smollm2-shape

# --- 3b. two NCCL ranks on this one GPU (a host id each): results, bandwidth against a device copy,
#         a stalled peer's timeout and abort, the group rebuilt (epoch 2), learner steps on it
#         (float32, then bf16 + shard = "gradients" + checkpoint_activations)
section nccl-pair 120 "$BIN/gpu_check" nccl-pair --model "$TINY" --mib 1,16,256 --iters 5 --timeout-ms 3000

# --- 3c. the pipeline on the GPU: deploy/dev-1gpu.toml (rollout and learner processes both on GPU 0),
#         a short sync recipe from the tiny model; the run directory is checked afterwards
section dev-1gpu 150 scripts/gpu-pipeline-check.sh "$BIN/launcher" "$PY"

# --- 3d. the weight-sync group between two processes on SmolLM2-135M's shape (538 MB a version):
#         the host path (shared memory) and NCCL (GPU to GPU, loaded from the GPU); parameters equal after
section weight-sync 120 "$BIN/gpu_check" weight-sync --model "$SMOL" --versions 3 --transports ring,nccl

# --- 4. NCCL on libtorch tensors + learner step with the NCCL all-reduce
section nccl-learner 90 "$BIN/gpu_check" nccl-learner "$TINY" --dtype f32

# --- 5. CUDA greedy == CPU greedy (f32, tiny)
section greedy-match 90 "$BIN/gpu_check" greedy-match "$TINY" 64

# --- 6. learner step, CUDA bf16, vs PyTorch eager (same sizes as actors/tests/learner_bench.rs, plus a larger batch)
L=("$BIN/gpu_check" learner --device cuda --dtype bf16 --python "$PY" --script tests/oracle/loss_oracle.py --warmup 2)
section learner-tiny 90 "${L[@]}" --model "$TINY" --batch 8 --seq 64 --iters 20
section learner-smollm2-8x512 120 "${L[@]}" --model "$SMOL" --batch 8 --seq 512 --iters 10
section learner-smollm2-32x512 120 "${L[@]}" --model "$SMOL" --batch 32 --seq 512 --iters 5

# --- 6b. the grouped workload (issue 52), CUDA bf16: G = 8 rollouts of a 300-token prompt, the group's
#         prompt once (shared prefix), packed, padded, and PyTorch eager padded as TRL pads; same run
section learner-groups 240 env RLMESH_PYTHON="$PY" "$BIN/launcher" bench learner --workload groups --device cuda --models "$SMOL" --rounds 3

# --- 7. generation throughput (rlmesh), then 8. the transformers peer
G=(--models "$TINY,$SMOL" --dtypes bf16,f32 --batch 1,8,32 --new-tokens 128 --prompt-len 32 --repeats "${GEN_REPEATS:-3}")
section generate 150 "$BIN/gpu_check" generate --device cuda "${G[@]}"
section generate-peer 180 "$PY" scripts/gpu-generate-peer.py --device cuda "${G[@]}"

say ""
say "=== done in $(( $(date +%s) - START ))s; failed: ${FAILED[*]:-none}"
say "summary: $SUM"
[ ${#FAILED[@]} -eq 0 ]
