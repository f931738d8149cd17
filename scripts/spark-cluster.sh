#!/usr/bin/env bash
# A real Spark standalone cluster on 127.0.0.1: Spark's own Master and Workers, as background JVMs.
#
#   scripts/spark-cluster.sh start|stop|status [--workers N] [--cores C] [--memory M] [--dir DIR]
#                            [--port N] [--webui-port N]
#   scripts/spark-cluster.sh start-worker --worker N [--dir DIR]
#
# --workers (2), --cores per worker (1), --memory per worker (1g, as in spark-submit: 512m, 2g).
# --port/--webui-port: the master's RPC and web UI ports (default 0: free ports). Everything the
# cluster writes (logs, pid files, executor work dirs, scratch) stays in DIR (private; default
# $SPARKTF_HOME/spark-cluster, SPARKTF_HOME defaulting to the checkout's .local). `start` returns once every worker is ALIVE at the master and prints SPARK_MASTER_URL=...
# (also in DIR/master.env, which sparktf submit --profile standalone reads). `stop` leaves no JVM.
# `start-worker --worker N` starts worker N of a running cluster again (after it was lost).
# Spark's authentication and RPC encryption are on: every start makes a new shared secret in
# DIR/secret.conf (private; sparktf submit reads it, plain spark-submit takes it with
# --properties-file DIR/secret.conf); master.env names it as SPARK_SECRET_FILE.
# Environment equivalents: SPARKTF_SPARK_WORKERS, SPARKTF_SPARK_CORES, SPARKTF_SPARK_MEMORY,
# SPARKTF_SPARK_CLUSTER_DIR; the Spark is the venv's pyspark (SPARKTF_SPARK_HOME overrides).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cmd="${1:-}"; shift || true
WORKERS="${SPARKTF_SPARK_WORKERS:-2}"
CORES="${SPARKTF_SPARK_CORES:-1}"
MEMORY="${SPARKTF_SPARK_MEMORY:-1g}"
DIR="${SPARKTF_SPARK_CLUSTER_DIR:-${SPARKTF_HOME:-$ROOT/.local}/spark-cluster}"
PORT=0
WEBUI_PORT=0
START_TIMEOUT="${SPARKTF_SPARK_START_TIMEOUT:-180}"
PY="${SPARKTF_PYTHON:-$ROOT/.venv/bin/python}"
usage() { sed -n '2,18p' "$0" | sed 's/^# \{0,1\}//'; }
case "$cmd" in -h|--help) usage; exit 0 ;; esac
while [ $# -gt 0 ]; do
  case "$1" in
    --workers|--cores|--memory|--dir|--port|--webui-port|--worker)
      [ $# -ge 2 ] || { echo "spark-cluster.sh: $1 needs a value" >&2; exit 2; } ;;&
    --workers) WORKERS="$2"; shift 2 ;;
    --worker) N="$2"; shift 2 ;;
    --cores) CORES="$2"; shift 2 ;;
    --memory) MEMORY="$2"; shift 2 ;;
    --dir) DIR="$2"; shift 2 ;;
    --port) PORT="$2"; shift 2 ;;
    --webui-port) WEBUI_PORT="$2"; shift 2 ;;
    -h|--help) usage; exit 0 ;;
    *) echo "spark-cluster.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$WORKERS" =~ ^[1-9][0-9]*$ ]] || { echo "spark-cluster.sh: --workers must be a positive integer, got '$WORKERS'" >&2; exit 2; }
[[ "$CORES" =~ ^[1-9][0-9]*$ ]] || { echo "spark-cluster.sh: --cores must be a positive integer, got '$CORES'" >&2; exit 2; }
[[ "$MEMORY" =~ ^[1-9][0-9]*[mMgG]$ ]] || { echo "spark-cluster.sh: --memory must look like 512m or 2g, got '$MEMORY'" >&2; exit 2; }
for p in "$PORT" "$WEBUI_PORT"; do
  [[ "$p" =~ ^[0-9]+$ ]] && [ "$p" -le 65535 ] || { echo "spark-cluster.sh: a port must be 0-65535, got '$p'" >&2; exit 2; }
done
case "$DIR" in *[[:space:]]*) echo "spark-cluster.sh: --dir must not contain spaces: '$DIR'" >&2; exit 2 ;; esac

