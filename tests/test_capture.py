"""OPDUMP_CAPTURE and opdump repro: the full tensors and typed arguments of
chosen calls (crates/engine/src/capture.rs, cpp/rows/saved_call.cpp,
crates/format/src/capture.rs), the exact metrics compare takes from them
(crates/judge/src/exact.rs), and the repro folder (crates/cli/src/commands/repro.rs,
repro.py)."""

import contextlib
import importlib.util
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors import safe_open
from safetensors.torch import load_file

from conftest import CLI, LIB, ROOT, clean_env

sys.path.insert(0, str(ROOT / "scripts"))
import demo


def capture_files(dump):
    return sorted(Path(dump).glob("rank=*/device=*/capture-*.safetensors"))


def metadata(path):
    with safe_open(str(path), framework="pt") as f:
        return f.metadata()


def calls(table):
    return table.drop_duplicates("seq").set_index("seq")


MODEL_JOB = """
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x):
        return F.gelu(self.fc(x)) * 2


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([Block(), Block()])

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return x


torch.manual_seed(0)
net = Net()
xs = [torch.randn(4, 8) for _ in range(2)]
zs = [torch.randn(4, 8) for _ in range(2)]
saved = {f"mul_{s}_in": z.clone() for s, z in enumerate(zs)}
torch.ops.opdump.enable()
for step in range(2):
    y = net(xs[step])
    zs[step].mul_(3.0)
    torch.ops.opdump.step()
torch.ops.opdump.flush()
torch.ops.opdump.disable()
with torch.no_grad():
    saved["gelu1_in"] = net.blocks[1].fc(net.blocks[0](xs[0]))  # the same values again
for s, z in enumerate(zs):
    saved[f"mul_{s}_out"] = z
torch.save(saved, os.environ["SAVED"])
print(json.dumps(torch.ops.opdump.capture_stats()))
"""


def test_every_selector_form(run, tmp_path):
    sel = "aten::gelu#1;aten::mul_.Tensor@step=1#0;module=blocks.1#0"
    job = run(MODEL_JOB, OPDUMP_CAPTURE=sel, SAVED=tmp_path / "saved.pt")
    assert job.returncode == 0, job.stderr
    import torch

    saved = torch.load(tmp_path / "saved.pt")
    t = job.table()
    c = calls(t)
    files = capture_files(job.dump_dir)
    by_selector = {}
    for f in files:
        m = metadata(f)
        by_selector.setdefault(m["opdump.selector"], []).append((int(m["opdump.seq"]), f, m))

    # aten::gelu#1: the second recorded gelu in the process (blocks.1, step 0).
    (seq, f, m), = by_selector["aten::gelu#1"]
    gelus = list(c[c.op == "aten::gelu"].index)
    assert seq == gelus[1] and m["opdump.op"] == "aten::gelu" and m["opdump.module"] == "blocks.1"
    x = load_file(str(f))
    assert torch.equal(x["input.self"], saved["gelu1_in"])
    assert torch.equal(x["output.0"], torch.nn.functional.gelu(saved["gelu1_in"]))

    # aten::mul_.Tensor@step=1#0: the first in-place mul of step 1; inputs
    # as they were before the op, outputs after.
    (seq, f, m), = by_selector["aten::mul_.Tensor@step=1#0"]
    assert c.loc[seq, "step"] == 1 and c.loc[seq, "op"] == "aten::mul_"
    x = load_file(str(f))
    assert torch.equal(x["input.self"], saved["mul_1_in"]) and torch.equal(x["output.0"], saved["mul_1_out"])
    args = json.loads(m["opdump.args"])
    assert [a["name"] for a in args] == ["self", "other"]
    assert args[0]["value"] == {"tensor": "input.self"}

    # module=blocks.1#0: every recorded call inside blocks.1's first forward
    # (step 0), nested calls included, and nothing else; the gelu in it is
    # captured once, under the first selector that chose it.
    got = sorted(s for s, _, _ in by_selector["module=blocks.1#0"])
    inside = c[(c.step == 0) & (c.phase == "forward") & c.module.fillna("").str.startswith("blocks.1")]
    assert sorted(got + [gelus[1]]) == sorted(inside.index) and len(got) >= 4, (got, list(inside.index))
    assert (inside.depth > 0).any()  # linear's addmm, inside its call

    # The rows of captured calls name their file and key; no other row does.
    captured = {s for v in by_selector.values() for s, _, _ in v}
    rows = t[t.seq.isin(captured)]
    assert rows.capture_file.notna().all() and rows.capture_key.notna().all()
    assert t[~t.seq.isin(captured)].capture_file.isna().all()
    for _, r in rows.iterrows():
        assert r.capture_key in load_file(str(job.dump_dir / "rank=0" / "device=cpu" / r.capture_file))
    captured_calls, skipped, partial, nbytes = job.result()
    assert (captured_calls, skipped, partial) == (len(files), 0, 0)
    assert nbytes == sum(v.numel() * v.element_size() for f in files for v in load_file(str(f)).values())
    assert any(f"captured {len(files)} op calls" in l for l in job.opdump_lines()), job.stderr


