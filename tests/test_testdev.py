"""Tests of the testdev PrivateUse1 test device (tests/testdev/).

    .venv/bin/python -m pytest tests/test_testdev.py -q

The first run builds tests/testdev/build/libtestdev.so (about a minute).
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import tests.testdev as testdev  # noqa: E402
from conftest import LIB  # noqa: E402

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


# ---- the device ---------------------------------------------------------------


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


# ---- numerics against the CPU -------------------------------------------------


def _inputs(seed, *shapes, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(*s, generator=g, dtype=dtype) for s in shapes]


EXACT_CASES = {
    "matmul": (lambda a, b: a @ b, lambda: _inputs(1, (8, 16), (16, 4))),
    "linear": (lambda x, w, b: F.linear(x, w, b), lambda: _inputs(2, (8, 16), (4, 16), (4,))),
    "gelu": (F.gelu, lambda: _inputs(3, (8, 33))),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), lambda: _inputs(4, (8, 33))),
    "softmax": (lambda x: F.softmax(x, dim=-1), lambda: _inputs(5, (8, 33))),
    "masked_softmax": (
        lambda x: x.masked_fill(torch.triu(torch.ones(6, 6, dtype=torch.bool, device=x.device), 1),
                                float("-inf")).softmax(-1),
        lambda: _inputs(6, (2, 6, 6)),
    ),
    "cross_entropy": (
        lambda x: F.cross_entropy(x, torch.arange(8, device=x.device) % 5).reshape(1),
        lambda: _inputs(7, (8, 5)),
    ),
}


@pytest.mark.parametrize("case", sorted(EXACT_CASES))
def test_forward_backward_match_cpu_exactly(case):
    """These reach the device as the very ops the CPU runs: bit-identical."""
    fn, make = EXACT_CASES[case]
    out_c, grads_c = run(fn, make(), "cpu")
    out_d, grads_d = run(fn, make(), D)
    assert bits_equal(out_d, out_c)
    for g_dev, g_cpu in zip(grads_d, grads_c):
        assert bits_equal(g_dev, g_cpu)


def _bn(x, w, b):
    """Batch norm in training mode over dim 1, updating running statistics."""
    c = x.shape[1]
    stats = torch.zeros(c, device=x.device), torch.ones(c, device=x.device)
    return F.batch_norm(x, *stats, w, b, training=True)


CONV_CASES = {
    "conv1d": (lambda x, w, b: F.conv1d(x, w, b, padding=1), lambda: _inputs(20, (4, 3, 20), (5, 3, 3), (5,))),
    "conv2d": (lambda x, w, b: F.conv2d(x, w, b, padding=1), lambda: _inputs(21, (2, 3, 9, 9), (4, 3, 3, 3), (4,))),
    "depthwise": (  # groups = channels
        lambda x, w, b: F.conv2d(x, w, b, padding=1, groups=6),
        lambda: _inputs(22, (2, 6, 9, 9), (6, 1, 3, 3), (6,)),
    ),
    "conv_transpose2d": (
        lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, output_padding=1),
        lambda: _inputs(23, (2, 4, 5, 5), (4, 3, 3, 3), (3,)),
    ),
    "conv3d": (lambda x, w, b: F.conv3d(x, w, b), lambda: _inputs(29, (2, 2, 5, 5, 5), (3, 2, 3, 3, 3), (3,))),
    "conv2d_float64": (
        lambda x, w: F.conv2d(x, w, stride=2),
        lambda: _inputs(24, (2, 3, 9, 9), (4, 3, 3, 3), dtype=torch.float64),
    ),
    "conv1d_bn1d": (
        lambda x, w, b, g, h: _bn(F.conv1d(x, w, b, stride=2, dilation=2), g, h),
        lambda: _inputs(25, (4, 3, 20), (5, 3, 3), (5,), (5,), (5,)),
    ),
    "conv2d_bn2d": (
        lambda x, w, b, g, h: _bn(F.conv2d(x, w, b), g, h),
        lambda: _inputs(26, (4, 3, 9, 9), (4, 3, 3, 3), (4,), (4,), (4,)),
    ),
    "depthwise_bn2d": (
        lambda x, w, g, h: _bn(F.conv2d(x, w, padding=1, groups=6), g, h),
        lambda: _inputs(27, (4, 6, 9, 9), (6, 1, 3, 3), (6,), (6,)),
    ),
}

POOL_CASES = {
    "max_pool2d": (lambda x: F.max_pool2d(x, 3, 2, 1), "aten::max_pool2d_with_indices.out"),
    "avg_pool2d": (lambda x: F.avg_pool2d(x, 3, 2, 1), "aten::avg_pool2d.out"),
    "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, 3), "aten::_adaptive_avg_pool2d"),
    "adaptive_avg_pool2d_1": (lambda x: F.adaptive_avg_pool2d(x, 1), "aten::mean.out"),
}


@pytest.mark.parametrize("case", sorted(CONV_CASES))
def test_convolutions_match_cpu_exactly(case):
    """Convolutions reach the device as PyTorch's hooks for out-of-tree
    devices, which testdev runs as the CPU's convolution: bit-identical,
    forward and every gradient."""
    fn, make = CONV_CASES[case]
    testdev.trace(True)
    out_d, grads_d = run(fn, make(), D)
    traced = testdev.traced_ops()
    out_c, grads_c = run(fn, make(), "cpu")
    assert traced.get("aten::convolution_overrideable") == 1
    assert traced.get("aten::convolution_backward_overrideable") == 1
    assert bits_equal(out_d, out_c)
    assert all(g is not None for g in grads_c)
    for g_dev, g_cpu in zip(grads_d, grads_c):
        assert bits_equal(g_dev, g_cpu)


@pytest.mark.parametrize("case", sorted(POOL_CASES))
def test_pooling_matches_cpu_exactly(case):
    fn, op = POOL_CASES[case]
    inputs = _inputs(28, (2, 3, 8, 8))
    testdev.trace(True)
    out_d, grads_d = run(fn, inputs, D)
    assert op in testdev.traced_ops()
    out_c, grads_c = run(fn, inputs, "cpu")
    assert bits_equal(out_d, out_c) and bits_equal(grads_d[0], grads_c[0])


@pytest.mark.parametrize(
    "norm, shape", [(nn.BatchNorm1d, (8, 4)), (nn.BatchNorm1d, (8, 4, 6)), (nn.BatchNorm2d, (4, 4, 5, 5))]
)
def test_batch_norm_matches_cpu_with_its_running_statistics(norm, shape):
    """native_batch_norm updates running_mean/var in place though its schema
    does not say so: they must move on testdev as on the CPU."""
    (x,) = _inputs(9, shape)
    x = x * 2 + 3  # statistics far from the initial 0 and 1, so a missed update shows

    def train_then_eval(device):
        torch.manual_seed(0)
        bn = norm(4).to(device)
        with torch.no_grad():
            bn.weight.uniform_(0.5, 1.5)
            bn.bias.uniform_(-1, 1)
        out, grads = run(bn, [x], device)
        bn(x.to(device))
        bn.eval()
        return bn, out, grads, bn(x.to(device))

    bn_d, out_d, grads_d, eval_d = train_then_eval(D)
    bn_c, out_c, grads_c, eval_c = train_then_eval("cpu")
    assert bits_equal(out_d, out_c) and bits_equal(grads_d[0], grads_c[0])
    assert bits_equal(bn_d.weight.grad, bn_c.weight.grad) and bits_equal(bn_d.bias.grad, bn_c.bias.grad)
    assert not bits_equal(bn_c.running_mean, torch.zeros(4))
    for name, v in bn_c.state_dict().items():
        assert bits_equal(bn_d.state_dict()[name], v), name
    assert bits_equal(eval_d, eval_c)


def test_native_batch_norm_legit_matches_cpu():
    """The functional batch norm op (what decompositions and export use) marks
    its running statistics as written."""
    x, w, b = _inputs(10, (4, 3, 5, 5), (3,), (3,))

    def go(device):
        stats = [torch.zeros(3, device=device), torch.ones(3, device=device)]
        out = torch.ops.aten._native_batch_norm_legit(
            x.to(device), w.to(device), b.to(device), *stats, True, 0.1, 1e-5
        )
        return list(out) + stats

    for td, tc in zip(go(D), go("cpu")):
        assert bits_equal(td, tc)


def _row_ulps(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest difference in units of the dtype's eps times the row's largest magnitude."""
    a64, b64 = a.double(), b.double()
    scale = torch.maximum(a64.abs(), b64.abs()).amax(-1, keepdim=True)
    return ((a64 - b64).abs() / (torch.finfo(a.dtype).eps * scale)).max().item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_close_to_cpu(dtype):
    """LayerNorm's forward has a generic kernel, so testdev runs it decomposed:
    close to the CPU kernel, not always identical (a realistic device gap)."""
    x, w, b = _inputs(8, (16, 64), (64,), (64,), dtype=dtype)

    def fn(x, w, b):
        return F.layer_norm(x, (64,), w, b)

    testdev.trace(True)
    out_d, grads_d = run(fn, [x, w, b], D)
    traced = testdev.traced_ops()
    out_c, grads_c = run(fn, [x, w, b], "cpu")
    assert "aten::native_layer_norm" not in traced and "aten::native_batch_norm" in traced
    assert _row_ulps(out_d, out_c) <= 4
    for g_dev, g_cpu in zip(grads_d, grads_c):
        assert g_dev.dtype == g_cpu.dtype
        tol = 4 * torch.finfo(dtype).eps * g_cpu.double().abs().max().item()
        assert (g_dev.double() - g_cpu.double()).abs().max().item() <= tol