umask 077
mkdir -p "$DIR"
chmod 700 "$DIR"
DIR="$(cd "$DIR" && pwd)"
ENV_FILE="$DIR/master.env"
SECRET_FILE="$DIR/secret.conf"
PIDS="$DIR/pids"
LOGS="$DIR/logs"
# Every daemon of this cluster carries this tag on its command line: how stop and the tests
# find exactly this cluster's JVMs.
TAG="-Dsparktf.spark.cluster=$DIR"
TAG_RE="$(printf '%s' "$TAG" | sed 's/[][\.*^$+?(){}|]/\\&/g')"

# pid of a daemon of this cluster ($1 = pid file) if it is alive
running_pid() {
  [ -f "$1" ] || return 1
  local pid; pid="$(cat "$1")"
  [[ "$pid" =~ ^[0-9]+$ ]] || return 1
  # the JVM, or the setsid/spark-class launcher that becomes it (exec) while it starts. Just
  # after the fork it is still this script, and during an exec /proc/PID/cmdline reads empty:
  # on a busy machine these moments last, so look again for up to 2 s.
  local try
  for try in 1 2 3 4 5 6 7 8 9 10; do
    kill -0 "$pid" 2>/dev/null || return 1
    if tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null \
        | grep -qE -- "$TAG_RE |bin/spark-class org\.apache\.spark\.deploy\."; then
      echo "$pid"
      return 0
    fi
    sleep 0.2
  done
  return 1
}

tagged_pids() {  # every live process of this cluster (daemons and, by group, their executors)
  local pid
  for pid in $(ls /proc | grep -E '^[0-9]+$'); do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = java ] || continue
    tr '\0' ' ' < "/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$TAG " && echo "$pid"
  done
  return 0
}

master_json() {  # the master's /json/ page, parsed: prints ALIVE worker count, or fails
  "$PY" - "$1" <<'PY'
import json, sys, urllib.request
with urllib.request.urlopen(sys.argv[1].rstrip("/") + "/json/", timeout=5) as r:
    state = json.load(r)
print(sum(1 for w in state.get("workers", []) if w.get("state") == "ALIVE"))
PY
}

