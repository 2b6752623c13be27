"""Shared helpers: every test runs its PyTorch job in a fresh subprocess,
since opdump is process-wide state, and reads the dump back with pyarrow."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[1]
# scripts/test.sh points this at another target dir for the torch 2.11 run.
TARGET = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target")) / "release"
LIB = TARGET / "libopdump.so"
CORE = TARGET / "libopdump_core.so"
CLI = TARGET / "opdump"


def clean_env(**extra):
    """The environment of a job: no OPDUMP_* leaking in from the caller."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("OPDUMP") and k != "LD_PRELOAD"}
    env["PYTHONUNBUFFERED"] = "1"
    env["PYTHONPATH"] = str(ROOT)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def tinylm(device, dump, steps, **env):
    """Trains TinyLM (scripts/demo.py's worker) on `device` with opdump
    preloaded and on; returns the process, its losses (None when it failed)
    and its `opdump:` lines. One intra-op thread: with several, MKL may split
    a long reduction differently from one run to the next under load, and
    the losses would then differ in the last bit with or without opdump."""
    e = clean_env(**{"OPDUMP": "1", "OPDUMP_DIR": dump, "LD_PRELOAD": LIB, "OMP_NUM_THREADS": "1", **env})
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "demo.py"), "--worker", device, "--steps", str(steps)],
                       env=e, capture_output=True, text=True, timeout=600)
    lines = [l for l in p.stderr.splitlines() if l.startswith("opdump:")]
    losses = json.loads(p.stdout.strip().splitlines()[-1])["losses"] if p.returncode == 0 else None
    return p, losses, lines


class Job:
    """The outcome of one subprocess run."""

    def __init__(self, proc, dump_dir):
        self.proc = proc
        self.returncode = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.dump_dir = Path(dump_dir)

    def result(self):
        """The JSON the script printed on its last stdout line."""
        lines = [l for l in self.stdout.splitlines() if l.strip()]
        assert lines, f"no output; stderr:\n{self.stderr}"
        return json.loads(lines[-1])

    def opdump_lines(self):
        return [l for l in self.stderr.splitlines() if l.startswith("opdump:")]

    def table(self):
        return read_dump(self.dump_dir)


def read_dump(path):
    """All rows of a dump, sorted by seq, as a pandas DataFrame."""
    files = sorted(p for p in Path(path).rglob("*.parquet") if not p.name.startswith("."))
    assert files, f"no parquet files under {path}"
    tables = [pq.read_table(f) for f in files]
    import pyarrow as pa

    return pa.concat_tables(tables).to_pandas().sort_values(["seq", "role", "arg", "list_index"], kind="stable")


PRELUDE = """
import json, os, sys
import torch
if os.environ.get("TESTJOB_LOAD", "1") == "1":
    torch.ops.load_library(os.environ["TESTJOB_LIB"])
"""


@pytest.fixture
def run(tmp_path):
    """run(code, **env) runs `code` after loading opdump, in a subprocess,
    with OPDUMP_DIR in the test's temporary directory."""

    calls = []

    def _run(code, *, preload=False, load=True, testdev=False, timeout=300, cwd=None, **env):
        script = tmp_path / "job.py"
        body = textwrap.dedent(code)
        if testdev:  # the test device, loaded before opdump's records begin
            body = "import tests.testdev as testdev\ntestdev.load()\n" + body
        script.write_text((PRELUDE if not preload else "import json, os, sys\nimport torch\n") + body)
        # Each run its own dump unless told otherwise: dumps accumulate files.
        calls.append(1)
        dump = env.pop("OPDUMP_DIR", tmp_path / ("dump" if len(calls) == 1 else f"dump{len(calls)}"))
        e = clean_env(OPDUMP_DIR=dump, TESTJOB_LIB=LIB, TESTJOB_LOAD=int(load), **env)
        if preload:
            e["LD_PRELOAD"] = str(LIB)
        proc = subprocess.run(
            [sys.executable, str(script)], env=e, capture_output=True, text=True,
            timeout=timeout, cwd=cwd or tmp_path,
        )
        return Job(proc, dump)

    return _run


def ref_stats(t):
    """Statistics of a tensor computed independently, with torch's own
    reductions in float64 over the finite elements."""
    import torch

    x = t.detach().cpu()
    if x.is_complex():
        x = x.abs()
    x = x.to(torch.float64).flatten()
    finite = torch.isfinite(x)
    f = x[finite]
    out = {
        "nan_count": int(torch.isnan(x).sum()),
        "posinf_count": int(torch.isposinf(x).sum()),
        "neginf_count": int(torch.isneginf(x).sum()),
        "zero_count": int((x == 0).sum()),
        "l2": float(torch.linalg.vector_norm(f)) if f.numel() else 0.0,
    }
    if f.numel():
        out.update(
            min=float(f.min()), max=float(f.max()), mean=float(f.mean()),
            std=float(f.std(unbiased=False)), absmax=float(f.abs().max()),
        )
    else:
        out.update(min=None, max=None, mean=None, std=None, absmax=None)
    return out


def assert_stats_match(row, ref, rtol=1e-9, atol=1e-12, what=""):
    import math

    for k, v in ref.items():
        got = row[k]
        if v is None:
            assert got is None or (isinstance(got, float) and math.isnan(got)), f"{what} {k}: {got} vs None"
        else:
            assert got is not None and not (isinstance(got, float) and math.isnan(got)), f"{what} {k} is null"
            assert math.isclose(float(got), v, rel_tol=rtol, abs_tol=atol), f"{what} {k}: {got} vs {v}"


@pytest.fixture(params=["aten", "fused"])
def kernel(request):
    """How testdev computes opdump's statistics of its tensors: opdump's ATen
    reductions, staged or in pieces (what CUDA runs), or testdev's kernel for
    opdump::fused_stats (a backend with a fused reduction). The environment
    of the job."""
    return {"TESTDEV_FUSED_STATS": "1" if request.param == "fused" else "0"}


@pytest.fixture(scope="session", autouse=True)
def built():
    if not LIB.exists() or not CORE.exists():
        pytest.exit(f"{LIB} is not built: run scripts/setup.sh first", returncode=2)

# Statuses whose statistics hold measured values: computed now, reused from
# an earlier measurement of the unchanged tensor, or copied through a view.
MEASURED = ("computed", "reused", "view")
