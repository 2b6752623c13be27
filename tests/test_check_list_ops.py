"""The accuracy check of ops whose outputs are the arguments they write, or
tensor lists: the `_foreach_*` kernels of torch's default AdamW and of SGD
with momentum, and `_fused_adamw_`, on testdev with TESTDEV_FOREACH=1 (one
kernel per `_foreach_` call, as on CUDA). Each is checked per list element,
a line each with its index and its parameter's name; a fault of 1e-3 in
any of them is named by `opdump check`, a fault-free run fails nothing,
and a fault that starts after the first steps is found by the re-check of
signatures in later steps (OPDUMP_CHECK_RECHECK)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import CLI, LIB, ROOT, clean_env

# A small model trained on testdev with the named optimizer; at step
# `late_step` the job plants `late_fault` (tests.testdev.set_fault).
JOB = """
import json, sys, torch
import tests.testdev as td
td.load()
opt_name, steps, late_step, late_fault = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4)).to("testdev")
make = {
    "adamw": lambda p: torch.optim.AdamW(p, lr=1e-2),
    "adamw_fused": lambda p: torch.optim.AdamW(p, lr=1e-2, fused=True),
    "sgd": lambda p: torch.optim.SGD(p, lr=1e-2, momentum=0.9),
}
opt = make[opt_name](model.parameters())
counts = {}
losses = []
for step in range(steps):
    if step == late_step:
        td.set_fault(late_fault)
    x, y = torch.randn(8, 16).to("testdev"), torch.randn(8, 4).to("testdev")
    opt.zero_grad()
    loss = torch.nn.functional.mse_loss(model(x), y)
    loss.backward()
    opt.step()
    losses.append(float(loss))
    counts.update(td.fault_counts())
