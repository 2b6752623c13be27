"""The Python package against a failing tool and a stale wheel layout: every
failure of the ``opdump`` tool is an ``OpdumpError`` (a path that looks like
an option, an exit status that is no verdict, output that is no report, a
tool that cannot run), and a ``_lib`` left in a clone with no core for the
running torch gives way to the clone's own build."""

import shutil
import subprocess
import sys
import textwrap
import types

import pytest

from conftest import LIB, ROOT, TARGET, clean_env, read_dump

sys.path.insert(0, str(ROOT / "python"))
import opdump
from opdump import _cli, _native

JOB = """
torch.ops.opdump.enable()
x = torch.arange(16, dtype=torch.float32).reshape(4, 4)
y = (x @ x).relu()
torch.ops.opdump.flush()
print(json.dumps(float(y.sum())))
"""


@pytest.fixture
def dump(run):
    job = run(JOB)
    assert job.returncode == 0, job.stderr
    return job.dump_dir


def test_paths_that_look_like_options_stay_paths(dump, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("-a", "--steps"):
        shutil.copytree(dump, tmp_path / name)
    report = opdump.compare("-a", "--steps")
    assert report["exit_status"] == 0, report
    assert report["first_divergence"] is None
    summary = opdump.summary("--steps")
    assert isinstance(summary, dict) and summary, summary


def test_a_path_named_help_is_an_error_about_that_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "--help").mkdir()
    (tmp_path / "b").mkdir()
    with pytest.raises(opdump.OpdumpError) as e:
        opdump.compare("--help", "b")
    message = str(e.value)
    assert message.startswith("opdump:") and "--help" in message, message
    assert "\n" not in message and "Usage" not in message, message


def fake_tool(tmp_path, body):
    tool = tmp_path / "opdump"
    tool.write_text("#!/bin/sh\n" + textwrap.dedent(body))
    tool.chmod(0o755)
    return tool


@pytest.mark.parametrize("body, needle", [
    ("echo 'opdump summary: 3 ops'\n", "no JSON report"),   # text, not JSON
    ("echo '[1, 2]'\n", "no report"),                        # JSON, not a report
    ("echo '{}'\nexit 4\n", "status 4"),                    # a status that is no verdict
    ("kill -9 $$\n", "status -9"),                           # killed
    ("echo 'opdump: cannot read a: gone' >&2\nexit 2\n", "opdump: cannot read a: gone"),
])
def test_every_failure_of_the_tool_is_an_opdump_error(tmp_path, monkeypatch, body, needle):
    monkeypatch.setattr(_cli, "cli_path", lambda: fake_tool(tmp_path, body))
    with pytest.raises(opdump.OpdumpError) as e:
        opdump.compare(tmp_path / "a", tmp_path / "b")
    assert needle in str(e.value), str(e.value)


def test_a_tool_that_cannot_run_is_an_opdump_error(tmp_path, monkeypatch):
    broken = tmp_path / "opdump"
    broken.write_bytes(b"\x7fELF not really")
    broken.chmod(0o755)
    monkeypatch.setattr(_cli, "cli_path", lambda: broken)
    with pytest.raises(opdump.OpdumpError, match="cannot run"):
        opdump.summary(tmp_path)
    monkeypatch.setattr(_cli, "cli_path", lambda: None)
    with pytest.raises(opdump.OpdumpError, match="not installed"):
        opdump.summary(tmp_path)


def lib_dir(path, versions):
    """A directory laid out as a wheel's _lib (or, without versions, as a
    build): the entry point and one core per torch version."""
    path.mkdir(parents=True)
    (path / "libopdump.so").write_bytes(b"")
    for v in versions:
        (path / f"torch-{v}").mkdir()
        (path / f"torch-{v}" / "libopdump_core.so").write_bytes(b"")
    return path


@pytest.fixture
def torch_2_15(monkeypatch):
    """A process whose torch is 2.15.0 (with a local tag)."""
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(__version__="2.15.0+cu132"))


@pytest.mark.parametrize("bundled, build, chosen", [
    (["0.0.1"], True, "build"),          # a stale _lib: the build serves this torch
    (["2.11.0", "2.15.0"], True, "bundled"),
    (["0.0.1"], False, "bundled"),       # nothing fits: loading it says why
    ([], True, "bundled"),               # a _lib laid out as a build
])
def test_library_path_skips_a_lib_without_this_torch(tmp_path, monkeypatch, torch_2_15, bundled, build, chosen):
    dirs = {"bundled": lib_dir(tmp_path / "_lib", bundled)}
    dirs["build"] = lib_dir(tmp_path / "release", []) if build else tmp_path / "none"
    monkeypatch.setattr(_native, "_BUNDLED", dirs["bundled"])
    monkeypatch.setattr(_native, "_CLONE_BUILD", dirs["build"])
    assert opdump.library_path() == dirs[chosen] / "libopdump.so"


def test_a_clone_with_a_stale_lib_still_dumps(tmp_path):
    """The package in a clone where scripts/wheel.sh left a _lib for another
    torch: opdump.enable() loads the clone's build and records."""
    clone = tmp_path / "clone"
    package = clone / "python" / "opdump"
    shutil.copytree(ROOT / "python" / "opdump", package, ignore=shutil.ignore_patterns("_lib", "__pycache__"))
    stale = package / "_lib"
    (stale / "torch-0.0.1").mkdir(parents=True)
    shutil.copy(LIB, stale / "libopdump.so")
    (stale / "torch-0.0.1" / "libopdump_core.so").write_bytes(b"")
    (clone / "target").mkdir()
    (clone / "target" / "release").symlink_to(TARGET)
    code = textwrap.dedent(f"""
        import json, sys
        sys.path.insert(0, {str(clone / "python")!r})
        import torch, opdump
        on = opdump.enable()
        y = torch.ones(4) * 2
        opdump.flush()
        print(json.dumps([on, str(opdump.library_path())]))
    """)
    out = tmp_path / "dump"
    p = subprocess.run([sys.executable, "-c", code], env=clean_env(OPDUMP_DIR=out),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    import json

    on, lib = json.loads(p.stdout.strip().splitlines()[-1])
    assert on and lib == str(clone / "target" / "release" / "libopdump.so"), p.stderr
    assert "aten::mul" in set(read_dump(out).op), p.stderr
