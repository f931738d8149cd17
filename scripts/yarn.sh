#!/usr/bin/env bash
# A real single-node YARN on 127.0.0.1 (ResourceManager + one NodeManager in one JVM, Hadoop's
# MiniYARNCluster), next to the local HDFS of scripts/hdfs.sh.
#
#   scripts/yarn.sh start|stop|status [--dir DIR] [--conf-dir DIR] [--rm-port N] [--web-port N]
#                   [--scheduler-port N] [--tracker-port N] [--admin-port N] [--memory-mb N] [--vcores N]
#
# Ports are free ones unless given (0 = free). Environment equivalents: SPARKTF_YARN_DIR
# (.local/yarn), SPARKTF_HDFS_CONF_DIR (conf/hadoop), SPARKTF_YARN_RM_PORT,
# SPARKTF_YARN_WEB_PORT, SPARKTF_YARN_MEMORY_MB (8192), SPARKTF_YARN_VCORES (8).
# `start` returns once the NodeManager has registered; it prints YARN_RM=127.0.0.1:PORT and
# YARN_WEBAPP=http://127.0.0.1:PORT and writes yarn-site.xml into the conf dir (the dir where
# scripts/hdfs.sh writes core-site.xml), so `HADOOP_CONF_DIR=DIR spark-submit --master yarn`
# submits to it; it never replaces a yarn-site.xml that it did not write. `stop` stops every
# container and leaves no JVM behind.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cmd="${1:-}"; shift || true
DIR="${SPARKTF_YARN_DIR:-$ROOT/.local/yarn}"
CONF_DIR="${SPARKTF_HDFS_CONF_DIR:-$ROOT/conf/hadoop}"
RM_PORT="${SPARKTF_YARN_RM_PORT:-0}"
WEB_PORT="${SPARKTF_YARN_WEB_PORT:-0}"
SCHEDULER_PORT=0
TRACKER_PORT=0
ADMIN_PORT=0
MEMORY_MB="${SPARKTF_YARN_MEMORY_MB:-8192}"
VCORES="${SPARKTF_YARN_VCORES:-8}"
START_TIMEOUT="${SPARKTF_YARN_START_TIMEOUT:-120}"
JARS="${SPARKTF_HADOOP_JARS:-$ROOT/.local/hadoop/lib}"
usage() {
  echo "usage: scripts/yarn.sh start|stop|status [--dir DIR] [--conf-dir DIR] [--rm-port N]" \
    "[--web-port N] [--scheduler-port N] [--tracker-port N] [--admin-port N] [--memory-mb N]" \
    "[--vcores N]" >&2
}
case "$cmd" in -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
  esac
  [ $# -ge 2 ] || { echo "yarn.sh: option $1 needs a value" >&2; usage; exit 2; }
  case "$1" in
    --dir) DIR="$2" ;;
    --conf-dir) CONF_DIR="$2" ;;
    --rm-port) RM_PORT="$2" ;;
    --web-port) WEB_PORT="$2" ;;
    --scheduler-port) SCHEDULER_PORT="$2" ;;
    --tracker-port) TRACKER_PORT="$2" ;;
    --admin-port) ADMIN_PORT="$2" ;;
    --memory-mb) MEMORY_MB="$2" ;;
    --vcores) VCORES="$2" ;;
    *) echo "yarn.sh: unknown option $1" >&2; usage; exit 2 ;;
  esac
  shift 2
done
for value in "$RM_PORT" "$WEB_PORT" "$SCHEDULER_PORT" "$TRACKER_PORT" "$ADMIN_PORT" \
             "$MEMORY_MB" "$VCORES"; do
  [[ "$value" =~ ^[0-9]+$ ]] || { echo "yarn.sh: expected a number, got '$value'" >&2; exit 2; }
done
# shellcheck source=scripts/lib/private_dir.sh
. "$ROOT/scripts/lib/private_dir.sh"
private_dir yarn.sh "$DIR"  # what it sources and kills is trusted only from a private DIR
DIR="$(cd "$DIR" && pwd)"
PIDFILE="$DIR/yarn.pid"
READY="$DIR/ready.env"
LOG="$DIR/yarn.log"
CLUSTER="$DIR/cluster"

