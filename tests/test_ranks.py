"""opdump ranks end to end: a 4-rank gloo DDP job on the CPU, fault-free and
with one bit of one gradient flipped on rank 2 after the all-reduce."""

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from conftest import CLI, LIB, ROOT, clean_env

JOB = ROOT / "tests" / "jobs" / "ddp_cpu.py"
FLIP_RANK, FLIP_STEP = 2, 1


def ddp_dump(tmp_path, name, **env):
    out = tmp_path / name
    p = subprocess.run([sys.executable, str(JOB), str(LIB), f"file://{tmp_path}/init-{name}"],
                       env=clean_env(OPDUMP_DIR=out, OPDUMP_SKETCH=16, **env),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    assert sorted(x.name for x in out.iterdir()) == [f"rank={r}" for r in range(4)]
    return out, json.loads(p.stdout.strip().splitlines()[-1])


def ranks(dump):
    p = subprocess.run([str(CLI), "ranks", str(dump), "--json"], capture_output=True, text=True, timeout=120)
    assert "panicked" not in p.stderr, p.stderr
    return p


def has_fingerprints(dump):
    """Whether the plugin wrote fingerprints (older builds leave the column
    out, or null)."""
    for f in dump.rglob("part-*.parquet"):
        t = pq.read_table(f)
        if "fingerprint" in t.column_names and t.column("fingerprint").null_count < t.num_rows:
            return True
    return False


def require_fingerprints(dump):
    """Without fingerprints `opdump ranks` can only say so, on one line."""
    if has_fingerprints(dump):
        return
    p = ranks(dump)
    assert p.returncode == 2, (p.returncode, p.stdout)
    assert p.stdout == "" and p.stderr.count("\n") == 1, p.stderr
    assert "no fingerprint" in p.stderr, p.stderr
    pytest.skip("the plugin writes no fingerprints: opdump ranks says so (exit 2)")


def test_ranks_of_a_fault_free_ddp_job_agree(tmp_path):
    dump, _ = ddp_dump(tmp_path, "clean")
    require_fingerprints(dump)
    p = ranks(dump)
    assert p.returncode == 0, (p.stdout, p.stderr)
    report = json.loads(p.stdout)
    assert report["ranks"] == [0, 1, 2, 3]
    assert report["first"] is None
    assert report["tensors"]["compared"] > 0 and report["tensors"]["odd"] == 0


def test_a_flipped_gradient_bit_names_its_rank_and_parameter(tmp_path):
    dump, job = ddp_dump(tmp_path, "flip", FLIP=f"{FLIP_RANK}:{FLIP_STEP}")
    require_fingerprints(dump)
    p = ranks(dump)
    assert p.returncode == 1, (p.stdout, p.stderr)
    report = json.loads(p.stdout)
    first = report["first"]
    assert first["kind"] == "odd", first
    assert first["odd_ranks"] == [FLIP_RANK], first
    assert first["majority_ranks"] == [r for r in range(4) if r != FLIP_RANK]
    assert first["step"] == FLIP_STEP and first["phase"] == "optimizer", first
    assert first["name"] == job["flipped"] + ".grad", first
    assert [b["rank"] for b in report["by_rank"]] == [FLIP_RANK]
    text = subprocess.run([str(CLI), "ranks", str(dump)], capture_output=True, text=True, timeout=120)
    assert text.returncode == 1
    assert f"RANK {FLIP_RANK} DIFFERS" in text.stdout, text.stdout
