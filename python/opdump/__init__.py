"""opdump: find the operator where two runs of the same PyTorch network part ways.

opdump is a native plugin on a PyTorch dispatch key. Loaded into a job, it
records, for every operator call (forward, backward, optimizer; at every
nesting depth), statistics of every input and output tensor, computed on the
tensor's own device, into Parquet files. ``compare`` aligns the op streams of
two dumps and names the first call whose outputs diverge, and whether it
introduced the error or inherited it.

Without changing the job::

    python -m opdump run --dir dump-cpu -- python train.py --device cpu
    python -m opdump run --dir dump-npu -- python train.py --device npu
    opdump compare dump-cpu dump-npu

From Python::

    import opdump
    opdump.enable()            # loads the plugin for the running torch, starts recording
    ...                        # the job
    opdump.flush()
    rows = opdump.read("opdump", as_="pandas")
    report = opdump.compare("dump-cpu", "dump-npu")
    report["headline"]["op"], report["headline"]["module"]

Loading never raises for a plugin that cannot load (no core for the running
torch, for instance): one ``opdump:`` line on stderr, and the job goes on.
"""

from __future__ import annotations

from ._cli import OpdumpError, cli_path, compare, summary
from ._native import (
    device_stats,
    disable,
    enable,
    flush,
    is_loaded,
    library_path,
    load,
    stats,
    step,
    supported_torch_versions,
)
from ._read import read


def _version() -> str:
    try:
        from importlib.metadata import PackageNotFoundError, version

        return version("opdump")
    except PackageNotFoundError:  # imported from a clone, not installed
        return "0+unknown"


__version__ = _version()

__all__ = [
    "OpdumpError",
    "cli_path",
    "compare",
    "device_stats",
    "disable",
    "enable",
    "flush",
    "is_loaded",
    "library_path",
    "load",
    "read",
    "stats",
    "step",
    "summary",
    "supported_torch_versions",
]
