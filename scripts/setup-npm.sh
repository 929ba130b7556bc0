#!/usr/bin/env bash
# Installs (once, cached) the npm packages rlmesh's tests use: the reference MCP
# server @modelcontextprotocol/server-everything (rlmesh-mcp's tests talk to it
# over stdio and Streamable HTTP).  Idempotent: a stamp records a finished
# install; a partial one is redone.  Without npm it says so and installs nothing
# (those tests then report SKIPPED).
#
# Prints the server's entry point (run it with `node`) on its last line.
set -euo pipefail

CACHE="${RLMESH_CACHE:-$HOME/.cache/rlmesh}"
PREFIX="$CACHE/npm"
VERSION="2026.8.31"
STAMP="$PREFIX/.rlmesh-server-everything-$VERSION"
ENTRY="$PREFIX/node_modules/@modelcontextprotocol/server-everything/dist/index.js"

if [ ! -f "$STAMP" ]; then
  if ! command -v npm >/dev/null 2>&1; then
    echo "[setup] npm not found: the MCP tests against server-everything will report SKIPPED" >&2
    exit 0
  fi
  echo "[setup] installing @modelcontextprotocol/server-everything@$VERSION into $PREFIX" >&2
  rm -rf "$PREFIX.tmp"
  mkdir -p "$PREFIX.tmp"
  npm install --silent --no-audit --no-fund --prefix "$PREFIX.tmp" \
    "@modelcontextprotocol/server-everything@$VERSION" >&2
  rm -rf "$PREFIX"
  mv "$PREFIX.tmp" "$PREFIX"
  touch "$STAMP"
fi
echo "$ENTRY"
