"""Every message a user can meet names its cause and the next step.

Each catalogued line of docs/guide/troubleshooting.md ("Every message, and
what to do") is caused for real here, caused by a named test elsewhere, or
listed with the reason no test can cause it. The catalogue is also checked
against the code both ways, so that neither can change without the other."""

import os
import re
import shutil
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from conftest import CLI, CORE, LIB, ROOT, clean_env

PAGE = ROOT / "docs" / "guide" / "troubleshooting.md"
SECTION = "## Every message, and what to do"

# ---------------------------------------------------------------------------
# The messages in the code: the literals at the places that print or return
# a message for a user.
# ---------------------------------------------------------------------------

_SAY = r"\b(?:say|warn|fail|internal_error|eprintln!|bail!|CliError::new|Error::new|Error::format|Error::other)\s*\("
_PLUGIN = _SAY + r"|\bErr\(\s*format!\s*\(|\bpush\(\s*format!\s*\(|\bformat!\((?=\s*\"\{name\} is not an opdump)"
_DISPLAY = r"|\bwrite!\s*\(\s*f\s*,"
_PYTHON = r"\b(?:SystemExit|OpdumpError|_say|print)\s*\("

EMITTERS = {
    "crates/engine/src/**/*.rs": _PLUGIN,
    "crates/preload/src/*.rs": _PLUGIN,
    "crates/fsguard/src/lib.rs": _PLUGIN + _DISPLAY,
    "crates/format/src/error.rs": _SAY + _DISPLAY,
    "crates/format/src/reader.rs": _SAY,
    "crates/format/src/regular.rs": _SAY,
    "crates/load/src/*.rs": _SAY,
    "crates/cli/src/**/*.rs": _SAY,
    "cpp/*/*.cpp": _SAY,
    "python/opdump/*.py": _PYTHON,
}

# Lines printed for a user that this page does not list: internal, each
# with why (matched as the start of a piece of the message).
INTERNAL = {
    "internal error": "a bug inside opdump, printed within the catalogued 'opdump switches itself off' line",
    "measuring the inputs of": "the C++ side's internal error, printed within the 'switches itself off' line",
    "measuring the outputs of": "the C++ side's internal error, printed within the 'switches itself off' line",
    "following the memory of": "the C++ side's internal error, printed within the 'switches itself off' line",
    "registration failed": "the C++ side's internal error, printed within the 'switches itself off' line",
    "following re-allocated memory failed":
        "remember_uninitialized failing on a plain tensor; only out of memory reaches it",
    "too many distinct dtypes": "an invariant of the loader (dtypes are interned in 16 bits); no file reaches it",
    "statistics columns miscounted": "an invariant of the loader; no file reaches it",
    "no file holds the spilled chunks": "an invariant of the loader's spill file; no file reaches it",
    "cannot compress a chunk of the dump": "snappy fails only on an output buffer the loader sizes itself",
    "no files of rank": "compare and summary check --rank first and print 'no rank <r> (ranks present ...)'",
    "a file name holds a NUL byte": "paths come from argv and the environment, which cannot hold a NUL byte",
    "timing:": "OPDUMP_TIMINGS=1 benchmark output on stderr, not an error",
    "exited with status": "opdump.compare() raises it only when the command printed no opdump: line",
    "printed no JSON report": "opdump.compare() raises it only when the command printed no report at all",
    "printed JSON that is no report": "opdump.compare() raises it only when the command printed no report at all",
    "an invalid number of": "a value filling the 'corrupt footer' line, not a line of its own",
    "call.json": "serde_json failing on a struct of plain values it serialises; no input reaches it",
    "the thread decoding the dump's files stopped":
        "the loader's decoding thread ended without sending an error or the file's end: only a panic in it (a bug)",
}


def _literal_end(text, i):
    j = i + 1
    while text[j] != '"':
        j += 2 if text[j] == "\\" else 1
    return j + 1


def _unescape(body):
    body = re.sub(r"\\\n\s*", "", body)  # Rust's line continuation
    return body.replace('\\"', '"').replace("\\\\", "\\").replace("\\n", "\n")


