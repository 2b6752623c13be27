"""Op shapes: in-place, out=, list returns and inputs, factory ops,
ops that return nothing, and an op that raises."""

import math
import textwrap

import torch

from conftest import MEASURED, assert_stats_match, ref_stats


def test_op_shapes(run, tmp_path):
    job = run("""
    torch.manual_seed(1)
    a = torch.randn(4, 5)
    b = torch.randn(4, 5)
    torch.save({"a": a.clone(), "b": b.clone()}, "in.pt")
    torch.ops.opdump.enable()
    a.add_(b)                                  # in-place
    out = torch.empty(4, 5)
    torch.add(a, b, out=out)                   # out=
    parts = torch.split(out, 2)                # list return
    cat = torch.cat([parts[1], parts[0]])      # list input
    r = torch.randn(3, 3)                      # factory
    xs = [torch.ones(2), torch.zeros(3)]
    torch._foreach_add_(xs, 2.0)               # returns nothing
    err = None
    try:
        torch.mm(torch.ones(2, 3), torch.ones(2, 3))
    except RuntimeError as e:
        err = str(e)
    torch.ops.opdump.flush()
    torch.save({"a": a, "out": out, "cat": cat, "r": r}, "out.pt")
    print(json.dumps({"err": err}))
    """)
    assert job.returncode == 0, job.stderr
    t = job.table()
    before = torch.load(tmp_path / "in.pt")
    after = torch.load(tmp_path / "out.pt")
    top = t[t.depth == 0]

    add_ = top[top.op == "aten::add_"].set_index(["role", "arg"])
    assert add_.loc[("input", "self")].stats_status in MEASURED
    assert_stats_match(add_.loc[("input", "self")], ref_stats(before["a"]), what="add_ self before")
    assert_stats_match(add_.loc[("output", "0")], ref_stats(after["a"]), what="add_ result")

    add_out = top[(top.op == "aten::add") & (top.overload == "out")].set_index(["role", "arg"])
    assert add_out.loc[("input", "out")].stats_status == "uninitialized"
    assert math.isnan(add_out.loc[("input", "out")]["min"])
    assert_stats_match(add_out.loc[("output", "0")], ref_stats(after["out"]), what="add out=")

    split = top[top.op == "aten::split"]
    outs = split[split.role == "output"].sort_values("list_index")
    assert outs.list_index.tolist() == [0, 1] and set(outs.arg) == {"0"}
    assert [list(s) for s in outs["shape"]] == [[2, 5], [2, 5]]

    cat = top[top.op == "aten::cat"]
    ins = cat[cat.role == "input"].sort_values("list_index")
    assert ins.arg.tolist() == ["tensors", "tensors"] and ins.list_index.tolist() == [0, 1]
    assert_stats_match(cat[cat.role == "output"].iloc[0], ref_stats(after["cat"]), what="cat")

    randn = top[top.op == "aten::randn"]
    assert (randn.role == "output").all() and len(randn) == 1
    assert_stats_match(randn.iloc[0], ref_stats(after["r"]), what="randn")
    # The nested fill of randn's fresh memory is not measured as values.
    nested = t[(t.parent_seq == randn.iloc[0].seq) & (t.op == "aten::empty")]
    assert (nested.stats_status == "uninitialized").all()

    fe = top[top.op == "aten::_foreach_add_"]
    outs = fe[fe.role == "output"].sort_values("list_index")
    assert outs.arg.tolist() == ["self", "self"]
    assert outs["min"].tolist() == [3.0, 2.0] and outs["max"].tolist() == [3.0, 2.0]

    mm = top[top.op == "aten::mm"]
    assert len(mm.drop_duplicates("seq")) == 1
    msg = job.result()["err"]
    assert msg and "cannot be multiplied" in msg
    assert mm.iloc[0].error is not None and "cannot be multiplied" in mm.iloc[0].error
    assert (mm.role == "input").all()


