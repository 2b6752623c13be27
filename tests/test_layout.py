"""The layout of the Rust code: no import circle between the files of a crate
(scripts/import_cycles.py), checked on the repository and, so that the check
can fail, on a small tree with a known circle; and the layout of the C++
code: a folder of cpp/ per concern, and which folders may include which."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "import_cycles.py"


def load_script():
    spec = importlib.util.spec_from_file_location("import_cycles", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


import_cycles = load_script()


def crate_src(name):
    return REPO / "src" if name == "opdump" else REPO / "crates" / name / "src"


def cycles_of(src):
    return import_cycles.report([src])


def write_tree(root, files):
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


CRATES = sorted(p.parent.name for p in (REPO / "crates").glob("*/src")) + ["opdump"]


@pytest.mark.parametrize("crate", CRATES)
def test_no_import_circle_between_the_files_of_a_crate(crate):
    assert cycles_of(crate_src(crate)) == []


def test_a_known_circle_is_found_and_fails_the_script(tmp_path):
    src = write_tree(
        tmp_path / "demo" / "src",
        {
            "lib.rs": "pub mod a;\npub mod b;\npub mod report;\n",
            # a -> b through a `use` group, b -> a through a path in code.
            "a.rs": "use crate::{b::Thing, report};\npub struct A;\n",
            "b.rs": "pub struct Thing;\nfn f() -> crate::a::A { crate::a::A }\n",
            # report/model -> report through `super`, report -> report/model.
            "report.rs": "pub mod model;\npub use crate::report::model::Model;\n",
            "report/model.rs": "use super::Style;\npub struct Model;\n",
        },
    )
    edges = import_cycles.graph(src)
    assert edges[("a",)] == {("b",), ("report",)}
    assert edges[("report", "model")] == {("report",)}
    assert sorted(cycles_of(src)) == [
        "demo: a -> b -> a",
        "demo: report -> report/model -> report",
    ]
    run = subprocess.run(
        [sys.executable, str(SCRIPT), str(src)], capture_output=True, text=True
    )
    assert run.returncode == 1
    assert "demo: a -> b -> a" in run.stdout


def test_comments_strings_and_test_modules_make_no_edge(tmp_path):
    src = write_tree(
        tmp_path / "quiet" / "src",
        {
            "lib.rs": "pub mod a;\npub mod b;\n",
            "a.rs": "use crate::b;\n",
            # None of these is a reference from b to a.
            "b.rs": (
                '// crate::a::X\n/* crate::a::Y */\nconst S: &str = "crate::a::Z";\n'
                "const C: char = '\"';\nmod tests {\n    use super::*;\n    use super::helper;\n}\n"
            ),
        },
    )
    assert cycles_of(src) == []
    run = subprocess.run(
        [sys.executable, str(SCRIPT), str(src)], capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout


def dependency_tree(package, edges):
    """`cargo tree` of one package, without duplicates collapsed."""
    run = subprocess.run(
        ["cargo", "tree", "--offline", "-p", package, "-e", edges, "--prefix", "none", "--no-dedupe"],
        cwd=REPO, capture_output=True, text=True,
    )
    assert run.returncode == 0, run.stderr
    return {line.split()[0] for line in run.stdout.splitlines() if line.strip()}


def test_the_judge_builds_and_tests_without_arrow_or_parquet():
    # The judge's own build and its tests (dev-dependencies included).
    crates = dependency_tree("opdump-judge", "normal,dev")
    assert "opdump-judge" in crates
    assert not {c for c in crates if c.startswith(("arrow", "parquet"))}, sorted(crates)


def test_the_format_without_its_parquet_feature_has_no_arrow():
    run = subprocess.run(
        ["cargo", "tree", "--offline", "-p", "opdump-format", "--no-default-features", "-e", "normal",
         "--prefix", "none"],
        cwd=REPO, capture_output=True, text=True,
    )
    assert run.returncode == 0, run.stderr
    assert "opdump-format" in run.stdout
    assert "arrow" not in run.stdout and "parquet" not in run.stdout, run.stdout


# Every thread opdump starts blocks SIGXFSZ before it runs (a thread started
# from the job's thread inherits the job's mask): one place starts them in
# Rust (opdump_fsguard::spawn) and one in C++ (start_thread).
THREAD_STARTERS = {
    "rust": (REPO / "crates" / "fsguard" / "src" / "lib.rs", ("std::thread::Builder", "thread::spawn(")),
    "c++": (REPO / "cpp" / "common" / "own_threads.cpp", ("std::thread(", "std::jthread(", "pthread_create(")),
}


def _product_sources():
    for path in sorted((REPO / "cpp").rglob("*.[ch]*")):
        yield "c++", path, path.read_text()
    for path in sorted(list((REPO / "src").rglob("*.rs")) + list((REPO / "crates").rglob("src/**/*.rs"))):
        if path.parts[-3:-1] == ("crates", "testkit") or "testkit" in path.parts:
            continue
        text = path.read_text()
        # Unit tests start threads of their own.
        yield "rust", path, text.split("#[cfg(test)]")[0]


def test_threads_are_started_in_one_place_per_language():
    for lang, path, text in _product_sources():
        home, needles = THREAD_STARTERS[lang]
        if path == home:
            continue
        for needle in needles:
            assert needle not in text, f"{path.relative_to(REPO)} starts a thread ({needle}); use {home.name}'s"


# cpp/ holds a folder per concern (README.md, "Code layout"); each folder's
# header is what the others may use. Only the header the cxx bridge includes
# (src/bridge.rs) sits in cpp/ itself.
CPP = REPO / "cpp"
BRIDGE_HEADER = "opdump.h"
# The device path and the signature measure tensors whatever calls them (the
# test device's batch kernel includes the signature's definition): neither
# reaches into the hook's state.
HOOK_FREE = ("device", "signature")
_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"]([^">]+)[">]', re.MULTILINE)


def cpp_includes(path):
    """The folders of cpp/ a file includes from, by its #include lines."""
    folders = set()
    for name in _INCLUDE.findall(path.read_text()):
        target = (path.parent / name).resolve() if not name.startswith("opdump/") else None
        if name.startswith("opdump/cpp/"):
            parts = name.split("/")[2:]
        elif target is not None and target.is_relative_to(CPP) and target.exists():
            parts = target.relative_to(CPP).parts
        else:
            continue
        if len(parts) > 1:
            folders.add(parts[0])
    return folders