def _literals_of_call(text, start):
    """The string literals of the call whose '(' ends at `start`, C++'s
    adjacent literals joined as the compiler joins them."""
    depth, i, parts, last_end = 1, start, [], None
    while depth and i < len(text):
        c = text[i]
        if c == '"':
            end = _literal_end(text, i)
            body = _unescape(text[i + 1:end - 1])
            if parts and text[last_end:i].strip() == "":
                parts[-1] += body
            else:
                parts.append(body)
            last_end, i = end, end
            continue
        if c == "'" and re.match(r"'(\\.|[^'\\])'", text[i:i + 4]):
            i = text.index("'", i + 2) + 1
            continue
        depth += {"(": 1, ")": -1}.get(c, 0)
        i += 1
    return parts


def _shipped(path):
    text = path.read_text()
    # A Rust file's unit tests (the module at its end) print nothing for a user.
    return re.split(r"#\[cfg\(test\)\]\s*mod tests", text)[0] if path.suffix == ".rs" else text


def code_messages():
    """(where, literal) of every message literal at an emission site."""
    found = []
    for pattern, emitters in EMITTERS.items():
        for path in sorted(ROOT.glob(pattern)):
            text = _shipped(path)
            for m in re.finditer(emitters, text):
                literals = _literals_of_call(text, m.end())
                if m.group(0).startswith("print") and not (literals and literals[0].startswith("opdump:")):
                    continue  # `python -m opdump info` and usage output
                line = text.count("\n", 0, m.start()) + 1
                found += [(f"{path.relative_to(ROOT)}:{line}", lit) for lit in literals]
    return found


def all_sources():
    """The scanned sources as one text, with each literal split over lines
    (Rust's continuation, C++'s adjacent literals) joined and quotes
    unescaped, so that a message's fixed text reads as printed."""
    text = "\n".join(_shipped(path) for pattern in EMITTERS for path in ROOT.glob(pattern))
    text = re.sub(r"\\\n\s*", "", text)
    text = re.sub(r'"\s*\n\s*"', "", text)
    return text.replace('\\"', '"')


def pieces(message, placeholder):
    """The fixed text of a message between its placeholders, long enough to
    be searched for."""
    return [p.strip(" :;,.") for p in re.split(placeholder, message) if len(p.strip(" :;,.")) >= 8]


# ---------------------------------------------------------------------------
# The catalogue.
# ---------------------------------------------------------------------------

def catalogue_text():
    text = PAGE.read_text()
    assert SECTION in text, f"{PAGE} has no section {SECTION!r}"
    return text.split(SECTION, 1)[1]


def catalogued():
    """The message texts of the catalogue: code spans that start with
    `opdump: `, and the first span of each indented item (a variant of the
    line above it)."""
    spans = []
    for line in catalogue_text().splitlines():
        for _, body in re.findall(r"(`+)(.+?)\1", line):
            body = body.strip()
            if body.startswith("opdump: "):
                spans.append(body[len("opdump: "):])
        m = re.match(r"\s+- (`+)(.+?)\1", line)
        if m:
            spans.append(m.group(2).strip())
    return spans


def test_each_catalogued_message_has_a_cause_and_a_next_step():
    items = [l for l in catalogue_text().splitlines() if l.startswith("- ")]
    assert len(items) > 50
    for item in items:
        assert ("**Cause:**" in item and "**Next:**" in item) or "see [" in item, item


def test_every_catalogued_message_is_in_the_code():
    literals = all_sources()
    for message in catalogued():
        for piece in pieces(message, r"<[^>]*>|…"):
            if piece in literals:
                continue
            # A line joined from two literals ("{problem}. Dumping stays off").
            for part in pieces(piece, r"(?<=\.) |(?<=;) "):
                assert part in literals, f"the catalogue's {message!r}: {part!r} is in no message of the code"


def test_every_message_in_the_code_is_catalogued():
    page = catalogue_text()
    missing = []
    for where, literal in code_messages():
        for piece in pieces(literal, r"\{[^{}]*\}"):
            if piece.startswith("opdump:"):
                piece = piece[len("opdump:"):].strip()
            if len(piece) < 8 or piece in page or any(piece.startswith(k) for k in INTERNAL):
                continue
            missing.append(f"{where}: {piece!r}")
    assert not missing, "messages neither in " + str(PAGE) + " nor in INTERNAL:\n" + "\n".join(missing)


def test_the_scan_finds_the_messages_it_should():
    """The scan of the code is what the two tests above stand on: it must
    see the lines of each side (plugin, C++, command, Python)."""
    found = "\n".join(lit for _, lit in code_messages())
    for known in ["writing the dump failed", "is not valid: ", "is not a directory; set OPDUMP_DIR",
                  "carries cores for torch", "another copy of opdump is already loaded",
                  "dump schema version", "no phase (forward, backward, optimizer) in common",
                  "only rank", "holds no capture of", "--set ", "cannot load "]:
        assert known in found, known


