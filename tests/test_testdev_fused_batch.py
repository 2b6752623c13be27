"""testdev's kernel for opdump::fused_stats_batch (tests/testdev/README.md,
"Fused statistics"): one launch for the rows of several tensors, each the
8 statistics of opdump::fused_stats (bit for bit), then with a sketch of
length K the fingerprint in three limbs and the sketch before its Hadamard
transform. Checked against independent numpy computations of the
definition (signature_ref.py), against what opdump records on the CPU for the same
values, and against the switches that turn it off."""


import numpy as np

import signature_ref as ref

K = 16

# The tensors, made on the CPU with known seeds and moved to testdev (`host`,
# `dev`), then three taken on testdev: a non-contiguous view, an empty one
# and a 0-dim tensor.
TENSORS = """
import torch
g = torch.Generator().manual_seed(7)
def nan_with_payload(dtype, bits):       # a NaN that is not the canonical one
    int_type = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16,
                torch.float64: torch.int64}[dtype]
    return torch.tensor([bits], dtype=int_type).view(dtype)
f32 = torch.randn(1000, generator=g) * 100
f32[[3, 700]] = float("nan"); f32[10] = float("inf"); f32[999] = -float("inf"); f32[20] = 0.0; f32[21] = -0.0
f32 = torch.cat([f32, nan_with_payload(torch.float32, -4194303)])          # 0xffc00001
bf16 = torch.cat([(torch.randn(300, generator=g) * 3).bfloat16(), nan_with_payload(torch.bfloat16, -63),
                  torch.tensor([float("nan"), float("inf")], dtype=torch.bfloat16)])  # -63: 0xffc1
f16 = torch.cat([torch.randn(77, generator=g).half(), nan_with_payload(torch.float16, 0x7e01)])
f64 = torch.randn(257, generator=g, dtype=torch.float64) * 1e3
f64[100] = float("nan")
i64 = torch.randint(-2**62, 2**62, (130,), generator=g, dtype=torch.int64)
i8 = torch.randint(-128, 128, (50,), generator=g, dtype=torch.int8)
bools = torch.rand(90, generator=g) > 0.5
c64 = torch.complex(torch.randn(70, generator=g), torch.randn(70, generator=g))
c64[5] = complex(float("inf"), 1.0); c64[6] = complex(0.0, float("nan"))
base = torch.randn(40, 30, generator=g)
host = [f32, bf16, f16, f64, i64, i8, bools, c64]
dev = [t.to("testdev") for t in host]
big = base.to("testdev")
dev += [big.t()[::2, 1:], big[:0], torch.tensor(2.5).to("testdev")]   # strided, empty, 0-dim
names = ["float32", "bfloat16", "float16", "float64", "int64", "int8", "bool", "complex64",
         "strided", "empty", "scalar"]
"""


# The definition's reference (signature_ref.py): the words, keys and
# fingerprint of a tensor, and its elements as the sketch takes them.
fingerprint = ref.fingerprint


def sketch_y(t, k):
    """y (the sketch before its Hadamard transform), and per bucket the sum
    of the magnitudes added to it (the scale of its rounding)."""
    x = ref.values(t.resolve_conj().resolve_neg())
    e = np.arange(len(x), dtype=np.uint64)
    lg = k.bit_length() - 1
    h = (e >> np.uint64(lg)).astype(np.uint32) * np.uint32(ref.GOLDEN)
    a = ref.fmix32(h + np.uint32(ref.SIGN_SEED))
    c = ref.fmix32(h + np.uint32(ref.PROJ_SEED)) & np.uint32(k - 1)
    r = (e & np.uint64(k - 1)).astype(np.uint32)
    sign = np.where((a >> r) & np.uint32(1), -1.0, 1.0)
    y, scale = np.zeros(k), np.zeros(k)
    np.add.at(y, (r ^ c).astype(np.int64), sign * x)
    np.add.at(scale, (r ^ c).astype(np.int64), np.abs(x))
    return y, scale


