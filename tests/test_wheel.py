"""The wheel (scripts/wheel.sh), installed where there is no compiler: a
fresh venv with cargo, g++ and cc off PATH, into which pip installs the wheel
and its [analysis] extra.

That venv sees the test run's own torch, as a user's environment already has
one, through a .pth file and links rather than a second copy: torch from PyPI
with its CUDA libraries is about 6 GB unpacked, and a copy for every run
filled CI's disk. pip counts it as installed, so the wheel's torch
requirement is checked against it.

The wheel packs the plugin the set-up built; maturin builds the command in
its own target dir (about 2 min the first time on two cores), the venv takes
about 30 s; the venv is removed when the module's tests end."""

import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from conftest import ROOT, TARGET

JOB = ROOT / "tests" / "jobs" / "faulty_cpu.py"
TORCH_VERSION = subprocess.run([sys.executable, "-c", "import torch; print(torch.__version__.split('+')[0])"],
                               capture_output=True, text=True, check=True).stdout.strip()
# Another version, for a wheel that carries no core for the running torch.
OTHER_VERSION = "2.11.0" if TORCH_VERSION != "2.11.0" else "2.15.0"
COMPILERS = ("cargo", "rustc", "g++", "gcc", "cc", "c++", "clang")

pytestmark = pytest.mark.timeout(1200)


def build_wheel(out: Path, *args: str) -> Path:
    env = dict(os.environ, OPDUMP_SKIP_BUILD="1")  # built by the set-up already
    p = subprocess.run([str(ROOT / "scripts" / "wheel.sh"), "--out", str(out), *args],
                       capture_output=True, text=True, env=env, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    return Path(p.stdout.strip().splitlines()[-1])


def link_torch(into: Path) -> set:
    """Links the running torch and everything it requires (with the extras
    asked for, under this platform's markers) into `into`, one link per
    top-level file or folder of each distribution; returns their names."""
    into.mkdir()
    seen, todo = set(), [("torch", "")]
    while todo:
        name, extra = todo.pop()
        try:
            dist = distribution(name)
        except PackageNotFoundError:
            continue  # not here: pip installs it into the venv
        key = (canonicalize_name(dist.metadata["Name"]), extra)
        if key in seen:
            continue
        seen.add(key)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": extra}):
                todo += [(req.name, "")] + [(req.name, e) for e in req.extras]
        for top in {f.parts[0] for f in dist.files or []} - {"..", "__pycache__"}:
            src, dst = Path(dist.locate_file(top)), into / top
            if src.exists() and not dst.exists():
                dst.symlink_to(src)
    return {name for name, _ in seen}


class Venv:
    """A fresh venv with the wheel installed, and a PATH with no compiler."""

    def __init__(self, root: Path, wheel: Path):
        self.root = root
        self.bin = root / "venv" / "bin"
        self.python = self.bin / "python"
        subprocess.run([sys.executable, "-m", "venv", str(root / "venv")], check=True, timeout=300)
        # The running torch, linked from outside the venv's prefix: pip does
        # not uninstall what lies outside it, so nothing it resolves can
        # reach the test run's own environment.
        linked = link_torch(root / "host-torch")
        assert "torch" in linked, linked
        site = subprocess.run([str(self.python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                              capture_output=True, text=True, check=True).stdout.strip()
        (Path(site) / "host-torch.pth").write_text(f"{root / 'host-torch'}\n")
        # The wheel and its [analysis] extra (duckdb, pandas, pyarrow); torch
        # must already count as installed, at the build's version.
        p = subprocess.run([str(self.python), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                            f"{wheel}[analysis]", f"torch=={TORCH_VERSION}"],
                           capture_output=True, text=True, timeout=1200)
        assert p.returncode == 0, p.stderr[-4000:]
        assert not list(Path(site).glob("torch-*.dist-info")), "pip installed a second torch"
        # A few plain tools, and nothing that compiles.
        tools = root / "tools"
        tools.mkdir()
        for t in ("sh", "env", "ls", "cat", "uname"):
            found = shutil.which(t)
            if found:
                (tools / t).symlink_to(found)
        self.path = f"{self.bin}:{tools}"

    def env(self, **extra) -> dict:
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("OPDUMP", "PYTHON", "CARGO", "RUST")) and k != "LD_PRELOAD"}
        env.update(PATH=self.path, PYTHONUNBUFFERED="1", HOME=str(self.root))
        env.update({k: str(v) for k, v in extra.items()})
        return env

    def run(self, *cmd, cwd: Path, **extra) -> subprocess.CompletedProcess:
        return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=cwd,
                              env=self.env(**extra), timeout=600)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("dist"))


