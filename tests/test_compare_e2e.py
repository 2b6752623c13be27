"""opdump compare end to end: two real runs of a small transformer, one of
them with a faulty kernel, and the op it must name."""

import json
import subprocess
import sys

import pytest

from conftest import CLI, LIB, ROOT, clean_env

JOB = ROOT / "tests" / "jobs" / "faulty_cpu.py"


def dump(tmp_path, name, **env):
    out = tmp_path / name
    p = subprocess.run([sys.executable, str(JOB)], env=clean_env(OPDUMP=1, OPDUMP_DIR=out, LD_PRELOAD=LIB, **env),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return out


def compare(a, b, *extra):
    p = subprocess.run([str(CLI), "compare", str(a), str(b), "--json", *extra],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode in (0, 1, 3), p.stderr
    return p.returncode, json.loads(p.stdout)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    return dump(tmp_path_factory.mktemp("ref"), "ref")


def test_identical_runs_agree(reference, tmp_path):
    again = dump(tmp_path, "again")
    code, report = compare(reference, again)
    assert code == 0
    assert report["first_divergence"] is None and report["first_introduced"] is None


@pytest.mark.parametrize("fault", [
    "aten::gelu=2.0", "aten::gelu=1.01", "aten::gelu=1.001",
    "aten::_softmax=1.01", "aten::_softmax=1.001", "aten::addmm=1.001",
])
def test_planted_fault_is_named(reference, tmp_path, fault):
    faulty = dump(tmp_path, "faulty", FAULT=fault)
    code, report = compare(reference, faulty)
    assert code == 1
    first = report["first_introduced"]
    assert first is not None, report
    assert first["op"] == fault.split("=")[0], first
    assert first["verdict"] == "introduced"
    assert first["seq_a"] is not None and first["seq_b"] is not None


def test_bf16_autocast_against_fp32(reference, tmp_path):
    """Fault-free cross-precision: aligned despite the casts, no dtype-only
    divergence, and nothing introduced beyond what bf16 explains."""
    bf16 = dump(tmp_path, "bf16", AUTOCAST="bfloat16")
    code, report = compare(reference, bf16)
    assert report["first_introduced"] is None, report["first_introduced"]
    # Exit 1 means some aligned op's outputs diverged (crates/cli/README.md):
    # with nothing introduced and bf16 rounding within tolerance, none has.
    assert report["first_divergence"] is None, report["first_divergence"]
    assert code == 0


def test_different_models_are_refused(tmp_path):
    a = tmp_path / "a"
    p = subprocess.run([sys.executable, "-c", "import torch; x = torch.randn(3, 3); (x @ x).relu()"],
                       env=clean_env(OPDUMP=1, OPDUMP_DIR=a, LD_PRELOAD=LIB), capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    b = dump(tmp_path, "b")
    p = subprocess.run([str(CLI), "compare", str(a), str(b)], capture_output=True, text=True)
    assert p.returncode == 2, (p.returncode, p.stdout[-2000:])
    assert p.stderr.startswith("opdump:"), p.stderr
