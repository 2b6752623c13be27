"""compare with fingerprints and sketches, end to end: the demo's TinyLM on
cpu against testdev with faults that statistics cannot see (values moved to
other places, zero-mean noise of 1e-4), and without a fault."""

import json
import subprocess
import sys

import pytest

from conftest import CLI, ROOT

sys.path.insert(0, str(ROOT / "scripts"))
import demo

ON = {"OPDUMP_SKETCH": "16"}


def compare_json(a, b):
    p = subprocess.run([str(CLI), "compare", str(a), str(b), "--json"], capture_output=True, text=True, timeout=600)
    assert p.returncode in (0, 1, 3), p.stderr
    return p.returncode, json.loads(p.stdout)


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    dump, _ = demo.run_device("cpu", tmp_path_factory.mktemp("cpu"), 1, None, env_extra=ON)
    return dump


@pytest.mark.parametrize("fault, op", [
    ("aten::gelu=permute:7", "aten::gelu"),       # every statistic kept
    ("aten::addmm=noise:1e-4", "aten::addmm"),    # the l2 norm moves by ~1e-8
])
def test_fault_invisible_to_statistics_is_named(cpu_run, tmp_path, fault, op):
    dev, _ = demo.run_device("testdev", tmp_path, 1, fault, env_extra=ON)
    code, report = compare_json(cpu_run, dev)
    first = report["first_introduced"]
    assert code == 1 and first is not None, report.get("headline")
    assert first["op"] == op, first


def test_fault_free_devices_agree(cpu_run, tmp_path):
    dev, _ = demo.run_device("testdev", tmp_path, 1, None, env_extra=ON)
    code, report = compare_json(cpu_run, dev)
    assert code != 1 and report["first_introduced"] is None, report["first_introduced"]


def test_statistics_alone_blame_the_consumer(cpu_run, tmp_path):
    """Without sketches (OPDUMP_SKETCH=0, the default, on both sides) the permutation is
    seen only at its first consumer: what the sketch fixes."""
    off = {"OPDUMP_SKETCH": "0"}
    a, _ = demo.run_device("cpu", tmp_path / "a", 1, None, env_extra=off)
    b, _ = demo.run_device("testdev", tmp_path / "b", 1, "aten::gelu=permute:7", env_extra=off)
    code, report = compare_json(a, b)
    assert code == 1 and report["first_introduced"]["op"] == "aten::addmm"
