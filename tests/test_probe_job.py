"""Standing probes of the promise that opdump never hurts the job: the one-run
features (the accuracy check, online compare, the device hold) must not
change a job's results, crash it or kill it, and must never record values a
tensor did not hold as `computed`. Each test here failed on the code before
its fix (issue 44)."""

import json
import resource
import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import CLI, LIB, clean_env, read_dump


def run_script(tmp_path, code, *, name="job.py", preexec_fn=None, timeout=300, **env):
    script = tmp_path / name
    script.write_text(textwrap.dedent(code))
    e = clean_env(TESTJOB_LIB=LIB, PYTHONDONTWRITEBYTECODE=1, **env)
    return subprocess.run([sys.executable, str(script)], env=e, capture_output=True, text=True,
                          preexec_fn=preexec_fn, timeout=timeout, cwd=tmp_path)


def last_json(p):
    assert p.returncode == 0, (p.returncode, p.stderr[-4000:])
    return json.loads(p.stdout.strip().splitlines()[-1])


def check_rows(dump):
    files = sorted(Path(dump).glob("checks/rank=*/part-*.jsonl"))
    return [json.loads(l) for f in files for l in f.read_text().splitlines()]


# ---------------------------------------------------------------------------
# 1. The check's CPU reruns never draw from the job's random generators
# ---------------------------------------------------------------------------

# A model that draws random numbers in every way a job does: attention
# dropout inside SDPA, an LSTM's dropout between layers, nn.Dropout, and
# torch.randn in forward. The losses and the parameters' bits are printed.
RANDOM_JOB = """
import hashlib, json, os, sys
import torch
import torch.nn as nn
import torch.nn.functional as F
if os.environ.get("JOB_TESTDEV") == "1":
    import tests.testdev as testdev
    testdev.load()
    dev = "testdev"
else:
    dev = "cpu"
torch.ops.load_library(os.environ["TESTJOB_LIB"])

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(8, 16)
        self.lstm = nn.LSTM(16, 16, num_layers=2, dropout=0.3, batch_first=True)
        self.drop = nn.Dropout(0.2)
        self.out = nn.Linear(16, 1)

    def forward(self, x):
        h = self.inp(x)
        q = h.view(h.shape[0], 2, h.shape[1], 8)
        h = F.scaled_dot_product_attention(q, q, q, dropout_p=0.3).reshape(h.shape)
        if h.device.type == "cpu":  # testdev has no LSTM cell kernel
            h, _ = self.lstm(h)
        h = self.drop(h) + 0.01 * torch.randn(h.shape, device=h.device)
        return self.out(h).mean()

torch.manual_seed(0)
model = Net().to(dev)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(4, 6, 8).to(dev)
losses = []
for step in range(3):
    loss = model(x)
    opt.zero_grad()
    loss.backward()
    opt.step()
    losses.append(loss.item())
digest = hashlib.sha256()
for p in model.parameters():
    digest.update(p.detach().cpu().numpy().tobytes())
print(json.dumps({"losses": losses, "params": digest.hexdigest(),
                  "next_draw": torch.rand(1).item()}))
"""


@pytest.mark.parametrize("device", ["cpu", "testdev"])
def test_check_leaves_the_jobs_random_draws_unchanged(tmp_path, device):
    env = {"JOB_TESTDEV": "1" if device == "testdev" else "0"}
    without = last_json(run_script(tmp_path, RANDOM_JOB, **env))
    dump = tmp_path / "dump"
    p = run_script(tmp_path, RANDOM_JOB, OPDUMP="1", OPDUMP_CHECK="1", OPDUMP_DIR=dump,
                   OPDUMP_CHECK_SECONDS="600", **env)
    with_check = last_json(p)
    assert with_check == without, "OPDUMP_CHECK changed the job's random draws"
    rows = [r for r in check_rows(dump) if r["kind"] == "check"]
    by_op = {}
    for r in rows:
        by_op.setdefault(r["op"], []).append(r)
    # Ops that draw are never run again, whatever their name: a reason that
    # says so, and no verdict.
    drawing = ["aten::scaled_dot_product_attention", "aten::dropout", "aten::randn"]
    for op in drawing + (["aten::lstm"] if device == "cpu" else []):
        assert op in by_op, (op, sorted(by_op))
        for r in by_op[op]:
            assert r["verdict"] == "no_reference", r
            assert "random" in r["reason"], r
    # Ops that draw nothing are still checked.
    assert any(r["verdict"] == "pass" for r in by_op["aten::addmm"]), by_op.get("aten::addmm")


