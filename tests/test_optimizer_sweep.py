"""The optimizer sweep: one planted `scale:1.001` fault at a time in every
kernel that torch's AdamW, Adam and SGD with momentum run on testdev
(`TESTDEV_FOREACH=1`, as on CUDA: `_foreach_*` kernels, or one `_fused_*`
kernel with `fused=True`), against a CPU reference made with torch's
defaults, which run a per-parameter loop. Each fault must be named by
`opdump compare` at its kernel and an element, in step 0's optimizer (step
1's for a kernel that first scales zeros, see FIRST_STEP), and by the
one-device check (`OPDUMP_CHECK`) of the faulted run; the fault-free pairs, a float64
checksum of the weights included, must exit 0.

    .venv/bin/python tests/test_optimizer_sweep.py            # the table, by hand
    .venv/bin/python tests/test_optimizer_sweep.py adamw      # one optimizer"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from test_fault_sweep import compare

ROOT = Path(__file__).resolve().parents[1]
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release"
FAULT = "scale:1.001"
# Three steps: a fault in step 0's optimizer is read by step 1's forward,
# and the run still has a step after that one.
STEPS = int(os.environ.get("SWEEP_STEPS", "3"))
PARALLEL = 2

# (optimizer, mode) -> the kernels testdev runs in its step, each faulted in
# turn. The `_foreach_add_` of the step counters runs on the CPU (the counters
# of a non-fused optimizer are CPU tensors), where testdev plants no fault.
CONFIGS = {
    ("adamw", "foreach"): ["_foreach_mul", "_foreach_lerp", "_foreach_addcmul", "_foreach_sqrt",
                           "_foreach_div", "_foreach_add", "_foreach_addcdiv"],
    ("adam", "foreach"): ["_foreach_lerp", "_foreach_mul", "_foreach_addcmul", "_foreach_sqrt",
                          "_foreach_div", "_foreach_add", "_foreach_addcdiv"],
    ("sgd", "foreach"): ["_foreach_mul", "_foreach_add"],
    ("adamw", "fused"): ["_fused_adamw"],
    ("adam", "fused"): ["_fused_adam"],
    ("sgd", "fused"): ["_fused_sgd"],
}


def worker(device, optimizer, mode, checksum):
    """The job: trains TinyLM on `device` with `optimizer` (torch's defaults
    on the CPU; `mode` on testdev); prints the losses, how often each fault
    fired and, with `checksum`, a float64 sum of the weights."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(ROOT / "scripts"))
    import torch
    import torch.nn.functional as F

    import tinylm

    faults = {}
    if device == "testdev":
        import tests.testdev as testdev

        testdev.load()
    model = tinylm.make(0).to(device)
    kw = {"fused": True} if mode == "fused" and device != "cpu" else {}
    if optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, **kw)
    else:
        cls = torch.optim.AdamW if optimizer == "adamw" else torch.optim.Adam
        opt = cls(model.parameters(), lr=1e-3, **kw)
    losses = []
    for x, y in tinylm.batches(STEPS):
        x, y = x.to(device), y.to(device)
        opt.zero_grad()
        loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
        loss.backward()
        opt.step()
        losses.append(loss.item())
    out = {"losses": losses}
    if checksum:
        out["checksum"] = float(sum(p.double().cpu().sum() for p in model.parameters()))
    if device == "testdev":
        faults = testdev.fault_counts()
    out["fault_counts"] = faults
    print(json.dumps(out))


def job(out, device, optimizer, mode, fault=None, checksum=False, check=False):
    """Runs the worker with opdump preloaded, dumping into `out`; returns
    its JSON."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("OPDUMP", "TESTDEV")) and k != "LD_PRELOAD"}
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1",
               OPDUMP="1", OPDUMP_DIR=str(out), LD_PRELOAD=str(TARGET / "libopdump.so"),
               TESTDEV_FOREACH="1")
    if check:
        # The optimizer's kernels only: the checking thread then keeps up
        # with the job, so a signature whose first check saw only zeros
        # (see FIRST_STEP) is checked again in the next step, not once the
        # checker has caught up with the whole first step (about step 9 of
        # a TinyLM with OPDUMP_CHECK=1; tests/test_check_list_ops.py runs
        # that).
        env["OPDUMP_CHECK"] = "_foreach_|_fused_"
    if fault:
        env["TESTDEV_FAULT"] = fault
    shutil.rmtree(out, ignore_errors=True)
    argv = [sys.executable, __file__, "--worker", device, optimizer, mode] + (["--checksum"] if checksum else [])
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600)
    if p.returncode != 0:
        raise RuntimeError(f"optimizer sweep: {optimizer}/{mode} on {device} ({fault}) failed:\n{p.stderr[-3000:]}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def check(dump):
    """`opdump check --json`: its exit status and the failed calls' ops."""
    p = subprocess.run([str(TARGET / "opdump"), "check", str(dump), "--json"],
                       capture_output=True, text=True, timeout=600)
    try:
        rep = json.loads(p.stdout)
    except json.JSONDecodeError:
        raise RuntimeError(f"opdump check failed ({p.returncode}): {p.stderr}") from None
    return p.returncode, sorted({f["op"] for f in rep.get("failures", [])})


