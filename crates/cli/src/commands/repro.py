#!/usr/bin/env python3
"""Reproduces one op call that two runs computed differently, outside the job.

Written by `opdump repro` beside the call's captured tensors: a.safetensors
(run A, the reference device), b.safetensors (run B, the device under test)
and call.json. Needs torch only; opdump need not be installed or loaded.
When A captured nothing (a run judged online against a reference dump),
there is no a.safetensors: A's side runs from B's inputs, which agreed with
A's where the call introduced the error. Made from the capture of an
in-job check (`opdump repro --check`), A is the CPU in the call's own dtype
and B the device the call was checked on.

It calls the op again three times, each from A's captured inputs:
  - on A's device type, and on B's device type;
  - as a reference on the CPU in float64 (in the original dtype where the op
    has no float64 kernel, which it then says);
and prints each output's error against the reference, and that of the
outputs the two runs recorded. The last line names the device that is off:
the one whose error is beyond what rounding explains (call.json's
`tolerance`, from `opdump compare`) and at least call.json's `margin` (the
check's factor, 10) times the other's.

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

What it trusts: torch, the modules --setup names, and call.json, which
`opdump repro` wrote. The capture files are data: their op must be a real
operator (a torch._ops.OpOverload named by identifiers), the same op as
call.json's; dtypes, layouts and memory formats must be torch's own; and
anything else malformed ends the script with one line and exit status 2.
"""

# First of all: `python repro.py` puts this folder first on sys.path, so a
# torch.py or json.py planted beside the script would be imported in place
# of the real module. sys is built in and os is loaded at start-up (frozen),
# so importing these two searches no folder.
import os
import sys


def _is_own_folder(entry, here):
    """Whether the sys.path entry `entry` ('' is the working directory) is
    the folder `here`."""
    try:
        return os.path.realpath(entry or os.curdir) == here
    except (OSError, TypeError, ValueError):  # an entry that is no path
        return False


sys.path[:] = [p for p in sys.path if not _is_own_folder(p, os.path.realpath(os.path.dirname(__file__)))]

import argparse
import importlib
import json
import math
import re
import struct

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


class CallError(Exception):
    """The call cannot be rebuilt or made here."""


def torch_values(kind):
    """torch's own values of type `kind` (torch.dtype, ...) by name: the only
    values a dtype, layout or memory format argument may name. Read from
    torch's namespace, not with getattr, which imports a submodule of torch
    for a name torch does not hold yet."""
    return {name: v for name, v in vars(torch).items() if isinstance(v, kind)}


ARG_DTYPES = torch_values(torch.dtype)
LAYOUTS = torch_values(torch.layout)
MEMORY_FORMATS = torch_values(torch.memory_format)
# A namespace, op or overload name: an identifier. A leading `__` would
# reach Python's own attributes (__class__, __globals__) instead of an op.
IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
DEVICE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(:[0-9]+)?")
# A tensor's key in a capture file: input.self, input.tensors.2, output.0.
TENSOR_KEY = re.compile(r"(input|output)\.[A-Za-z0-9_]+(\.[0-9]+)?")


def is_name(text):
    return isinstance(text, str) and IDENTIFIER.fullmatch(text) is not None and not text.startswith("__")


def resolve_op(qualified, overload):
    """The operator `ns::op` `overload` of torch.ops: only ever an OpOverload.
    Other attributes on the way (torch.ops.load_library, import_module) run
    code when called, so each step is checked before the next."""
    ns, _, name = qualified.partition("::") if isinstance(qualified, str) else ("", "", "")
    if not (is_name(ns) and is_name(name) and is_name(overload)):
        raise CallError(f"the capture names the op {qualified!r}, overload {overload!r}: not an operator name")
    where = f"torch.ops.{ns}.{name}.{overload}"
    try:
        namespace = getattr(torch.ops, ns)
        if not isinstance(namespace, torch._ops._OpNamespace):
            raise CallError(f"{where} is not an operator (torch.ops.{ns} is no op namespace)")
        packet = getattr(namespace, name)
        if not isinstance(packet, torch._ops.OpOverloadPacket):
            raise CallError(f"{where} is not an operator")
        op = getattr(packet, overload)
    except (AttributeError, RuntimeError) as e:
        raise CallError(f"{where} is not known to this torch: {e}") from e
    if not isinstance(op, torch._ops.OpOverload):
        raise CallError(f"{where} is not an operator")
    return op


def parse_json(text, what):
    """`text` parsed; malformed or too deeply nested JSON is a CallError."""
    if not isinstance(text, (str, bytes, bytearray)):
        raise CallError(f"{what} is not JSON text")
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise CallError(f"{what} is not valid JSON ({type(e).__name__})") from None


