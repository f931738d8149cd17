#!/usr/bin/env bash
# The test command: set-up, the style and architecture checks (ruff, import-linter), a real HDFS
# on free ports, pytest, HDFS stopped whatever happens.
#   scripts/test.sh [PYTEST-ARGS]     (e.g. scripts/test.sh -k storage -x)
set -uo pipefail
case "${1:-}" in -h|--help) sed -n '2,4p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
scripts/setup.sh || exit 1

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
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"

.venv/bin/python -m pytest "$@"
