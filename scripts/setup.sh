#!/usr/bin/env bash
# One idempotent set-up for every command of the project:
#   a Python venv with the pinned torch and the test tools, then a release build
#   of libopdump.so, the preload shim, the opdump CLI and the test device.
#
#   scripts/setup.sh                 -> .venv/ with torch 2.15.0, build into target/
#   VENV=.venv-torch211 TORCH_VERSION=2.11.0 CARGO_TARGET_DIR=target-torch211 scripts/setup.sh
#
# Re-running it only redoes what is missing or out of date.
set -euo pipefail
cd "$(dirname "$0")/.."

VENV=${VENV:-.venv}
TORCH_VERSION=${TORCH_VERSION:-2.15.0}
PY=${PYTHON:-python3}

# The stamp names the torch and the requirements: a changed list installs again.
reqs=$(sha256sum scripts/requirements-test.txt | cut -c1-12)
stamp="$VENV/.opdump-setup-torch-$TORCH_VERSION-$reqs"
if [ ! -f "$stamp" ]; then
  echo "setup: creating $VENV with torch==$TORCH_VERSION (first run downloads several GB)" >&2
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
  "$VENV/bin/python" -m pip install -q --upgrade pip
  "$VENV/bin/python" -m pip install -q "torch==$TORCH_VERSION" -r scripts/requirements-test.txt
  touch "$stamp"
fi

export OPDUMP_PYTHON="$PWD/$VENV/bin/python"
if [ "${OPDUMP_SKIP_BUILD:-0}" != 1 ]; then
  cargo build --release --workspace --quiet
  "$OPDUMP_PYTHON" tests/testdev/build.py >&2
fi
