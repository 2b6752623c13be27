"""`opdump check DUMP` and `opdump repro --check FILE`: the CLI half of the
in-job accuracy check (crates/cli/src/checks.rs, commands/check.rs,
commands/repro_check.rs, report/check/).

The dumps are synthetic: `checks/rank=<R>/part-<pid>.jsonl` files in the
form the plugin writes, so every verdict, ratio and count below is known
beforehand. The repro tests put a real capture file (made by a job with
OPDUMP_CAPTURE) under checks/rank=0/ with a row naming it, run the command
`opdump check` prints, and run the repro.py it writes."""

import json
import shlex
import shutil
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from conftest import CLI, clean_env

FIELDS = ["signature", "op", "overload", "args", "module", "phase", "step", "seq", "rank", "device", "dtype",
          "device_err", "cpu_err", "ratio", "device_ulp", "cpu_ulp", "reduction_len", "verdict", "reason",
          "capture"]


def row(sig="aten::mm.default(float32[64, 32], float32[32, 16])", op="aten::mm", verdict="pass", ratio=1.0,
        rank=0, capture=None, **kw):
    r = {"kind": "check", "signature": sig, "op": op, "overload": "default", "args": "", "module": "blocks.0.mlp",
         "phase": "forward", "step": 0, "seq": 7, "rank": rank, "device": "testdev:0", "dtype": "float32",
         "device_err": None if ratio is None else ratio * 6e-8, "cpu_err": 6e-8, "ratio": ratio,
         "device_ulp": None, "cpu_ulp": None, "reduction_len": None, "verdict": verdict, "reason": None,
         "capture": capture}
    r.update(kw)
    return r


def summary(rank=0, pid=4242, rows=(), **kw):
    # As the plugin counts: checked is pass and fail, not no_reference.
    s = {"kind": "summary", "rank": rank, "pid": pid, "checked": sum(r["verdict"] != "no_reference" for r in rows),
         "passed": sum(r["verdict"] == "pass" for r in rows), "failed": sum(r["verdict"] == "fail" for r in rows),
         "no_reference": sum(r["verdict"] == "no_reference" for r in rows),
         "signatures": len({r["signature"] for r in rows}), "skipped_bytes": 0, "skipped_budget": 0,
         "skipped_busy": 0}
    s.update(kw)
    return s


def write_part(dump, rank, pid, rows, summary_line=True, **skipped):
    d = Path(dump) / "checks" / f"rank={rank}"
    d.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r) for r in rows]
    if summary_line:
        lines.append(json.dumps(summary(rank, pid, rows, **skipped)))
    path = d / f"part-{pid}.jsonl"
    path.write_text("".join(l + "\n" for l in lines))
    return path


def check(dump, *args, cwd=None):
    p = subprocess.run([str(CLI), "check", str(dump), *args], capture_output=True, text=True, timeout=60, cwd=cwd)
    return p


# Three failing signatures (one failing twice), passes and no references,
# with ratios in an order the report must not keep.
MM = "aten::mm.default(float32[64, 32], float32[32, 16])"
GELU = "aten::gelu.default(float32[8, 16])"
SUM = "aten::sum.dim_IntList(float32[8, 1024], [1], False)"
ROWS0 = [
    row(MM, "aten::mm", "fail", 40.0, seq=3, reduction_len=32),
    row(GELU, "aten::gelu", "fail", 2.5e4, seq=5, module="blocks.1.act", device_ulp=812.5, cpu_ulp=0.5,
        device_vs_cpu=1.5e-3, capture="checks/rank=0/capture-4242-0.safetensors"),
    row("aten::add.Tensor(float32[8], float32[8])", "aten::add", "pass", 1.0, seq=6),
    # The plugin may write a count as a float.
    row(SUM, "aten::sum", "fail", 900.0, seq=9, phase="backward", step=1, reduction_len=1024.0,
        capture="checks/rank=0/capture-4242-1.safetensors"),
    row("aten::bernoulli_.float(float32[8])", "aten::bernoulli_", "no_reference", None, seq=10,
        reason="random op", device_err=None, cpu_err=None),
    row("aten::dropout.default(float32[4])", "aten::dropout", "no_reference", None, seq=11,
        reason="random op", device_err=None, cpu_err=None),
    row("aten::_foo.default(float32[4])", "aten::_foo", "no_reference", None, seq=12,
        reason="no CPU kernel", device_err=None, cpu_err=None),
]
ROWS1 = [
    row(MM, "aten::mm", "fail", 60.0, rank=1, seq=3, reduction_len=32),
    row("aten::add.Tensor(float32[8], float32[8])", "aten::add", "pass", 2.0, rank=1, seq=6),
]