# ---------------------------------------------------------------------------
# Reachability: where each catalogued message is caused.
# ---------------------------------------------------------------------------

# Caused by another test: catalogue key -> (the test file, the text it asserts).
ELSEWHERE = {
    "runs one call against the same call": ("crates/cli/tests/cli/verdict_text.rs",
                                            "runs one call against the same call"),
    "give the directory of a dump you made": ("tests/test_online.py", "is writable by other users"),
    "this run is dumped without comparing": ("tests/test_online.py", "this run is dumped without comparing"),
    "This run is dumped without comparing": ("tests/test_online.py", "this run is dumped without comparing"),
    "introduced a divergence from OPDUMP_REFERENCE": ("tests/test_online.py",
                                                      "introduced a divergence from OPDUMP_REFERENCE"),
    "is off at": ("tests/test_online.py", " is off at "),
    "the process exits with status 1": ("tests/test_online.py", "the process exits with status 1"),
    "another copy of opdump is already loaded": ("tests/test_loading.py", "another copy of opdump is already loaded"),
    "this opdump was built for torch": ("tests/test_loading.py", "built for torch"),
    "is a symbolic link": ("tests/test_hostile.py", "symbolic link"),
    # A file at OPDUMP_DIR reads "cannot be created (File exists)": fsguard
    # creates the directory first. Its unit test reaches NotDirectory.
    "is not a directory; set OPDUMP_DIR": ("crates/fsguard/tests/fsguard/directories.rs", "DirProblem::NotDirectory"),
    "descriptor <n> no longer refers": ("tests/test_hostile.py", "no longer refers"),
    "is no longer the file opdump wrote": ("crates/fsguard/tests/fsguard/descriptors.rs",
                                           "no longer the file opdump wrote"),
    "corrupt footer": ("crates/cli/tests/cli/hostile_input.rs", "corrupt footer"),
    "fails its checksum": ("crates/cli/tests/cli/probe_files.rs", '"checksum"'),
    "not a file of check results opdump wrote": ("crates/cli/tests/cli/probe_files.rs", "larger than"),
    "not a regular file": ("crates/cli/tests/cli/hostile_input.rs", "not a regular file"),
    "its own ancestor": ("crates/cli/tests/cli/hostile_input.rs", "its own ancestor"),
    "is not a device name": ("tests/test_repro_hostile.py", "not a device name"),
    "not a readable capture file": ("tests/test_repro_hostile.py", "not a readable capture file"),
    "not of its call": ("tests/test_repro_hostile.py", "not of its call"),
    "<folder> <why>; remove it": ("tests/test_repro_hostile.py", '"symbolic link", "--out"'),
    "no fingerprint column": ("crates/cli/tests/cli/ranks.rs", "no fingerprint column"),
    "cannot be compared": ("crates/cli/tests/cli/ranks.rs", "cannot be compared"),
    "cannot run <opdump command>": ("tests/test_package_errors.py", "cannot run"),
    "no check results (no checks": ("tests/test_check_cli.py", "run the job with OPDUMP_CHECK=1"),
    "pass the dump directory (OPDUMP_DIR of the job)": ("tests/test_check_cli.py", "pass the dump directory"),
    "no check results of rank": ("tests/test_check_cli.py", "no check results of rank 5"),
    "not a line opdump wrote": ("tests/test_check_cli.py", "not a line opdump wrote"),
    "the rank of a rank=<R> directory": ("tests/test_check_cli.py", "must be a decimal number"),
    "pass a check's capture file": ("tests/test_check_cli.py", "not in a checks/rank=<R>/ directory"),
    "names this capture file": ("tests/test_check_cli.py", "names this capture file"),
    "the check's device": ("tests/test_check_cli.py", "is no device name"),
    "the opdump command is not installed": ("tests/test_package_errors.py", "not installed"),
    "checked against float64 on the CPU": ("tests/test_check.py", "OPDUMP_CHECK:"),
    "OPDUMP_CHECK_SECONDS=<s> spent": ("tests/test_check.py", "OPDUMP_CHECK_SECONDS="),
    "of them checks again in later steps": ("tests/test_check_list_ops.py", "of them checks again in later steps"),
    "results could not be written": ("tests/test_check.py", "results could not be written"),
    "OPDUMP_CHECK matched no recorded op call": ("tests/test_check.py", "OPDUMP_CHECK matched no recorded op call"),
    "cannot write the accuracy check's results": ("tests/test_check.py", "cannot write the accuracy check's results"),
}