print(json.dumps({"losses": losses, "fault_counts": counts}))
"""

PARAMS = {"0.weight", "0.bias", "2.weight", "2.bias"}


def job(dump, optimizer, steps=2, fault="", late_step=-1, late_fault="", **env):
    e = clean_env(OPDUMP="1", OPDUMP_DIR=dump, LD_PRELOAD=LIB, OMP_NUM_THREADS="1", TESTDEV_FOREACH="1",
                  TESTDEV_FAULT=fault, OPDUMP_CHECK=env.pop("OPDUMP_CHECK", "_foreach|_fused"), **env)
    p = subprocess.run([sys.executable, "-c", JOB, optimizer, str(steps), str(late_step), late_fault],
                       env=e, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert p.returncode == 0, p.stderr[-3000:]
    res = json.loads(p.stdout.strip().splitlines()[-1])
    res["opdump_lines"] = [l for l in p.stderr.splitlines() if l.startswith("opdump:")]
    return res


def lines(dump):
    files = sorted(Path(dump).glob("checks/rank=*/part-*.jsonl"))
    assert files, f"no check results under {dump}"
    return [json.loads(l) for f in files for l in f.read_text().splitlines()]


def checks(dump):
    return [r for r in lines(dump) if r["kind"] == "check"]


def report(dump):
    return subprocess.run([str(CLI), "check", str(dump)], capture_output=True, text=True, timeout=60)


def on_testdev(rows, op):
    return [r for r in rows if r["op"] == op and r["device"].startswith("testdev")]


# torch's default AdamW on a device with multi-tensor kernels: (fault, the op
# it shows in).
ADAMW_KERNELS = [
    ("_foreach_add", "aten::_foreach_add_"),
    ("_foreach_addcdiv", "aten::_foreach_addcdiv_"),
    ("_foreach_addcmul", "aten::_foreach_addcmul_"),
    ("_foreach_div", "aten::_foreach_div_"),
    ("_foreach_lerp", "aten::_foreach_lerp_"),
    ("_foreach_mul", "aten::_foreach_mul_"),
    ("_foreach_sqrt", "aten::_foreach_sqrt"),
]


@pytest.mark.parametrize("kernel,op", ADAMW_KERNELS, ids=[k for k, _ in ADAMW_KERNELS])
def test_a_fault_in_each_foreach_kernel_of_adamw_is_named_with_its_element(tmp_path, kernel, op):
    res = job(tmp_path, "adamw", fault=f"aten::{kernel}=scale:1.001")
    assert res["fault_counts"].get(f"aten::{kernel}", 0) > 0, res
    bad = [r for r in on_testdev(checks(tmp_path), op) if r["verdict"] == "fail"]
    assert bad, f"{op} not failed: {sorted({(r['op'], r['verdict']) for r in checks(tmp_path)})}"
    assert all(r["element"] is not None and r["ratio"] > 10 for r in bad), bad
    assert all(5e-4 < r["device_err"] < 2e-3 for r in bad), bad
    # Nothing else fails: each kernel is judged from its own inputs.
    assert {r["op"] for r in checks(tmp_path) if r["verdict"] == "fail"} == {op}
    p = report(tmp_path)
    assert p.returncode == 1, p.stdout + p.stderr
    assert op in p.stdout and "list element" in p.stdout, p.stdout


def test_fused_adamw_is_checked_per_parameter_and_a_fault_in_it_is_named(tmp_path):
    clean, faulty = tmp_path / "clean", tmp_path / "faulty"
    job(clean, "adamw_fused")
    rows = on_testdev(checks(clean), "aten::_fused_adamw_")
    # A line per parameter, each with its name, all passed.
    assert {r["name"] for r in rows} == PARAMS and len({r["element"] for r in rows}) == 4, rows
    assert all(r["verdict"] == "pass" for r in rows), rows
    assert report(clean).returncode == 0
    res = job(faulty, "adamw_fused", fault="aten::_fused_adamw=scale:1.001")
    assert res["fault_counts"].get("aten::_fused_adamw", 0) > 0, res
    bad = [r for r in on_testdev(checks(faulty), "aten::_fused_adamw_") if r["verdict"] == "fail"]
    assert {r["name"] for r in bad} == PARAMS, bad
    p = report(faulty)
    assert p.returncode == 1 and "aten::_fused_adamw_" in p.stdout and "failed at 4 list elements" in p.stdout, p.stdout


def test_sgd_with_momentum_kernels_are_checked_and_their_faults_named(tmp_path):
    res = job(tmp_path, "sgd", steps=3, fault="aten::_foreach_add=scale:1.001; aten::_foreach_mul=scale:1.001")
    assert all(res["fault_counts"].get(k, 0) > 0 for k in ("aten::_foreach_add", "aten::_foreach_mul")), res
    rows = checks(tmp_path)
    for op in ("aten::_foreach_add_", "aten::_foreach_mul_"):
        bad = [r for r in on_testdev(rows, op) if r["verdict"] == "fail"]
        # The momentum buffers have no name; the parameters have theirs.
        assert bad and all(r["element"] is not None for r in bad), (op, on_testdev(rows, op))
    assert any(r["name"] in PARAMS for r in on_testdev(rows, "aten::_foreach_add_") if r["verdict"] == "fail")
    assert report(tmp_path).returncode == 1


def test_a_fault_free_adamw_fails_nothing_and_every_foreach_kernel_is_judged(tmp_path):
    job(tmp_path, "adamw")
    rows = checks(tmp_path)
    assert [r for r in rows if r["verdict"] == "fail"] == []
    for _, op in ADAMW_KERNELS:
        mine = on_testdev(rows, op)
        assert mine and all(r["verdict"] == "pass" and r["element"] is not None for r in mine), (op, mine)
    # The lists of parameters and gradients name their parameters.
    assert {r["name"] for r in on_testdev(rows, "aten::_foreach_lerp_")} == PARAMS
    p = report(tmp_path)
    assert p.returncode == 0 and "no check failed" in p.stdout, p.stdout


def test_a_fault_that_starts_after_the_first_steps_is_found_by_the_recheck(tmp_path):
    # The lerp's signature is the same every step: checked at step 0, then
    # again only in its turn among the re-occurring `_foreach_` signatures.
    late = dict(steps=24, late_step=3, late_fault="aten::_foreach_lerp=scale:1.001")
    res = job(tmp_path / "recheck", "adamw", **late)
    assert res["fault_counts"].get("aten::_foreach_lerp", 0) > 0, res
    bad = [r for r in on_testdev(checks(tmp_path / "recheck"), "aten::_foreach_lerp_") if r["verdict"] == "fail"]
    assert bad and all(r["step"] >= 3 for r in bad), bad
    summary = [r for r in lines(tmp_path / "recheck") if r["kind"] == "summary"][0]
    assert summary["rechecks"] > 0, summary
    said = f"({summary['rechecks']} of them checks again in later steps, OPDUMP_CHECK_RECHECK=1)"
    assert any(said in l for l in res["opdump_lines"]), res["opdump_lines"]
    p = report(tmp_path / "recheck")
    assert p.returncode == 1 and "aten::_foreach_lerp_" in p.stdout, p.stdout
    # Without the re-check the same run passes: the fault came too late.
    job(tmp_path / "first", "adamw", OPDUMP_CHECK_RECHECK="0", **late)
    assert report(tmp_path / "first").returncode == 0
