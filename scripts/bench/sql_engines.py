#!/usr/bin/env python3
"""The SQL recipes of sql/ on DuckDB and on Spark SQL (local mode), timed on
the same synthetic multi-rank dumps, next to the CLI's answer to the same
question.

    nice -n 10 .venv/bin/python scripts/bench/sql_engines.py [--ranks 8] [--calls 100000]

Needs target/release/opdump and the synth_ranks example (cargo build
--release -p opdump-cli -p opdump-testkit --bins --examples), DuckDB in
this Python, and for Spark a Python with pyspark (--spark-python, default
.venv-spark/bin/python as scripts/test-spark.sh makes it; --no-spark skips
it). Each figure is the wall time of the whole command as a user runs it
(`python sql/run_ENGINE.py RECIPE DUMP... --json`, so Spark's includes
starting its JVM), one run each; peak RSS is that of the process (for
Spark, of the Python driver, not of the JVM). Every engine's answer is
checked against the other's and the CLI's where they answer the same
question. The dumps are removed at the end. Prints markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RELEASE = ROOT / "target" / "release"
COMPARE_TOL = 1e-4

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


def timed(cmd: list[str]) -> tuple[float, int, int, str]:
    """Seconds, peak RSS (bytes), exit status and stdout of `cmd`."""
    t = time.perf_counter()
    p = subprocess.run([*TIME, *cmd], capture_output=True, text=True)
    return time.perf_counter() - t, peak_rss(p.stderr), p.returncode, p.stdout


def rows(dump: Path) -> int:
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(f).metadata.num_rows for f in dump.rglob("*.parquet"))


def recipe_cmd(python: str, engine: str, recipe: str, dumps: list[Path]) -> list[str]:
    runner = ROOT / "sql" / f"run_{engine}.py"
    # 4g: Spark's default heap (1g) runs out in the compare of 8 x 100k.
    extra = ["--master", "local[2]", "--driver-memory", "4g"] if engine == "spark" else []
    if recipe == "compare":
        # B carries rounding noise on every output (1e-9, growing along the
        # chain): the one tolerance of the recipe must pass over it.
        extra += ["--param", f"tol={COMPARE_TOL}"]
    return [python, str(runner), recipe, *map(str, dumps), "--json", *extra]


def check(recipe: str, got: dict, cli: dict, fault_rank: int) -> str:
    """What was checked of `got` against the CLI (raises on a mismatch)."""
    if recipe == "ranks_vote":
        first = got["findings"][0]
        assert first["rank"] == fault_rank and cli["first"]["odd_ranks"] == [fault_rank], (first, cli["first"])
        counts = {r["verdict"]: r["tensors"] for r in got["counts"]}
        assert counts.get("agree", 0) == cli["tensors"]["agree"] and counts.get("odd", 0) == cli["tensors"]["odd"]
        return "odd rank and counts as `opdump ranks`"
    if recipe == "compare":
        firsts = got["first_introduced"]
        assert [r["rank"] for r in firsts] == [fault_rank], firsts
        site = cli["fleet"]["first_introduced"]["site"]
        # The recipe names the top call (linear), compare the op below it.
        assert (firsts[0]["module"], firsts[0]["step"]) == (site["module"], site["step"]), (firsts, site)
        return "the faulty rank, module and step as `compare --rank all`"
    if recipe == "summary":
        calls = {}
        for r in got["per_op"]:
            calls[r["rank"]] = calls.get(r["rank"], 0) + r["calls"]
        want = {s["dump"]["rank"]: s["dump"]["op_calls"] for s in cli["ranks"]}
        assert calls == want, (calls, want)
        return "op calls per rank as `opdump summary`"
    assert got["origins"] == [], got["origins"]  # the synthetic runs hold no NaN
    return "no origin (the dumps hold no NaN or Inf)"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dir", type=Path, default=Path("/tmp/opdump-sql-bench"))
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--calls", type=int, default=100_000)
    ap.add_argument("--spark-python", default=str(ROOT / ".venv-spark" / "bin" / "python"))
    ap.add_argument("--no-spark", action="store_true")
    a = ap.parse_args()
    shutil.rmtree(a.dir, ignore_errors=True)
    da, db = a.dir / "a", a.dir / "b"
    fault_rank = a.ranks // 2
    subprocess.run([str(RELEASE / "examples" / "synth_ranks"), "--ranks", str(a.ranks), "--calls", str(a.calls),
                    "--a", str(da), "--b", str(db), "--fault-rank", str(fault_rank)], check=True)
    opdump = str(RELEASE / "opdump")
    cli = {
        "summary": [opdump, "summary", str(da), "--json"],
        "nonfinite_origins": [opdump, "summary", str(da), "--json"],
        "ranks_vote": [opdump, "ranks", str(da), "--json"],
        "compare": [opdump, "compare", str(da), str(db), "--rank", "all", "--json"],
    }
    engines = [("duckdb", sys.executable)] + ([] if a.no_spark else [("spark", a.spark_python)])
    lines = [f"{a.ranks} ranks x {a.calls:,} op calls: A {rows(da) / 1e6:.2f} M tensor rows, B {rows(db) / 1e6:.2f} M; "
             f"load average at start {', '.join(f'{x:.1f}' for x in os.getloadavg())}", "",
             "| recipe | dumps | " + " | ".join(e for e, _ in engines) + " | CLI | checked |",
             "|---|---|" + "---|" * len(engines) + "---|---|"]
    try:
        for recipe, cmd in cli.items():
            dumps = [da, db] if recipe == "compare" else [da]
            secs, rss, code, out = timed(cmd)
            want = json.loads(out)
            cells, what = [], ""
            for engine, python in engines:
                s, r, c, o = timed(recipe_cmd(python, engine, recipe, dumps))
                if c != 0:
                    raise SystemExit(f"{engine} {recipe}: exit {c}")
                what = check(recipe, json.loads(o), want, fault_rank)
                cells.append(f"{s:.1f} s, {r / 1e6:.0f} MB" if engine == "duckdb" else f"{s:.1f} s")
                print(f"{recipe} {engine}: {s:.1f} s", file=sys.stderr, flush=True)
            lines.append(f"| `{recipe}` | {'A, B' if recipe == 'compare' else 'A'} | {' | '.join(cells)} | "
                         f"`{' '.join(['opdump'] + cmd[1:2])}` {secs:.1f} s, {rss / 1e6:.0f} MB | {what} |")
    finally:
        shutil.rmtree(a.dir, ignore_errors=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
