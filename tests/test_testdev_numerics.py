"""testdev against the CPU: ops, convolutions, pooling, norms and small
models trained on both, bit for bit where the CPU kernel runs. (The testdev test device:
tests/testdev/; shared helpers: tests/testdev_common.py.)

    .venv/bin/python -m pytest tests/test_testdev_numerics.py -q
"""

from __future__ import annotations

import threading

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import tests.testdev as testdev
from testdev_common import CONV_CASES, D, bits_equal, randn_inputs, run

# The fixtures these tests use (the first two autouse): imported, they apply here.
from testdev_common import _loaded as _loaded
from testdev_common import _no_faults as _no_faults

EXACT_CASES = {
    "matmul": (lambda a, b: a @ b, lambda: randn_inputs(1, (8, 16), (16, 4))),
    "linear": (lambda x, w, b: F.linear(x, w, b), lambda: randn_inputs(2, (8, 16), (4, 16), (4,))),
    "gelu": (F.gelu, lambda: randn_inputs(3, (8, 33))),
    "gelu_tanh": (lambda x: F.gelu(x, approximate="tanh"), lambda: randn_inputs(4, (8, 33))),
    "softmax": (lambda x: F.softmax(x, dim=-1), lambda: randn_inputs(5, (8, 33))),
    "masked_softmax": (
        lambda x: x.masked_fill(torch.triu(torch.ones(6, 6, dtype=torch.bool, device=x.device), 1),
                                float("-inf")).softmax(-1),
        lambda: randn_inputs(6, (2, 6, 6)),
    ),
    "cross_entropy": (
        lambda x: F.cross_entropy(x, torch.arange(8, device=x.device) % 5).reshape(1),
        lambda: randn_inputs(7, (8, 5)),
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
    inputs = randn_inputs(28, (2, 3, 8, 8))
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
    (x,) = randn_inputs(9, shape)
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
    x, w, b = randn_inputs(10, (4, 3, 5, 5), (3,), (3,))

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
    x, w, b = randn_inputs(8, (16, 64), (64,), (64,), dtype=dtype)

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
