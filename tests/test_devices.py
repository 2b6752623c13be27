"""Two devices in one process: per-device partitions, the device statistics
path against the CPU one, and backward on the device's autograd thread."""

import math

import pyarrow.parquet as pq

from conftest import MEASURED


def test_partitions_route_rows_by_device(run):
    job = run("""
    torch.ops.opdump.enable()
    a = torch.randn(8, 8)
    b = (a @ a).relu()                      # cpu
    d = a.to("testdev")                     # crosses: its output is on testdev
    e = (d @ d).relu().sum()                # testdev
    torch.ops.opdump.flush()
    print(json.dumps(1))
    """, testdev=True)
    assert job.returncode == 0, job.stderr
    parts = sorted(p.parent.name for p in job.dump_dir.rglob("*.parquet"))
    assert set(parts) == {"device=cpu", "device=testdev_0"}
    for f in job.dump_dir.rglob("*.parquet"):
        t = pq.read_table(f).to_pandas()
        want = f.parent.name.removeprefix("device=").replace("_", ":")
        for seq, rows in t.groupby("seq"):
            outs = rows[rows.role == "output"]
            first = (outs if len(outs) else rows).sort_values(["arg", "list_index"]).iloc[0]
            assert first.tensor_device == want, (f, seq, rows.op.iloc[0])
    t = job.table()
    mm = t[(t.op == "aten::matmul") & (t.depth == 0) & (t.role == "output")]
    assert sorted(mm.tensor_device) == ["cpu", "testdev:0"]


def test_device_stats_equal_cpu_stats(run, kernel):
    job = run("""
    torch.manual_seed(0)
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16,
              torch.int64, torch.int32, torch.int8, torch.uint8, torch.bool, torch.complex64]
    tensors = []
    for dt in dtypes:
        base = torch.randn(257, 33, dtype=torch.float64) * 100
        if dt.is_floating_point or dt.is_complex:
            base[0, :3] = torch.tensor([float("nan"), float("inf"), -float("inf")])
            base[5, 7] = 0.0
        t = base.to(dt) if dt != torch.bool else base > 0
        tensors.append(t)
        tensors.append(t[:, ::3])  # not dense
    tensors.append(torch.empty(0, 4))
    devs = [t.to("testdev") for t in tensors]
    torch.ops.opdump.enable()
    for t in tensors:
        torch.ops.aten.alias(t)
    for t in devs:
        torch.ops.aten.alias(t)
    torch.ops.opdump.flush()
    print(json.dumps(len(tensors)))
    """, testdev=True, **kernel)
    assert job.returncode == 0, job.stderr
    n = job.result()
    t = job.table()
    rows = t[(t.op == "aten::alias") & (t.role == "input")].sort_values("seq")
    assert len(rows) == 2 * n
    cpu, dev = rows.iloc[:n], rows.iloc[n:]
    assert (cpu.tensor_device == "cpu").all() and (dev.tensor_device == "testdev:0").all()
    for (_, a), (_, b) in zip(cpu.iterrows(), dev.iterrows()):
        assert a["dtype"] == b["dtype"]
        assert a.stats_status in MEASURED and b.stats_status in MEASURED
        for k in ("nan_count", "posinf_count", "neginf_count", "zero_count"):
            assert a[k] == b[k], (a["dtype"], k)
        for k in ("min", "max", "mean", "std", "l2", "absmax"):
            x, y = a[k], b[k]
            if x is None or (isinstance(x, float) and math.isnan(x)):
                assert y is None or math.isnan(y), (a["dtype"], k)
            else:
                assert math.isclose(x, y, rel_tol=1e-12, abs_tol=1e-300), (a["dtype"], k, x, y)


def test_backward_on_the_device_thread_is_observed(run):
    job = run("""
    import threading
    torch.ops.opdump.enable()
    lin = torch.nn.Linear(16, 4).to("testdev")
    x = torch.randn(8, 16).to("testdev")
    lin(x).pow(2).sum().backward()
    torch.ops.opdump.flush()
    print(json.dumps(threading.get_native_id()))
    """, testdev=True)
    assert job.returncode == 0, job.stderr
    main = job.result()
    t = job.table()
    bw = t[(t.phase == "backward") & (t.tensor_device == "testdev:0")]
    assert len(bw) > 0
    assert "aten::mm" in set(bw.op)
    assert (bw.thread != main).all(), "backward of a device runs on the autograd device thread"