def headline(rep):
    """(op, step, phase, element) of the compare report's headline, or
    None when nothing was introduced."""
    h = rep.get("headline")
    if not h:
        return None
    return (h.get("op"), h.get("step_b"), h.get("phase_b"), h.get("element"))


# Kernels whose step-0 call scales state that still holds zeros (Adam's
# `exp_avg_sq.mul_(β2)` without weight decay; SGD's momentum buffer, which
# the first step makes by cloning the gradient): a wrong kernel changes
# nothing there, and shows first in step 1.
FIRST_STEP = {("adam", "_foreach_mul"): 1, ("sgd", "_foreach_mul"): 1}


def sweep(configs=CONFIGS, log=print):
    """Runs the sweep; returns one row per fault and per fault-free pair:
    (optimizer, mode, kernel or None, fired, compare exit, headline,
    check exit, check's failed ops)."""
    out = Path(tempfile.mkdtemp(prefix="optimizer-sweep-"))
    refs = {}
    for optimizer in sorted({o for o, _ in configs}):
        refs[optimizer] = out / f"{optimizer}-cpu"
        job(refs[optimizer], "cpu", optimizer, "default")
    ref_sum = out / "adamw-cpu-checksum"
    job(ref_sum, "cpu", "adamw", "default", checksum=True)

    plan = [(o, m, k) for (o, m), ks in configs.items() for k in [None] + ks]

    def one(item):
        optimizer, mode, kernel = item
        d = out / f"{optimizer}-{mode}-{kernel or 'clean'}"
        fault = f"aten::{kernel}={FAULT}" if kernel else None
        res = job(d, "testdev", optimizer, mode, fault, check=True)
        fired = res["fault_counts"].get(f"aten::{kernel}", 0) if kernel else 0
        code, rep = compare(refs[optimizer], d)
        ccode, cops = check(d)
        shutil.rmtree(d, ignore_errors=True)
        return (optimizer, mode, kernel, fired, code, headline(rep), ccode, cops)

    rows = []
    with ThreadPoolExecutor(PARALLEL) as pool:
        for row in pool.map(one, plan):
            rows.append(row)
            log(fmt(row))
    d = out / "adamw-foreach-checksum"
    job(d, "testdev", "adamw", "foreach", checksum=True)
    code, rep = compare(ref_sum, d)
    rows.append(("adamw", "foreach+checksum", None, 0, code, headline(rep), None, []))
    log(fmt(rows[-1]))
    shutil.rmtree(out, ignore_errors=True)
    return rows


def fmt(row):
    optimizer, mode, kernel, fired, code, head, ccode, cops = row
    return (f"{optimizer:5} {mode:16} {kernel or '(no fault)':18} fired {fired:3}  compare exit {code} "
            f"headline {head or '-'}  check exit {'-' if ccode is None else ccode} {','.join(cops) or '-'}")


def named(row):
    """Whether a faulted row's headline is its kernel, with an element and
    its parameter, in step 0's optimizer (see FIRST_STEP), and the check
    named the kernel."""
    optimizer, _, kernel, _, code, head, ccode, cops = row
    op = f"aten::{kernel}"
    step = FIRST_STEP.get((optimizer, kernel), 0)
    at_kernel = (head is not None and head[0].rstrip("_") == op and head[1] == step and head[2] == "optimizer"
                 and head[3] is not None and head[3].get("param"))
    checked = ccode not in (0, None) and any(o.rstrip("_") == op for o in cops)
    return code == 1 and at_kernel and checked


def failures(rows):
    bad = []
    for r in rows:
        if r[2] is None:
            if r[4] != 0 or r[6] not in (0, None):
                bad.append(r)
        elif r[3] == 0 or not named(r):
            bad.append(r)
    return bad


def test_every_optimizer_kernel_fault_is_named_and_clean_runs_agree(capsys):
    rows = sweep(log=lambda line: None)
    with capsys.disabled():
        print("\noptimizer sweep (optimizer, mode, kernel, fired, compare exit, headline, check):")
        for r in rows:
            print("  " + fmt(r))
    assert sum(r[2] is not None for r in rows) == sum(len(k) for k in CONFIGS.values())
    bad = failures(rows)
    assert not bad, "\n".join(fmt(r) for r in bad)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        worker(sys.argv[2], sys.argv[3], sys.argv[4], "--checksum" in sys.argv)
    else:
        only = set(sys.argv[1:])
        rows = sweep({k: v for k, v in CONFIGS.items() if not only or k[0] in only})
        bad = failures(rows)
        print(f"{len(rows)} rows, {len(bad)} failed")
        sys.exit(1 if bad else 0)
