"""The SQL recipes of sql/ against the CLI on the same dumps: the per-op and
per-module summary and the NaN/Inf origins against `opdump summary --json`,
the ranks vote against `opdump ranks --json`, and the compare recipe's first
introduced call against `opdump compare --json`.

The recipes run through their runner's command line, as a user runs them:
DuckDB by default; OPDUMP_SQL_ENGINE=spark runs sql/run_spark.py instead,
with the Python of OPDUMP_SPARK_PYTHON (one that has pyspark), so that the
same assertions check Spark SQL."""

import json
import os
import subprocess
import sys

import pytest

from conftest import CLI, LIB, ROOT, clean_env

ENGINE = os.environ.get("OPDUMP_SQL_ENGINE", "duckdb")
RUNNER = ROOT / "sql" / f"run_{ENGINE}.py"
RUNNER_PYTHON = os.environ.get("OPDUMP_SPARK_PYTHON", sys.executable) if ENGINE == "spark" else sys.executable

# A TinyLM step whose output module adds log(-1) from step 1 on: the first
# NaN from finite inputs is that aten::log in `Poison`, while the first Inf
# from finite inputs is the attention mask's -inf (a masked_fill_ inside
# masked_fill, so the origin is the inner call).
NAN_JOB = """
import os, sys, torch
from torch import nn
sys.path.insert(0, os.path.join(os.environ["ROOT"], "scripts"))
import tinylm
torch.ops.load_library(os.environ["LIB"])

class Poison(nn.Module):
    def __init__(self):
        super().__init__()
        self.on = False

    def forward(self, x):
        return x + torch.log(-torch.ones_like(x[..., :1])) if self.on else x

model = tinylm.make(vocab=64, d=32, layers=1, heads=2, seq=8)
poison = Poison()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
g = torch.Generator().manual_seed(1)
torch.ops.opdump.enable()
for step in range(2):
    idx = torch.randint(0, 64, (2, 8), generator=g)
    poison.on = step == 1
    loss = nn.functional.cross_entropy(poison(model(idx)).flatten(0, 1), idx.flatten())
    opt.zero_grad()
    loss.backward()
    opt.step()
torch.ops.opdump.flush()
"""

FLIP_RANK, FLIP_STEP = 2, 1


