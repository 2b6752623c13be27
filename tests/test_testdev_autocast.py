"""torch.autocast on testdev (tests/testdev/autocast.cpp): the policy PyTorch
shares between its accelerators, checked against the same ops computed on
the CPU in the dtypes the policy names.

    .venv/bin/python -m pytest tests/test_testdev_autocast.py -q
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import tests.testdev as testdev  # noqa: E402

D = "testdev"


@pytest.fixture(scope="module", autouse=True)
def _loaded():
    testdev.load()


def inputs():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 16, generator=g)
    w = torch.randn(8, 16, generator=g, requires_grad=True)
    b = torch.randn(8, generator=g, requires_grad=True)
    return x, w, b


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_linear_runs_in_the_autocast_dtype_and_softmax_in_float32(dtype):
    x, w, b = inputs()
    wd, bd = (t.detach().to(D).requires_grad_() for t in (w, b))
    with torch.autocast(device_type=D, dtype=dtype):
        y = F.linear(x.to(D), wd, bd)
        p = torch.softmax(y, dim=-1)
    assert y.dtype == dtype and p.dtype == torch.float32
    # The CPU, with the casts written out: the same numbers, bit for bit,
    # forward and backward (the gradients flow back through the casts).
    y_ref = F.linear(x.to(dtype), w.to(dtype), b.to(dtype))
    p_ref = torch.softmax(y_ref.float(), dim=-1)
    assert torch.equal(y.cpu(), y_ref)
    assert torch.equal(p.cpu(), p_ref)
    p.square().sum().backward()
    p_ref.square().sum().backward()
    assert wd.grad.dtype == torch.float32 and wd.grad.device.type == D
    assert torch.equal(wd.grad.cpu(), w.grad) and torch.equal(bd.grad.cpu(), b.grad)


def test_autocast_off_outside_the_block_and_for_cpu_tensors():
    x, w, b = inputs()
    with torch.autocast(device_type=D, dtype=torch.bfloat16):
        on_cpu = F.linear(x, w, b)  # only testdev tensors are autocast here
    assert on_cpu.dtype == torch.float32
    assert F.linear(x.to(D), w.to(D), b.to(D)).dtype == torch.float32


def test_device_module_answers_amp_questions():
    assert torch.bfloat16 in torch.testdev.get_amp_supported_dtype()
    assert torch.testdev.is_bf16_supported()
    assert torch.amp.is_autocast_available(D)
