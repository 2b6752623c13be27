"""What the tests of the testdev test device share (tests/test_testdev_*.py):
the device loaded once per module and its faults, trace and costs reset
around each test (both autouse fixtures: a test file imports them), and the
helpers that run a function on the device and on the CPU.

The first load builds tests/testdev/build/libtestdev.so (about a minute).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import tests.testdev as testdev  # noqa: E402 - after ROOT joins sys.path

D = "testdev"


@pytest.fixture(scope="module", autouse=True)
def _loaded():
    testdev.load()


@pytest.fixture(autouse=True)
def _no_faults():
    testdev.set_fault(None)
    yield
    testdev.set_fault(None)
    testdev.trace(False)
    testdev.set_costs(sync_us=0, launch_us=0)
    if testdev.capturing():
        torch.ops.testdev.capture_end()


def bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Same dtype, shape and values (NaN equal to NaN), on any devices."""
    a, b = a.detach().cpu(), b.detach().cpu()
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def run(fn, inputs, device):
    """fn on copies of inputs moved to device (float ones requiring grad);
    returns the output and the gradients of sum(output * fixed weights)."""
    xs = []
    for x in inputs:
        x = x.detach().to(device, copy=True)
        if x.is_floating_point():
            x.requires_grad_()
        xs.append(x)
    out = fn(*xs)
    g = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).reshape(out.shape).to(device)
    (out * g).sum().backward()
    return out.detach().cpu(), [x.grad.cpu() if x.grad is not None else None for x in xs]


def randn_inputs(seed, *shapes, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=dtype) for s in shapes]


def batch_norm_train(x, w, b):
    """Batch norm in training mode over dim 1, updating running statistics."""
    c = x.shape[1]
    stats = torch.zeros(c, device=x.device), torch.ones(c, device=x.device)
    return F.batch_norm(x, *stats, w, b, training=True)


CONV_CASES = {
    "conv1d": (lambda x, w, b: F.conv1d(x, w, b, padding=1), lambda: randn_inputs(20, (4, 3, 20), (5, 3, 3), (5,))),
    "conv2d": (
        lambda x, w, b: F.conv2d(x, w, b, padding=1),
        lambda: randn_inputs(21, (2, 3, 9, 9), (4, 3, 3, 3), (4,)),
    ),
    "depthwise": (  # groups = channels
        lambda x, w, b: F.conv2d(x, w, b, padding=1, groups=6),
        lambda: randn_inputs(22, (2, 6, 9, 9), (6, 1, 3, 3), (6,)),
    ),
    "conv_transpose2d": (
        lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, output_padding=1),
        lambda: randn_inputs(23, (2, 4, 5, 5), (4, 3, 3, 3), (3,)),
    ),
    "conv3d": (lambda x, w, b: F.conv3d(x, w, b), lambda: randn_inputs(29, (2, 2, 5, 5, 5), (3, 2, 3, 3, 3), (3,))),
    "conv2d_float64": (
        lambda x, w: F.conv2d(x, w, stride=2),
        lambda: randn_inputs(24, (2, 3, 9, 9), (4, 3, 3, 3), dtype=torch.float64),
    ),
    "conv1d_bn1d": (
        lambda x, w, b, g, h: batch_norm_train(F.conv1d(x, w, b, stride=2, dilation=2), g, h),
        lambda: randn_inputs(25, (4, 3, 20), (5, 3, 3), (5,), (5,), (5,)),
    ),
    "conv2d_bn2d": (
        lambda x, w, b, g, h: batch_norm_train(F.conv2d(x, w, b), g, h),
        lambda: randn_inputs(26, (4, 3, 9, 9), (4, 3, 3, 3), (4,), (4,), (4,)),
    ),
    "depthwise_bn2d": (
        lambda x, w, g, h: batch_norm_train(F.conv2d(x, w, padding=1, groups=6), g, h),
        lambda: randn_inputs(27, (4, 6, 9, 9), (6, 1, 3, 3), (6,), (6,)),
    ),
}


def device_randn(n=4096, seed=0, dtype=torch.float32):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=dtype).to(D)


def run_python(code: str, env_fault: str = "", **env_vars: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TESTDEV_FAULT=env_fault, **env_vars)
    prelude = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
               "import torch, torch.nn.functional as F\nimport tests.testdev as testdev\n")
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=300
    )


@pytest.fixture
def no_gc():
    """Exact memory counts: no cycle collection frees an earlier test's
    tensors in the middle of this one."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()
