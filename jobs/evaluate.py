"""Evaluate an exported model on a dataset split and write the metrics as JSON.

    jobs/evaluate.py --model hdfs://nn:8020/models/resnet20/export \\
        --data hdfs://nn:8020/datasets/cifar10 [--split test] \\
        [--output hdfs://nn:8020/eval/resnet20.json] [--batch-size 256] [--overwrite]

Runs ``sparktf.predict`` over the split's Parquet on the executors and aggregates there.
Classifiers: accuracy, top-5 accuracy, per-class precision/recall/F1 and their macro
averages, the confusion matrix (rows = true labels), also drawn as
``<output stem>.confusion.png`` beside the JSON. The PTB language model: the corpus
perplexity, exp(total NLL / total predicted tokens). A DCGAN cannot be evaluated (exit 2).
The outputs are published atomically (local or hdfs://); a summary is printed.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sparktf.console import run_job

if __name__ == "__main__":
    run_job("evaluate")
