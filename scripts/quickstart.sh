#!/usr/bin/env bash
# From a fresh clone to a trained model: set-up, then jobs/train_resnet.py with its embedded
# default (local Spark executors, a small CIFAR-format dataset it makes itself, local disk).
#   scripts/quickstart.sh [TRAIN-ARGS]      (e.g. --steps 50)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
"$ROOT/scripts/setup.sh"
exec "$ROOT/scripts/submit.sh" "$ROOT/jobs/train_resnet.py" "$@"