def test_backward_runs_on_the_device_thread():
    threads = []
    x = torch.randn(5, device=D, requires_grad=True)
    y = x * 3
    y.register_hook(lambda g: threads.append(threading.get_ident()))
    y.sum().backward()
    assert threads and threads[0] != threading.get_ident()
    assert x.grad.device.type == D
    assert bits_equal(x.grad, torch.full((5,), 3.0))


def test_streams_and_events_are_noops():
    """Work is synchronous: one default stream, events complete at once."""
    mod = torch.get_device_module(D)
    assert (mod.is_available(), mod.device_count(), mod.current_device()) == (True, 1, 0)
    s = torch.Stream(device=D)
    assert s.device == torch.device(D, 0)
    e = torch.Event(device=D)
    e.record(s)
    assert e.query()
    e.synchronize()
    s.wait_event(e)
    s.synchronize()
    assert s.query()
    mod.synchronize()


def test_random_ops_follow_the_cpu_generator():
    torch.manual_seed(123)
    a = torch.randn(100, device=D)
    torch.manual_seed(123)
    assert bits_equal(a, torch.randn(100))
    # dropout reaches the device and keeps or doubles each element
    y = F.dropout(torch.ones(1000, device=D), p=0.5, training=True).cpu()
    assert set(y.unique().tolist()) == {0.0, 2.0}
    # an explicit testdev generator draws like a CPU one with the same seed
    g = torch.Generator(device=D).manual_seed(7)
    gc = torch.Generator().manual_seed(7)
    for _ in range(2):  # the generator's state advances
        assert bits_equal(torch.rand(10, device=D, generator=g), torch.rand(10, generator=gc))


