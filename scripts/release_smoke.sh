#!/usr/bin/env bash
# Smoke test of a release wheel against one torch, as a user installs it:
# a throwaway venv (target-cores/smoke-<version>/, removed afterwards) gets
# that torch from its downloaded wheel, with its dependencies from PyPI, and
# then the opdump wheel; scripts/release_smoke.py runs inside it.
#
#   scripts/release_smoke.sh dist/opdump-….whl target-cores/download/torch-2.13.0-….whl
#
# KEEP=1 keeps the venv (about 6 GB with torch's CUDA libraries) for a look.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { sed -n '2,9p' "$0" >&2; exit 2; }
wheel=$(realpath "$1")
torch_whl=$(realpath "$2")
v=$(basename "$torch_whl" | cut -d- -f2)
root="$PWD/target-cores/smoke-$v"

rm -rf "$root"
[ "${KEEP:-0}" = 1 ] || trap 'rm -rf "$root"' EXIT
echo "release_smoke.sh: torch $v: installing it and the wheel into $root" >&2
"${PYTHON:-python3}" -m venv "$root/venv"
"$root/venv/bin/python" -m pip install -q --disable-pip-version-check "$torch_whl" "$wheel[analysis]" >&2
# The venv's bin first: the `opdump` command the wheel installed.
PATH="$root/venv/bin:$PATH" "$root/venv/bin/python" scripts/release_smoke.py --torch "$v" --work "$root/work"
echo "release_smoke.sh: torch $v: $SECONDS s" >&2
