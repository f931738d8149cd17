"""CIFAR-format conversion throughput: the Spark job against single-process baselines.

    .venv/bin/python bench/convert.py [--sizes 12500 50000] [--shards 4]

For each input size (training records; the test split gets a fifth as many) it times
``sparktf.datasets.convert`` to TFRecord on local disk through a local-cluster Spark
session (2 executors; the session is started and warmed up first and not timed), and in the
same run two single-process baselines writing the same records to TFRecord:

- ``numpy+sparktf``: numpy parsing plus sparktf's vectorised Example/TFRecord encoder
  (byte-identical output, no Spark);
- ``numpy+tf``: numpy parsing plus ``tf.train.Example`` and ``tf.io.TFRecordWriter`` (the
  usual way, as in the book's 4.1 writer).

Throughput is records/s and MB/s of raw input; ``ratio_*`` = Spark job / baseline. Peak
resident memory is sampled for the driver (Python and JVM) and the executors (JVMs and their
Python workers) during each Spark conversion: it should not grow with the input. Prints a
JSON result and writes it to bench/results/.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common  # also puts the checkout on sys.path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

from sparktf import storage
from sparktf.datasets import convert, sources, tfrecord
from sparktf.datasets.formats import make_id
from sparktf.datasets.synthetic import write_cifar10

RECORD = sources.CIFAR_RECORD_BYTES


def raw_files(directory: Path) -> list[Path]:
    return sorted(p for p in directory.iterdir() if p.suffix == ".bin")


def parse_blocks(path: Path, block: int = 1024):
    data = np.fromfile(path, dtype=np.uint8).reshape(-1, RECORD)
    for start in range(0, len(data), block):
        rows = data[start : start + block]
        images = rows[:, 1:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
        yield start, rows[:, 0].astype(np.int64), np.ascontiguousarray(images)


def baseline_sparktf(raw: Path, out: Path) -> int:
    """numpy parse + sparktf's vectorised encoder, one process, one file per input file."""
    records = 0
    for index, path in enumerate(raw_files(raw)):
        with open(out / f"{path.stem}.tfrecord", "wb") as f:
            for start, labels, images in parse_blocks(path):
                ids = make_id(index, np.arange(start, start + len(labels)))
                f.write(tfrecord.frame_images(images, labels, ids))
                records += len(labels)
    return records


