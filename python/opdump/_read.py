"""Reading a dump: the Parquet files under ``rank=<R>/device=<D>/``, as a
DuckDB relation or a pandas DataFrame. Both libraries are optional."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

_EXTRA = "pip install 'opdump[analysis]'"


def _need(module: str) -> Any:
    try:
        import importlib

        return importlib.import_module(module)
    except ImportError as e:
        top = module.split(".")[0]
        raise ImportError(f"opdump.read() needs {top}, which is not installed: {_EXTRA} (or pip install {top})") from e


def read(path: os.PathLike | str, as_: Literal["duckdb", "pandas"] = "duckdb",
         connection: Any | None = None) -> Any:
    """A dump's rows: one per tensor of every recorded op call, with the
    partition columns ``rank`` and ``device``. The columns are those of the
    README's schema table; rows are in the order calls ended, so sort by
    ``seq`` for call order.

    Args:
        path: the dump directory (``OPDUMP_DIR``).
        as_: ``"duckdb"`` for a lazy DuckDB relation (query it with
            ``.filter()``, ``.aggregate()`` or SQL), ``"pandas"`` for a
            DataFrame read whole.
        connection: a DuckDB connection to read with (default: DuckDB's
            default connection).

    Raises:
        FileNotFoundError: no complete Parquet file under ``path``.
        ImportError: the library ``as_`` names is not installed.
        ValueError: ``as_`` is neither.
    """
    root = Path(path)
    if as_ not in ("duckdb", "pandas"):
        raise ValueError(f"as_={as_!r}: use 'duckdb' or 'pandas'")
    # Files still being written are hidden (.part-*.tmp) and never listed.
    if not any(p.is_file() for p in root.glob("rank=*/device=*/part-*.parquet")):
        raise FileNotFoundError(f"{root}: no opdump Parquet files (rank=*/device=*/part-*.parquet)")
    if as_ == "pandas":
        _need("pandas")
        ds = _need("pyarrow.dataset")
        # By name: capture files (capture-*.safetensors) share the directories.
        files = sorted(str(p) for p in root.glob("rank=*/device=*/part-*.parquet"))
        table = ds.dataset(files, format="parquet", partitioning="hive", partition_base_dir=str(root)).to_table()
        return table.to_pandas()
    duckdb = _need("duckdb")
    # The module's functions use DuckDB's default connection.
    con = connection if connection is not None else duckdb
    return con.read_parquet(str(root / "rank=*" / "device=*" / "part-*.parquet"), hive_partitioning=True)
