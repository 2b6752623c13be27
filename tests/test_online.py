"""Online compare (OPDUMP_REFERENCE): a run judged against a reference dump
while it runs names the first introduced divergence on one line, captures
that call in the same run, runs it again on the CPU to say which device is
off, writes its verdicts into the dump, and agrees with `opdump compare
REFERENCE THIS_DUMP` offline; `opdump repro` works from its one capture.

TinyLM (scripts/demo.py's worker) trains on the CPU for the reference and
on testdev with a planted fault; each run is a subprocess with opdump
preloaded."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import CLI, LIB, ROOT, clean_env, read_dump
from conftest import tinylm as train_tinylm

STEPS = 6


def tinylm(device, dump, steps=STEPS, **env):
    return train_tinylm(device, dump, steps, **env)


def verdicts(dump):
    """The verdict file's lines, as dicts."""
    files = list(Path(dump).glob("verdicts/rank=0/part-*.jsonl"))
    assert len(files) == 1, files
    return [json.loads(l) for l in files[0].read_text().splitlines()]


def offline(ref, dump):
    p = subprocess.run([str(CLI), "compare", str(ref), str(dump), "--json"], capture_output=True, text=True)
    assert p.returncode in (0, 1, 3), p.stderr
    return p.returncode, json.loads(p.stdout)


def same_headline(final, report):
    """The stored final verdict names what offline compare names."""
    h, o = final["headline"], report["headline"]
    if o is None:
        assert h is None, h
        return
    assert (h["op"], h["overload"], h["seq_a"], h["seq_b"], h["step"]) == \
        (o["op"], o["overload"], o["seq_a"], o["seq_b"], o["step_b"])


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    d = tmp_path_factory.mktemp("online") / "cpu"
    p, losses, lines = tinylm("cpu", d)
    assert p.returncode == 0, p.stderr[-3000:]
    assert not lines, lines
    return d, losses


