"""The accuracy check (OPDUMP_CHECK): with no reference dump, the first call
of each distinct signature runs again on the CPU in float64 and in its own
dtype, and a device output much further from float64 than the CPU's own is
`fail`, named with its module. Faults of 1e-3 planted on testdev, forward
and backward, are each named; correct devices (testdev, and the CPU itself)
fail nothing; the job's results are unchanged; the byte cap and the time
budget are honoured and counted; bad values are one line naming the
variable."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import LIB, clean_env
from conftest import tinylm as train_tinylm
from tests.battery import run as battery
from tests.battery.models import FAMILIES


def rows(dump):
    """Every line of the check's files, as dicts."""
    files = sorted(Path(dump).glob("checks/rank=*/part-*.jsonl"))
    assert files, f"no check results under {dump}"
    return [json.loads(l) for f in files for l in f.read_text().splitlines()]


def checks(dump):
    return [r for r in rows(dump) if r["kind"] == "check"]


def summary(dump):
    s = [r for r in rows(dump) if r["kind"] == "summary"]
    assert len(s) == 1, s
    return s[0]


def failed(dump):
    return [r for r in checks(dump) if r["verdict"] == "fail"]


def tinylm(device, dump, steps=2, **env):
    return train_tinylm(device, dump, steps, **env)


def largest_ratio(dump):
    return max((r["ratio"] for r in checks(dump) if r["ratio"] is not None), default=0.0)


# Faults of 1e-3 planted at once, forward and backward: (TESTDEV_FAULT, the
# ops that must fail, each with the module its call ran in).
TINYLM_FAULTS = "aten::gelu=scale:1.001; aten::_softmax_backward_data=scale:1.001; aten::_log_softmax=scale:0.999"
# (op, phase, module): the loss runs outside any module.
TINYLM_FAULTED = [("aten::gelu", "forward", "blocks."), ("aten::_softmax_backward_data", "backward", "blocks."),
                  ("aten::_log_softmax", "forward", None)]


def test_tinylm_faults_of_1e_3_forward_and_backward_are_each_named_with_their_module(tmp_path):
    run = tmp_path / "check"
    p, losses, lines = tinylm("testdev", run, OPDUMP_CHECK="1", TESTDEV_FAULT=TINYLM_FAULTS)
    assert p.returncode == 0, p.stderr[-3000:]
    bad = failed(run)
    by_op = {}
    for r in bad:
        by_op.setdefault(r["op"], []).append(r)
    assert all(n > 0 for n in json.loads(p.stdout.strip().splitlines()[-1])["fault_counts"].values()), p.stdout
    for op, phase, module in TINYLM_FAULTED:
        assert op in by_op, f"{op} not named; failed: {sorted(by_op)}"
        assert all(r["phase"] == phase for r in by_op[op]), by_op[op]
        assert all((r["module"] or "").startswith(module) if module else r["module"] is None
                   for r in by_op[op]), by_op[op]
        assert all(r["ratio"] > 10 for r in by_op[op])
        # A fault of 1e-3 shows as an error of about 1e-3 against float64.
        assert all(5e-4 < r["device_err"] < 2e-3 for r in by_op[op]), by_op[op]
    # Nothing else fails, but the composites that call a faulted kernel.
    composites = {"aten::log_softmax", "aten::cross_entropy_loss", "aten::softmax", "aten::_softmax"}
    assert set(by_op) - {op for op, _, _ in TINYLM_FAULTED} <= composites, sorted(by_op)
    s = summary(run)
    # A list op (AdamW's `_foreach_` kernels) has a line per list element.
    assert s["failed"] == len(bad) and s["signatures"] > 20 and s["checked"] > 20, s
    assert any("OPDUMP_CHECK:" in l and f"{s['failed']} failed" in l for l in lines), lines
    # The capture of a failed call holds its inputs and the device's output.
    gelu = by_op["aten::gelu"][0]
    assert gelu["capture"] and (run / gelu["capture"]).is_file()


def test_check_leaves_the_job_bitwise_unchanged(tmp_path):
    _, off, _ = tinylm("testdev", tmp_path / "off", OPDUMP="0")
    p, on, _ = tinylm("testdev", tmp_path / "on", OPDUMP_CHECK="1")
    assert p.returncode == 0, p.stderr[-3000:]
    assert on == off  # floats from json: bitwise for the printed repr
    assert failed(tmp_path / "on") == []


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("device", ["testdev", "cpu"])
def test_fault_free_families_fail_nothing(tmp_path, family, device):
    d, _ = battery.dump(family, device, tmp_path, steps=1, env_extra={"OPDUMP_CHECK": "1"})
    bad = failed(d)
    assert bad == [], [(r["signature"], r["ratio"]) for r in bad]
    s = summary(d)
    assert s["checked"] > 20, s
    # The margin: the largest ratio a correct device showed.
    print(f"{family} on {device}: {s['signatures']} signatures, largest ratio {largest_ratio(d):.3g}")
    assert largest_ratio(d) <= 10


# Two battery families with several faults at once, forward and backward:
# (family, TESTDEV_FAULT, [(op named, phase)]).
BATTERY_FAULTS = [
    ("bert", "aten::gelu=scale:1.001; aten::gelu_backward=scale:0.999",
     [("aten::gelu", "forward"), ("aten::gelu_backward", "backward")]),
    ("resnet", "aten::convolution_overrideable=scale:1.001; aten::native_batch_norm_backward=scale:1.001",
     # testdev's own convolution has no CPU kernel: the aligned op that calls it is named.
     [("aten::convolution", "forward"), ("aten::native_batch_norm_backward", "backward")]),
]


