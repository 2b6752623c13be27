"""Prints the torch releases the release wheel carries a core for, one a line:
the newest patch of every minor release that the wheel's own requirement
(pyproject.toml, `torch>=2.11,<2.16`) allows, read from PyPI's list of torch
releases. With --all-patches, every patch release in the range.

Only final releases with a Linux x86_64 wheel count: a core is built from
that wheel's headers and libraries. Standard library only (run by the system
Python before any venv exists)."""

import json
import re
import sys
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYPI = "https://pypi.org/pypi/torch/json"


def numeric(v: str) -> tuple:
    return tuple(int(p) for p in v.split("."))


def wheel_range() -> tuple:
    """(low, high) from `torch>=A.B,<C.D` in pyproject.toml: low <= v < high."""
    # A regex, not tomllib: that needs Python 3.11, the project 3.10.
    found = re.search(r'^dependencies\s*=.*?"(torch[^"]*)"', (ROOT / "pyproject.toml").read_text(), re.M)
    spec = found.group(1) if found else "(none)"
    low = re.search(r">=\s*([\d.]+)", spec)
    high = re.search(r"<\s*([\d.]+)", spec)
    if not (low and high):
        sys.exit(f"release: pyproject.toml's torch requirement {spec!r} has no >= and < bound; "
                 "give the versions with --versions")
    return numeric(low.group(1)), numeric(high.group(1))


def choose(releases: dict, low: tuple, high: tuple, all_patches: bool = False) -> list:
    """The versions of `releases` (PyPI's JSON: version -> files) to build
    cores for, sorted: final releases with low <= v < high and a Linux x86_64
    wheel not yanked; the newest patch of each minor unless all_patches."""
    chosen = {}
    for v, files in releases.items():
        if not re.fullmatch(r"\d+\.\d+\.\d+", v) or not (low <= numeric(v) < high):
            continue
        if not any("linux" in f["filename"] and "x86_64" in f["filename"] and not f.get("yanked")
                   for f in files):
            continue
        key = v if all_patches else ".".join(v.split(".")[:2])
        if key not in chosen or numeric(v) > numeric(chosen[key]):
            chosen[key] = v
    return sorted(chosen.values(), key=numeric)


def main() -> None:
    low, high = wheel_range()
    try:
        with urllib.request.urlopen(PYPI, timeout=60) as r:
            releases = json.load(r)["releases"]
    except OSError as e:
        sys.exit(f"release: cannot read the torch releases from {PYPI} ({e}); "
                 "check the network, or give the versions with --versions")
    versions = choose(releases, low, high, "--all-patches" in sys.argv[1:])
    if not versions:
        sys.exit(f"release: PyPI lists no torch release in the wheel's range {low} <= v < {high}")
    print("\n".join(versions))


if __name__ == "__main__":
    main()
