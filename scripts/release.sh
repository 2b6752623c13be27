#!/usr/bin/env bash
# The release wheel: one core for every torch minor release the wheel's own
# requirement allows (pyproject.toml: torch>=2.11,<2.16), each built against
# that release's headers and libraries, all packed into one wheel.
#
#   scripts/release.sh                  # the newest patch of each minor (from PyPI) -> dist/
#   scripts/release.sh --smoke          # then, per version, install torch and the wheel in a
#                                       # throwaway venv and dump a small job (release_smoke.sh)
#   scripts/release.sh --versions "2.13.0 2.15.0"   # these only, not PyPI's list
#   scripts/release.sh --all-patches    # every patch release in the range, not only the newest
#   scripts/release.sh --out DIR        # where the wheel goes (default dist/)
#   scripts/release.sh --cores-only     # build the cores, pack no wheel
#
# Per version, under target-cores/ (git-ignored; every step is skipped when
# its result is already there, so a second run only packs the wheel):
#   download/torch-<v>-*.whl     PyPI's wheel, downloaded (pip download --no-deps), never installed
#   torch-<v>/torch/             its include/ and lib/ unpacked (not the CUDA libraries, which no
#                                core links), with the build-version file LIBTORCH asks for
#   torch-<v>/libopdump_core.so  the core, built with LIBTORCH=torch-<v>/torch; .stamp names the
#                                sources and compiler it was built from
# The cores build one after another in one target dir of their own
# (target-cores/cargo): the reference build in target/ is never touched, and
# the Rust dependencies, which do not depend on torch, compile once.
# scripts/wheel.sh then packs them (--core FILE=VERSION) with the entry point
# of the reference build. CI (scripts/test.sh) builds the reference core only.
set -euo pipefail
cd "$(dirname "$0")/.."

out=dist
smoke=0
cores_only=0
versions=""
all_patches=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --smoke) smoke=1; shift ;;
    --cores-only) cores_only=1; shift ;;
    --versions) versions=$2; shift 2 ;;
    --all-patches) all_patches=(--all-patches); shift ;;
    -h|--help) sed -n '2,12p' "$0"; exit 0 ;;
    *) echo "release.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

py=${PYTHON:-python3}
cache="$PWD/target-cores"
mkdir -p "$cache/download"
if [ -z "$versions" ]; then
  versions=$("$py" scripts/release_versions.py "${all_patches[@]}")
fi
versions=$(echo $versions)   # one line
echo "release.sh: torch $versions" >&2

# What a core is built from: every file of the core's crates as they are now
# (committed or not; found without git, so that an exported tree works too),
# the lock file and the compilers.
fingerprint() {
  { find build.rs Cargo.toml Cargo.lock src cpp crates -type f -not -name '*.pyc' -print0 \
      | LC_ALL=C sort -z | xargs -0 sha256sum
    rustc -V; c++ --version | head -n 1
  } | sha256sum | cut -c1-16
}
sources=$(fingerprint)

cores=()
for v in $versions; do
  dir="$cache/torch-$v"
  whl=$(ls "$cache"/download/torch-"$v"-*.whl 2>/dev/null | head -n 1 || true)
  if [ -z "$whl" ]; then
    echo "release.sh: downloading torch $v (the wheel only)" >&2
    "$py" -m pip download -q --no-deps --only-binary=:all: "torch==$v" -d "$cache/download" >&2
    whl=$(ls "$cache"/download/torch-"$v"-*.whl | head -n 1)
  fi

  if [ ! -f "$dir/torch/build-version" ]; then
    echo "release.sh: unpacking $(basename "$whl")" >&2
    rm -rf "$dir/torch" "$dir/unpack"
    mkdir -p "$dir/unpack"
    unzip -q "$whl" 'torch/include/*' 'torch/lib/*' 'torch/version.py' \
      -x 'torch/lib/libtorch_cuda*' -d "$dir/unpack"
    # LIBTORCH (crates/torchfind) reads the version from build-version, as
    # an unpacked libtorch has it; the wheel keeps it in version.py.
    sed -n "s/^__version__ = '\(.*\)'$/\1/p" "$dir/unpack/torch/version.py" > "$dir/unpack/torch/build-version"
    [ -s "$dir/unpack/torch/build-version" ] || { echo "release.sh: no __version__ in $whl" >&2; exit 1; }
    mv "$dir/unpack/torch" "$dir/torch"
    rmdir "$dir/unpack"
  fi
  built=$(cat "$dir/torch/build-version")
  base=${built%%+*}
  [ "$base" = "$v" ] || { echo "release.sh: $whl says torch $built, not $v" >&2; exit 1; }

  core="$dir/libopdump_core.so"
  stamp="$sources torch-$built"
  if [ -f "$core" ] && [ "$(cat "$core.stamp" 2>/dev/null)" = "$stamp" ]; then
    echo "release.sh: core for torch $v is up to date" >&2
  else
    # The ABI flag is in no file of the wheel; the library's symbols show it
    # (counted, not grep -q: its early exit would fail the pipe under pipefail).
    abi=0
    if [ "$(nm -D --defined-only "$dir/torch/lib/libc10.so" | grep -c cxx11)" -gt 0 ]; then abi=1; fi
    echo "release.sh: building the core for torch $built (cxx11 ABI $abi)" >&2
    start=$SECONDS
    env -u OPDUMP_PYTHON LIBTORCH="$dir/torch" LIBTORCH_CXX11_ABI=$abi CARGO_TARGET_DIR="$cache/cargo" \
      nice -n 19 cargo build --release --quiet -p opdump >&2
    # Copied out: the next version builds into the same target dir.
    cp "$cache/cargo/release/libopdump_core.so" "$core.tmp"
    mv "$core.tmp" "$core"
    echo "$stamp" > "$core.stamp"
    echo "release.sh: core for torch $v built in $((SECONDS - start)) s" >&2
  fi
  cores+=(--core "$core=$v")
done

[ "$cores_only" = 0 ] || exit 0

wheel=$(scripts/wheel.sh --out "$out" "${cores[@]}")
echo "release.sh: $wheel ($(du -h "$wheel" | cut -f1))" >&2

if [ "$smoke" = 1 ]; then
  failed=()
  for v in $versions; do
    whl=$(ls "$cache"/download/torch-"$v"-*.whl | head -n 1)
    scripts/release_smoke.sh "$wheel" "$whl" || failed+=("$v")
  done
  if [ ${#failed[@]} -gt 0 ]; then
    echo "release.sh: the smoke test failed for torch ${failed[*]}" >&2
    exit 1
  fi
  echo "release.sh: smoke test passed for torch $versions" >&2
fi
echo "$wheel"
