"""Convert PTB (simple-examples ptb.{train,valid,test}.txt) to TFRecord and Parquet.

    ./scripts/submit.sh jobs/convert_ptb.py --input IN --output OUT [--format tfrecord,parquet]
        [--shards N] [--overwrite] [--seq-len 21] [--unk WORD]

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
    run_job("convert_ptb")
