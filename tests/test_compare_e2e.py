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


def test_reports_say_where_in_the_model(reference, tmp_path):
    """The module of the op named, the forward call of a backward one, and
    the parameter names, in the JSON, the text and the Parquet report."""
    faulty = dump(tmp_path, "gelu", FAULT="aten::gelu=1.01")
    code, report = compare(reference, faulty)
    first = report["first_introduced"]
    assert code == 1 and first["op"] == "aten::gelu", first
    assert first["module"] == "blocks.0" and first["module_b"] is None, first
    assert first["fwd_seq"] is None and first["source"] is None
    assert report["headline"]["module"] == "blocks.0"

    faulty = dump(tmp_path, "addmm", FAULT="aten::addmm=1.001")
    code, report = compare(reference, faulty)
    first = report["first_introduced"]
    assert first["op"] == "aten::addmm" and first["module"] == "blocks.0.qkv", first
    assert "blocks.0.qkv.bias" in first["names"], first
    named = {t["arg"]: t["name"] for t in first["tensors"]}
    assert named["self"] == "blocks.0.qkv.bias", named

    faulty = dump(tmp_path, "gelu_bwd", FAULT="aten::gelu_backward=1.01")
    code, report = compare(reference, faulty)
    first = report["first_introduced"]
    assert first["op"] == "aten::gelu_backward" and first["phase_a"] == "backward", first
    # The backward call belongs to the forward gelu of the last block (the
    # backward runs the blocks in reverse), and takes its module.
    assert first["fwd_op"] == "aten::gelu", first
    assert first["module"] == first["fwd_module"] == "blocks.1", first
    assert first["fwd_seq"] is not None and first["fwd_seq"] < first["seq_a"]
    assert first["fwd_seq_b"] is not None
    p = subprocess.run([str(CLI), "compare", str(reference), str(faulty), "--out", str(tmp_path / "rep")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 1, p.stderr
    text = p.stdout
    assert "  module  blocks.1\n" in text, text
    assert f"  backward of  aten::gelu (seq A {first['fwd_seq']}, seq B {first['fwd_seq_b']}) in blocks.1" in text, text
    verdict = next(l for l in text.splitlines() if l.startswith("Verdict:"))
    assert "aten::gelu_backward in blocks.1 (seq A" in verdict, verdict
    import pyarrow.parquet as pq

    rows = pq.read_table(tmp_path / "rep" / "compare.parquet").to_pandas()
    row = rows[(rows.seq_a == first["seq_a"]) & (rows.role == "output")].iloc[0]
    assert row.module_a == row.module_b == "blocks.1" and row.fwd_seq_a == first["fwd_seq"]
    assert {"name_a", "name_b"} <= set(rows.columns)
    assert "blocks.1.fc1.weight" in set(rows.name_a.dropna())


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
