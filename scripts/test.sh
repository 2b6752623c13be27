#!/usr/bin/env bash
# The test command: set-up (venv with the pinned torch), the Python lint,
# the release build, then formatting and lints, the Rust tests of every
# crate, and the Python tests against the built library.
#
#   scripts/test.sh               # everything
#   scripts/test.sh -k seed       # extra arguments go to pytest
#   PYTEST_WORKERS=0 scripts/test.sh   # the Python tests one at a time, in one process
set -euo pipefail
cd "$(dirname "$0")/.."
# The venv first, and the Python lint on it: a finding fails before the build.
OPDUMP_SKIP_BUILD=1 scripts/setup.sh
export OPDUMP_PYTHON="$PWD/${VENV:-.venv}/bin/python"

echo "== ruff check (all Python of the repository)" >&2
"$OPDUMP_PYTHON" -m ruff check --quiet .

scripts/setup.sh

echo "== cargo fmt --check, cargo clippy -D warnings" >&2
cargo fmt --all -- --check
cargo clippy --release --workspace --all-targets --quiet -- -D warnings

echo "== cargo test (engine, format, cli, preload)" >&2
cargo test --release --workspace --quiet

# Every test runs its jobs in subprocesses: two workers keep both cores busy
# (a test file stays on one worker, so its module fixtures are made once).
echo "== pytest" >&2
"$OPDUMP_PYTHON" -m pytest tests -q -p no:cacheprovider -n "${PYTEST_WORKERS:-auto}" --dist loadfile "$@"
