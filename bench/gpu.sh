#!/usr/bin/env bash
# GPU readiness in one run, on a machine with an NVIDIA GPU:
#   1. sets up the `gpu` extra (scripts/setup.sh --gpu: tensorflow[and-cuda]) unless
#      --no-setup, and checks that TensorFlow sees the GPU;
#   2. ResNet-20 training, fp32 then bf16: one plain Keras `fit` process on the GPU against
#      sparktf all-reduce fed from files and from Spark, one worker per GPU
#      (--gpus-per-worker 1), same global batch and window (bench/train.py --gpus N);
#   3. `sparktf.predict` with GPU executors against one TF process and predict_batch_udf
#      (bench/predict.py --gpus N);
#   4. prints the goals table: sparktf >= 0.9x the single process, >= 30k training
#      images/s for ResNet-20 bf16 (an H200-class GPU).
#
# Usage: bench/gpu.sh [--no-setup] [--gpus N] [--batch-size B] [--steps S] [-h|--help]
#
#   --no-setup      skip scripts/setup.sh --gpu (the .venv already has the gpu extra)
#   --gpus N        GPUs to use (default 1)
#   --batch-size B  global training batch (default 1024)
#   --steps S       training steps per run (default 100)
#
# The benchmarks themselves are limited to 5 minutes in all (set-up apart: the first
# `setup.sh --gpu` downloads the CUDA wheels). Results: bench/results/train-gpu-fp32-*.json,
# train-gpu-bf16-*.json, predict-gpu-*.json, logs bench/results/gpu-*.log; the results page
# goes to bench/results/RESULTS-gpu.md. Exits 2 without a GPU, 1 if a benchmark failed.
set -euo pipefail

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; }

SETUP=1
GPUS=1
BATCH=1024
STEPS=100
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --no-setup) SETUP=0; shift ;;
    --gpus) GPUS="${2:?--gpus needs a number}"; shift 2 ;;
    --batch-size) BATCH="${2:?--batch-size needs a number}"; shift 2 ;;
    --steps) STEPS="${2:?--steps needs a number}"; shift 2 ;;
    *) echo "gpu.sh: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
for v in "$GPUS" "$BATCH" "$STEPS"; do
  [[ "$v" =~ ^[1-9][0-9]*$ ]] || { echo "gpu.sh: expected a whole number >= 1, got $v" >&2; exit 2; }
done

cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-.venv/bin/python}"
RESULTS=bench/results
mkdir -p "$RESULTS"

found=0
if command -v nvidia-smi >/dev/null 2>&1; then
  found=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | grep -c . || true)
fi
if [[ "$found" -lt "$GPUS" ]]; then
  echo "gpu.sh: needs $GPUS NVIDIA GPU(s); nvidia-smi found ${found}" >&2
  exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader

if [[ $SETUP -eq 1 ]]; then
  t0=$SECONDS
  scripts/setup.sh --gpu
  echo "gpu.sh: set-up took $((SECONDS - t0)) s"
fi
"$PYTHON" - "$GPUS" <<'EOF'
import sys
import tensorflow as tf

gpus = tf.config.list_physical_devices("GPU")
print(f"TensorFlow {tf.__version__} sees {len(gpus)} GPU(s)")
if len(gpus) < int(sys.argv[1]):
    sys.exit(f"gpu.sh: TensorFlow sees {len(gpus)} GPU(s), {sys.argv[1]} needed: "
             "is the gpu extra installed (scripts/setup.sh --gpu)?")
EOF

since=$(date +%s)
deadline=$((SECONDS + 300))
failed=()
run() {  # run NAME ARGS...: one benchmark, within what is left of the 5 minutes
  local name=$1; shift
  local left=$((deadline - SECONDS))
  if [[ $left -le 10 ]]; then
    echo "== $name: skipped, the 5 minutes are used up"; failed+=("$name"); return
  fi
  echo "== $name: $* (log: $RESULTS/gpu-$name.log, ${left} s left)"
  if ! timeout --signal=TERM --kill-after=30 "$left" "$PYTHON" "$@" >"$RESULTS/gpu-$name.log" 2>&1; then
    failed+=("$name")
    tail -n 15 "$RESULTS/gpu-$name.log" | sed 's/^/   | /'
  fi
}
common=(--gpus "$GPUS" --batch-size "$BATCH" --steps "$STEPS" --rounds 1
        --configs allreduce/files,allreduce/spark --threads "$(nproc)")
run train-fp32 bench/train.py "${common[@]}" --precision fp32 --tag gpu-fp32
run train-bf16 bench/train.py "${common[@]}" --precision bf16 --tag gpu-bf16
run predict bench/predict.py --gpus "$GPUS" --rounds 1 --tag gpu --models resnet20 mnist_mlp

"$PYTHON" bench/results.py --since "$since" --names train-gpu-fp32 train-gpu-bf16 predict-gpu \
  --output "$RESULTS/RESULTS-gpu.md" --note "bench/gpu.sh: $GPUS GPU(s), batch $BATCH, $STEPS steps." || true
if [[ ${#failed[@]} -gt 0 ]]; then
  echo "gpu.sh: failed or not run: ${failed[*]}" >&2
  exit 1
fi
