#!/usr/bin/env python3
"""Build the testdev backend: tests/testdev/build/libtestdev.so.

    .venv/bin/python tests/testdev/build.py [--force] [--verbose]

Compiles with g++ (or $CXX) directly against the torch of the running Python:
no ninja, no setuptools, no network. Idempotent: nothing is compiled when the
library is newer than every source and its stamp records the same torch
(version and install path) and the same compiler command. Safe to run from
several processes at once (a file lock serialises them; the library is
replaced atomically).
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
# TESTDEV_BUILD_DIR keeps builds for different torch versions apart.
BUILD_DIR = Path(os.environ.get("TESTDEV_BUILD_DIR", HERE / "build"))
LIBRARY = BUILD_DIR / "libtestdev.so"
STAMP = BUILD_DIR / "libtestdev.stamp.json"
SOURCES = [HERE / "testdev.cpp", HERE / "faults.cpp", HERE / "direct.cpp", HERE / "counters.cpp",
           HERE / "fused_stats.cpp", HERE / "autocast.cpp"]
HEADERS = [HERE / "faults.h", HERE / "direct.h", HERE / "counters.h", HERE / "device.h", HERE / "fused_stats.h",
           HERE / "autocast.h"]
# The batch kernel's fingerprint and sketch take their constants from opdump's header.
HEADERS.append(HERE.parent.parent / "cpp" / "signature" / "signature.h")


class BuildError(RuntimeError):
    """The compiler or the linker failed; the message holds their output."""


def _torch_paths():
    import torch

    torch_dir = Path(torch.__file__).resolve().parent
    try:
        from torch.utils.cpp_extension import include_paths, library_paths

        includes = [str(p) for p in include_paths()]
        libs = [str(p) for p in library_paths()]
    except Exception:  # cpp_extension wants setuptools; fall back to the layout
        includes = [str(torch_dir / "include"), str(torch_dir / "include/torch/csrc/api/include")]
        libs = [str(torch_dir / "lib")]
    # library_paths() may add CUDA's lib folder; a CPU build needs torch/lib only.
    libs = [p for p in libs if Path(p, "libtorch_cpu.so").exists()] or [str(torch_dir / "lib")]
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    return torch, torch_dir, includes, libs, abi


def _commands(obj_dir: Path, out: Path):
    torch, torch_dir, includes, libs, abi = _torch_paths()
    cxx = shlex.split(os.environ.get("CXX", "g++"))
    cflags = [
        "-std=c++20",  # torch >= 2.12 headers require it; older ones accept it
        "-O2",
        "-fPIC",
        "-fvisibility=hidden",
        "-Wall",
        "-Wno-unused-parameter",
        f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
    ]
    for inc in includes:
        cflags += ["-isystem", inc]
    compiles = []
    objects = []
    for src in SOURCES:
        obj = obj_dir / (src.stem + ".o")
        objects.append(obj)
        compiles.append(cxx + cflags + ["-c", str(src), "-o", str(obj)])
    link = cxx + ["-shared", "-o", str(out)] + [str(o) for o in objects]
    for lib in libs:
        link += [f"-L{lib}", f"-Wl,-rpath,{lib}"]
    link += ["-lc10", "-ltorch_cpu"]
    stamp = {
        "torch_version": torch.__version__,
        "torch_dir": str(torch_dir),
        # The command names the temporary folder; keep only what matters.
        "cxx": cxx,
        "cflags": cflags,
        "libs": libs,
    }
    return compiles, link, stamp


def _up_to_date(stamp: dict) -> bool:
    if not LIBRARY.exists() or not STAMP.exists():
        return False
    try:
        if json.loads(STAMP.read_text()) != stamp:
            return False
    except (OSError, ValueError):
        return False
    built = LIBRARY.stat().st_mtime
    return all(p.stat().st_mtime < built for p in SOURCES + HEADERS + [Path(__file__)])


@contextlib.contextmanager
def locked():
    """Holds the build lock: no other process replaces the library meanwhile
    (load() builds and loads under it, so it never loads a library that a
    process with another torch is rebuilding)."""
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    with open(BUILD_DIR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def build(force: bool = False, verbose: bool = False, *, lock: bool = True) -> Path:
    """Builds libtestdev.so if needed and returns its path.

    lock=False: the caller already holds locked()."""
    with locked() if lock else contextlib.nullcontext():
        with tempfile.TemporaryDirectory(dir=BUILD_DIR, prefix=".tmp-") as tmp:
            tmp = Path(tmp)
            staged = tmp / LIBRARY.name
            compiles, link, stamp = _commands(tmp, staged)
            if not force and _up_to_date(stamp):
                if verbose:
                    print(f"testdev: {LIBRARY} is up to date", file=sys.stderr)
                return LIBRARY
            print(f"testdev: building {LIBRARY} for torch {stamp['torch_version']}", file=sys.stderr)
            start = time.monotonic()
            # One compiler per source, in parallel (each needs ~1 GB of memory).
            procs = []
            for cmd in compiles:
                if verbose:
                    print(shlex.join(cmd), file=sys.stderr)
                procs.append((cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)))
            failed = []
            for cmd, proc in procs:
                out, _ = proc.communicate()
                if proc.returncode != 0:
                    failed.append((cmd, out.decode(errors="replace")))
                elif out.strip():
                    sys.stderr.write(out.decode(errors="replace"))
            if failed:
                raise BuildError(
                    "\n".join(f"testdev: compile failed: {shlex.join(cmd)}\n{out}" for cmd, out in failed)
                )
            if verbose:
                print(shlex.join(link), file=sys.stderr)
            res = subprocess.run(link, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            if res.returncode != 0:
                raise BuildError(f"testdev: link failed: {shlex.join(link)}\n{res.stdout.decode(errors='replace')}")
            os.replace(staged, LIBRARY)  # atomic: a loader never sees half a file
            STAMP.write_text(json.dumps(stamp, indent=1) + "\n")
            print(f"testdev: built in {time.monotonic() - start:.0f} s", file=sys.stderr)
    return LIBRARY


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--force", action="store_true", help="rebuild even if up to date")
    ap.add_argument("-v", "--verbose", action="store_true", help="print the compiler commands")
    args = ap.parse_args()
    try:
        build(force=args.force, verbose=args.verbose)
    except BuildError as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
