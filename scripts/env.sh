# Source this (or let scripts/test and scripts/launcher do it): the environment
# that builds rlmesh against the cached PyTorch 2.11 (tch 0.24, LIBTORCH_USE_PYTORCH=1).
_rlmesh_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RLMESH_VENV="$("$_rlmesh_root/scripts/setup-python.sh" | tail -n 1)"
export RLMESH_VENV
export LIBTORCH_USE_PYTORCH=1
export PYTHON_SYS_EXECUTABLE="$RLMESH_VENV/bin/python"
export RLMESH_PYTHON="$RLMESH_VENV/bin/python"
# NCCL for cudarc's dynamic loading (the wheel's libnccl.so.2 plus the link setup-python made).
_nccl="$("$RLMESH_VENV/bin/python" -c 'import importlib.util,os;s=importlib.util.find_spec("nvidia.nccl");print(os.path.join(list(s.submodule_search_locations)[0],"lib") if s else "")' 2>/dev/null)"
[ -n "$_nccl" ] && export RLMESH_NCCL_LIB_DIR="$_nccl"
# @modelcontextprotocol/server-everything for rlmesh-mcp's tests: installed from npm into
# the cache once, when missing (scripts/setup-npm.sh); without npm those tests say SKIPPED.
_everything="${RLMESH_CACHE:-$HOME/.cache/rlmesh}/npm/node_modules/@modelcontextprotocol/server-everything/dist/index.js"
[ -f "$_everything" ] || _everything="$("$_rlmesh_root/scripts/setup-npm.sh" | tail -n 1)" || _everything=""
[ -n "$_everything" ] && [ -f "$_everything" ] && export RLMESH_MCP_EVERYTHING="$_everything"
unset _nccl _rlmesh_root _everything
# torch-sys runs `python` (with VIRTUAL_ENV set) to find libtorch: put the venv first.
export VIRTUAL_ENV="$RLMESH_VENV"
case ":$PATH:" in *":$RLMESH_VENV/bin:"*) ;; *) export PATH="$RLMESH_VENV/bin:$PATH" ;; esac
