"""opdump repro and repro.py against a hostile dump: capture files whose
metadata names something that is not an operator, or another op than the
dump's row, or is malformed; a default repro folder that another user made
or can write, or that is a link; modules planted beside repro.py. Nothing in
a capture file may run as code, and each refusal is one line with exit
status 2 (crates/cli/src/commands/repro.rs, crates/cli/src/commands/repro.py)."""

import json
import os
import shutil
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from conftest import CLI, LIB, PRELUDE, clean_env

IS_ROOT = os.geteuid() == 0
NOBODY = 65534

# One captured call of aten::gelu (self, approximate).
GELU_JOB = """
x = torch.randn(4, 8)
torch.ops.opdump.enable()
y = torch.nn.functional.gelu(x)
torch.ops.opdump.flush()
torch.ops.opdump.disable()
print(json.dumps(torch.ops.opdump.capture_stats()))
"""
CALL = "aten::gelu#0"
# A module that leaves a file named by MARKER when it is imported: proof
# that data made the script import it.
MARKER_MODULE = "import os\nopen(os.environ['MARKER'], 'w').write(__name__)\n"


@pytest.fixture(scope="module")
def dump(tmp_path_factory):
    """A dump of GELU_JOB with its one gelu call captured."""
    work = tmp_path_factory.mktemp("job")
    (work / "job.py").write_text(PRELUDE + textwrap.dedent(GELU_JOB))
    env = clean_env(OPDUMP_DIR=work / "dump", TESTJOB_LIB=LIB, TESTJOB_LOAD=1, OPDUMP_CAPTURE=CALL)
    p = subprocess.run([sys.executable, str(work / "job.py")], env=env, capture_output=True, text=True,
                       timeout=300, cwd=work)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout.splitlines()[-1])[0] == 1, "the call was not captured"
    return work / "dump"


def copy_of(dump, dest):
    shutil.copytree(dump, dest)
    return dest


def capture_file(dump):
    (f,) = Path(dump).glob("rank=*/device=*/capture-*.safetensors")
    return f


def read_header(path):
    """A safetensors file's header (JSON) and the bytes after it, read with
    struct and json alone."""
    data = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n]), data[8 + n:]


def write_header(path, header, body):
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    Path(path).write_bytes(struct.pack("<Q", len(text)) + text + body)


# What an edit returns to leave the file without metadata.
DROP = object()


def edit_metadata(path, edit):
    """Rewrites the metadata of the capture file `path` with edit(metadata),
    which changes it in place (or returns DROP to leave none)."""
    header, body = read_header(path)
    meta = header.pop("__metadata__", {})
    if edit(meta) is not DROP:
        header["__metadata__"] = meta
    write_header(path, header, body)


def opdump_repro(a, b, *extra, cwd=None):
    return subprocess.run([str(CLI), "repro", str(a), str(b), "--call", CALL, *extra], capture_output=True,
                          text=True, timeout=300, cwd=cwd)


def repro_folder(dump, folder):
    p = opdump_repro(dump, dump, "--out", str(folder))
    assert p.returncode == 0, p.stderr
    return folder


def run_script(folder, cwd=None, **env):
    e = clean_env(**env)
    return subprocess.run([sys.executable, str(Path(folder) / "repro.py"), "--json"], capture_output=True,
                          text=True, env=e, timeout=300, cwd=cwd)


def assert_one_line_exit_2(p, prefix, *words):
    lines = p.stderr.splitlines()
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert len(lines) == 1 and lines[0].startswith(prefix), lines
    for w in words:
        assert w in lines[0], (w, lines[0])
    return lines[0]


def test_the_untouched_folder_runs(dump, tmp_path):
    """The baseline the hostile cases change one thing of."""
    folder = repro_folder(dump, tmp_path / "repro")
    p = run_script(folder)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)["outputs"]["output.0"]
    assert out["run_a_reproduces_recorded_a"], out


# ---------------------------------------------------------------------------
# opdump repro: a capture must be of its row's op
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("op, overload", [("aten::relu", "default"), ("aten::gelu", "out"),
                                          ("import_module::__self__", "import_module"), (None, None)])
def test_opdump_repro_refuses_a_capture_of_another_op(dump, tmp_path, op, overload):
    hostile = copy_of(dump, tmp_path / "dump")

    def edit(meta):
        for key, value in (("opdump.op", op), ("opdump.overload", overload)):
            meta.pop(key) if value is None else meta.update({key: value})

    edit_metadata(capture_file(hostile), edit)
    folder = tmp_path / "repro"
    p = opdump_repro(hostile, dump, "--out", str(folder))
    line = assert_one_line_exit_2(p, "opdump: ", "not of its call", "aten::gelu")
    assert str(capture_file(hostile)) in line
    assert not folder.exists(), "nothing may be written for a refused capture"