# What no test here or elsewhere causes, and why.
NOT_CAUSED = {
    "is not writable": "the suite runs as root in CI, and root may write any directory",
    "cannot be opened": "needs a directory that exists and that open() refuses; root opens any",
    "cannot tell the version of the torch": "needs a hand-built libtorch with no version file; "
                                            "crates/preload/src/cores.rs tests the wording",
    "cannot load <core>": "needs a core built against another torch's C++ ABI",
    "cannot find where libopdump.so was loaded from": "needs a library mapped from memory, not from a file",
    "the module hooks could not be installed": "needs a torch whose global module hook API fails",
    "no <libopdump.so> in": "a clone always has its build to fall back on; only a broken installed wheel lacks it",
    "this opdump package carries no libopdump.so": "as above: needs a broken installed wheel",
    "the writer did not finish within 60 s": "needs a disk that hangs for a minute at exit",
    "cannot start the writer thread": "needs the system to refuse a thread; root ignores RLIMIT_NPROC",
    "<internal error>": "a bug in opdump; by design no input causes it",
    "cannot decode this file": "needs a file the Parquet reader panics on; the fuzzed files of "
                               "crates/cli/tests/cli/hostile_input.rs give ordinary errors today",
    "column <name> is missing": "a Parquet file with opdump's footer but not its columns, which is refused "
                                "for its schema first unless made column by column",
    "has unexpected type": "as above: a column of opdump's name with another type",
    "cannot write the temporary file": "as for the temporary file that cannot be created",
    "cannot create a temporary file": "the loader spills only dumps larger than it keeps in memory",
    "cannot read capture file": "needs a capture file that the dump names and that cannot be opened while "
                                "the dump itself can be read",
    "no parameter or gradient rows": "a Python job always names its parameters; needs a C++-only job",
    "none with a fingerprint": "needs a multi-rank job written with OPDUMP_SKETCH=0 (the gloo job of "
                               "test_ranks.py, too slow for this file)",
    "nothing compared": "needs ranks that record disjoint steps of a gloo job (too slow for this file)",
    "no name column": "needs a multi-rank dump of schema 1",
    "<path>: <OS error>": "the OS error of a path the user named; no fixed text to assert",
    "device statistics have not come back": "device path: needs a stalled accelerator stream",
    "device tensors not measured": "device path: needs a results pool that fills on an accelerator",
    "device statistics did not all come back": "device path: needs an accelerator that hangs at exit",
    "waiting for device statistics failed": "device path: needs an accelerator that reports an error",
    "sending device statistics to the host failed": "device path: needs an accelerator that reports an error",
    "reading held device tensors failed": "device path: needs an accelerator that reports an error, "
    "or a batch kernel that breaks its contract",
    "reading held device tensors before a write failed": "device path: needs an accelerator that reports an error",
    "closing device batches failed": "device path: needs an accelerator that reports an error",
    "cannot find cudaStreamIsCapturing": "device path: needs a CUDA build of torch without the symbol",
    "capturing the inputs of": "device path: needs a device copy that fails",
    "the working directory cannot be opened": "needs a working directory removed under the command",
    "has no calls of rank": "needs a reference with fewer steps than the run; tests/test_online.py's "
                            "references have all of them",
    "the headline is": "needs a later call ten times further beyond its allowance than the first; the rule is "
                       "the judge's (crates/judge, compare::headline)",
    "the CPU check of the call online compare named did not finish": "needs a CPU run of one call that takes a minute",
    "did not come within 30 s of the step's end": "needs a judge that takes half a minute for one step",
    "arrived after their step was judged": "needs a call that spans a step's end on a thread of the job's own; "
                                           "tests/test_online.py's two-step runs check that TinyLM has none",
    "queue (4 x OPDUMP_CHECK_MAX_BYTES=<n>) was full": "needs a signature whose every call finds the checking "
                                                  "thread's queue full; the count is tested in crates/engine",
    "checks unfinished at exit": "needs checks still queued after a minute at exit",
    "s in all for room in the checking thread's queue": ("tests/test_check_skipped.py",
                                                         "for room in the checking thread's queue"),
    "writing the capture file of a failed check": "needs a disk that refuses the capture file but not the line "
                                                   "before it",
    "the accuracy check of <op> could not copy": "device path: needs a device copy that fails",
    "the partition device=": "needs a dump whose partition directory names no device; opdump never writes one",
}