def test_bad_selectors_are_one_line_and_dumping_stays_off(run):
    job = run("torch.randn(3).exp()\nprint(json.dumps(1))", OPDUMP="1", OPDUMP_CAPTURE="aten::gelu")
    assert job.returncode == 0
    lines = job.opdump_lines()
    assert any("OPDUMP_CAPTURE" in l and "call index" in l for l in lines), job.stderr
    assert any("dumping stays off" in l for l in lines), job.stderr
    assert not list(Path(job.dump_dir).rglob("*.parquet"))


def test_a_selector_that_matches_nothing_is_said(run):
    job = run("""
    torch.ops.opdump.enable()
    torch.randn(3).exp()
    torch.ops.opdump.flush()
    print(json.dumps(1))
    """, OPDUMP_CAPTURE="aten::gelu#0")
    assert job.returncode == 0, job.stderr
    assert any("matched no recorded call" in l for l in job.opdump_lines()), job.stderr


def test_the_byte_cap_skips_and_counts(run):
    # Each add reads two [64] float32 tensors (512 bytes) and writes one
    # (256 bytes).
    code = """
    torch.ops.opdump.enable()
    a, b = torch.randn(64), torch.randn(64)
    for _ in range(3):
        torch.add(a, b)
    torch.ops.opdump.flush()
    print(json.dumps(torch.ops.opdump.capture_stats()))
    """
    sel = "aten::add.Tensor#0;aten::add.Tensor#1;aten::add.Tensor#2"
    job = run(code, OPDUMP_CAPTURE=sel, OPDUMP_CAPTURE_MAX_BYTES="1300")
    assert job.returncode == 0, job.stderr
    # #0: 768 bytes; #1: its inputs fit (1280), its output does not: kept
    # without outputs; #2: its inputs do not fit: not captured.
    assert job.result() == [2, 1, 1, 1280]
    files = capture_files(job.dump_dir)
    keys = [sorted(load_file(str(f))) for f in files]
    assert keys == [["input.other", "input.self", "output.0"], ["input.other", "input.self"]]
    assert [metadata(f)["opdump.outputs_skipped"] for f in files] == ["0", "1"]
    line = next(l for l in job.opdump_lines() if "captured" in l)
    assert "1 more not captured and 1 without their outputs" in line and "OPDUMP_CAPTURE_MAX_BYTES=1300" in line


def test_capture_files_are_complete_after_kill_9(tmp_path):
    """A job capturing large calls is killed with SIGKILL mid-way: every
    visible capture file reads back whole (files are written under a hidden
    name and renamed when complete)."""
    script = tmp_path / "job.py"
    script.write_text("""
import os, sys, torch
torch.ops.load_library(os.environ["TESTJOB_LIB"])
torch.ops.opdump.enable()
x = torch.randn(1 << 18)
for i in range(100000):
    torch.neg(x)
    if i == 3:
        print("go", flush=True)
""")
    sel = ";".join(f"aten::neg#{i}" for i in range(200))
    env = clean_env(TESTJOB_LIB=LIB, OPDUMP_DIR=tmp_path / "dump", OPDUMP_CAPTURE=sel)
    p = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "go"
    deadline = time.time() + 60
    while len(capture_files(tmp_path / "dump")) < 5 and time.time() < deadline:
        time.sleep(0.05)
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=60)
    files = capture_files(tmp_path / "dump")
    assert len(files) >= 5
    import torch

    for f in files:
        t = load_file(str(f))  # raises on a partial file
        assert torch.equal(t["output.0"], -t["input.self"]) and t["input.self"].numel() == 1 << 18


# ---------------------------------------------------------------------------
# Arguments of many ops round-trip: repro.py calls each again on the CPU and
# gets the recorded outputs bit for bit.
# ---------------------------------------------------------------------------

