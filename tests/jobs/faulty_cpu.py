"""A TinyLM training step on the CPU, optionally with one aten CPU kernel
replaced by a faulty one, to emulate a device whose kernel is wrong.

FAULT="aten::gelu=1.01" replaces gelu's CPU kernel by a Python one that
computes the right answer from other aten ops (so it decomposes into nested
ops, as a different backend would) and then scales it. AUTOCAST=bfloat16 runs
the forward under CPU autocast. Run with opdump loaded and OPDUMP=1."""

import math
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "scripts"))
import tinylm  # noqa: E402


def faulty_gelu(scale):
    def gelu(x, approximate="none"):
        return (0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))) * scale

    return gelu


def faulty_softmax(scale):
    def _softmax(x, dim, half_to_float):
        e = torch.exp(x - x.amax(dim, keepdim=True))
        return (e / e.sum(dim, keepdim=True)) * scale

    return _softmax


def faulty_addmm(scale):
    def addmm(bias, a, b, beta=1, alpha=1):
        return (bias * beta + torch.mm(a, b) * alpha) * scale

    return addmm


def faulty_gelu_backward(scale):
    def gelu_backward(grad_output, x, approximate="none"):
        cdf = 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))
        pdf = torch.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)
        return grad_output * (cdf + x * pdf) * scale

    return gelu_backward


FAULTS = {"aten::gelu": ("gelu", faulty_gelu), "aten::_softmax": ("_softmax", faulty_softmax),
          "aten::addmm": ("addmm", faulty_addmm), "aten::gelu_backward": ("gelu_backward", faulty_gelu_backward)}

lib = None
spec = os.environ.get("FAULT")
if spec:
    op, scale = spec.split("=")
    name, make = FAULTS[op]
    lib = torch.library.Library("aten", "IMPL")
    lib.impl(name, make(float(scale)), "CPU")

autocast = os.environ.get("AUTOCAST")
losses = tinylm.train("cpu", steps=int(os.environ.get("STEPS", "1")),
                      autocast=getattr(torch, autocast) if autocast else None)
print(losses)
