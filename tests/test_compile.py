"""torch.compile under opdump: a compiled job runs as without it, the calls
made while tracing are not the job's, and a fault in compiled code is named.

Most training jobs are compiled. Dynamo traces every module call, and so
would trace opdump's module hooks; the hooks step aside while it compiles
(cpp/hook/python_hooks.cpp), and the calls it makes on fake tensors are not
recorded (cpp/hook/fallback.cpp, `tracing_call`)."""

import json
import subprocess
import sys

import pytest

from conftest import LIB, ROOT, clean_env, read_dump
from tests.battery import run as battery

# Trains a compiled model for three steps and prints its losses bit for bit:
# the second and third depend on every parameter after the updates before.
TRAIN = """
import json, sys
import torch
torch.set_num_threads(1)
sys.path.insert(0, {root!r})
model, backend = sys.argv[1], sys.argv[2]
if model == "tinylm":
    from scripts import tinylm
    losses = tinylm.train("cpu", steps=3, compile=backend)
else:
    from tests.battery import models
    losses = models.train(model, "cpu", steps=3, compile=backend)
print(json.dumps([float(l).hex() for l in losses]))
"""


def train(tmp_path, model, backend, opdump):
    script = tmp_path / "train.py"
    script.write_text(TRAIN.format(root=str(ROOT)))
    env = clean_env()
    if opdump:
        env.update(OPDUMP="1", OPDUMP_DIR=str(tmp_path / f"dump-{model}-{backend}"), LD_PRELOAD=str(LIB))
    p = subprocess.run([sys.executable, str(script), model, backend], env=env, capture_output=True,
                       text=True, timeout=900, cwd=tmp_path)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1]), p.stderr


@pytest.mark.parametrize("backend", ["inductor", "aot_eager"])
@pytest.mark.parametrize("model", ["tinylm", "llama"])
def test_compiled_job_is_unchanged(tmp_path, model, backend):
    """OPDUMP=1 with the default settings (module hooks on): the compiled
    job's losses are the same bits as without opdump, opdump says nothing,
    torch warns of nothing opdump installed, and the dump holds the compiled
    code's calls, none of them put in a module they do not run in."""
    without, _ = train(tmp_path, model, backend, opdump=False)
    with_opdump, stderr = train(tmp_path, model, backend, opdump=True)
    assert with_opdump == without
    assert "opdump:" not in stderr, stderr[-3000:]
    assert "global hooks" not in stderr
    rows = read_dump(tmp_path / f"dump-{model}-{backend}")
    calls = rows.drop_duplicates("seq")
    assert calls.op.isin(["aten::mm", "aten::addmm"]).any()
    # The compiled code's submodules run without their hooks: its calls
    # carry no module rather than the compiled model's or a stale one.
    forward = calls[(calls.phase == "forward") & calls.op.isin(["aten::mm", "aten::addmm"])]
    assert len(forward) and forward.module.isna().all(), forward.module.value_counts()


def test_calls_on_fake_tensors_are_not_recorded(run):
    """Calls under a fake mode, and calls on a fake tensor outside it, are
    the tracer's, not the job's: neither is recorded, and the real calls
    around them are."""
    job = run(
        """
        from torch._subclasses.fake_tensor import FakeTensorMode
        torch.ops.opdump.enable()
        real = torch.ones(3) * 2
        with FakeTensorMode():
            torch.ones(4).sin()
        mode = FakeTensorMode()
        fake = mode.from_tensor(torch.zeros(5))
        fake.cos()
        real.tan()
        torch.ops.opdump.flush()
        print(json.dumps({}))
        """
    )
    assert job.returncode == 0, job.stderr
    ops = set(job.table().op)
    assert {"aten::ones", "aten::mul", "aten::tan", "aten::zeros"} <= ops, ops
    assert not ops & {"aten::sin", "aten::cos"}, ops


@pytest.fixture(scope="module")
def compiled_cpu(tmp_path_factory):
    out = tmp_path_factory.mktemp("compiled")
    a, _ = battery.dump("llama", "cpu", out, compile="aot_eager")
    return out, a


def test_compiled_cpu_against_compiled_testdev_names_the_fault(compiled_cpu):
    out, a = compiled_cpu
    b, res = battery.dump("llama", "testdev", out, fault="aten::silu=scale:1.01", compile="aot_eager")
    assert res["fault_counts"].get("aten::silu", 0) > 0
    code, rep = battery.compare(a, b)
    assert code == 1, rep["first_introduced"]
    assert rep["first_introduced"]["op"] == "aten::silu"


def test_compiled_cpu_against_compiled_testdev_agrees(compiled_cpu):
    out, a = compiled_cpu
    b, _ = battery.dump("llama", "testdev", out, compile="aot_eager")
    code, rep = battery.compare(a, b)
    assert code == 0, rep["first_introduced"]


# Dumps two TinyLM steps on a device, eager or compiled.
TINYLM = """
import sys
sys.path.insert(0, {root!r})
import torch
torch.set_num_threads(1)
if sys.argv[1] == "testdev":
    import tests.testdev as testdev
    testdev.load()
from scripts import tinylm
tinylm.train(sys.argv[1], steps=2, compile=sys.argv[2] if sys.argv[2] != "eager" else None)
"""


def tinylm_dump(out, device, backend, fault=None):
    script = out / "tinylm_job.py"
    script.write_text(TINYLM.format(root=str(ROOT)))
    d = out / f"tinylm-{device}-{backend}{'-fault' if fault else ''}"
    env = clean_env(OPDUMP="1", OPDUMP_DIR=str(d), LD_PRELOAD=str(LIB), **({"TESTDEV_FAULT": fault} if fault else {}))
    p = subprocess.run([sys.executable, str(script), device, backend], env=env, capture_output=True, text=True,
                       timeout=600, cwd=out)
    assert p.returncode == 0, p.stderr[-3000:]
    return d


@pytest.fixture(scope="module")
def eager_cpu(tmp_path_factory):
    out = tmp_path_factory.mktemp("eager")
    return out, tinylm_dump(out, "cpu", "eager")


def test_eager_against_compiled_compares_without_force(eager_cpu):
    """A compiled run is the eager run's decomposed ops in a flat list: the
    comparison aligns them across levels, is not refused as another
    program, and finds nothing introduced."""
    out, a = eager_cpu
    b = tinylm_dump(out, "cpu", "aot_eager")
    code, rep = battery.compare(a, b)
    assert code == 0, (rep["first_divergence"], rep["first_introduced"])
    assert rep["first_introduced"] is None
    p = subprocess.run([str(battery.TARGET / "opdump"), "compare", str(a), str(b)], capture_output=True, text=True)
    aligned = int(p.stdout.split("aligned: ")[1].split(" op calls")[0].replace(",", ""))
    b_calls = len(read_dump(b).drop_duplicates("seq"))
    assert aligned > 0.85 * b_calls, p.stdout[:2000]


def test_eager_cpu_against_compiled_testdev_names_the_fault(eager_cpu):
    out, a = eager_cpu
    b = tinylm_dump(out, "testdev", "aot_eager", fault="aten::gelu=scale:1.01")
    code, rep = battery.compare(a, b)
    assert code == 1, rep["first_introduced"]
    assert rep["first_introduced"]["op"] == "aten::gelu"
