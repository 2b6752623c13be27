"""A check that skipped work says so in its verdict (OPDUMP_CHECK): a
signature met and never checked, for the time budget or for a checking
queue that stayed full, is listed in the process's summary line and by
`opdump check`, which exits 3 when no check failed. With the default
OPDUMP_CHECK_WAIT, a call that finds the queue full waits for room instead,
so the same job has nothing skipped and exits 0."""

import json
import subprocess

from conftest import CLI
from conftest import tinylm as train_tinylm

# Copies waiting for the checking thread stay under 4 x this many bytes:
# TinyLM's largest call and the calls it is inside fit, a few calls
# together do not, so the job, faster than the checking thread, fills the
# queue.
SMALL_QUEUE = str(8 << 20)


def summary(dump):
    lines = [json.loads(l) for f in sorted(dump.glob("checks/rank=*/part-*.jsonl"))
             for l in f.read_text().splitlines()]
    s = [l for l in lines if l["kind"] == "summary"]
    assert len(s) == 1, s
    return s[0]


def check(dump, *args):
    return subprocess.run([str(CLI), "check", str(dump), *args], capture_output=True, text=True, timeout=120)


def job(dump, **env):
    p, losses, lines = train_tinylm("cpu", dump, 1, OPDUMP_CHECK="1", **env)
    assert p.returncode == 0 and losses, p.stderr[-3000:]
    return lines


def assert_listed(dump, s, why):
    unchecked = s["unchecked"]
    assert unchecked and all(u["why"] == why for u in unchecked), s
    assert len(unchecked) == s["skipped_budget"] + s["skipped_busy"], s
    p = check(dump)
    assert p.returncode == 3, (p.returncode, p.stdout, p.stderr)
    assert "signatures were never checked" in p.stdout, p.stdout
    for u in unchecked[:50]:
        assert u["signature"] in p.stdout, (u, p.stdout)
    r = json.loads(check(dump, "--json").stdout)
    assert r["exit_status"] == 3
    assert [(u["signature"], u["op"], u["why"]) for u in r["unchecked"]] == \
        [(u["signature"], u["op"], u["why"]) for u in unchecked]


def test_a_spent_budget_lists_the_signatures_never_checked_and_exits_3(tmp_path):
    d = tmp_path / "budget"
    lines = job(d, OPDUMP_CHECK_SECONDS="0.000001")
    s = summary(d)
    assert s["skipped_budget"] > 10 and s["checked"] <= 3, s
    assert_listed(d, s, "budget")
    assert any("OPDUMP_CHECK_SECONDS=" in l and "raise it" in l for l in lines), lines


def test_a_full_queue_skips_without_a_wait_and_waits_by_default(tmp_path):
    # Never waiting, calls that find the queue full go unchecked, and in one
    # step most signatures are not met again.
    d = tmp_path / "nowait"
    lines = job(d, OPDUMP_CHECK_MAX_BYTES=SMALL_QUEUE, OPDUMP_CHECK_WAIT="0")
    s = summary(d)
    assert s["skipped_busy"] > 0 and s["waits"] == 0, s
    assert_listed(d, s, "busy")
    assert any("was full at each call for OPDUMP_CHECK_WAIT=0 s" in l for l in lines), lines
    # The same job with the default wait: every signature is checked, and
    # the waits are counted and said.
    d = tmp_path / "wait"
    lines = job(d, OPDUMP_CHECK_MAX_BYTES=SMALL_QUEUE)
    s = summary(d)
    assert s["skipped_busy"] == 0 and s["unchecked"] == [], s
    assert s["waits"] > 0 and s["wait_seconds"] > 0, s
    said = [l for l in lines if "for room in the checking thread's queue" in l]
    assert len(said) == 1 and f"{s['waits']} calls waited" in said[0], lines
    p = check(d)
    assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
    assert "never checked" not in p.stdout, p.stdout
