"""The ``opdump`` command-line tool (Rust, shipped in the wheel's scripts):
finding it, and running ``compare`` and ``summary`` from Python."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path
from typing import Any

from ._native import _CLONE_BUILD

CLI_NAME = "opdump"


class OpdumpError(RuntimeError):
    """The ``opdump`` tool failed: it is missing or cannot run, it exited with
    a status that is no verdict (2: bad input or usage), or it printed no JSON
    report. The message is its ``opdump:`` line where it printed one."""

# The exit statuses that carry a report, per command (crates/cli/src/app/error.rs).
_VERDICTS = {"compare": (0, 1, 3), "summary": (0,)}


def cli_path() -> Path | None:
    """The ``opdump`` executable: the one installed with this package (the
    scripts directory of this interpreter), else the repository's release
    build, else the first on ``PATH``."""
    candidates = []
    for scheme in (None, f"{os.name}_user"):
        try:
            scripts = sysconfig.get_path("scripts", scheme) if scheme else sysconfig.get_path("scripts")
        except KeyError:
            continue
        candidates.append(Path(scripts) / CLI_NAME)
    candidates.append(_CLONE_BUILD / CLI_NAME)
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    found = shutil.which(CLI_NAME)
    return Path(found) if found else None


def _arguments(opts: dict[str, Any]) -> list[str]:
    """``steps="0-2", force=True, rtol=["bfloat16=0.05"]`` ->
    ``--steps=0-2 --force --rtol=bfloat16=0.05``. A value is joined to its
    flag so that one starting with ``-`` is never read as an option."""
    out: list[str] = []
    for key, value in opts.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, (list, tuple)):
            out += [f"{flag}={_text(v)}" for v in value]
        else:
            out.append(f"{flag}={_text(value)}")
    return out


def _text(value: Any) -> str:
    return os.fspath(value) if isinstance(value, os.PathLike) else str(value)


def _run_json(command: str, paths: list[str], opts: dict[str, Any]) -> dict[str, Any]:
    """Runs ``opdump COMMAND --json OPTIONS -- PATHS`` and returns its report;
    any failure of the tool is an :class:`OpdumpError`."""
    cli = cli_path()
    if cli is None:
        raise OpdumpError(f"the {CLI_NAME} command is not installed: reinstall the opdump wheel")
    # `--` ends the options: a path such as `--help` stays a path.
    argv = [str(cli), command, "--json", *_arguments(opts), "--", *paths]
    try:
        p = subprocess.run(argv, capture_output=True, text=True, encoding="utf-8", errors="replace")
    except OSError as e:
        raise OpdumpError(f"cannot run {cli}: {e}; reinstall the opdump wheel") from e
    if p.returncode not in _VERDICTS[command]:
        raise OpdumpError(p.stderr.strip() or f"{CLI_NAME} {command} exited with status {p.returncode}")
    try:
        report = json.loads(p.stdout)
    except json.JSONDecodeError as e:
        raise OpdumpError(f"{CLI_NAME} {command} printed no JSON report ({e}): {p.stderr.strip()}") from e
    if not isinstance(report, dict):
        raise OpdumpError(f"{CLI_NAME} {command} printed JSON that is no report: {p.stdout[:80]!r}")
    return report


def compare(a: os.PathLike | str, b: os.PathLike | str, **opts: Any) -> dict[str, Any]:
    """Runs ``opdump compare A B --json`` and returns the parsed report.

    Args:
        a: the reference dump (the device you trust).
        b: the dump under test.
        **opts: the command's options by name, ``_`` for ``-``:
            ``steps="0-2"``, ``rank=0``, ``ignore="aten::_to_copy"``,
            ``rtol=["bfloat16=0.05"]``, ``force=True``, ``out="report_dir"``,
            ``html="report.html"`` (``opdump compare --help`` lists them).

    Returns:
        The report (README, "opdump compare"): ``exit_status`` (0 agree, 1 an
        op introduced a divergence, 3 outputs diverged with no op to blame),
        ``headline``, ``first_introduced``, ``first_divergence``, each with
        ``op``, ``module``, ``seq_a``, ``seq_b``, the metrics and the tensors.

    Raises:
        OpdumpError: the dumps could not be read or compared (exit status 2),
            or the tool is missing, cannot run or printed no report.
    """
    return _run_json("compare", [os.fspath(a), os.fspath(b)], opts)


def summary(path: os.PathLike | str, **opts: Any) -> dict[str, Any]:
    """Runs ``opdump summary PATH --json``: op calls per op, phase, step and
    module, and where NaN or Inf first appeared. ``rank=R`` limits it to one
    rank. Raises :class:`OpdumpError` as :func:`compare` does."""
    return _run_json("summary", [os.fspath(path)], opts)
