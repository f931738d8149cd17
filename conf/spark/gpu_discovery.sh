#!/usr/bin/env bash
# Spark GPU discovery script: prints the GPUs of this host as Spark's resource JSON,
#   {"name": "gpu", "addresses": ["0", "1", ...]}
# Used through spark.{executor,worker}.resource.gpu.discoveryScript when a training job runs
# with --gpus-per-worker N (sparktf.train.gpu_spark_conf). CUDA_VISIBLE_DEVICES, when set,
# limits the list. No GPU (or no nvidia-smi): an empty address list.
set -uo pipefail
case "${1:-}" in -h|--help) sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
addresses=""
if command -v nvidia-smi >/dev/null 2>&1; then
  addresses="$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | tr -d ' ')"
fi
if [ -n "${CUDA_VISIBLE_DEVICES:-}" ] && [ -n "$addresses" ]; then
  allowed=",${CUDA_VISIBLE_DEVICES// /},"
  addresses="$(for a in $addresses; do case "$allowed" in *",$a,"*) echo "$a" ;; esac; done)"
fi
json=""
for a in $addresses; do json="${json:+$json,}\"$a\""; done
echo "{\"name\": \"gpu\", \"addresses\": [${json}]}"
