#!/usr/bin/env bash
# spark-submit with sparktf's configuration, from the checkout: `sparktf submit` run with the
# checkout's venv (scripts/setup.sh). Everything it does is in `sparktf submit --help`.
#
#   scripts/submit.sh [--profile local|standalone|yarn|k8s|FILE] [--ship-env] [--dry-run]
#                     [SPARK-SUBMIT-OPTIONS] JOB [ARGS]
#
# JOB: a file (jobs/train_resnet.py) or a job name (train_resnet). SPARKTF_PYTHON picks
# another Python with sparktf installed. Returns the job's exit code.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PY="${SPARKTF_PYTHON:-$ROOT/.venv/bin/python}"
[ -x "$PY" ] || { echo "submit.sh: $PY not found; run scripts/setup.sh first" >&2; exit 1; }
exec "$PY" -m sparktf submit "$@"