def test_sdpa_without_dropout_is_still_checked(tmp_path):
    code = """
    import json, os
    import torch
    import torch.nn.functional as F
    torch.ops.load_library(os.environ["TESTJOB_LIB"])
    torch.manual_seed(0)
    q = torch.randn(2, 2, 5, 8)
    y = F.scaled_dot_product_attention(q, q, q, dropout_p=0.0)
    print(json.dumps({"y": float(y.sum())}))
    """
    dump = tmp_path / "dump"
    last_json(run_script(tmp_path, code, OPDUMP="1", OPDUMP_CHECK="1", OPDUMP_DIR=dump))
    sdpa = [r for r in check_rows(dump) if r.get("op") == "aten::scaled_dot_product_attention"]
    assert sdpa and all(r["verdict"] == "pass" for r in sdpa), sdpa


def test_a_call_without_a_tensor_result_is_never_run_again(tmp_path):
    """An op that returns no tensor and writes none has nothing to compare,
    and running it again would repeat its side effect on the job's objects
    (the optimizer's profiler ranges, a custom op's logging): the check says
    so and never runs it."""
    code = """
    import json, os
    import torch
    torch.ops.load_library(os.environ["TESTJOB_LIB"])
    calls = []

    @torch.library.custom_op("opdump_probe::note", mutates_args=())
    def note(x: torch.Tensor) -> None:
        calls.append(float(x.sum()))

    x = torch.ones(3)
    for _ in range(3):
        note(x)
        with torch.autograd.profiler.record_function("probe-range"):
            x = x * 2
    # The check's line of `note` is written once its check is over.
    import glob, time
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not any(
            "opdump_probe::note" in open(f).read() for f in glob.glob(os.environ["OPDUMP_DIR"] + "/checks/*/*.jsonl")):
        time.sleep(0.05)
    print(json.dumps({"calls": len(calls)}))
    """
    dump = tmp_path / "dump"
    out = last_json(run_script(tmp_path, code, OPDUMP="1", OPDUMP_CHECK="1", OPDUMP_DIR=dump))
    assert out == {"calls": 3}, "the check ran the job's side effect again"
    rows = {r["op"]: r for r in check_rows(dump) if r["kind"] == "check"}
    for op in ("opdump_probe::note", "profiler::_record_function_enter_new", "profiler::_record_function_exit"):
        assert rows[op]["verdict"] == "no_reference", rows.get(op)
        assert rows[op]["reason"] == "no floating-point output to compare", rows[op]
    assert rows["aten::mul"]["verdict"] == "pass", rows.get("aten::mul")


# ---------------------------------------------------------------------------
# 2. A check never uses an op after it is gone
# ---------------------------------------------------------------------------

SCOPED_OP_JOB = """
import json, os
import torch
torch.ops.load_library(os.environ["TESTJOB_LIB"])
from torch.library import _scoped_library

total = 0.0
for round in range(6):
    with _scoped_library("opdump_probe", "FRAGMENT") as lib:
        lib.define(f"scale{round}(Tensor x, float s) -> Tensor")
        lib.impl(f"scale{round}", lambda x, s: x * s, "CompositeExplicitAutograd")
        op = getattr(torch.ops.opdump_probe, f"scale{round}")
        for i in range(4):
            # Each call a new signature: the checks queue up behind each other.
            total += float(op(torch.randn(64 + i, 128), 1.5).sum())
    # The library is gone here, its checks maybe still queued.
print(json.dumps({"total": total}))
"""


def checked_runs(tmp_path, code, n):
    """Runs `code` with OPDUMP_CHECK `n` times, two at a time, each in its own
    folder with its dump in `dump`; asserts every run exited 0."""

    def once(i):
        d = tmp_path / f"run{i}"
        d.mkdir()
        return run_script(d, code, OPDUMP="1", OPDUMP_CHECK="1", OPDUMP_DIR=d / "dump",
                          OPDUMP_CHECK_SECONDS="600")

    with ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(once, range(n)))
    bad = [(p.returncode, p.stderr[-1500:]) for p in runs if p.returncode != 0]
    assert not bad, f"{len(bad)} of {n} runs failed: {bad[0]}"


def test_scoped_library_op_dropped_while_its_checks_are_queued(tmp_path):
    checked_runs(tmp_path, SCOPED_OP_JOB, 20)
    # The ops that were checked are named; a gone op is `no_reference`, never a crash.
    for i in range(20):
        for r in check_rows(tmp_path / f"run{i}" / "dump"):
            if r["kind"] == "check" and r["verdict"] == "no_reference":
                assert r["reason"], r