# Caused by a test below: catalogue key -> (text of the cause in the line as
# printed, text of the next step in the same line).
CAUSED = {
    # the plugin's configuration
    "is not valid": ('OPDUMP_STEPS="x" is not valid', "use numbers and ranges such as 0-2,10"),
    "dumping stays off until the values above are fixed": ("stays off until the values above", "are fixed"),
    "is not an opdump variable": ("OPDUMP_DIRR is not an opdump variable", "did you mean OPDUMP_DIR?"),
    "enable() ignored": ("enable() ignored", "fix the OPDUMP_* values reported at load first"),
    "is writable by other users": ("is writable by other users", "use a directory only you can write, or chmod"),
    "is owned by another user": ("is owned by another user", "use a directory you own"),
    "cannot be created": ("cannot be created", "set OPDUMP_DIR to a writable directory"),
    "carries cores for torch": ("carries cores for torch 9.9.9 only", "Install torch 9.9.9 or an opdump built for"),
    "cannot load <lib>": ("missing.so", "Check that the file exists and was built for this torch"),
    "--set <item>": ("--set 'QUEUE'", "expected OPDUMP_NAME=VALUE, e.g. --set OPDUMP_QUEUE=65536"),
    "cannot run <command>": ("no-such-command", "check the command after --"),
    # writing
    "writing the dump failed": ("writing the dump failed", "free space (or raise the limit) under OPDUMP_DIR"),
    "lost (write failures)": ("lost (write failures)", "To drop none, set OPDUMP_QUEUE_FULL=block"),
    "the writer has not taken a record": ("the writer has not taken a record", "Point OPDUMP_DIR at a faster disk"),
    "OPDUMP_MAX_RECORDS=<N> reached": ("OPDUMP_MAX_RECORDS=3 reached", "To record more, raise it"),
    # capture
    "OPDUMP_CAPTURE matched no recorded call": ("OPDUMP_CAPTURE matched no recorded call",
                                                "hold for a run with the same settings"),
    "captured <n> op call": ("OPDUMP_CAPTURE_MAX_BYTES=1 reached", "raise it to capture them"),
    "writing a capture file failed": ("writing a capture file failed", "Free space under OPDUMP_DIR"),
    # reading and comparing
    "no opdump files here": ("no opdump files here", "name the OPDUMP_DIR of a run that recorded"),
    "is too old": ("schema version 0 is too old", "dump the job again with this opdump"),
    "is newer than this opdump": ("schema version 9 is newer", "compare it with the opdump that wrote it"),
    "not an opdump file": ("not an opdump file", "point opdump at a directory opdump wrote"),
    "bad opdump.schema_version": ('bad opdump.schema_version "four"', "move it out of the dump directory"),
    "bad <key> <value>": ('bad opdump.rows "many"', "the file is damaged: move it out of the dump directory"),
    "bad partition directory": ('bad partition directory rank="abc"', "move it out of the dump directory"),
    "appears twice in rank": ("appears twice in rank 0", "give each run its own OPDUMP_DIR"),
    "holds no op calls": ("dump A holds no op calls", "run its job with OPDUMP=1"),
    "no op calls in the selected steps": ("no op calls in the selected steps", "pass --steps within those"),
    "no phase (forward, backward, optimizer) in common": ("no phase (forward, backward, optimizer) in common",
                                                          "dump the same steps and ops on both sides"),
    "look like different programs": ("look like different programs", "use --force to compare anyway"),
    "no rank <r> (ranks present": ("no rank 7 (ranks present: 0)", "choose one of those with --rank"),
    "the dumps share no rank (A has <ranks>, B has <ranks>); choose one": ("share no rank (A has 0, B has 1)",
                                                                           "choose one with --rank"),
    "the dumps share no rank (A has <ranks>, B has <ranks>); dump the same": ("share no rank (A has 0, B has 1)",
                                                                              "name ranks both have with --rank"),
    "--out writes one rank pair's tables": ("--out writes one rank pair's tables", "choose one rank with --rank N"),
    "--steps <value>": ('--steps "x"', "expected steps like 3, 0-2 or 0-2,5"),
    "--ignore <value>": ('--ignore "("', "--ignore takes a regular expression"),
    "--rtol <value>": ('--rtol "float32"', "expected DTYPE=VALUE, e.g. bfloat16=0.05"),
    "--min-amplification": ("--min-amplification", "must be a number >= 1"),
    "writing to stdout": ("writing to stdout", "redirect it to a file on a disk with space"),
    "only rank <r> has files": ("only rank 0 has files", "compares the ranks of one data-parallel job"),
    # repro
    "no op introduced a divergence": ("no op introduced a divergence", "name the call to reproduce with --call"),
    "names every call inside a module": ("names every call inside a module", "name one call, e.g."),
    "no recorded call": ("no recorded call aten::mm#99", "it counts recorded calls of that op"),
    "--call: <why>": ("--call: ", "write aten::gelu#0"),
    "holds no capture of": ("holds no capture of aten::mm", "run its job again with OPDUMP_CAPTURE='aten::mm"),
    "has no aligned call in B": ("has no aligned call in B", "choose a call that `opdump compare` shows"),
}


