"""The fault sweep: one planted fault at a time, `scale:1.001` and then
`noise:1e-3`, in every kernel that testdev can fault in one training step
of the TinyLM (scripts/tinylm.py) and of the battery's Llama
(tests/battery/models.py), forward, backward and optimizer. Each run is
compared with one CPU reference run of its model, and every fault that fired
must be the headline: at a call of its op, or at the aligned call that holds
it when only testdev makes the nested call (`_convolution` over
`convolution_overrideable`).

    .venv/bin/python tests/test_fault_sweep.py            # the table, by hand
    .venv/bin/python tests/test_fault_sweep.py tinylm     # one model
    .venv/bin/python tests/test_fault_sweep.py tinylm --ops=gelu,mm

A fault that fires yet changes nothing (it scales only zeros) cannot be
seen by any comparison; such kernels are listed in UNSEEABLE with the
reason. A kernel that runs only in the optimizer changes parameters that
nothing reads within the one step a run makes: its rows say "optim"."""

import json
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release"
FAULTS = ("scale:1.001", "noise:1e-3")
# Zero-mean noise keeps a large tensor's statistics within rounding (it
# moves the norm by about R²/2): noise runs dump the sketch too (README,
# "Fingerprint and sketch"), scale runs the statistics alone.
SKETCH = {"scale": 0, "noise": 16}
MODELS = ("tinylm", "llama")
# At most two jobs at a time: the machine has two cores.
PARALLEL = 2
STEPS = 1


def train(model, device):
    """One step of `model` on `device`; returns the losses. Runs in the
    worker process."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "scripts"))
    if model == "tinylm":
        import tinylm

        return tinylm.train(device, steps=STEPS)
    from tests.battery import models

    return models.train(model, device, steps=STEPS)


def worker(model, device, discover):
    """The job: with `discover`, the faultable kernels it runs on testdev
    (without opdump); else the losses and how often the fault fired."""
    sys.path.insert(0, str(ROOT))
    if device == "testdev":
        import tests.testdev as testdev

        testdev.load()
        testdev.trace(discover)
    losses = train(model, device)
    out = {"losses": losses, "fault_counts": testdev.fault_counts() if device == "testdev" else {}}
    if discover:
        names = set(testdev.traced_ops()) | set(testdev.traced_direct_ops())
        out["kernels"] = sorted({n.split(".")[0] for n in names})
    print(json.dumps(out))


def job(model, device, out=None, fault=None, discover=False, sketch=0):
    """Runs the worker in a fresh process (with opdump preloaded when `out`
    is given, with sketches of length `sketch`); returns its JSON."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("OPDUMP") and k not in ("TESTDEV_FAULT", "LD_PRELOAD")}
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    if out is not None:
        shutil.rmtree(out, ignore_errors=True)
        env.update(OPDUMP="1", OPDUMP_DIR=str(out), LD_PRELOAD=str(TARGET / "libopdump.so"),
                   OPDUMP_SKETCH=str(sketch))
    if fault:
        env["TESTDEV_FAULT"] = fault
    argv = [sys.executable, __file__, "--worker", model, device] + (["--discover"] if discover else [])
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"fault sweep: {model} on {device} ({fault}) failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def compare(a, b):
    p = subprocess.run([str(TARGET / "opdump"), "compare", str(a), str(b), "--json"],
                       capture_output=True, text=True, timeout=600)
    if p.returncode not in (0, 1, 3):
        raise RuntimeError(f"opdump compare failed ({p.returncode}): {p.stderr}")
    return p.returncode, json.loads(p.stdout)


def bare(op):
    """`aten::add_` -> `add`: the name a fault spec and a dump row share."""
    name = op.split("::")[-1]
    return name[:-1] if name.endswith("_") and not name.endswith("__") else name


def calls_of(dump, op):
    """seq -> parent seq of every call in `dump`, the seqs of `op`'s calls
    (any overload) in order, and the phases they ran in."""
    import pyarrow.parquet as pq

    files = sorted(p for p in Path(dump).rglob("*.parquet") if not p.name.startswith("."))
    parent, mine, phases = {}, set(), set()
    for f in files:
        t = pq.read_table(f, columns=["seq", "parent_seq", "op", "phase"]).to_pydict()
        for seq, par, name, phase in zip(t["seq"], t["parent_seq"], t["op"], t["phase"]):
            parent[seq] = par
            if bare(name) == op:
                mine.add(seq)
                phases.add(phase)
    return parent, sorted(mine), phases


