"""A hostile host: a job that closes opdump's descriptors and reuses their
numbers, a file-size limit with SIGXFSZ at its default action, and dump
directories that other users could write or that hold planted links. opdump
must never write into or close the job's files, never kill it, never publish
a partial file, and never trust a directory someone else controls. Each test
causes the fault."""

import functools
import json
import os
import pwd
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from conftest import LIB, ROOT, clean_env

IS_ROOT = os.geteuid() == 0


def visible(dump):
    return sorted(f for f in Path(dump).rglob("part-*.parquet"))


def assert_visible_files_complete(dump):
    """Every visible file reads back and holds the op calls its metadata counts."""
    for f in visible(dump):
        t = pq.read_table(f)  # raises on an empty or truncated file
        md = pq.read_metadata(f).metadata
        calls = len(set(t.column("seq").to_pylist()))
        assert calls == int(md[b"opdump.op_calls"]), f
        assert t.num_rows == int(md[b"opdump.rows"]), f


def opdump_lines(stderr):
    return [l for l in stderr.splitlines() if l.startswith("opdump:")]


def lost_in_report(lines):
    """The op calls the exit report counts as lost to write failures."""
    report = [l for l in lines if "lost (write failures)" in l]
    assert len(report) == 1, lines
    return int(report[0].split("dropped (channel full), ")[1].split()[0])


# ---------------------------------------------------------------------------
# 1. The job closes opdump's descriptors and opens files of its own
# ---------------------------------------------------------------------------

FD_REUSE_JOB = """
import json, os, sys, time
import torch
torch.ops.load_library(os.environ["TESTJOB_LIB"])
out, dump = sys.argv[1], os.path.realpath(sys.argv[2])

def fds_into(prefix):
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith(prefix):
                found.append(int(name))
        except OSError:
            pass
    return sorted(found)

if os.environ.get("TESTJOB_DUMP", "1") == "1":
    torch.ops.opdump.enable()
torch.manual_seed(0)
x = torch.randn(32, 32)
for i in range(100):
    x = torch.tanh(x @ x * 0.01)
torch.ops.opdump.flush()              # one complete, visible file
for i in range(100):
    x = torch.tanh(x @ x * 0.01)
time.sleep(2)                         # the writer idles with its hidden file open
opdump_fds = fds_into(dump)
os.closerange(3, 4096)                # daemon style
files = []
for k in range(8):
    path = os.path.join(out, f"job-{k}.txt")
    files.append((path, os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)))
for i in range(100):                  # go on recording
    x = torch.tanh(x @ x * 0.01)
torch.ops.opdump.flush()
errors = []
for k, (path, fd) in enumerate(files):
    try:
        os.write(fd, f"the job's file {k}\\n".encode())
        os.close(fd)
    except OSError as e:
        errors.append([path, e.errno])
print(json.dumps({"sum": float(x.sum()), "opdump_fds": opdump_fds,
                  "job_fds": [fd for _, fd in files], "errors": errors,
                  "stats": torch.ops.opdump.stats()}))
"""


