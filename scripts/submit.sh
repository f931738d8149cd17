#!/usr/bin/env bash
# spark-submit with sparktf's configuration: the profile's conf file (conf/spark/PROFILE.conf),
# the venv's python for the driver and the executors, worker reuse, and the HDFS settings.
#
#   scripts/submit.sh [--profile local|standalone|yarn|k8s|FILE] [SPARK-SUBMIT-OPTIONS] JOB [ARGS]
#
# SPARKTF_PROFILE sets the default profile (local: local-cluster[2,1,1024] on this machine).
# Any spark-submit option before JOB (--master, --conf k=v, --num-executors ...) overrides the
# profile. The master: --master, else $SPARKTF_SPARK_MASTER, else for --profile standalone the
# cluster scripts/spark-cluster.sh started (.local/spark-cluster/master.env), else the profile's.
# A training job gets one executor per TensorFlow process (chief + workers + ps): local-cluster[N],
# spark.cores.max = N x executor cores (standalone), spark.executor.instances = N (YARN, k8s),
# unless given; --executor-cores C also sets spark.task.cpus = C (one task per executor).
# The driver's console shows warnings and sparktf's progress (conf/log4j2.properties);
# --log-level DEBUG brings Spark's INFO lines back. Returns the job's exit code.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PROFILE="${SPARKTF_PROFILE:-local}"
if [ "${1:-}" = "--profile" ]; then PROFILE="$2"; shift 2; fi
case "${1:-}" in -h|--help|"") sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; [ -n "${1:-}" ]; exit $? ;; esac

PY="${SPARKTF_PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || { echo "submit.sh: $PY not found; run scripts/setup.sh first" >&2; exit 1; }
SUBMIT="${SPARKTF_SPARK_SUBMIT:-$ROOT/.venv/bin/spark-submit}"
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
# A quiet driver console (Spark's INFO lines off, conf/log4j2.properties) unless the job runs
# with --log-level DEBUG or SPARKTF_LOG_LEVEL=DEBUG.
level="${SPARKTF_LOG_LEVEL:-INFO}"
for ((i = 1; i <= $#; i++)); do
  case "${!i}" in
    --log-level=*) level="${!i#--log-level=}" ;;
    --log-level) j=$((i + 1)); level="${!j:-}" ;;
  esac
done
if [ "$level" != DEBUG ]; then
  extra+=(--conf "spark.driver.extraJavaOptions=-Dlog4j2.configurationFile=file:$ROOT/conf/log4j2.properties")