# Each line: the selector of a top-level call the job below makes first of
# its kind (OPDUMP_MAX_DEPTH=0, so only top-level calls count), and what it
# exercises.
ROUND_TRIP = [
    "aten::add.Tensor#0",             # Scalar alpha (int)
    "aten::add.Scalar#0",             # Scalar other (float)
    "aten::mul_.Tensor#0",            # in place
    "aten::sum.dim_IntList#0",        # int[], bool, optional ScalarType
    "aten::mean.dim#0",               # int[] of two
    "aten::cat#0",                    # Tensor[]
    "aten::stack#0",                  # Tensor[], int
    "aten::addmm#0",                  # beta, alpha floats
    "aten::mm#0",                     # a transposed (strided) input
    "aten::bmm#0",
    "aten::_softmax#0",               # bool
    "aten::native_layer_norm#0",      # int[], optional tensors, tuple return
    "aten::gelu#0",                   # str
    "aten::clamp#0",                  # optional Scalar None
    "aten::where.self#0",             # bool tensor
    "aten::index_select#0",           # int64 index
    "aten::gather#0",
    "aten::embedding#0",
    "aten::_to_copy#0",               # ScalarType keyword
    "aten::full#0",                   # no tensor input; dtype, layout, device, pin_memory
    "aten::arange.start_step#0",      # Scalars, dtype int64
    "aten::clone#0",                  # memory format
    "aten::add.out#0",                # out=
    "aten::_foreach_add_.List#0",     # Tensor[] written, no return
    "aten::_foreach_mul.Scalar#0",    # Tensor[] return
    "aten::max.dim#0",                # (values, indices)
    "aten::topk#0",
    "aten::pow.Tensor_Scalar#0",
    "aten::masked_fill.Scalar#0",     # -inf
    "aten::convolution#0",            # int[] stride/padding/dilation, bool, int[] output_padding
    "aten::avg_pool2d#0",
    "aten::sigmoid_#0",
    "aten::nll_loss_forward#0",       # optional weight None, int reduction, ignore_index
    "aten::scatter_add#0",
    "aten::linalg_vector_norm#0",     # Scalar ord, optional int[]
    "aten::div.Tensor_mode#0",        # optional str
    "aten::bitwise_and.Tensor#0",     # int32
    "aten::mul.Tensor#0",             # float16
    "aten::permute#0",                # a view
    "aten::expand#0",                 # a broadcast view
]

ROUND_TRIP_JOB = """
A = torch.ops.aten
g = torch.Generator().manual_seed(0)
r = lambda *shape: torch.randn(*shape, generator=g)
x, y = r(4, 8), r(4, 8)
# Every input is made before recording starts: only the calls below are
# top-level recorded calls, each the first of its kind.
x1, x2, x3, y1 = x.clone(), x.clone(), x.clone(), y.clone()
xt, w_t = x.t(), r(3, 8).t()
pos, neg = x > 0, x < 0
i3, i42 = torch.tensor([0, 3, 3]), torch.tensor([[0, 1], [1, 2], [2, 3], [3, 4]])
emb, ids = r(10, 3), torch.tensor([[1, 2], [9, 0]])
logp, target = torch.log_softmax(x, 1), torch.tensor([1, 0, 7, 3])
src = y[:, :2].contiguous()
xh, yh = x.half(), y.half()
ints, six = torch.arange(8, dtype=torch.int32), torch.tensor(6, dtype=torch.int32)
bias, m2, b1, b2, lnw = r(4, 3), r(8, 3), r(2, 4, 8), r(2, 8, 5), r(8)
img, wconv, bconv, img2 = r(1, 2, 6, 6), r(3, 2, 3, 3), r(3), r(1, 2, 6, 6)
out, row = torch.empty(4, 8), x[:1]
torch.ops.opdump.enable()
A.add.Tensor(x, y, alpha=2)
A.add.Scalar(x, 2.5)
A.mul_.Tensor(x1, y)
A.sum.dim_IntList(x, [1], True, dtype=torch.float64)
A.mean.dim(x, [0, 1], False)
A.cat([x, y], 1)
A.stack([x, y], 0)
A.addmm(bias, x, m2, beta=0.5, alpha=2.0)
A.mm(x, w_t)
A.bmm(b1, b2)
A._softmax(x, 1, False)
A.native_layer_norm(x, [8], lnw, None, 1e-5)
A.gelu(x, approximate="tanh")
A.clamp(x, min=-0.5)
A.where.self(pos, x, y)
A.index_select(x, 1, i3)
A.gather(x, 1, i42)
A.embedding(emb, ids)
A._to_copy(x, dtype=torch.bfloat16)
A.full([2, 3], 1.5, dtype=torch.float32, layout=torch.strided, device=torch.device("cpu"), pin_memory=False)
A.arange.start_step(0, 10, 2, dtype=torch.int64)
A.clone(xt, memory_format=torch.contiguous_format)
A.add.out(x, y, out=out)
A._foreach_add_.List([x2, y1], [y, x])
A._foreach_mul.Scalar([x, y], 3.0)
A.max.dim(x, 1, False)
A.topk(x, 3, -1, True, True)
A.pow.Tensor_Scalar(x, 2)
A.masked_fill.Scalar(x, neg, float("-inf"))
A.convolution(img, wconv, bconv, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)
A.avg_pool2d(img2, [2, 2])
A.sigmoid_(x3)
A.nll_loss_forward(logp, target, None, 1, -100)
A.scatter_add(x, 1, i42, src)
A.linalg_vector_norm(x, 2, [1], False)
A.div.Tensor_mode(x, y, rounding_mode="floor")
A.bitwise_and.Tensor(ints, six)
A.mul.Tensor(xh, yh)
A.permute(x, [1, 0])
A.expand(row, [3, 8])
torch.ops.opdump.flush()
print(json.dumps(torch.ops.opdump.capture_stats()))
"""


