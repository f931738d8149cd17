#!/usr/bin/env bash
# A real local HDFS on 127.0.0.1 (NameNode + DataNodes in one JVM, Hadoop's MiniDFSCluster).
#
#   scripts/hdfs.sh start|stop|status [--port N] [--http-port N] [--dir DIR] [--conf-dir DIR]
#                                     [--datanodes N] [--kerberos] [--host ADDRESS|NAME]
#
# Environment equivalents: SPARKTF_HDFS_PORT (8020), SPARKTF_WEBHDFS_PORT (9870),
# SPARKTF_HDFS_DIR (.local/hdfs), SPARKTF_HDFS_CONF_DIR (conf/hadoop), SPARKTF_HDFS_DATANODES (1).
# --datanodes N starts N DataNodes (each on its own 127.0.0.1 ports; one replica per block, so
# the files spread over them); keep N the same across restarts of one --dir. --host binds and
# advertises another address than 127.0.0.1, or a host name (a host of scripts/netcluster.sh);
# with --kerberos the services' principals are then hdfs/HOST and HTTP/HOST, and the KDC
# listens there too.
# `start` returns once HDFS accepts writes and prints HDFS_URI=..., WEBHDFS_URL=... and
# HADOOP_CONF_DIR=..., the conf dir into which it writes core-site.xml and hdfs-site.xml. Several instances can run side
# by side with different ports and directories. `stop` leaves no JVM behind and removes the
# configuration files its `start` wrote.
# --kerberos secures it with Hadoop's MiniKdc (realm EXAMPLE.COM, KDC on 127.0.0.1, a free port,
# TCP, in the same JVM): DIR/krb (mode 700) holds krb5.conf, service.keytab and user.keytab, whose
# principal is SPARKTF_HDFS_KRB_USER (the login name) @EXAMPLE.COM, a superuser of this HDFS.
# WebHDFS then asks for SPNEGO; `start` waits until that principal writes, and also prints
# KRB5_CONFIG=, SPARKTF_HDFS_PRINCIPAL= and SPARKTF_HDFS_KEYTAB=. Keys are new at every start.
# Every line is NAME=VALUE: `set -a; eval "$(scripts/hdfs.sh start --kerberos)"; set +a` exports
# them, and sparktf (jobs, `sparktf submit`, plain spark-submit) needs nothing more.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cmd="${1:-}"; shift || true
case "$cmd" in -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
PORT="${SPARKTF_HDFS_PORT:-8020}"
HTTP_PORT="${SPARKTF_WEBHDFS_PORT:-9870}"
DIR="${SPARKTF_HDFS_DIR:-$ROOT/.local/hdfs}"
CONF_DIR="${SPARKTF_HDFS_CONF_DIR:-$ROOT/conf/hadoop}"
START_TIMEOUT="${SPARKTF_HDFS_START_TIMEOUT:-120}"
JARS="${SPARKTF_HADOOP_JARS:-$ROOT/.local/hadoop/lib}"
DATANODES="${SPARKTF_HDFS_DATANODES:-1}"
KERBEROS=0
HOST="${SPARKTF_HDFS_HOST:-127.0.0.1}"
KRB_USER="${SPARKTF_HDFS_KRB_USER:-$(id -un)}"
while [ $# -gt 0 ]; do
  case "$1" in
    --port) PORT="$2"; shift 2 ;;
    --http-port) HTTP_PORT="$2"; shift 2 ;;
    --dir) DIR="$2"; shift 2 ;;
    --conf-dir) CONF_DIR="$2"; shift 2 ;;
    --datanodes) DATANODES="$2"; shift 2 ;;
    --kerberos) KERBEROS=1; shift ;;
    --host) HOST="$2"; shift 2 ;;
    -h|--help) sed -n '2,24p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "hdfs.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
case "$DATANODES" in
  ''|*[!0-9]*|0*) echo "hdfs.sh: --datanodes needs a whole number >= 1, got '$DATANODES'" >&2; exit 2 ;;
esac
# shellcheck source=scripts/lib/private_dir.sh
. "$ROOT/scripts/lib/private_dir.sh"
private_dir hdfs.sh "$DIR"  # what it sources and kills is trusted only from a private DIR
DIR="$(cd "$DIR" && pwd)"
PIDFILE="$DIR/hdfs.pid"
READY="$DIR/ready.env"
LOG="$DIR/hdfs.log"
KRB_DIR="$DIR/krb"
CONF_RECORD="$DIR/conf-dir"

