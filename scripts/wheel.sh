#!/usr/bin/env bash
# Builds the opdump wheel: the Python package (python/opdump), the plugin's
# entry point libopdump.so, one core per supported torch version
# (opdump/_lib/torch-<version>/libopdump_core.so) and the `opdump` command.
#
#   scripts/wheel.sh                    # the core for the torch of .venv (2.15.0)
#   scripts/wheel.sh --torch 2.11.0     # and one for torch 2.11.0: set up .venv-torch211 and
#                                       # build into target-torch211/ first (downloads torch)
#   scripts/wheel.sh --out DIR          # where the wheel goes (default dist/)
#   scripts/wheel.sh --core FILE=VERSION
#                                       # carry FILE as the core for VERSION, built elsewhere
#                                       # (the tests use it to make a wheel for another torch;
#                                       # scripts/release.sh, to pack one core per torch release)
#
# The cores are built by cargo (build.rs, against each torch); maturin builds
# the command and packs the wheel; auditwheel then checks the result against
# the manylinux policies and sets the platform tag. The cores link torch's
# own libc10.so and libtorch_cpu.so, which the torch dependency provides and
# which are already in the process when a core is loaded: they are excluded
# from grafting, as torchvision and torchaudio do.
set -euo pipefail
cd "$(dirname "$0")/.."

out=dist
extra_torch=()
given_cores=()
while [ $# -gt 0 ]; do
  case "$1" in
    --out) out=$2; shift 2 ;;
    --torch) extra_torch+=("$2"); shift 2 ;;
    --core) given_cores+=("$2"); shift 2 ;;
    -h|--help) sed -n '2,15p' "$0"; exit 0 ;;
    *) echo "wheel.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

scripts/setup.sh >&2
# The reference build, or the one VENV and CARGO_TARGET_DIR name (as for
# scripts/test-torch211.sh).
venv="$PWD/${VENV:-.venv}"
target="${CARGO_TARGET_DIR:-$PWD/target}/release"
py="$venv/bin/python"
export PATH="$venv/bin:$PATH"   # maturin, auditwheel, patchelf

# The cores to carry, as FILE=VERSION.
cores=()
if [ ${#given_cores[@]} -gt 0 ]; then
  cores=("${given_cores[@]}")
else
  version_of() { "$1" -c 'import torch; print(torch.__version__.split("+")[0])'; }
  cores+=("$target/libopdump_core.so=$(version_of "$py")")
  for v in "${extra_torch[@]}"; do
    tag=$(echo "$v" | cut -d. -f1,2 | tr -d .)
    echo "wheel.sh: building the core for torch $v (.venv-torch$tag, target-torch$tag)" >&2
    VENV=".venv-torch$tag" TORCH_VERSION="$v" CARGO_TARGET_DIR="$PWD/target-torch$tag" \
      TESTDEV_BUILD_DIR="$PWD/target-torch$tag/testdev" scripts/setup.sh >&2
    cores+=("$PWD/target-torch$tag/release/libopdump_core.so=$(version_of ".venv-torch$tag/bin/python")")
  done
fi

# Stage the plugin in the package: debug info stripped (the core is ~90 MB
# with it, a few without), and each core's runpath pointing at the torch
# beside it in site-packages rather than at the venv it was built in.
stage=python/opdump/_lib
rm -rf "$stage"
mkdir -p "$stage"
strip --strip-debug -o "$stage/libopdump.so" "$target/libopdump.so"
for c in "${cores[@]}"; do
  file=${c%=*}
  version=${c##*=}
  [ -f "$file" ] || { echo "wheel.sh: no core at $file" >&2; exit 1; }
  mkdir -p "$stage/torch-$version"
  strip --strip-debug -o "$stage/torch-$version/libopdump_core.so" "$file"
  patchelf --set-rpath '$ORIGIN/../../../torch/lib' "$stage/torch-$version/libopdump_core.so"
done

raw=$(mktemp -d)
trap 'rm -rf "$raw"' EXIT
# maturin builds the command in a target dir of its own: its build differs
# from the workspace build (it strips), and building in the shared one would
# replace target/release/opdump while tests or users run it.
CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$PWD/target}/maturin" \
  maturin build --release --quiet --auditwheel skip --out "$raw" >&2
mkdir -p "$out"
wheel=$(ls "$raw"/*.whl)
auditwheel repair --exclude 'libc10.so' --exclude 'libtorch_cpu.so' --exclude 'libtorch.so' \
  -w "$out" "$wheel" >&2
built=$(ls -t "$out"/opdump-*.whl | head -n 1)
echo "wheel.sh: $built" >&2
echo "wheel.sh: cores for torch $(ls "$stage" | sed -n 's/^torch-//p' | paste -sd, -)" >&2
echo "$built"
