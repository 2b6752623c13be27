"""Memory without values stays `uninitialized` through copies and restrides
(to, clone, copy_, as_strided_, resize_, set_, the CPU fallback's copies of a
device's out= buffers), and becomes `computed` once written: then its
statistics are torch's own."""

import torch

from conftest import MEASURED, assert_stats_match, ref_stats

# Each name maps to memory nothing ever wrote, made in one of the ways above.
NEVER_WRITTEN = """
torch.ops.opdump.enable()
t = {}
t["to"] = torch.empty(6, 5).to(torch.float64)
t["copy_"] = torch.empty(7).copy_(torch.empty(7))
t["copy_bcast"] = torch.empty(3, 4).copy_(torch.empty(4))
t["clone"] = torch.empty(8).clone()
t["contiguous"] = torch.empty(4, 6).t().contiguous()
a = torch.empty(3, 4)
a.as_strided_((4, 3), (1, 4))
t["as_strided_"] = a
r = torch.empty(2, 3)
r.resize_(4, 5)
t["resize_"] = r
src = torch.empty(9)
t["set_tensor"] = torch.empty(0).set_(src)
t["set_source"] = src
t["set_storage"] = torch.empty(0).set_(torch.empty(10).untyped_storage())
for name, x in t.items():
    torch.ops.aten.alias(x)                # reads it: the row under test
torch.ops.opdump.flush()
print(json.dumps(list(t)))
"""


def test_copies_and_restrides_of_empty_stay_uninitialized(run):
    job = run(NEVER_WRITTEN)
    assert job.returncode == 0, job.stderr
    names = job.result()
    t = job.table()
    # Nothing in this job ever holds values: no row, at any depth, is measured.
    measured = t[t.stats_status.isin(MEASURED)]
    assert measured.empty, measured[["seq", "depth", "op", "role", "arg", "stats_status", "max"]]
    assert set(t.stats_status) == {"uninitialized"}
    reads = t[(t.op == "aten::alias") & (t.role == "input")].sort_values("seq")
    assert len(reads) == len(names)
    # The copies and restrides themselves were recorded, nested ones included.
    ops = set(t.op)
    for op in ("aten::_to_copy", "aten::copy_", "aten::clone", "aten::as_strided_", "aten::resize_",
               "aten::set_", "aten::empty_strided"):
        assert op in ops, op


def test_where_restrides_its_fresh_output(run, tmp_path):
    """TensorIterator gives a fresh output the layout of its inputs with
    as_strided_ (T5's `where` over transposed inputs); out= buffers too."""
    job = run("""
    torch.manual_seed(0)
    x = torch.randn(4, 3).t(); y = torch.randn(4, 3).t(); c = (torch.rand(4, 3) > 0.5).t()
    torch.ops.opdump.enable()
    w = torch.where(c, x, y)
    o = torch.where(c, x, y, out=torch.empty(0))
    torch.ops.opdump.flush()
    torch.save({"w": w, "o": o}, "w.pt")
    print(json.dumps(list(w.stride())))
    """)
    assert job.returncode == 0, job.stderr
    assert job.result() == [1, 3]
    t = job.table()
    restride = t[t.op == "aten::as_strided_"]
    assert len(restride) >= 2 and set(restride.stats_status) == {"uninitialized"}
    assert (restride.depth > 0).all()
    ref = torch.load(tmp_path / "w.pt")
    wheres = t[(t.op == "aten::where") & (t.depth == 0) & (t.role == "output")].sort_values("seq")
    assert list(wheres.stats_status) == ["computed", "computed"]
    assert_stats_match(wheres.iloc[0], ref_stats(ref["w"]), what="where")
    assert_stats_match(wheres.iloc[1], ref_stats(ref["o"]), what="where out=")


