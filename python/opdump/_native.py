"""The plugin: where its library is, loading it, and the switches it registers
as ``torch.ops.opdump.*``."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Optional

_PACKAGE = Path(__file__).resolve().parent
# In a wheel: the torch-free entry point, and one core per supported torch
# version in torch-<version>/ beside it (crates/preload/src/cores.rs).
_BUNDLED = _PACKAGE / "_lib"
# In a clone of the repository (python/opdump), the cargo build.
_CLONE_BUILD = _PACKAGE.parent.parent / "target" / "release"

LIBRARY_NAME = "libopdump.so"
CORE_PREFIX = "torch-"


def library_path() -> Optional[Path]:
    """The ``libopdump.so`` to load: the wheel's, else the release build of
    the repository this package sits in; None when there is neither."""
    for d in (_BUNDLED, _CLONE_BUILD):
        p = d / LIBRARY_NAME
        if p.is_file():
            return p
    return None


def supported_torch_versions() -> list[str]:
    """The torch versions the wheel carries a core for (empty outside a
    wheel: a build serves the torch it was built against)."""
    if not _BUNDLED.is_dir():
        return []
    found = [p.name[len(CORE_PREFIX):] for p in _BUNDLED.glob(CORE_PREFIX + "*")
             if (p / "libopdump_core.so").is_file()]
    return sorted(found, key=lambda v: tuple(int(x) if x.isdigit() else 0 for x in v.split(".")))


def _say(msg: str) -> None:
    print(f"opdump: {msg}", file=sys.stderr, flush=True)


def is_loaded() -> bool:
    """Whether the plugin's core is in this process (its ``torch.ops.opdump``
    switches exist). Never imports torch itself."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    try:
        return hasattr(torch.ops.opdump, "enable")
    except Exception:  # a half-imported torch
        return False


def load(path: Optional[os.PathLike | str] = None) -> bool:
    """Loads the plugin into this process with ``torch.ops.load_library``.

    The entry point ``libopdump.so`` loads the core built for the running
    torch. Where there is none, it prints one ``opdump:`` line naming the
    running version and the supported ones, and dumping stays off.

    Args:
        path: a ``libopdump.so`` to load instead of the bundled one.

    Returns:
        True when the plugin is loaded (also when it already was, for example
        through ``LD_PRELOAD``); False, after one ``opdump:`` line on stderr,
        when it could not be. It never raises for a plugin that cannot load:
        the job goes on without it.
    """
    import torch

    if is_loaded():
        return True
    lib = Path(path) if path is not None else library_path()
    if lib is None:
        _say(f"no {LIBRARY_NAME} in {_BUNDLED}: this opdump package carries no plugin; opdump stays off")
        return False
    try:
        torch.ops.load_library(str(lib))
    except OSError as e:
        _say(f"cannot load {lib}: {e}; opdump stays off")
        return False
    return is_loaded()


def _ops():
    import torch

    return torch.ops.opdump


def enable() -> bool:
    """Starts recording (loading the plugin first if needed). Returns whether
    recording is on: False when the plugin could not be loaded."""
    if not load():
        return False
    _ops().enable()
    return True


def disable() -> None:
    """Stops recording. Does nothing when the plugin is not loaded."""
    if is_loaded():
        _ops().disable()


def flush() -> None:
    """Writes everything queued and completes the open files."""
    if is_loaded():
        _ops().flush()


def step() -> Optional[int]:
    """Advances the step number; from then on the job numbers its steps
    itself instead of opdump counting ``Optimizer.step`` calls. Returns the
    new step, or None when the plugin is not loaded."""
    if not is_loaded():
        return None
    return int(_ops().step())


def stats() -> Optional[dict[str, int]]:
    """Op calls ``written``, ``dropped`` and ``failed`` so far, or None when
    the plugin is not loaded."""
    if not is_loaded():
        return None
    written, dropped, failed = (int(x) for x in _ops().stats())
    return {"written": written, "dropped": dropped, "failed": failed}


def device_stats() -> Optional[dict[str, int]]:
    """Tensors on devices other than the CPU: ``measured``, ``dropped``,
    ``capturing``, ``waits`` and ``failed`` (README, "The device path"), or
    None when the plugin is not loaded."""
    if not is_loaded():
        return None
    keys = ("measured", "dropped", "capturing", "waits", "failed")
    return dict(zip(keys, (int(x) for x in _ops().device_stats())))
