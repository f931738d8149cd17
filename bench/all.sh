#!/usr/bin/env bash
# Runs every benchmark (convert, read, feed, train, predict) under one measuring contract
# (bench/common.py) within a time budget (default 900 s, the goal all.wall_s), then prints one
# goals table (benchmark, goal, value, target, met) and writes the results page
# bench/RESULTS.md (bench/results.py: the table, the machine, the stack, the rounds each
# benchmark ran, the sizes, the budget and its shares). A run of every benchmark also records
# its wall time as the goal all.wall_s (at most 900 s on 2 cores; bench/results/all-<time>.json)
# and keeps the run's result files in bench/runs/<time>/, which the page names. A run with
# --only writes bench/results/RESULTS-partial.md instead.
#
# Usage: bench/all.sh [--only "NAME ..."] [--budget SECONDS] [--rounds N] [--timeout SECONDS]
#                     [-h|--help]
#
#   --only "NAME ..."   run only these benchmarks (default: convert read feed train predict)
#   --budget SECONDS    time for the whole run (default 900; 0: no budget, every benchmark runs
#                       exactly --rounds rounds, default 3, read 5). Each benchmark gets a share
#                       by weight (convert 7, read 11, feed 17, train 50, predict 18: about
#                       their parts of a measured run), of what is left when it starts (time one
#                       saves goes to the next; 10 s are kept for the results page), and runs
#                       with --budget <its share - 10 s> (the 10 s: its Spark/HDFS/S3 teardown):
#                       as many interleaved rounds as fit in it, counted from its start, at
#                       least 2, at most --rounds. A slower machine runs fewer rounds, never
#                       fails for time; each result records the rounds it ran.
#   --rounds N          the most rounds of every measurement (default 5 with a budget); the
#                       median counts
#   --timeout SECONDS   per-benchmark limit; a benchmark past it is stopped (default: 2.5 x its
#                       share + 120 s, so that 2 slow rounds still finish; 600 without a budget)
#
# Every benchmark writes bench/results/<name>-<time>.json; its output goes to
# bench/results/<name>.log. Each one starts what it needs (a Spark local-cluster session;
# read: a throwaway HDFS through bench/common.hdfs and, with its --s3, a throwaway S3 store,
# SeaweedFS through bench/common.s3 and scripts/s3.sh) and stops it when it ends, fails or is
# stopped. Exits 1 if a benchmark failed or left no result (the table still shows the rest).
# PYTHON (default .venv/bin/python) is the interpreter.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

ONLY="convert read feed train predict"
BUDGET=900
ROUNDS=""
TIMEOUT=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --only) ONLY="${2:?--only needs a list of benchmarks}"; shift 2 ;;
    --budget) BUDGET="${2:?--budget needs seconds}"; shift 2 ;;
    --rounds) ROUNDS="${2:?--rounds needs a number}"; shift 2 ;;
    --timeout) TIMEOUT="${2:?--timeout needs seconds}"; shift 2 ;;
    *) echo "all.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
[[ "$BUDGET" =~ ^[0-9]+$ ]] || { echo "all.sh: --budget expects whole seconds (0: none), got $BUDGET" >&2; exit 2; }
[[ -z "$ROUNDS" || "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "all.sh: --rounds expects a whole number >= 1, got $ROUNDS" >&2; exit 2; }
[[ -z "$TIMEOUT" || "$TIMEOUT" =~ ^[1-9][0-9]*$ ]] || { echo "all.sh: --timeout expects seconds, got $TIMEOUT" >&2; exit 2; }
BUDGET=$((10#$BUDGET))

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
RESULTS=bench/results
mkdir -p "$RESULTS"

# Sizes for a run of under 15 minutes on 2 cores (the defaults of each script are larger).
# train runs without its --s3 (allreduce/files-s3, training from files on a throwaway S3
# store): one more run a round and the store's start would leave train's share room for 4
# rounds of every configuration, not 5 (bench/README.md).
declare -A ARGS=(
  [convert]="--sizes 12500 50000 --shards 4"
  [read]="--records 48000 --shards 4 --rowwise-limit 500 --s3"
  [feed]="--rows 120000 --no-tfos"
  [train]="--steps 80 --batch-size 64"
  [predict]="--resnet-rows 4096 --mlp-rows 262144"
)
# Shares of the budget: about each benchmark's part (in %) of a measured run (672 s: convert 44,
# read 56, feed 117, train 359, predict 96; predict has since gained the Keras export and the
# streaming query, about 50 s at 2 rounds; read the S3 cases of --s3, about 14 s to start the
# store and copy the dataset, and 3 s a round: 8 -> 11).
declare -A WEIGHT=([convert]=7 [read]=11 [feed]=17 [train]=50 [predict]=18)
RESERVE=10  # seconds of the budget kept for bench/results.py at the end
MARGIN=10   # seconds of a share outside the benchmark's own --budget: its teardown and exit
declare -A DEFAULT_ROUNDS=([read]=5)
rounds_of() {
  if [[ $BUDGET -gt 0 ]]; then echo "${ROUNDS:-5}"; else echo "${ROUNDS:-${DEFAULT_ROUNDS[$1]:-3}}"; fi
}
for name in $ONLY; do
  [[ -n "${ARGS[$name]+x}" ]] || { echo "all.sh: unknown benchmark $name (expected: ${!ARGS[*]})" >&2; exit 2; }
done
weights() { local sum=0 name; for name in "$@"; do sum=$((sum + WEIGHT[$name])); done; echo "$sum"; }
read -r -a names <<<"$ONLY"
total_weight=$(weights "${names[@]}")

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
shares=()
for i in "${!names[@]}"; do
  name=${names[$i]}
  log="$RESULTS/$name.log"
  budget_args=()
  limit=${TIMEOUT:-600}
  share_text=""
  if [[ $BUDGET -gt 0 ]]; then
    # This benchmark's part of what is left (and of the whole, for the timeout).
    left=$((BUDGET - RESERVE - (SECONDS - started)))
    share=$(( (left > 0 ? left : 0) * WEIGHT[$name] / $(weights "${names[@]:$i}") ))
    fixed=$(( (BUDGET - RESERVE) * WEIGHT[$name] / total_weight ))
    own=$((share - MARGIN > 1 ? share - MARGIN : 1))
    budget_args=(--budget "$own")
    limit=${TIMEOUT:-$(( 5 * (share > fixed ? share : fixed) / 2 + 120 ))}
    shares+=("$name=$share")
    share_text="share $share s, "
  fi
  echo "== $name: $PYTHON bench/$name.py ${ARGS[$name]} --rounds $(rounds_of "$name")${budget_args[*]:+ ${budget_args[*]}} (${share_text}timeout $limit s; log: $log)"
  t0=$SECONDS
  # shellcheck disable=SC2086  # ARGS values are word lists
  timeout --signal=TERM --kill-after=90 "$limit" \
    "$PYTHON" "bench/$name.py" ${ARGS[$name]} --rounds "$(rounds_of "$name")" "${budget_args[@]}" \
    >"$log" 2>&1 &
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
if [[ $BUDGET -gt 0 ]]; then
  budget_note=" Budget ${BUDGET} s; shares (s, each benchmark's --budget 10 s less; at least 2 rounds, at most --rounds): ${shares[*]}."
else
  budget_note=" No budget: fixed rounds."
fi
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
  --note "bench/all.sh took ${wall} s (${took[*]}).${budget_note} Sizes: ${sizes}." || failed+=("results")
echo "bench/all.sh: ${wall} s; results page: $page"
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "bench/all.sh: failed: ${failed[*]}" >&2
  exit 1
fi