def test_batch_rows_match_fused_stats_and_the_definition(run):
    job = run(TENSORS + f"""
testdev.set_job_thread()
testdev.reset_counters()
out = torch.ops.opdump.fused_stats_batch(dev, {K})
launches = testdev.launches()
single = [torch.ops.opdump.fused_stats(t) for t in dev]
plain = torch.ops.opdump.fused_stats_batch(dev)
torch.save({{"host": host, "views": [t.cpu() for t in dev[len(host):]]}}, "tensors.pt")
print(json.dumps({{
    "launches": launches, "device": str(out.device), "dtype": str(out.dtype), "shape": list(out.shape),
    "rows": out.cpu().view(torch.int64).tolist(),
    "single": [s.cpu().view(torch.int64).tolist() for s in single],
    "plain_shape": list(plain.shape), "plain": plain.cpu().view(torch.int64).tolist(),
}}))
""", testdev=True)
    assert job.returncode == 0, job.stderr
    r = job.result()
    import torch

    saved = torch.load(job.dump_dir.parent / "tensors.pt")
    tensors = saved["host"] + saved["views"]
    assert len(tensors) == 11
    # One kernel for the whole batch, on the job's thread.
    assert r["launches"] == {"job": 1, "other": 0, "observer": 0}, r["launches"]
    assert r["device"] == "testdev:0" and r["dtype"] == "torch.float64"
    assert r["shape"] == [11, 8 + 3 + K]
    rows = np.array(r["rows"], dtype=np.int64)
    values = rows.view(np.float64)
    names = ["float32", "bfloat16", "float16", "float64", "int64", "int8", "bool", "complex64",
             "strided", "empty", "scalar"]
    for i, (name, t) in enumerate(zip(names, tensors)):
        # Columns 0..7: fused_stats' row, bit for bit (with and without a sketch).
        assert r["single"][i] == r["rows"][i][:8], name
        assert r["plain"][i] == r["single"][i], name
        p0, p1, p2 = values[i, 8:11]
        exact = p0 == int(p0) and p2 == int(p2)
        assert p1 == 0 and 0 <= p0 < 2**32 and 0 <= p2 < 2**32 and exact, (name, p0, p1, p2)
        got = (int(p0) + (int(p1) << 16) + (int(p2) << 32)) % 2**64
        assert got == fingerprint(t), f"{name}: fingerprint {got:#x} != {fingerprint(t):#x}"
        y, scale = sketch_y(t, K)
        err = np.abs(values[i, 11:] - y)
        assert (err <= 1e-12 * scale).all(), (name, values[i, 11:], y)
    assert r["plain_shape"] == [11, 8]
    # The empty tensor: counts 0, fingerprint 0, sketch zeros; the others
    # have something in every part of their row.
    assert (values[9, [0, 1, 2, 3]] == 0).all() and (values[9, 8:] == 0).all()
    for i in (0, 1, 4, 7, 8):
        assert values[i, 8] != 0 and np.abs(values[i, 11:]).sum() > 0, names[i]
    # The counts say the NaNs, infinities and signed zeros were read as such.
    assert list(values[0, :4]) == [996, 3, 1, 2]  # 1001 values: 3 NaN, +inf, -inf


def test_the_fingerprint_canonicalises_nans_and_follows_logical_order(run):
    """Two NaNs with different bits give one fingerprint; a transposed view
    and its contiguous copy give the same; swapping two values changes it."""
    job = run(f"""
import torch
a = torch.tensor([1.0, float("nan"), 3.0, 4.0])
b = a.clone(); b.view(torch.int32)[1] = -4194303        # another NaN
m = torch.arange(12, dtype=torch.float32).reshape(3, 4).to("testdev")
ts = [a.to("testdev"), b.to("testdev"), m.t(), m.t().contiguous(), a[[0, 2, 1, 3]].to("testdev")]
out = torch.ops.opdump.fused_stats_batch(ts, {K})
print(json.dumps(out.cpu().tolist()))
""", testdev=True)
    assert job.returncode == 0, job.stderr
    rows = job.result()
    f = [int(r[8]) + (int(r[10]) << 32) for r in rows]
    assert f[0] == f[1] and rows[0][11:] == rows[1][11:]
    assert f[2] == f[3] and rows[2][11:] == rows[3][11:]
    assert f[0] != f[4]


