"""testdev's planted faults (TESTDEV_FAULT, testdev.set_fault): scale, noise
and permute on chosen ops, forward and backward, and what they leave alone. (The testdev test device:
tests/testdev/; shared helpers: tests/testdev_common.py.)

    .venv/bin/python -m pytest tests/test_testdev_faults.py -q
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tests.testdev as testdev
from testdev_common import CONV_CASES, D, bits_equal, device_randn, randn_inputs, run, run_python

# The fixtures these tests use (the first two autouse): imported, they apply here.
from testdev_common import _loaded as _loaded
from testdev_common import _no_faults as _no_faults


@pytest.mark.parametrize("factor", [2.0, 1.01])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scale_multiplies_exactly(factor, dtype):
    x = device_randn(dtype=dtype)
    clean = F.gelu(x)
    testdev.set_fault(f"aten::gelu=scale:{factor}")
    faulted = F.gelu(x)
    assert bits_equal(faulted, clean * factor)
    assert not bits_equal(faulted, clean)
    assert testdev.fault_counts() == {"aten::gelu": 1}


def test_fault_covers_out_and_inplace_overloads():
    a, b = device_randn(seed=1), device_randn(seed=2)
    clean = a + b
    testdev.set_fault("add=scale:3")
    out = torch.empty_like(a)
    torch.add(a, b, out=out)
    assert bits_equal(out, clean * 3)
    c = a.clone()
    c.add_(b)
    assert bits_equal(c, clean * 3)
    assert bits_equal(a + b, clean * 3)
    # x.relu_() is its own op (aten::relu_), covered by the fault on relu
    testdev.set_fault("relu=scale:2")
    r = a.clone().relu_()
    assert bits_equal(r, F.relu(a.cpu()) * 2)
    assert testdev.fault_counts() == {"aten::relu": 1}


def test_fault_leaves_other_ops_alone():
    x = device_randn(n=64 * 32).reshape(64, 32)
    w = device_randn(n=32 * 16, seed=1).reshape(32, 16)
    xc, wc = x.cpu(), w.cpu()
    for spec in ["gelu=scale:2", "gelu=noise:0.1:3", "gelu=permute:4"]:
        testdev.set_fault(spec)
        y = torch.tanh(x @ w).softmax(-1).exp() - x.sum()
        assert bits_equal(y, torch.tanh(xc @ wc).softmax(-1).exp() - xc.sum())
        assert testdev.fault_counts() == {"aten::gelu": 0}


def test_fault_leaves_integer_outputs_alone():
    i = torch.arange(10, device=D)
    testdev.set_fault("add=scale:2")
    assert bits_equal(i + i, torch.arange(10) * 2)  # not 4x: integer outputs untouched
    assert testdev.fault_counts() == {"aten::add": 0}


def test_noise_has_the_requested_relative_size_and_is_reproducible():
    x = device_randn(n=100_000)
    clean = torch.exp(x)
    r = 1e-3
    testdev.set_fault(f"exp=noise:{r}:7")
    y1 = torch.exp(x)
    y1_again_later = torch.exp(x)  # a second firing draws fresh noise
    rel = ((y1 - clean).norm() / clean.norm()).item()
    assert 0.97 * r < rel < 1.03 * r
    # each element moved by at most R * sqrt(3) relative (u is uniform on [-sqrt3, sqrt3])
    assert ((y1 / clean - 1).abs().max().item()) <= r * 3**0.5 * (1 + 1e-3) + 1e-6
    assert not bits_equal(y1_again_later, y1)
    testdev.set_fault(f"exp=noise:{r}:7")  # same seed, counts restart: same noise
    assert bits_equal(torch.exp(x), y1)
    testdev.set_fault(f"exp=noise:{r}:8")
    assert not bits_equal(torch.exp(x), y1)
    testdev.set_fault(f"exp=noise:{r}:7")
    torch.exp(x)
    testdev.reset_fault_counts()  # reset restarts the streams too
    assert bits_equal(torch.exp(x), y1)


def test_noise_in_bfloat16_keeps_dtype():
    x = device_randn(n=10_000, dtype=torch.bfloat16)
    clean = F.gelu(x)
    testdev.set_fault("gelu=noise:0.01:1")
    y = F.gelu(x)
    assert y.dtype == torch.bfloat16
    rel = ((y.float() - clean.float()).norm() / clean.float().norm()).item()
    assert 0.005 < rel < 0.02


def test_permute_preserves_values_not_order():
    x = device_randn(n=10_000)
    clean = F.gelu(x).cpu()
    testdev.set_fault("gelu=permute:5")
    y = F.gelu(x).cpu()
    assert bits_equal(y.sort().values, clean.sort().values)
    assert (y != clean).float().mean().item() > 0.99
    assert torch.equal(y.norm(), clean.norm()) or abs(y.norm().item() / clean.norm().item() - 1) < 1e-6
    testdev.set_fault("gelu=permute:5")
    assert bits_equal(F.gelu(x), y)
    testdev.set_fault("gelu=permute:6")
    assert not bits_equal(F.gelu(x), y)


def test_permute_on_a_strided_out_tensor():
    x = device_randn(n=200).reshape(10, 20)
    clean = torch.exp(x).cpu()
    out = torch.zeros(20, 10, device=D).t()  # non-contiguous destination
    testdev.set_fault("exp=permute")
    torch.exp(x, out=out)
    y = out.cpu()
    assert bits_equal(y.flatten().sort().values, clean.flatten().sort().values)
    assert not bits_equal(y, clean)


def test_counter_counts_every_call_and_resets():
    x = device_randn(n=16)
    testdev.set_fault("gelu=scale:1.5; aten::_softmax=scale:2")
    for _ in range(3):
        F.gelu(x)
    F.softmax(x, -1)
    assert testdev.fault_counts() == {"aten::gelu": 3, "aten::_softmax": 1}
    assert testdev.fault_spec() == "aten::gelu=scale:1.5;aten::_softmax=scale:2"
    testdev.reset_fault_counts()
    assert testdev.fault_counts() == {"aten::gelu": 0, "aten::_softmax": 0}
    testdev.set_fault(None)
    assert testdev.fault_counts() == {}


def test_composite_ops_never_reach_the_device():
    """linear and softmax are composite: a fault on them never fires; on their
    parts (addmm, _softmax) it does."""
    x, w, b = device_randn(n=24).reshape(4, 6), device_randn(n=18, seed=1).reshape(3, 6), device_randn(n=3, seed=2)
    lin, soft = F.linear(x, w, b), F.softmax(x, -1)
    testdev.set_fault("linear=scale:2;softmax=scale:2")
    assert bits_equal(F.linear(x, w, b), lin)
    assert bits_equal(F.softmax(x, -1), soft)
    assert testdev.fault_counts() == {"aten::linear": 0, "aten::softmax": 0}
    testdev.set_fault("addmm=scale:2;_softmax=scale:2")
    assert bits_equal(F.linear(x, w, b), lin * 2)
    assert bits_equal(F.softmax(x, -1), soft * 2)
    assert testdev.fault_counts() == {"aten::addmm": 1, "aten::_softmax": 1}


def test_fault_applies_in_backward_on_the_device_thread():
    x = device_randn(n=100)
    _, (clean_grad,) = run(F.gelu, [x], D)
    testdev.set_fault("gelu_backward=scale:2")
    _, (grad,) = run(F.gelu, [x], D)
    assert bits_equal(grad, clean_grad * 2)
    assert testdev.fault_counts() == {"aten::gelu_backward": 1}


@pytest.mark.parametrize("case", ["conv1d", "conv2d", "depthwise"])
def test_fault_on_convolution_forward_and_backward(case):
    """A convolution reaches the device as convolution_overrideable, its
    backward as convolution_backward_overrideable: faults name those.
    aten::convolution itself has a generic kernel and never reaches it."""
    fn, make = CONV_CASES[case]
    out_c, grads_c = run(fn, make(), D)
    testdev.set_fault("convolution=scale:2;convolution_backward=scale:2")
    out, grads = run(fn, make(), D)
    assert bits_equal(out, out_c) and all(bits_equal(g, gc) for g, gc in zip(grads, grads_c))
    assert testdev.fault_counts() == {"aten::convolution": 0, "aten::convolution_backward": 0}

    testdev.set_fault("convolution_overrideable=scale:2")
    out, grads = run(fn, make(), D)
    assert bits_equal(out, out_c * 2)
    # The backward does not read the forward's output: the gradients stay clean.
    assert all(bits_equal(g, gc) for g, gc in zip(grads, grads_c))
    assert testdev.fault_counts() == {"aten::convolution_overrideable": 1}

    testdev.set_fault("convolution_backward_overrideable=scale:2")
    out, grads = run(fn, make(), D)
    assert bits_equal(out, out_c)
    for g, g_cpu in zip(grads, grads_c):  # input, weight and bias
        assert bits_equal(g, g_cpu * 2)
    assert testdev.fault_counts() == {"aten::convolution_backward_overrideable": 1}


def test_fault_on_batch_norm_forward_and_backward():
    """native_batch_norm's outputs include the running statistics it updates."""
    (x,) = randn_inputs(11, (4, 3, 5, 5))
    x = x.to(D)
    bn = nn.BatchNorm2d(3).to(D)
    clean = bn(x)
    clean_mean, clean_var = bn.running_mean.clone(), bn.running_var.clone()
    bn.reset_running_stats()
    testdev.set_fault("native_batch_norm=scale:2")
    assert bits_equal(bn(x), clean * 2)
    assert bits_equal(bn.running_mean, clean_mean * 2) and bits_equal(bn.running_var, clean_var * 2)
    assert testdev.fault_counts() == {"aten::native_batch_norm": 1}

    def fn(x, w, b):
        return F.batch_norm(x, None, None, w, b, training=True)

    inputs = [x] + randn_inputs(12, (3,), (3,))
    testdev.set_fault(None)
    out_c, grads_c = run(fn, inputs, D)
    testdev.set_fault("native_batch_norm_backward=scale:2")
    out, grads = run(fn, inputs, D)
    assert bits_equal(out, out_c)
    for g, g_cpu in zip(grads, grads_c):
        assert bits_equal(g, g_cpu * 2)
    assert testdev.fault_counts() == {"aten::native_batch_norm_backward": 1}


