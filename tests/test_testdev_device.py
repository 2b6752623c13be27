"""testdev itself: tensors, views, modules and saved files on the device. (The testdev test device:
tests/testdev/; shared helpers: tests/testdev_common.py.)

    .venv/bin/python -m pytest tests/test_testdev_device.py -q
"""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from testdev_common import D, bits_equal

# The fixtures these tests use (the first two autouse): imported, they apply here.
from testdev_common import _loaded as _loaded
from testdev_common import _no_faults as _no_faults


@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.bool, torch.complex64]
)
def test_round_trip(dtype):
    torch.manual_seed(0)
    x = (torch.randn(3, 5) * 10).to(dtype)
    y = x.to(D)
    assert y.device == torch.device(D, 0)
    assert y.is_testdev
    assert bits_equal(y.cpu(), x)
    # non-contiguous source and device -> device copy
    t = x.t().to(D)
    assert bits_equal(t.cpu(), x.t())
    assert bits_equal(t.clone().cpu(), x.t())
    assert bits_equal(x.testdev().cpu(), x)


def test_factories_and_item():
    assert bits_equal(torch.ones(2, 3, device=D).cpu(), torch.ones(2, 3))
    assert bits_equal(torch.arange(6, device=D).cpu(), torch.arange(6))
    assert torch.tensor(2.5, device=D).item() == 2.5
    assert torch.full((2,), 7, device=D).sum().item() == 14
    e = torch.empty(4, 5, device=D)
    assert e.shape == (4, 5) and e.device.type == D
    with pytest.raises(RuntimeError, match="single device"):
        torch.empty(2, device=torch.device(D, 1))


def test_views_alias_their_base():
    a = torch.zeros(4, 4, device=D)
    a.view(16)[0] = 1
    a.t()[0, 1] = 2  # a[1, 0]
    a.unfold(1, 2, 2)[2, 0, 1] = 3  # a[2, 1]
    a.diagonal()[3] = 4
    a[:, 3].add_(10)
    expected = torch.zeros(4, 4)
    expected[0, 0], expected[1, 0], expected[2, 1], expected[3, 3] = 1, 2, 3, 4
    expected[:, 3] += 10
    assert bits_equal(a.cpu(), expected)
    c = torch.zeros(3, dtype=torch.complex64, device=D)
    torch.view_as_real(c)[1, 1] = 5
    assert c[1].item() == 5j


def test_module_to_device_and_state_dict():
    torch.manual_seed(0)
    m = nn.Linear(3, 2)
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    m.to(D)
    assert all(p.device.type == D for p in m.parameters())
    assert all(bits_equal(m.state_dict()[k], v) for k, v in sd.items())
    m.cpu()
    assert all(p.device.type == "cpu" for p in m.parameters())


def test_save_and_load_keep_the_device():
    import io

    x = torch.randn(3, 4).to(D)
    buf = io.BytesIO()
    torch.save({"x": x}, buf)
    buf.seek(0)
    y = torch.load(buf)["x"]
    assert y.device == torch.device(D, 0) and bits_equal(y, x)
    buf.seek(0)
    assert bits_equal(torch.load(buf, map_location="cpu")["x"], x.cpu())