running_pid() {
  [ -f "$PIDFILE" ] || return 1
  local pid; pid="$(cat "$PIDFILE")"
  kill -0 "$pid" 2>/dev/null && grep -q MiniYarn "/proc/$pid/cmdline" 2>/dev/null || return 1
  echo "$pid"
}

# Processes that run in this cluster's directory or name it on their command line: YARN
# containers (the application master, executors, their python workers and TensorFlow
# processes all run in the NodeManager's container dirs).
container_pids() {
  local procs=(/proc/[0-9]*)  # listed before grep starts: its own command line is no match
  {
    grep -lsF -- "$CLUSTER/" "${procs[@]/%//cmdline}" || true
    find "${procs[@]/%//cwd}" -maxdepth 0 -lname "$CLUSTER/*" 2>/dev/null || true
  } | sed -n 's|^/proc/\([0-9]*\)/.*|\1|p' | sort -u
}

MARK="Written by scripts/yarn.sh start"
conf_is_ours() {  # no yarn-site.xml yet, or one this script wrote
  [ ! -e "$CONF_DIR/yarn-site.xml" ] || grep -qF "$MARK" "$CONF_DIR/yarn-site.xml"
}

write_conf() {  # from the ready file's YARN_* values
  mkdir -p "$CONF_DIR"
  cat > "$CONF_DIR/yarn-site.xml.tmp" <<XML
<?xml version="1.0"?>
<!-- $MARK (MiniYARNCluster in $DIR). -->
<configuration>
  <property><name>yarn.resourcemanager.hostname</name><value>127.0.0.1</value></property>
  <property><name>yarn.resourcemanager.address</name><value>$YARN_RM</value></property>
  <property><name>yarn.resourcemanager.scheduler.address</name><value>$YARN_SCHEDULER</value></property>
  <property><name>yarn.resourcemanager.resource-tracker.address</name><value>$YARN_TRACKER</value></property>
  <property><name>yarn.resourcemanager.admin.address</name><value>$YARN_ADMIN</value></property>
  <property><name>yarn.resourcemanager.webapp.address</name><value>$YARN_WEBAPP</value></property>
  <!-- A client gives up on a stopped ResourceManager after a minute, not the default 15. -->
  <property><name>yarn.resourcemanager.connect.max-wait.ms</name><value>60000</value></property>
  <property><name>yarn.nodemanager.resource.memory-mb</name><value>$YARN_MEMORY_MB</value></property>
  <property><name>yarn.nodemanager.resource.cpu-vcores</name><value>$YARN_VCORES</value></property>
  <property><name>yarn.scheduler.minimum-allocation-mb</name><value>256</value></property>
  <property><name>yarn.scheduler.maximum-allocation-mb</name><value>$YARN_MEMORY_MB</value></property>
</configuration>
XML
  mv "$CONF_DIR/yarn-site.xml.tmp" "$CONF_DIR/yarn-site.xml"
}

# The ResourceManager's REST API answers and counts an active NodeManager.
rm_ready() {
  curl -sS -m 10 -f "http://$YARN_WEBAPP/ws/v1/cluster/metrics" 2>/dev/null \
    | grep -q '"activeNodes":[1-9]'
}

port_busy() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

stop_cluster() {
  local pid
  if pid="$(running_pid)"; then
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; sleep 0.5; fi
    echo "yarn.sh: stopped (pid $pid)"
  else
    echo "yarn.sh: not running"
  fi
  # The NodeManager kills its containers when it stops; a container it lost (a JVM killed
  # with -9) is stopped here.
  local left; left="$(container_pids)"
  if [ -n "$left" ]; then
    echo "yarn.sh: stopping leftover container processes: $(echo $left)" >&2
    # shellcheck disable=SC2086
    kill $left 2>/dev/null || true
    sleep 2
    # shellcheck disable=SC2086
    kill -9 $(container_pids) 2>/dev/null || true
  fi
  rm -f "$PIDFILE" "$READY"
}