def test_opdump_repro_refuses_a_device_that_is_no_device_name(dump, tmp_path):
    """The device goes into call.json and onto the terminal."""
    hostile = copy_of(dump, tmp_path / "dump")

    def edit(meta):
        layout = json.loads(meta["opdump.tensors"])
        for lay in layout.values():
            lay["device"] = "cpu\x1b]0;owned\x07"
        meta["opdump.tensors"] = json.dumps(layout)

    edit_metadata(capture_file(hostile), edit)
    p = opdump_repro(hostile, dump, "--out", str(tmp_path / "repro"))
    assert_one_line_exit_2(p, "opdump: ", "not a device name")
    assert "\x1b" not in p.stdout + p.stderr


# ---------------------------------------------------------------------------
# repro.py: only real operators, only torch's own dtypes
# ---------------------------------------------------------------------------


def name_the_op(folder, op, overload, args=None):
    """The folder as a dump whose rows and captures agree on `op` would give
    it: both captures and call.json name `op` `overload`."""
    def edit(meta):
        meta.update({"opdump.op": op, "opdump.overload": overload})
        if args is not None:
            meta["opdump.args"] = json.dumps(args)

    for name in ("a.safetensors", "b.safetensors"):
        edit_metadata(folder / name, edit)
    call = json.loads((folder / "call.json").read_text())
    call.update(op=op, overload=overload)
    (folder / "call.json").write_text(json.dumps(call))


IMPORT_MARKER = [{"name": "name", "kwarg_only": False, "value": {"str": "opdump_test_marker"}}]


@pytest.mark.parametrize("op, overload", [
    # torch.ops.import_module.__self__ is torch.ops: these reach
    # torch.ops.import_module and torch.ops.load_library.
    ("import_module::__self__", "import_module"),
    ("import_module::__self__", "load_library"),
    ("load_library::x", "default"),
    ("aten::__class__", "default"),
    ("aten::add", "overloads"),
    ("aten::add", "_op"),
    ("higher_order::cond", "default"),
    ("aten::gelu", "default.x"),
    ("aten", "default"),
])
def test_repro_py_calls_nothing_but_an_operator(dump, tmp_path, op, overload):
    folder = repro_folder(dump, tmp_path / "repro")
    name_the_op(folder, op, overload, IMPORT_MARKER)
    modules = tmp_path / "modules"
    modules.mkdir()
    (modules / "opdump_test_marker.py").write_text(MARKER_MODULE)
    marker = tmp_path / "imported"
    env = clean_env(MARKER=marker)
    p = subprocess.run([sys.executable, str(folder / "repro.py")], capture_output=True, text=True, timeout=300,
                       env={**env, "PYTHONPATH": f"{modules}{os.pathsep}{env['PYTHONPATH']}"})
    assert not marker.exists(), "data in a capture file imported a module"
    assert_one_line_exit_2(p, "repro: ", "not an operator")


def test_repro_py_refuses_a_capture_of_another_op_than_call_json(dump, tmp_path):
    folder = repro_folder(dump, tmp_path / "repro")
    edit_metadata(folder / "b.safetensors", lambda m: m.update({"opdump.op": "aten::relu"}))
    assert_one_line_exit_2(run_script(folder), "repro: ", "b.safetensors", "aten::relu", "call.json")


@pytest.mark.parametrize("kind, value", [("dtype", "_dynamo"), ("dtype", "ops"), ("dtype", "__builtins__"),
                                         ("layout", "float32"), ("memory_format", "load_library")])
def test_repro_py_takes_only_torchs_own_dtypes(dump, tmp_path, kind, value):
    folder = repro_folder(dump, tmp_path / "repro")
    args = [{"name": "self", "kwarg_only": False, "value": {"tensor": "input.self"}},
            {"name": "approximate", "kwarg_only": True, "value": {kind: value}}]
    edit_metadata(folder / "a.safetensors", lambda m: m.update({"opdump.args": json.dumps(args)}))
    assert_one_line_exit_2(run_script(folder), "repro: ", "a.safetensors", "approximate", "cannot be rebuilt")


# ---------------------------------------------------------------------------
# repro.py: malformed metadata is one line, never a traceback
# ---------------------------------------------------------------------------


def nested(depth):
    v = {"int": 1}
    for _ in range(depth):
        v = {"list": [v]}
    return v


def with_args(args):
    return lambda m: m.update({"opdump.args": args if isinstance(args, str) else json.dumps(args)})