running_pid() {
  [ -f "$PIDFILE" ] || return 1
  local pid; pid="$(cat "$PIDFILE")"
  kill -0 "$pid" 2>/dev/null && grep -q MiniHdfs "/proc/$pid/cmdline" 2>/dev/null || return 1
  echo "$pid"
}

write_conf() {  # $1 = hdfs uri, $2 = webhdfs url; with --kerberos what a client needs besides
  local core="" site=""
  if [ "$KERBEROS" = 1 ]; then
    core="
  <property><name>hadoop.security.authentication</name><value>kerberos</value></property>"
    local host="localhost"  # the services' principals name the host clients reach
    [ "$HOST" = 127.0.0.1 ] || host="$HOST"
    site="
  <property><name>dfs.namenode.kerberos.principal</name><value>hdfs/$host@$REALM</value></property>
  <property><name>dfs.datanode.kerberos.principal</name><value>hdfs/$host@$REALM</value></property>
  <property><name>dfs.web.authentication.kerberos.principal</name><value>HTTP/$host@$REALM</value></property>
  <property><name>dfs.block.access.token.enable</name><value>true</value></property>"
  fi
  mkdir -p "$CONF_DIR"
  printf '%s\n' "$CONF_DIR" > "$CONF_RECORD"  # `stop` removes what was written there
  cat > "$CONF_DIR/core-site.xml" <<XML
<?xml version="1.0"?>
<!-- Written by scripts/hdfs.sh start. -->
<configuration>
  <property><name>fs.defaultFS</name><value>$1</value></property>$core
</configuration>
XML
  cat > "$CONF_DIR/hdfs-site.xml" <<XML
<?xml version="1.0"?>
<!-- Written by scripts/hdfs.sh start. sparktf reads dfs.namenode.http-address for WebHDFS. -->
<configuration>
  <property><name>dfs.namenode.http-address</name><value>${2#http://}</value></property>
  <property><name>dfs.replication</name><value>1</value></property>
  <property><name>dfs.client.use.datanode.hostname</name><value>false</value></property>$site
</configuration>
XML
}

remove_conf() {  # the client configuration this instance's `start` wrote (not another's)
  local conf f uri
  [ -f "$CONF_RECORD" ] || return 0
  conf="$(cat "$CONF_RECORD")"
  uri="$(sed -n 's/^HDFS_URI=//p' "$READY" 2>/dev/null || true)"
  if [ -n "$uri" ] && [ -f "$conf/core-site.xml" ] && grep -qF "<value>$uri</value>" "$conf/core-site.xml"; then
    for f in core-site.xml hdfs-site.xml; do
      if [ -f "$conf/$f" ] && grep -q "Written by scripts/hdfs.sh start" "$conf/$f"; then
        rm -f "$conf/$f"
      fi
    done
    rmdir "$conf" 2>/dev/null || true
  fi
  rm -f "$CONF_RECORD"
}

probe_write() {  # $1 = webhdfs url: create, then delete, a small file through WebHDFS
  local f="/tmp/.sparktf-probe-$$"
  local loc
  loc=$(curl -sS -m 10 -i -X PUT "$1/webhdfs/v1$f?op=CREATE&overwrite=true&user.name=${USER:-root}" \
        | tr -d '\r' | awk 'tolower($1)=="location:"{print $2}') || return 1
  [ -n "$loc" ] || return 1
  curl -sS -m 10 -f -X PUT -T /dev/null "$loc" >/dev/null || return 1
  curl -sS -m 10 -f -X DELETE "$1/webhdfs/v1$f?op=DELETE&user.name=${USER:-root}" >/dev/null
}

port_busy() { (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null; }

case "$cmd" in
  start)
    if pid="$(running_pid)"; then
      echo "hdfs.sh: already running (pid $pid)" >&2
      cat "$READY"
      exit 0
    fi
    command -v java >/dev/null || { echo "hdfs.sh: java not found; install Java 17" >&2; exit 1; }
    ls "$JARS"/hadoop-*minicluster-*.jar >/dev/null 2>&1 \
      || { echo "hdfs.sh: Hadoop jars missing in $JARS; run scripts/setup.sh" >&2; exit 1; }
    if [ "$KERBEROS" = 1 ] && ! ls "$JARS"/hadoop-minikdc-*.jar >/dev/null 2>&1; then
      echo "hdfs.sh: --kerberos needs hadoop-minikdc in $JARS; run scripts/setup.sh" >&2; exit 1
    fi
    for p in "$PORT" "$HTTP_PORT"; do
      if port_busy "$p"; then echo "hdfs.sh: port $p on $HOST is in use" >&2; exit 1; fi
    done
    rm -f "$READY"
    krb_jvm=() krb_args=()
    if [ "$KERBEROS" = 1 ]; then
      # Fresh keys at every start; nothing in this folder is readable by other users.
      rm -rf "$KRB_DIR"
      mkdir -m 700 "$KRB_DIR"
      krb_jvm=(-Djava.security.krb5.conf="$KRB_DIR/krb5.conf")
      krb_args=(--kerberos-dir "$KRB_DIR" --kerberos-user "$KRB_USER")
    fi
    (
      [ "$KERBEROS" = 0 ] || umask 077
      # The JVM outlives this script: it must not keep descriptors it inherited, such as a
      # flock(1) lock the caller holds around `start`.
      for fd in /proc/$BASHPID/fd/*; do
        fd="${fd##*/}"
        if [ "$fd" -gt 2 ] && [ "$fd" -lt 255 ]; then eval "exec $fd>&-" 2>/dev/null || true; fi
      done
      exec nohup java -Xmx$((768 + 128 * (DATANODES - 1)))m \
        --add-opens java.base/java.lang=ALL-UNNAMED --add-opens java.base/java.util=ALL-UNNAMED \
        --add-opens java.base/java.io=ALL-UNNAMED --add-opens java.base/java.net=ALL-UNNAMED \
        --add-opens java.base/java.nio=ALL-UNNAMED --add-opens java.base/sun.nio.ch=ALL-UNNAMED \
        --add-opens java.base/java.lang.reflect=ALL-UNNAMED \
        -Dlog4j.configuration=file:/dev/null -Djava.net.preferIPv4Stack=true \
        "${krb_jvm[@]}" -cp "$JARS/*" "$ROOT/scripts/hdfs/MiniHdfs.java" \
        --nn-port "$PORT" --http-port "$HTTP_PORT" --base-dir "$DIR/cluster" --ready-file "$READY" \
        --datanodes "$DATANODES" --host "$HOST" "${krb_args[@]}" > "$LOG" 2>&1 < /dev/null
    ) &
    echo $! > "$PIDFILE"
    deadline=$((SECONDS + START_TIMEOUT))
    until [ -f "$READY" ]; do
      if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
        echo "hdfs.sh: HDFS failed to start; last lines of $LOG:" >&2; tail -20 "$LOG" >&2
        rm -f "$PIDFILE"; exit 1
      fi
      if [ $SECONDS -ge $deadline ]; then
        echo "hdfs.sh: HDFS not active after ${START_TIMEOUT}s; see $LOG" >&2
        "$0" stop --dir "$DIR" >/dev/null; exit 1
      fi
      sleep 0.5
    done
    # shellcheck disable=SC1090
    . "$READY"
    if [ "$KERBEROS" = 1 ]; then
      # MiniHdfs writes READY only once the user principal has written through RPC and WebHDFS.
      REALM="${SPARKTF_HDFS_PRINCIPAL##*@}"
    else
      until probe_write "$WEBHDFS_URL"; do
        if [ $SECONDS -ge $deadline ]; then
          echo "hdfs.sh: HDFS does not accept writes after ${START_TIMEOUT}s; see $LOG" >&2
          "$0" stop --dir "$DIR" >/dev/null; exit 1
        fi
        sleep 0.5
      done
    fi
    write_conf "$HDFS_URI" "$WEBHDFS_URL"
    CONF_DIR="$(cd "$CONF_DIR" && pwd)"
    echo "HADOOP_CONF_DIR=$CONF_DIR" >> "$READY"  # the client configuration, for Spark's JVMs
    cat "$READY"
    ;;
  stop)
    if pid="$(running_pid)"; then
      kill "$pid" 2>/dev/null || true
      for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
      if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; sleep 0.5; fi
      echo "hdfs.sh: stopped (pid $pid)"
    else
      echo "hdfs.sh: not running"
    fi
    remove_conf
    rm -f "$PIDFILE" "$READY"
    rm -rf "$KRB_DIR"
    ;;
  status)
    if pid="$(running_pid)"; then
      echo "running (pid $pid)"; cat "$READY"
    else
      echo "not running"; exit 3
    fi
    ;;
  *)
    echo "usage: scripts/hdfs.sh start|stop|status [--port N] [--http-port N] [--dir DIR] [--conf-dir DIR] [--datanodes N] [--kerberos]" >&2
    exit 2 ;;
esac
