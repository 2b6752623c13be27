"""The smoke test of a release wheel against one torch, run by the Python of
a venv that has that torch and the wheel installed (scripts/release_smoke.sh
makes it). It checks that the core the wheel carries for this torch loads and
records right, which is what a core built against the wrong headers or ABI
gets wrong first:

1. a small job under `python -m opdump run`: no `opdump:` line (a missing or
   unloadable core says one), and the statistics of mm, gelu, mul and sum read
   back with pyarrow equal those computed here in float64 from the tensors;
2. a TinyLM step (tests/jobs/faulty_cpu.py) dumped twice, once with gelu's
   kernel scaled by 1.01: `opdump compare` names aten::gelu in blocks.0 as the
   op that introduced the error (modules, backward, the whole record path).

Prints one line, `smoke torch <v>: ok (...)`, or exits 1 with what differed."""

import argparse
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import torch

ROOT = Path(__file__).resolve().parent.parent
FAULTY = ROOT / "tests" / "jobs" / "faulty_cpu.py"

JOB = """
import json, sys
import torch
import torch.nn.functional as F

torch.manual_seed(0)
a = torch.randn(64, 32)
b = torch.randn(32, 16)
c = torch.mm(a, b)
g = F.gelu(c)
m = g * 3.0
s = torch.sum(m)

def stats(t):
    d = t.detach().double().flatten()
    return {"shape": list(t.shape), "numel": t.numel(), "min": d.min().item(), "max": d.max().item(),
            "mean": d.mean().item(), "l2": d.norm().item(), "absmax": d.abs().max().item()}

json.dump({"aten::mm": stats(c), "aten::gelu": stats(g), "aten::mul": stats(m), "aten::sum": stats(s)},
          open(sys.argv[1], "w"))
"""


def fail(v: str, what: str) -> None:
    print(f"smoke torch {v}: FAILED: {what}", file=sys.stderr)
    sys.exit(1)


def run(cmd: list, cwd: Path, **extra) -> subprocess.CompletedProcess:
    # The job sees no setting of the shell that runs the release.
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPDUMP") and k != "LD_PRELOAD"}
    env.update(PYTHONUNBUFFERED="1", **extra)
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd, env=env, timeout=900)


def opdump_lines(stderr: str) -> list:
    return [line for line in stderr.splitlines() if line.startswith("opdump:")]


def read_dump(dump: Path) -> list:
    files = sorted(dump.rglob("part-*.parquet"))
    return [row for f in files for row in pq.read_table(f).to_pylist()]


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--torch", required=True, help="the torch version this venv must have")
    ap.add_argument("--work", required=True, type=Path)
    args = ap.parse_args()
    v, work = args.torch, args.work
    work.mkdir(parents=True, exist_ok=True)

    running = torch.__version__.split("+")[0]
    if running != v:
        fail(v, f"the venv has torch {torch.__version__}")
    import opdump
    carried = opdump.supported_torch_versions()
    if v not in carried:
        fail(v, f"the wheel carries cores for {carried} only")

    # 1. The small job, its statistics against float64 ones.
    (work / "job.py").write_text(JOB)
    p = run([sys.executable, "-m", "opdump", "run", "--dir", "dump", "--", sys.executable, "job.py", "expected.json"],
            cwd=work)
    if p.returncode != 0 or opdump_lines(p.stderr):
        fail(v, f"the job under opdump: exit {p.returncode}, {p.stderr[-2000:]}")
    expected = json.loads((work / "expected.json").read_text())
    rows = read_dump(work / "dump")
    for op, want in expected.items():
        got = [r for r in rows if r["op"] == op and r["role"] == "output" and r["depth"] == 0
               and r["shape"] == want["shape"]]
        if len(got) != 1:
            fail(v, f"{len(got)} top-level output rows of {op} with shape {want['shape']}, not 1")
        r = got[0]
        if r["dtype"] != "float32" or r["numel"] != want["numel"] or r["stats_status"] != "computed":
            fail(v, f"{op}: dtype {r['dtype']}, numel {r['numel']}, stats {r['stats_status']}")
        for k in ("min", "max", "mean", "l2", "absmax"):
            if r[k] is None or not close(r[k], want[k]):
                fail(v, f"{op}.{k} is {r[k]} in the dump, {want[k]} computed from the tensor")
    checked = len(expected)

    # The command reads the dump too.
    p = run(["opdump", "summary", "dump", "--json"], cwd=work)
    if p.returncode != 0:
        fail(v, f"opdump summary: exit {p.returncode}, {p.stderr[-2000:]}")
    json.loads(p.stdout)

    # 2. A planted fault, found by compare.
    for name, extra in (("ref", {}), ("bad", {"FAULT": "aten::gelu=1.01"})):
        p = run([sys.executable, "-m", "opdump", "run", "--dir", name, "--steps", "0", "--", sys.executable, FAULTY],
                cwd=work, **extra)
        if p.returncode != 0 or opdump_lines(p.stderr):
            fail(v, f"TinyLM {name}: exit {p.returncode}, {p.stderr[-2000:]}")
    p = run(["opdump", "compare", "ref", "bad", "--json"], cwd=work)
    if p.returncode != 1:
        fail(v, f"opdump compare ref bad: exit {p.returncode} (1: a divergence), {p.stderr[-2000:]}")
    first = json.loads(p.stdout)["first_introduced"]
    if (first["op"], first["module"]) != ("aten::gelu", "blocks.0"):
        fail(v, f"compare names {first['op']} in {first['module']}, not aten::gelu in blocks.0")

    print(f"smoke torch {v}: ok (core loaded; {len(rows)} rows, the statistics of {checked} ops equal "
          f"float64 ones; compare names aten::gelu in blocks.0; cores in the wheel: {', '.join(carried)})")


if __name__ == "__main__":
    main()
