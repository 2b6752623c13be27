#!/usr/bin/env bash
# The demo: set-up, then a small transformer LM trained for two steps on two
# devices with opdump loaded, and opdump compare's verdict on the two dumps.
#   scripts/demo.sh [--devices cpu,testdev] [--fault "aten::gelu=scale:1.01"] [--out DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh >&2
exec "$PWD/${VENV:-.venv}/bin/python" scripts/demo.py "$@"