stop_all() {
  local f pid stopped=0 groups=()
  for f in "$PIDS"/*.pid; do
    [ -e "$f" ] || continue
    if pid="$(running_pid "$f")"; then
      groups+=("$pid")
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
      stopped=$((stopped + 1))
    fi
  done
  # wait for the process groups (a daemon and the executors it started) to end
  for _ in $(seq 1 60); do
    local alive=0
    for pid in "${groups[@]}"; do pgrep -g "$pid" >/dev/null 2>&1 && alive=1; done
    [ "$alive" = 0 ] && break
    sleep 0.5
  done
  for pid in "${groups[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
  # anything of this cluster that escaped its group
  for pid in $(tagged_pids); do kill -KILL "$pid" 2>/dev/null || true; done
  for _ in $(seq 1 20); do [ -z "$(tagged_pids)" ] && break; sleep 0.5; done
  rm -f "$PIDS"/*.pid "$ENV_FILE" "$SECRET_FILE" "$DIR/conf/spark-defaults.conf"
  if [ -n "$(tagged_pids)" ]; then
    echo "spark-cluster.sh: processes of $DIR still alive: $(tagged_pids | tr '\n' ' ')" >&2
    return 1
  fi
  echo "$stopped"
}

start_daemon() {  # $1 = name, $2 = class, rest = arguments
  local name="$1" class="$2"; shift 2
  setsid "$SPARK_HOME/bin/spark-class" "$class" "$@" > "$LOGS/$name.log" 2>&1 < /dev/null &
  echo $! > "$PIDS/$name.pid"
}

fail_start() {
  echo "spark-cluster.sh: $1" >&2
  [ -n "${2:-}" ] && [ -f "$2" ] && { echo "last lines of $2:" >&2; tail -20 "$2" >&2; }
  stop_all >/dev/null || true
  exit 1
}

daemon_env() {  # the daemons' Spark and environment: every file they write stays in DIR
  [ -x "$PY" ] || PY="$(command -v python3)" || { echo "spark-cluster.sh: no python found" >&2; exit 1; }
  command -v java >/dev/null || { echo "spark-cluster.sh: java not found; install Java 17" >&2; exit 1; }
  SPARK_HOME="${SPARKTF_SPARK_HOME:-$("$PY" -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))' 2>/dev/null)}" \
    || { echo "spark-cluster.sh: pyspark not importable by $PY; run scripts/setup.sh" >&2; exit 1; }
  [ -x "$SPARK_HOME/bin/spark-class" ] || { echo "spark-cluster.sh: no bin/spark-class in $SPARK_HOME" >&2; exit 1; }
  mkdir -p "$PIDS" "$LOGS" "$DIR/conf" "$DIR/work" "$DIR/local" "$DIR/tmp"
  # Keep every file the daemons (and the executors they start) write inside DIR, on loopback.
  export SPARK_HOME SPARK_LOCAL_IP=127.0.0.1 SPARK_CONF_DIR="$DIR/conf" SPARK_LOG_DIR="$LOGS" \
    SPARK_PID_DIR="$PIDS" SPARK_LOCAL_DIRS="$DIR/local" SPARK_WORKER_DIR="$DIR/work" \
    SPARK_DAEMON_MEMORY="${SPARKTF_SPARK_DAEMON_MEMORY:-512m}" PYSPARK_PYTHON="$PY"
  export SPARK_DAEMON_JAVA_OPTS="$TAG -Djava.io.tmpdir=$DIR/tmp -XX:-UsePerfData"
  unset SPARK_MASTER_HOST SPARK_MASTER_PORT SPARK_MASTER_WEBUI_PORT SPARK_WORKER_CORES \
    SPARK_WORKER_MEMORY SPARK_WORKER_PORT SPARK_WORKER_WEBUI_PORT SPARK_WORKER_OPTS SPARK_MASTER_OPTS
}

start_worker() {  # $1 = worker number, $2 = the master's URL
  mkdir -p "$DIR/work/worker-$1"
  start_daemon "worker-$1" org.apache.spark.deploy.worker.Worker \
    --host 127.0.0.1 --port 0 --webui-port 0 --cores "$CORES" --memory "$MEMORY" \
    --work-dir "$DIR/work/worker-$1" "$2"
}

case "$cmd" in
  start)
    if pid="$(running_pid "$PIDS/master.pid")"; then
      missing=0
      for f in "$PIDS"/worker-*.pid; do running_pid "$f" >/dev/null || missing=$((missing + 1)); done
      if [ "$missing" = 0 ] && [ -f "$ENV_FILE" ]; then
        echo "spark-cluster.sh: already running (master pid $pid); stop it to change its size" >&2
        cat "$ENV_FILE"
        exit 0
      fi
      echo "spark-cluster.sh: a partly running cluster in $DIR; stopping it first" >&2
    fi
    stop_all >/dev/null || exit 1
    daemon_env
    # The cluster's shared secret (a standalone master takes no other): the daemons read it
    # from their spark-defaults.conf, the workers hand it to the executors in their
    # environment, applications read DIR/secret.conf. Private files only (umask 077).
    secret="$(od -An -tx1 -N32 /dev/urandom | tr -d ' \n')"
    [ "${#secret}" = 64 ] || { echo "spark-cluster.sh: could not read /dev/urandom" >&2; exit 1; }
    cat > "$SECRET_FILE" <<CONF
# Written by scripts/spark-cluster.sh start: this cluster's shared secret. Keep it private.
# spark-submit --properties-file $SECRET_FILE ... (sparktf submit reads it itself)
spark.authenticate              true
spark.authenticate.secret       $secret
spark.network.crypto.enabled    true
spark.io.encryption.enabled     true
CONF
    cat > "$DIR/conf/spark-defaults.conf" <<CONF
# Written by scripts/spark-cluster.sh start: the daemons of this cluster read only this file.
spark.worker.cleanup.enabled    true
spark.authenticate              true
spark.authenticate.secret       $secret
spark.network.crypto.enabled    true
CONF
    unset secret
    start_daemon master org.apache.spark.deploy.master.Master \
      --host 127.0.0.1 --port "$PORT" --webui-port "$WEBUI_PORT"
    deadline=$((SECONDS + START_TIMEOUT))
    url=""; ui=""
    until [ -n "$url" ] && [ -n "$ui" ]; do
      running_pid "$PIDS/master.pid" >/dev/null || fail_start "the master failed to start" "$LOGS/master.log"
      [ $SECONDS -lt $deadline ] || fail_start "the master did not start in ${START_TIMEOUT}s" "$LOGS/master.log"
      sleep 0.5
      url="$(grep -o 'Starting Spark master at spark://[^ ]*' "$LOGS/master.log" | head -1 | awk '{print $NF}')" || true
      ui_port="$(grep -o 'Bound MasterWebUI to .*, and started at http://[^ ]*' "$LOGS/master.log" \
                 | head -1 | sed 's/.*:\([0-9]*\)$/\1/')" || true
      [ -n "$ui_port" ] && ui="http://127.0.0.1:$ui_port"
    done
    for i in $(seq 1 "$WORKERS"); do start_worker "$i" "$url"; done
    until [ "$(master_json "$ui" 2>/dev/null || echo 0)" -ge "$WORKERS" ]; do
      running_pid "$PIDS/master.pid" >/dev/null || fail_start "the master died" "$LOGS/master.log"
      for i in $(seq 1 "$WORKERS"); do
        running_pid "$PIDS/worker-$i.pid" >/dev/null \
          || fail_start "worker $i failed to start" "$LOGS/worker-$i.log"
      done
      [ $SECONDS -lt $deadline ] \
        || fail_start "not all $WORKERS workers ALIVE at $ui after ${START_TIMEOUT}s" "$LOGS/worker-1.log"
      sleep 1
    done
    printf 'SPARK_MASTER_URL=%s\nSPARK_MASTER_WEBUI_URL=%s\nSPARK_CLUSTER_WORKERS=%s\nSPARK_CLUSTER_CORES=%s\nSPARK_CLUSTER_MEMORY=%s\nSPARK_SECRET_FILE=%s\n' \
      "$url" "$ui" "$WORKERS" "$CORES" "$MEMORY" "$SECRET_FILE" > "$ENV_FILE"
    cat "$ENV_FILE"
    ;;
  start-worker)
    # Starts worker N again in the running cluster (one lost or stopped): same secret, size
    # and master; returns once the master counts it ALIVE.
    [[ "${N:-}" =~ ^[1-9][0-9]*$ ]] || { echo "spark-cluster.sh: start-worker needs --worker N" >&2; exit 2; }
    pid="$(running_pid "$PIDS/master.pid")" && [ -f "$ENV_FILE" ] \
      || { echo "spark-cluster.sh: no running cluster in $DIR (start it first)" >&2; exit 1; }
    want="$(sed -n 's/^SPARK_CLUSTER_WORKERS=//p' "$ENV_FILE")"
    [ "$N" -le "$want" ] || { echo "spark-cluster.sh: the cluster has workers 1-$want, not $N" >&2; exit 2; }
    if running_pid "$PIDS/worker-$N.pid" >/dev/null; then
      echo "spark-cluster.sh: worker $N is running" >&2; cat "$ENV_FILE"; exit 0
    fi
    CORES="$(sed -n 's/^SPARK_CLUSTER_CORES=//p' "$ENV_FILE")"
    MEMORY="$(sed -n 's/^SPARK_CLUSTER_MEMORY=//p' "$ENV_FILE")"
    url="$(sed -n 's/^SPARK_MASTER_URL=//p' "$ENV_FILE")"
    ui="$(sed -n 's/^SPARK_MASTER_WEBUI_URL=//p' "$ENV_FILE")"
    daemon_env
    start_worker "$N" "$url"
    deadline=$((SECONDS + START_TIMEOUT))
    until [ "$(master_json "$ui" 2>/dev/null || echo 0)" -ge "$want" ]; do
      running_pid "$PIDS/worker-$N.pid" >/dev/null \
        || { echo "spark-cluster.sh: worker $N failed to start" >&2; tail -20 "$LOGS/worker-$N.log" >&2; exit 1; }
      [ $SECONDS -lt $deadline ] || { echo "spark-cluster.sh: worker $N not ALIVE after ${START_TIMEOUT}s" >&2; exit 1; }
      sleep 1
    done
    cat "$ENV_FILE"
    ;;
  stop)
    n="$(stop_all)" || exit 1
    if [ "$n" -gt 0 ]; then echo "spark-cluster.sh: stopped ($n daemons)"; else echo "spark-cluster.sh: not running"; fi
    ;;
  status)
    if pid="$(running_pid "$PIDS/master.pid")" && [ -f "$ENV_FILE" ]; then
      ui="$(sed -n 's/^SPARK_MASTER_WEBUI_URL=//p' "$ENV_FILE")"
      [ -x "$PY" ] || PY=python3
      alive="$(master_json "$ui" 2>/dev/null || echo '?')"
      want="$(sed -n 's/^SPARK_CLUSTER_WORKERS=//p' "$ENV_FILE")"
      echo "running (master pid $pid, $alive of $want workers ALIVE)"
      cat "$ENV_FILE"
    else
      leftovers="$(tagged_pids | tr '\n' ' ')"
      if [ -n "$leftovers" ]; then
        echo "partly running: processes $leftovers of $DIR; run stop"; exit 4
      fi
      echo "not running"; exit 3
    fi
    ;;
  *)
    echo "usage: scripts/spark-cluster.sh start|stop|status|start-worker [--workers N] [--cores C] [--memory M] [--dir DIR] (--help)" >&2
    exit 2 ;;
esac
