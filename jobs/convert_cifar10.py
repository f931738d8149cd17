"""Convert CIFAR-10 (binary version, plain files or cifar-10-binary.tar.gz) to TFRecord and Parquet.

    ./scripts/submit.sh jobs/convert_cifar10.py --input IN --output OUT [--format tfrecord,parquet]
        [--shards N] [--overwrite]

Spark parses and writes in parallel on the executors; OUT (local or hdfs://) gets
manifest.json and <split>/tfrecord, <split>/parquet (docs/datasets.md). Exit codes: 0 done,
2 bad input or flags (the message names the file and the byte offset or record), 1 other
failures. Nothing is published unless the whole conversion succeeds.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sparktf.console import run_job

if __name__ == "__main__":
    run_job("convert_cifar10")