def named_where(report, dump_b, op):
    """Where the headline is, relative to the faulted op's calls in B:
    "first" (its first call, or the aligned call holding it), "later" (a
    later call), None (elsewhere), or "optim" when the op ran only in the
    optimizer, whose updated parameters nothing reads within one step."""
    head = report.get("headline")
    seq = head and head.get("seq_b")
    unmatched = report.get("first_introduced_unmatched")
    if unmatched and unmatched.get("op"):
        seq = unmatched["op"]["seq"]
    parent, calls, phases = calls_of(dump_b, op)
    if seq is None:
        return "optim" if phases == {"optimizer"} else None
    for i, c in enumerate(calls):
        chain, s = [], c
        while s is not None and s not in chain:
            chain.append(s)
            s = parent.get(s)
        if seq in chain:
            return "first" if i == 0 else "later"
    return None


# Kernels whose fault fires but changes no value, with why: no comparison
# can see them.
UNSEEABLE = {
    "fill": "fills with 0 (zeroed gradients, masks): 0 x 1.001 = 0",
    "zero": "writes zeros",
}


def sweep(models=MODELS, out=None, log=print, only=None):
    """Runs the sweep (over the kernels in `only`, when given); returns its
    rows (model, op, fault, fired, named, exit status, headline). A model
    after the first sweeps only the kernels the models before it did not
    run: the rules are per op, and the run time stays in check."""
    import tempfile

    out = Path(out or tempfile.mkdtemp(prefix="fault-sweep-"))
    rows, seen = [], set()
    for model in models:
        kernels = [k for k in job(model, "testdev", discover=True)["kernels"] if k not in seen]
        seen.update(kernels)
        refs = {}
        for sketch in set(SKETCH.values()):
            refs[sketch] = out / f"{model}-cpu-{sketch}"
            job(model, "cpu", refs[sketch], sketch=sketch)
        plan = [bare(k) for k in kernels if not only or bare(k) in only]

        def kernel(op, model=model):
            """Both faults in `op`, the second only when the first fired
            (they fire on the same calls)."""
            first = one((op, FAULTS[0]))
            if not first[3]:
                return [first, (model, op, FAULTS[1], 0, None, None, None)]
            return [first, one((op, FAULTS[1]))]

        def one(item, model=model, refs=refs):
            op, fault = item
            kind = fault.split(":")[0]
            d = out / f"{model}-{op}-{kind}"
            res = job(model, "testdev", d, f"aten::{op}={fault}", sketch=SKETCH[kind])
            ref = refs[SKETCH[kind]]
            fired = res["fault_counts"].get(f"aten::{op}", 0)
            code, rep = compare(ref, d) if fired else (None, {})
            where = named_where(rep, d, op) if fired else None
            head = rep.get("headline") or {}
            shutil.rmtree(d, ignore_errors=True)
            return (model, op, fault, fired, where, code, head.get("op"))

        with ThreadPoolExecutor(PARALLEL) as pool:
            for pair in pool.map(kernel, plan):
                for row in pair:
                    rows.append(row)
                    log(fmt(row))
    shutil.rmtree(out, ignore_errors=True)
    return rows


def fmt(row):
    model, op, fault, fired, where, code, head = row
    return (f"{model:7} {op:36} {fault:12} fired {fired:4}  named {where or '-':6} "
            f"exit {'-' if code is None else code}  headline {head or '-'}")


def failures(rows):
    """Fired faults not named at their op, other than the unseeable ones
    and those of the optimizer (see `named_where`)."""
    return [r for r in rows if r[3] > 0 and r[4] is None and r[1] not in UNSEEABLE]


def test_every_fired_fault_is_named(capsys):
    rows = sweep(log=lambda line: None)
    with capsys.disabled():
        print("\nfault sweep (model, op, fault, fired, named, exit status, headline):")
        for r in rows:
            print("  " + fmt(r))
    fired = [r for r in rows if r[3] > 0]
    # The sweep saw kernels of both models, forward and backward.
    assert len({r[0] for r in fired}) == len(MODELS), rows
    assert len(fired) >= 40, rows
    bad = failures(rows)
    assert not bad, "\n".join(fmt(r) for r in bad)
    for r in fired:
        if r[4] in ("first", "later"):
            assert r[5] == 1, fmt(r)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2], sys.argv[3], "--discover" in sys.argv)
    else:
        args = [a for a in sys.argv[1:] if not a.startswith("--ops=")]
        ops = [a[6:].split(",") for a in sys.argv[1:] if a.startswith("--ops=")]
        rows = sweep(tuple(args) or MODELS, only=ops[0] if ops else None)
        bad = failures(rows)
        print(f"{sum(r[3] > 0 for r in rows)} fired, {len(bad)} not named")
        sys.exit(1 if bad else 0)