# The signatures rank 0's summary counts as never checked, as it lists them.
UNCHECKED0 = [
    {"signature": "aten::bmm.default(float32[64, 32, 32], float32[64, 32, 8])", "op": "aten::bmm",
     "overload": "default", "why": "budget"},
    {"signature": "aten::exp.default(float32[8])", "op": "aten::exp", "overload": "default", "why": "busy"},
    {"signature": "aten::tanh.default(float32[8])", "op": "aten::tanh", "overload": "default", "why": "busy"},
]


@pytest.fixture
def dump(tmp_path):
    d = tmp_path / "dump"
    write_part(d, 0, 4242, ROWS0, skipped_bytes=3, skipped_budget=1, skipped_busy=2, unchecked=UNCHECKED0)
    # The plugin's summary may hold more fields than opdump check reads.
    write_part(d, 1, 4343, ROWS1, unfinished=0, write_failures=0, seconds=0.25)
    return d


def test_failing_signatures_worst_first_exit_1(dump):
    p = check(dump)
    assert p.returncode == 1, p.stderr
    out = p.stdout
    blocks = [l for l in out.splitlines() if l[:1].isdigit() and ". " in l]
    # By ratio: gelu 2.5e4, sum 900, mm 60 (its worse call, on rank 1).
    assert blocks == [f"1. {GELU}", f"2. {SUM}", f"3. {MM}"], out
    gelu = out[out.index(f"1. {GELU}"):out.index(f"2. {SUM}")]
    assert "module blocks.1.act" in gelu and "phase forward" in gelu and "step 0" in gelu and "seq 5" in gelu
    assert "device 0.0015, CPU in float32 6.000e-8; ratio 25000 (fails above 10)" in gelu, gelu
    assert "ULP device 812.5, CPU 0.5; device vs CPU in float32 0.0015" in gelu
    assert f"reproduce: opdump repro --check {dump}/checks/rank=0/capture-4242-0.safetensors" in gelu
    s = out[out.index(f"2. {SUM}"):out.index(f"3. {MM}")]
    assert "phase backward" in s and "step 1" in s and "reduction length 1,024" in s
    mm = out[out.index(f"3. {MM}"):]
    assert "rank 1" in mm and "failed in 2 calls (ranks 0-1)" in mm and "no capture file" in mm
    count = next(l for l in out.splitlines() if l.startswith("checked "))
    assert count.startswith("checked 6 calls: 2 passed, 4 failed (3 signatures); 3 no_reference "
                            "(random op: 2; no CPU kernel: 1)"), count
    assert "skipped 6: 3 over OPDUMP_CHECK_MAX_BYTES, 1 past the time budget, 2 while the checker was busy" in count
    # Listed after the failures, each with its op and why.
    assert "never checked: 3 signatures" in out
    for u in UNCHECKED0:
        line = next(l for l in out.splitlines() if u["signature"] in l)
        assert u["op"] in line and ("OPDUMP_CHECK_SECONDS" if u["why"] == "budget" else "queue was full") in line
    assert p.stderr == ""


def test_no_failure_exits_0(tmp_path):
    d = tmp_path / "ok"
    write_part(d, 0, 1, [row(verdict="pass", ratio=1.5), row(GELU, "aten::gelu", "no_reference", None,
                                                            reason="over the byte cap")])
    p = check(d)
    assert p.returncode == 0, p.stderr
    assert "no check failed" in p.stdout
    assert "checked 1 calls: 1 passed, 0 failed; 1 no_reference (over the byte cap: 1)" in p.stdout


def test_a_killed_process_is_reported_not_failed(tmp_path):
    d = tmp_path / "killed"
    path = write_part(d, 0, 77, [row(verdict="pass"), row(GELU, "aten::gelu", "fail", 99.0)], summary_line=False)
    # Killed while writing its next line: cut short, no newline.
    path.write_text(path.read_text() + json.dumps(row(SUM, "aten::sum", "pass"))[:50])
    p = check(d, "--json")
    assert p.returncode == 1, p.stderr
    r = json.loads(p.stdout)
    assert r["counts"]["checked"] == 2 and r["counts"]["failed"] == 1
    assert r["processes"] == [{"rank": 0, "file": str(path), "pid": 77, "finished": False, "checked": 2}]
    assert any("no summary line" in n for n in r["notes"]) and any("cut short" in n for n in r["notes"])


