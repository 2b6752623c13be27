#!/usr/bin/env bash
# Builds and tests opdump against torch 2.11.0, in a second venv and target
# directory so that the reference build (.venv, target/) is untouched. The
# library built here (target-torch211/release/) is also the one to carry to a
# machine that has torch 2.11.0 but no cargo.
set -euo pipefail
cd "$(dirname "$0")/.."
export VENV=.venv-torch211 TORCH_VERSION=2.11.0
export CARGO_TARGET_DIR="$PWD/target-torch211" TESTDEV_BUILD_DIR="$PWD/target-torch211/testdev"
exec scripts/test.sh "$@"