def test_user_error_unchanged(run):
    code = """
    try:
        torch.mm(torch.ones(2, 3), torch.ones(2, 3))
    except RuntimeError as e:
        print(json.dumps({"type": type(e).__name__, "msg": str(e)}))
    """
    off = run(code, load=False)
    on = run(code, OPDUMP=1)
    assert on.returncode == 0 and off.returncode == 0
    assert on.result() == off.result()


def test_argument_text_of_layouts_memory_formats_and_devices(run):
    """The args column names layouts, memory formats and devices as torch
    prints them, at an op's first call and at its later ones (the hook keeps
    their text per thread after the first)."""
    job = run("""
    torch.ops.opdump.enable()
    for _ in range(3):
        torch.empty(2, 3, layout=torch.strided, device="cpu")
        torch.empty(1, 2, 3, 4, memory_format=torch.channels_last)
        torch.zeros(2, dtype=torch.float64, layout=torch.strided, device=torch.device("cpu"))
        torch.ones(2, 3).contiguous(memory_format=torch.preserve_format)
        torch.ones(4).to_sparse()
    torch.ops.opdump.flush()
    """)
    assert job.returncode == 0, job.stderr
    calls = job.table().drop_duplicates("seq").sort_values("seq")
    texts = {}
    for op, args in zip(calls.op, calls.args):
        texts.setdefault((op, args), 0)
        texts[(op, args)] += 1
    expected = [
        ("aten::empty", "size=[2, 3], dtype=None, layout=Strided, device=cpu, pin_memory=False, memory_format=None"),
        (
            "aten::empty",
            "size=[1, 2, 3, 4], dtype=None, layout=None, device=cpu, pin_memory=False, memory_format=ChannelsLast",
        ),
        ("aten::empty", "size=[2], dtype=float64, layout=Strided, device=cpu, pin_memory=False, memory_format=None"),
        ("aten::clone", "memory_format=Preserve"),
        (
            "aten::_sparse_coo_tensor_with_dims_and_tensors",
            "sparse_dim=1, dense_dim=0, size=[4], dtype=float32, layout=Sparse, device=cpu, pin_memory=None, "
            "is_coalesced=None",
        ),
    ]
    for key in expected:
        assert texts.get(key) == 3, (key, sorted(t for t in texts if t[0] == key[0]))


# Passes each tensor of a dict through aten::alias under opdump: its input
# row holds opdump's statistics of that tensor.
ALIAS_EACH = """
torch.save(tensors, "t.pt")
torch.ops.opdump.enable()
for name, t in tensors.items():
    torch.ops.aten.alias(t)
torch.ops.opdump.flush()
print(json.dumps(list(tensors)))
"""


def alias_rows(run, tmp_path, make_tensors):
    """Runs `make_tensors` (code that fills the dict `tensors`), then
    ALIAS_EACH; yields (name, input row, the saved tensor) in order."""
    job = run(textwrap.dedent(make_tensors) + ALIAS_EACH)
    assert job.returncode == 0, job.stderr
    names = job.result()
    saved = torch.load(tmp_path / "t.pt")
    t = job.table()
    rows = t[(t.op == "aten::alias") & (t.role == "input")].sort_values("seq")
    assert len(rows) == len(names)
    for name, (_, row) in zip(names, rows.iterrows()):
        yield name, row, saved[name]


