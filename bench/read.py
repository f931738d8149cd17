"""Rows/s of the training readers against plain ``tf.data.TFRecordDataset``, same run.

    .venv/bin/python bench/read.py [--records 20000] [--batch-size 256] [--shards 4]

Converts a CIFAR-format dataset once (Spark, both formats, local disk), copies it to a
throwaway HDFS, then reads one epoch with each reader and reports rows/s and the ratio to
the baseline: ``tf.data.TFRecordDataset`` over the same local files with batched parsing
(``batch`` then ``tf.io.parse_example`` and ``decode_raw``), which is how a tuned local
pipeline reads. Readers: ``readers.tfrecord_dataset`` and ``readers.parquet_dataset``, local
and HDFS; and, for scale, petastorm's row-by-row ``make_reader`` on a slice of the data. The
readers run round robin, ``--rounds`` passes each, and the fastest pass counts (the machine
is shared). Peak memory is sampled while reading (the reader process; the idle driver JVM
of the finished conversion is listed apart). Prints JSON and writes it to bench/results/.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from sparktf import storage
from sparktf.datasets import convert, formats, petastorm_io
from sparktf.datasets.synthetic import write_cifar10


def one_pass(make) -> tuple[float, int]:
    dataset = make()
    started = time.perf_counter()
    rows = sum(int(batch["id"].shape[0]) for batch in dataset)
    return rows / (time.perf_counter() - started), rows


def baseline(files: list[str], batch_size: int):
    import tensorflow as tf

    spec = {k: v for k, v in formats.feature_spec("image").items() if k in ("image", "label", "id")}

    def parse(serialized):
        f = tf.io.parse_example(serialized, spec)
        image = tf.reshape(tf.io.decode_raw(f["image"], tf.uint8), [-1, 32, 32, 3])
        return {"image": image, "label": f["label"], "id": f["id"]}

    return (
        tf.data.TFRecordDataset(files, num_parallel_reads=4)
        .batch(batch_size)
        .map(parse, num_parallel_calls=tf.data.AUTOTUNE)
        .prefetch(tf.data.AUTOTUNE)
    )


def petastorm_rowwise(path: str, limit: int) -> float:
    with petastorm_io.make_reader(
        path, num_epochs=1, shuffle_row_groups=False, workers_count=2
    ) as reader:
        started = time.perf_counter()
        n = 0
        for _ in reader:
            n += 1
            if n >= limit:
                break
        return n / (time.perf_counter() - started)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=20_000, help="training records")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--shards", type=int, default=4, help="part files of the dataset")
    parser.add_argument(
        "--rounds", type=int, default=3, help="passes per reader, round robin; the fastest counts"
    )
    parser.add_argument(
        "--rowwise-limit",
        type=int,
        default=2_000,
        help="rows read by the row-by-row petastorm reader",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    result: dict = {
        "benchmark": "read",
        "machine": common.machine(),
        "records": args.records,
        "batch_size": args.batch_size,
        "shards": args.shards,
        "rows_per_s": {},
        "ratio_vs_baseline": {},
    }
    with (
        tempfile.TemporaryDirectory(prefix="sparktf-bench-read-") as work,
        common.hdfs() as hdfs_uri,
    ):
        from sparktf.spark import get_session

        write_cifar10(f"{work}/raw", n_train=args.records, n_test=10, seed=1)
        spark = get_session("sparktf-bench-read")
        local = f"{work}/cifar"
        convert.convert("cifar10", f"{work}/raw", local, shards=args.shards, spark=spark)
        spark.stop()
        remote = f"{hdfs_uri}/bench/cifar"
        seconds, _ = common.timed(storage.copy_tree, local, remote)
        result["copy_to_hdfs_s"] = round(seconds, 2)

        from sparktf.datasets import readers

        manifest = formats.load_manifest(local)
        files = [
            storage.parse(f).path
            for f in formats.split_files(manifest, local, "train", formats.TFRECORD)
        ]
        bs = args.batch_size
        cases = {
            "baseline_tfrecorddataset_local": lambda: baseline(files, bs),
            "tfrecord_local": lambda: readers.tfrecord_dataset(f"{local}/train", batch_size=bs),
            "tfrecord_hdfs": lambda: readers.tfrecord_dataset(f"{remote}/train", batch_size=bs),
            "parquet_local": lambda: readers.parquet_dataset(f"{local}/train", batch_size=bs),
            "parquet_hdfs": lambda: readers.parquet_dataset(f"{remote}/train", batch_size=bs),
            "tfrecord_local_shuffled": lambda: readers.tfrecord_dataset(
                f"{local}/train", batch_size=bs, shuffle=True
            ),
            "parquet_local_shuffled": lambda: readers.parquet_dataset(
                f"{local}/train", batch_size=bs, shuffle=True
            ),
        }
        with common.PeakMemory() as memory:
            best = {name: 0.0 for name in cases}
            for _ in range(args.rounds):  # round robin: load drifts hit all alike
                for name, make in cases.items():
                    rate, rows = one_pass(make)
                    assert rows == args.records, (name, rows)
                    best[name] = max(best[name], rate)
            result["rows_per_s"] = {name: round(rate) for name, rate in best.items()}
            limit = min(args.rowwise_limit, args.records)
            result["rows_per_s"]["petastorm_make_reader_rowwise_local"] = round(
                petastorm_rowwise(f"{local}/train/parquet", limit)
            )
        base = result["rows_per_s"]["baseline_tfrecorddataset_local"]
        result["ratio_vs_baseline"] = {
            k: round(v / base, 2) for k, v in result["rows_per_s"].items()
        }
        result["mb_per_s"] = {k: round(v * 3072 / 1e6, 1) for k, v in result["rows_per_s"].items()}
        result["peak_memory_while_reading"] = memory.report()
    result["finished_at"] = time.strftime("%Y-%m-%d %H:%M:%S")
    common.write_results("read", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