def is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def is_float(x):
    """A float as capture files write one: a number, or "nan", "inf", "-inf"."""
    return is_int(x) or isinstance(x, float) or x in ("nan", "inf", "-inf")


def is_list_of(x, test):
    return isinstance(x, list) and all(test(e) for e in x)


# What each kind of argument value holds (cpp/rows/saved_call.cpp).
VALUE_CHECKS = {
    "tensor": lambda x: isinstance(x, str),
    "tensors": lambda x: is_list_of(x, lambda k: k is None or isinstance(k, str)),
    "int": is_int,
    "bool": lambda x: isinstance(x, bool),
    "float": is_float,
    "str": lambda x: isinstance(x, str),
    "ints": lambda x: is_list_of(x, is_int),
    "bools": lambda x: is_list_of(x, lambda b: isinstance(b, bool)),
    "floats": lambda x: is_list_of(x, is_float),
    "complex": lambda x: is_list_of(x, is_float) and len(x) == 2,
    "dtype": lambda x: isinstance(x, str) and x in ARG_DTYPES,
    "layout": lambda x: isinstance(x, str) and x in LAYOUTS,
    "memory_format": lambda x: isinstance(x, str) and x in MEMORY_FORMATS,
    "device": lambda x: isinstance(x, str) and DEVICE.fullmatch(x) is not None,
    "generator": lambda x: x is None,
    # Elements of a list (SymInt[], int?[]) are plain values, never lists.
    "list": lambda x: is_list_of(x, lambda e: check_value(e, ("int", "float", "bool"))),
}


def check_value(v, kinds):
    """Whether `v` is None or a value of one of `kinds` that holds what that
    kind holds."""
    if v is None:
        return True
    if not isinstance(v, dict) or len(v) != 1:
        return False
    ((kind, x),) = v.items()
    return kind in kinds and VALUE_CHECKS[kind](x)


def checked_args(text, path):
    """The arguments in a capture's metadata, checked to be what opdump
    writes: a list of {name, kwarg_only, value}."""
    args = parse_json(text, f"{path}: opdump.args")
    if not isinstance(args, list):
        raise CallError(f"{path}: opdump.args is not a list of arguments")
    for a in args:
        ok = isinstance(a, dict) and isinstance(a.get("name"), str) and isinstance(a.get("kwarg_only"), bool)
        if not ok or "value" not in a:
            raise CallError(f"{path}: opdump.args holds {str(a)[:80]!r}, not an argument")
        if not check_value(a["value"], VALUE_CHECKS):
            raise CallError(f"{path}: argument {a['name'][:80]!r} holds {str(a['value'])[:80]!r}, "
                            f"which cannot be rebuilt")
    return args


def checked_layout(text, path):
    """Where each tensor lived (opdump.tensors): {key: {device, stride}}."""
    layout = parse_json(text, f"{path}: opdump.tensors")

    def ok(lay):
        return isinstance(lay, dict) and VALUE_CHECKS["device"](lay.get("device", "cpu")) and \
            is_list_of(lay.get("stride", []), is_int)

    if not isinstance(layout, dict) or not all(ok(lay) for lay in layout.values()):
        raise CallError(f"{path}: opdump.tensors is not a layout of tensors")
    return layout


def read_safetensors(data):
    """The tensors (on the CPU) and the metadata of a safetensors file's bytes."""
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError("its metadata is not a map of strings")
    base = 8 + n
    tensors = {}
    for key, info in header.items():
        if TENSOR_KEY.fullmatch(key) is None:
            raise ValueError(f"{key[:80]!r} is not a tensor key of a capture")
        dtype = DTYPES.get(info["dtype"])
        if dtype is None:
            raise CallError(f"{key} has dtype {info['dtype']}, which this torch lacks")
        start, end = info["data_offsets"]
        shape = info["shape"]
        if end > start:
            t = torch.frombuffer(bytearray(data[base + start:base + end]), dtype=dtype)
        else:
            t = torch.empty(0, dtype=dtype)
        tensors[key] = t.reshape(shape)
    return tensors, meta


