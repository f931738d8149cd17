"""CIFAR-format conversion: the Spark job against one plain process writing both formats.

    .venv/bin/python bench/convert.py [--sizes 12500 50000] [--shards 4] [--rounds 3]
        [--budget SECONDS]

For two input sizes (training records; the test split gets a fifth as many: 50,000 gives
the 60k records of CIFAR-10), per round (round robin, medians count; bench/common.py),
every time the whole job from its start to the last file written:

- ``spark_both``: ``sparktf.datasets.conversion`` writing TFRecord and Parquet (local disk)
  through a local Spark session, at both sizes, with the peak memory of the process tree;
- ``spark_tfrecord`` / ``spark_parquet``: one format alone, at the larger size;
- ``spark_tfrecord_small_dataset`` / ``spark_parquet_small_dataset``: one format alone for a
  2k-record dataset (``--overhead-records``): the fixed overhead;
- ``book_both``: one plain process (the reference way) from one pass over the input: numpy
  parse, ``tf.train.Example`` + ``tf.io.TFRecordWriter`` (one Example per record,
  written in order, as the reference writer does),
  plus pyarrow for the Parquet (``pq.write_table``), at the larger size;
- ``numpy_sparktf_tfrecord``: numpy parsing plus sparktf's vectorised Example/TFRecord
  encoder, no Spark (byte-identical TFRecord output: checked), at the larger size.

The Spark session is started and warmed up before and reported apart (``startup_s``).
Goals: Parquet alone <= 1.3x the TFRecord alone's time; both formats
>= 1.0x that plain process (speed); <= 3 s per format for the 2k-record dataset; peak memory
flat (<= 1.2x) from the smaller to the larger size. Prints a JSON result and writes it to
bench/results/.
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
from sparktf.datasets import conversion as convert
from sparktf.datasets import sources, tfrecord
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


def baseline_tf(raw: Path, out: Path, parquet: bool = True) -> int:
    """The reference way, one process, one pass: numpy parse + tf.train.Example +
    tf.io.TFRecordWriter, and (``parquet``) pyarrow's ParquetWriter for the same records."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import tensorflow as tf

    schema = pa.schema([("image", pa.binary()), ("label", pa.int64()), ("id", pa.int64())])

    def int64(value):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=[int(value)]))

    records = 0
    for index, path in enumerate(raw_files(raw)):
        table = pq.ParquetWriter(str(out / f"{path.stem}.parquet"), schema) if parquet else None
        with tf.io.TFRecordWriter(str(out / f"{path.stem}.tfrecord")) as writer:
            for start, labels, images in parse_blocks(path):
                if table is not None:
                    table.write_table(
                        pa.table(
                            {
                                "image": pa.array([i.tobytes() for i in images], pa.binary()),
                                "label": pa.array(labels, pa.int64()),
                                "id": pa.array(
                                    make_id(index, np.arange(start, start + len(labels))),
                                    pa.int64(),
                                ),
                            },
                            schema=schema,
                        )
                    )
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
        if table is not None:
            table.close()
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
    parser.add_argument(
        "--overhead-records",
        type=int,
        default=2_040,
        help="records of the small dataset that measures the fixed overhead",
    )
    common.add_rounds(parser)
    parser.add_argument("--workdir", default=None, help="scratch directory (default: a temp dir)")
    args = parser.parse_args(argv)
    if not 0 < args.sizes[0] < args.sizes[1]:
        parser.error("--sizes: expected two record counts, the smaller first")
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="sparktf-bench-convert-"))
    work.mkdir(parents=True, exist_ok=True)
    small_n, large_n = args.sizes
    result: dict = {
        "benchmark": "convert",
        "machine": common.machine(),
        "shards": args.shards,
        "sizes_train_records": args.sizes,
        "window": "whole conversion, start to last file written; Spark start-up apart",
        "startup_s": {},
    }
    spark = None
    try:
        from sparktf.spark import get_session

        seconds, spark = common.timed(get_session, "sparktf-bench-convert")
        result["startup_s"]["spark_session"] = round(seconds, 2)
        write_cifar10(work / "warm", n_train=200, n_test=40, seed=9)
        seconds, _ = common.timed(
            convert.convert,
            "cifar10",
            str(work / "warm"),
            str(work / "warm-out"),
            output_formats=["tfrecord", "parquet"],
            shards=args.shards,
            spark=spark,
        )
        result["startup_s"]["warm_up_conversion"] = round(seconds, 2)
        import tensorflow as tf  # imported (and its writer warmed up) outside the timings

        with tf.io.TFRecordWriter(str(work / "tf-warmup.tfrecord")) as writer:
            writer.write(b"warm-up")

        raws = {}
        for n in (small_n, large_n):
            raws[n] = work / f"raw-{n}"
            write_cifar10(raws[n], n_train=n, n_test=max(1, n // 5), seed=n)
        tiny = args.overhead_records
        raws["tiny"] = work / "raw-tiny"
        write_cifar10(raws["tiny"], n_train=tiny * 5 // 6, n_test=tiny - tiny * 5 // 6, seed=3)
        records = {n: sum(p.stat().st_size for p in raw_files(raws[n])) // RECORD for n in raws}
        result["records"] = {str(k): v for k, v in records.items()}

        def spark_job(n, formats_, out):
            return common.timed(
                convert.convert,
                "cifar10",
                str(raws[n]),
                str(work / out),
                output_formats=formats_,
                shards=args.shards,
                spark=spark,
                overwrite=True,
            )[0]

        seconds, memory_peak = common.Rounds(), common.Rounds()
        memory_by_kind: dict = {}
        rounds = common.RoundBudget.from_args(args)
        for _ in rounds:
            for n in (small_n, large_n):
                with common.PeakMemory() as memory:
                    seconds.add(f"spark_both_{n}", spark_job(n, ["tfrecord", "parquet"], f"s-{n}"))
                memory_peak.add(f"spark_both_{n}", memory.peak_total)
                memory_by_kind.setdefault(str(n), []).append(memory.report())
            seconds.add("spark_tfrecord", spark_job(large_n, ["tfrecord"], "s-tfrecord"))
            seconds.add("spark_parquet", spark_job(large_n, ["parquet"], "s-parquet"))
            seconds.add(
                "spark_tfrecord_small_dataset", spark_job("tiny", ["tfrecord"], "s-tiny-tfr")
            )
            seconds.add("spark_parquet_small_dataset", spark_job("tiny", ["parquet"], "s-tiny-pq"))
            for name, fn in (
                ("book_both", baseline_tf),
                ("numpy_sparktf_tfrecord", baseline_sparktf),
            ):
                out = work / f"base-{name}"
                shutil.rmtree(out, ignore_errors=True)
                out.mkdir()
                took, written = common.timed(fn, raws[large_n], out)
                assert written == records[large_n], (name, written, records[large_n])
                seconds.add(name, took)
        rounds.record(result)
        result["seconds"] = seconds.report(2)
        med = seconds.medians()
        result["records_per_s"] = {
            k: round(records[large_n if not k.endswith("small_dataset") else "tiny"] / v)
            for k, v in med.items()
            if not k.startswith("spark_both_")
        }
        for n in (small_n, large_n):
            result["records_per_s"][f"spark_both_{n}"] = round(records[n] / med[f"spark_both_{n}"])
        result["peak_memory_spark_both"] = memory_by_kind
        # The sparktf baseline writes the very bytes the Spark job writes.
        spark_parts = sorted((work / f"s-{large_n}" / "train" / "tfrecord").iterdir())
        spark_bytes = b"".join(p.read_bytes() for p in spark_parts)
        base_bytes = b"".join(
            p.read_bytes()
            for p in sorted((work / "base-numpy_sparktf_tfrecord").iterdir())
            if p.name.startswith("data_batch")
        )
        result["baseline_bytes_identical_to_spark_output"] = spark_bytes == base_bytes
        mem = memory_peak.medians()
        growth = mem[f"spark_both_{large_n}"] / mem[f"spark_both_{small_n}"]
        result["peak_memory_growth_large_vs_small"] = round(growth, 3)
        result["goals"] = {
            f"Parquet time / TFRecord time, {records[large_n]} records": common.goal(
                med["spark_parquet"] / med["spark_tfrecord"], 1.3, "<="
            ),
            f"both formats / book's way (speed), {records[large_n]} records": common.goal(
                med["book_both"] / med[f"spark_both_{large_n}"], 1.0
            ),
            f"{records['tiny']} records, TFRecord (s)": common.goal(
                med["spark_tfrecord_small_dataset"], 3.0, "<="
            ),
            f"{records['tiny']} records, Parquet (s)": common.goal(
                med["spark_parquet_small_dataset"], 3.0, "<="
            ),
            f"peak memory {records[large_n]} / {records[small_n]} records": common.goal(
                growth, 1.2, "<="
            ),
        }
        result["finished_at"] = time.strftime("%Y-%m-%d %H:%M:%S")
        common.write_results("convert", result)
    finally:
        if spark is not None:
            spark.stop()
        if not args.workdir:
            storage.delete(str(work))
    return 0


if __name__ == "__main__":
    sys.exit(main())