def test_closed_and_reused_descriptors_are_never_written_or_closed(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(FD_REUSE_JOB)
    out, dump = tmp_path / "out", tmp_path / "dump"
    out.mkdir()
    p = subprocess.run([sys.executable, str(script), str(out), str(dump)],
                       env=clean_env(OPDUMP_DIR=dump, TESTJOB_LIB=LIB),
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    # The test only means something if the job got opdump's numbers.
    assert r["opdump_fds"], "opdump held no descriptor into the dump while idle"
    assert set(r["opdump_fds"]) & set(r["job_fds"]), r
    # The job never saw EBADF, and its files hold only what it wrote.
    assert r["errors"] == [], r["errors"]
    for k in range(8):
        data = (out / f"job-{k}.txt").read_bytes()
        assert b"PAR1" not in data
        assert data == f"the job's file {k}\n".encode(), (k, data[:64])
    # Nothing partial is visible; what is visible is complete.
    assert visible(dump), "the file completed before closerange is missing"
    assert_visible_files_complete(dump)
    # One warning names the problem; the loss is counted and reported.
    lines = opdump_lines(p.stderr)
    warn = [l for l in lines if "writing the dump failed" in l]
    assert len(warn) == 1, p.stderr
    assert "descriptor" in warn[0] and "no longer refers" in warn[0], warn[0]
    # ... and what to do.
    assert "free space (or raise the limit) under OPDUMP_DIR" in warn[0], warn[0]
    assert r["stats"][2] > 0
    assert lost_in_report(lines) > 0
    # The same job without opdump computes the same result.
    ref_out = tmp_path / "ref"
    ref_out.mkdir()
    ref = subprocess.run([sys.executable, str(script), str(ref_out), str(tmp_path / "none")],
                         env=clean_env(TESTJOB_LIB=LIB, TESTJOB_DUMP=0), capture_output=True, text=True, timeout=300)
    assert ref.returncode == 0, ref.stderr
    assert json.loads(ref.stdout.strip().splitlines()[-1])["sum"] == r["sum"]


# ---------------------------------------------------------------------------
# 2. A file-size limit with SIGXFSZ at its default action
# ---------------------------------------------------------------------------

XFSZ_JOB = """
import json, os, signal
import torch
# Python ignores SIGXFSZ; a C++ host, or a job like this one, does not.
signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
torch.ops.load_library(os.environ["TESTJOB_LIB"])
torch.manual_seed(0)
x = torch.randn(64, 64)
for i in range(3000):
    x = torch.tanh(x @ x * 0.01)
print(json.dumps({"sum": float(x.sum()), "stats": torch.ops.opdump.stats()}))
"""


def test_file_size_limit_with_default_sigxfsz_does_not_kill_the_job(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(XFSZ_JOB)
    limit = 32 * 1024

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    dump = tmp_path / "dump"
    env = clean_env(OPDUMP=1, OPDUMP_DIR=dump, OPDUMP_ROTATE_SECS="1", TESTJOB_LIB=LIB)
    p = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                       preexec_fn=small_files, timeout=300)
    assert p.returncode == 0, (p.returncode, p.stderr[-3000:])
    lines = opdump_lines(p.stderr)
    warn = [l for l in lines if "writing the dump failed" in l]
    assert len(warn) == 1 and "File too large" in warn[0], p.stderr
    assert lost_in_report(lines) > 0
    # No partial file, visible or hidden; what is visible reads back.
    for f in dump.rglob("*"):
        if f.is_file():
            assert not f.name.startswith("."), f
    assert_visible_files_complete(dump)
    # The same job under the same limit without opdump: same result (so the
    # limit is opdump's to hit, not the job's).
    ref = subprocess.run([sys.executable, str(script)], env=clean_env(TESTJOB_LIB=LIB),
                         capture_output=True, text=True, preexec_fn=small_files, timeout=300)
    assert ref.returncode == 0, ref.stderr
    last = [json.loads(r.stdout.strip().splitlines()[-1]) for r in (ref, p)]
    assert last[0]["sum"] == last[1]["sum"]


# ---------------------------------------------------------------------------
# 4. Dump directories opdump must not trust
# ---------------------------------------------------------------------------

DIR_JOB = """
import json, os
import torch
torch.ops.load_library(os.environ["TESTJOB_LIB"])
torch.ops.opdump.enable()
x = torch.arange(12.0).reshape(3, 4)
y = (x * 2).sum(0).relu()
torch.ops.opdump.flush()
print(json.dumps({"y": y.tolist(), "stats": torch.ops.opdump.stats(), "euid": os.geteuid()}))
"""
DIR_RESULT = [24.0, 30.0, 36.0, 42.0]


def _other_user():
    """A user that is not the one running the tests: (uid, gid)."""
    for name in ("nobody", "daemon"):
        try:
            pw = pwd.getpwnam(name)
        except KeyError:
            continue
        if pw.pw_uid != os.geteuid():
            return pw.pw_uid, pw.pw_gid
    return None


@pytest.fixture
def shared():
    """A directory every user can read, for jobs run as another user (the
    test's tmp_path is private to root)."""
    d = Path(tempfile.mkdtemp(prefix="opdump-hostile-", dir="/tmp"))
    d.chmod(0o755)
    (d / "job.py").write_text(DIR_JOB)
    (d / "job.py").chmod(0o644)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def becomes(user):
    """A preexec_fn that switches the child to `user` ((uid, gid)), or None."""
    if user is None:
        return None

    def become():
        os.setgroups([])
        os.setgid(user[1])
        os.setuid(user[0])

    return become


@functools.cache
def interpreter_for(user):
    """(python, extra PYTHONPATH) that `user` can run with this torch: the
    venv's interpreter may live where only root can read it (/root/.pyenv);
    then a system Python of the same version with the venv's site-packages."""
    site_dirs = [d for d in sys.path if d.endswith("site-packages")]
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    for python, path in ((sys.executable, []), (f"/usr/bin/python{version}", site_dirs),
                         (f"/usr/local/bin/python{version}", site_dirs)):
        if not os.path.exists(python):
            continue
        env = clean_env(HOME="/tmp")
        env["PYTHONPATH"] = os.pathsep.join(path + [str(ROOT)])
        try:
            probe = subprocess.run([python, "-s", "-c", "import torch"], env=env, capture_output=True,
                                   preexec_fn=becomes(user), cwd="/", timeout=300)
        except OSError:  # the user may not run this interpreter
            continue
        if probe.returncode == 0:
            return python, path
    return None


def run_dir_job(shared, dump=None, user=None, cwd=None):
    """Runs DIR_JOB with OPDUMP_DIR=dump (unset: the default ./opdump), as
    `user` ((uid, gid), or the current user)."""
    found = interpreter_for(user)
    if found is None:
        pytest.skip(f"no Python with this torch that uid {user[0]} may run (the venv's lives in a private directory)")
    python, path = found
    env = clean_env(TESTJOB_LIB=LIB, HOME=str(shared))
    env["PYTHONPATH"] = os.pathsep.join(path + [str(ROOT)])
    if dump is not None:
        env["OPDUMP_DIR"] = str(dump)
    p = subprocess.run([python, "-s", str(shared / "job.py")], env=env, capture_output=True, text=True,
                       preexec_fn=becomes(user), cwd=cwd or shared, timeout=300)
    assert p.returncode == 0, p.stderr
    r = json.loads(p.stdout.strip().splitlines()[-1])
    assert r["y"] == DIR_RESULT, "the job's result changed"
    return r, opdump_lines(p.stderr)


def non_root_user():
    """The user a permission test runs its job as: never root, who bypasses
    permission checks."""
    if not IS_ROOT:
        return None  # the current user already is not root
    other = _other_user()
    if other is None:
        pytest.skip("running as root and no unprivileged user (nobody, daemon) exists to run the job as")
    return other


def chown(path, user):
    if user is not None:
        os.chown(path, user[0], user[1])


def test_world_writable_dump_dir_is_refused(shared):
    user = non_root_user()
    dump = shared / "open-to-all"
    dump.mkdir()
    chown(dump, user)
    dump.chmod(0o777)  # no sticky bit
    r, lines = run_dir_job(shared, dump, user)
    assert r["euid"] != 0
    assert r["stats"] == [0, 0, 0], "dumping stays off"
    assert len(lines) == 1, lines
    line = lines[0]
    assert f"OPDUMP_DIR={dump}" in line and "writable by other users" in line and "0777" in line, line
    assert "chmod" in line and "Dumping stays off" in line, line
    assert list(dump.iterdir()) == [], "nothing may be written into a refused directory"


def test_sticky_dump_dir_of_our_own_is_accepted(shared):
    user = non_root_user()
    dump = shared / "sticky"
    dump.mkdir()
    chown(dump, user)
    dump.chmod(0o1777)
    r, lines = run_dir_job(shared, dump, user)
    assert r["stats"][0] > 0 and lines == [], (r, lines)
    assert visible(dump)
    assert_visible_files_complete(dump)


def test_dump_dir_of_another_user_is_refused(shared):
    """Root can write anywhere, so an access() check passes: the owner must
    be compared with the job's effective uid. And an unprivileged job must
    not take a sticky, world-writable directory of root's (as /tmp itself)."""
    if not IS_ROOT:
        pytest.skip("needs root to give a directory to another user")
    other = _other_user()
    if other is None:
        pytest.skip("running as root and no other user (nobody, daemon) to own the directory")
    # A job that runs as root, and the directory of an unprivileged user.
    theirs = shared / "theirs"
    theirs.mkdir()
    os.chown(theirs, *other)
    theirs.chmod(0o755)
    r, lines = run_dir_job(shared, theirs)
    assert r["euid"] == 0
    assert r["stats"] == [0, 0, 0], "dumping stays off"
    assert len(lines) == 1, lines
    assert f"OPDUMP_DIR={theirs}" in lines[0] and "owned by another user" in lines[0], lines
    assert f"uid {other[0]}" in lines[0] and "Dumping stays off" in lines[0], lines
    assert list(theirs.iterdir()) == []
    # An unprivileged job, and root's sticky, world-writable directory.
    roots = shared / "roots"
    roots.mkdir()
    roots.chmod(0o1777)
    r, lines = run_dir_job(shared, roots, other)
    assert r["euid"] == other[0]
    assert r["stats"] == [0, 0, 0], "dumping stays off"
    assert len(lines) == 1 and f"OPDUMP_DIR={roots}" in lines[0] and "owned by another user" in lines[0], lines
    assert list(roots.iterdir()) == []


def test_default_dir_in_a_shared_working_directory(shared):
    """The default ./opdump in a sticky, world-writable working directory
    such as /tmp: an `opdump` that another user created there first does not
    get the dump; with no such plant the job makes its own, private one."""
    if not IS_ROOT:
        pytest.skip("needs root to plant a directory owned by another user")
    user = non_root_user()
    work = shared / "tmp-like"
    work.mkdir()
    work.chmod(0o1777)
    planted = work / "opdump"
    planted.mkdir()
    planted.chmod(0o777)  # root's, open to all: the job's user did not make it
    r, lines = run_dir_job(shared, None, user, cwd=work)
    assert r["stats"] == [0, 0, 0], (r, lines)
    assert len(lines) == 1 and f"OPDUMP_DIR={planted}" in lines[0], lines
    assert "owned by another user" in lines[0], lines
    assert list(planted.iterdir()) == []
    # Without the plant the job creates its own, private ./opdump.
    planted.rmdir()
    r, lines = run_dir_job(shared, None, user, cwd=work)
    assert r["stats"][0] > 0 and lines == [], (r, lines)
    assert (planted.stat().st_mode & 0o777) == 0o700
    assert planted.stat().st_uid == user[0]
    assert visible(planted)


def test_planted_rank_link_is_not_followed(shared):
    user = non_root_user()
    dump, elsewhere = shared / "dump", shared / "elsewhere"
    for d in (dump, elsewhere):
        d.mkdir()
        chown(d, user)
        d.chmod(0o700)
    (dump / "rank=0").symlink_to(elsewhere)
    os.lchown(dump / "rank=0", *(user or (os.geteuid(), os.getegid())))
    r, lines = run_dir_job(shared, dump, user)
    assert list(elsewhere.rglob("*")) == [], "opdump followed the planted link"
    # The link is refused at the first record, with one line; the loss is counted.
    warn = [l for l in lines if "writing the dump failed" in l]
    assert len(warn) == 1, lines
    assert "rank=0" in warn[0] and "symbolic link" in warn[0], warn[0]
    assert r["stats"][0] == 0 and r["stats"][2] > 0, r
    assert lost_in_report(lines) == r["stats"][2]
    assert (dump / "rank=0").is_symlink()
