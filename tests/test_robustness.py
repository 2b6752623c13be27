"""opdump never hurts the job: fork, signals, a full disk, many threads, long
runs, and a multi-rank job. Each test causes the fault."""

import json
import os
import resource
import shutil
import signal
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from conftest import CLI, LIB, clean_env, read_dump


def start(tmp_path, code, **env):
    script = tmp_path / "job.py"
    script.write_text(f"import torch, json, os, sys\ntorch.ops.load_library({str(LIB)!r})\n" + code)
    dump = tmp_path / "dump"
    # A shell that starts the tests in the background leaves SIGINT ignored,
    # and an ignored signal stays ignored across exec: give the job the
    # default action, as a terminal would, so Python installs its handler.
    return subprocess.Popen([sys.executable, str(script)], env=clean_env(OPDUMP=1, OPDUMP_DIR=dump, **env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)), dump


def visible(dump):
    return [f for f in dump.rglob("*.parquet") if not f.name.startswith(".")]


def test_dataloader_fork_and_many_forks(run):
    job = run("""
    import threading
    from torch.utils.data import DataLoader, TensorDataset
    # The ops' dispatcher handles are function-local statics: a fork while
    # another thread is inside their first initialisation leaves the child
    # waiting on that guard for ever, with or without opdump. Initialise the
    # ones the thread and the children call before any of it, and before
    # recording (the children's `sub` must not appear in the dump).
    torch.ones(8).add(1).mul(0.5).sub(1)
    torch.ops.opdump.enable()
    ds = TensorDataset(torch.arange(64.0).reshape(32, 2))
    total = 0.0
    for (b,) in DataLoader(ds, batch_size=4, num_workers=2, multiprocessing_context="fork"):
        total += float(b.sum())
    stop = threading.Event()
    def busy():
        x = torch.ones(8)
        while not stop.is_set():
            x = x.add(1).mul(0.5)
    th = threading.Thread(target=busy); th.start()
    codes = []
    for i in range(50):
        pid = os.fork()
        if pid == 0:
            torch.ones(3).add(1)          # a child's ops: not recorded by default
            os._exit(7)
        codes.append(os.waitpid(pid, 0)[1] >> 8)
    child = os.fork()
    if child == 0:
        torch.ones(2).sub(1)
        sys.exit(0)                       # a child leaving through atexit
    codes.append(os.waitpid(child, 0)[1] >> 8)
    stop.set(); th.join()
    torch.ops.opdump.flush()
    print(json.dumps({"total": total, "codes": codes, "pid": os.getpid()}))
    """, timeout=120)
    assert job.returncode == 0, job.stderr
    r = job.result()
    assert r["total"] == float(sum(range(64)))
    assert r["codes"] == [7] * 50 + [0]
    t = job.table()
    assert set(t.pid) == {r["pid"]}, "only the parent writes, and only into its own files"
    assert "aten::sub" not in set(t.op)
    assert t.drop_duplicates("seq").seq.is_unique
    names = {f.name.split("-")[1] for f in visible(job.dump_dir)}
    assert names == {str(r["pid"])}


def test_fork_record_opt_in(run):
    job = run("""
    torch.ops.opdump.enable()
    pid = os.fork()
    if pid == 0:
        torch.ones(2).sub(1)
        sys.exit(0)
    os.waitpid(pid, 0)
    torch.ops.opdump.flush()
    print(json.dumps({"pid": os.getpid(), "child": pid}))
    """, OPDUMP_FORK="record", timeout=120)
    assert job.returncode == 0, job.stderr
    r = job.result()
    files = visible(job.dump_dir)
    child_files = [f for f in files if f.name.startswith(f"part-{r['child']}-")]
    assert child_files
    md = pq.read_metadata(child_files[0]).metadata
    assert md[b"opdump.forked_from"] == str(r["pid"]).encode()
    assert "aten::sub" in set(pq.read_table(child_files[0]).column("op").to_pylist())