def one_opdump_line(p):
    assert p.returncode == 2, (p.returncode, p.stdout, p.stderr)
    assert p.stdout == ""
    lines = p.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("opdump: "), p.stderr
    return lines[0]


def test_a_missing_dump_exits_2(tmp_path):
    line = one_opdump_line(check(tmp_path / "nowhere"))
    assert str(tmp_path / "nowhere") in line and "No such file" in line
    assert "pass the dump directory (OPDUMP_DIR of the job)" in line
    (tmp_path / "file").write_text("x")
    line = one_opdump_line(check(tmp_path / "file"))
    assert "not a directory; pass the dump directory" in line


def test_a_dump_without_check_results_exits_2(tmp_path):
    d = tmp_path / "plain"
    (d / "rank=0").mkdir(parents=True)
    line = one_opdump_line(check(d))
    assert "no check results" in line and "run the job with OPDUMP_CHECK=1" in line
    # An empty checks/ directory is no different.
    (d / "checks" / "rank=0").mkdir(parents=True)
    assert "no check results" in one_opdump_line(check(d))
    # A rank directory opdump did not write.
    (d / "checks" / "rank=x").mkdir()
    line = one_opdump_line(check(d))
    assert "rank=x" in line and "must be a decimal number" in line


@pytest.mark.parametrize("mutation", ["not_json", "field_gone", "wrong_type", "bad_verdict", "summary_field_gone"])
def test_a_mutated_file_exits_2_naming_file_and_line(dump, mutation):
    path = dump / "checks" / "rank=0" / "part-4242.jsonl"
    lines = path.read_text().splitlines()
    target = 2  # the third line (1-based: 3)
    if mutation == "not_json":
        lines[target] = lines[target][:-5]
    elif mutation == "field_gone":
        r = json.loads(lines[target])
        del r["ratio"]
        lines[target] = json.dumps(r)
    elif mutation == "wrong_type":
        r = json.loads(lines[target])
        r["seq"] = "six"
        lines[target] = json.dumps(r)
    elif mutation == "bad_verdict":
        r = json.loads(lines[target])
        r["verdict"] = "fine"
        lines[target] = json.dumps(r)
    else:
        target = len(lines) - 1
        r = json.loads(lines[target])
        del r["skipped_busy"]
        lines[target] = json.dumps(r)
    path.write_text("\n".join(lines) + "\n")
    line = one_opdump_line(check(dump))
    assert f"{path}:{target + 1}: " in line, line
    assert "not a line opdump wrote" in line and "run the job again with OPDUMP_CHECK=1" in line
    if mutation == "field_gone":
        assert "lacks ratio" in line
    if mutation == "summary_field_gone":
        assert "lacks skipped_busy" in line


def test_json_fields(dump):
    p = check(dump, "--json")
    assert p.returncode == 1, p.stderr
    r = json.loads(p.stdout)
    assert r["format"] == "opdump-check" and r["version"] == 2 and r["path"] == str(dump)
    assert r["ranks"] == [0, 1] and r["exit_status"] == 1
    assert r["counts"] == {"checked": 6, "passed": 2, "failed": 4, "no_reference": 3, "failed_signatures": 3}
    assert r["skipped"] == {"bytes": 3, "budget": 1, "busy": 2}
    # A failure comes first (exit status 1); the signatures never checked are listed all the same.
    assert r["unchecked"] == [dict(u, ranks=[0]) for u in UNCHECKED0]
    assert r["no_reference_reasons"] == [{"reason": "random op", "count": 2}, {"reason": "no CPU kernel", "count": 1}]
    f = r["failures"]
    assert [x["signature"] for x in f] == [GELU, SUM, MM]
    assert [x["ratio"] for x in f] == [2.5e4, 900.0, 60.0]
    g = f[0]
    src = ROWS0[1]
    for k in FIELDS:
        if k != "verdict":  # every failure's
            assert g[k] == src[k], k
    assert g["repro"] == f"opdump repro --check {dump}/checks/rank=0/capture-4242-0.safetensors"
    assert g["calls_failed"] == 1 and g["ranks_failed"] == [0]
    mm = f[2]
    assert mm["rank"] == 1 and mm["calls_failed"] == 2 and mm["ranks_failed"] == [0, 1] and mm["repro"] is None
    assert [(x["rank"], x["pid"], x["finished"], x["checked"]) for x in r["processes"]] == \
        [(0, 4242, True, 4), (1, 4343, True, 2)]
    # The summary lines agree with the files; the synthetic dump has no
    # capture files, which is said.
    assert sorted(r["notes"]) == sorted(f"{dump}/{c}: the capture file of {s} is missing" for c, s in
                                        [(ROWS0[1]["capture"], GELU), (ROWS0[3]["capture"], SUM)])


