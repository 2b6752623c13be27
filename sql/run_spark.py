"""Runs an opdump SQL recipe on Spark SQL (pyspark), the same files as
run_duckdb.py.

    python sql/run_spark.py summary DUMP
    python sql/run_spark.py compare DUMP_A DUMP_B --master local[4]
    spark-submit sql/run_spark.py ranks_vote hdfs:///runs/job1 --json

Each dump is read with Spark's Parquet reader and partition discovery (the
`rank=<R>/device=<D>/` folders become the columns `rank` and `device`;
`basePath` is the dump, so a dump of one rank still has them), merged by
column name (`mergeSchema`, for files of older schema versions), and
registered as a temporary view that the recipe's `{dump}`, `{a}` or `{b}`
names. DUMP is any path Spark reads: a local folder, hdfs://, s3a://.

Without --master the session is whatever spark-submit or the environment
configures, else local[*]. --driver-memory sets the heap of a JVM this
process starts (local mode: 1g by default, too little for a compare of
millions of rows)."""

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import recipes

VIEWS = {"dump": "opdump_dump", "a": "opdump_a", "b": "opdump_b"}


def session(master=None, driver_memory=None):
    from pyspark.sql import SparkSession

    # No progress bars: the results go to stdout, the log to stderr.
    b = SparkSession.builder.appName("opdump-sql").config("spark.ui.showConsoleProgress", "false")
    if master:
        b = b.master(master)
    if driver_memory:
        # Read when this process starts the JVM (python sql/run_spark.py);
        # under spark-submit, its --driver-memory applies instead.
        b = b.config("spark.driver.memory", driver_memory)
    spark = b.getOrCreate()
    # Row order and the ranks' seq numbers do not depend on the local time
    # zone; only the session's own settings are touched.
    spark.conf.set("spark.sql.session.timeZone", "UTC")
    return spark


def register(spark, view, path):
    """The dump at `path` as the temporary view `view`."""
    p = str(path).rstrip("/")
    df = (
        spark.read.option("basePath", p)
        .option("mergeSchema", "true")
        # Hidden files (a writer's temporary `.part-*`) are skipped by Spark
        # already; only Parquet files are read.
        .option("pathGlobFilter", "*.parquet")
        .option("recursiveFileLookup", "false")
        .parquet(p)
    )
    df.createOrReplaceTempView(view)


def run(recipe, dumps, params=None, spark=None):
    """The recipe's results on `dumps` (one path per table it reads, in the
    order dump, a, b): {name: pandas DataFrame}."""
    path = recipes.recipe_path(recipe)
    names = recipes.tables_of(path)
    if len(dumps) != len(names):
        raise SystemExit(f"{path.name} reads {len(names)} dump(s) ({', '.join(names)}), {len(dumps)} given")
    spark = spark or session()
    for n, d in zip(names, dumps):
        register(spark, VIEWS[n], d)
    out = {}
    for st in recipes.statements(path, {n: VIEWS[n] for n in names}, params):
        df = spark.sql(st.sql)
        if st.result is not None:
            out[st.result] = df.toPandas()
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("recipe", help=f"one of: {', '.join(recipes.available())}, or a path")
    ap.add_argument("dumps", nargs="+", help="the dump directory (two for compare)")
    ap.add_argument("--param", action="append", default=[], metavar="NAME=VALUE")
    ap.add_argument("--master", help="the Spark master, e.g. local[4] (default: the environment's)")
    ap.add_argument("--driver-memory", metavar="SIZE",
                    help="the driver's heap, e.g. 4g (Spark's default, 1g, is short for a compare of millions of "
                         "rows in local mode, where the driver does all the work)")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON object")
    a = ap.parse_args(argv)
    params = dict(p.split("=", 1) for p in a.param)
    spark = session(a.master, a.driver_memory)
    spark.sparkContext.setLogLevel("WARN")
    results = run(a.recipe, a.dumps, params, spark)
    if a.json:
        print(json.dumps({k: recipes.records(v) for k, v in results.items()}, indent=1))
    else:
        import pandas as pd

        with pd.option_context("display.max_rows", 200, "display.max_columns", 30, "display.width", 200):
            for name, df in results.items():
                print(f"== {name} ({len(df)} rows)")
                print(df.to_string(index=False))
                print()
    spark.stop()


if __name__ == "__main__":
    main()
