#!/usr/bin/env bash
# The device checks on a machine with an NVIDIA GPU, torch 2.11 and Python
# 3.12 but no cargo (scripts/gpu_check.py says what they are). Run from the
# repository root with the library built here by scripts/test-torch211.sh
# (target-torch211/release/). Writes one JSON file ($OUT/gpu-check.json, or
# --out FILE). About 5 minutes on one GPU (the launches check adds two
# short profiled runs to the others' 4).
#
#   scripts/gpu-check.sh                    # cuda
#   scripts/gpu-check.sh --device testdev   # a dry run on the CPU test device
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv-torch211/bin/python ] && [ -z "${PYTHON:-}" ] && PY=.venv-torch211/bin/python
exec "$PY" scripts/gpu_check.py "$@"