SELF = {"name": "self", "kwarg_only": False, "value": {"tensor": "input.self"}}
BAD_METADATA = {
    "args nested past JSON's recursion limit": (with_args("[" * 100000 + "]" * 100000), "opdump.args"),
    "an argument nested in lists": (with_args([SELF, {"name": "x", "kwarg_only": True, "value": nested(50)}]),
                                    "cannot be rebuilt"),
    "args missing": (lambda m: m.pop("opdump.args"), "lacks opdump.args"),
    "no metadata": (lambda m: DROP, "lacks opdump.op"),
    "args not a list": (with_args({"self": 1}), "opdump.args"),
    "args not JSON": (with_args("[{"), "opdump.args"),
    "an argument without a name": (with_args([{"kwarg_only": False, "value": None}]), "not an argument"),
    "kwarg_only not a bool": (with_args([dict(SELF, kwarg_only="no")]), "not an argument"),
    "an int that is a string": (with_args([SELF, {"name": "n", "kwarg_only": True, "value": {"int": "7"}}]),
                                "cannot be rebuilt"),
    "a tensor key that is a list": (with_args([dict(SELF, value={"tensor": ["input.self"]})]),
                                    "cannot be rebuilt"),
    "an unknown kind": (with_args([dict(SELF, value={"pickle": "x"})]), "cannot be rebuilt"),
    "a layout that is not a map": (lambda m: m.update({"opdump.tensors": "[1, 2]"}), "opdump.tensors"),
    "a stride that is not ints": (lambda m: m.update({"opdump.tensors": '{"input.self": {"stride": "x"}}'}),
                                  "opdump.tensors"),
}


@pytest.mark.parametrize("case", sorted(BAD_METADATA))
def test_bad_metadata_is_one_line_and_exit_2(dump, tmp_path, case):
    edit, words = BAD_METADATA[case]
    folder = repro_folder(dump, tmp_path / "repro")
    edit_metadata(folder / "a.safetensors", edit)
    assert_one_line_exit_2(run_script(folder), "repro: ", "a.safetensors", words)


def test_a_header_that_is_no_safetensors_is_one_line(dump, tmp_path):
    folder = repro_folder(dump, tmp_path / "repro")
    header, body = read_header(folder / "a.safetensors")
    header["input.self"]["shape"] = [3, "x"]
    write_header(folder / "a.safetensors", header, body)
    assert_one_line_exit_2(run_script(folder), "repro: ", "a.safetensors", "not a readable capture file")


# ---------------------------------------------------------------------------
# repro.py imports nothing from its own folder
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("how", ["by path", "from the folder"])
def test_modules_planted_beside_repro_py_are_not_imported(dump, tmp_path, how):
    folder = repro_folder(dump, tmp_path / "repro")
    for name in ("torch", "json", "argparse"):
        (folder / f"{name}.py").write_text(MARKER_MODULE.replace("'w'", "'a'"))
    marker = tmp_path / "imported"
    if how == "by path":
        p = run_script(folder, MARKER=marker)
    else:
        p = subprocess.run([sys.executable, "repro.py", "--json"], capture_output=True, text=True, timeout=300,
                           env=clean_env(MARKER=marker), cwd=folder)
    assert not marker.exists(), f"imported from the repro folder: {marker.read_text()}"
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["outputs"]["output.0"]["run_a_reproduces_recorded_a"]


# ---------------------------------------------------------------------------
# The default folder: new, or one that passes OPDUMP_DIR's trust test
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def default_name(dump, tmp_path_factory):
    """The default folder's name, from a run in an empty directory, which
    must create it private and ours."""
    work = tmp_path_factory.mktemp("fresh")
    p = opdump_repro(dump, dump, cwd=work)
    assert p.returncode == 0, p.stderr
    (made,) = list(work.iterdir())
    st = made.stat()
    assert made.name.startswith("repro-aten__gelu-") and made.is_dir() and not made.is_symlink()
    assert st.st_mode & 0o777 == 0o700 and st.st_uid == os.geteuid()
    assert sorted(f.name for f in made.iterdir()) == ["a.safetensors", "b.safetensors", "call.json", "repro.py"]
    return made.name


def test_an_own_private_default_folder_is_reused(dump, tmp_path, default_name):
    folder = tmp_path / default_name
    folder.mkdir(mode=0o755)
    (folder / "repro.py").write_text("stale")
    p = opdump_repro(dump, dump, cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert (folder / "repro.py").read_text().startswith("#!/usr/bin/env python3")


def plant_open(folder):
    folder.mkdir()
    folder.chmod(0o777)
    return "writable by other users", "0777"


def plant_foreign(folder):
    if not IS_ROOT:
        pytest.skip("needs root to give a folder to another user")
    folder.mkdir(mode=0o755)
    os.chown(folder, NOBODY, NOBODY)
    return "owned by another user", f"uid {NOBODY}"


def plant_link(folder):
    target = folder.parent / "elsewhere"
    target.mkdir(mode=0o700)
    folder.symlink_to(target)
    return "symbolic link", "--out"


@pytest.mark.parametrize("plant", [plant_open, plant_foreign, plant_link], ids=["0777", "foreign", "link"])
def test_an_untrusted_default_folder_is_refused(dump, tmp_path, default_name, plant):
    folder = tmp_path / default_name
    words = plant(folder)
    p = opdump_repro(dump, dump, cwd=tmp_path)
    assert_one_line_exit_2(p, "opdump: ", default_name, *words)
    assert list(folder.iterdir()) == [], "nothing may be written into a refused folder"