# The same with libraries dropped by reference (their finalizer removes the
# ops), one of them made before the check started.
DROPPED_LIBRARY_JOB = """
import json, os, gc
import torch
torch.ops.load_library(os.environ["TESTJOB_LIB"])
lib0 = torch.library.Library("opdump_early", "DEF")   # made before the check starts
lib0.define("twice(Tensor x) -> Tensor")
lib0.impl("twice", lambda x: x * 2, "CompositeExplicitAutograd")
total = 0.0
for i in range(3):
    total += float(torch.ops.opdump_early.twice(torch.randn(32 + i, 64)).sum())
del lib0
gc.collect()
for round in range(4):
    lib = torch.library.Library("opdump_drop", "FRAGMENT")
    lib.define(f"scale{round}(Tensor x, float s) -> Tensor")
    lib.impl(f"scale{round}", lambda x, s: x * s, "CompositeExplicitAutograd")
    op = getattr(torch.ops.opdump_drop, f"scale{round}")
    for i in range(4):
        total += float(op(torch.randn(64 + i, 128), 1.5).sum())
    del lib, op
    gc.collect()
print(json.dumps({"total": total}))
"""


def test_dropped_library_ops_while_their_checks_are_queued(tmp_path):
    checked_runs(tmp_path, DROPPED_LIBRARY_JOB, 10)
    rows = [r for i in range(10) for r in check_rows(tmp_path / f"run{i}" / "dump") if r["kind"] == "check"]
    mine = [r for r in rows if r["op"].startswith("opdump_")]
    assert mine and all(r["verdict"] in ("pass", "no_reference") for r in mine), mine
    assert any(r["verdict"] == "pass" for r in mine)


# ---------------------------------------------------------------------------
# 3. A file-size limit never kills the job
# ---------------------------------------------------------------------------

XFSZ_JOB = """
import json, os, signal
import torch
# Python ignores SIGXFSZ; a C++ host, or a job like this one, does not.
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
torch.ops.load_library(os.environ["TESTJOB_LIB"])
torch.manual_seed(0)
w = torch.randn(32, 32, requires_grad=True)
x = torch.randn(16, 32)
total = 0.0
for step in range(int(os.environ.get("JOB_STEPS", "6"))):
    y = torch.tanh(x @ w) * (step + 1)
    for i in range(40):
        y = torch.sin(y + i) * 0.5   # ops of many signatures: many check lines
        y = y.view(16, 32)
    loss = y.square().mean()
    loss.backward()
    with torch.no_grad():
        w -= 0.01 * w.grad
        w.grad = None
    total += loss.item()
print(json.dumps({"total": total}))
"""


def small_files(limit):
    def apply():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return apply


def test_file_size_limit_does_not_kill_a_job_with_the_check(tmp_path):
    want = last_json(run_script(tmp_path, XFSZ_JOB))
    dump = tmp_path / "dump"
    p = run_script(tmp_path, XFSZ_JOB, preexec_fn=small_files(2048), OPDUMP="1", OPDUMP_CHECK="1",
                   OPDUMP_DIR=dump, OPDUMP_CHECK_SECONDS="600")
    assert p.returncode == 0, (p.returncode, p.stderr[-3000:])
    assert last_json(p) == want
    exit_line = [l for l in p.stderr.splitlines() if l.startswith("opdump: OPDUMP_CHECK:")]
    assert len(exit_line) == 1, p.stderr
    assert "results could not be written" in exit_line[0], exit_line


def test_file_size_limit_does_not_kill_a_job_judged_online(tmp_path):
    ref = tmp_path / "ref"
    last_json(run_script(tmp_path, XFSZ_JOB, OPDUMP="1", OPDUMP_DIR=ref, JOB_STEPS="6"))
    want = last_json(run_script(tmp_path, XFSZ_JOB))
    dump = tmp_path / "dump"
    # A fault in the judged run, so that verdicts are written; the limit is
    # below what the dump and the verdicts take.
    code = XFSZ_JOB.replace("torch.sin(y + i)", "torch.sin(y + i) * (1.0 + (1e-2 if i == 38 else 0.0))")
    p = run_script(tmp_path, code, preexec_fn=small_files(4096), OPDUMP="1", OPDUMP_DIR=dump,
                   OPDUMP_REFERENCE=ref, JOB_STEPS="6")
    assert p.returncode == 0, (p.returncode, p.stderr[-3000:])
    assert isinstance(last_json(p)["total"], float)
    assert want["total"] != last_json(p)["total"]  # the job ran as it is, fault included
    lines = [l for l in p.stderr.splitlines() if l.startswith("opdump:")]
    assert any("File too large" in l or "could not be written" in l or "lost" in l for l in lines), lines


# ---------------------------------------------------------------------------
# 4. The device hold never records re-allocated memory as `computed`
# ---------------------------------------------------------------------------