class Tables(HTMLParser):
    """The rows of each table with an id, as lists of cell texts."""

    def __init__(self):
        super().__init__()
        self.tables, self.current, self.row, self.cell, self.tags = {}, None, None, None, set()

    def handle_starttag(self, tag, attrs):
        self.tags.add(tag)
        attrs = dict(attrs)
        for k in ("href", "src"):
            assert k not in attrs, (tag, attrs)  # self-contained
        if tag == "table":
            self.current = attrs.get("id")
            self.tables[self.current] = []
        elif tag == "tr":
            self.row = []
        elif tag in ("td", "th"):
            self.cell = ""

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self.row is not None:
            self.row.append(self.cell)
            self.cell = None
        elif tag == "tr":
            self.tables[self.current].append(self.row)
            self.row = None

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def test_html_report_holds_the_failing_rows(dump, tmp_path):
    page = tmp_path / "check.html"
    p = check(dump, "--html", str(page))
    assert p.returncode == 1, p.stderr
    text = page.read_text()
    t = Tables()
    t.feed(text)
    assert "script" not in t.tags and "http" not in text
    header, *rows = t.tables["failures"]
    col = {h: i for i, h in enumerate(header)}
    assert [r[col["signature"]] for r in rows] == [GELU, SUM, MM]
    assert [r[col["module"]] for r in rows] == ["blocks.1.act", "blocks.0.mlp", "blocks.0.mlp"]
    assert [float(r[col["ratio"]]) for r in rows] == [2.5e4, 900.0, 60.0]
    assert rows[0][col["reproduce"]] == f"opdump repro --check {dump}/checks/rank=0/capture-4242-0.safetensors"
    assert float(rows[0][col["device error"]]) == pytest.approx(2.5e4 * 6e-8, rel=1e-3)
    nr = {r[0]: r[1] for r in t.tables["no_reference"][1:]}
    assert nr == {"random op": "2", "no CPU kernel": "1"}
    assert t.tables["counts"][1][:4] == ["6", "2", "4", "3"]
    assert [r[0] for r in t.tables["unchecked"][1:]] == [u["signature"] for u in UNCHECKED0]
    # A signature with markup is shown, not run.
    hostile = tmp_path / "hostile"
    write_part(hostile, 0, 1, [row("<script>alert(1)</script>", "aten::mm", "fail", 50.0)])
    page2 = tmp_path / "h.html"
    assert check(hostile, "--html", str(page2)).returncode == 1
    t2 = Tables()
    t2.feed(page2.read_text())
    assert "script" not in t2.tags and t2.tables["failures"][1][1] == "<script>alert(1)</script>"


def test_rank(dump):
    p = check(dump, "--rank", "1", "--json")
    assert p.returncode == 1, p.stderr
    r = json.loads(p.stdout)
    assert r["ranks"] == [1] and [f["signature"] for f in r["failures"]] == [MM]
    assert r["failures"][0]["calls_failed"] == 1 and r["counts"]["checked"] == 2
    p = check(dump, "--rank", "all", "--json")
    assert json.loads(p.stdout)["ranks"] == [0, 1]
    # Rank 1 alone, with its failure made a pass: exit 0.
    write_part(dump, 1, 4343, [row(rank=1)])
    assert check(dump, "--rank", "1").returncode == 0
    assert check(dump, "--rank", "0").returncode == 1
    line = one_opdump_line(check(dump, "--rank", "5"))
    assert "no check results of rank 5 (ranks present: 0, 1)" in line


# ---------------------------------------------------------------------------
# opdump repro --check: from a real capture file
# ---------------------------------------------------------------------------

MM_JOB = """
torch.manual_seed(0)
dev = os.environ.get("JOB_DEVICE", "cpu")
a = torch.randn(64, 32, device=dev)
b = torch.randn(32, 16, device=dev)
c = torch.mm(a, b)
print(json.dumps(float(c.sum())))
"""


