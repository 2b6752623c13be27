"""The reference peer of the benchmark: a pure-Python ``TorchDispatchMode``
that records what opdump records, written as well as Python allows.

For every aten op call the mode sees, it writes one row per input and output
tensor (inputs measured before the op runs, outputs after) with the op-level
columns repeated on each row, in opdump's column names:

    seq, parent_seq, depth, pid, thread, step, phase, op, overload, args,
    start_ns, duration_ns, error, role, arg, list_index, dtype, shape, stride,
    tensor_device, numel, stats_status, min, max, mean, std, l2, absmax,
    nan_count, posinf_count, neginf_count, zero_count

How it keeps Python's cost down:

- per op overload, the schema's argument names are parsed once and cached;
- per tensor, the statistics take three or four reductions on the tensor's
  own dtype (``aminmax``, ``sum``, ``linalg.vector_norm``, and
  ``count_nonzero`` only when 0 lies between min and max), one
  ``torch.stack`` and one ``.tolist()``; ``std`` and ``absmax`` are derived
  from those (``var = l2^2/n - mean^2``; ``absmax = max(|min|, |max|)``).
  ``aminmax`` propagates NaN and +-inf, so the common all-finite case needs
  no extra pass; only a tensor with a non-finite element takes a slower path
  (masks, then the same reductions over its finite elements);
- rows go into per-column Python lists and become one Arrow table every
  ``flush_rows`` rows (default 65536), written as one Parquet row group with
  snappy (as opdump writes); the rest is written at ``close()`` or exit.
  No thread: everything runs inline in the job's thread.

What a dispatch mode cannot see: it sits below autograd and below
CompositeImplicitAutograd decompositions, so it sees the decomposed ops only
(``aten::t`` + ``aten::addmm``, not ``aten::linear``), every call at depth 0;
opdump also records the enclosing composite calls. The benchmark reports
the op calls and rows each tool wrote, so the difference is visible.

Usage::

    from peer_dumper import PeerDumper
    with PeerDumper("/tmp/peer-dump"):
        train()
"""

from __future__ import annotations

import atexit
import math
import os
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook
from torch.utils._python_dispatch import TorchDispatchMode

_SCHEMA = pa.schema(
    [
        ("seq", pa.int64()),
        ("parent_seq", pa.int64()),
        ("depth", pa.int32()),
        ("pid", pa.int32()),
        ("thread", pa.int64()),
        ("step", pa.int64()),
        ("phase", pa.string()),
        ("op", pa.string()),
        ("overload", pa.string()),
        ("args", pa.string()),
        ("start_ns", pa.int64()),
        ("duration_ns", pa.int64()),
        ("error", pa.string()),
        ("role", pa.string()),
        ("arg", pa.string()),
        ("list_index", pa.int32()),
        ("dtype", pa.string()),
        ("shape", pa.list_(pa.int64())),
        ("stride", pa.list_(pa.int64())),
        ("tensor_device", pa.string()),
        ("numel", pa.int64()),
        ("stats_status", pa.string()),
        ("min", pa.float64()),
        ("max", pa.float64()),
        ("mean", pa.float64()),
        ("std", pa.float64()),
        ("l2", pa.float64()),
        ("absmax", pa.float64()),
        ("nan_count", pa.int64()),
        ("posinf_count", pa.int64()),
        ("neginf_count", pa.int64()),
        ("zero_count", pa.int64()),
    ]
)
_COLS = [f.name for f in _SCHEMA]
# Column positions of the per-row (tensor) part, after the op part.
_OP_COLS = _COLS[:13]
_T_COLS = _COLS[13:]

# Ops whose outputs hold no values yet (opdump marks them `uninitialized`).
_UNINIT_OPS = {
    "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
    "aten::new_empty_strided", "aten::empty_permuted", "aten::resize_", "aten::set_",
}
_NO_STATS = (None, None, None, None, None, None, None, None, None, None)
_INF = math.inf


def _dtype_name(dt, _cache={}):  # noqa: B006 - the default is the cache: a local lookup
    s = _cache.get(dt)
    if s is None:
        s = _cache[dt] = str(dt).removeprefix("torch.")
    return s