class _TinyLM(nn.Module):
    def __init__(self, vocab=40, d=32):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.proj = nn.Linear(4 * d, d)
        self.head = nn.Linear(d, vocab)

    def forward(self, idx):
        x = self.emb(idx)
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        t = idx.shape[1]
        mask = torch.triu(torch.ones(t, t, dtype=torch.bool, device=idx.device), 1)
        att = (q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5).masked_fill(mask, float("-inf")).softmax(-1)
        x = x + att @ v
        x = x + self.proj(F.gelu(self.fc(self.ln2(x))))
        return self.head(x)


def _train(device, steps=25):
    torch.manual_seed(0)
    model = _TinyLM()
    data = torch.randint(0, 40, (8, 12))
    model.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    idx, tgt = data[:, :-1].to(device), data[:, 1:].to(device)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(idx).flatten(0, 1), tgt.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses


def test_small_model_trains_with_adamw_like_cpu():
    model_d, losses_d = _train(D)
    model_c, losses_c = _train("cpu")
    assert all(p.device.type == D for p in model_d.parameters())
    assert losses_d[-1] < 0.7 * losses_d[0]
    # LayerNorm runs decomposed on testdev: the runs agree closely, not bitwise.
    assert max(abs(a - b) for a, b in zip(losses_d, losses_c)) < 1e-3
    for pd, pc in zip(model_d.parameters(), model_c.parameters()):
        # Adam moves a parameter by about lr per step whatever the gradient's
        # size, so tiny gradient differences show up as up to ~lr apart.
        torch.testing.assert_close(pd.detach().cpu(), pc.detach(), rtol=0, atol=3e-3)