@pytest.mark.parametrize("fault,op,phase,label", [
    ("aten::gelu=scale:1.01", "aten::gelu", "forward", "aten::gelu in blocks.0"),
    ("aten::gelu_backward=scale:1.01", "aten::gelu_backward", "backward",
     # Backward runs the blocks last to first.
     "aten::gelu_backward (backward of aten::gelu in blocks.1)"),
])
def test_a_planted_fault_is_named_captured_and_stored_as_offline_compare_says(
        reference, tmp_path, fault, op, phase, label):
    ref, _ = reference
    run = tmp_path / "testdev"
    p, losses, lines = tinylm("testdev", run, OPDUMP_REFERENCE=ref, TESTDEV_FAULT=fault)
    assert p.returncode == 0, p.stderr[-3000:]
    named = [l for l in lines if "introduced a divergence from OPDUMP_REFERENCE" in l]
    assert len(named) == 1, lines
    # Its first faulted call: step 0, the op's first call.
    assert named[0].startswith(f"opdump: step 0, {phase}: {label} introduced"), named[0]
    assert "output error 1.0e-2" in named[0] and f"({op}#0)" in named[0], named[0]

    rows = verdicts(run)
    final = rows[-1]
    assert final["kind"] == "final" and final["outcome"] == "introduced" and final["exit_status"] == 1
    assert final["steps_judged"] == STEPS + 1 and final["steps_missing"] == 0  # the steps and the tail
    groups = [r for r in rows if r["kind"] == "group"]
    assert {r["step"] for r in groups} == set(range(STEPS + 1))
    assert any(r["outcome"] == "introduced" and r["first_introduced"]["op"] == op for r in groups)

    status, report = offline(ref, run)
    assert status == final["exit_status"]
    same_headline(final, report)
    # Offline compare and DuckDB read the stored verdicts.
    assert any(f"was judged against a reference dump while it ran (OPDUMP_REFERENCE): introduced at {op} (step 0"
               in n for n in report["notes"]), report["notes"]
    import duckdb
    introduced = duckdb.sql(f"SELECT step, first_introduced.op FROM read_json('{run}/verdicts/rank=*/*.jsonl') "
                            "WHERE kind = 'group' AND outcome = 'introduced' ORDER BY step").fetchall()
    assert introduced and introduced[0] == (0, op), introduced

    # The same call of a later step was captured, with its selector.
    captures = list(run.glob("rank=0/device=*/capture-*.safetensors"))
    assert len(captures) == 1, captures
    t = read_dump(run)
    captured = t[t.capture_file.notna()]
    assert set(captured.op) == {op} and captured.step.min() > 0
    step = int(captured.step.min())

    # Run again on the CPU from its inputs, it says testdev is off: 1e-2
    # from float64, where the CPU in float32 is at rounding.
    off = [l for l in lines if " is off at " in l]
    assert len(off) == 1, lines
    assert off[0].startswith(f"opdump: testdev:0 is off at {label} (the call {op}@step={step}#0): 1.0e-2 from "
                             "float64, where the CPU in float32 is "), off[0]
    check = final["cpu_check"]
    assert check["device_is_off"] is True and check["dtype"] == "float32"
    assert 9e-3 < check["device_err"] < 1.1e-2 and check["cpu_err"] < 1e-6, check
    assert [r for r in rows if r["kind"] == "cpu_check"] == [check]

    # opdump repro works from this one capture: A's side runs from B's inputs.
    repro = tmp_path / "repro"
    p = subprocess.run([str(CLI), "repro", str(ref), str(run), "--out", str(repro)], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert not (repro / "a.safetensors").exists() and (repro / "b.safetensors").exists()
    assert json.loads((repro / "call.json").read_text())["a_from_b"] is True
    p = subprocess.run([sys.executable, str(repro / "repro.py"), "--setup", "tests.testdev:load", "--json"],
                       capture_output=True, text=True, env=clean_env(TESTDEV_FAULT=fault))
    assert p.returncode == 1, p.stdout + p.stderr
    result = json.loads(p.stdout)
    assert result["off"] == ["testdev"], result
    # repro.py judges with call.json's margin, the check's factor: with one
    # larger than the fault's error ratio, testdev is no longer off.
    call = json.loads((repro / "call.json").read_text())
    assert call["margin"] == 10
    (repro / "call.json").write_text(json.dumps({**call, "margin": 1e30}))
    p = subprocess.run([sys.executable, str(repro / "repro.py"), "--setup", "tests.testdev:load", "--json"],
                       capture_output=True, text=True, env=clean_env(TESTDEV_FAULT=fault))
    assert "testdev" not in json.loads(p.stdout)["off"], p.stdout + p.stderr


@pytest.mark.parametrize("steps,selection", [(2, {}), (4, {"OPDUMP_STEPS": "0-1"})], ids=["two-steps", "steps-0-1"])
def test_a_short_run_captures_the_named_call_and_says_which_device_is_off(tmp_path, steps, selection):
    """A run of two steps, or one that dumps two (the quick start's
    `--steps 0-1`): the job waits at the end of step 0 for its verdict, so
    the call named in step 0 is captured in step 1 and run again on the CPU
    before the run ends. A 0.1% fault in a backward kernel."""
    fault, op = "aten::_softmax_backward_data=scale:1.001", "aten::_softmax_backward_data"
    label = f"{op} (backward of aten::_softmax in blocks.1)"
    ref = tmp_path / "cpu"
    p, _, lines = tinylm("cpu", ref, steps=steps, **selection)
    assert p.returncode == 0 and not lines, p.stderr[-3000:]
    p, alone, _ = tinylm("testdev", tmp_path / "alone", steps=steps, TESTDEV_FAULT=fault, **selection)
    assert p.returncode == 0, p.stderr[-3000:]
    run = tmp_path / "testdev"
    p, losses, lines = tinylm("testdev", run, steps=steps, OPDUMP_REFERENCE=ref, TESTDEV_FAULT=fault, **selection)
    assert p.returncode == 0, p.stderr[-3000:]
    assert losses == alone  # waiting for a verdict changes nothing the job computes

    named = [l for l in lines if "introduced a divergence from OPDUMP_REFERENCE" in l]
    assert len(named) == 1 and named[0].startswith(f"opdump: step 0, backward: {label} introduced"), lines
    # The fault's 1e-3, relative to the scale a cancelling op is judged at
    # (its partial sums'), which is above the output's own norm.
    err = float(re.search(r"output error ([0-9.e+-]+),", named[0]).group(1))
    assert 2e-4 < err <= 1.1e-3 and f"({op}#0)" in named[0], named[0]
    # Captured in step 1, the last step dumped.
    assert len(list(run.glob("rank=0/device=*/capture-*.safetensors"))) == 1
    t = read_dump(run)
    captured = t[t.capture_file.notna()]
    assert set(captured.op) == {op} and set(captured.step) == {1}, captured[["op", "step"]]
    # Which device is off, said before the run ended.
    off = [l for l in lines if " is off at " in l or "agrees with float64" in l]
    assert len(off) == 1, lines
    assert off[0].startswith(f"opdump: testdev:0 is off at {label} (the call {op}@step=1#0): 1.0e-3 from float64, "
                             "where the CPU in float32 is "), off[0]
    # Nothing else: no call came after its step was judged, no wait ran out.
    assert len(lines) == 2, lines
    final = verdicts(run)[-1]
    assert final["outcome"] == "introduced" and final["cpu_check"]["device_is_off"] is True, final
    assert final["first_introduced"]["op"] == op and final["first_introduced"]["step"] == 0


def test_a_fault_free_run_says_nothing_and_stores_agreement(reference, tmp_path):
    ref, _ = reference
    run = tmp_path / "cpu-again"
    p, losses, lines = tinylm("cpu", run, OPDUMP_REFERENCE=ref)
    assert p.returncode == 0, p.stderr[-3000:]
    assert lines == [], lines
    final = verdicts(run)[-1]
    assert final["outcome"] == "agree" and final["headline"] is None
    assert not list(run.glob("rank=0/device=*/capture-*"))
    assert final["cpu_check"] is None
    status, report = offline(ref, run)
    assert status == final["exit_status"] == 0
    same_headline(final, report)


def test_stop_ends_the_job_nonzero_after_the_capture_with_readable_files(reference, tmp_path):
    ref, _ = reference
    run = tmp_path / "stopped"
    p, _, lines = tinylm("testdev", run, OPDUMP_REFERENCE=ref, TESTDEV_FAULT="aten::gelu=scale:1.01",
                         OPDUMP_ON_DIVERGENCE="stop")
    assert p.returncode != 0
    raised = [l for l in p.stderr.splitlines() if l.startswith("RuntimeError: opdump: OPDUMP_ON_DIVERGENCE=stop")]
    assert len(raised) == 1 and "aten::gelu in blocks.0" in raised[0], p.stderr[-2000:]
    assert "opdump: OPDUMP_ON_DIVERGENCE=stop: a divergence was introduced; the process exits with status 1" \
        in lines, lines
    assert len(list(run.glob("rank=0/device=*/capture-*.safetensors"))) == 1
    for f in run.glob("rank=0/device=*/*.parquet"):
        pq.read_table(f)  # complete, readable files
    assert verdicts(run)[-1]["outcome"] == "introduced"


def test_the_job_result_is_unchanged_whatever_the_reference(reference, tmp_path):
    """Another program's dump, a missing directory, a file of another schema
    version, a mutated file, a directory others can write or another user
    owns, an empty one: one line each, and the losses are bitwise those of
    the run with no reference."""
    ref, cpu_losses = reference
    other = tmp_path / "other-program"
    p, _, _ = tinylm("cpu", other, steps=2, OPDUMP_INCLUDE="aten::(mm|addmm)")
    assert p.returncode == 0
    schema = tmp_path / "schema"
    shutil.copytree(ref, schema)
    f = sorted(schema.glob("rank=0/device=*/*.parquet"))[0]
    t = pq.read_table(f)
    meta = dict(pq.read_metadata(f).metadata)
    meta[b"opdump.schema_version"] = b"99"
    pq.write_table(t.replace_schema_metadata(meta), f)
    mutated = tmp_path / "mutated"
    shutil.copytree(ref, mutated)
    f = sorted(mutated.glob("rank=0/device=*/*.parquet"))[0]
    data = bytearray(f.read_bytes())
    for i in range(64, len(data) - 64, 97):
        data[i] ^= 0x5A
    f.write_bytes(bytes(data))
    empty = tmp_path / "empty"
    empty.mkdir(mode=0o700)
    shared = tmp_path / "shared"
    shutil.copytree(ref, shared)
    os.chmod(shared, 0o777)

    cases = {}
    if os.geteuid() == 0:  # root can give a copy to another user
        foreign = tmp_path / "foreign"
        shutil.copytree(ref, foreign)
        os.chown(foreign, 65534, 65534)
        cases[foreign] = "is owned by another user"
    cases |= {
        other: "is a dump of another program",
        tmp_path / "missing": "cannot be opened",
        schema: "is newer than this opdump",
        mutated: "",
        shared: "is writable by other users",
        empty: "no opdump files here",
    }
    for given, says in cases.items():
        run = tmp_path / ("run-" + given.name)
        p, losses, lines = tinylm("cpu", run, OPDUMP_REFERENCE=given)
        assert p.returncode == 0, p.stderr[-3000:]
        assert losses == cpu_losses, given.name
        assert len(lines) == 1, (given.name, lines)
        assert "OPDUMP_REFERENCE" in lines[0] and says in lines[0], lines[0]
        assert lines[0].lower().endswith("this run is dumped without comparing"), lines[0]
        assert len(read_dump(run)) > 0


def test_a_bad_on_divergence_value_names_the_variable(tmp_path):
    p, _, lines = tinylm("cpu", tmp_path / "d", steps=1, OPDUMP_REFERENCE=tmp_path, OPDUMP_ON_DIVERGENCE="halt")
    assert p.returncode == 0
    assert any(l.startswith('opdump: OPDUMP_ON_DIVERGENCE="halt" is not valid: use report') for l in lines), lines


JOB = """
import resource, sys, torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64))
opt = torch.optim.SGD(model.parameters(), lr=1e-3)
x = torch.randn(32, 64)
for step in range(int(sys.argv[1])):
    y = x
    with torch.no_grad():
        for _ in range(500):
            y = (y * 0.999).add(0.001).relu().neg().neg()
    loss = model(x + y * 0).square().mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def test_memory_does_not_grow_with_the_number_of_steps(tmp_path):
    """Each step's records are judged and dropped. A step here makes about
    2,600 op calls, so keeping the records of 100 more steps would take
    some 150 MB more; a run of 120 steps with a reference peaks within a
    few tens of MB of a run of 20 (one malloc arena per kind of thread,
    so that arenas do not add their own noise)."""
    job = tmp_path / "job.py"
    job.write_text(JOB)

    def run(steps, dump, **env):
        e = clean_env(OPDUMP="1", OPDUMP_DIR=dump, LD_PRELOAD=LIB, MALLOC_ARENA_MAX=2, **env)
        p = subprocess.run([sys.executable, str(job), str(steps)], env=e, capture_output=True, text=True,
                           timeout=300)
        assert p.returncode == 0, p.stderr[-2000:]
        return int(p.stdout.split()[-1]) / 1024, [l for l in p.stderr.splitlines() if l.startswith("opdump:")]

    run(120, tmp_path / "ref")
    short, lines = run(20, tmp_path / "short", OPDUMP_REFERENCE=tmp_path / "ref")
    assert lines == [], lines
    long, lines = run(120, tmp_path / "long", OPDUMP_REFERENCE=tmp_path / "ref")
    assert lines == [], lines
    assert verdicts(tmp_path / "long")[-1]["steps_judged"] == 121
    print(f"peak RSS: 20 steps {short:.0f} MiB, 120 steps {long:.0f} MiB")
    assert long - short < 64, (short, long)


def test_a_battery_family_judged_online_names_what_offline_compare_names(tmp_path):
    """ResNet (convolutions, batch norm), a fault in batch norm's backward: the run judged
    against a CPU reference names the call at its first faulted call, as
    offline compare does, captures it later and finds testdev off."""
    sys.path.insert(0, str(ROOT / "tests"))
    from battery import run as battery

    # The job waits at the end of step 0 for its verdict, at most a bounded
    # time: on a loaded machine the judge may take longer, and the call is
    # then captured in a later step; twelve short steps leave it room.
    steps = 12
    ref, _ = battery.dump("resnet", "cpu", tmp_path / "ref", steps=steps)
    run, res = battery.dump("resnet", "testdev", tmp_path / "run", steps=steps,
                            fault="aten::native_batch_norm_backward=scale:1.01",
                            env_extra={"OPDUMP_REFERENCE": str(ref)})
    assert res["fault_counts"].get("aten::native_batch_norm_backward", 0) > 0, res
    final = verdicts(run)[-1]
    status, report = offline(ref, run)
    assert status == final["exit_status"] == 1
    same_headline(final, report)
    assert final["headline"]["op"] == "aten::native_batch_norm_backward" and final["headline"]["phase"] == "backward"
    assert final["headline"]["step"] == 0
    assert len(list(run.glob("rank=0/device=*/capture-*.safetensors"))) == 1
    assert final["cpu_check"]["device_is_off"] is True, final["cpu_check"]


def test_steps_the_reference_lacks_are_said_and_counted(tmp_path):
    """A reference of two steps against a run of four: the steps after the
    reference's last (its tail after the last optimizer step, step 2) are
    not compared, though the reference has the step before each, its
    context; one line says so, and the final verdict counts them."""
    ref = tmp_path / "cpu"
    p, _, lines = tinylm("cpu", ref, steps=2)
    assert p.returncode == 0 and not lines, p.stderr[-3000:]
    run = tmp_path / "testdev"
    p, _, lines = tinylm("testdev", run, steps=4, OPDUMP_REFERENCE=ref)
    assert p.returncode == 0, p.stderr[-3000:]
    missing = [l for l in lines if "has no calls of rank 0 in step 3;" in l]
    assert len(missing) == 1, lines
    final = verdicts(run)[-1]
    assert final["kind"] == "final" and final["steps_missing"] == 2, final