def test_written_memory_is_computed(run, tmp_path):
    """The counter-case: once written (or when it had values all along), the
    same copies and restrides are measured, and equal torch's reductions."""
    job = run("""
    torch.manual_seed(0)
    x = torch.randn(6, 5)
    torch.ops.opdump.enable()
    t = {}
    a = torch.empty(3, 4)
    a.as_strided_((4, 3), (1, 4))
    a.normal_()                                   # written after the restride
    t["as_strided_then_normal_"] = a
    f = torch.empty(6, 5).to(torch.float64)
    f.copy_(x)                                    # a real copy into the copy of empty
    t["to_then_copy_"] = f
    t["copy_into_empty"] = torch.empty(6, 5).copy_(x)
    t["to_of_values"] = x.to(torch.float64)
    r = torch.empty(2, 3)
    r.resize_(4, 5)
    r.uniform_()
    t["resize_then_uniform_"] = r
    v = torch.randn(10)
    v.resize_(5)                                  # shrinking keeps the values
    t["resize_of_values"] = v
    src = torch.empty(9)
    s = torch.empty(0).set_(src)
    src.uniform_()                                # written through the other tensor
    t["set_then_source_written"] = s
    t["set_to_values"] = torch.empty(0).set_(x)
    t["set_source_values"] = x                    # set_ does not taint its source
    t["as_tensor"] = torch.as_tensor([1.0, -2.0, 3.5])
    t["tensor"] = torch.tensor([[1.0, float("nan")], [0.0, 4.0]])
    for name, y in t.items():
        torch.ops.aten.alias(y)
    torch.ops.opdump.flush()
    torch.save(t, "t.pt")
    print(json.dumps(list(t)))
    """)
    assert job.returncode == 0, job.stderr
    names = job.result()
    saved = torch.load(tmp_path / "t.pt")
    t = job.table()
    reads = t[(t.op == "aten::alias") & (t.role == "input")].sort_values("seq")
    assert len(reads) == len(names)
    for name, (_, row) in zip(names, reads.iterrows()):
        assert row.stats_status in MEASURED, (name, row.stats_status)
        assert_stats_match(row, ref_stats(saved[name]), what=name)


def test_device_fallback_copies_of_out_buffers(run, tmp_path):
    """The CPU fallback copies an out= buffer to the CPU (`_to_cpu`), runs
    the op there and copies the result back: the copy is uninitialized, the
    result copied back is computed."""
    job = run("""
    torch.manual_seed(0)
    a = torch.randn(64, 32, device="testdev")
    b = torch.randn(64, 32, device="testdev")
    torch.ops.opdump.enable()
    out = torch.empty(64, 32, device="testdev")
    torch.add(a, b, out=out)
    host = torch.empty(5, device="testdev").cpu()
    host2 = torch.empty(5, device="testdev").cpu()
    host2.fill_(3.0)
    torch.ops.aten.alias(out)
    torch.ops.aten.alias(host)
    torch.ops.aten.alias(host2)
    torch.ops.opdump.flush()
    torch.save({"a": a.cpu(), "b": b.cpu(), "out": out.cpu(), "host2": host2}, "t.pt")
    print(json.dumps(1))
    """, testdev=True)
    assert job.returncode == 0, job.stderr
    saved = torch.load(tmp_path / "t.pt")
    t = job.table()

    add = t[(t.op == "aten::add") & (t.overload == "out") & (t.depth == 0)]
    seq = add.seq.iloc[0]
    # Every call nested in add.out, at any depth.
    inside, frontier = set(), {seq}
    while frontier:
        frontier = set(t[t.parent_seq.isin(frontier)].seq) - inside
        inside |= frontier
    sub = t[t.seq.isin(inside)]
    to_cpu = sub[(sub.op == "aten::_to_cpu") & (sub.role == "output")].sort_values("list_index")
    assert list(to_cpu.stats_status) == ["computed", "computed", "uninitialized"]
    # Whatever is measured inside holds a, b or the sum: no garbage.
    refs = {k: ref_stats(saved[k]) for k in ("a", "b", "out")}
    measured = sub[sub.stats_status.isin(MEASURED)]
    assert len(measured) > 0
    for _, row in measured.iterrows():
        assert any(abs(row.l2 - r["l2"]) <= 1e-9 * r["l2"]
                   and abs(row["mean"] - r["mean"]) <= 1e-9 + 1e-9 * abs(r["mean"])
                   for r in refs.values()), (row.op, row.role, row.arg, row.l2)
    # The fallback's copy back of the result: computed, equal to the sum.
    back = sub[(sub.op == "aten::_copy_from_and_resize") & (sub.role == "output")]
    assert len(back) == 1 and back.iloc[0].stats_status == "computed"
    assert_stats_match(back.iloc[0], refs["out"], rtol=1e-6, what="copied back")
    top = add[add.role == "output"].iloc[0]
    assert_stats_match(top, refs["out"], rtol=1e-6, what="add out=")

    reads = t[(t.op == "aten::alias") & (t.role == "input")].sort_values("seq")
    assert reads.stats_status.iloc[0] in MEASURED
    assert list(reads.stats_status.iloc[1:]) == ["uninitialized", "computed"]
    assert_stats_match(reads.iloc[0], refs["out"], rtol=1e-6, what="out read back")
    assert_stats_match(reads.iloc[2], ref_stats(saved["host2"]), what="written host copy")
    # The copies of the empty device tensor to the CPU: no values anywhere.
    first_to = t[(t.op == "aten::to") & (t.depth == 0)].seq.min()
    inside, frontier = {first_to}, {first_to}
    while frontier:
        frontier = set(t[t.parent_seq.isin(frontier)].seq) - inside
        inside |= frontier
    assert set(t[t.seq.isin(inside)].stats_status) == {"uninitialized"}
