#!/usr/bin/env bash
# The benchmark: set-up (venv + release build), then every configuration side
# by side, printed as markdown tables of medians and ratios.
#   scripts/bench/run.sh [--quick] [--out FILE] [run.py options; --help lists them]
set -euo pipefail
cd "$(dirname "$0")/../.."
scripts/setup.sh >&2
exec "$PWD/${VENV:-.venv}/bin/python" scripts/bench/run.py "$@"