def load_repro_module():
    """repro.py as `opdump repro` writes it, imported once for every call."""
    spec = importlib.util.spec_from_file_location("opdump_repro_script",
                                                  ROOT / "crates" / "cli" / "src" / "commands" / "repro.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def run_repro(mod, folder, *args):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = mod.main(["--dir", str(folder), "--json", *args])
    return code, json.loads(out.getvalue())


def test_forty_ops_round_trip_bit_for_bit(run, tmp_path):
    job = run(ROUND_TRIP_JOB, OPDUMP_CAPTURE=";".join(ROUND_TRIP), OPDUMP_MAX_DEPTH="0")
    assert job.returncode == 0, job.stderr
    assert job.result()[:3] == [len(ROUND_TRIP), 0, 0], job.result()
    mod = load_repro_module()
    failures = []
    for sel in ROUND_TRIP:
        folder = tmp_path / ("repro-" + sel.replace(":", "_").replace("#", "_"))
        p = subprocess.run([str(CLI), "repro", str(job.dump_dir), str(job.dump_dir), "--call", sel,
                            "--out", str(folder)], capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, (sel, p.stderr)
        code, r = run_repro(mod, folder)
        outs = r["outputs"]
        # Bit for bit the outputs the job recorded (the verdict against the
        # float64 reference is not the point here: A and B are one run).
        if not outs or not all(o.get("run_a_reproduces_recorded_a") for o in outs.values()):
            failures.append((sel, r))
    assert not failures, failures


# ---------------------------------------------------------------------------
# The workflow on cpu against testdev: dump, compare, capture, repro.
# ---------------------------------------------------------------------------


def compare_json(a, b):
    p = subprocess.run([str(CLI), "compare", str(a), str(b), "--json"], capture_output=True, text=True, timeout=300)
    assert p.returncode in (0, 1, 3), p.stderr
    return p.returncode, json.loads(p.stdout)


def repro_script(folder, fault):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPDUMP") and k != "LD_PRELOAD"}
    env.update(PYTHONPATH=str(ROOT), TESTDEV_FAULT=fault)
    p = subprocess.run([sys.executable, str(folder / "repro.py"), "--setup", "tests.testdev:load", "--json"],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode in (0, 1), p.stderr
    return p.returncode, json.loads(p.stdout)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cpu")
    dump, _ = demo.run_device("cpu", out, 1, None)
    return out, dump


def test_workflow_scale_fault(cpu_run, tmp_path):
    out_cpu, cpu = cpu_run
    fault = "aten::gelu=scale:1.01"
    dev, _ = demo.run_device("testdev", tmp_path, 1, fault)
    code, report = compare_json(cpu, dev)
    assert code == 1 and report["first_introduced"]["op"] == "aten::gelu"
    nxt = report["next"]
    assert nxt["capture_a"] == nxt["capture_b"] == "aten::gelu@step=0#0" and not nxt["captured"]
    # Capture, in new dumps of both runs.
    cap_a, _ = demo.run_device("cpu", tmp_path, 1, None, capture=nxt["capture_a"])
    cap_b, _ = demo.run_device("testdev", tmp_path, 1, fault, capture=nxt["capture_b"])
    code, report = compare_json(cap_a, cap_b)
    first = report["first_introduced"]
    assert code == 1 and first["op"] == "aten::gelu" and report["next"]["captured"]
    out = next(t for t in first["tensors"] if t["role"] == "output")
    assert out["evidence"] == "exact" and out["exact"] is not None
    assert abs(out["exact"]["rel_l2"] - 0.01) < 1e-4 and out["exact"]["cosine"] > 0.9999999
    folder = tmp_path / "repro"
    p = subprocess.run([str(CLI), "repro", str(cap_a), str(cap_b), "--out", str(folder)], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "--setup" in p.stdout  # testdev needs registering first
    code, r = repro_script(folder, fault)
    assert code == 1 and r["off"] == ["testdev"], r["verdict"]
    assert r["verdict"].startswith("testdev is off")
    o = r["outputs"]["output.0"]
    # cpu agrees with the float64 reference within float32 rounding, and
    # reproduces A's recorded output bit for bit.
    assert o["run_a"]["rel_l2"] < 2 ** -24 * 4 and o["run_a_reproduces_recorded_a"]
    assert abs(o["run_b"]["rel_l2"] - 0.01) < 1e-4 and abs(o["recorded_b"]["rel_l2"] - 0.01) < 1e-4


def test_workflow_permute_fault_exact_metrics_see_it(cpu_run, tmp_path):
    """Statistics blame the permuted values' first consumer; the capture of
    the whole block shows the permutation at the op that made it (cosine
    below 1 with every statistic equal), and repro names testdev."""
    fault = "aten::gelu=permute:7"
    # Statistics alone (no sketches: OPDUMP_SKETCH=0) blame the consumer.
    off = {"OPDUMP_SKETCH": "0"}
    cpu, _ = demo.run_device("cpu", tmp_path / "nosketch", 1, None, env_extra=off)
    dev, _ = demo.run_device("testdev", tmp_path / "nosketch", 1, fault, env_extra=off)
    code, report = compare_json(cpu, dev)
    first = report["first_introduced"]
    assert code == 1 and first["op"] == "aten::addmm" and first["module"] == "blocks.0.fc2", first
    # The broader net: every top-level call of the block's first forward
    # (OPDUMP_MAX_DEPTH=0 on both sides keeps the files few).
    sel, depth = "module=blocks.0#0", {"OPDUMP_MAX_DEPTH": "0"}
    cap_a, _ = demo.run_device("cpu", tmp_path, 1, None, capture=sel, env_extra=depth)
    cap_b, _ = demo.run_device("testdev", tmp_path, 1, fault, capture=sel, env_extra=depth)
    code, report = compare_json(cap_a, cap_b)
    first = report["first_introduced"]
    assert code == 1 and first["op"] == "aten::gelu", first
    out = next(t for t in first["tensors"] if t["role"] == "output")
    assert out["verdict"] == "diverged" and out["evidence"] == "exact"
    # Every statistic within rounding of A's (the input drifted by ~1e-7),
    # the values in other places.
    assert out["exact"]["cosine"] < 0.99
    for k in ("min", "max", "mean", "std", "l2", "absmax"):
        assert out["a"][k] == pytest.approx(out["b"][k], rel=1e-5), k
    folder = tmp_path / "repro"
    p = subprocess.run([str(CLI), "repro", str(cap_a), str(cap_b), "--out", str(folder)], capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    code, r = repro_script(folder, fault)
    assert code == 1 and r["off"] == ["testdev"], r["verdict"]
    assert r["outputs"]["output.0"]["run_a"]["rel_l2"] < 2 ** -24 * 4


def test_exact_metrics_raise_no_false_alarm_between_correct_devices(tmp_path):
    """Every top-level call of both blocks captured on cpu and on a
    fault-free testdev: the exact errors (larger than the statistics' bounds)
    stay within the tolerance model, and the runs agree."""
    sel, depth = "module=blocks.0#0;module=blocks.1#0", {"OPDUMP_MAX_DEPTH": "0"}
    a, _ = demo.run_device("cpu", tmp_path, 1, None, capture=sel, env_extra=depth)
    b, _ = demo.run_device("testdev", tmp_path, 1, None, capture=sel, env_extra=depth)
    p = subprocess.run([str(CLI), "compare", str(a), str(b), "--json", "--out", str(tmp_path / "rep")],
                       capture_output=True, text=True, timeout=300)
    report = json.loads(p.stdout)
    assert p.returncode == 0 and report["first_divergence"] is None, report["first_divergence"]
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "rep" / "compare.parquet").to_pandas()
    exact = rows[rows.evidence == "exact"]
    assert len(capture_files(a)) >= 40 and len(exact) >= 100, (len(capture_files(a)), len(exact))
    assert set(exact.verdict) <= {"close", "identical"} and exact.exact_rel_l2.notna().all()