class _TinyCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.bn2 = nn.BatchNorm2d(8)
        self.pointwise = nn.Conv2d(8, 16, 1)
        self.conv1d = nn.Conv1d(16, 16, 3, padding=1)
        self.bn3 = nn.BatchNorm1d(16)
        self.head = nn.Linear(16, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv(x))), 2)
        x = F.avg_pool2d(F.relu(self.bn2(self.depthwise(x))), 2)
        x = F.relu(self.bn3(self.conv1d(self.pointwise(x).flatten(2))))
        return self.head(F.adaptive_avg_pool1d(x, 1).flatten(1))


def _train_cnn(device, steps=3):
    torch.manual_seed(0)
    model = _TinyCNN()
    x, y = torch.randn(8, 3, 16, 16), torch.randint(0, 10, (8,))
    model.to(device)
    x, y = x.to(device), y.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return model, losses


def test_small_cnn_trains_like_cpu_bitwise():
    """Convolutions (1-d, 2-d, depthwise), BatchNorm, pooling: every op runs
    the CPU's kernel, so training matches the CPU bit for bit, running
    statistics included."""
    model_d, losses_d = _train_cnn(D)
    model_c, losses_c = _train_cnn("cpu")
    assert losses_d == losses_c and losses_c[-1] < losses_c[0]
    state_d = model_d.state_dict()
    for name, v in model_c.state_dict().items():
        assert state_d[name].device.type == D
        assert bits_equal(state_d[name], v), name


