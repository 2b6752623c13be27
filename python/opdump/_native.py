"""The plugin: where its library is, loading it, and the switches it registers
as ``torch.ops.opdump.*``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

_PACKAGE = Path(__file__).resolve().parent
# In a wheel: the torch-free entry point, and one core per supported torch
# version in torch-<version>/ beside it (crates/preload/src/cores.rs).
_BUNDLED = _PACKAGE / "_lib"
# In a clone of the repository (python/opdump), the cargo build.
_CLONE_BUILD = _PACKAGE.parent.parent / "target" / "release"

LIBRARY_NAME = "libopdump.so"
CORE_PREFIX = "torch-"


def library_path() -> Path | None:
    """The ``libopdump.so`` to load: the wheel's, else the release build of
    the repository this package sits in; None when there is neither.

    A wheel's library that carries no core for the torch this process runs
    (or will import) gives way to the build: a ``_lib`` that
    ``scripts/wheel.sh`` left in a clone must not keep the clone's own build
    from loading. With neither fit, the wheel's is returned, so that loading
    it prints the one line that names the versions it has."""
    found = [d for d in (_BUNDLED, _CLONE_BUILD) if (d / LIBRARY_NAME).is_file()]
    running = _torch_version()
    for d in found:
        if _serves(d, running):
            return d / LIBRARY_NAME
    return found[0] / LIBRARY_NAME if found else None


def _serves(lib_dir: Path, running: str | None) -> bool:
    """Whether the library in ``lib_dir`` has a core for torch ``running``.
    A build's directory (no ``torch-*`` cores) serves the torch it was built
    for, which the library itself checks; an unknown version cannot rule out
    a wheel."""
    carried = _versions_in(lib_dir)
    return not carried or running is None or running.split("+")[0].strip() in carried


def _torch_version() -> str | None:
    """The version of the torch imported in this process, else of the one
    installed for this interpreter (read without importing it); None when
    neither is known."""
    torch = sys.modules.get("torch")
    if torch is not None:
        version = getattr(torch, "__version__", None)
        return str(version) if version else None
    try:
        from importlib.metadata import version

        return version("torch")
    except Exception:  # not installed as a distribution, or unreadable metadata
        return None


def _versions_in(lib_dir: Path) -> list[str]:
    """The torch versions ``lib_dir`` carries a core for, oldest first
    (crates/preload/src/cores.rs reads the same layout)."""
    if not lib_dir.is_dir():
        return []
    found = [p.name[len(CORE_PREFIX):] for p in lib_dir.glob(CORE_PREFIX + "*")
             if (p / "libopdump_core.so").is_file()]
    return sorted(found, key=lambda v: tuple(int(x) if x.isdigit() else 0 for x in v.split(".")))


def supported_torch_versions() -> list[str]:
    """The torch versions the wheel carries a core for (empty outside a
    wheel: a build serves the torch it was built against)."""
    return _versions_in(_BUNDLED)


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


def load(path: os.PathLike | str | None = None) -> bool:
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
        _say(f"cannot load {lib}: {e}; opdump stays off. Check that the file exists and was built for this torch "
             "(python -m opdump info)")
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


def step() -> int | None:
    """Advances the step number; from then on the job numbers its steps
    itself instead of opdump counting ``Optimizer.step`` calls. Returns the
    new step, or None when the plugin is not loaded."""
    if not is_loaded():
        return None
    return int(_ops().step())


def stats() -> dict[str, int] | None:
    """Op calls ``written``, ``dropped`` and ``failed`` so far, or None when
    the plugin is not loaded."""
    if not is_loaded():
        return None
    written, dropped, failed = (int(x) for x in _ops().stats())
    return {"written": written, "dropped": dropped, "failed": failed}


def device_stats() -> dict[str, int] | None:
    """Tensors on devices other than the CPU: ``measured``, ``dropped``,
    ``capturing``, ``waits`` and ``failed`` (README, "The device path"), or
    None when the plugin is not loaded."""
    if not is_loaded():
        return None
    keys = ("measured", "dropped", "capturing", "waits", "failed")
    return dict(zip(keys, (int(x) for x in _ops().device_stats())))
