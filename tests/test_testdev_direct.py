"""testdev's direct kernels (no CPU fallback), how an observer sees them,
and the switches that turn them and the fused statistics kernel off. (The testdev test device:
tests/testdev/; shared helpers: tests/testdev_common.py.)

    .venv/bin/python -m pytest tests/test_testdev_direct.py -q
"""

from __future__ import annotations

import pytest
import torch

import tests.testdev as testdev
from testdev_common import D, bits_equal, device_randn, randn_inputs, run_python

# The fixtures these tests use (the first two autouse): imported, they apply here.
from testdev_common import _loaded as _loaded
from testdev_common import _no_faults as _no_faults
from testdev_common import no_gc as no_gc


def _direct_inputs():
    x, y = randn_inputs(40, (6, 5), (6, 5))
    special = x.clone()
    special[0, 0], special[1, 1], special[2, 2] = float("nan"), float("inf"), -float("inf")
    return {"x": x, "y": y, "special": special, "mask": x > y}


DIRECT_CASES = {
    "aten::_to_copy": lambda t: t["x"].to(torch.float64),
    "aten::abs": lambda t: t["x"].abs(),
    "aten::nan_to_num": lambda t: torch.nan_to_num(t["special"]),
    "aten::eq.Tensor": lambda t: t["x"] == t["y"],
    "aten::eq.Scalar": lambda t: t["x"] == t["x"][0, 0].item(),
    "aten::ne.Tensor": lambda t: t["x"] != t["y"],
    "aten::ne.Scalar": lambda t: t["x"] != 0.5,
    "aten::sum": lambda t: t["x"].sum(),
    "aten::sum.dim_IntList": lambda t: t["x"].sum(1),
    "aten::div.Tensor": lambda t: t["x"] / t["y"],
    "aten::sub.Tensor": lambda t: t["x"] - t["y"],
    "aten::mul.Tensor": lambda t: t["x"] * 2,  # a CPU scalar argument
    "aten::where.self": lambda t: torch.where(t["mask"], t["x"], t["y"]),
    "aten::var_mean.correction": lambda t: torch.var_mean(t["x"], dim=1),
    "aten::aminmax": lambda t: torch.aminmax(t["x"]),
    "aten::cat": lambda t: torch.cat([t["x"], t["y"]]),
    "aten::dot": lambda t: torch.dot(t["x"].flatten(), t["y"].flatten()),
    "aten::isnan": lambda t: t["special"].isnan(),
    "aten::isinf": lambda t: t["special"].isinf(),
    "aten::isposinf": lambda t: t["special"].isposinf(),
    "aten::isneginf": lambda t: t["special"].isneginf(),
    "aten::fill_.Scalar": lambda t: t["x"].clone().fill_(2.5),
    "aten::zero_": lambda t: t["x"].clone().zero_(),
    "aten::clone": lambda t: t["x"].t().clone(),
    "aten::amin": lambda t: t["x"].amin(0),
    "aten::amax": lambda t: t["x"].amax(1),
    "aten::min": lambda t: t["x"].min(),
    "aten::max": lambda t: t["x"].max(),
}


@pytest.mark.parametrize("op", sorted(DIRECT_CASES))
def test_direct_kernels_match_cpu_without_the_fallback(op):
    """The ops of a statistics measurement run their CPU kernel on the
    device's memory: results identical to the CPU, nothing reaches the
    fallback."""
    assert testdev.direct_enabled()
    fn = DIRECT_CASES[op]
    inputs = _direct_inputs()
    expected = fn(inputs)
    on_device = {k: v.to(D) for k, v in inputs.items()}
    testdev.trace(True)
    got = fn(on_device)
    assert op in testdev.traced_direct_ops()
    assert testdev.traced_ops() == {}
    expected, got = (expected, got) if isinstance(expected, tuple) else ((expected,), (got,))
    for g, e in zip(got, expected):
        assert g.device.type == D
        assert bits_equal(g, e)
        assert g.stride() == e.stride()


def test_direct_inplace_ops_return_their_argument(no_gc):
    x = device_randn(n=64)
    base = testdev.memory_allocated()
    assert x.fill_(1.5) is x
    assert torch.ops.aten.fill_.Scalar(x, 2.0) is x
    assert bits_equal(x, torch.full((64,), 2.0))
    assert x.zero_() is x
    assert bits_equal(x, torch.zeros(64))
    assert testdev.memory_allocated() == base


def test_direct_outputs_work_as_testdev_tensors():
    """Adopted outputs go on to the fallback, autograd and out= arguments."""
    x = device_randn(n=32, seed=3).requires_grad_()
    y = (x * x).sum()  # direct mul and sum
    y.backward()
    assert bits_equal(x.grad, 2 * x.detach())
    a = x.detach().abs()
    torch.exp(a, out=a)  # the fallback writes into an adopted output
    assert bits_equal(a, x.detach().cpu().abs().exp())


def test_copies_to_the_host_keep_their_generic_path():
    """x.to("cpu") is _to_copy(device=cpu): not a direct kernel, it still
    ends in _copy_from, a launch and a host wait."""
    x = device_randn(n=16)
    testdev.set_job_thread()
    testdev.reset_counters()
    testdev.trace(True)
    y = x.to("cpu", torch.float64)
    assert y.device.type == "cpu" and bits_equal(y, x.cpu().double())
    assert testdev.traced_direct_ops() == {}
    assert testdev.launches()["job"] == 2 and testdev.host_waits()["job"] == 2


