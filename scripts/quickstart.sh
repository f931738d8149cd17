#!/usr/bin/env bash
# From a fresh clone to a trained model: set-up, then jobs/train_resnet.py with its embedded
# default (local Spark executors, a small synthetic CIFAR-format dataset it makes itself, local
# disk), then a short summary: the model, its steps and metrics, where the export is, and the
# commands to run next.
#   scripts/quickstart.sh [TRAIN-ARGS]      (e.g. --steps 50)
# TRAIN-ARGS are jobs/train_resnet.py's flags: .venv/bin/python jobs/train_resnet.py --help
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
case " $* " in *" -h "*|*" --help "*) sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac
"$ROOT/scripts/setup.sh"
RUN_DIR="$(mktemp -d "${TMPDIR:-/tmp}/sparktf-quickstart.XXXXXX")"
trap 'rm -rf "$RUN_DIR"' EXIT
# The result goes to a file for the summary (the job prints it otherwise).
"$ROOT/scripts/submit.sh" "$ROOT/jobs/train_resnet.py" "$@" --result-json "$RUN_DIR/result.json"
cd "$ROOT"
"${SPARKTF_PYTHON:-$ROOT/.venv/bin/python}" -m sparktf.jobs.quickstart "$RUN_DIR/result.json" "$@"