def test_switches_and_bad_arguments(run):
    """opdump takes the batch kernel where one is registered on the backend's
    key (cpp/device/device_reduce.cpp): TESTDEV_FUSED_BATCH=0, or
    TESTDEV_FUSED_STATS=0, registers none."""
    code = """
has = torch._C._dispatch_has_kernel_for_dispatch_key
r = {"batch": testdev.fused_batch_enabled(), "single": testdev.fused_stats_enabled(),
     "kernel": has("opdump::fused_stats_batch", "PrivateUse1"),
     "single_kernel": has("opdump::fused_stats", "PrivateUse1")}
if r["kernel"]:
    x = torch.randn(5).to("testdev")
    for sketch in (32, 2, 3, 64, -2, 1):
        try:
            r[str(sketch)] = list(torch.ops.opdump.fused_stats_batch([x], sketch).shape)
        except RuntimeError as e:
            r[str(sketch)] = "refused" if "power of two" in str(e) else str(e)
print(json.dumps(r))
"""
    on = run(code, testdev=True)
    assert on.returncode == 0, on.stderr
    refused = {s: "refused" for s in ("3", "64", "-2", "1")}
    assert on.result() == {"batch": True, "single": True, "kernel": True, "single_kernel": True,
                           "32": [1, 43], "2": [1, 13], **refused}
    for env, single in (({"TESTDEV_FUSED_BATCH": "0"}, True), ({"TESTDEV_FUSED_STATS": "0"}, False)):
        off = run(code, testdev=True, **env)
        assert off.returncode == 0, off.stderr
        expected = {"batch": False, "single": single, "kernel": False, "single_kernel": single}
        assert off.result() == expected, env
    bad = run("print(json.dumps(1))", testdev=True, TESTDEV_FUSED_BATCH="yes")
    assert bad.returncode != 0
    assert 'ValueError: testdev: bad environment: TESTDEV_FUSED_BATCH="yes" is not 0 or 1' in bad.stderr


def test_rows_give_what_opdump_records_on_the_cpu(run):
    """The limbs and y of a row, finished as opdump finishes them (F, then
    the sketch H y), equal the fingerprint and sketch opdump records for the
    same values on the CPU with OPDUMP_SKETCH=16 (its own kernels,
    cpp/signature/signature.cpp)."""
    job = run(TENSORS + f"""
torch.ops.opdump.enable()
for t in host:
    torch.ops.aten.alias(t)
torch.ops.opdump.flush()
torch.ops.opdump.disable()
out = torch.ops.opdump.fused_stats_batch(dev[:len(host)], {K})
print(json.dumps(out.cpu().tolist()))
""", testdev=True, OPDUMP_SKETCH=str(K))
    assert job.returncode == 0, job.stderr
    rows = np.array(job.result())
    t = job.table()
    rec = t[(t.op == "aten::alias") & (t.role == "input")]
    assert len(rec) == len(rows) == 8
    hadamard = np.array([[(-1) ** bin(b & j).count("1") for j in range(K)] for b in range(K)], dtype=float)
    for (_, r), row in zip(rec.iterrows(), rows):
        f = (int(row[8]) + (int(row[9]) << 16) + (int(row[10]) << 32)) % 2**64
        assert f == int(r.fingerprint), (r.tensor_dtype, f, r.fingerprint)
        sketch = hadamard @ row[11:]
        atol = 1e-9 * np.abs(row[11:]).sum()
        assert np.allclose(sketch, np.array(r.sketch), rtol=1e-12, atol=atol), r.tensor_dtype