def capture_of_mm(run, testdev=False, **env):
    job = run(MM_JOB, testdev=testdev, OPDUMP="1", OPDUMP_CAPTURE="aten::mm#0", **env)
    assert job.returncode == 0, job.stderr
    files = sorted(Path(job.dump_dir).glob("rank=*/device=*/capture-*.safetensors"))
    assert len(files) == 1, files
    return files[0]


def dump_with_capture(tmp_path, capture, device):
    d = tmp_path / "checked"
    name = "capture-4242-0.safetensors"
    (d / "checks" / "rank=0").mkdir(parents=True)
    shutil.copy(capture, d / "checks" / "rank=0" / name)
    write_part(d, 0, 4242, [
        row(MM, "aten::mm", "fail", 5e3, device=device, capture=f"checks/rank=0/{name}", seq=4, step=0,
            reduction_len=32),
        row(GELU, "aten::gelu", "pass", 1.0, device=device),
    ])
    return d, d / "checks" / "rank=0" / name


def run_printed_command(dump, cwd, *extra):
    """The repro command `opdump check` prints, run as printed (with the
    binary's path for `opdump`)."""
    p = check(dump, "--json", cwd=cwd)
    assert p.returncode == 1, p.stderr
    cmd = json.loads(p.stdout)["failures"][0]["repro"]
    text = check(dump, cwd=cwd).stdout
    assert f"reproduce: {cmd}" in text
    argv = shlex.split(cmd)
    assert argv[:3] == ["opdump", "repro", "--check"]
    return subprocess.run([str(CLI), *argv[1:], *extra], capture_output=True, text=True, timeout=60, cwd=cwd)


def run_repro_py(folder, *args, **env):
    return subprocess.run([sys.executable, str(folder / "repro.py"), "--json", *args], capture_output=True,
                          text=True, timeout=300, env=clean_env(**env))


def test_the_printed_repro_command_works_on_the_cpu(run, tmp_path):
    capture = capture_of_mm(run)
    dump, _ = dump_with_capture(tmp_path, capture, "cpu")
    work = tmp_path / "work"
    work.mkdir()
    # With a relative dump path, run from where `opdump check` ran.
    p = run_printed_command(dump.relative_to(tmp_path), tmp_path)
    assert p.returncode == 0, p.stderr
    folder = tmp_path / "repro-aten__mm_default-4"
    assert f"wrote {folder.name}/" in p.stdout and "python repro-aten__mm_default-4/repro.py" in p.stdout
    assert "--setup" not in p.stdout
    assert sorted(x.name for x in folder.iterdir()) == ["b.safetensors", "call.json", "repro.py"]
    assert (folder / "b.safetensors").read_bytes() == capture.read_bytes()
    call = json.loads((folder / "call.json").read_text())
    assert call["device_a"] == "cpu" and call["device_b"] == "cpu" and call["a_from_b"] is True
    assert call["op"] == "aten::mm" and call["overload"] == "default" and call["seq_b"] == 4
    assert call["tolerance"] == pytest.approx(10 * 2.0 ** -24)
    assert call["margin"] == 10  # repro.py's factor: the check's own
    assert call["check"]["ratio"] == 5e3 and call["check"]["signature"] == MM
    assert call["module"] == "blocks.0.mlp"
    # repro.py: the same kernel on both sides, neither off; the errors are
    # float32 rounding of a 32-long dot product against float64.
    r = run_repro_py(folder)
    assert r.returncode == 0, r.stdout + r.stderr
    res = json.loads(r.stdout)
    assert res["off"] == [] and res["verdict"].startswith("neither is off"), res
    o = res["outputs"]["output.0"]
    assert 0 < o["run_a"]["rel_l2"] < 2 ** -24 * 8 and o["run_a"]["rel_l2"] == o["run_b"]["rel_l2"]
    assert o["recorded_b"]["rel_l2"] == o["run_b"]["rel_l2"]  # the recorded output, remade bit for bit
    # Text output names the check.
    r = subprocess.run([sys.executable, str(folder / "repro.py")], capture_output=True, text=True, timeout=300,
                       env=clean_env())
    assert r.returncode == 0 and "checked in" in r.stdout and "ratio 5.000e+03, fail" in r.stdout, r.stdout
    # --out DIR (and -o).
    out = tmp_path / "elsewhere"
    p = run_printed_command(dump, tmp_path, "-o", str(out))
    assert p.returncode == 0 and (out / "call.json").exists(), p.stderr


