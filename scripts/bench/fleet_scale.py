#!/usr/bin/env python3
"""The fleet scale goals of `opdump compare --rank all` and `opdump ranks`.

    nice -n 10 .venv/bin/python scripts/bench/fleet_scale.py [--dir /tmp/opdump-fleet]

(a) `compare --rank all` over 64 ranks x 200k op calls per side, against one
    rank pair's time x 64 / cores: goal <= 2x, peak RSS <= 4 GB;
(b) `opdump ranks` over 256 ranks x 100k op calls: goal <= 60 s, <= 4 GB.

The dumps are synthetic (crates/testkit/examples/synth_ranks.rs, built here
with cargo unless --no-build), written under --dir and removed at the end
(--keep keeps them). Each timing is the median of --repeats runs; peak RSS
is the child's own (GNU time), the most over the runs. Every run's answer is
checked: the planted rank must be the one named, or the figures mean
nothing. Prints markdown; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GB = 1e9

# GNU time reports the peak RSS of the process it starts. A child started
# from this Python directly would report at least this Python's own RSS
# (the kernel keeps the high-water mark of the address space it forked from).
TIME = ["/usr/bin/time", "-f", "opdump-bench-maxrss-kb=%M"]


def peak_rss(stderr: str) -> int:
    """The peak RSS in bytes that GNU time wrote last on `stderr`."""
    for line in reversed(stderr.splitlines()):
        if line.startswith("opdump-bench-maxrss-kb="):
            return int(line.split("=", 1)[1]) * 1024
    raise SystemExit(f"no peak RSS from {TIME[0]} (GNU time is needed):\n{stderr[-2000:]}")


@dataclass
class Run:
    """One child process: wall seconds, peak RSS in bytes, exit status and stdout."""

    seconds: float
    rss: int
    code: int
    stdout: str


def run(cmd: list[str]) -> Run:
    """Runs `cmd` and measures its wall time and peak RSS."""
    t = time.perf_counter()
    p = subprocess.run([*TIME, *cmd], capture_output=True, text=True)
    return Run(time.perf_counter() - t, peak_rss(p.stderr), p.returncode, p.stdout)


def repeated(cmd: list[str], repeats: int, check) -> tuple[float, int, list[float]]:
    """Median seconds, the most peak RSS, and every time, of `repeats` runs
    of `cmd`; `check` raises on a wrong answer."""
    runs = []
    for i in range(repeats):
        r = run(cmd)
        check(r)
        runs.append(r)
        log(f"  {' '.join(cmd[1:3])}... run {i + 1}: {r.seconds:.2f} s, {r.rss / 1e6:.0f} MB")
    times = [r.seconds for r in runs]
    return statistics.median(times), max(r.rss for r in runs), times


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def build() -> None:
    for args in (["--bin", "opdump", "-p", "opdump-cli"], ["-p", "opdump-testkit", "--example", "synth_ranks"]):
        subprocess.run(["cargo", "build", "--release", "--quiet", *args], cwd=ROOT, check=True)


def synth(ranks: int, calls: int, a: Path, b: Path | None) -> None:
    cmd = [str(ROOT / "target/release/examples/synth_ranks"), "--ranks", str(ranks), "--calls", str(calls),
           "--a", str(a)]
    if b is not None:
        cmd += ["--b", str(b)]
    subprocess.run(cmd, check=True)


def rows(dump: Path) -> int:
    """Tensor rows of a dump, from the Parquet footers."""
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(f).metadata.num_rows for f in dump.rglob("*.parquet"))


def expect_compare(fault_rank: int | None):
    """A check of a compare run: exit 1 and the planted rank named (or, for
    a rank pair without the fault, exit 0)."""

    def check(r: Run) -> None:
        if fault_rank is None:
            if r.code != 0:
                raise SystemExit(f"a fault-free rank pair exited {r.code}")
            return
        j = json.loads(r.stdout)
        first = j["fleet"]["first_introduced"]
        if r.code != 1 or first is None or first["ranks"] != [fault_rank]:
            raise SystemExit(f"compare --rank all: exit {r.code}, first introduced {first}; "
                             f"expected rank {fault_rank} alone")

    return check


def expect_ranks(fault_rank: int):
    def check(r: Run) -> None:
        j = json.loads(r.stdout)
        odd = (j.get("first") or {}).get("odd_ranks")
        if r.code != 1 or odd != [fault_rank]:
            raise SystemExit(f"opdump ranks: exit {r.code}, odd ranks {odd}; expected [{fault_rank}]")

    return check


def fleet_compare(opdump: str, args, cores: int) -> list[str]:
    """Goal (a); returns its markdown lines."""
    n, calls = args.compare_ranks, args.compare_calls
    a, b = args.dir / "a", args.dir / "b"
    t = time.perf_counter()
    synth(n, calls, a, b)
    log(f"(a) wrote {n} ranks x {calls} op calls per side in {time.perf_counter() - t:.0f} s")
    rows_a, rows_b = rows(a), rows(b)
    jobs = args.jobs or cores
    pair_t, pair_rss, pair_all = repeated(
        [opdump, "compare", str(a), str(b), "--rank", "0"], args.repeats, expect_compare(None)
    )
    fleet_cmd = [opdump, "compare", str(a), str(b), "--rank", "all", "--jobs", str(jobs), "--json"]
    fleet_t, fleet_rss, fleet_all = repeated(fleet_cmd, args.repeats, expect_compare(n // 2))
    one_t, one_rss, _ = repeated(fleet_cmd[:-2] + ["1", "--json"], 1, expect_compare(n // 2))
    budget = pair_t * n / jobs
    ratio = fleet_t / budget
    shutil.rmtree(a), shutil.rmtree(b)
    shown = " ".join(["opdump"] + fleet_cmd[1:])
    return [
        f"(a) `{shown}`: {n} ranks x {calls:,} op calls per side "
        f"({rows_a / 1e6:.1f} M and {rows_b / 1e6:.1f} M tensor rows), "
        f"{jobs} jobs on {cores} cores",
        "",
        "| | seconds (median) | runs | peak RSS |",
        "|---|---|---|---|",
        f"| one rank pair (`--rank 0`) | {pair_t:.2f} | {', '.join(f'{x:.2f}' for x in pair_all)} "
        f"| {pair_rss / 1e6:.0f} MB |",
        f"| `--rank all --jobs {jobs}` | {fleet_t:.1f} | {', '.join(f'{x:.1f}' for x in fleet_all)} "
        f"| {fleet_rss / 1e6:.0f} MB |",
        f"| `--rank all --jobs 1` | {one_t:.1f} | 1 | {one_rss / 1e6:.0f} MB |",
        "",
        f"Ratio to one pair x {n} / {jobs}: **{ratio:.2f}x** (goal <= 2x: {'met' if ratio <= 2 else 'MISSED'}); "
        f"peak RSS {fleet_rss / GB:.2f} GB (goal <= 4 GB: {'met' if fleet_rss <= 4 * GB else 'MISSED'}).",
    ]


def ranks_vote(opdump: str, args) -> list[str]:
    """Goal (b); returns its markdown lines."""
    n, calls = args.ranks_ranks, args.ranks_calls
    d = args.dir / "r"
    t = time.perf_counter()
    synth(n, calls, d, None)
    log(f"(b) wrote {n} ranks x {calls} op calls in {time.perf_counter() - t:.0f} s")
    total = rows(d)
    cmd = [opdump, "ranks", str(d), "--json"]
    secs, rss, all_t = repeated(cmd, args.repeats, expect_ranks(n // 2))
    shutil.rmtree(d)
    return [
        f"(b) `opdump ranks {d} --json`: {n} ranks x {calls:,} op calls ({total / 1e6:.1f} M tensor rows)",
        "",
        f"{secs:.1f} s (median of {', '.join(f'{x:.1f}' for x in all_t)}; "
        f"goal <= 60 s: {'met' if secs <= 60 else 'MISSED'}), "
        f"peak RSS {rss / 1e6:.0f} MB (goal <= 4 GB: {'met' if rss <= 4 * GB else 'MISSED'}).",
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dir", type=Path, default=Path("/tmp/opdump-fleet"),
                   help="where the dumps are written (removed first)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--jobs", type=int, default=0, help="compare --jobs (default: the cores)")
    p.add_argument("--compare-ranks", type=int, default=64)
    p.add_argument("--compare-calls", type=int, default=200_000)
    p.add_argument("--ranks-ranks", type=int, default=256)
    p.add_argument("--ranks-calls", type=int, default=100_000)
    p.add_argument("--only", choices=["compare", "ranks"], help="run one of the two")
    p.add_argument("--no-build", action="store_true")
    p.add_argument("--keep", action="store_true", help="keep --dir at the end")
    args = p.parse_args()
    if not args.no_build:
        build()
    opdump = str(ROOT / "target/release/opdump")
    cores = os.cpu_count() or 1
    if args.dir.exists():
        shutil.rmtree(args.dir)
    args.dir.mkdir(parents=True)
    lines = [f"load average at start: {', '.join(f'{x:.2f}' for x in os.getloadavg())}", ""]
    try:
        if args.only in (None, "compare"):
            lines += fleet_compare(opdump, args, cores) + [""]
        if args.only in (None, "ranks"):
            lines += ranks_vote(opdump, args)
    finally:
        if not args.keep:
            shutil.rmtree(args.dir, ignore_errors=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