def job(args, dump, **env):
    p = subprocess.run([sys.executable, *map(str, args)], env=clean_env(OPDUMP_DIR=dump, OPDUMP_SKETCH=16, **env),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    return dump


@pytest.fixture(scope="module")
def nan_dump(tmp_path_factory):
    d = tmp_path_factory.mktemp("nan")
    (d / "job.py").write_text(NAN_JOB)
    return job([d / "job.py"], d / "dump", ROOT=ROOT, LIB=LIB)


@pytest.fixture(scope="module")
def ddp_dump(tmp_path_factory):
    """tests/jobs/ddp_cpu.py, 4 ranks, one gradient bit flipped on one rank."""
    d = tmp_path_factory.mktemp("ddp")
    return job([ROOT / "tests" / "jobs" / "ddp_cpu.py", LIB, f"file://{d}/init"], d / "dump",
               FLIP=f"{FLIP_RANK}:{FLIP_STEP}")


def faulty_cpu(d, name, **env):
    return job([ROOT / "tests" / "jobs" / "faulty_cpu.py"], d / name, OPDUMP=1, LD_PRELOAD=LIB, **env)


@pytest.fixture(scope="module")
def gelu_pair(tmp_path_factory):
    """A reference TinyLM step and one whose gelu kernel is 1% off."""
    d = tmp_path_factory.mktemp("gelu")
    return faulty_cpu(d, "ref"), faulty_cpu(d, "gelu", FAULT="aten::gelu=1.01")


def recipe(name, *dumps):
    p = subprocess.run([RUNNER_PYTHON, str(RUNNER), name, *map(str, dumps), "--json"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def cli(*args, codes=(0,)):
    p = subprocess.run([str(CLI), *map(str, args), "--json"], capture_output=True, text=True, timeout=300)
    assert p.returncode in codes, p.stderr
    return json.loads(p.stdout)


def full_name(op, overload):
    return op if overload in ("", "default") else f"{op}.{overload}"


def check_summary(dump):
    """Every per-op, per-module, per-phase and per-step number of the
    summary recipe against `opdump summary`, rank by rank."""
    want = cli("summary", dump)
    got = recipe("summary", dump)
    assert sorted({r["rank"] for r in got["per_op"]}) == [s["dump"]["rank"] for s in want["ranks"]]
    for s in want["ranks"]:
        rank = s["dump"]["rank"]
        per_op = {(r["op"], r["overload"]): r for r in got["per_op"] if r["rank"] == rank}
        assert {k: r["calls"] for k, r in per_op.items()} == {(o["op"], o["overload"]): o["calls"] for o in s["per_op"]}
        nonfinite = {(o["op"], o["overload"]): o for o in s["nonfinite_ops"]}
        for key, r in per_op.items():
            o = nonfinite.get(key, {"calls_nan_out": 0, "calls_inf_out": 0, "calls_nonfinite_in": 0, "first_seq": None})
            assert (r["calls_nan_out"], r["calls_inf_out"], r["calls_nonfinite_in"], r["first_nonfinite_seq"]) == (
                o["calls_nan_out"], o["calls_inf_out"], o["calls_nonfinite_in"], o["first_seq"]), key

        modules = [r for r in got["per_module"] if r["rank"] == rank]
        fields = ["module", "calls", "first_seq", "calls_nan_out", "calls_inf_out", "first_nonfinite_seq",
                  "first_nonfinite_op", "first_nonfinite_phase"]
        assert [[r[f] for f in fields] for r in modules if r["module"] is not None] == \
            [[m[f] for f in fields] for m in s["per_module"]]
        outside = [r["calls"] for r in modules if r["module"] is None]
        assert outside == ([s["calls_outside_modules"]] if s["per_module"] else outside)

        steps = [r for r in got["per_step"] if r["rank"] == rank]
        by_phase, by_step = {}, {}
        for r in steps:
            by_phase[r["phase"]] = by_phase.get(r["phase"], 0) + r["calls"]
            by_step[str(r["step"])] = by_step.get(str(r["step"]), 0) + r["calls"]
        assert by_phase == s["per_phase"] and by_step == s["per_step"]
        assert sum(r["calls_raised"] for r in steps) == s["ops_raised"]
    return want


def check_origins(dump, summary):
    """The origins recipe names the call `opdump summary` names, per rank
    and kind (or none where it has none)."""
    got = {(r["rank"], r["kind"]): r for r in recipe("nonfinite_origins", dump)["origins"]}
    for s in summary["ranks"]:
        for kind, field in [("nan_from_finite", "first_nan_from_finite"),
                            ("nonfinite_from_finite", "first_nonfinite_from_finite")]:
            want, r = s[field], got.pop((s["dump"]["rank"], kind), None)
            if want is None:
                assert r is None, r
                continue
            assert r is not None, (kind, want)
            keys = ["seq", "op", "overload", "step", "phase", "depth", "module", "parent_seq"]
            assert {k: r[k] for k in keys} == {k: want[k] for k in keys}, kind
    assert not got, got


def test_summary_and_origins_of_a_dump_with_nan(nan_dump):
    summary = check_summary(nan_dump)
    s = summary["ranks"][0]
    # The dump has what the comparison is about: NaN from a finite call in
    # a module, and an Inf origin nested in its parent call.
    assert s["first_nan_from_finite"]["op"] == "aten::log" and s["first_nan_from_finite"]["module"] == "Poison"
    assert s["first_nonfinite_from_finite"]["depth"] > 0
    check_origins(nan_dump, summary)


def test_summary_of_every_rank_of_a_ddp_dump(ddp_dump):
    summary = check_summary(ddp_dump)
    assert len(summary["ranks"]) == 4
    check_origins(ddp_dump, summary)


def hex_fp(v):
    return None if v is None else f"0x{int(v):016x}"


def test_ranks_vote_names_the_rank_opdump_ranks_names(ddp_dump):
    want = cli("ranks", ddp_dump, codes=(1,))
    got = recipe("ranks_vote", ddp_dump)

    counts = {r["verdict"]: r["tensors"] for r in got["counts"]}
    t = want["tensors"]
    assert {k: counts.get(k, 0) for k in ("agree", "odd", "split", "not_judged", "one_rank")} == \
        {k: t[k] for k in ("agree", "odd", "split", "not_judged", "one_rank")}
    assert sum(counts.get(k, 0) for k in ("agree", "odd", "split", "not_judged")) == t["compared"]

    # One finding row per rank outside the majority; the CLI lists each
    # finding once, with its odd ranks.
    findings = {}
    for r in got["findings"]:
        key = (r["kind"], r["step"], r["phase"], r["op"], r["overload"], r["name"], r["role"], r["arg"],
               r["list_index"], r["occurrence"])
        findings.setdefault(key, []).append(r)
    listed = [(f["kind"], f["step"], f["phase"], f["op"], f["overload"], f["name"], f["role"], f["arg"],
               -1 if f["list_index"] is None else f["list_index"], f["occurrence"]) for f in want["findings"]]
    assert list(findings)[:len(listed)] == listed
    first = findings[listed[0]]
    w = want["first"]
    assert [r["rank"] for r in first] == w["odd_ranks"] == [FLIP_RANK]
    assert [(r["seq"], hex_fp(r["fingerprint"])) for r in first] == [(o["seq"], o["fingerprint"]) for o in w["others"]]
    assert hex_fp(first[0]["majority_fingerprint"]) == w["majority_fingerprint"]
    assert first[0]["majority_ranks"] == len(w["majority_ranks"])
    assert (first[0]["reference_rank"], first[0]["reference_seq"]) == (w["reference"]["rank"], w["reference"]["seq"])

    assert [(r["rank"], r["odd"], r["first_step"]) for r in got["by_rank"]] == \
        [(b["rank"], b["odd"], b["first_step"]) for b in want["by_rank"]]


def test_compare_recipe_names_the_faulty_kernel_compare_names(gelu_pair):
    ref, gelu = gelu_pair
    want = cli("compare", ref, gelu, codes=(1,))["first_introduced"]
    got = recipe("compare", ref, gelu)
    first = got["first_introduced"]
    assert len(first) == 1, first  # one rank
    r = first[0]
    assert (r["op"], r["overload"], r["module"], r["seq_a"], r["seq_b"], r["step"], r["phase"]) == (
        want["op"], want["overload"], want["module"], want["seq_a"], want["seq_b"], want["step_a"], want["phase_a"])
    assert 0.005 < r["err_out"] < 0.02  # a 1% fault
    per_op = {(p["op"], p["overload"]): p for p in got["per_op"]}
    gelu_row = per_op[("aten::gelu", "default")]
    # Two blocks: the first gelu introduces, the second inherits.
    assert (gelu_row["paired"], gelu_row["differing"], gelu_row["introduced"]) == (2, 2, 1)
    assert sum(p["introduced"] for p in got["per_op"]) == 1


def test_compare_recipe_finds_nothing_between_identical_runs(gelu_pair):
    ref, _ = gelu_pair
    again = faulty_cpu(ref.parent, "again")
    assert cli("compare", ref, again)["first_introduced"] is None
    got = recipe("compare", ref, again)
    assert got["first_introduced"] == []
    assert sum(p["differing"] for p in got["per_op"]) == 0
    assert all(p["only_a"] == p["only_b"] == 0 for p in got["per_op"])
    assert sum(p["paired"] for p in got["per_op"]) > 1000


def test_compare_recipe_tolerance_passes_over_a_fault_below_it(gelu_pair):
    """--param tol reaches the recipe: a 1% fault is within 5%."""
    ref, gelu = gelu_pair
    p = subprocess.run([RUNNER_PYTHON, str(RUNNER), "compare", str(ref), str(gelu), "--json", "--param", "tol=0.05"],
                       capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout)
    assert got["first_introduced"] == [] and sum(r["differing"] for r in got["per_op"]) == 0
    strict = recipe("compare", ref, gelu)
    assert sum(r["differing"] for r in strict["per_op"]) > 0