def test_repro_check_names_the_device_that_is_off(run, tmp_path):
    """A capture made on testdev; repro.py with a fault planted in testdev's
    mm names testdev, and without it names neither."""
    capture = capture_of_mm(run, testdev=True, JOB_DEVICE="testdev")
    dump, file = dump_with_capture(tmp_path, capture, "testdev:0")
    p = run_printed_command(dump, tmp_path, "--out", str(tmp_path / "r"))
    assert p.returncode == 0, p.stderr
    assert "--setup tests.testdev:load" in p.stdout
    folder = tmp_path / "r"
    r = run_repro_py(folder, "--setup", "tests.testdev:load", TESTDEV_FAULT="aten::mm=scale:1.001")
    assert r.returncode == 1, r.stdout + r.stderr
    res = json.loads(r.stdout)
    assert res["off"] == ["testdev"] and res["verdict"].startswith("testdev is off"), res
    o = res["outputs"]["output.0"]
    assert o["run_b"]["rel_l2"] == pytest.approx(1e-3, rel=1e-2) and o["run_a"]["rel_l2"] < 2 ** -24 * 8
    r = run_repro_py(folder, "--setup", "tests.testdev:load")
    assert r.returncode == 0 and json.loads(r.stdout)["off"] == [], r.stdout + r.stderr


def test_repro_check_refusals(run, tmp_path):
    capture = capture_of_mm(run)
    dump, file = dump_with_capture(tmp_path, capture, "cpu")

    def repro(*args):
        return subprocess.run([str(CLI), "repro", *args], capture_output=True, text=True, timeout=60, cwd=tmp_path)

    # A capture no row names.
    other = file.with_name("capture-4242-9.safetensors")
    shutil.copy(file, other)
    line = one_opdump_line(repro("--check", str(other), "--out", str(tmp_path / "x")))
    assert "no check in" in line and "names this capture file" in line
    # Outside checks/rank=<R>/.
    line = one_opdump_line(repro("--check", str(capture), "--out", str(tmp_path / "x")))
    assert "not in a checks/rank=<R>/ directory" in line
    # A row of another op naming the file.
    write_part(dump, 0, 4242, [row(GELU, "aten::gelu", "fail", 50.0, device="cpu",
                                   capture="checks/rank=0/capture-4242-0.safetensors")])
    line = one_opdump_line(repro("--check", str(file), "--out", str(tmp_path / "x")))
    assert "the capture holds a call of \"aten::mm\"" in line and "aten::gelu" in line
    # A device that is no device name.
    write_part(dump, 0, 4242, [row(MM, "aten::mm", "fail", 50.0, device="cpu;rm",
                                   capture="checks/rank=0/capture-4242-0.safetensors")])
    assert "is no device name" in one_opdump_line(repro("--check", str(file), "--out", str(tmp_path / "x")))
    # A capture file that is not one.
    write_part(dump, 0, 4242, [row(MM, "aten::mm", "fail", 50.0, device="cpu",
                                   capture="checks/rank=0/capture-4242-0.safetensors")])
    file.write_bytes(b"not safetensors")
    line = one_opdump_line(repro("--check", str(file), "--out", str(tmp_path / "x")))
    assert "not a readable capture file: run the job again with OPDUMP_CHECK=1" in line
    # --check with dumps, and neither.
    assert one_opdump_line(repro("a", "b", "--check", str(file)))
    assert one_opdump_line(repro())
    assert not (tmp_path / "x" / "repro.py").exists()


def test_a_summary_that_disagrees_with_its_lines_is_noted(tmp_path):
    d = tmp_path / "odd"
    rows = [row(verdict="pass"), row(GELU, "aten::gelu", "fail", 20.0)]
    write_part(d, 0, 5, rows, failed=3, unfinished=2, write_failures=1)
    p = check(d, "--json")
    assert p.returncode == 1, p.stderr
    notes = json.loads(p.stdout)["notes"]
    assert any("the summary line counts 1 passed, 3 failed, 0 no_reference; the file's lines hold 1, 1, 0" in n
               for n in notes), notes
    assert any("2 checks were still queued" in n for n in notes) and any("1 lines or capture files" in n
                                                                          for n in notes), notes