FSDP_PATTERN_JOB = """
import json, os
import tests.testdev as testdev
testdev.load()
import torch
torch.ops.load_library(os.environ["TESTJOB_LIB"])
torch.ops.opdump.enable()
torch.manual_seed(0)
x = torch.randn(4096).to("testdev")
y = torch.exp(x)
# What FSDP does with a parameter's memory between uses, outside the
# dispatcher: the storage freed, and allocated again at the same size.
storage = y.untyped_storage()
n = storage.size()
storage.resize_(0)
storage.resize_(n)
junk = torch.full((4096,), 7.0).to("testdev")   # new memory may reuse the freed block
torch.ops.opdump.flush()
ref = torch.exp(x.cpu())
print(json.dumps({"min": float(ref.min()), "max": float(ref.max()), "mean": float(ref.double().mean())}))
"""


@pytest.mark.parametrize("hold", ["1", "0"])
def test_reallocated_held_memory_is_never_computed(tmp_path, hold):
    dump = tmp_path / "dump"
    p = run_script(tmp_path, FSDP_PATTERN_JOB, OPDUMP="1", OPDUMP_DIR=dump, OPDUMP_DEVICE_HOLD=hold)
    ref = last_json(p)
    t = read_dump(dump)
    out = t[(t.op == "aten::exp") & (t.role == "output") & (t.depth == 0) & (t.tensor_device.str.startswith("testdev"))]
    assert len(out) == 1, out
    row = out.iloc[0]
    if row.stats_status == "computed":
        # Computed only if these are the values exp produced.
        assert abs(row["min"] - ref["min"]) <= 1e-6 * abs(ref["min"]), row
        assert abs(row["max"] - ref["max"]) <= 1e-6 * abs(ref["max"]), row
        assert abs(row["mean"] - ref["mean"]) <= 1e-6 * abs(ref["mean"]), row
    else:
        assert hold == "1" and row.stats_status == "failed", row.stats_status


# ---------------------------------------------------------------------------
# 5. Memory written in part, or allocated again outside the dispatcher, is
#    not `computed` (FSDP2's all-gather buffers and unsharded parameters)
# ---------------------------------------------------------------------------

FSDP_JOB = Path(__file__).parent / "jobs" / "fsdp_cpu.py"


def free_port():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_fsdp(tmp_path, dump=None, **env):
    extra = {"OPDUMP": "1", "OPDUMP_DIR": dump} if dump else {}
    e = clean_env(TESTJOB_LIB=LIB, PYTHONDONTWRITEBYTECODE=1, OMP_NUM_THREADS=1, **extra, **env)
    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                        "--master_addr", "127.0.0.1", "--master_port", str(free_port()), str(FSDP_JOB)],
                       env=e, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    # The ranks print at once: their lines may run together.
    out, decoder, at = [], json.JSONDecoder(), p.stdout.find("{")
    while at >= 0:
        row, end = decoder.raw_decode(p.stdout, at)
        out.append(row)
        at = p.stdout.find("{", end)
    assert len(out) == 2, p.stdout
    return sorted(out, key=lambda r: r["rank"])


def test_fsdp2_runs_dumped_twice_agree_and_a_ranks_fault_is_named(tmp_path):
    pytest.importorskip("torch.distributed.fsdp")
    plain = torchrun_fsdp(tmp_path)
    a = torchrun_fsdp(tmp_path, tmp_path / "a")
    b = torchrun_fsdp(tmp_path, tmp_path / "b")
    assert a == plain and b == plain, "opdump changed the FSDP job's results"
    # The all-gather buffer that all_gather_copy_in returns holds this
    # rank's shard and nothing else yet.
    t = read_dump(tmp_path / "a" / "rank=0")
    buf = t[(t.op == "fsdp::all_gather_copy_in") & (t.role == "output") & (t.arg == "1")]
    assert len(buf) and (buf.stats_status == "uninitialized").all(), buf.stats_status.tolist()
    same = subprocess.run([str(CLI), "compare", str(tmp_path / "a"), str(tmp_path / "b"), "--rank", "all"],
                          capture_output=True, text=True)
    assert same.returncode == 0, same.stdout + same.stderr
    torchrun_fsdp(tmp_path, tmp_path / "c", FAULT_RANK="1")
    faulty = subprocess.run([str(CLI), "compare", str(tmp_path / "a"), str(tmp_path / "c"), "--rank", "all"],
                            capture_output=True, text=True)
    assert faulty.returncode == 1, faulty.stdout + faulty.stderr
    rank1 = [l for l in faulty.stdout.splitlines() if l.startswith("rank 1")]
    assert rank1 and "introduced" in rank1[0] and "addmm" in rank1[0], faulty.stdout
