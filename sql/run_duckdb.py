"""Runs an opdump SQL recipe on DuckDB, in this process.

    python sql/run_duckdb.py summary DUMP
    python sql/run_duckdb.py compare DUMP_A DUMP_B [--param tol=1e-3]
    python sql/run_duckdb.py ranks_vote DUMP --json

Each result is printed as a table (or, with --json, all of them as one JSON
object: result name -> list of rows). DUMP is a dump directory (its
`rank=<R>/device=<D>/` partitions become the columns `rank` and `device`)
or any path or URL DuckDB reads, `s3://bucket/run1` included (with the
httpfs extension and credentials set up as DuckDB documents)."""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recipes


def table_source(path):
    """A dump directory as a DuckDB table: every Parquet file under it, the
    hive partitions as columns, columns matched by name so that files of
    older schema versions (fewer columns) read too."""
    glob = str(path).rstrip("/") + "/**/*.parquet"
    quoted = glob.replace("'", "''")
    return f"read_parquet('{quoted}', hive_partitioning = true, union_by_name = true)"


def run(recipe, dumps, params=None, con=None):
    """The recipe's results on `dumps` (one path per table it reads, in the
    order dump, a, b): {name: pandas DataFrame}."""
    import duckdb

    path = recipes.recipe_path(recipe)
    names = recipes.tables_of(path)
    if len(dumps) != len(names):
        raise SystemExit(f"{path.name} reads {len(names)} dump(s) ({', '.join(names)}), {len(dumps)} given")
    tables = {n: table_source(d) for n, d in zip(names, dumps)}
    con = con or duckdb.connect()
    out = {}
    for st in recipes.statements(path, tables, params):
        rel = con.sql(st.sql)
        if st.result is not None:
            out[st.result] = rel.df()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe", help=f"one of: {', '.join(recipes.available())}, or a path")
    ap.add_argument("dumps", nargs="+", help="the dump directory (two for compare)")
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON object")
    a = ap.parse_args(argv)
    params = dict(p.split("=", 1) for p in a.param)
    results = run(a.recipe, a.dumps, params)
    if a.json:
        print(json.dumps({k: recipes.records(v) for k, v in results.items()}, indent=1))
        return
    import pandas as pd

    with pd.option_context("display.max_rows", 200, "display.max_columns", 30, "display.width", 200):
        for name, df in results.items():
            print(f"== {name} ({len(df)} rows)")
            print(df.to_string(index=False))
            print()


if __name__ == "__main__":
    main()
