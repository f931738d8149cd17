#!/usr/bin/env bash
# The test command: set-up, the style and architecture checks (ruff, import-linter), a real HDFS
# on free ports (not for the unit tier), pytest, HDFS stopped whatever happens.
#   scripts/test.sh [--stack default|petastorm] [--tier unit|integration|e2e|all] [PYTEST-ARGS]
#   unit: no JVM, minutes; integration: the session's Spark and HDFS; e2e: jobs, scripts and
#   clusters as separate applications; all (the default, what CI runs): the three.
#   Two test processes run at once (pytest-xdist, a test module each at a time); set
#   SPARKTF_TEST_PROCESSES=1 for one.
#   --stack petastorm: the second stack (.venv-petastorm); by default its unit tier but the
#   TensorFlow-only modules (their pins are the default stack's), the petastorm interop tests
#   and the elastic runs (what CI runs there, beside the default stack's suite: pytest -m
#   "(unit and not tensorflow_only) or petastorm or elastic"; a -m of yours replaces it), any
#   --tier on request. The default stack leaves the elastic runs to it (-m "not elastic";
#   -m elastic runs them here).
set -uo pipefail
TIER=
STACK=default
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --tier) [ $# -ge 2 ] || { echo "test.sh: --tier needs a value" >&2; exit 2; }; TIER="$2"; shift 2 ;;
    --tier=*) TIER="${1#--tier=}"; shift ;;
    --stack) [ $# -ge 2 ] || { echo "test.sh: --stack needs a value" >&2; exit 2; }; STACK="$2"; shift 2 ;;
    --stack=*) STACK="${1#--stack=}"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
case "$STACK" in
  default) VENV=.venv; TIER="${TIER:-all}" ;;
  petastorm) VENV=.venv-petastorm ;;
  *) echo "test.sh: unknown stack '$STACK' (default, petastorm)" >&2; exit 2 ;;
esac
case "$TIER" in
  unit|integration|e2e|all) select=(--tier "$TIER") ;;
  "") TIER=interop; select=(--tier all -m "(unit and not tensorflow_only) or petastorm or elastic") ;;  # the petastorm stack's default
  *) echo "test.sh: unknown tier '$TIER' (unit, integration, e2e, all)" >&2; exit 2 ;;
esac
if [ "$STACK" = default ] && [ "$TIER" != unit ]; then select+=(-m "not elastic"); fi
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
if [ "$TIER" = unit ]; then hadoop=(--no-hadoop); else hadoop=(); fi
scripts/setup.sh --stack "$STACK" ${hadoop[@]+"${hadoop[@]}"} || exit 1

# Cheap checks first (seconds): all three run, then any failure stops the script before pytest.
failed=()
"$VENV"/bin/ruff check . || failed+=("ruff check (lint; '$VENV/bin/ruff check --fix .' fixes most)")
"$VENV"/bin/ruff format --check --output-format concise . \
  || failed+=("ruff format --check (see the diff with '$VENV/bin/ruff format --diff .')")
"$VENV"/bin/lint-imports --no-logo \
  || failed+=("lint-imports (the import contracts in pyproject.toml [tool.importlinter])")
if [ "${#failed[@]}" -gt 0 ]; then
  printf 'test.sh: failed: %s\n' "${failed[@]}" >&2
  exit 1
fi

export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
# The tests' JVMs (HDFS, YARN, Spark drivers and executors) live seconds to minutes on tiny
# data, and start-up is most of their CPU. C1 compilation only starts a Spark application
# about 30% sooner on 2 cores (12.0 s -> 8.6 s measured); not verifying the bytecode of the
# jars on the class path (Spark's and Hadoop's own, as installed) takes another 12-15% off a
# local-cluster session's start, run and stop (CPU 20.4-22.9 s -> 17.0-19.6 s, paired runs).
# Neither changes what the tests check. Set SPARKTF_TEST_JAVA_OPTIONS= to test without them;
# every JVM prints them once ("Picked up JAVA_TOOL_OPTIONS").
JAVA_FAST="-XX:TieredStopAtLevel=1 -XX:+UnlockDiagnosticVMOptions -XX:-BytecodeVerificationRemote"
export JAVA_TOOL_OPTIONS="${SPARKTF_TEST_JAVA_OPTIONS-$JAVA_FAST}"
# Two test processes: the suite waits on JVMs, sockets and child processes about a third of
# the time (CPU use of the machine averaged 70% with one). A module runs whole in one of them
# (its module fixtures are made once), the longest first (tests/conftest.py).
PROCESSES="${SPARKTF_TEST_PROCESSES:-2}"
if [ "$PROCESSES" -gt 1 ] 2>/dev/null; then
  select+=(-n "$PROCESSES" --dist loadfile --no-loadscope-reorder)
fi
if [ "$TIER" = unit ]; then  # no HDFS, no Spark: nothing to start or stop
  exec "$VENV"/bin/python -m pytest "${select[@]}" ${args[@]+"${args[@]}"}
fi

free_port() { "$VENV"/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
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
export SPARK_LOCAL_IP=127.0.0.1 PYSPARK_PYTHON="$ROOT/$VENV/bin/python"

"$VENV"/bin/python -m pytest "${select[@]}" ${args[@]+"${args[@]}"}
