"""The device path (cpp/device/device_stats.cpp) on the test device: bounded extra
memory, no wait on the job's thread, nothing launched during a graph
capture, the same records as a synchronous measurement, and the pool of
pending results under OPDUMP_QUEUE_FULL's rules.

testdev counts what the device sees (tests/testdev/README.md): the bytes it
holds, host waits per thread, the launches of an observer (ops run with
opdump's dispatch key excluded, as its statistics are) and what happens
while a capture is marked."""

import math

import pytest

from conftest import MEASURED, ROOT

STATS = ("min", "max", "mean", "std", "l2", "absmax", "nan_count", "posinf_count", "neginf_count", "zero_count")

# One AdamW step of the demo's TinyLM on testdev; `steps` of them, the first
# a warm-up. Prints the counters of the last step.
TINYLM_STEPS = """
import sys
sys.path.insert(0, {scripts!r})
import tinylm
import torch.nn.functional as F
testdev.set_job_thread()
model = tinylm.make(0).to("testdev")
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = [(x.to("testdev"), y.to("testdev")) for x, y in tinylm.batches({steps})]
def step(x, y):
    opt.zero_grad()
    loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
    loss.backward()
    opt.step()
    return loss
for i, (x, y) in enumerate(data):
    if i == len(data) - 1:
        testdev.reset_counters()
        before = torch.ops.opdump.device_stats()
        if {on}:
            torch.ops.opdump.enable()
    loss = step(x, y)
waits = testdev.host_waits()
torch.ops.opdump.disable()
torch.ops.opdump.flush()
after = torch.ops.opdump.device_stats()
print(json.dumps({{"waits": waits, "waits_after_flush": testdev.host_waits(), "launches": testdev.launches(),
                  "measured": after[0] - before[0], "device_stats": after,
                  "loss": float(loss)}}))
"""


def tinylm_job(run, steps=2, on=True, **env):
    job = run(TINYLM_STEPS.format(scripts=str(ROOT / "scripts"), steps=steps, on=on), testdev=True, **env)
    assert job.returncode == 0, job.stderr
    return job