def test_values_nan_inf_empty_int_bool(run, tmp_path):
    rows = []
    for name, row, ten in alias_rows(run, tmp_path, """
    tensors = {
        "f32": torch.tensor([1.0, float("nan"), float("inf"), -float("inf"), 0.0, -3.5]),
        "bf16": torch.tensor([0.1, -2.5, float("nan"), 0.0], dtype=torch.bfloat16),
        "f16": torch.tensor([65504.0, -1e-3, float("-inf")], dtype=torch.float16),
        "f64": torch.randn(1000, dtype=torch.float64) * 1e6 + 1e9,
        "empty": torch.empty(0, 3),
        "allnan": torch.full((4,), float("nan")),
        "i64": torch.tensor([-5, 0, 7, 2**40]),
        "u8": torch.tensor([0, 255, 3], dtype=torch.uint8),
        "bool": torch.tensor([True, False, True, True]),
        "c64": torch.tensor([3 + 4j, 0j, -1j]),
        "strided": torch.arange(24.0).reshape(4, 6)[:, ::2],
        "transposed": torch.randn(5, 7).t(),
        "expanded": torch.randn(3, 1).expand(3, 4),
    }
    """):
        rows.append(row)
        assert row.stats_status in MEASURED, name
        assert row["dtype"] == str(ten.dtype).removeprefix("torch."), name
        assert row.numel == ten.numel()
        assert_stats_match(row, ref_stats(ten), rtol=1e-9, atol=1e-12, what=name)
    f32 = rows[0]
    assert (f32.nan_count, f32.posinf_count, f32.neginf_count, f32.zero_count) == (1, 1, 1, 1)


def test_values_vector_kernel_blocks(run, tmp_path):
    """Float tensors long enough for the vector kernels (blocks of 1024,
    vectors of 32, 16 and 8, scalar tails), with NaN and infinities in some
    blocks only, a large mean against the spread (on either side of the
    AVX-512 kernel's limit), an outlier as the first value of every block
    (the AVX2 kernel's pivot), and a tensor large enough to be split into
    chunks measured in parallel."""
    for name, row, ten in alias_rows(run, tmp_path, """
    g = torch.Generator().manual_seed(3)
    tensors = {}
    for dt in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        name = str(dt).removeprefix("torch.")
        for n in (7, 16, 23, 1024, 1031, 3000):
            tensors[f"{name}-{n}"] = (torch.randn(n, generator=g, dtype=torch.float64) * 3 + 1).to(dt)
        x = torch.randn(5000, generator=g, dtype=torch.float64).to(dt)
        x[1500] = float("nan"); x[1600] = float("inf"); x[4999] = -float("inf"); x[10:20] = 0
        tensors[f"{name}-nonfinite"] = x
        # The kernels count NaN and infinities in their vectors: before a
        # block's first finite value (its pivot), a block of them alone, in
        # the last vectors and the scalar tail (an attention mask's -inf).
        z = torch.randn(2100, generator=g, dtype=torch.float64) * 2 + 5
        z[:3] = float("nan")
        z[3] = -float("inf")
        z[1024:2048] = -float("inf")
        z[2050:2060:3] = float("nan")
        z[2090:] = float("inf")
        tensors[f"{name}-masked"] = z.to(dt)
        tensors[f"{name}-offset"] = (torch.rand(4096, generator=g, dtype=torch.float64) + 1000).to(dt)
        # The AVX-512 kernel takes float32 blocks whose mean is at most about
        # 32 times their spread, and leaves the others to the AVX2 kernel.
        for mean in (31, 33):
            w = torch.randn(2048, generator=g, dtype=torch.float64) + mean
            w[5:9] = 0
            tensors[f"{name}-mean{mean}"] = w.to(dt)
        y = torch.rand(4100, generator=g, dtype=torch.float64) + 1000
        y[::1024] = -60000.0
        tensors[f"{name}-pivots"] = y.to(dt)
    big = torch.randn(3_000_001, generator=g)
    big[2_000_000] = float("nan")
    tensors["float32-chunks"] = big
    tensors["float64-huge"] = torch.full((2000,), 1e307, dtype=torch.float64)
    """):
        assert row.stats_status == "computed", name
        ref = ref_stats(ten)
        if name == "float64-huge":  # the float64 sum overflows, in torch too
            ref = {k: v for k, v in ref.items() if k not in ("mean", "std", "l2")}
        assert_stats_match(row, ref, rtol=1e-9, atol=1e-12, what=name)