def test_faults_apply_to_direct_ops_as_on_the_fallback():
    x = device_randn(n=100)
    clean_abs, clean_sum, clean_rows = x.abs(), x.sum(), x.reshape(10, 10).sum(1)
    testdev.set_fault("abs=scale:2;sum=scale:3;fill=scale:2")
    assert bits_equal(x.abs(), clean_abs * 2)
    assert bits_equal(x.sum(), clean_sum * 3)
    assert bits_equal(x.reshape(10, 10).sum(1), clean_rows * 3)  # every overload
    y = x.clone()
    y.fill_(1.5)  # in place: the argument itself is changed
    assert bits_equal(y, torch.full((100,), 3.0))
    assert testdev.fault_counts() == {"aten::abs": 1, "aten::sum": 2, "aten::fill": 1}
    assert bits_equal(testdev.call_unobserved("aten::abs", x), clean_abs)  # observers are not faulted
    assert testdev.fault_counts()["aten::abs"] == 1
    testdev.set_fault("sum=noise:1e-3:4")
    noisy = x.sum()
    testdev.set_fault("sum=noise:1e-3:4")
    assert bits_equal(x.sum(), noisy) and not bits_equal(noisy, clean_sum)


def test_direct_kernels_can_be_switched_off():
    res = run_python(
        """
        testdev.load()
        x = torch.randn(50).to("testdev")
        testdev.trace(True)
        s, a = x.sum(), x.abs()
        print(testdev.direct_enabled(), testdev.traced_direct_ops(), sorted(testdev.traced_ops()))
        print(torch.equal(s.cpu(), x.cpu().sum()), torch.equal(a.cpu(), x.cpu().abs()))
        """,
        TESTDEV_DIRECT="0",
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        "False {} ['aten::abs.out', 'aten::sum.IntList_out']",
        "True True",
    ]


def test_an_observer_sees_a_direct_op_once_on_testdev(run):
    """The dispatcher calls of a direct kernel's CPU kernel (clone's
    empty_like and copy_, sum's sum.dim_IntList) work on host aliases: an
    observer does not see them."""
    job = run(
        """
        x = torch.randn(8, 8).to("testdev")
        torch.ops.opdump.enable()
        y = x.t().clone()
        s = x.sum()
        torch.ops.opdump.flush()
        print(json.dumps(1))
        """,
        testdev=True,
    )
    assert job.returncode == 0, job.stderr
    t = job.table()
    ops = set(zip(t.op, t.overload))
    assert {("aten::clone", "default"), ("aten::sum", "default")} <= ops, ops
    assert ("aten::sum", "dim_IntList") not in ops and "aten::copy_" not in set(t.op)
    elsewhere = t[t.tensor_device != "testdev:0"]
    assert elsewhere.empty, elsewhere[["op", "overload", "depth", "tensor_device"]]


def test_hidden_fallback_shows_an_observer_each_op_once(run):
    """TESTDEV_HIDE_FALLBACK=1: the fallback's copies to the host and back and
    the CPU kernel's own calls are hidden, as inside a device's own kernel;
    the results and the faults are the same."""
    code = """
    testdev.set_fault("aten::gelu=scale:2")
    torch.manual_seed(0)
    x = torch.randn(16, 8).to("testdev")
    torch.ops.opdump.enable()
    y = torch.nn.functional.gelu(x) + x.cos()
    torch.ops.opdump.disable()
    torch.ops.opdump.flush()
    print(json.dumps({"y": y.cpu().tolist(), "hidden": testdev.fallback_hidden(), "fired": testdev.fault_counts()}))
    """
    shown, hidden = run(code, testdev=True), run(code, testdev=True, TESTDEV_HIDE_FALLBACK="1")
    assert shown.returncode == 0 and hidden.returncode == 0, (shown.stderr, hidden.stderr)
    a, b = shown.result(), hidden.result()
    assert (a["hidden"], b["hidden"]) == (False, True)
    assert a["y"] == b["y"] and a["fired"] == b["fired"] == {"aten::gelu": 1}
    ops_shown, ops_hidden = set(shown.table().op), set(hidden.table().op)
    assert {"aten::_to_cpu", "aten::_copy_from_and_resize"} <= ops_shown, ops_shown
    # The ops themselves, and the allocation of their outputs on testdev.
    assert ops_hidden == {"aten::gelu", "aten::cos", "aten::add", "aten::empty"}, ops_hidden
    assert set(hidden.table().tensor_device) == {"testdev:0"}


def test_fused_statistics_kernel_can_be_switched_off_and_bad_switches_raise():
    res = run_python(
        """
        testdev.load()
        print(testdev.fused_stats_enabled(), testdev.fallback_hidden())
        """,
        TESTDEV_FUSED_STATS="0",
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False False"
    res = run_python(
        """
        try:
            testdev.load()
        except ValueError as e:
            print("ValueError:", e)
        print(testdev.fused_stats_enabled(), testdev.fallback_hidden())
        """,
        TESTDEV_FUSED_STATS="off",
        TESTDEV_HIDE_FALLBACK="yes",
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("ValueError: testdev: bad environment:")
    assert 'TESTDEV_FUSED_STATS="off"' in lines[0] and 'TESTDEV_HIDE_FALLBACK="yes"' in lines[0]
    assert lines[1] == "True False"  # the bad ones keep their defaults