@pytest.mark.parametrize("modules", ["1", "0"])
def test_fork_record_dataloader_workers_publish_their_files(run, modules):
    """DataLoader workers end with os._exit after their loop, which runs no
    exit handler: under OPDUMP_FORK=record each still publishes its records,
    leaves no hidden file behind, and its capture files have their rows."""
    job = run("""
    from torch.utils.data import DataLoader, Dataset
    class Items(Dataset):
        def __len__(self):
            return 8
        def __getitem__(self, i):
            return torch.full((3,), float(i)).mul(2)
    torch.ops.opdump.enable()
    loader = DataLoader(Items(), batch_size=2, num_workers=2, multiprocessing_context="fork")
    total = sum(float(b.sum()) for b in loader)
    torch.ops.opdump.flush()
    print(json.dumps({"pid": os.getpid(), "total": total}))
    """, OPDUMP_FORK="record", OPDUMP_MODULES=modules, OPDUMP_CAPTURE="aten::mul#0", timeout=120)
    assert job.returncode == 0, job.stderr
    r = job.result()
    assert r["total"] == 2 * 3 * sum(range(8))
    hidden = [f for f in job.dump_dir.rglob("*") if f.name.startswith(".")]
    assert not hidden, hidden
    t = job.table()
    workers = t[t.pid != r["pid"]]
    assert workers.pid.nunique() == 2
    muls = workers[(workers.op == "aten::mul") & (workers.role == "output")]
    assert sorted(muls["max"]) == [2.0 * i for i in range(8)]
    # Each worker captured its first mul: every capture file has its row.
    captures = list(job.dump_dir.rglob("capture-*.safetensors"))
    assert len(captures) == 2
    named = set(t.capture_file.dropna().map(lambda p: os.path.basename(p)))
    assert {c.name for c in captures} <= named, (captures, named)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_mid_run_completes_files(tmp_path, sig):
    # Each add_ writes the iteration number into x: the dump itself tells
    # which iterations ran, so nothing recorded before the signal may be missing.
    p, dump = start(tmp_path, """
x = torch.zeros(16)
i = 0
while True:
    x.add_(1)
    i += 1
    if i % 100 == 0:
        print(i, flush=True)
""")
    for line in p.stdout:
        if int(line) >= 300:
            break
    printed = int(line)
    p.send_signal(sig)
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        stacks = subprocess.run(["gdb", "-p", str(p.pid), "-batch", "-ex", "thread apply all bt 30"],
                                capture_output=True, text=True) if shutil.which("gdb") else None
        p.kill()
        _, err = p.communicate()
        pytest.fail("the job did not end after the signal\n" + err[-3000:] +
                    ("\n" + stacks.stdout[-12000:] if stacks else ""))
    assert p.returncode != 0
    t = read_dump(dump)
    adds = t[(t.op == "aten::add_") & (t.role == "output")].sort_values("seq")
    values = adds["max"].astype(int).tolist()
    assert values == list(range(1, len(values) + 1)), "no record lost or duplicated"
    assert len(values) >= printed
    assert t.drop_duplicates("seq").seq.is_unique


def test_full_disk_job_completes(tmp_path):
    """A file-size limit (EFBIG: Python ignores SIGXFSZ) stands for a full disk."""
    script = tmp_path / "job.py"
    script.write_text(f"""
import torch, json
torch.ops.load_library({str(LIB)!r})
x = torch.randn(64, 64)
for i in range(3000):
    x = torch.tanh(x @ x * 0.01)
print(json.dumps({{"sum": float(x.sum()), "stats": torch.ops.opdump.stats()}}))
""")
    limit = 32 * 1024

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    env = clean_env(OPDUMP=1, OPDUMP_DIR=tmp_path / "dump", OPDUMP_ROTATE_SECS="1")
    p = subprocess.run([sys.executable, str(script)], env=env,
                       capture_output=True, text=True, preexec_fn=small_files, timeout=300)
    assert p.returncode == 0, p.stderr
    lines = [l for l in p.stderr.splitlines() if l.startswith("opdump:")]
    assert any("writing the dump failed" in l and "File too large" in l for l in lines), p.stderr
    # The exit report counts what was lost.
    report = [l for l in lines if "lost (write failures)" in l]
    assert len(report) == 1, p.stderr
    lost = int(report[0].split("dropped (channel full), ")[1].split()[0])
    assert lost > 0
    # No partial garbage: every visible file reads back, no temporary file is left.
    for f in (tmp_path / "dump").rglob("*"):
        if f.is_file():
            assert not f.name.startswith("."), f
            pq.read_table(f)
    # The same job without opdump computes the same result.
    ref = subprocess.run([sys.executable, str(script)], env=clean_env(), capture_output=True, text=True)
    # (without OPDUMP the library is loaded but records nothing)
    last = [json.loads(r.stdout.strip().splitlines()[-1]) for r in (ref, p)]
    assert last[0]["sum"] == last[1]["sum"]