def test_observer_bookkeeping_is_not_faulted():
    """Ops run with TESTING_ONLY_GenericMode excluded (how opdump computes its
    statistics) are left alone."""
    x = device_randn(n=100)
    clean = F.gelu(x)
    testdev.set_fault("gelu=scale:2")
    assert bits_equal(testdev.call_unobserved("aten::gelu", x), clean)
    assert testdev.fault_counts() == {"aten::gelu": 0}
    assert bits_equal(F.gelu(x), clean * 2)


def test_trace_lists_the_ops_that_reach_the_device():
    x = device_randn(n=12).reshape(3, 4)
    testdev.trace(True)
    F.gelu(x)
    F.linear(x, x)
    traced = testdev.traced_ops()
    assert traced.get("aten::gelu.out") == 1
    assert traced.get("aten::mm.out") == 1
    assert not any(name.startswith("aten::linear") for name in traced)
    testdev.trace(False)
    F.gelu(x)
    assert testdev.traced_ops() == {}


@pytest.mark.parametrize(
    "spec, message",
    [
        ("gelu", "no '='"),
        ("gelu=", "unknown fault kind"),
        ("=scale:2", "no op name"),
        ("gelu=scale", "exactly one value"),
        ("gelu=scale:abc", "not a finite number"),
        ("gelu=scale:inf", "not a finite number"),
        ("gelu=scale:2:3", "exactly one value"),
        ("gelu=noise:-1", "must be > 0"),
        ("gelu=noise:1e-3:x", "not a non-negative integer"),
        ("gelu=permute:1:2", "permute takes"),
        ("gelu=explode:2", "unknown fault kind"),
        ("aten::gelu.out=scale:2", "without an overload"),
        ("gelux=scale:2", "no operator aten::gelux"),
        ("ge lu=scale:2", "not an op name"),
        ("gelu=scale:2;gelu_=scale:3", "a second fault on aten::gelu"),
    ],
)
def test_bad_spec_raises_and_keeps_the_active_faults(spec, message):
    testdev.set_fault("exp=scale:2")
    with pytest.raises(ValueError, match=message):
        testdev.set_fault(spec)
    assert testdev.fault_spec() == "aten::exp=scale:2"