def _located(message):
    """The table that says where `message` is caused, and its key."""
    for table in (CAUSED, ELSEWHERE, NOT_CAUSED):
        for key in table:
            if key in message:
                return table, key
    return None, None


def test_every_catalogued_message_is_accounted_for():
    for message in catalogued():
        table, key = _located(message)
        assert table is not None, f"{message!r}: caused nowhere and not listed as uncausable"
        if table is ELSEWHERE:
            where, phrase = ELSEWHERE[key]
            assert phrase in (ROOT / where).read_text(), f"{where} no longer asserts {phrase!r}"


def says(stderr, cause, advice):
    """One `opdump:` line holds both the cause and the advice."""
    lines = [l for l in stderr.splitlines() if l.startswith("opdump:")]
    assert any(cause in l and advice in l for l in lines), (
        f"no opdump: line with {cause!r} and {advice!r} in:\n{stderr}")


def caused(stderr, *keys):
    for key in keys:
        says(stderr, *CAUSED[key])


# The package's source, for `import opdump` and `python -m opdump`.
PACKAGE = ROOT / "python"


def job(tmp_path, code, *, load=True, preexec=None, **env):
    """Runs `code` (with the plugin loaded first unless `load` is false) in
    a fresh process; returns its stderr."""
    script = tmp_path / "job.py"
    head = "import json, os, sys\nimport torch\n" + (f"torch.ops.load_library({str(LIB)!r})\n" if load else "")
    script.write_text(head + code)
    env.setdefault("OPDUMP_DIR", tmp_path / "dump")
    p = subprocess.run([sys.executable, str(script)], env=clean_env(**env), capture_output=True, text=True,
                       timeout=300, cwd=tmp_path, preexec_fn=preexec)
    assert p.returncode == 0, p.stderr
    return p.stderr


def test_bad_configuration(tmp_path):
    err = job(tmp_path, "print(torch.ops.opdump.enable())\n", OPDUMP_STEPS="x", OPDUMP_DIRR="/tmp/x")
    caused(err, "is not valid", "dumping stays off until the values above are fixed", "is not an opdump variable",
           "enable() ignored")


@pytest.mark.parametrize("key", ["is writable by other users", "is owned by another user", "cannot be created"])
def test_refused_dump_directories(tmp_path, key):
    dump = tmp_path / "dump"
    if key == "cannot be created":
        dump.write_text("a file")
    else:
        dump.mkdir()
        os.chmod(dump, 0o777)
        if key == "is owned by another user":
            if os.geteuid() != 0:
                pytest.skip("giving a directory to another user needs root")
            os.chmod(dump, 0o700)
            os.chown(dump, 4242, 4242)
    err = job(tmp_path, "torch.ops.opdump.enable()\ntorch.ones(3).add(1)\n", OPDUMP_DIR=dump)
    caused(err, key)
    says(err, CAUSED[key][0], "Dumping stays off")


def test_no_core_for_this_torch_and_a_bad_library_path(tmp_path):
    # A wheel's layout with a core for a torch that does not exist.
    wheel = tmp_path / "wheel"
    (wheel / "torch-9.9.9").mkdir(parents=True)
    shutil.copy(LIB, wheel / LIB.name)
    shutil.copy(CORE, wheel / "torch-9.9.9" / CORE.name)
    err = job(tmp_path, f"""
import opdump
print(opdump.load({str(tmp_path / 'missing.so')!r}))
torch.ops.load_library({str(wheel / LIB.name)!r})
""", load=False, PYTHONPATH=PACKAGE)
    caused(err, "carries cores for torch", "cannot load <lib>")