def load_safetensors(path):
    """The tensors of a safetensors file (on the CPU) and its metadata; a
    file that is not one is a CallError."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        return read_safetensors(data)
    except CallError as e:
        raise CallError(f"{path}: {e}") from None
    except (OSError, ValueError, KeyError, TypeError, IndexError, struct.error, RecursionError,
            RuntimeError) as e:
        raise CallError(f"{path}: not a readable capture file ({type(e).__name__}: {e})") from None


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

    def __init__(self, path, call_device, op_name, overload):
        """The call in the capture file `path`, which must be of the op
        `op_name` `overload` (call.json's)."""
        self.tensors, meta = load_safetensors(path)
        for key in ("opdump.op", "opdump.overload", "opdump.args"):
            if key not in meta:
                raise CallError(f"{path}: its metadata lacks {key}: not a capture file of opdump's")
        if (meta["opdump.op"], meta["opdump.overload"]) != (op_name, overload):
            raise CallError(f"{path} holds a call of {meta['opdump.op'][:80]!r} {meta['opdump.overload'][:80]!r}, "
                            f"not of {op_name} {overload} (call.json)")
        self.op = resolve_op(op_name, overload)
        self.args = checked_args(meta["opdump.args"], path)
        self.layout = checked_layout(meta.get("opdump.tensors", "{}"), path)
        self.unsaved = [k for k in meta.get("opdump.unsaved", "").split(",") if k]
        self.outputs_skipped = meta.get("opdump.outputs_skipped") == "1"
        self.device = call_device  # where the call ran in its job

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
            return ARG_DTYPES[x]
        if kind == "layout":
            return LAYOUTS[x]
        if kind == "memory_format":
            return MEMORY_FORMATS[x]
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
        op = self.op
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


# The fields of call.json this script reads, and what each must hold.
CALL_FIELDS = {
    "op": lambda x: isinstance(x, str), "overload": lambda x: isinstance(x, str),
    "device_a": VALUE_CHECKS["device"], "device_b": VALUE_CHECKS["device"],
    "dump_a": lambda x: isinstance(x, str), "dump_b": lambda x: isinstance(x, str),
    "seq_a": is_int, "seq_b": is_int, "tolerance": lambda x: is_int(x) or isinstance(x, float),
    "margin": lambda x: (is_int(x) or isinstance(x, float)) and x >= 1,
    # Written by every opdump that writes a_from_b; older folders lack it.
    "a_from_b": lambda x: x is None or isinstance(x, bool),
}


def load_call(folder):
    """call.json in `folder`, with the fields this script reads checked."""
    path = os.path.join(folder, "call.json")
    try:
        with open(path) as f:
            call = json.load(f)
    except (OSError, ValueError, RecursionError) as e:
        raise CallError(f"{path}: {type(e).__name__}: {e}") from None
    bad = [k for k, ok in CALL_FIELDS.items() if not (isinstance(call, dict) and ok(call.get(k)))]
    if bad:
        raise CallError(f"{path}: {', '.join(bad)} missing or malformed")
    return call


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
    call = load_call(args.dir)
    # Without A's capture (a run judged online), A's side runs from B's
    # inputs: the call introduced the error while its inputs agreed.
    a_from_b = bool(call.get("a_from_b"))
    a_file = "b.safetensors" if a_from_b else "a.safetensors"
    a = Call(os.path.join(args.dir, a_file), call["device_b" if a_from_b else "device_a"], call["op"],
             call["overload"])
    b = Call(os.path.join(args.dir, "b.safetensors"), call["device_b"], call["op"], call["overload"])
    dev_a = args.device_a or call["device_a"]
    dev_b = args.device_b or call["device_b"]
    name = f"{call['op']}.{call['overload']}"
    tol = float(call["tolerance"])
    # Off by this factor more than the other device, beyond rounding: "off".
    margin = float(call["margin"])
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
    rec_a, rec_b = ({} if a_from_b else a.recorded()), b.recorded()
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
    off_a = err_a > tol and err_a > margin * err_b
    off_b = err_b > tol and err_b > margin * err_a
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
    result.update(error_a=err_a, error_b=err_b,
                  off=[d for d, o in ((kind_a, off_a or both), (kind_b, off_b or both)) if o],
                  verdict=verdict)
    if args.json:
        print(json.dumps(result, default=lambda v: None if isinstance(v, float) and not math.isfinite(v) else v))
    else:
        check = call.get("check") if isinstance(call.get("check"), dict) else None
        if check is not None:
            # Made by `opdump repro --check` from an in-job check's capture:
            # A is the CPU in the call's own dtype.
            print(f"{name}  checked in {call['dump_b']} (seq {call['seq_b']}, on {call['device_b']}): "
                  f"ratio {fmt(check.get('ratio'))}, {check.get('verdict')}")
            print(f"each run from the captured inputs, A on {dev_a} in the call's dtype, B on {dev_b}; "
                  f"reference: {ref_kind}; off beyond {fmt(tol)} and {margin:g} times the other")
        else:
            print(f"{name}  A: {call['dump_a']} (seq {call['seq_a']}, {call['device_a']})  "
                  f"B: {call['dump_b']} (seq {call['seq_b']}, {call['device_b']})")
            inputs = "B's captured inputs (A captured none)" if a_from_b else "A's captured inputs"
            print(f"each run from {inputs}; reference: {ref_kind}; rounding explains {fmt(tol)}")
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