def test_the_bridge_header_is_the_only_file_directly_in_cpp():
    assert BRIDGE_HEADER in (REPO / "src" / "bridge.rs").read_text().replace("opdump/cpp/", "")
    loose = sorted(p.name for p in CPP.iterdir() if not p.is_dir())
    assert loose == [BRIDGE_HEADER], f"files directly in cpp/ belong in a folder: {loose}"


@pytest.mark.parametrize("folder", HOOK_FREE)
def test_the_device_path_and_the_signature_never_include_the_hook(folder):
    files = sorted(p for p in (CPP / folder).rglob("*") if p.is_file())
    assert files, f"cpp/{folder}/ is empty"
    for path in files:
        assert "hook" not in cpp_includes(path), f"{path.relative_to(REPO)} includes a header of cpp/hook/"


def test_includes_are_read_by_folder(tmp_path):
    # The check above sees both ways of naming a header of cpp/: by the
    # project's path, and relative to the file (the AVX2 files, built alone).
    demo = tmp_path / "demo.cpp"
    demo.write_text(
        '#include "opdump/cpp/hook/hook.h"\n#include <vector>\n'
        '#include "opdump/cpp/opdump.h"\n#include "opdump/src/bridge.rs.h"\n'
    )
    assert cpp_includes(demo) == {"hook"}
    assert cpp_includes(CPP / "signature" / "signature_avx2.cpp") == {"signature"}
    assert cpp_includes(CPP / "stats" / "stats_avx2.cpp") == {"signature", "stats"}
