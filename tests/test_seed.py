"""The seed example: LayerNorm(320) over (1, 4096, 320), sum()*1e-4,
backward(), in float32 and bfloat16. Every statistic opdump records for the
layer norm's tensors equals torch's own reduction of the same tensor."""

import pytest
import torch

from conftest import MEASURED, assert_stats_match, ref_stats

SEED_JOB = """
dtype = getattr(torch, sys.argv[1] if len(sys.argv) > 1 else os.environ["DT"])
torch.manual_seed(0)
x = torch.randn(1, 4096, 320).to(dtype)
x.requires_grad_(True)
ln = torch.nn.LayerNorm(320).to(dtype)
with torch.no_grad():
    ln.weight.uniform_(0.5, 1.5)
    ln.bias.uniform_(-0.1, 0.1)
torch.ops.opdump.enable()
y = ln(x)
s = y.sum() * 1e-4
s.backward()
torch.ops.opdump.disable()
torch.ops.opdump.flush()
torch.save({"x": x.detach(), "y": y.detach(), "w": ln.weight.detach(), "b": ln.bias.detach(),
            "gx": x.grad, "gw": ln.weight.grad, "gb": ln.bias.grad}, "tensors.pt")
print(json.dumps(torch.ops.opdump.stats()))
"""


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_seed_layernorm(run, tmp_path, dtype):
    job = run(SEED_JOB, DT=dtype)
    assert job.returncode == 0, job.stderr
    written, dropped, failed = job.result()
    assert dropped == 0 and failed == 0
    t = job.table()
    assert t.seq.nunique() == written
    ops = set(t.op)
    assert {"aten::native_layer_norm", "aten::native_layer_norm_backward", "aten::sum", "aten::mul"} <= ops

    # Nesting: every parent exists, is entered earlier, and is one level up.
    calls = t.drop_duplicates("seq").set_index("seq")
    for seq, row in calls.iterrows():
        if row.depth == 0:
            assert row.parent_seq != row.parent_seq  # NaN: no parent
        else:
            p = int(row.parent_seq)
            assert p < seq and calls.loc[p].depth < row.depth, (seq, row.op)
    ln = calls[calls.op == "aten::native_layer_norm"]
    assert len(ln) == 1 and ln.iloc[0].phase == "forward"
    assert calls.loc[int(ln.iloc[0].parent_seq)].op == "aten::layer_norm"
    bw = calls[calls.op == "aten::native_layer_norm_backward"]
    assert len(bw) == 1 and bw.iloc[0].phase == "backward"

    saved = torch.load(tmp_path / "tensors.pt")
    rows = t[t.op == "aten::native_layer_norm"].set_index(["role", "arg"])
    checks = {
        ("input", "input"): saved["x"], ("input", "weight"): saved["w"], ("input", "bias"): saved["b"],
        ("output", "0"): saved["y"],
    }
    rows_bw = t[t.op == "aten::native_layer_norm_backward"].set_index(["role", "arg"])
    checks_bw = {("output", "0"): saved["gx"], ("output", "1"): saved["gw"], ("output", "2"): saved["gb"],
                 ("input", "input"): saved["x"], ("input", "weight"): saved["w"]}
    for table, expected in ((rows, checks), (rows_bw, checks_bw)):
        for key, tensor in expected.items():
            row = table.loc[key]
            assert row["dtype"] == dtype
            assert list(row["shape"]) == list(tensor.shape)
            assert row.stats_status in MEASURED
            assert row.tensor_device == "cpu"
            assert row.numel == tensor.numel()
            assert_stats_match(row, ref_stats(tensor), rtol=1e-7, atol=1e-9, what=str(key))
    # The mean and rstd outputs (their dtype depends on the device's kernel).
    assert list(rows.loc[("output", "1")]["shape"]) == [1, 4096, 1]
    assert ln.iloc[0].args == "normalized_shape=[320], eps=1e-05"
