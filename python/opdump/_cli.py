"""The ``opdump`` command-line tool (Rust, shipped in the wheel's scripts):
finding it, and running ``compare`` and ``summary`` from Python."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path
from typing import Any, Optional

from ._native import _CLONE_BUILD

CLI_NAME = "opdump"


class OpdumpError(RuntimeError):
    """The ``opdump`` tool failed (exit status 2): bad input or usage. The
    message is its ``opdump:`` line."""


def cli_path() -> Optional[Path]:
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
    ``--steps 0-2 --force --rtol bfloat16=0.05``."""
    out: list[str] = []
    for key, value in opts.items():
        flag = "--" + key.replace("_", "-")
        if value is None or value is False:
            continue
        if value is True:
            out.append(flag)
        elif isinstance(value, (list, tuple)):
            for v in value:
                out += [flag, str(v)]
        else:
            out += [flag, os.fspath(value) if isinstance(value, os.PathLike) else str(value)]
    return out


def _run_json(command: str, paths: list[str], opts: dict[str, Any]) -> dict[str, Any]:
    cli = cli_path()
    if cli is None:
        raise OpdumpError(f"the {CLI_NAME} command is not installed: reinstall the opdump wheel")
    p = subprocess.run([str(cli), command, *paths, "--json", *_arguments(opts)],
                       capture_output=True, text=True)
    if p.returncode == 2 or not p.stdout.strip():
        raise OpdumpError(p.stderr.strip() or f"{CLI_NAME} {command} exited with status {p.returncode}")
    return json.loads(p.stdout)


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
        OpdumpError: the dumps could not be read or compared (exit status 2).
    """
    return _run_json("compare", [os.fspath(a), os.fspath(b)], opts)


def summary(path: os.PathLike | str, **opts: Any) -> dict[str, Any]:
    """Runs ``opdump summary PATH --json``: op calls per op, phase, step and
    module, and where NaN or Inf first appeared. ``rank=R`` limits it to one
    rank."""
    return _run_json("summary", [os.fspath(path)], opts)