def _device_name(dev, _cache={}):  # noqa: B006 - the default is the cache: a local lookup
    s = _cache.get(dev)
    if s is None:
        s = _cache[dev] = str(dev)
    return s


def _reduce(x):
    """(min, max, sum, l2), nonzero of a float tensor; nonzero is counted
    only when 0 lies in [min, max] (else every element is nonzero)."""
    mn, mx = torch.aminmax(x)
    vals = torch.stack((mn, mx, torch.sum(x), torch.linalg.vector_norm(x))).tolist()
    if vals[0] <= 0.0 <= vals[1] or vals[0] != vals[0]:
        return vals, int(torch.count_nonzero(x))
    return vals, x.numel()


def tensor_stats(t: torch.Tensor):
    """(status, min, max, mean, std, l2, absmax, nan, posinf, neginf, zero)."""
    if t.layout != torch.strided or t.device.type == "meta" or t.is_quantized:
        return ("unsupported",) + _NO_STATS
    n = t.numel()
    if n == 0:
        return ("computed", None, None, None, None, None, None, 0, 0, 0, 0)
    x = t
    dt = t.dtype
    if dt not in (torch.float32, torch.float64):
        if dt.is_complex:
            x = t.abs()
        elif dt.is_floating_point:
            x = t.float()  # float16/bfloat16: accumulate in float32
        else:
            x = t.double()  # int and bool
    (mn, mx, sm, l2), nonzero = _reduce(x)
    nan = pinf = ninf = 0
    if not (-_INF < mn and mx < _INF):  # a NaN or an infinity: measure the finite part
        nan = int(torch.isnan(x).sum())
        pinf = int((x == _INF).sum())
        ninf = int((x == -_INF).sum())
        fin = x[torch.isfinite(x)]
        n = fin.numel()
        if n == 0:
            return ("computed", None, None, None, None, None, None, nan, pinf, ninf, t.numel() - nonzero)
        (mn, mx, sm, l2), _ = _reduce(fin)
    mean = sm / n
    var = l2 * l2 / n - mean * mean
    std = math.sqrt(var) if var > 0.0 else 0.0
    return ("computed", mn, mx, mean, std, l2, max(abs(mn), abs(mx)), nan, pinf, ninf, t.numel() - nonzero)