class _TiedLM(nn.Module):
    """An embedding and an LM head that share one Parameter."""

    def __init__(self, vocab=30, d=16):
        super().__init__()
        self.emb = nn.Embedding(vocab, d)
        self.fc = nn.Linear(d, d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.emb.weight

    def forward(self, idx):
        return self.head(torch.tanh(self.fc(self.emb(idx))))


def test_module_to_device_keeps_tied_weights():
    """Module._apply keeps each Parameter (param.data = moved) only when the
    CPU and testdev tensors are shallow-copy compatible; testdev says they
    are, as PyTorch leaves PrivateUse1 backends to say."""
    assert torch._has_compatible_shallow_copy_type(torch.zeros(1), torch.zeros(1, device=D))
    assert torch._has_compatible_shallow_copy_type(torch.zeros(1, device=D), torch.zeros(1))
    model = _TiedLM()
    tied, w = model.emb.weight, model.emb.weight.detach().clone()
    model.to(D)
    assert model.head.weight is model.emb.weight is tied
    assert tied.device.type == D and isinstance(tied, nn.Parameter) and bits_equal(tied, w)
    assert len(list(model.parameters())) == 3
    model.cpu()
    assert model.head.weight is model.emb.weight is tied and tied.device.type == "cpu"


def _train_tied(device, steps=2):
    torch.manual_seed(0)
    model = _TiedLM()
    idx = torch.randint(0, 30, (4, 9))
    model.to(device)
    idx = idx.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for _ in range(steps):
        loss = F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model


def test_tied_weights_train_like_cpu_bitwise():
    """Both uses of the shared weight add into one gradient and one update, as
    on the CPU. Untied copies would each get half of it and drift apart."""
    model_d, model_c = _train_tied(D), _train_tied("cpu")
    assert model_d.head.weight is model_d.emb.weight
    state_d = model_d.state_dict()
    for name, v in model_c.state_dict().items():
        assert bits_equal(state_d[name], v), name


# ---- planted faults -----------------------------------------------------------


def _x(n=4096, seed=0, dtype=torch.float32):
    return torch.randn(n, generator=torch.Generator().manual_seed(seed), dtype=dtype).to(D)


@pytest.mark.parametrize("factor", [2.0, 1.01])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_scale_multiplies_exactly(factor, dtype):
    x = _x(dtype=dtype)
    clean = F.gelu(x)
    testdev.set_fault(f"aten::gelu=scale:{factor}")
    faulted = F.gelu(x)
    assert bits_equal(faulted, clean * factor)
    assert not bits_equal(faulted, clean)
    assert testdev.fault_counts() == {"aten::gelu": 1}


def test_fault_covers_out_and_inplace_overloads():
    a, b = _x(seed=1), _x(seed=2)
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
    x = _x(n=64 * 32).reshape(64, 32)
    w = _x(n=32 * 16, seed=1).reshape(32, 16)
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
    x = _x(n=100_000)
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
    x = _x(n=10_000, dtype=torch.bfloat16)
    clean = F.gelu(x)
    testdev.set_fault("gelu=noise:0.01:1")
    y = F.gelu(x)
    assert y.dtype == torch.bfloat16
    rel = ((y.float() - clean.float()).norm() / clean.float().norm()).item()
    assert 0.005 < rel < 0.02


def test_permute_preserves_values_not_order():
    x = _x(n=10_000)
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
    x = _x(n=200).reshape(10, 20)
    clean = torch.exp(x).cpu()
    out = torch.zeros(20, 10, device=D).t()  # non-contiguous destination
    testdev.set_fault("exp=permute")
    torch.exp(x, out=out)
    y = out.cpu()
    assert bits_equal(y.flatten().sort().values, clean.flatten().sort().values)
    assert not bits_equal(y, clean)


def test_counter_counts_every_call_and_resets():
    x = _x(n=16)
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
    x, w, b = _x(n=24).reshape(4, 6), _x(n=18, seed=1).reshape(3, 6), _x(n=3, seed=2)
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
    x = _x(n=100)
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
    (x,) = _inputs(11, (4, 3, 5, 5))
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

    inputs = [x] + _inputs(12, (3,), (3,))
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
    x = _x(n=100)
    clean = F.gelu(x)
    testdev.set_fault("gelu=scale:2")
    assert bits_equal(testdev.call_unobserved("aten::gelu", x), clean)
    assert testdev.fault_counts() == {"aten::gelu": 0}
    assert bits_equal(F.gelu(x), clean * 2)


def test_trace_lists_the_ops_that_reach_the_device():
    x = _x(n=12).reshape(3, 4)
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


def _python(code: str, env_fault: str = "", **env_vars: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, TESTDEV_FAULT=env_fault, **env_vars)
    prelude = (f"import sys; sys.path.insert(0, {str(ROOT)!r})\n"
               "import torch, torch.nn.functional as F\nimport tests.testdev as testdev\n")
    return subprocess.run(
        [sys.executable, "-c", prelude + textwrap.dedent(code)], env=env, capture_output=True, text=True, timeout=300
    )


def test_env_var_is_read_at_load():
    res = _python(
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
    res = _python(
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
    res = _python(
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


# ---- what the device counts -----------------------------------------------------


@pytest.fixture
def no_gc():
    """Exact memory counts: no cycle collection frees an earlier test's
    tensors in the middle of this one."""
    gc.collect()
    gc.disable()
    yield
    gc.enable()


def test_memory_counts_allocations_frees_and_the_peak(no_gc):
    base = testdev.memory_allocated()
    testdev.reset_peak_memory_stats()
    assert testdev.max_memory_allocated() == base
    x = torch.empty(1000, device=D)
    y = torch.empty(250, dtype=torch.float64, device=D)
    assert testdev.memory_allocated() == base + 6000
    del x
    assert testdev.memory_allocated() == base + 2000
    assert testdev.max_memory_allocated() == base + 6000
    testdev.reset_peak_memory_stats()
    assert testdev.max_memory_allocated() == base + 2000
    y.resize_(500)  # a new block from the allocator, the old one given back
    assert testdev.memory_allocated() == base + 4000
    assert testdev.max_memory_allocated() == base + 6000  # both, during the copy
    mod = torch.get_device_module(D)
    assert mod.memory_allocated() == testdev.memory_allocated()
    assert mod.max_memory_allocated() == testdev.max_memory_allocated()
    del y
    assert testdev.memory_allocated() == base
    mod.reset_peak_memory_stats()
    assert testdev.max_memory_allocated() == base


def test_memory_counts_the_outputs_direct_kernels_adopt(no_gc):
    n = 1 << 16
    x = _x(n=n)
    base = testdev.memory_allocated()
    a = x.abs()  # the CPU kernel's output, adopted by the device without a copy
    s = x.sum()
    assert a.device.type == D and s.device.type == D
    assert testdev.memory_allocated() == base + 4 * n + 4
    del a, s
    assert testdev.memory_allocated() == base
    b = x.abs()
    b.resize_(2 * n)  # an adopted output grows like any testdev tensor
    assert testdev.memory_allocated() == base + 8 * n
    del b
    assert testdev.memory_allocated() == base


def test_host_waits_count_blocking_reads_and_synchronisations():
    x = _x(n=16)
    on_host = x.cpu()
    testdev.set_job_thread()
    testdev.reset_counters()

    def waits_after(fn):
        fn()
        return testdev.host_waits()["job"]

    assert waits_after(lambda: x.cpu()) == 1
    assert waits_after(lambda: x.sum().item()) == 2
    assert waits_after(lambda: x.to("cpu", torch.float64)) == 3
    assert waits_after(lambda: torch.empty(16).copy_(x)) == 4
    # A non_blocking copy to the host is not a wait (and the data is there).
    out = torch.empty(16)
    assert waits_after(lambda: out.copy_(x, non_blocking=True)) == 4
    assert bits_equal(out, on_host)
    assert waits_after(lambda: torch.get_device_module(D).synchronize()) == 5
    assert waits_after(lambda: torch.accelerator.synchronize()) == 6
    stream = torch.Stream(device=D)
    assert waits_after(lambda: stream.synchronize()) == 7
    event = torch.Event(device=D)
    event.record(stream)
    assert waits_after(lambda: event.synchronize()) == 8
    # Copies to the device and on it, and ops, are not waits.
    assert waits_after(lambda: (torch.ones(4).to(D), x.clone(), x.double(), F.gelu(x))) == 8
    assert testdev.host_waits() == {"job": 8, "other": 0}
    worker = threading.Thread(target=x.cpu)
    worker.start()
    worker.join()
    assert testdev.host_waits() == {"job": 8, "other": 1}
    testdev.reset_counters()
    assert testdev.host_waits() == {"job": 0, "other": 0}


def test_launches_count_each_kernel_once_by_thread_and_observer():
    x = _x(n=16)
    testdev.set_job_thread()
    testdev.reset_counters()
    F.gelu(x)  # the fallback, its copies to and from the host included
    x.abs()  # a direct kernel
    x.cpu()  # _copy_from
    torch.empty(4, device=D)  # allocation and views are not launches
    x.view(4, 4).t()
    assert testdev.launches() == {"job": 3, "other": 0, "observer": 0}
    testdev.call_unobserved("aten::gelu", x)
    testdev.call_unobserved("aten::abs", x)
    assert testdev.launches() == {"job": 5, "other": 0, "observer": 2}
    worker = threading.Thread(target=x.abs)
    worker.start()
    worker.join()
    assert testdev.launches() == {"job": 5, "other": 1, "observer": 2}
    testdev.reset_counters()
    assert testdev.launches() == {"job": 0, "other": 0, "observer": 0}


def _seconds(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def test_costs_make_waits_and_launches_take_time():
    x = _x(n=16)
    testdev.set_costs(sync_us=50_000)
    assert testdev.costs() == {"sync_us": 50_000.0, "launch_us": 0.0}
    assert _seconds(x.cpu) >= 0.05  # a launch (free) and a wait
    assert _seconds(x.abs) < 0.05  # a launch only
    testdev.set_costs(launch_us=50_000)  # sync_us stays
    assert testdev.costs() == {"sync_us": 50_000.0, "launch_us": 50_000.0}
    assert _seconds(x.abs) >= 0.05
    assert _seconds(x.cpu) >= 0.1
    for bad in [{"sync_us": -1}, {"launch_us": float("nan")}, {"sync_us": 1, "launch_us": float("inf")}]:
        with pytest.raises(ValueError, match="microseconds"):
            testdev.set_costs(**bad)
    assert testdev.costs() == {"sync_us": 50_000.0, "launch_us": 50_000.0}
    testdev.set_costs(sync_us=0, launch_us=2.5)
    assert testdev.costs() == {"sync_us": 0.0, "launch_us": 2.5}


def test_cost_env_vars_are_read_at_load():
    res = _python(
        """
        testdev.load()
        print(testdev.costs(), testdev.direct_enabled())
        """,
        TESTDEV_SYNC_US="250",
        TESTDEV_LAUNCH_US=" 1.5 ",
        TESTDEV_DIRECT="1",
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "{'sync_us': 250.0, 'launch_us': 1.5} True"


def test_bad_settings_env_vars_raise_at_load():
    res = _python(
        """
        try:
            testdev.load()
        except ValueError as e:
            print("ValueError:", e)
        print(testdev.costs(), testdev.direct_enabled())
        """,
        TESTDEV_SYNC_US="fast",
        TESTDEV_LAUNCH_US="3",
        TESTDEV_DIRECT="yes",
    )
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert lines[0].startswith("ValueError: testdev: bad environment:")
    assert 'TESTDEV_SYNC_US="fast"' in lines[0] and 'TESTDEV_DIRECT="yes"' in lines[0]
    assert "TESTDEV_LAUNCH_US" not in lines[0]
    assert lines[1] == "{'sync_us': 0.0, 'launch_us': 3.0} True"  # the bad ones keep their defaults


# ---- direct kernels ------------------------------------------------------------


def _direct_inputs():
    x, y = _inputs(40, (6, 5), (6, 5))
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
    x = _x(n=64)
    base = testdev.memory_allocated()
    assert x.fill_(1.5) is x
    assert torch.ops.aten.fill_.Scalar(x, 2.0) is x
    assert bits_equal(x, torch.full((64,), 2.0))
    assert x.zero_() is x
    assert bits_equal(x, torch.zeros(64))
    assert testdev.memory_allocated() == base


def test_direct_outputs_work_as_testdev_tensors():
    """Adopted outputs go on to the fallback, autograd and out= arguments."""
    x = _x(n=32, seed=3).requires_grad_()
    y = (x * x).sum()  # direct mul and sum
    y.backward()
    assert bits_equal(x.grad, 2 * x.detach())
    a = x.detach().abs()
    torch.exp(a, out=a)  # the fallback writes into an adopted output
    assert bits_equal(a, x.detach().cpu().abs().exp())


def test_copies_to_the_host_keep_their_generic_path():
    """x.to("cpu") is _to_copy(device=cpu): not a direct kernel, it still
    ends in _copy_from, a launch and a host wait."""
    x = _x(n=16)
    testdev.set_job_thread()
    testdev.reset_counters()
    testdev.trace(True)
    y = x.to("cpu", torch.float64)
    assert y.device.type == "cpu" and bits_equal(y, x.cpu().double())
    assert testdev.traced_direct_ops() == {}
    assert testdev.launches()["job"] == 2 and testdev.host_waits()["job"] == 2


def test_faults_apply_to_direct_ops_as_on_the_fallback():
    x = _x(n=100)
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
    res = _python(
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
    res = _python(
        """
        testdev.load()
        print(testdev.fused_stats_enabled(), testdev.fallback_hidden())
        """,
        TESTDEV_FUSED_STATS="0",
    )
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "False False"
    res = _python(
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


# ---- graph capture -----------------------------------------------------------


def test_capture_refuses_host_waits_and_counts_observer_launches():
    x = _x(n=16)
    testdev.reset_counters()
    with testdev.capture():
        assert testdev.capturing()
        y = x.abs()  # the program's own work is captured, and fine
        with pytest.raises(RuntimeError, match="testdev: host wait while the stream is capturing"):
            x.cpu()
        with pytest.raises(RuntimeError, match="capturing"):
            y.sum().item()
        with pytest.raises(RuntimeError, match="capturing"):
            torch.get_device_module(D).synchronize()
        testdev.call_unobserved("aten::abs", x)  # an observer launching: counted
        testdev.call_unobserved("aten::gelu", x)
        with pytest.raises(RuntimeError, match="already capturing"):
            with testdev.capture():
                pass
        assert testdev.capturing()
    assert not testdev.capturing()
    assert testdev.capture_counts() == {"observer_launches": 2, "waits": 3}
    assert testdev.host_waits() == {"job": 0, "other": 0}  # the refused waits did not happen
    testdev.call_unobserved("aten::abs", x)
    x.cpu()  # after the capture: an ordinary launch and wait again
    assert testdev.capture_counts() == {"observer_launches": 2, "waits": 3}
    assert sum(testdev.host_waits().values()) == 1
    with pytest.raises(RuntimeError, match="capture_end without capture_begin"):
        torch.ops.testdev.capture_end()
    testdev.reset_counters()
    assert testdev.capture_counts() == {"observer_launches": 0, "waits": 0}


_DEFINE_STREAM_CAPTURING = 'torch.library.define("opdump::stream_capturing", "(Tensor t) -> bool")'
_ASK_STREAM_CAPTURING = """
x = torch.ones(2, device="testdev")
answers = [torch.ops.opdump.stream_capturing(x)]
with testdev.capture():
    answers.append(torch.ops.opdump.stream_capturing(x))
answers.append(torch.ops.opdump.stream_capturing(x))
print(answers)
"""


@pytest.mark.parametrize("schema_first", [True, False])
def test_stream_capturing_kernel_answers_in_either_order(schema_first):
    """testdev implements opdump::stream_capturing before or after the schema
    exists (here defined by the test, as opdump is not loaded)."""
    steps = [_DEFINE_STREAM_CAPTURING, "testdev.load()"]
    res = _python("\n".join(steps if schema_first else steps[::-1]) + _ASK_STREAM_CAPTURING)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "[False, True, False]"


@pytest.mark.parametrize("opdump_first", [True, False])
def test_stream_capturing_with_libopdump_in_either_order(opdump_first):
    steps = [f"torch.ops.load_library({str(LIB)!r})", "testdev.load()"]
    check = """
    try:
        torch._C._dispatch_find_schema_or_throw("opdump::stream_capturing", "")
    except RuntimeError:
        print("no schema")
        raise SystemExit
    """
    code = "\n".join(steps if opdump_first else steps[::-1]) + textwrap.dedent(check) + _ASK_STREAM_CAPTURING
    res = _python(code)
    assert res.returncode == 0, res.stderr
    if res.stdout.strip() == "no schema":
        pytest.skip("this libopdump does not define opdump::stream_capturing")
    assert res.stdout.strip() == "[False, True, False]"
