#!/usr/bin/env bash
# Issue 18's comparison: the four configs/multistep-*.toml recipes (GRPO,
# SLCA-GRPO, StepTool, critic-free StepTool) for each seed, one run after the
# other on this machine, then `launcher report` over all of them.
#   scripts/compare-estimators.sh [SEED ...]      (default: 0 1 2)
# Runs go to ${RUNS:-runs/compare}/<recipe>-s<seed>; each seed's warm-up runs
# once (with its first recipe) and the other three start from it ([sft] share).
# Run it with nothing else busy: wall times are part of the comparison.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs="${RUNS:-$root/runs/compare}"
seeds=("$@")
[ ${#seeds[@]} -gt 0 ] || seeds=(0 1 2)
mkdir -p "$runs"
dirs=()
for seed in "${seeds[@]}"; do
  for r in grpo slca steptool steptool-critic-free; do
    dir="$runs/multistep-$r-s$seed"
    dirs+=("$dir")
    if [ -f "$dir/summary.json" ]; then
      echo "[compare] $dir is done; skipping it" >&2
      continue
    fi
    echo "[compare] $(date -u +%H:%M:%S) multistep-$r seed $seed → $dir" >&2
    "$root/scripts/launcher" up deploy/local.toml --recipe "configs/multistep-$r.toml" --seed "$seed" --run-dir "$dir" > "$dir.summary.json" 2> "$dir.stderr.log" \
      || { echo "[compare] multistep-$r seed $seed failed; see $dir.stderr.log" >&2; exit 1; }
  done
done
"$root/scripts/launcher" report "${dirs[@]}" --out "$runs/report"
