"""The multi-rank demo: a 4-rank data-parallel job (gloo, on the CPU) run
twice with opdump, the second time with a faulty optimizer kernel on one
rank, as a bad device in a fleet would compute it. `opdump compare --rank
all` compares every rank pair and names that rank alone; the ranks vote of
sql/ranks_vote.sql, run through DuckDB on the faulty run by itself, names
it too (its parameters leave the other ranks' after the first update).

    scripts/setup.sh && .venv/bin/python scripts/demo_ranks.py
    .venv/bin/python scripts/demo_ranks.py --fault-rank 1 --out /tmp/demo-ranks
    .venv/bin/python scripts/demo_ranks.py --json   # one JSON object, for tests

The fault: the faulty rank's CPU kernel of `aten::_foreach_add_.List` (the
SGD update, p -= lr * g, over every parameter at once) is replaced by one
that computes the update from other aten ops and scales the result by
1.001. Exit status: that of `opdump compare --rank all` (1 when a rank
diverges)."""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release"
WORLD, STEPS, SCALE = 4, 3, 1.001


def faulty_update(scale):
    """An `_foreach_add_.List` kernel that is off by `scale` (in place, as
    the real one)."""
    import torch

    def _foreach_add_(selves, others, alpha=1):
        with torch.no_grad():
            for s, o in zip(selves, others):
                s.copy_((s + o * alpha) * scale)

    return _foreach_add_


def worker(rank, init, fault_rank):
    """One rank: opdump is switched on once the process group exists, so it
    takes the rank from torch.distributed."""
    import torch
    import torch.distributed as dist
    from torch import nn

    torch.ops.load_library(str(TARGET / "libopdump.so"))
    if rank == fault_rank:
        lib = torch.library.Library("aten", "IMPL")  # kept registered while the rank runs
        with warnings.catch_warnings():  # "overriding a previously registered kernel": the point
            warnings.simplefilter("ignore")
            lib.impl("_foreach_add_.List", faulty_update(SCALE), "CPU")
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=WORLD)
    torch.ops.opdump.enable()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    ddp = nn.parallel.DistributedDataParallel(model)
    # foreach=True: the CPU default is one add_ per parameter.
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1, foreach=True)
    data = torch.Generator().manual_seed(100 + rank)  # each rank its own batch
    for _ in range(STEPS):
        x, y = torch.randn(32, 8, generator=data), torch.randn(32, 4, generator=data)
        opt.zero_grad()
        # The squared error by hand: aten::mse_loss resizes an uninitialized
        # buffer, whose leftover values compare reads as a divergence on every rank.
        ((ddp(x) - y) ** 2).mean().backward()
        opt.step()
    torch.ops.opdump.flush()
    dist.destroy_process_group()


def run_job(dump, fault_rank):
    """The job, into `dump`, in a process of its own with a clean opdump
    environment; `fault_rank` None runs it without a fault."""
    shutil.rmtree(dump, ignore_errors=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPDUMP") and k != "LD_PRELOAD"}
    env.update(OPDUMP_DIR=str(dump), OPDUMP_SKETCH="16", PYTHONUNBUFFERED="1")
    # The rendezvous file of gloo's file:// init must not exist from an
    # earlier run: a fresh folder each time.
    with tempfile.TemporaryDirectory() as rendezvous:
        init = f"file://{rendezvous}/init"
        fault = str(-1 if fault_rank is None else fault_rank)
        p = subprocess.run([sys.executable, __file__, "--worker", init, "--fault-rank", fault],
                           env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        sys.exit(f"demo_ranks: the job into {dump} failed:\n{p.stderr}")


def workers(init, fault_rank):
    import torch.multiprocessing as mp

    # Forked workers inherit the imported torch instead of importing it again.
    mp.start_processes(worker, args=(init, fault_rank), nprocs=WORLD, start_method="fork")


def compare(a, b, as_json):
    args = [str(TARGET / "opdump"), "compare", str(a), str(b), "--rank", "all"] + (["--json"] if as_json else [])
    return subprocess.run(args, capture_output=True, text=True)


def vote(dump):
    """The results of sql/ranks_vote.sql on `dump`, run as a user runs it."""
    args = [sys.executable, str(ROOT / "sql" / "run_duckdb.py"), "ranks_vote", str(dump), "--json"]
    p = subprocess.run(args, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"demo_ranks: the DuckDB ranks vote failed:\n{p.stderr}")
    return json.loads(p.stdout)


def vote_text(v):
    """The vote in a few lines: the counts, the first finding, each rank's
    findings (the recipe lists one row per finding and odd rank)."""
    counts = ", ".join(f"{r['tensors']} {r['verdict']}" for r in v["counts"])
    lines = [f"tensors: {counts}"]
    if v["findings"]:
        f = v["findings"][0]
        lines.append(f"first: rank {f['rank']} is {f['kind']} at step {f['step']} ({f['phase']}): "
                     f"{f['name']}, {f['role']} {f['arg']} of {f['op']}.{f['overload']}")
    lines += [f"rank {r['rank']}: {r['odd']} findings from step {r['first_step']}" for r in v["by_rank"]]
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=Path("opdump-demo-ranks"), help="where the two dumps go")
    ap.add_argument("--fault-rank", type=int, default=2, help=f"the rank with the faulty kernel (0-{WORLD - 1})")
    ap.add_argument("--json", action="store_true", help="print compare's and the vote's JSON as one object")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        workers(a.worker, a.fault_rank)
        return 0
    if not 0 <= a.fault_rank < WORLD:
        sys.exit(f"demo_ranks: --fault-rank must be 0-{WORLD - 1}")
    a.out.mkdir(parents=True, exist_ok=True)
    ref, bad = a.out / "reference", a.out / "faulty"
    print(f"demo_ranks: {WORLD} ranks x {STEPS} steps, twice; the second with a faulty "
          f"_foreach_add_ on rank {a.fault_rank}", file=sys.stderr)
    run_job(ref, None)
    run_job(bad, a.fault_rank)
    c = compare(ref, bad, a.json)
    if c.returncode not in (0, 1):
        sys.exit(f"demo_ranks: opdump compare failed:\n{c.stderr}")
    v = vote(bad)
    if a.json:
        print(json.dumps({"compare": json.loads(c.stdout), "compare_exit": c.returncode, "vote": v}))
    else:
        print(f"$ opdump compare {ref} {bad} --rank all\n{c.stdout}")
        print(f"$ python sql/run_duckdb.py ranks_vote {bad}   (in short)\n{vote_text(v)}")
    return c.returncode


if __name__ == "__main__":
    sys.exit(main())
