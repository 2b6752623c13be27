"""The multi-rank demo (scripts/demo_ranks.py) end to end: a 4-rank gloo
job on the CPU run twice, the second time with a faulty optimizer kernel on
one rank. `opdump compare --rank all` must name that rank alone, and the
DuckDB ranks vote on the faulty run must name it as the odd rank out; the
rank is not the demo's default, so neither answer can be a constant."""

import json
import subprocess
import sys

import pyarrow.parquet as pq

from conftest import CLI, ROOT, clean_env

FAULT_RANK = 1


def test_compare_and_the_duckdb_vote_name_the_faulty_rank(tmp_path):
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "demo_ranks.py"), "--out", str(tmp_path),
                        "--fault-rank", str(FAULT_RANK), "--json"],
                       env=clean_env(), capture_output=True, text=True, timeout=600)
    assert p.returncode == 1, p.stderr
    got = json.loads(p.stdout)

    # The fault is where the demo says: only the faulty rank's dump calls the
    # replacement kernel's ops inside _foreach_add_ (read back from the files).
    def nested_in_update(rank):
        t = pq.read_table(tmp_path / "faulty" / f"rank={rank}", columns=["op", "depth", "phase"]).to_pylist()
        return any(r["phase"] == "optimizer" and r["depth"] > 0 and r["op"] == "aten::copy_" for r in t)

    assert [nested_in_update(r) for r in range(4)] == [r == FAULT_RANK for r in range(4)]

    c = got["compare"]
    assert got["compare_exit"] == 1 and c["format"] == "opdump-compare-fleet"
    assert [r["rank"] for r in c["ranks"]] == [0, 1, 2, 3]
    first = c["fleet"]["first_introduced"]
    assert first["rank"] == FAULT_RANK and first["ranks"] == [FAULT_RANK], first
    assert first["on_every_rank"] is False
    assert first["site"]["op"].startswith("aten::_foreach_add_") and first["site"]["step"] == 0, first
    row = next(r for r in c["ranks"] if r["rank"] == FAULT_RANK)
    assert row["verdict"] == "introduced", row

    v = got["vote"]
    assert v["findings"], v
    assert v["findings"][0]["kind"] == "odd" and v["findings"][0]["rank"] == FAULT_RANK, v["findings"][0]
    odd = {r["rank"]: r["odd"] for r in v["by_rank"]}
    assert odd[FAULT_RANK] > 0 and all(n == 0 for r, n in odd.items() if r != FAULT_RANK), odd

    # The vote's findings: the tensors `opdump ranks` lists, call by call
    # in its order; within one call (a foreach update differs in several
    # tensors) in the recipe's stated order, not the engine's whim.
    p = subprocess.run([str(CLI), "ranks", str(tmp_path / "faulty"), "--json"], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 1, p.stderr
    want = json.loads(p.stdout)["findings"]
    got = v["findings"]
    order = [(f["step"], f["reference_seq"], f["role"], f["list_index"], f["arg"], f["rank"]) for f in got]
    assert order == sorted(order)

    def calls(findings, seq):
        out = {}
        for f in findings:
            key = (f["step"], f["phase"], f["name"], f["role"], f["arg"],
                   -1 if f["list_index"] is None else f["list_index"])
            out.setdefault((f["step"], seq(f)), set()).add(key)
        return out

    want_calls = calls(want, lambda f: f["reference"]["seq"])
    got_calls = calls(got, lambda f: f["reference_seq"])
    assert list(got_calls)[:len(want_calls)] == list(want_calls)
    *whole, last = want_calls
    assert all(got_calls[c] == want_calls[c] for c in whole)
    assert want_calls[last] <= got_calls[last]  # the CLI lists the first 10
