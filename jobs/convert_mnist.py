"""Convert MNIST (IDX files, gzipped or not) to TFRecord and Parquet.

    ./scripts/submit.sh jobs/convert_mnist.py --input IN --output OUT [--format tfrecord,parquet]
        [--shards N] [--overwrite]

Spark parses and writes in parallel on the executors; OUT (local or hdfs://) gets
manifest.json and <split>/tfrecord, <split>/parquet (docs/datasets.md). Exit codes: 0 done,
2 bad input or flags (the message names the file and the byte offset or record), 1 other
failures. Nothing is published unless the whole conversion succeeds.
"""

from __future__ import annotations

from sparktf import cli
from sparktf.datasets import convert


def main(argv=None) -> int:
    parser = cli.parser(__doc__.split("\n", 1)[0], config_section="convert_mnist")
    convert.add_job_flags(parser, "mnist")
    return convert.run_job("mnist", cli.parse(parser, argv))


if __name__ == "__main__":
    cli.run(main)
