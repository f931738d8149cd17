#!/usr/bin/env bash
# A local Spark Connect server (Spark's own SparkConnectServer) on 127.0.0.1, with a token.
#
#   scripts/spark-connect.sh start|stop|status [--dir DIR] [--master MASTER] [--port N]
#                            [--conf K=V ...] [--timeout S]
#
# The checkout's `sparktf connect` with its venv's Python (SPARKTF_PYTHON overrides).
# --master: local-cluster[2,1,1024] by default (the local profile's), or a standalone master
# (spark://127.0.0.1:PORT, as scripts/spark-cluster.sh starts one). --port: the gRPC port
# (default: a free one); it listens on 127.0.0.1 only. `start` returns once a client has run a
# barrier stage over every task slot, and prints export SPARK_REMOTE='sc://localhost:PORT/;token=T'
# (eval "$(scripts/spark-connect.sh start)"). Clients must present that token: a new one per
# start, kept in DIR/token (0600), passed to the server in its environment, on no command line.
# DIR ($SPARKTF_HOME/state/connect, SPARKTF_HOME defaulting to the checkout's .local) is private
# and holds the pid, port, master, token, Spark settings and server.log. `stop` ends the server
# and its executors and frees the port; `status` exits 0 when it runs, 1 when not.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${SPARKTF_PYTHON:-$ROOT/.venv/bin/python}"
usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; }
case "${1:-}" in
  -h|--help) usage; exit 0 ;;
  start|stop|status) ;;
  *) echo "usage: scripts/spark-connect.sh start|stop|status [--dir DIR] [--master M] [--port N] [--conf K=V] [--timeout S] (--help)" >&2
     exit 2 ;;
esac
for arg in "$@"; do
  case "$arg" in -h|--help) usage; exit 0 ;; esac
done
[ -x "$PY" ] || { echo "spark-connect.sh: no Python at $PY: run scripts/setup.sh (or set SPARKTF_PYTHON)" >&2; exit 1; }
exec "$PY" -m sparktf connect "$@"