def test_measuring_a_large_tensor_takes_bounded_device_memory(run, kernel):
    """A 512 MiB float32 tensor is measured with at most 64 MiB of extra
    device memory (kDeviceScratchBytes), against values whose statistics are
    known exactly: a NaN, +inf and -inf in different pieces of the tensor."""
    job = run("""
    n = 128 * 1024 * 1024                     # 512 MiB of float32
    host = (torch.arange(n, dtype=torch.int32) % 1000).float()
    host[5] = float("nan"); host[n // 2 + 3] = float("inf"); host[n - 2] = -float("inf")
    t = host.to("testdev")
    del host
    torch.ops.opdump.enable()
    testdev.reset_peak_memory_stats()
    base = testdev.memory_allocated()
    torch.ops.aten.alias(t)
    torch.ops.opdump.flush()
    peak = testdev.max_memory_allocated() - base
    torch.ops.opdump.disable()
    print(json.dumps({"peak": peak, "device_stats": torch.ops.opdump.device_stats()}))
    """, testdev=True, timeout=600, **kernel)
    assert job.returncode == 0, job.stderr
    r = job.result()
    assert r["peak"] <= 64 * 2**20, f"measuring took {r['peak'] / 2**20:.1f} MiB of device memory"
    assert r["peak"] > 0, "nothing was allocated: the measurement did not run on the device"
    t = job.table()
    row = t[(t.op == "aten::alias") & (t.role == "input")].iloc[0]
    assert row.stats_status == "computed"
    n = 128 * 1024 * 1024
    finite = n - 3
    # Values 0..999 repeated; the three non-finite ones replace 5 % 1000,
    # (n/2+3) % 1000 and (n-2) % 1000.
    removed = [5 % 1000, (n // 2 + 3) % 1000, (n - 2) % 1000]
    total = (n // 1000) * sum(range(1000)) + sum(range(n % 1000)) - sum(removed)
    mean = total / finite
    assert (row.nan_count, row.posinf_count, row.neginf_count) == (1, 1, 1)
    assert row.zero_count == n // 1000 + (1 if n % 1000 > 0 else 0)
    assert (row["min"], row["max"]) == (0.0, 999.0)
    assert math.isclose(row["mean"], mean, rel_tol=1e-12)


def test_tensors_in_many_pieces_equal_cpu_statistics(run, kernel):
    """Tensors over a piece (2**20 elements), dense or not, with NaN and
    infinities in some pieces and a piece with no finite value at all, give
    the CPU's statistics."""
    job = run("""
    torch.manual_seed(0)
    a = torch.randn(3 * 2**20 + 7, dtype=torch.float64) * 50 + 3
    a[10] = float("nan"); a[2**20 + 1] = float("inf"); a[3 * 2**20 + 2] = -float("inf")
    a[2**21:2**21 + 2**20] = float("nan")          # the third piece: nothing finite
    b = torch.randn(3000, 1500).to(torch.bfloat16)
    c = torch.randn(700, 1, 3000)
    bases = [a, a.float(), b, c, a.to(torch.complex64)]
    # b: every third column, not dense (1.5 M elements); c: broadcast (4.2 M)
    views = [lambda t: t, lambda t: t, lambda t: t[:, ::3], lambda t: t.expand(700, 2, 3000), lambda t: t]
    tensors = [v(t) for v, t in zip(views, bases)]
    devs = [v(t.to("testdev")) for v, t in zip(views, bases)]
    torch.ops.opdump.enable()
    for t in tensors + devs:
        torch.ops.aten.alias(t)
    torch.ops.opdump.flush()
    print(json.dumps(len(tensors)))
    """, testdev=True, OPDUMP_REUSE="0", timeout=600, **kernel)
    assert job.returncode == 0, job.stderr
    n = job.result()
    t = job.table()
    rows = t[(t.op == "aten::alias") & (t.role == "input")].sort_values("seq")
    cpu, dev = rows.iloc[:n], rows.iloc[n:]
    for (_, x), (_, y) in zip(cpu.iterrows(), dev.iterrows()):
        assert y.stats_status == "computed", y.stats_status
        for k in STATS:
            u, v = x[k], y[k]
            if isinstance(u, float) and math.isnan(u):
                assert math.isnan(v), (x.dtype, k)
            else:
                assert math.isclose(u, v, rel_tol=1e-12, abs_tol=1e-300), (x.dtype, x.shape, k, u, v)


# Tensors around the staging rows' width (1,024 elements), with what the
# rows must take apart: NaN and infinities, zeros, a large mean against a
# small spread, nothing finite, no element, non-contiguous memory. Each is
# measured held, then read in a batch.
STAGED_ROWS = """
import math
torch.manual_seed(0)
a = torch.randn(200003) * 3 + 1e4
a[5] = float("nan"); a[1024] = float("inf"); a[150000] = -float("inf"); a[7:1030:3] = 0
b = torch.randn(1025, dtype=torch.float64) * 1e-3 - 7
c = torch.randn(3, 1023).to(torch.bfloat16)
d = torch.arange(-500, 2500)
e = torch.rand(5000) < 0.3
f = torch.tensor(2.5)
g = torch.full((1500,), float("nan"))
h = torch.randn(1024) + 1e6
i = torch.randn(300, 700).t()
j = torch.randn(4096).half()
k = torch.randn(400, 900)[:, ::3]
m = torch.empty(0)
n = torch.randn(300000, dtype=torch.float64)
# int64: with the sketch their words go into rows of their own after their
# values, which must leave their statistics and their neighbours' alone.
o = torch.randint(-(2**40), 2**40, (3000,))
p = torch.arange(-5, 1500)
tensors = [a, b, c, d, e, f, g, h, i, j, k, m, n, o, p]
devs = [x.to("testdev") for x in tensors]
devs[8] = tensors[8].t().to("testdev").t()      # dense, not contiguous, on the device too
devs[10] = torch.randn(400, 900).to("testdev")[:, ::3]
tensors[10] = devs[10].cpu()
torch.ops.opdump.enable()
for x in devs:
    torch.ops.aten.alias(x)
torch.ops.opdump.flush()
torch.ops.opdump.disable()
ref = []
for x in tensors:
    v = x.to(torch.float64).flatten()
    fin = v[torch.isfinite(v)]
    r = {"nan_count": int(torch.isnan(v).sum()), "posinf_count": int(torch.isposinf(v).sum()),
         "neginf_count": int(torch.isneginf(v).sum()), "zero_count": int((v == 0).sum())}
    if fin.numel():
        vals = fin.tolist()
        mean = math.fsum(vals) / len(vals)          # the exact sum, rounded once
        r.update(min=min(vals), max=max(vals), mean=mean, abs_mean=math.fsum(abs(u) for u in vals) / len(vals),
                 std=math.sqrt(math.fsum((u - mean) ** 2 for u in vals) / len(vals)),
                 torch_mean=float(fin.mean()), torch_std=float(fin.std(unbiased=False)),
                 torch_l2=float(torch.linalg.vector_norm(fin)))
    ref.append(r)
print(json.dumps(ref))
"""


def ulps(got, want):
    return abs(got - want) / math.ulp(want) if want != 0 else abs(got) / 5e-324


@pytest.mark.parametrize("sketch", ["0", "16"])
def test_staged_rows_equal_torch_float64_reductions(run, sketch):
    """The staging buffer's rows (cpp/device/device_reduce.cpp, row_stats)
    give each held tensor the statistics of torch's own float64 reductions:
    counts and extremes exactly; the mean within 2 ulps of the exact one
    (the sum of the finite values rounded once) where the sum does not
    cancel, and where it does within what float64 sums in any order allow
    (2^-52 of the mean magnitude: the float64 randn's mean is 10 ulps off,
    torch's own 8); the deviation within 2^-44 of a two-pass one over the
    exact mean. With and without the sketch (a batch of another size)."""
    job = run(STAGED_ROWS, testdev=True, OPDUMP_REUSE="0", OPDUMP_SKETCH=sketch, TESTDEV_FUSED_STATS="0")
    assert job.returncode == 0, job.stderr
    ref = job.result()
    t = job.table()
    rows = t[(t.op == "aten::alias") & (t.role == "input")].sort_values("seq")
    assert len(rows) == len(ref)
    worst = {"mean": 0.0, "std": 0.0, "torch_mean": 0.0}
    each = []
    for (_, row), r in zip(rows.iterrows(), ref):
        what = (row["dtype"], row["shape"])
        assert row.stats_status == "computed", what
        for key in ("nan_count", "posinf_count", "neginf_count", "zero_count"):
            assert row[key] == r[key], (what, key, row[key], r[key])
        if "mean" not in r:
            assert math.isnan(row["mean"]) and math.isnan(row["min"]), what
            continue
        assert (row["min"], row["max"]) == (r["min"], r["max"]), what
        worst["mean"] = max(worst["mean"], ulps(row["mean"], r["mean"]))
        each.append(f"{row['dtype']}{[int(d) for d in row['shape']]} "
                    f"{ulps(row['mean'], r['mean']):.0f}/{ulps(row['std'], r['std']):.0f}")
        worst["torch_mean"] = max(worst["torch_mean"], ulps(r["torch_mean"], r["mean"]))
        allowed = 2 * math.ulp(r["mean"]) + 2**-52 * r["abs_mean"]
        assert abs(row["mean"] - r["mean"]) <= allowed, (what, row["mean"], r["mean"], r["torch_mean"])
        assert math.isclose(row["std"], r["std"], rel_tol=2**-44, abs_tol=1e-300), (what, row["std"], r["std"])
        worst["std"] = max(worst["std"], ulps(row["std"], r["std"]))
        assert math.isclose(row["l2"], r["torch_l2"], rel_tol=2**-40), (what, row["l2"], r["torch_l2"])
    print(f"sketch {sketch}: worst ulps from the exact mean {worst['mean']:.1f} (torch's float64 mean "
          f"{worst['torch_mean']:.1f}), from the float64 two-pass deviation {worst['std']:.1f}; "
          f"ulps of mean/std per tensor: {', '.join(each)}")


def test_a_training_step_waits_on_the_job_thread_at_most_once_per_256_tensors(run, kernel):
    off = tinylm_job(run, on=False, **kernel).result()
    on = tinylm_job(run, **kernel).result()
    extra = on["waits"]["job"] - off["waits"]["job"]
    assert on["measured"] > 500, on
    assert extra <= on["measured"] // 256, (on, off)
    # The results were waited for, by opdump's own thread.
    assert on["waits_after_flush"]["other"] > 0, on
    assert on["device_stats"][1] == 0 and on["device_stats"][4] == 0, on
    assert math.isclose(on["loss"], off["loss"], rel_tol=0, abs_tol=0), "opdump changed the job's numbers"


# Calls whose presence depends on whether a gradient's memory is held:
# autograd adds two gradients of one tensor in place only when nothing else
# holds that memory (InputBuffer::accumulate), so while opdump holds a
# measured gradient until its batch closes the sum is an `add`, not an
# `add_`, and testdev's copies around it differ. Same values.
ACCUMULATION = {"aten::add", "aten::add_", "aten::to", "aten::_to_copy", "aten::_copy_from", "aten::_to_cpu",
                "aten::copy_", "aten::empty_strided", "aten::_copy_from_and_resize", "aten::detach",
                "aten::new_empty_strided"}


def paired_calls(a, b):
    """Pairs the calls of two dumps of one program by their ops in order
    (difflib); returns {seq in a: seq in b} and the ops left unpaired."""
    import difflib

    ca = a.drop_duplicates("seq").sort_values("seq")[["seq", "op", "overload", "depth"]]
    cb = b.drop_duplicates("seq").sort_values("seq")[["seq", "op", "overload", "depth"]]
    m = difflib.SequenceMatcher(None, list(zip(ca.op, ca.overload, ca.depth)), list(zip(cb.op, cb.overload, cb.depth)),
                                autojunk=False)
    pairs, unpaired = {}, []
    sa, sb = list(ca.seq), list(cb.seq)
    last_a = last_b = 0
    for blk in m.get_matching_blocks():
        unpaired += list(ca.op.iloc[last_a:blk.a]) + list(cb.op.iloc[last_b:blk.b])
        for k in range(blk.size):
            pairs[sa[blk.a + k]] = sb[blk.b + k]
        last_a, last_b = blk.a + blk.size, blk.b + blk.size
    return pairs, unpaired


def assert_same_records(a, b):
    """Every paired call has the same rows, statuses, statistics,
    fingerprints and sketches, to the bit."""
    pairs, unpaired = paired_calls(a, b)
    assert len(pairs) >= 0.99 * a.seq.nunique() > 1000, (len(pairs), a.seq.nunique())
    assert set(unpaired) <= ACCUMULATION, sorted(set(unpaired) - ACCUMULATION)
    keys = ["seq", "role", "arg", "list_index"]
    a = a[a.seq.isin(pairs.keys())].copy()
    a["seq"] = a.seq.map(pairs)
    b = b[b.seq.isin(pairs.values())]
    a = a.sort_values(keys).reset_index(drop=True)
    b = b.sort_values(keys).reset_index(drop=True)
    assert len(a) == len(b) > 1000
    for col in ["op", "role", "arg", "tensor_device", "numel"]:
        differ = (a[col] != b[col]) & ~(a[col].isna() & b[col].isna())
        assert not differ.any(), (col, a[differ][keys + ["op", col]].head(8).to_string())
    # The statuses too: which memory a nested call may read is judged by
    # storage (cpp/hook/provenance.cpp), never by an address the allocator may
    # hand out again in another order.
    status = (a.stats_status != b.stats_status) & ~(a.stats_status.isna() & b.stats_status.isna())
    assert not status.any(), a[status][keys + ["op", "stats_status"]].head(8).to_string()
    dev = a.tensor_device == "testdev:0"
    assert a[dev].stats_status.isin(MEASURED).sum() > 500
    assert not a[dev].stats_status.isin(["capturing", "dropped", "failed"]).any()
    # testdev's fallback runs `mm` on the CPU into a copy of its unwritten
    # out buffer, and the CPU kernel calls resolve_conj on that buffer before
    # it writes it: those rows read whatever the memory held, different in
    # every run (a testdev artifact: on a real device the buffer is made
    # outside the dispatcher, and provenance marks it not measured).
    unwritten = (a.op == "aten::resolve_conj") & (a.tensor_device == "cpu") & (a.depth >= 2)
    a, b = a[~unwritten], b[~unwritten]
    assert len(a) > 1000
    for col in STATS:
        x, y = a[col].to_numpy(dtype=float), b[col].to_numpy(dtype=float)
        same = (x == y) | (x != x) & (y != y)
        assert same.all(), (col, a[~same][["seq", "op", "arg", col]].head(), b[~same][col].head())
    fa, fb = a.fingerprint.astype("object"), b.fingerprint.astype("object")
    same = (fa == fb) | (fa.isna() & fb.isna())
    assert same.all(), a[~same][["seq", "op", "arg", "fingerprint"]].head()
    return a


def test_asynchronous_records_equal_synchronous_ones(run, kernel):
    """OPDUMP_DEVICE_SYNC=1 waits for each measurement on the job's thread:
    the same rows, with the same values to the bit, with the fingerprint and
    sketch too. Held tensors written in place by the optimizer, out= calls,
    views and tensors the job frees before their batch closes are all part
    of a training step."""
    a = tinylm_job(run, OPDUMP_SKETCH="16", **kernel).table()
    b = tinylm_job(run, OPDUMP_DEVICE_SYNC="1", OPDUMP_SKETCH="16", **kernel).table()
    a = assert_same_records(a, b)
    dev = a[(a.tensor_device == "testdev:0") & a.stats_status.isin(["computed"])]
    assert dev.fingerprint.notna().mean() > 0.99, dev[dev.fingerprint.isna()][["op", "dtype"]].head()
    sk_a = [tuple(v) for v in a.sketch.dropna()]
    assert len(sk_a) > 500


# In-place writes into held tensors, out= into one, a write through a view,
# a tensor freed before its batch closes, and a foreach op over held
# tensors; then the values every row must show, computed on the CPU.
HELD = """
import torch
torch.manual_seed(0)
testdev.set_job_thread()
xc = torch.randn(300, 7)
x = xc.to("testdev")
torch.ops.opdump.enable()
y = x * 2                       # held
y.add_(1)                       # writes y: y's row above holds x * 2
z = torch.empty(300, 7, device="testdev")
w = x + 3                       # held
torch.exp(x, out=w)             # out= into held memory: w's row holds x + 3
v = y.view(-1)
v.mul_(-1)                      # a write through a view of held y
f = x - 5                       # held, then freed by the job
del f
g = torch.randn(300, 7).to("testdev")
ps = [x * k for k in (1.0, 2.0, 3.0)]   # held
torch._foreach_add_(ps, 1.0)   # one op writes all three
torch.ops.opdump.flush()
print(json.dumps(torch.ops.opdump.device_stats()))
"""


def test_a_held_tensor_written_in_place_is_measured_before_the_write(run, kernel):
    """Each output keeps the values it had when its op returned, though the
    job writes its memory (in place, out=, through a view, by a foreach op)
    or frees it before the batch is read: checked against the same values
    on the CPU, and against a synchronous run, to the bit."""
    job = run(HELD, testdev=True, OPDUMP_SKETCH="16", **kernel)
    assert job.returncode == 0, job.stderr
    early = job.result()[5]
    assert early >= 3, job.result()  # add_, exp.out, mul_ through the view, the foreach
    t = job.table()
    import torch

    torch.manual_seed(0)
    xc = torch.randn(300, 7)
    want = {  # (op, role, arg) of the first such row -> values
        ("aten::mul", "output"): [xc * 2] + [xc * k for k in (1.0, 2.0, 3.0)],
        ("aten::add_", "input"): [xc * 2],
        ("aten::add_", "output"): [xc * 2 + 1],
        ("aten::add", "output"): [xc + 3],
        ("aten::exp", "output"): [xc.exp()],
        ("aten::mul_", "input"): [xc * 2 + 1],
        ("aten::mul_", "output"): [-(xc * 2 + 1)],
        ("aten::sub", "output"): [xc - 5],
    }
    # The job's own calls (testdev runs in-place ops as nested copies).
    dev = t[(t.tensor_device == "testdev:0") & (t.depth == 0)].sort_values("seq")
    for (op, role), values in want.items():
        rows = dev[(dev.op == op) & (dev.role == role) & (dev.numel == 2100)]
        assert len(rows) >= len(values), (op, role, rows[["seq", "stats_status"]])
        for (_, row), ref in zip(rows.iterrows(), values):
            ref = ref.double()
            assert row.stats_status in MEASURED, (op, role, row.stats_status)
            assert math.isclose(row["min"], ref.min().item(), rel_tol=1e-12), (op, role, row["min"], ref.min())
            assert math.isclose(row["max"], ref.max().item(), rel_tol=1e-12), (op, role)
            assert math.isclose(row["mean"], ref.mean().item(), rel_tol=1e-9, abs_tol=1e-12), (op, role)
    fe = dev[(dev.op == "aten::_foreach_add_") & (dev.role == "input")]
    assert len(fe) == 3
    for (_, row), k in zip(fe.sort_values("list_index").iterrows(), (1.0, 2.0, 3.0)):
        assert math.isclose(row["max"], (xc * k).max().item(), rel_tol=1e-12), (k, row["max"])
    sync = run(HELD, testdev=True, OPDUMP_SKETCH="16", OPDUMP_DEVICE_SYNC="1", **kernel)
    assert sync.returncode == 0, sync.stderr
    s = sync.table()
    keys = ["seq", "role", "arg", "list_index"]
    a = t.sort_values(keys).reset_index(drop=True)
    b = s.sort_values(keys).reset_index(drop=True)
    assert list(a.op) == list(b.op)
    for col in STATS + ("fingerprint",):
        x, y = a[col].to_numpy(dtype=object), b[col].to_numpy(dtype=object)
        same = [(u == v) or (u != u and v != v) or (u is None and v is None) for u, v in zip(x, y)]
        assert all(same), (col, a[[not q for q in same]][["seq", "op", "role", col]])


def test_a_training_step_launches_few_kernels_per_measured_tensor(run, kernel):
    """opdump's own launches (testdev's observer count) over one TinyLM
    training step, per measured device tensor, with statistics alone and
    with the sketch: a count, not a time. testdev runs the optimizer's
    `_foreach_` ops as one kernel each (TESTDEV_FOREACH=1), as CUDA does.
    The bounds are today's figures with some room (scripts/bench/run.py
    reports them): with the batch kernel 0.017 per tensor (bound: issue
    47's goal of 0.02, the reads before the optimizer's writes included:
    a batch holds up to 32 MiB of the job's memory), with ATen ops
    0.093 for the statistics (bound: issue 47's goal of 0.1) and 0.248 with
    the sketch (int64 words staged as int32 rows, the sketch by one
    embedding_bag a batch, a tensor read before a write staged with
    them)."""
    fused = kernel["TESTDEV_FUSED_STATS"] == "1"
    bounds = {"0": 0.02 if fused else 0.1, "16": 0.02 if fused else 0.28}
    for sketch, limit in bounds.items():
        r = tinylm_job(run, OPDUMP_SKETCH=sketch, TESTDEV_HIDE_FALLBACK="1", TESTDEV_FOREACH="1", **kernel).result()
        per = r["launches"]["observer"] / r["measured"]
        assert r["measured"] > 500, r
        print(f"sketch {sketch}: {per:.3f} launches per measured tensor")
        assert per <= limit, (sketch, per, r)


def test_a_tensor_read_before_its_write_keeps_its_fingerprint(run):
    """Autograd accumulates a gradient in place (add_), which testdev runs
    as add(out=self): the inner add reads memory the outer op is writing,
    so it is staged at once, not held, and its fingerprint and sketch come
    from the staging buffer's rows. They must equal those the same values
    got through the outer add_ (held, or reused from when they were made),
    for its input and its output alike."""
    import pyarrow.parquet as pq

    job = tinylm_job(run, OPDUMP_SKETCH="16", TESTDEV_HIDE_FALLBACK="1", TESTDEV_FOREACH="1",
                     TESTDEV_FUSED_STATS="0")
    # As Python ints: pandas would make the uint64 fingerprints floats.
    rows = [r for f in sorted(job.dump_dir.rglob("part-*.parquet")) for r in pq.read_table(f).to_pylist()
            if r["tensor_device"] == "testdev:0" and (r["role"] == "output" or r["arg"] == "self")]
    outer = {(r["seq"], r["role"]): r for r in rows if r["op"] == "aten::add_" and r["depth"] == 0}
    pairs = 0
    for r in rows:
        if r["op"] != "aten::add" or r["depth"] != 1 or (r["parent_seq"], r["role"]) not in outer:
            continue
        p = outer[(r["parent_seq"], r["role"])]
        what = (r["seq"], r["role"], r["stats_status"], p["stats_status"])
        assert r["stats_status"] == "computed" and p["stats_status"] in MEASURED, what
        assert r["fingerprint"] == p["fingerprint"] is not None, what
        scale = max(abs(v) for v in p["sketch"])
        assert r["sketch"] == pytest.approx(p["sketch"], rel=1e-12, abs=1e-12 * scale), what
        pairs += 1
    assert pairs >= 4, pairs


def test_nothing_is_launched_or_waited_on_while_the_stream_captures(run):
    job = run("""
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).to("testdev")
    x = torch.randn(32, 64).to("testdev")
    testdev.set_job_thread()
    torch.ops.opdump.enable()
    model(x)                                   # measured as usual
    torch.ops.opdump.flush()
    testdev.reset_counters()
    torch.ops.opdump.step()                    # step 1: the captured calls
    with testdev.capture():
        y = model(x)
    counts = testdev.capture_counts()
    torch.ops.opdump.flush()
    print(json.dumps({"capture": counts, "device_stats": torch.ops.opdump.device_stats()}))
    """, testdev=True)
    assert job.returncode == 0, job.stderr
    r = job.result()
    assert r["capture"] == {"observer_launches": 0, "waits": 0}, r
    t = job.table()
    dev = t[t.tensor_device == "testdev:0"]
    before, during = dev[dev.step == 0], dev[dev.step == 1]
    assert len(during) > 10 and (before.stats_status == "computed").sum() > 10
    assert not before.stats_status.isin(["capturing", "failed", "dropped"]).any()
    # Inputs of the captured ops that were measured before the capture are
    # reused (no launch); everything else says why it has no values.
    assert set(during.stats_status) <= {"capturing", "reused", "view", "uninitialized"}, set(during.stats_status)
    assert (during.stats_status == "capturing").sum() > 5
    assert r["device_stats"][2] == (during.stats_status == "capturing").sum()


def test_a_full_pool_of_pending_results_follows_the_queue_rules(run):
    """opdump-device waits 3 s per batch (TESTDEV_SYNC_US): the job fills
    the pool of pending results. With `drop` the measurements that find no
    room are dropped, counted and written with their status; with `block`
    the job waits instead, counted, and nothing is dropped.

    The pool drains one batch (80 measurements) in 3 s, so the job fills it
    unless it measures fewer than 27 tensors a second. With 200 ms a batch, a
    job slowed by a loaded machine (two other busy processes on two cores)
    kept pace with the drain and dropped nothing; with 1 s, one on a machine
    with a load of 9 on two cores did too."""
    job = """
    x = torch.randn(256, 256).to("testdev")
    testdev.set_job_thread()
    torch.ops.opdump.enable()
    for _ in range(600):
        x = torch.tanh(x)
    torch.ops.opdump.flush()
    print(json.dumps(torch.ops.opdump.device_stats()))
    """
    # Statistics only (OPDUMP_SKETCH=0): the launches of fingerprints and
    # sketches would slow the job below the pace that fills the pool.
    # ATen reductions: a batch closes at 57 of these tensors (the staging
    # buffer's 3.75M elements), each measured twice (an output, then the next
    # tanh's input) and read once, where the batch kernel would hold 64
    # (16 MiB).
    dropping = run(job, testdev=True, OPDUMP_QUEUE_FULL="drop", TESTDEV_SYNC_US="3000000", OPDUMP_SKETCH="0",
                   TESTDEV_FUSED_STATS="0")
    assert dropping.returncode == 0, dropping.stderr
    measured, dropped, _, waits, failed, _ = dropping.result()
    t = dropping.table()
    assert dropped > 0 and waits == 0 and failed == 0
    assert (t.stats_status == "dropped").sum() == dropped
    assert (t.stats_status == "computed").sum() >= measured > 0
    blocking = run(job, testdev=True, TESTDEV_SYNC_US="3000000", OPDUMP_SKETCH="0", TESTDEV_FUSED_STATS="0")
    assert blocking.returncode == 0, blocking.stderr
    measured, dropped, _, waits, failed, _ = blocking.result()
    assert dropped == 0 and waits > 0 and failed == 0
    assert (blocking.table().stats_status == "dropped").sum() == 0
