"""Every selection variable: the dump holds exactly what it selects."""


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


# Each selection rule is a unit test of crates/engine/src/selection.rs; these
# jobs check that the rules are wired to the hook end to end.


def test_include_steps_and_ranks_end_to_end(run):
    t = calls(run(JOB, OPDUMP_INCLUDE=r"aten::(relu|mm)\b", OPDUMP_STEPS="1-2", RANK="3", OPDUMP_RANKS="2-3"))
    assert set(t.op) == {"aten::relu", "aten::mm"}
    assert sorted(t.step.unique()) == [1, 2]
    other = run(JOB, OPDUMP_RANKS="1", RANK="0")
    assert other.returncode == 0 and other.result() == [0, 0, 0]
    assert not list(other.dump_dir.rglob("*.parquet"))


def test_narrowed_selection_keeps_depth_and_parents(run):
    # Calls of ops the regexes leave out never reach Rust: the hook counts
    # them itself, so a selected call nested in them keeps its depth, and
    # its parent is the nearest selected call.
    full = calls(run(JOB))
    only = calls(run(JOB, OPDUMP_INCLUDE=r"aten::(linear|mm|relu)\b"))
    assert set(only.op) == {"aten::linear", "aten::mm", "aten::relu"}
    for op in only.op.unique():
        want = full[full.op == op].sort_values("seq").depth.tolist()
        assert only[only.op == op].sort_values("seq").depth.tolist() == want, op
    assert (full[(full.op == "aten::mm") & (full.phase == "forward")].depth > 0).all()
    by_seq = only.set_index("seq")
    for _, mm in only[(only.op == "aten::mm") & (only.phase == "forward")].iterrows():
        assert by_seq.loc[mm.parent_seq].op == "aten::linear"
    bare = calls(run(JOB, OPDUMP_INCLUDE=r"aten::mm\b"))
    assert bare.parent_seq.isna().all()
    assert bare.sort_values("seq").depth.tolist() == full[full.op == "aten::mm"].sort_values("seq").depth.tolist()


def test_max_depth_and_inputs(run):
    t = run(JOB, OPDUMP_MAX_DEPTH="0", OPDUMP_INPUTS="0").table()
    assert set(t.depth) == {0}
    assert set(t.role) <= {"output", "none"} and "output" in set(t.role)


def test_max_records(run):
    job = run(JOB, OPDUMP_MAX_RECORDS="25")
    assert job.table().seq.nunique() == 25
    assert any("OPDUMP_MAX_RECORDS=25 reached" in l for l in job.opdump_lines())


def test_queue_drop_counts_what_it_drops(run):
    job = run(JOB, OPDUMP_QUEUE="1", OPDUMP_QUEUE_FULL="drop")
    assert job.returncode == 0, job.stderr
    written, dropped, failed = job.result()
    assert dropped > 0 and failed == 0
    assert job.table().seq.nunique() == written


def test_rotation_rows_and_file_mode(run):
    import os
    import stat

    import pyarrow.parquet as pq

    job = run(JOB, OPDUMP_ROTATE_ROWS="50", OPDUMP_FILE_MODE="640")
    files = list(job.dump_dir.rglob("*.parquet"))
    assert len(files) > 3
    assert all(pq.read_metadata(f).num_rows <= 50 + 20 for f in files)
    assert all(stat.S_IMODE(os.stat(f).st_mode) == 0o640 for f in files)
    assert stat.S_IMODE(os.stat(files[0].parent).st_mode) == 0o750


# Ops defined and dropped in turn: the dispatcher may make each one where
# the one before was, and the hook's per-op cache is keyed by that address.
DROPPED_OPS_JOB = """
import gc
torch.ops.opdump.enable()
for round in range(12):
    lib = torch.library.Library("opdump_reuse", "FRAGMENT")
    name = f"keep{round}" if round % 2 else f"skip{round}"
    lib.define(name + "(Tensor x) -> Tensor")
    lib.impl(name, lambda x: x + 1, "CompositeExplicitAutograd")
    getattr(torch.ops.opdump_reuse, name)(torch.ones(3))
    del lib
    gc.collect()
torch.ops.opdump.flush()
print(json.dumps(torch.ops.opdump.stats()))
"""


def test_an_op_made_where_a_dropped_one_was_is_named_and_selected_as_itself(run):
    everything = calls(run(DROPPED_OPS_JOB))
    mine = everything[everything.op.str.startswith("opdump_reuse::")]
    assert sorted(mine.op) == sorted(f"opdump_reuse::{'keep' if r % 2 else 'skip'}{r}" for r in range(12))
    kept = calls(run(DROPPED_OPS_JOB, OPDUMP_INCLUDE=r"opdump_reuse::keep"))
    assert sorted(kept.op) == sorted(f"opdump_reuse::keep{r}" for r in range(1, 12, 2))
