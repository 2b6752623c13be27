#!/usr/bin/env python3
"""Reproduces one op call that two runs computed differently, outside the job.

Written by `opdump repro` beside the call's captured tensors: a.safetensors
(run A, the reference device), b.safetensors (run B, the device under test)
and call.json. Needs torch only; opdump need not be installed or loaded.

It calls the op again three times, each from A's captured inputs:
  - on A's device type, and on B's device type;
  - as a reference on the CPU in float64 (in the original dtype where the op
    has no float64 kernel, which it then says);
and prints each output's error against the reference, and that of the
outputs the two runs recorded. The last line names the device that is off:
the one whose error is beyond what rounding explains (call.json's
`tolerance`, from `opdump compare`) and at least 10 times the other's.

  python repro.py [--device-a DEV] [--device-b DEV] [--setup MODULE[:FUNCTION]] [--json]

  --device-a/--device-b  run on these devices instead of the recorded ones
  --setup MODULE[:FUNCTION]
                         import MODULE first, and call its FUNCTION when one
                         is named: what registers a device backend (for
                         opdump's test device: tests.testdev:load); may be
                         repeated
  --json                 print the results as one JSON object

Exit status: 0 when neither device is off, 1 when one or both are, 2 when
the call cannot be made.
"""

import argparse
import importlib
import json
import math
import os
import struct
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))

DTYPES = {
    "BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16,
    "I32": torch.int32, "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16,
    "F32": torch.float32, "F64": torch.float64, "C64": torch.complex64,
}
for name, attr in (("U16", "uint16"), ("U32", "uint32"), ("U64", "uint64"),
                   ("F8_E4M3", "float8_e4m3fn"), ("F8_E5M2", "float8_e5m2")):
    if hasattr(torch, attr):
        DTYPES[name] = getattr(torch, attr)
# Off by this factor more than the other device, beyond rounding: "off".
MARGIN = 10.0


class CallError(Exception):
    """The call cannot be rebuilt or made here."""


