"""Train the word-level LSTM language model on the Penn Treebank (PTB).

    ./scripts/submit.sh jobs/train_ptb.py                       # the embedded default
    ./scripts/submit.sh jobs/train_ptb.py --data hdfs://nn:8020/data/DATASET \\
        --model-dir hdfs://nn:8020/models/ptb_small [--strategy ps] [--input-mode spark]

With no arguments it trains on a small synthetic dataset it prepares under .local/demo,
on local executors. Defaults come from conf/jobs/train_ptb.json; flags override them
(--help lists all).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sparktf.console import run_job

if __name__ == "__main__":
    run_job("train_ptb")