@pytest.fixture(scope="module")
def venv(tmp_path_factory, wheel) -> Iterator[Venv]:
    root = tmp_path_factory.mktemp("wheel-venv")
    try:  # removed even when the set-up fails, so that no run leaves it behind
        yield Venv(root, wheel)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def rows_in(dump: Path) -> int:
    """Rows of a dump, read here by pyarrow, independently of the package."""
    files = [f for f in dump.rglob("part-*.parquet")]
    assert files, f"no dump under {dump}"
    return sum(pq.read_metadata(f).num_rows for f in files)


def opdump_lines(stderr: str) -> list:
    return [l for l in stderr.splitlines() if l.startswith("opdump:")]


def test_wheel_contents_and_metadata(wheel):
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        tags = z.read(next(n for n in names if n.endswith(".dist-info/WHEEL"))).decode()
    assert "opdump/_lib/libopdump.so" in names
    assert f"opdump/_lib/torch-{TORCH_VERSION}/libopdump_core.so" in names
    assert any(n.endswith(".data/scripts/opdump") for n in names)
    assert {"opdump/__init__.py", "opdump/__main__.py", "opdump/py.typed"} <= names
    assert "Name: opdump\n" in meta and "License: Apache-2.0" in meta
    assert "Requires-Python: >=3.10" in meta
    assert "Requires-Dist: torch>=2.11,<2.16" in meta
    assert "Provides-Extra: analysis" in meta and "Requires-Dist: duckdb ; extra == 'analysis'" in meta
    # auditwheel set a manylinux tag; the wheel has no Python ABI of its own.
    tag = next(l for l in tags.splitlines() if l.startswith("Tag: "))
    assert tag.startswith("Tag: py3-none-manylinux_") and tag.endswith("_x86_64"), tag


