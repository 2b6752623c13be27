#!/usr/bin/env bash
# The SQL recipes of sql/ through Spark SQL: the assertions of
# tests/test_sql_recipes.py (the recipes' results against `opdump summary`,
# `opdump ranks` and `opdump compare` on the same dumps), with
# sql/run_spark.py in place of sql/run_duckdb.py.
#
#   scripts/test-spark.sh            # everything it needs, then the tests
#   scripts/test-spark.sh -k ranks   # extra arguments go to pytest
#
# It installs what it needs: a Java runtime from the distribution's packages
# (default-jre-headless, when no Java 17 or newer is on the PATH) and pyspark
# into a venv of its own (.venv-spark, or $SPARK_VENV), so the project's
# .venv and scripts/test.sh stay free of Java. The jobs that write the test
# dumps run with the project's venv (scripts/setup.sh); OPDUMP_SKIP_BUILD=1
# skips its build.
set -euo pipefail
cd "$(dirname "$0")/.."

SPARK_VENV=${SPARK_VENV:-.venv-spark}
PYSPARK_VERSION=${PYSPARK_VERSION:-4.3.0}
PY=${PYTHON:-python3}

java_major() {
  # `java -version` prints `openjdk version "17.0.15" ...` (or "1.8.0_x").
  java -version 2>&1 | sed -n 's/.*version "\([0-9]*\)\.\{0,1\}\([0-9]*\).*/\1 \2/p' | head -1 |
    awk '{ print ($1 == 1) ? $2 : $1 }'
}

if ! command -v java >/dev/null || [ "$(java_major)" -lt 17 ]; then
  echo "test-spark: installing a Java runtime (default-jre-headless)" >&2
  sudo=""
  [ "$(id -u)" = 0 ] || sudo=sudo
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq default-jre-headless >/dev/null
fi

# pandas and pyarrow: run_spark.py hands results over as pandas frames
# (pyspark 4.3 warns that it does not fully support pandas 3 yet).
reqs=("pyspark==$PYSPARK_VERSION" "pandas<3" pyarrow)
# The stamp names the requirements: a changed list installs again.
stamp="$SPARK_VENV/.opdump-setup-$(echo "${reqs[*]}" | sha256sum | cut -c1-12)"
if [ ! -f "$stamp" ]; then
  echo "test-spark: installing ${reqs[*]} into $SPARK_VENV" >&2
  [ -x "$SPARK_VENV/bin/python" ] || "$PY" -m venv "$SPARK_VENV"
  "$SPARK_VENV/bin/python" -m pip install -q --upgrade pip
  "$SPARK_VENV/bin/python" -m pip install -q "${reqs[@]}"
  touch "$stamp"
fi

scripts/setup.sh
export OPDUMP_PYTHON="$PWD/${VENV:-.venv}/bin/python"
echo "test-spark: $(java -version 2>&1 | head -1); pyspark $("$SPARK_VENV/bin/python" -c 'import pyspark; print(pyspark.__version__)')" >&2
OPDUMP_SQL_ENGINE=spark OPDUMP_SPARK_PYTHON="$PWD/$SPARK_VENV/bin/python" \
  "$OPDUMP_PYTHON" -m pytest tests/test_sql_recipes.py -q -p no:cacheprovider "$@"
