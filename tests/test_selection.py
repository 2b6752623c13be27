"""Every selection variable: the dump holds exactly what it selects."""

import pytest

JOB = """
torch.manual_seed(0)
p = torch.nn.Parameter(torch.randn(4, 4))
opt = torch.optim.SGD([p], lr=0.1)
torch.ops.opdump.enable()
for step in range(4):
    x = torch.randn(3, 4)
    y = torch.nn.functional.linear(x, p).relu().sum()
    y.backward()
    opt.step()
    opt.zero_grad()
torch.ops.opdump.flush()
print(json.dumps(torch.ops.opdump.stats()))
"""


def calls(job):
    return job.table().drop_duplicates("seq")


def test_include_and_exclude(run):
    inc = calls(run(JOB, OPDUMP_INCLUDE=r"aten::(relu|mm)\b"))
    assert set(inc.op) == {"aten::relu", "aten::mm"}
    exc = calls(run(JOB, OPDUMP_EXCLUDE=r"^aten::(relu|t)\."))
    assert "aten::relu" not in set(exc.op) and "aten::t" not in set(exc.op)
    assert "aten::mm" in set(exc.op)
    ov = calls(run(JOB, OPDUMP_INCLUDE=r"aten::add_\.Tensor"))
    assert set(ov.op + "." + ov.overload) == {"aten::add_.Tensor"}


def test_steps(run):
    t = calls(run(JOB, OPDUMP_STEPS="1-2"))
    assert sorted(t.step.unique()) == [1, 2]
    t = calls(run(JOB, OPDUMP_STEPS="0,3"))
    assert sorted(t.step.unique()) == [0, 3]


def test_ranks(run):
    other = run(JOB, OPDUMP_RANKS="1", RANK="0")
    assert other.returncode == 0 and other.result() == [0, 0, 0]
    assert not list(other.dump_dir.rglob("*.parquet"))
    job = run(JOB, OPDUMP_RANKS="0-1", RANK="1")
    assert [p.name for p in job.dump_dir.iterdir()] == ["rank=1"]


def test_max_depth_and_inputs(run):
    t = run(JOB, OPDUMP_MAX_DEPTH="0").table()
    assert set(t.depth) == {0}
    t1 = run(JOB, OPDUMP_MAX_DEPTH="1").table()
    assert set(t1.depth) == {0, 1}
    t = run(JOB, OPDUMP_INPUTS="0").table()
    assert set(t.role) <= {"output", "none"} and "output" in set(t.role)


def test_max_records(run):
    job = run(JOB, OPDUMP_MAX_RECORDS="25")
    assert job.table().seq.nunique() == 25
    assert any("OPDUMP_MAX_RECORDS=25 reached" in l for l in job.opdump_lines())


def test_rotation_rows(run):
    job = run(JOB, OPDUMP_ROTATE_ROWS="50")
    files = list(job.dump_dir.rglob("*.parquet"))
    assert len(files) > 3
    import pyarrow.parquet as pq

    assert all(pq.read_metadata(f).num_rows <= 50 + 20 for f in files)


def test_queue_drop_counts_what_it_drops(run):
    job = run(JOB, OPDUMP_QUEUE="1", OPDUMP_QUEUE_FULL="drop")
    assert job.returncode == 0, job.stderr
    written, dropped, failed = job.result()
    assert dropped > 0 and failed == 0
    assert job.table().seq.nunique() == written


def test_file_mode(run):
    import os
    import stat

    job = run(JOB, OPDUMP_FILE_MODE="640")
    f = next(job.dump_dir.rglob("*.parquet"))
    assert stat.S_IMODE(os.stat(f).st_mode) == 0o640
    assert stat.S_IMODE(os.stat(f.parent).st_mode) == 0o750
