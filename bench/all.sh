#!/usr/bin/env bash
# Runs every benchmark (convert, read, feed, train, predict) under one measuring contract
# (bench/common.py), at sizes meant for a run of under 15 minutes on 2 cores (training takes most
# of it), then prints one goals table (benchmark, goal, value, target, met) and writes the
# results page bench/RESULTS.md (bench/results.py: the table, the machine, the stack, the
# sizes). A run of every benchmark also records its wall time as the goal all.wall_s (at most
# 900 s on 2 cores; bench/results/all-<time>.json) and keeps the run's result files in
# bench/runs/<time>/, which the page names. A run with --only writes
# bench/results/RESULTS-partial.md instead.
#
# Usage: bench/all.sh [--only "NAME ..."] [--rounds N] [--timeout SECONDS] [-h|--help]
#
#   --only "NAME ..."   run only these benchmarks (default: convert read feed train predict)
#   --rounds N          rounds of every measurement; the median counts (default 3; read: 5,
#                       its CPU-per-GB ratios need them on 2 cores)
#   --timeout SECONDS   per-benchmark limit; a benchmark past it is stopped (default 600)
#
# Every benchmark writes bench/results/<name>-<time>.json; its output goes to
# bench/results/<name>.log. Each one starts what it needs (a Spark local-cluster session;
# read: a throwaway HDFS through bench/common.hdfs) and stops it when it ends, fails or is
# stopped. Exits 1 if a benchmark failed or left no result (the table still shows the rest).
# PYTHON (default .venv/bin/python) is the interpreter.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

ONLY="convert read feed train predict"
ROUNDS=""
TIMEOUT=600
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --only) ONLY="${2:?--only needs a list of benchmarks}"; shift 2 ;;
    --rounds) ROUNDS="${2:?--rounds needs a number}"; shift 2 ;;
    --timeout) TIMEOUT="${2:?--timeout needs seconds}"; shift 2 ;;
    *) echo "all.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ -z "$ROUNDS" || "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "all.sh: --rounds expects a whole number >= 1, got $ROUNDS" >&2; exit 2; }
[[ "$TIMEOUT" =~ ^[1-9][0-9]*$ ]] || { echo "all.sh: --timeout expects seconds, got $TIMEOUT" >&2; exit 2; }

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
RESULTS=bench/results
mkdir -p "$RESULTS"

# Sizes for a run of under 15 minutes on 2 cores (the defaults of each script are larger).
declare -A ARGS=(
  [convert]="--sizes 12500 50000 --shards 4"
  [read]="--records 48000 --shards 4 --rowwise-limit 500"
  [feed]="--rows 120000 --no-tfos"
  [train]="--steps 80 --batch-size 64"
  [predict]="--resnet-rows 4096 --mlp-rows 262144"
)
declare -A DEFAULT_ROUNDS=([read]=5)
rounds_of() { echo "${ROUNDS:-${DEFAULT_ROUNDS[$1]:-3}}"; }
for name in $ONLY; do
  [[ -n "${ARGS[$name]+x}" ]] || { echo "all.sh: unknown benchmark $name (expected: ${!ARGS[*]})" >&2; exit 2; }
done

child=""
stop_child() {
  if [[ -n "$child" ]] && kill -0 "$child" 2>/dev/null; then
    kill -TERM "$child" 2>/dev/null || true  # the benchmark's finally blocks stop Spark/HDFS
    wait "$child" 2>/dev/null || true
  fi
}
trap 'stop_child; exit 130' INT TERM

since=$(date +%s)
started=$SECONDS
failed=()
took=()
for name in $ONLY; do
  log="$RESULTS/$name.log"
  echo "== $name: $PYTHON bench/$name.py ${ARGS[$name]} --rounds $(rounds_of "$name") (log: $log)"
  t0=$SECONDS
  # shellcheck disable=SC2086  # ARGS values are word lists
  timeout --signal=TERM --kill-after=90 "$TIMEOUT" \
    "$PYTHON" "bench/$name.py" ${ARGS[$name]} --rounds "$(rounds_of "$name")" >"$log" 2>&1 &
  child=$!
  rc=0
  wait "$child" || rc=$?
  child=""
  took+=("$name=$((SECONDS - t0))")
  if [[ $rc -ne 0 ]]; then
    failed+=("$name")
    echo "   FAILED (exit $rc) after $((SECONDS - t0)) s; last lines of $log:"
    tail -n 15 "$log" | sed 's/^/   | /'
  else
    echo "   done in $((SECONDS - t0)) s"
  fi
done
wall=$((SECONDS - started))

sizes=""
for name in $ONLY; do sizes+="${sizes:+; }$name: \`${ARGS[$name]} --rounds $(rounds_of "$name")\`"; done
page=bench/RESULTS.md
whole=()
if [[ "$ONLY" == "convert read feed train predict" ]]; then
  whole=(--wall-s "$wall" --took "${took[@]}" --keep "bench/runs/$(date +%Y%m%d-%H%M)")
  expect="$ONLY all"
else
  page="$RESULTS/RESULTS-partial.md"
  expect="$ONLY"
fi
echo
# shellcheck disable=SC2086
"$PYTHON" bench/results.py --since "$since" --output "$page" --expect $expect "${whole[@]}" \
  --note "bench/all.sh took ${wall} s (${took[*]}). Sizes: ${sizes}." || failed+=("results")
echo "bench/all.sh: ${wall} s; results page: $page"
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "bench/all.sh: failed: ${failed[*]}" >&2
  exit 1
fi
