#!/usr/bin/env bash
# The GPU landscape (docs/gpu.md): numpy and torch only, no install, about 6 minutes on one GPU.
#   scripts/gpu_landscape.sh [DIR] [OPTIONS]    results to DIR, else to $OUT; OPTIONS go to
#   `python -m autoshard.landscape.sweep` (e.g. --budget-s 300; --smoke: toy sizes on a CPU)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [[ $# -gt 0 && $1 != -* ]]; then out=$1; shift; else out=${OUT:?give a folder, or set OUT}; fi
mkdir -p "$out"
PYTHONPATH="$root/src${PYTHONPATH:+:$PYTHONPATH}" "${PYTHON:-python3}" -u -m autoshard.landscape.sweep \
    --out "$out" "$@" 2>&1 | tee "$out/log.txt"
