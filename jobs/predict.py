"""Batch prediction: apply an exported model to a Parquet table, write the predictions.

    jobs/predict.py --model hdfs://nn:8020/models/resnet20/export \\
        --input hdfs://nn:8020/data/cifar10/test/parquet \\
        --output hdfs://nn:8020/predictions/cifar10-test [--batch-size 256]

``--input`` is a split of a converted dataset (its ``parquet/`` directory, or the split
directory holding it) or any Parquet table. ``--model`` is a SavedModel version directory,
``MODEL_DIR/export`` or ``MODEL_DIR`` (the highest version is used). The output is Parquet
with ``id`` and ``label`` (when the input has them), the prediction columns of
``sparktf.predict`` (``prediction``, ``probabilities``, ...) and ``model_version``; it is
written to a temporary sibling and renamed into place, so ``--output`` holds either the
whole result or nothing.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sparktf.console import run_job

if __name__ == "__main__":
    run_job("predict")