def test_four_threads_every_op_recorded_once(run):
    job = run("""
    import threading
    torch.ops.opdump.enable()
    N = 400
    def work(k):
        torch.zeros(1)                     # a new thread's first op switches its hook on
        x = torch.zeros(4)
        for i in range(N):
            x.add_(1)
    ths = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    [t.start() for t in ths]; [t.join() for t in ths]
    torch.ops.opdump.flush()
    print(json.dumps(N))
    """)
    assert job.returncode == 0, job.stderr
    n = job.result()
    t = job.table()
    calls = t.drop_duplicates("seq")
    assert calls.seq.is_unique
    adds = t[(t.op == "aten::add_") & (t.role == "output")]
    per_thread = adds.groupby("thread")["max"].apply(lambda s: sorted(s.astype(int)))
    assert len(per_thread) == 4
    for values in per_thread:
        assert values == list(range(1, n + 1))


def test_memory_stays_bounded(run):
    job = run("""
    import resource
    def rss_mb():
        return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    torch.ops.opdump.enable()
    x = torch.ones(8)
    marks = []
    for i in range(6):
        for _ in range(50_000):
            x.add_(1e-9)
        marks.append(rss_mb())
    torch.ops.opdump.flush()
    print(json.dumps({"rss": marks, "stats": torch.ops.opdump.stats()}))
    """, OPDUMP_INPUTS="0", timeout=600)
    assert job.returncode == 0, job.stderr
    r = job.result()
    assert r["stats"][0] >= 300_000
    growth = r["rss"][-1] - r["rss"][1]
    print(f"RSS after 100k ops {r['rss'][1]:.0f} MB, after 300k {r['rss'][-1]:.0f} MB")
    assert growth < 64, r["rss"]


GLOO_JOB = """
import os, sys, json
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

def worker(rank, lib, dump, init):
    # mp.spawn sets no RANK: opdump takes it from torch.distributed.
    torch.ops.load_library(lib)
    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=2)
    assert "RANK" not in os.environ
    torch.ops.opdump.enable()
    torch.manual_seed(rank)
    x = torch.randn(16)
    y = (x * 2).sum()
    dist.all_reduce(x)
    z = x.relu().sum()
    torch.ops.opdump.flush()
    dist.destroy_process_group()

if __name__ == "__main__":
    lib, dump, init = sys.argv[1:4]
    mp.spawn(worker, args=(lib, dump, init), nprocs=2)
    print(json.dumps("ok"))
"""


def test_two_rank_gloo_job(tmp_path):
    script = tmp_path / "gloo_job.py"
    script.write_text(GLOO_JOB)
    dumps = []
    for name in ("a", "b"):
        dump = tmp_path / name
        p = subprocess.run([sys.executable, str(script), str(LIB), str(dump), f"file://{tmp_path}/init-{name}"],
                           env=clean_env(OPDUMP_DIR=dump), capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        assert sorted(x.name for x in dump.iterdir()) == ["rank=0", "rank=1"]
        dumps.append(dump)
    t = read_dump(dumps[0])
    coll = t[t.op.str.startswith("c10d::")]
    assert len(coll), sorted(set(t.op))
    assert (coll[coll.role == "output"].stats_status == "not_measured").all()
    for rank in ("0", "1"):
        p = subprocess.run([str(CLI), "compare", str(dumps[0]), str(dumps[1]), "--rank", rank, "--json"],
                           capture_output=True, text=True)
        assert p.returncode == 0, (p.returncode, p.stderr)
        assert json.loads(p.stdout)["first_divergence"] is None
