"""Reading a dump: the Parquet files under ``rank=<R>/device=<D>/``, as a
DuckDB relation or a pandas DataFrame. Both libraries are optional."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, Optional

_EXTRA = "pip install 'opdump[analysis]'"


def _need(module: str) -> Any:
    try:
        return __import__(module)
    except ImportError as e:
        raise ImportError(f"opdump.read(..., as_={module!r}) needs {module}, which is not installed: "
                          f"{_EXTRA} (or pip install {module})") from e


def read(path: os.PathLike | str, as_: Literal["duckdb", "pandas"] = "duckdb",
         connection: Optional[Any] = None) -> Any:
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
        pd = _need("pandas")
        return pd.read_parquet(root)
    duckdb = _need("duckdb")
    # The module's functions use DuckDB's default connection.
    con = connection if connection is not None else duckdb
    return con.read_parquet(str(root / "rank=*" / "device=*" / "part-*.parquet"), hive_partitioning=True)