def test_python_run_wrapper(tmp_path):
    def wrapper(*args):
        return subprocess.run([sys.executable, "-m", "opdump", "run", *args], env=clean_env(PYTHONPATH=PACKAGE),
                              capture_output=True, text=True, timeout=60, cwd=tmp_path)

    p = wrapper("--set", "QUEUE", "--", "true")
    assert p.returncode != 0
    caused(p.stderr, "--set <item>")
    p = wrapper("--", str(tmp_path / "no-such-command"))
    assert p.returncode == 127
    caused(p.stderr, "cannot run <command>")


def test_full_disk_and_its_capture_file(tmp_path):
    import resource

    limit = 32 * 1024

    def small_files():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    err = job(tmp_path, """
x = torch.randn(64, 64)
for i in range(1500):
    x = torch.tanh(x @ x * 0.01)
""", preexec=small_files, OPDUMP=1, OPDUMP_ROTATE_SECS=1, OPDUMP_CAPTURE="aten::mm#0;aten::mm#1")
    caused(err, "writing the dump failed", "lost (write failures)", "writing a capture file failed")


def test_a_writer_that_falls_behind(tmp_path):
    err = job(tmp_path, """
x = torch.ones(4)
for i in range(3000):
    x = x.add(1)
""", OPDUMP=1, OPDUMP_QUEUE=1, OPDUMP_QUEUE_WAIT_MS=0)
    caused(err, "the writer has not taken a record")
    says(err, "dropped (channel full)", CAUSED["lost (write failures)"][1])


def test_record_cap_and_a_capture_that_matches_nothing(tmp_path):
    err = job(tmp_path, "x = torch.ones(4)\nfor i in range(10):\n    x = x.add(1)\n",
              OPDUMP=1, OPDUMP_MAX_RECORDS=3, OPDUMP_CAPTURE="aten::gelu#0")
    caused(err, "OPDUMP_MAX_RECORDS=<N> reached", "OPDUMP_CAPTURE matched no recorded call")


def test_capture_byte_cap(tmp_path):
    err = job(tmp_path, "x = torch.ones(64)\nfor i in range(3):\n    x = x.mul(2)\n",
              OPDUMP=1, OPDUMP_CAPTURE="aten::mul#0;aten::mul#1", OPDUMP_CAPTURE_MAX_BYTES=1)
    caused(err, "captured <n> op call")


# --- the command, on real dumps ------------------------------------------

PROGRAM_A = """
x = torch.randn(8, 8)
for i in range(3):
    x = (x @ x).relu() * 0.1
"""
PROGRAM_B = """
y = torch.ones(16)
for i in range(6):
    y = torch.sin(y).cos().exp()
"""


@pytest.fixture(scope="module")
def dumps(tmp_path_factory):
    """Dump A (rank 0) and dump B, another program on rank 1."""
    base = tmp_path_factory.mktemp("dumps")
    for name, code, rank in [("a", PROGRAM_A, 0), ("b", PROGRAM_B, 1)]:
        work = base / f"job-{name}"
        work.mkdir()
        job(work, code, OPDUMP=1, OPDUMP_DIR=base / name, RANK=rank)
    return base


def opdump(*args, cwd=None, stdout=subprocess.PIPE):
    p = subprocess.run([str(CLI), *map(str, args)], env=clean_env(), stdout=stdout, stderr=subprocess.PIPE,
                       text=True, timeout=120, cwd=cwd)
    assert p.returncode == 2, f"status {p.returncode}: {p.stderr}"
    assert len(p.stderr.splitlines()) == 1, p.stderr
    return p.stderr


def one_file(dump):
    files = sorted(dump.rglob("part-*.parquet"))
    assert files, dump
    return files[0]


def copy_with_metadata(dump, tmp_path, change):
    """A copy of `dump` whose first file's footer metadata `change` edits."""
    out = tmp_path / "changed"
    shutil.copytree(dump, out)
    f = one_file(out)
    table = pq.read_table(f)
    meta = dict(pq.read_metadata(f).metadata)
    change(meta)
    pq.write_table(table.replace_schema_metadata(meta), f)
    return out


