"""Train any model of the registry on Spark executors (TensorFlowOnSpark).

    ./scripts/submit.sh jobs/train.py --model mnist_mlp --data hdfs://nn:8020/data/mnist \\
        --strategy ps --num-workers 2 --num-ps 1 --model-dir hdfs://nn:8020/models/mlp

Defaults come from conf/jobs/train.json; flags override them (--help lists all).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sparktf.console import run_job

if __name__ == "__main__":
    run_job("train")