def test_fault_context_manager_restores():
    testdev.set_fault("exp=scale:2")
    with testdev.fault("gelu=permute:1"):
        assert testdev.fault_spec() == "aten::gelu=permute:1"
    assert testdev.fault_spec() == "aten::exp=scale:2"


def test_env_var_is_read_at_load():
    res = run_python(
        """
        testdev.load()
        x = torch.randn(50).to("testdev")
        clean = F.gelu(x.cpu())
        y = F.gelu(x)
        torch.exp(x)
        print(testdev.fault_spec())
        print(torch.equal(y.cpu(), clean * 2), testdev.fault_counts())
        """,
        "aten::gelu=scale:2 ; exp=noise:1e-3:5;",
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == [
        "aten::gelu=scale:2;aten::exp=noise:0.001:5",
        "True {'aten::gelu': 1, 'aten::exp': 1}",
    ]


def test_bad_env_var_raises_at_load():
    res = run_python(
        """
        try:
            testdev.load()
        except ValueError as e:
            print("ValueError:", e)
        print(testdev.fault_counts())
        """,
        "gelu=scale:2;exp=wobble",
    )
    assert res.returncode == 0, res.stderr
    assert 'ValueError: testdev: bad TESTDEV_FAULT' in res.stdout
    assert 'unknown fault kind "wobble"' in res.stdout
    assert res.stdout.splitlines()[-1] == "{}"  # nothing half-applied


def test_second_copy_from_another_path_stays_inert(tmp_path):
    """Loading the library again from another path must not abort the process
    (two fallbacks on one dispatch key abort inside dlopen)."""
    copy = tmp_path / "libtestdev-copy.so"
    copy.write_bytes(testdev.library_path().read_bytes())
    res = run_python(
        f"""
        testdev.load()
        torch.ops.load_library({str(copy)!r})
        print(F.gelu(torch.ones(2).to("testdev")).cpu().tolist())
        """,
        "",
    )
    assert res.returncode == 0, res.stderr
    assert "another copy of libtestdev is already loaded" in res.stderr
    assert res.stdout.strip() == str(F.gelu(torch.ones(2)).tolist())


def test_build_is_idempotent():
    from tests.testdev import build

    lib = build.build()
    before = lib.stat().st_mtime_ns
    assert build.build() == lib
    assert lib.stat().st_mtime_ns == before
