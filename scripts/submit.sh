#!/usr/bin/env bash
# spark-submit with sparktf's configuration: the profile's conf file (conf/spark/PROFILE.conf),
# the venv's python for the driver and the executors, worker reuse, and the HDFS settings.
#
#   scripts/submit.sh [--profile local|standalone|yarn|k8s|FILE] [SPARK-SUBMIT-OPTIONS] JOB [ARGS]
#
# SPARKTF_PROFILE sets the default profile (local: local-cluster[2,1,1024] on this machine;
# a training job gets local-cluster[N,1,1024] with N its TensorFlow processes).
# Any spark-submit option before JOB (--master, --conf k=v, --num-executors ...) overrides the
# profile. Returns the job's exit code.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PROFILE="${SPARKTF_PROFILE:-local}"
if [ "${1:-}" = "--profile" ]; then PROFILE="$2"; shift 2; fi
case "${1:-}" in -h|--help|"") sed -n '2,10p' "$0" | sed 's/^# \{0,1\}//'; [ -n "${1:-}" ]; exit $? ;; esac

PY="${SPARKTF_PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || { echo "submit.sh: $PY not found; run scripts/setup.sh first" >&2; exit 1; }
SUBMIT="$ROOT/.venv/bin/spark-submit"
[ -x "$SUBMIT" ] || SUBMIT="$(command -v spark-submit)" || { echo "submit.sh: spark-submit not found" >&2; exit 1; }
CONF="$PROFILE"
[ -f "$CONF" ] || CONF="$ROOT/conf/spark/$PROFILE.conf"
[ -f "$CONF" ] || { echo "submit.sh: no Spark profile '$PROFILE' (conf/spark/*.conf)" >&2; exit 2; }

# Hadoop client configuration: $HADOOP_CONF_DIR, else what scripts/hdfs.sh start wrote.
if [ -z "${HADOOP_CONF_DIR:-}" ] && [ -f "$ROOT/conf/hadoop/core-site.xml" ]; then
  export HADOOP_CONF_DIR="$ROOT/conf/hadoop"
fi
export PYSPARK_PYTHON="$PY" PYSPARK_DRIVER_PYTHON="$PY"
extra=()
if [ "$PROFILE" = "local" ]; then
  export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
  extra+=(--conf "spark.executorEnv.PYTHONPATH=$ROOT")
  # A training job gets one local executor per TensorFlow process (chief + workers + ps),
  # unless --master is given: the profile's local-cluster[2,...] fits only two.
  job=""; job_args=(); has_master=0
  for ((i = 1; i <= $#; i++)); do
    arg="${!i}"
    if [ -z "$job" ]; then
      [ "$arg" = "--master" ] && has_master=1
      case "$arg" in *.py) job="$arg" ;; esac
    else
      job_args+=("$arg")
    fi
  done
  name="$(basename "$job" .py)"
  if [ "$has_master" = 0 ] && [[ "$name" == train* ]]; then
    n="$(cd "$ROOT" && "$PY" -c 'import sys; from sparktf.jobs.train import executors_needed
print(executors_needed(sys.argv[1], sys.argv[2:]) or "")' "$name" "${job_args[@]}" 2>/dev/null \
        | tail -n 1)" || n=""
    [[ "$n" =~ ^[0-9]+$ ]] && extra+=(--master "local-cluster[$n,1,1024]")
  fi
else
  # Ship the library to remote executors (their python must have the pinned stack).
  mkdir -p "$ROOT/.local"
  (cd "$ROOT" && "$PY" -c 'import shutil; shutil.make_archive(".local/sparktf", "zip", ".", "sparktf")')
  extra+=(--py-files "$ROOT/.local/sparktf.zip")
fi
for var in SPARKTF_WEBHDFS_URL SPARKTF_HDFS_USER HADOOP_CONF_DIR HADOOP_USER_NAME; do
  [ -n "${!var:-}" ] && extra+=(--conf "spark.executorEnv.$var=${!var}")
done
set +e
"$SUBMIT" --properties-file "$CONF" \
  --conf "spark.pyspark.python=$PY" --conf "spark.pyspark.driver.python=$PY" \
  --conf spark.python.worker.reuse=true \
  "${extra[@]}" "$@"
code=$?
exit $code