case "$cmd" in
  start)
    if pid="$(running_pid)"; then
      echo "yarn.sh: already running (pid $pid)" >&2
      # shellcheck disable=SC1090
      . "$READY"
      conf_is_ours && write_conf
      echo "YARN_RM=$YARN_RM"
      echo "YARN_WEBAPP=http://$YARN_WEBAPP"
      exit 0
    fi
    command -v java >/dev/null || { echo "yarn.sh: java not found; install Java 17" >&2; exit 1; }
    conf_is_ours || { echo "yarn.sh: $CONF_DIR/yarn-site.xml was not written by yarn.sh;" \
      "give another --conf-dir (or SPARKTF_HDFS_CONF_DIR)" >&2; exit 1; }
    ls "$JARS"/hadoop-yarn-server-tests-*-tests.jar >/dev/null 2>&1 \
      || { echo "yarn.sh: Hadoop jars missing in $JARS; run scripts/setup.sh" >&2; exit 1; }
    for p in "$RM_PORT" "$WEB_PORT" "$SCHEDULER_PORT" "$TRACKER_PORT" "$ADMIN_PORT"; do
      if [ "$p" != 0 ] && port_busy "$p"; then
        echo "yarn.sh: port $p on 127.0.0.1 is in use" >&2; exit 1
      fi
    done
    # Containers start {{JAVA_HOME}}/bin/java: the NodeManager hands them its JAVA_HOME.
    if [ -z "${JAVA_HOME:-}" ]; then
      JAVA_HOME="$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")"
    fi
    export JAVA_HOME
    rm -f "$READY"
    (umask 077; mkdir -p "$CLUSTER")
    nohup java -Xmx768m \
      --add-opens java.base/java.lang=ALL-UNNAMED --add-opens java.base/java.util=ALL-UNNAMED \
      --add-opens java.base/java.io=ALL-UNNAMED --add-opens java.base/java.net=ALL-UNNAMED \
      --add-opens java.base/java.nio=ALL-UNNAMED --add-opens java.base/sun.nio.ch=ALL-UNNAMED \
      --add-opens java.base/java.lang.reflect=ALL-UNNAMED \
      -Dlog4j.configuration=file:/dev/null -Djava.net.preferIPv4Stack=true \
      -cp "$JARS/*" "$ROOT/scripts/yarn/MiniYarn.java" \
      --base-dir "$CLUSTER" --ready-file "$READY" \
      --rm-port "$RM_PORT" --web-port "$WEB_PORT" --scheduler-port "$SCHEDULER_PORT" \
      --tracker-port "$TRACKER_PORT" --admin-port "$ADMIN_PORT" \
      --memory-mb "$MEMORY_MB" --vcores "$VCORES" \
      > "$LOG" 2>&1 < /dev/null &
    echo $! > "$PIDFILE"
    deadline=$((SECONDS + START_TIMEOUT))
    until [ -f "$READY" ]; do
      if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
        echo "yarn.sh: YARN failed to start; last lines of $LOG:" >&2; tail -20 "$LOG" >&2
        rm -f "$PIDFILE"; exit 1
      fi
      if [ $SECONDS -ge $deadline ]; then
        echo "yarn.sh: YARN not up after ${START_TIMEOUT}s; see $LOG" >&2
        stop_cluster >/dev/null; exit 1
      fi
      sleep 0.5
    done
    # shellcheck disable=SC1090
    . "$READY"
    until rm_ready; do
      if [ $SECONDS -ge $deadline ]; then
        echo "yarn.sh: the ResourceManager reports no active NodeManager after" \
          "${START_TIMEOUT}s; see $LOG" >&2
        stop_cluster >/dev/null; exit 1
      fi
      sleep 0.5
    done
    write_conf
    echo "YARN_RM=$YARN_RM"
    echo "YARN_WEBAPP=http://$YARN_WEBAPP"
    ;;
  stop)
    stop_cluster
    ;;
  status)
    if pid="$(running_pid)"; then
      # shellcheck disable=SC1090
      . "$READY"
      echo "running (pid $pid)"
      echo "YARN_RM=$YARN_RM"
      echo "YARN_WEBAPP=http://$YARN_WEBAPP"
    else
      echo "not running"; exit 3
    fi
    ;;
  *)
    usage
    exit 2 ;;
esac