def baseline_tf(raw: Path, out: Path) -> int:
    """numpy parse + tf.train.Example + tf.io.TFRecordWriter, one process."""
    import tensorflow as tf

    def int64(value):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))

    records = 0
    for index, path in enumerate(raw_files(raw)):
        with tf.io.TFRecordWriter(str(out / f"{path.stem}.tfrecord")) as writer:
            for start, labels, images in parse_blocks(path):
                for i, (label, image) in enumerate(zip(labels, images)):
                    example = tf.train.Example(
                        features=tf.train.Features(
                            feature={
                                "image": tf.train.Feature(
                                    bytes_list=tf.train.BytesList(value=[image.tobytes()])
                                ),
                                "label": int64(label),
                                "height": int64(32),
                                "width": int64(32),
                                "channels": int64(3),
                                "id": int64(make_id(index, start + i)),
                            }
                        )
                    )
                    writer.write(example.SerializeToString())
                records += len(labels)
    return records


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sizes",
        type=int,
        nargs=2,
        default=[12_500, 50_000],
        help="two training-record counts to convert (the test split gets a "
        "fifth as many: 50,000 gives the size of CIFAR-10)",
    )
    parser.add_argument("--shards", type=int, default=4, help="--shards of the conversion")
    parser.add_argument("--workdir", default=None, help="scratch directory (default: a temp dir)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="sparktf-bench-convert-"))
    work.mkdir(parents=True, exist_ok=True)
    result: dict = {
        "benchmark": "convert",
        "machine": common.machine(),
        "shards": args.shards,
        "runs": [],
    }
    try:
        from sparktf.spark import get_session

        seconds, spark = common.timed(get_session, "sparktf-bench-convert")
        result["spark_startup_s"] = round(seconds, 2)
        write_cifar10(work / "warm", n_train=200, n_test=40, seed=9)
        convert.convert(
            "cifar10",
            str(work / "warm"),
            str(work / "warm-out"),
            output_formats=["tfrecord", "parquet"],
            shards=args.shards,
            spark=spark,
        )

        for n in args.sizes:
            raw = work / f"raw-{n}"
            write_cifar10(raw, n_train=n, n_test=max(1, n // 5), seed=n)
            records = n + max(1, n // 5)
            mb = records * RECORD / 1e6
            run = {"records": records, "input_mb": round(mb, 1)}
            with common.PeakMemory() as memory:
                seconds, _ = common.timed(
                    convert.convert,
                    "cifar10",
                    str(raw),
                    str(work / f"spark-{n}"),
                    output_formats=["tfrecord"],
                    shards=args.shards,
                    spark=spark,
                )
            run["spark_tfrecord"] = {
                "seconds": round(seconds, 2),
                "records_per_s": round(records / seconds),
                "mb_per_s": round(mb / seconds, 1),
                **memory.report(),
            }
            run["_raw"] = raw
            result["runs"].append(run)

        # Both formats once, at the smaller size, for scale.
        raw = result["runs"][0]["_raw"]
        seconds, _ = common.timed(
            convert.convert,
            "cifar10",
            str(raw),
            str(work / "spark-both"),
            output_formats=["tfrecord", "parquet"],
            shards=args.shards,
            spark=spark,
        )
        records = result["runs"][0]["records"]
        result["spark_tfrecord_and_parquet_small"] = {
            "seconds": round(seconds, 2),
            "records_per_s": round(records / seconds),
        }
        spark.stop()

        import tensorflow as tf  # imported (and its writer warmed up) outside the timings

        with tf.io.TFRecordWriter(str(work / "tf-warmup.tfrecord")) as writer:
            writer.write(b"warm-up")
        for run in result["runs"]:
            raw = run.pop("_raw")
            spark_rate = run["spark_tfrecord"]["records_per_s"]
            for name, fn in (("numpy+sparktf", baseline_sparktf), ("numpy+tf", baseline_tf)):
                out = work / f"base-{name}-{run['records']}"
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir()
                seconds, written = common.timed(fn, raw, out)
                assert written == run["records"]
                run[f"baseline_{name}"] = {
                    "seconds": round(seconds, 2),
                    "records_per_s": round(written / seconds),
                    "mb_per_s": round(run["input_mb"] / seconds, 1),
                }
                run[f"ratio_vs_{name}"] = round(spark_rate / (written / seconds), 2)
        # The sparktf baseline writes the very bytes the Spark job writes.
        check = work / "base-numpy+sparktf-{}".format(result["runs"][0]["records"])
        spark_parts = sorted((work / f"spark-{args.sizes[0]}" / "train" / "tfrecord").iterdir())
        spark_bytes = b"".join(p.read_bytes() for p in spark_parts)
        base_bytes = b"".join(
            p.read_bytes() for p in sorted(check.iterdir()) if p.name.startswith("data_batch")
        )
        result["baseline_bytes_identical_to_spark_output"] = spark_bytes == base_bytes
        small, large = (r["spark_tfrecord"]["peak_mib_by_process_kind"] for r in result["runs"])
        result["peak_memory_growth_large_vs_small"] = {
            k: round(large.get(k, 0) / small[k], 2) for k in small if small[k]
        }
        result["finished_at"] = time.strftime("%Y-%m-%d %H:%M:%S")
        common.write_results("convert", result)
    finally:
        if not args.workdir:
            storage.delete(str(work))
    return 0


if __name__ == "__main__":
    sys.exit(main())