@pytest.mark.parametrize("family,fault,named", BATTERY_FAULTS)
def test_battery_faults_are_named_without_a_reference(tmp_path, family, fault, named):
    d, res = battery.dump(family, "testdev", tmp_path, steps=1, fault=fault, env_extra={"OPDUMP_CHECK": "1"})
    assert all(n > 0 for n in res["fault_counts"].values()), res
    bad = failed(d)
    for op, phase in named:
        hits = [r for r in bad if r["op"] == op and r["phase"] == phase]
        assert hits, f"{op} ({phase}) not named; failed: {sorted({(r['op'], r['phase']) for r in bad})}"
        assert all(r["module"] for r in hits), hits


def test_in_place_and_out_ops_are_checked_against_their_inputs_before_the_op(tmp_path):
    job = (
        "import torch, tests.testdev as td; td.load()\n"
        "x = torch.linspace(0.5, 2, 64).reshape(8, 8).to('testdev')\n"
        "y = torch.full((8, 8), 3.0).to('testdev')\n"
        "x.mul_(y)\n"                        # in place: its self before is x, not 3x
        "out = torch.empty(8, 8).to('testdev')\n"
        "torch.exp(x, out=out)\n"
        "print(float(out.sum()))\n"
    )
    # testdev runs mul_ through its mul.out kernel: a fault in it fails both.
    for fault, ops in [("", set()), ("aten::mul=scale:1.001", {"aten::mul_", "aten::mul"}),
                       ("aten::exp=scale:1.001", {"aten::exp"})]:
        d = tmp_path / (fault.split("=")[0].replace(":", "_") or "clean")
        e = clean_env(OPDUMP="1", OPDUMP_DIR=d, LD_PRELOAD=LIB, OPDUMP_CHECK="mul|exp", TESTDEV_FAULT=fault)
        p = subprocess.run([sys.executable, "-c", job], env=e, capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        got = {r["op"]: r for r in checks(d)}
        assert {"aten::mul_", "aten::exp"} <= set(got), sorted(got)
        for name, r in got.items():
            expected = "fail" if name in ops else "pass"
            assert r["verdict"] == expected, (fault, r)
        # Against inputs as they were after the op, a correct mul_ would be
        # off by a factor of 3, and exp's out= would not matter: a pass of
        # the correct kernels proves the copies were taken before.
        assert got["aten::exp"]["overload"] == "out"


def test_the_byte_cap_and_the_time_budget_are_honoured_and_reported(tmp_path):
    # No call's tensors fit in 64 bytes: each signature is no_reference, counted.
    p, _, lines = tinylm("cpu", tmp_path / "cap", steps=1, OPDUMP_CHECK="1", OPDUMP_CHECK_MAX_BYTES="64")
    assert p.returncode == 0, p.stderr[-3000:]
    s = summary(tmp_path / "cap")
    big = [r for r in checks(tmp_path / "cap") if r["reason"] and "OPDUMP_CHECK_MAX_BYTES=64" in r["reason"]]
    assert s["skipped_bytes"] == len(big) > 10, s
    assert s["checked"] + s["no_reference"] == len(checks(tmp_path / "cap"))
    # A budget of almost nothing: after the first check, the rest is counted, not checked.
    p, _, lines = tinylm("cpu", tmp_path / "budget", steps=1, OPDUMP_CHECK="1", OPDUMP_CHECK_SECONDS="0.000001")
    assert p.returncode == 0, p.stderr[-3000:]
    s = summary(tmp_path / "budget")
    assert s["skipped_budget"] > 10 and s["checked"] <= 3, s
    assert any("OPDUMP_CHECK_SECONDS=" in l and "raise it" in l for l in lines), lines


@pytest.mark.parametrize("name,value", [
    ("OPDUMP_CHECK", "("),
    ("OPDUMP_CHECK_PER_SIGNATURE", "-1"),
    ("OPDUMP_CHECK_PER_SIGNATURE", "two"),
    ("OPDUMP_CHECK_MAX_BYTES", "-5"),
    ("OPDUMP_CHECK_SECONDS", "soon"),
    ("OPDUMP_CHECK_RECHECK", "-1"),
])
def test_bad_values_are_one_line_naming_the_variable(tmp_path, name, value):
    p, losses, lines = tinylm("cpu", tmp_path / "d", steps=1, **{"OPDUMP_CHECK": "1", name: value})
    assert p.returncode == 0 and losses, p.stderr[-2000:]
    assert any(l.startswith(f"opdump: {name}={value!r}".replace("'", '"')) for l in lines), lines
    assert not (tmp_path / "d" / "checks").exists()


def test_a_regex_that_matches_no_op_is_said_at_exit(tmp_path):
    p, losses, lines = tinylm("cpu", tmp_path / "d", steps=1, OPDUMP_CHECK="no_such_op")
    assert p.returncode == 0 and losses, p.stderr[-2000:]
    assert any("OPDUMP_CHECK matched no recorded op call" in l and "widen OPDUMP_INCLUDE" in l for l in lines), lines


def test_results_that_cannot_be_written_are_one_line_and_the_job_runs_on(tmp_path):
    d = tmp_path / "d"
    d.mkdir(mode=0o700)
    (d / "checks").write_text("not a directory")  # where the results would go
    _, off, _ = tinylm("cpu", tmp_path / "off", steps=1, OPDUMP="0")
    p, losses, lines = tinylm("cpu", d, steps=1, OPDUMP_CHECK="1")
    assert p.returncode == 0 and losses == off, p.stderr[-2000:]
    said = [l for l in lines if "cannot write the accuracy check's results" in l]
    assert len(said) == 1 and "Free space or fix the permissions under OPDUMP_DIR" in said[0], lines
    assert any("results could not be written" in l for l in lines), lines