class PeerDumper(TorchDispatchMode):
    """Records per-tensor statistics of every aten op call into Parquet."""

    def __init__(self, out_dir: str, flush_rows: int = 65536, inputs: bool = True):
        super().__init__()
        os.makedirs(out_dir, mode=0o700, exist_ok=True)
        self.path = os.path.join(out_dir, f"peer-{os.getpid()}.parquet")
        self.flush_rows = flush_rows
        self.inputs = inputs
        self.pid = os.getpid()
        self.seq = 0
        self.step = 0
        self.in_optimizer = False
        self.rows_written = 0
        self.ops_written = 0
        self.files = 0
        self._writer = None
        self._buf = [[] for _ in _COLS]
        self._n = 0
        self._schemas = {}
        # The first pa.array() of Python lists imports pandas (~0.5 s): pay it
        # here, at start-up, not in the first flush.
        pa.array([[1]], type=pa.list_(pa.int64()))
        self._hooks = (
            register_optimizer_step_pre_hook(self._opt_pre),
            register_optimizer_step_post_hook(self._opt_post),
        )
        atexit.register(self.close)

    # Step and phase, as opdump numbers them: the step advances at the end of
    # every Optimizer.step.
    def _opt_pre(self, *_):
        self.in_optimizer = True

    def _opt_post(self, *_):
        self.in_optimizer = False
        self.step += 1

    def _schema_of(self, func):
        info = self._schemas.get(func)
        if info is None:
            s = func._schema
            info = (s.name, func._overloadname, [a.name for a in s.arguments])
            self._schemas[func] = info
        return info

    def _add(self, op_part, role, arg, li, t):
        st = tensor_stats(t)
        b = self._buf
        for i, v in enumerate(op_part):
            b[i].append(v)
        b[13].append(role)
        b[14].append(arg)
        b[15].append(li)
        b[16].append(_dtype_name(t.dtype))
        b[17].append(list(t.shape))
        b[18].append(list(t.stride()) if t.layout == torch.strided else [])
        b[19].append(_device_name(t.device))
        b[20].append(t.numel())
        for i, v in enumerate(st):
            b[21 + i].append(v)
        self._n += 1

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op, overload, names = self._schema_of(func)
        seq = self.seq
        self.seq += 1
        if self.in_optimizer:
            phase = "optimizer"
        elif torch._C._current_graph_task_id() != -1:
            phase = "backward"
        else:
            phase = "forward"

        # Inputs: tensors are measured before the op runs; the rest is `args`.
        tin = []
        text = []
        items = list(zip(names, args))
        items.extend(kwargs.items())
        for name, v in items:
            if isinstance(v, torch.Tensor):
                tin.append((name, None, v))
            elif isinstance(v, (list, tuple)) and v and isinstance(v[0], torch.Tensor):
                tin.extend((name, i, e) for i, e in enumerate(v) if isinstance(e, torch.Tensor))
            elif not (isinstance(v, (list, tuple)) and v and v[0] is None):
                text.append(f"{name}={v!r}")
        start = time.time_ns()
        pre = [(n, i, e, tensor_stats(e)) for n, i, e in tin] if self.inputs else []

        t0 = time.perf_counter_ns()
        out = func(*args, **kwargs)
        dur = time.perf_counter_ns() - t0

        op_part = (seq, None, 0, self.pid, threading.get_ident(), self.step, phase, op,
                   overload, ", ".join(text), start, dur, None)
        b = self._buf
        nrows = 0
        for name, li, e, st in pre:
            for i, v in enumerate(op_part):
                b[i].append(v)
            b[13].append("input")
            b[14].append(name)
            b[15].append(li)
            b[16].append(_dtype_name(e.dtype))
            b[17].append(list(e.shape))
            b[18].append(list(e.stride()) if e.layout == torch.strided else [])
            b[19].append(_device_name(e.device))
            b[20].append(e.numel())
            for i, v in enumerate(st):
                b[21 + i].append(v)
            nrows += 1
        self._n += nrows
        uninit = op in _UNINIT_OPS
        outs = out if isinstance(out, (tuple, list)) else (out,)
        for k, o in enumerate(outs):
            if isinstance(o, torch.Tensor):
                if uninit:
                    self._add_meta(op_part, str(k), None, o, "uninitialized")
                else:
                    self._add(op_part, "output", str(k), None, o)
                nrows += 1
            elif isinstance(o, (list, tuple)):
                for i, e in enumerate(o):
                    if isinstance(e, torch.Tensor):
                        self._add(op_part, "output", str(k), i, e)
                        nrows += 1
        if nrows == 0:
            for i, v in enumerate(op_part):
                b[i].append(v)
            for i in range(13, len(_COLS)):
                b[i].append(None)
            b[13][-1] = "none"
            b[21][-1] = "unsupported"
            self._n += 1
        self.ops_written += 1
        if self._n >= self.flush_rows:
            self.flush()
        return out

    def _add_meta(self, op_part, arg, li, t, status):
        b = self._buf
        for i, v in enumerate(op_part):
            b[i].append(v)
        for i, v in enumerate(("output", arg, li, _dtype_name(t.dtype), list(t.shape), list(t.stride()),
                               _device_name(t.device), t.numel(), status) + _NO_STATS):
            b[13 + i].append(v)
        self._n += 1

    def flush(self):
        """Writes the buffered rows as one row group."""
        if self._n == 0:
            return
        table = pa.Table.from_arrays([pa.array(c, type=f.type) for c, f in zip(self._buf, _SCHEMA)],
                                     schema=_SCHEMA)
        if self._writer is None:
            self._writer = pq.ParquetWriter(self.path, _SCHEMA, compression="snappy")
            self.files += 1
        self._writer.write_table(table)
        self.rows_written += self._n
        self._buf = [[] for _ in _COLS]
        self._n = 0

    def close(self):
        """Writes what is left and completes the file (idempotent)."""
        self.flush()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
        for h in self._hooks:
            h.remove()
        self._hooks = ()