def test_run_compare_and_read_without_a_compiler(venv, tmp_path):
    code = f"import shutil, json; print(json.dumps([shutil.which(t) for t in {COMPILERS!r}]))"
    check = venv.run("python", "-c", code, cwd=tmp_path)
    assert json.loads(check.stdout) == [None] * len(COMPILERS), check.stdout

    # An unmodified job, through python -m opdump run.
    # The reference also captures one call (through --set): its capture file
    # shares the Parquet files' directory, and read() must still take them.
    ref = venv.run("python", "-m", "opdump", "run", "--dir", "ref", "--set", "OPDUMP_CAPTURE=aten::gelu#0", "--",
                   "python", JOB, cwd=tmp_path)
    assert ref.returncode == 0, ref.stderr
    assert [l for l in opdump_lines(ref.stderr) if "captured 1 op call" not in l] == [], ref.stderr
    assert len(list((tmp_path / "ref").rglob("capture-*.safetensors"))) == 1
    bad = venv.run("python", "-m", "opdump", "run", "--dir", "bad", "--steps", "0", "--", "python", JOB,
                   cwd=tmp_path, FAULT="aten::gelu=1.01")
    assert bad.returncode == 0 and not opdump_lines(bad.stderr), bad.stderr
    assert ref.stdout != bad.stdout  # the fault changed the loss

    # The console command.
    p = venv.run("opdump", "compare", "ref", "bad", "--json", cwd=tmp_path)
    assert p.returncode == 1, p.stderr
    report = json.loads(p.stdout)
    assert report["first_introduced"]["op"] == "aten::gelu"
    assert report["first_introduced"]["module"] == "blocks.0"

    # The Python face: compare, summary and read.
    code = """
import json, opdump
r = opdump.compare("ref", "bad", steps="0")
s = opdump.summary("ref")
df = opdump.read("ref", as_="pandas")
rel = opdump.read("ref")
print(json.dumps({"exit": r["exit_status"], "op": r["headline"]["op"], "rows": len(df),
                  "duckdb_rows": rel.count("*").fetchall()[0][0], "devices": sorted(set(df.device.astype(str))),
                  "modules": int(df.module.notna().sum()), "ranks": len(s["ranks"])}))
"""
    p = venv.run("python", "-c", code, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    got = json.loads(p.stdout.splitlines()[-1])
    assert got["exit"] == 1 and got["op"] == "aten::gelu", got
    assert got["rows"] == got["duckdb_rows"] == rows_in(tmp_path / "ref"), got
    assert got["devices"] == ["cpu"] and got["modules"] > 0 and got["ranks"] == 1, got

    # A dump that is not there is a Python error, not a crash.
    p = venv.run("python", "-c", "import opdump; opdump.compare('ref', 'nowhere')", cwd=tmp_path)
    assert p.returncode == 1 and "OpdumpError" in p.stderr and "nowhere" in p.stderr, p.stderr


def test_load_then_enable_in_process(venv, tmp_path):
    code = """
import json, torch, opdump
assert not opdump.is_loaded()
loaded = opdump.load()
on = opdump.enable()
m = torch.nn.Linear(4, 2)
m(torch.randn(3, 4)).sum().backward()
opdump.flush()
print(json.dumps({"loaded": loaded, "on": on, "stats": opdump.stats(), "versions": opdump.supported_torch_versions()}))
"""
    p = venv.run("python", "-c", code, cwd=tmp_path, OPDUMP_DIR="inproc")
    assert p.returncode == 0 and not opdump_lines(p.stderr), p.stderr
    got = json.loads(p.stdout.splitlines()[-1])
    assert got["loaded"] and got["on"] and got["versions"] == [TORCH_VERSION], got
    assert got["stats"]["written"] > 0 and got["stats"]["dropped"] == got["stats"]["failed"] == 0, got
    t = pq.ParquetDataset(tmp_path / "inproc").read().to_pandas()
    assert len(t) == rows_in(tmp_path / "inproc")
    assert set(t.module.dropna()) == {"Linear"} and "weight" in set(t.name.dropna())


def test_a_wheel_without_a_core_for_the_running_torch_stays_off(venv, tmp_path):
    """Its only core is labelled for another torch version: one opdump: line
    naming both versions, dumping off, and the job's numbers unchanged."""
    other = build_wheel(tmp_path / "dist", "--core", f"{TARGET / 'libopdump_core.so'}={OTHER_VERSION}")
    site = tmp_path / "site"
    p = venv.run("python", "-m", "pip", "install", "-q", "--no-deps", "--target", site, other, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    code = "import json, torch, opdump; print(json.dumps([opdump.supported_torch_versions(), opdump.load()]))"
    p = venv.run("python", "-c", code, cwd=tmp_path, PYTHONPATH=site)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.splitlines()[-1]) == [[OTHER_VERSION], False]
    lines = opdump_lines(p.stderr)
    assert len(lines) == 1, p.stderr
    assert f"runs torch {TORCH_VERSION}" in lines[0] and f"cores for torch {OTHER_VERSION} only" in lines[0], lines

    # Preloaded into an unmodified job: the same line, no dump, same loss.
    off = venv.run("python", "-m", "opdump", "run", "--dir", "off", "--", "python", JOB, cwd=tmp_path,
                   PYTHONPATH=site)
    plain = venv.run("python", JOB, cwd=tmp_path)
    assert off.returncode == 0 and plain.returncode == 0, off.stderr
    assert len(opdump_lines(off.stderr)) == 1 and f"runs torch {TORCH_VERSION}" in off.stderr, off.stderr
    assert off.stdout == plain.stdout
    assert not (tmp_path / "off").exists() or not list((tmp_path / "off").rglob("*.parquet"))