def test_dumps_of_other_schema_versions_and_other_files(dumps, tmp_path):
    a = dumps / "a"
    for version, key in [(b"0", "is too old"), (b"9", "is newer than this opdump"),
                         (b"four", "bad opdump.schema_version")]:
        d = copy_with_metadata(a, tmp_path / version.decode(),
                               lambda m, version=version: m.update({b"opdump.schema_version": version}))
        caused(opdump("summary", d), key)
    d = copy_with_metadata(a, tmp_path / "rows", lambda m: m.update({b"opdump.rows": b"many"}))
    caused(opdump("summary", d), "bad <key> <value>")
    d = copy_with_metadata(a, tmp_path / "none", lambda m: m.pop(b"opdump.schema_version"))
    caused(opdump("summary", d), "not an opdump file")
    (tmp_path / "empty").mkdir()
    caused(opdump("summary", tmp_path / "empty"), "no opdump files here")


def test_files_that_do_not_belong(dumps, tmp_path):
    a = dumps / "a"
    odd = tmp_path / "odd"
    shutil.copytree(a, odd)
    (odd / "rank=abc").mkdir()
    caused(opdump("summary", odd), "bad partition directory")
    twice = tmp_path / "twice"
    shutil.copytree(a, twice)
    f = one_file(twice)
    shutil.copy(f, f.with_name(f.stem + "9.parquet"))
    caused(opdump("summary", twice), "appears twice in rank")


def test_a_dump_without_calls(dumps, tmp_path):
    f = one_file(dumps / "a")
    empty = tmp_path / "empty"
    (empty / f.parent.relative_to(dumps / "a")).mkdir(parents=True)
    table = pq.read_table(f)
    meta = dict(pq.read_metadata(f).metadata)
    meta.update({b"opdump.rows": b"0", b"opdump.op_calls": b"0"})
    pq.write_table(table.slice(0, 0).replace_schema_metadata(meta), empty / f.relative_to(dumps / "a"))
    caused(opdump("compare", empty, dumps / "a"), "holds no op calls")


def test_compare_refusals(dumps):
    a, b = dumps / "a", dumps / "b"
    caused(opdump("compare", a, a, "--steps", "5"), "no op calls in the selected steps")
    caused(opdump("compare", a, a, "--ignore", "."), "no phase (forward, backward, optimizer) in common")
    caused(opdump("compare", a, b), "look like different programs")
    caused(opdump("compare", a, a, "--rank", 7), "no rank <r> (ranks present")
    caused(opdump("summary", a, "--rank", 7), "no rank <r> (ranks present")
    caused(opdump("compare", a, b, "--rank", "all"),
           "the dumps share no rank (A has <ranks>, B has <ranks>); dump the same")
    caused(opdump("compare", a, a, "--rank", "all", "--out", dumps / "tables"), "--out writes one rank pair's tables")
    caused(opdump("ranks", a), "only rank <r> has files")


def test_bad_options(dumps):
    a = dumps / "a"
    caused(opdump("compare", a, a, "--steps", "x"), "--steps <value>")
    caused(opdump("compare", a, a, "--ignore", "("), "--ignore <value>")
    caused(opdump("compare", a, a, "--rtol", "float32"), "--rtol <value>")
    says(opdump("compare", a, a, "--rtol", "float32=abc"), '"abc" is not a number', "expected DTYPE=VALUE")
    says(opdump("compare", a, a, "--rtol", "float32=-1"), "--rtol", "the tolerance must be a finite number >= 0")
    says(opdump("compare", a, a, "--rtol", "f33=0.1"), 'unknown dtype "f33"', "use torch's names")
    caused(opdump("compare", a, a, "--min-amplification", "0.5"), "--min-amplification")


def test_a_full_stdout(dumps):
    a = dumps / "a"
    with open("/dev/full", "w") as full:
        caused(opdump("summary", a, stdout=full), "writing to stdout")
        caused(opdump("compare", a, a, "--json", stdout=full), "writing to stdout")


def test_repro_refusals(dumps, tmp_path):
    a = dumps / "a"
    caused(opdump("repro", a, a, cwd=tmp_path), "no op introduced a divergence")
    caused(opdump("repro", a, a, "--call", "module=m#0", cwd=tmp_path), "names every call inside a module")
    caused(opdump("repro", a, a, "--call", "aten::mm#99", cwd=tmp_path), "no recorded call")
    caused(opdump("repro", a, a, "--call", "aten::mm", cwd=tmp_path), "--call: <why>")
    caused(opdump("repro", a, a, "--call", "aten::mm#0", cwd=tmp_path), "holds no capture of")
    caused(opdump("repro", a, dumps / "b", "--call", "aten::mm#0", "--force", cwd=tmp_path),
           "has no aligned call in B")