def load_safetensors(path):
    """The tensors of a safetensors file (on the CPU) and its metadata."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {}) or {}
    base = 8 + n
    tensors = {}
    for key, info in header.items():
        dtype = DTYPES.get(info["dtype"])
        if dtype is None:
            raise CallError(f"{path}: {key} has dtype {info['dtype']}, which this torch lacks")
        start, end = info["data_offsets"]
        shape = info["shape"]
        if end > start:
            t = torch.frombuffer(bytearray(data[base + start:base + end]), dtype=dtype)
        else:
            t = torch.empty(0, dtype=dtype)
        tensors[key] = t.reshape(shape)
    return tensors, meta


def is_dense(shape, stride):
    """Strides that lay the elements out without gaps or overlaps, in any
    order of dimensions (what empty_strided can make and copy_ can fill)."""
    dims = sorted((s, n) for n, s in zip(shape, stride) if n != 1)
    expected = 1
    for s, n in dims:
        if s != expected:
            return False
        expected *= n
    return True


class Call:
    """One op call, rebuilt from a capture file."""

    def __init__(self, path, call_device):
        self.tensors, meta = load_safetensors(path)
        self.args = json.loads(meta["opdump.args"])
        self.layout = json.loads(meta.get("opdump.tensors", "{}"))
        self.unsaved = [k for k in meta.get("opdump.unsaved", "").split(",") if k]
        self.outputs_skipped = meta.get("opdump.outputs_skipped") == "1"
        self.device = call_device  # where the call ran in its job
        self.op_name = meta["opdump.op"]
        self.overload = meta["opdump.overload"]

    def op(self):
        ns, name = self.op_name.split("::", 1)
        try:
            packet = getattr(getattr(torch.ops, ns), name)
            return getattr(packet, self.overload)
        except (AttributeError, RuntimeError) as e:
            raise CallError(f"torch.ops.{ns}.{name}.{self.overload} is not known to this torch: {e}") from e

    def tensor(self, key, device, float64):
        if key not in self.tensors:
            why = "its dtype cannot be saved" if key in self.unsaved else "it was not captured"
            raise CallError(f"{key} is missing from the capture: {why}")
        t = self.tensors[key]
        if float64 and t.is_floating_point():
            t = t.double()
        elif float64 and t.is_complex():
            t = t.to(torch.complex128)
        lay = self.layout.get(key, {})
        # A tensor that lived where the call ran moves with it; one that
        # lived elsewhere (a CPU scalar beside a device op) stays there.
        where = device if lay.get("device", self.device) == self.device else lay.get("device", "cpu")
        stride = lay.get("stride")
        if stride and len(stride) == t.dim() and is_dense(list(t.shape), stride) and \
                list(stride) != list(torch.empty(t.shape).stride()):
            out = torch.empty_strided(tuple(t.shape), tuple(stride), dtype=t.dtype, device=where)
            out.copy_(t)
            return out
        return t.to(where, copy=True)

    def value(self, v, device, float64):
        if v is None:
            return None
        (kind, x), = v.items()
        if kind == "tensor":
            return self.tensor(x, device, float64)
        if kind == "tensors":
            return [None if k is None else self.tensor(k, device, float64) for k in x]
        if kind == "float":
            return float(x)
        if kind in ("int", "bool", "str", "ints", "bools"):
            return x
        if kind == "floats":
            return [float(f) for f in x]
        if kind == "complex":
            return complex(float(x[0]), float(x[1]))
        if kind == "dtype":
            # As recorded, for the reference too: a cast rounds on purpose.
            return getattr(torch, x)
        if kind == "layout":
            return getattr(torch, x)
        if kind == "memory_format":
            return getattr(torch, x)
        if kind == "device":
            return torch.device(device) if x == self.device else torch.device(x)
        if kind == "list":
            return [self.value(e, device, float64) for e in x]
        if kind == "generator":
            return None
        raise CallError(f"an argument of type {kind} ({x}) cannot be rebuilt")

    def run(self, device, float64=False):
        """Calls the op on `device`; returns its outputs by key."""
        positional, keywords, by_name = [], {}, {}
        for a in self.args:
            v = self.value(a["value"], device, float64)
            by_name[a["name"]] = v
            if a["kwarg_only"]:
                keywords[a["name"]] = v
            else:
                positional.append(v)
        op = self.op()
        result = op(*positional, **keywords)
        # One return (a Tensor, or a Tensor[]) is output.0; several come as
        # a tuple; none (an in-place op on a list) leaves the written args.
        if len(op._schema.returns) == 1:
            result = (result,)
        outputs = {}
        for key in self.tensors:
            if not key.startswith("output."):
                continue
            parts = key.split(".")
            if parts[1].isdigit():
                v = result[int(parts[1])] if result is not None else None
            else:
                v = by_name.get(parts[1])  # an argument the op wrote
            if len(parts) > 2 and v is not None:
                v = v[int(parts[2])]
            if isinstance(v, torch.Tensor):
                outputs[key] = v
        return outputs

    def recorded(self):
        return {k: t for k, t in self.tensors.items() if k.startswith("output.")}


def as_float64(t):
    t = t.detach().to("cpu")
    if t.is_complex():
        t = torch.view_as_real(t.to(torch.complex128))
    return t.to(torch.float64)


def errors(x, ref):
    """Relative L2 and max abs error of `x` against `ref`, over the elements
    finite in both; NaN/Inf that differ make it infinite."""
    x, r = as_float64(x), as_float64(ref)
    if x.shape != r.shape:
        return {"rel_l2": math.inf, "max_abs": math.inf, "note": f"shape {list(x.shape)} vs {list(r.shape)}"}
    fx, fr = torch.isfinite(x), torch.isfinite(r)
    both = fx & fr
    mismatch = int(((~fx | ~fr) & ~((x == r) | (torch.isnan(x) & torch.isnan(r)))).sum())
    d = (x - r)[both]
    norm = float(r[both].norm())
    diff = float(d.norm())
    rel = diff / norm if norm > 0 else (0.0 if diff == 0 else math.inf)
    out = {"rel_l2": math.inf if mismatch else rel,
           "max_abs": math.inf if mismatch else (float(d.abs().max()) if d.numel() else 0.0)}
    if mismatch:
        out["nonfinite_mismatch"] = mismatch
    return out


def bitwise_equal(x, y):
    if x.dtype != y.dtype or x.shape != y.shape:
        return False
    x, y = x.detach().cpu().contiguous().reshape(-1), y.detach().cpu().contiguous().reshape(-1)
    if x.is_floating_point() or x.is_complex():
        return x.view(torch.uint8).equal(y.view(torch.uint8))
    return x.equal(y)


def device_kind(d):
    return str(d).split(":")[0]


def fmt(v):
    return f"{v:.3e}" if isinstance(v, float) and math.isfinite(v) else str(v)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device-a", help="device for A's run (default: the device A ran on)")
    p.add_argument("--device-b", help="device for B's run (default: the device B ran on)")
    p.add_argument("--setup", action="append", default=[], metavar="MODULE[:FUNCTION]",
                   help="import MODULE (and call its FUNCTION) first: what registers a device backend")
    p.add_argument("--json", action="store_true", help="print the results as one JSON object")
    p.add_argument("--dir", default=HERE, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for spec in args.setup:
        module, _, function = spec.partition(":")
        m = importlib.import_module(module)
        if function:
            getattr(m, function)()
    with open(os.path.join(args.dir, "call.json")) as f:
        call = json.load(f)
    a = Call(os.path.join(args.dir, "a.safetensors"), call["device_a"])
    b = Call(os.path.join(args.dir, "b.safetensors"), call["device_b"])
    dev_a = args.device_a or call["device_a"]
    dev_b = args.device_b or call["device_b"]
    name = f"{call['op']}.{call['overload']}"
    tol = float(call["tolerance"])
    result = {"op": name, "device_a": dev_a, "device_b": dev_b, "tolerance": tol, "outputs": {}, "notes": []}

    def attempt(what, fn):
        try:
            return fn()
        except CallError:
            raise
        except Exception as e:  # the op's own error, on this device
            result["notes"].append(f"{what} raised {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
            return None

    for dev in (dev_a, dev_b):
        try:
            torch.empty(0, device=dev)
        except Exception as e:
            raise CallError(f"device {dev!r} is not available here ({str(e).splitlines()[0]}): pass "
                            f"--setup MODULE[:FUNCTION] to register it, or --device-a/--device-b") from e
    run_a = attempt(f"the call on {dev_a}", lambda: a.run(dev_a))
    run_b = attempt(f"the call on {dev_b}", lambda: a.run(dev_b))
    ref = attempt("the float64 reference", lambda: a.run("cpu", float64=True))
    ref_kind = "float64 on the CPU"
    if ref is None:
        ref = attempt("the reference in the original dtype", lambda: a.run("cpu"))
        ref_kind = "the original dtype on the CPU (the op has no float64 kernel)"
        result["notes"].append(f"the reference is {ref_kind}")
    ref_b = attempt("the float64 reference from B's inputs", lambda: b.run("cpu", float64=True)) or {}
    result["reference"] = ref_kind
    if ref is None:
        raise CallError("the reference call failed: " + "; ".join(result["notes"]))
    rec_a, rec_b = a.recorded(), b.recorded()
    err_a = err_b = 0.0
    for key in sorted(ref):
        row = {}
        if run_a is not None and key in run_a:
            row["run_a"] = errors(run_a[key], ref[key])
            err_a = max(err_a, row["run_a"]["rel_l2"])
            if key in rec_a:
                row["run_a_reproduces_recorded_a"] = bitwise_equal(run_a[key], rec_a[key])
        if run_b is not None and key in run_b:
            row["run_b"] = errors(run_b[key], ref[key])
            err_b = max(err_b, row["run_b"]["rel_l2"])
        if key in rec_a:
            row["recorded_a"] = errors(rec_a[key], ref[key])
        if key in rec_b and key in ref_b:
            row["recorded_b"] = errors(rec_b[key], ref_b[key])
        result["outputs"][key] = row
    if run_a is None or run_b is None:
        err_a = math.inf if run_a is None else err_a
        err_b = math.inf if run_b is None else err_b
    off_a = err_a > tol and err_a > MARGIN * err_b
    off_b = err_b > tol and err_b > MARGIN * err_a
    both = err_a > tol and err_b > tol and not (off_a or off_b)
    kind_a, kind_b = device_kind(dev_a), device_kind(dev_b)
    if off_b:
        verdict = (f"{kind_b} is off: {name} on {dev_b} is {fmt(err_b)} from the reference, {dev_a} {fmt(err_a)} "
                   f"(rounding explains {fmt(tol)})")
    elif off_a:
        verdict = (f"{kind_a} is off: {name} on {dev_a} is {fmt(err_a)} from the reference, {dev_b} {fmt(err_b)} "
                   f"(rounding explains {fmt(tol)})")
    elif both:
        verdict = (f"both are off: {name} on {dev_a} is {fmt(err_a)} and on {dev_b} {fmt(err_b)} from the reference "
                   f"(rounding explains {fmt(tol)})")
    else:
        verdict = (f"neither is off: from A's inputs, {name} on {dev_a} ({fmt(err_a)}) and on {dev_b} ({fmt(err_b)}) "
                   f"agree with the reference within rounding ({fmt(tol)}); the difference did not reproduce "
                   f"from these inputs")
    result.update(error_a=err_a, error_b=err_b, off=[d for d, o in ((kind_a, off_a or both), (kind_b, off_b or both)) if o],
                  verdict=verdict)
    if args.json:
        print(json.dumps(result, default=lambda v: None if isinstance(v, float) and not math.isfinite(v) else v))
    else:
        print(f"{name}  A: {call['dump_a']} (seq {call['seq_a']}, {call['device_a']})  "
              f"B: {call['dump_b']} (seq {call['seq_b']}, {call['device_b']})")
        print(f"each run from A's captured inputs; reference: {ref_kind}; rounding explains {fmt(tol)}")
        for key, row in result["outputs"].items():
            print(f"  {key}")
            for what, label in (("run_a", f"on {dev_a}"), ("run_b", f"on {dev_b}"),
                                ("recorded_a", "recorded in A"), ("recorded_b", "recorded in B (vs B's inputs)")):
                if what in row:
                    e = row[what]
                    extra = ""
                    if what == "run_a" and "run_a_reproduces_recorded_a" in row:
                        extra = "   (bit for bit the output A recorded)" if row["run_a_reproduces_recorded_a"] \
                            else "   (differs from the output A recorded)"
                    print(f"    {label:<32} rel l2 {fmt(e['rel_l2']):>10}   max abs {fmt(e['max_abs']):>10}{extra}")
        for n in result["notes"]:
            print(f"  note: {n}")
        print(verdict)
    return 1 if result["off"] else 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except CallError as e:
        print(f"repro: {e}", file=sys.stderr)
        sys.exit(2)