fi
# What the command line gives: the job, its arguments, and the spark-submit options before it.
job=""; job_args=(); before=(); given=" "
args=("$@"); i=0
while [ $i -lt ${#args[@]} ]; do
  arg="${args[i]}"
  if [ -n "$job" ]; then job_args+=("$arg"); i=$((i + 1)); continue; fi
  case "$arg" in
    --verbose|-v|--supervise) before+=("$arg"); i=$((i + 1)); continue ;;
    --conf=*) given+="${arg#--conf=} " ;;
    --*=*) given+="${arg%%=*} " ;;
    --conf) given+="${args[i+1]:-} " ;;
    -*) given+="$arg " ;;
    *) job="$arg"; i=$((i + 1)); continue ;;  # the application: jobs/X.py
  esac
  before+=("$arg"); i=$((i + 1))
  # an option without '=' takes the next word as its value
  if [[ "$arg" == -* && "$arg" != *=* && $i -lt ${#args[@]} ]]; then before+=("${args[i]}"); i=$((i + 1)); fi
done
opt() {  # value of spark-submit option $1 before the job, or of --conf key $2, if given
  local i j arg
  for ((i = 1; i <= ${#before[@]}; i++)); do
    arg="${before[i-1]}"
    case "$arg" in
      "$1") echo "${before[i]:-}"; return 0 ;;
      "$1="*) echo "${arg#*=}"; return 0 ;;
      "--conf") [[ "${before[i]:-}" == "$2="* ]] && { echo "${before[i]#*=}"; return 0; } ;;
      "--conf=$2="*) echo "${arg#--conf=$2=}"; return 0 ;;
    esac
  done
  return 1
}
profile_value() {  # value of key $1 in the profile's properties file
  awk -v k="$1" '{ sub(/^[ \t]+/, "") } $0 !~ /^[#!]/ { split($0, a, /[ \t=:]+/)
    if (a[1] == k) { v = $0; sub(/^[^ \t=:]+[ \t]*[=: \t][ \t]*/, "", v); print v } }' "$CONF" | tail -n 1
}
has() { [[ "$given" == *" $1 "* || "$given" == *" $1="* ]]; }

# The master: --master, else $SPARKTF_SPARK_MASTER, else (profile standalone) the cluster that
# scripts/spark-cluster.sh started (its master.env), else the profile's spark.master.
master="$(opt --master spark.master)" || master=""
if [ -z "$master" ] && [ -n "${SPARKTF_SPARK_MASTER:-}" ]; then
  master="$SPARKTF_SPARK_MASTER"; extra+=(--master "$master")
fi
if [ -z "$master" ] && [ "$PROFILE" = standalone ]; then
  env_file="${SPARKTF_SPARK_CLUSTER_DIR:-$ROOT/.local/spark-cluster}/master.env"
  if [ -f "$env_file" ]; then
    master="$(sed -n 's/^SPARK_MASTER_URL=//p' "$env_file")"
    [ -n "$master" ] && extra+=(--master "$master") \
      && echo "submit.sh: master $master (scripts/spark-cluster.sh, $env_file)" >&2
  fi
fi
master_given=1
[ -n "$master" ] || { master="$(profile_value spark.master)"; master_given=0; }
case "$master" in  # a driver next to a cluster on loopback talks to it on loopback
  local*|spark://127.0.0.1:*|spark://localhost:*)
    export SPARK_LOCAL_IP="${SPARK_LOCAL_IP:-127.0.0.1}"
    extra+=(--conf spark.driver.host=127.0.0.1 --conf spark.driver.bindAddress=127.0.0.1) ;;
esac

# A training job needs exactly one executor (one task slot) per TensorFlow process (chief +
# workers + ps): the count comes from the job's own flags and config.
n=""
name="$(basename "${job:-none}" .py)"
if [[ "$name" == train* ]]; then
  n="$(cd "$ROOT" && "$PY" -c 'import sys; from sparktf.jobs.train import executors_needed
print(executors_needed(sys.argv[1], sys.argv[2:]) or "")' "$name" "${job_args[@]}" 2>/dev/null \
      | tail -n 1)" || n=""
  [[ "$n" =~ ^[0-9]+$ ]] || n=""
fi
# Executor cores given on the command line also size the task (one task per executor).
cores="$(opt --executor-cores spark.executor.cores)" || cores=""
if [ -n "$cores" ] && ! has spark.task.cpus; then extra+=(--conf "spark.task.cpus=$cores"); fi
[ -n "$cores" ] || cores="$(profile_value spark.executor.cores)"
[[ "$cores" =~ ^[1-9][0-9]*$ ]] || cores=1

if [ "$PROFILE" = "local" ]; then
  extra+=(--conf "spark.executorEnv.PYTHONPATH=$ROOT")
else
  # Ship the library to remote executors (their python must have the pinned stack): a zip
  # per run, removed when the run ends.
  mkdir -p "$ROOT/.local"
  ship="$(mktemp -d "$ROOT/.local/submit-XXXXXX")"
  trap 'rm -rf "$ship"' EXIT
  (cd "$ROOT" && "$PY" -c 'import shutil, sys; shutil.make_archive(sys.argv[1], "zip", ".", "sparktf")' \
    "$ship/sparktf")
  py_files="$ship/sparktf.zip"
  if user_files="$(opt --py-files spark.submit.pyFiles)"; then  # one --py-files: both
    py_files+=",$user_files"
    kept=()
    for ((i = 0; i < ${#before[@]}; i++)); do
      case "${before[i]}" in
        --py-files) i=$((i + 1)) ;;
        --py-files=*) ;;
        *) kept+=("${before[i]}") ;;
      esac
    done
    set -- "${kept[@]}" "$job" "${job_args[@]}"
  fi
  extra+=(--py-files "$py_files")
fi
if [ -n "$n" ]; then
  case "$master" in
    local-cluster*|local*)
      # the profile's local-cluster[2,...] fits only two; a given --master is left alone
      [ "$master_given" = 0 ] && extra+=(--master "local-cluster[$n,1,1024]") ;;
    spark://*)
      if ! has spark.cores.max && ! has --total-executor-cores; then
        extra+=(--conf "spark.cores.max=$((n * cores))")
        echo "submit.sh: $n TensorFlow processes: spark.cores.max=$((n * cores)) ($cores per executor)" >&2
      fi ;;
    yarn*|k8s://*)
      if ! has spark.executor.instances && ! has --num-executors; then
        extra+=(--conf "spark.executor.instances=$n")
        echo "submit.sh: $n TensorFlow processes: spark.executor.instances=$n" >&2
      fi ;;
  esac
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
