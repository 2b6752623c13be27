"""What both runners share: reading a recipe file into the statements an
engine runs.

A recipe is plain SQL that DuckDB and Spark SQL both accept, plus four
conventions, all in comments so that the file stays valid SQL:

- `{dump}`, `{a}`, `{b}`: the dump(s) the recipe reads, as table sources.
  The runner puts in what its engine reads a hive-partitioned Parquet
  directory with (a `read_parquet(...)` call in DuckDB, a temporary view in
  Spark).
- `-- include: FILE.sql`: the statements of another file of this folder
  (shared views), run first.
- `-- param: NAME = DEFAULT`: `{NAME}` in the text becomes DEFAULT, or the
  value given to the runner (`--param NAME=VALUE`).
- `-- result: NAME`: the SELECT that follows is a result of the recipe, under
  that name. Every other statement is a `CREATE OR REPLACE TEMPORARY VIEW`.

Statements end with `;` at the end of a line."""

import re
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
TABLES = ("dump", "a", "b")

_INCLUDE = re.compile(r"^\s*--\s*include:\s*(\S+)\s*$")
_PARAM = re.compile(r"^\s*--\s*param:\s*(\w+)\s*=\s*(.*?)\s*$")
_RESULT = re.compile(r"^\s*--\s*result:\s*(\w+)\s*$")


@dataclass
class Statement:
    sql: str
    # The result's name, or None for a view the results read.
    result: str | None


def recipe_path(name):
    """A recipe by file name (`summary.sql`), by name (`summary`) or by path."""
    p = Path(name)
    if p.exists():
        return p.resolve()
    p = HERE / (name if name.endswith(".sql") else name + ".sql")
    if not p.exists():
        raise SystemExit(f"no recipe {name!r} (recipes: {', '.join(available())})")
    return p


def available():
    return sorted(p.stem for p in HERE.glob("*.sql") if not p.name.startswith("_"))


def tables_of(path):
    """The table placeholders a recipe (with its includes) reads."""
    code = "\n".join(l for l in _expand(Path(path), set()).splitlines() if not l.strip().startswith("--"))
    return [t for t in TABLES if "{" + t + "}" in code]


def statements(path, tables, params=None):
    """The statements of the recipe at `path`, placeholders filled: `tables`
    maps `dump`/`a`/`b` to table sources, `params` overrides defaults."""
    text = _expand(Path(path), set())
    values = {}
    for line in text.splitlines():
        m = _PARAM.match(line)
        if m:
            values[m.group(1)] = m.group(2)
    unknown = set(params or {}) - set(values)
    if unknown:
        raise SystemExit(f"{path}: no parameter {', '.join(sorted(unknown))} (it has: {', '.join(sorted(values))})")
    values.update(params or {})
    values.update(tables)
    out = []
    for chunk in re.split(r";[ \t]*(?:\n|$)", text):
        result = None
        body = []
        for line in chunk.splitlines():
            m = _RESULT.match(line)
            if m:
                result = m.group(1)
            elif not line.strip().startswith("--"):
                body.append(line)
        sql = "\n".join(body).strip()
        if sql:
            out.append(Statement(_fill(sql, values, path), result))
    return out


def _expand(path, seen):
    """The file's text with its includes put in place, each file once."""
    if path in seen:
        return ""
    seen.add(path)
    lines = []
    for line in path.read_text().splitlines():
        m = _INCLUDE.match(line)
        lines.append(_expand(path.parent / m.group(1), seen) if m else line)
    return "\n".join(lines)


def _fill(sql, values, path):
    def one(m):
        name = m.group(1)
        if name not in values:
            raise SystemExit(f"{path}: no value for {{{name}}}")
        return values[name]

    return re.sub(r"\{(\w+)\}", one, sql)


def records(df):
    """A result's rows as JSON-ready dicts: nulls (NaN, NA, None) as None,
    integers as Python ints (Spark hands 64-bit fingerprints back as
    decimals, which JSON must not round to a float)."""
    from decimal import Decimal

    import numpy as np

    def plain(v):
        if v is None:
            return None
        if isinstance(v, Decimal):
            return int(v) if v == v.to_integral_value() else float(v)
        if isinstance(v, (np.integer,)):
            return int(v)
        if isinstance(v, (float, np.floating)):
            return None if v != v else float(v)
        if isinstance(v, (np.bool_,)):
            return bool(v)
        try:
            import pandas as pd

            if v is pd.NA or v is pd.NaT:
                return None
        except ImportError:
            pass
        return v

    return [{k: plain(v) for k, v in row.items()} for row in df.astype(object).to_dict(orient="records")]
