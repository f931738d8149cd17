#!/usr/bin/env bash
# The test command: set-up, the style and architecture checks (ruff, import-linter), a real HDFS
# on free ports (not for the unit tier), pytest, HDFS stopped whatever happens.
#   scripts/test.sh [--tier unit|integration|e2e|all] [PYTEST-ARGS]   (e.g. --tier unit -x)
#   unit: no JVM, minutes; integration: the session's Spark and HDFS; e2e: jobs, scripts and
#   clusters as separate applications; all (the default, what CI runs): the three.
set -uo pipefail
TIER=all
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --tier) [ $# -ge 2 ] || { echo "test.sh: --tier needs a value" >&2; exit 2; }; TIER="$2"; shift 2 ;;
    --tier=*) TIER="${1#--tier=}"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
case "$TIER" in
  unit|integration|e2e|all) ;;
  *) echo "test.sh: unknown tier '$TIER' (unit, integration, e2e, all)" >&2; exit 2 ;;
esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ "$TIER" = unit ]; then scripts/setup.sh --no-hadoop || exit 1; else scripts/setup.sh || exit 1; fi

# Cheap checks first (seconds): all three run, then any failure stops the script before pytest.
failed=()
.venv/bin/ruff check . || failed+=("ruff check (lint; '.venv/bin/ruff check --fix .' fixes most)")
.venv/bin/ruff format --check --output-format concise . \
  || failed+=("ruff format --check (see the diff with '.venv/bin/ruff format --diff .')")
.venv/bin/lint-imports --no-logo \
  || failed+=("lint-imports (the import contracts in pyproject.toml [tool.importlinter])")
if [ "${#failed[@]}" -gt 0 ]; then
  printf 'test.sh: failed: %s\n' "${failed[@]}" >&2
  exit 1
fi

export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
# The tests' JVMs (HDFS, YARN, Spark drivers and executors) live seconds to minutes on tiny
# data: C1 compilation only starts a Spark application about 30% sooner on 2 cores (12.0 s ->
# 8.6 s measured) and costs nothing at this size. Set SPARKTF_TEST_JAVA_OPTIONS= to test
# without it; every JVM prints it once ("Picked up JAVA_TOOL_OPTIONS").
export JAVA_TOOL_OPTIONS="${SPARKTF_TEST_JAVA_OPTIONS--XX:TieredStopAtLevel=1}"
if [ "$TIER" = unit ]; then  # no HDFS, no Spark: nothing to start or stop
  exec .venv/bin/python -m pytest --tier unit ${args[@]+"${args[@]}"}
fi

free_port() { .venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
RUN_DIR="$(mktemp -d "${TMPDIR:-/tmp}/sparktf-test.XXXXXX")"
HDFS_ARGS=(--port "$(free_port)" --http-port "$(free_port)" --dir "$RUN_DIR/hdfs" --conf-dir "$RUN_DIR/hadoop-conf")
cleanup() {
  scripts/hdfs.sh stop "${HDFS_ARGS[@]}" >/dev/null 2>&1 || true
  rm -rf "$RUN_DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

out="$(scripts/hdfs.sh start "${HDFS_ARGS[@]}")" || { echo "test.sh: HDFS did not start" >&2; exit 1; }
echo "$out"
export SPARKTF_TEST_HDFS_URI="$(echo "$out" | sed -n 's/^HDFS_URI=//p')"
export SPARKTF_WEBHDFS_URL="$(echo "$out" | sed -n 's/^WEBHDFS_URL=//p')"
export HADOOP_CONF_DIR="$RUN_DIR/hadoop-conf"
export SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON="$ROOT/.venv/bin/python"

.venv/bin/python -m pytest --tier "$TIER" ${args[@]+"${args[@]}"}
