"""Loading and switching: LD_PRELOAD, off by default, a second copy, bad
configuration, and a torch that differs from the build's."""

import shutil
import subprocess

import pytest

from conftest import CORE, LIB, ROOT, clean_env


def test_preload_dumps_and_spares_non_torch_children(run, tmp_path):
    job = run("""
    import subprocess, time
    child = subprocess.Popen(["sleep", "3"])
    time.sleep(0.5)
    maps = open(f"/proc/{child.pid}/maps").read()
    child.kill()
    x = torch.randn(10, 10)
    y = (x @ x).relu()
    own = open("/proc/self/maps").read()
    print(json.dumps({
        "child_torch": "libtorch_cpu" in maps,
        "child_core": "libopdump_core" in maps,
        "child_shim": "libopdump.so" in maps,
        "self_core": "libopdump_core" in own,
        "self_torch_copies": len({l.split()[-1] for l in own.splitlines() if l.endswith("libtorch_cpu.so")}),
    }))
    """, preload=True, OPDUMP=1)
    assert job.returncode == 0, job.stderr
    r = job.result()
    assert r == {"child_torch": False, "child_core": False, "child_shim": True,
                 "self_core": True, "self_torch_copies": 1}
    t = job.table()
    assert {"aten::randn", "aten::mm", "aten::relu"} <= set(t.op)


def test_off_by_default(run, tmp_path):
    job = run("""
    x = torch.randn(100, 100)
    y = (x @ x).sum()
    print(json.dumps(torch.ops.opdump.stats()))
    """)
    assert job.returncode == 0, job.stderr
    assert job.result() == [0, 0, 0]
    assert not job.dump_dir.exists()
    assert job.opdump_lines() == []


def test_enable_writes_on_exit_without_flush(run):
    job = run("""
    torch.ops.opdump.enable()
    for i in range(100):
        torch.ones(4).add(i)
    print(json.dumps(1))
    """)
    assert job.returncode == 0, job.stderr
    t = job.table()
    assert (t.op == "aten::add").sum() >= 100


def test_uncaught_exception_still_writes(run):
    job = run("""
    torch.ops.opdump.enable()
    torch.ones(4).add(1)
    raise SystemExit(3)
    """)
    assert job.returncode == 3
    assert "aten::add" in set(job.table().op)


def test_second_copy_does_not_abort(run, tmp_path):
    other = tmp_path / "copy"
    other.mkdir()
    shutil.copy(LIB, other / LIB.name)
    shutil.copy(CORE, other / CORE.name)
    job = run(f"""
    torch.ops.load_library({str(other / LIB.name)!r})
    torch.ones(3).add(1)
    torch.ops.opdump.flush()
    print(json.dumps(torch.ops.opdump.stats()))
    """, OPDUMP=1)
    assert job.returncode == 0, job.stderr
    lines = job.opdump_lines()
    assert len(lines) == 1 and "another copy of opdump is already loaded" in lines[0], job.stderr
    assert job.result()[0] > 0  # the first copy keeps recording


@pytest.mark.parametrize("env,needle", [
    ({"OPDUMP": "yes please"}, 'OPDUMP="yes please" is not valid'),
    ({"OPDUMP": "1", "OPDUMP_INCLUDE": "add("}, 'OPDUMP_INCLUDE="add(" is not valid'),
    ({"OPDUMP": "1", "OPDUMP_STEPS": "1-"}, 'OPDUMP_STEPS="1-" is not valid'),
])
def test_bad_values_keep_dumping_off(run, env, needle):
    code = """
    x = torch.arange(10.0)
    print(json.dumps(float((x * 2).sum())))
    """
    job = run(code, **env)
    assert job.returncode == 0, job.stderr
    assert job.result() == 90.0
    assert any(needle in l for l in job.opdump_lines()), job.stderr
    assert not job.dump_dir.exists()


def test_unknown_variable_warns_with_nearest_name(run):
    job = run("print(json.dumps(1))", OPDUMP_DIRR="/tmp/x")
    assert job.returncode == 0
    assert any("OPDUMP_DIRR" in l and "did you mean OPDUMP_DIR?" in l for l in job.opdump_lines()), job.stderr


def test_unwritable_dir(run, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    job = run("""
    ok = torch.ops.opdump.enable()
    print(json.dumps(float(torch.ones(3).sum())))
    """, OPDUMP_DIR=blocker / "dump")
    assert job.returncode == 0, job.stderr
    assert job.result() == 3.0
    lines = job.opdump_lines()
    assert any("OPDUMP_DIR=" in l and "writable directory" in l for l in lines), job.stderr


OTHER_TORCH = ROOT / ".venv-torch211" / "bin" / "python"


@pytest.mark.skipif(not OTHER_TORCH.exists(), reason="needs .venv-torch211 (scripts/test-torch211.sh makes it)")
def test_other_torch_version_is_refused(tmp_path):
    import json

    code = (
        "import torch, json\n"
        f"torch.ops.load_library({str(LIB)!r})\n"
        "print(json.dumps(float(torch.ones(2).sum())))\n"
    )
    other_version = subprocess.run([str(OTHER_TORCH), "-c", "import torch; print(torch.__version__)"],
                                   capture_output=True, text=True).stdout.strip()
    import torch

    if other_version.split("+")[0] == torch.__version__.split("+")[0]:
        pytest.skip("the second venv has the same torch")
    p = subprocess.run([str(OTHER_TORCH), "-c", code], env=clean_env(OPDUMP="1", OPDUMP_DIR=tmp_path / "d"),
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.strip()) == 2.0
    lines = [l for l in p.stderr.splitlines() if l.startswith("opdump:")]
    assert len(lines) == 1 and "built for torch" in lines[0], p.stderr
    assert not (tmp_path / "d").exists()


def test_hook_only_passes_every_call_on_and_writes_nothing(run):
    """OPDUMP_HOOK_ONLY=1 (the benchmark's empty-hook cost): the hook's key
    is on for the thread as when dumping, every call still computes the same
    result, and nothing is recorded or written."""
    script = """
    torch.manual_seed(0)
    x = torch.randn(64, 64)
    y = torch.relu(x @ x).sum().item()
    torch.ops.opdump.flush()
    keys = str(torch._C._dispatch_tls_local_include_set())
    print(json.dumps({"y": y, "stats": torch.ops.opdump.stats(), "key_on": "TESTING_ONLY_GenericMode" in keys}))
    """
    hook = run(script, OPDUMP="1", OPDUMP_HOOK_ONLY="1")
    assert hook.returncode == 0, hook.stderr
    dumping = run(script, OPDUMP="1")
    assert dumping.returncode == 0, dumping.stderr
    got, want = hook.result(), dumping.result()
    assert got["key_on"] and want["key_on"]
    assert got["y"] == want["y"]
    assert got["stats"] == [0, 0, 0] and want["stats"][0] > 0
    assert not hook.dump_dir.exists()
    assert hook.opdump_lines() == []
