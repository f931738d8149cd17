"""Rows/s that the ``spark`` input mode delivers into the TensorFlow processes, against
Spark's own pass over the same cached rows, in the same run.

    .venv/bin/python bench/feed.py [--rows 20000] [--batch-size 256] [--rounds 3]

CIFAR-sized rows (``image``: numpy.save bytes of a 32x32x3 uint8 array, ``label``, ``id``)
are cached in a local-cluster[2,1,1024] session. Per round, every rate over the same
window, from submitting the job that moves the rows to the last row arriving (see the
contract in bench/common.py):

* ``spark_arrow_pass``: Spark's pass over the cached rows into Python as Arrow batches
  (``mapInArrow``, touching every batch) -- the baseline, and the transport the feed uses;
* ``spark_rdd_pass``: Spark's classic pass, one Python row object per row
  (``df.rdd.map(...).sum()``);
* ``sparktf_feed``: :mod:`sparktf.train.feed` into the two TensorFlow processes of an
  all-reduce layout, which decode every row into exact numpy batches of ``--batch-size`` and
  drop them (no training); from the feed job's submit to the last row read. Starting the
  TensorFlow cluster is reported apart under ``startup_s`` (the driver submits the feed job
  once every feeding process has said hello; the detail keeps how long after the submit the
  last one had opened its feed, and the first-to-last-batch rate);
* ``petastorm_converter`` (``--petastorm``): petastorm's ``make_spark_converter`` (the
  DataFrame written to cached Parquet, then ``make_tf_dataset`` read in one process), from
  the converter's creation to the last row;
* ``tfos_datafeed`` (``--tfos``): TensorFlowOnSpark's own feed (``TFCluster.train`` +
  ``DataFeed.next_batch``) for scale, once, after the last round.

Goals: sparktf_feed >= 0.7x the Arrow pass, and >= 1.0x petastorm's
converter. Peak memory of the whole process tree is sampled. Prints JSON and writes it to
bench/results/.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

from sparktf import cli
from sparktf.datasets import petastorm_io

log = logging.getLogger("bench.feed")
SHAPE = (32, 32, 3)


def make_rows(batches):
    """mapInArrow: ids in, CIFAR-sized rows out (np.save bytes, as converted datasets hold)."""
    import numpy as np
    import pyarrow as pa

    from sparktf.datasets.formats import encode_ndarray_column

    for batch in batches:
        ids = batch.column(0).to_numpy()
        rng = np.random.default_rng(int(ids[0]) if len(ids) else 0)
        images = rng.integers(0, 256, (len(ids), *SHAPE), dtype=np.uint8)
        yield pa.RecordBatch.from_arrays(
            [
                encode_ndarray_column(images),
                pa.array(ids % 10, pa.int64()),
                pa.array(ids, pa.int64()),
            ],
            names=["image", "label", "id"],
        )


def arrow_pass(df) -> tuple[float, int]:
    def touch(batches):
        import pyarrow as pa

        rows = nbytes = 0
        for batch in batches:
            rows += batch.num_rows
            nbytes += sum(b.size for b in batch.column(0).buffers() if b is not None)
        yield pa.RecordBatch.from_pydict({"rows": [rows], "bytes": [nbytes]})

    started = time.perf_counter()
    rows = sum(r.rows for r in df.mapInArrow(touch, "rows long, bytes long").collect())
    return rows / (time.perf_counter() - started), rows


def rdd_pass(df) -> tuple[float, int]:
    started = time.perf_counter()
    rows = df.rdd.map(lambda r: 1 if len(r.image) else 0).sum()
    return rows / (time.perf_counter() - started), rows


def sparktf_feed(spark, df, rows: int, batch_size: int, model_dir: str) -> dict:
    """The spark input mode into two TensorFlow processes that only read."""
    from sparktf.datasets.formats import Field
    from sparktf.train import RunConfig, RunPlan, ScalingConfig, TrainConfig
    from sparktf.train.cluster import BenchOptions, ClusterRun
    from sparktf.train.plan import DataInfo

    train = TrainConfig(model="bench", data="bench", input_mode="spark", shuffle=False)
    plan = RunPlan(
        train=train,
        scaling=ScalingConfig(strategy="allreduce", num_workers=2),
        run=RunConfig(
            model_dir=model_dir, failure={"feed_timeout_s": 120, "failure_timeout_s": 120}
        ),
        model_config={},
        global_batch=batch_size * 2,
        steps_per_epoch=1,
        target_steps=1,
        feed_passes=1,
        log_level="WARNING",
        data=DataInfo(
            dataset="bench",
            kind="image",
            data="bench",
            split="train",
            rows=rows,
            fields=(Field("image", "uint8", SHAPE), Field("label", "int64")),
        ),
    )
    submitted = time.time()
    with ClusterRun(spark, plan, bench=BenchOptions(feed_df=df, consume_only=True)) as cluster:
        cluster.start()
        done = cluster.wait(all_nodes=True)
        feed_started = cluster.feed.started_wall
    read = sum(d["rows"] for d in done.values())
    ended = max(d["ended"] for d in done.values())
    first = min(d["first_batch"] for d in done.values())
    # Same window as the Arrow pass: from the feed job's submit to the last row read.
    ready = max(d["started"] for d in done.values())
    return {
        "rows_per_s": read / (ended - feed_started),
        "rows_read": read,
        "rows_fed": cluster.feed.rows,
        "seconds_from_feed_job_submit": round(ended - feed_started, 2),
        "cluster_startup_s": round(feed_started - submitted, 2),
        "seconds_feed_job_submit_to_processes_ready": round(ready - feed_started, 2),
        "seconds_first_to_last_batch": round(ended - first, 2),
        "rows_per_s_first_to_last_batch": read / (ended - first),
        "per_process": {
            k: {"rows": d["rows"], "waited_for_rows_s": round(d["wait_s"], 2)}
            for k, d in done.items()
        },
    }


def petastorm_converter(spark, df, batch_size: int, cache_dir: str) -> dict:
    """petastorm's make_spark_converter: DataFrame -> cached Parquet -> tf.data, one process."""
    from petastorm.spark import SparkDatasetConverter, make_spark_converter

    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, "file://" + cache_dir)
    started = time.perf_counter()
    converter = make_spark_converter(df)
    written = time.perf_counter()
    try:
        with converter.make_tf_dataset(
            batch_size=batch_size, num_epochs=1, workers_count=2
        ) as dataset:
            rows = sum(int(batch.id.shape[0]) for batch in dataset)
    finally:
        converter.delete()
    seconds = time.perf_counter() - started
    return {
        "rows_per_s": rows / seconds,
        "rows_read": rows,
        "seconds": round(seconds, 2),
        "seconds_writing_parquet": round(written - started, 2),
    }


def tfos_consume(args, ctx):
    """TensorFlowOnSpark's own feed, consumed with DataFeed.next_batch (no TensorFlow)."""
    feed = ctx.get_data_feed(train_mode=True)
    rows = 0
    started = time.time()
    while not feed.should_stop():
        rows += len(feed.next_batch(args.batch_size))
    with open(os.path.join(args.out, f"tfos-{ctx.executor_id}.txt"), "w") as f:
        f.write(f"{rows} {started} {time.time()}")


def tfos_datafeed(spark, df, batch_size: int, out: str) -> dict:
    from tensorflowonspark import TFCluster

    TFCluster.tf_status.clear()
    rdd = df.rdd.map(lambda r: (bytes(r.image), r.label))
    cluster = TFCluster.run(
        sc=spark.sparkContext,
        map_fun=tfos_consume,
        tf_args=argparse.Namespace(batch_size=batch_size, out=out),
        num_executors=2,
        num_ps=0,
        input_mode=TFCluster.InputMode.SPARK,
        master_node="chief",
    )
    started = time.time()
    cluster.train(rdd, num_epochs=1, feed_timeout=600)
    cluster.shutdown(timeout=120)
    results = []
    for name in os.listdir(out):
        if name.startswith("tfos-"):
            rows, _, end = open(os.path.join(out, name)).read().split()
            results.append((int(rows), float(end)))
    rows = sum(r for r, _ in results)
    seconds = max(e for _, e in results) - started
    return {"rows_per_s": rows / seconds, "rows_read": rows, "seconds": round(seconds, 2)}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=20000)
    p.add_argument("--batch-size", type=int, default=256, help="rows per batch per process")
    p.add_argument("--partitions", type=int, default=8)
    common.add_rounds(p)
    p.add_argument(
        "--tfos",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure TensorFlowOnSpark's own DataFeed (once)",
    )
    p.add_argument(
        "--petastorm",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also measure petastorm's make_spark_converter (where petastorm is installed: "
        "the second stack, scripts/setup.sh --stack petastorm)",
    )
    args = p.parse_args(argv)
    if args.petastorm and not petastorm_io.available():
        print("bench/feed.py: petastorm is not installed here: its converter is not measured")
        args.petastorm = False
    cli.setup_logging("WARNING")
    logging.getLogger("bench").setLevel(logging.INFO)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tempfile

    from sparktf.spark import get_session

    seconds, spark = common.timed(
        get_session,
        "sparktf-bench-feed",
        profile="local",
        overrides={
            "spark.master": "local-cluster[2,1,1024]",
            "spark.executorEnv.PYTHONPATH": str(common.ROOT),
        },
    )
    result: dict = {
        "benchmark": "feed",
        "rows": args.rows,
        "row_bytes": 3072,
        "batch_size": args.batch_size,
        "partitions": args.partitions,
        "machine": common.machine(),
        "window": "job submit to last row, every variant",
        "startup_s": {"spark_session": round(seconds, 2)},
    }
    rates = common.Rounds()
    startup = common.Rounds()
    details: list = []
    try:
        with common.PeakMemory() as memory, tempfile.TemporaryDirectory() as tmp:
            df = (
                spark.range(args.rows, numPartitions=args.partitions)
                .mapInArrow(make_rows, "image binary, label long, id long")
                .cache()
            )
            df.count()
            for r in range(args.rounds):
                rates.add("spark_arrow_pass", arrow_pass(df)[0])
                rates.add("spark_rdd_pass", rdd_pass(df)[0])
                feed = sparktf_feed(
                    spark, df, args.rows, args.batch_size, os.path.join(tmp, f"model-{r}")
                )
                rates.add("sparktf_feed", feed["rows_per_s"])
                startup.add("tensorflow_cluster", feed["cluster_startup_s"])
                details.append(feed)
                if args.petastorm:
                    try:
                        conv = petastorm_converter(
                            spark, df, args.batch_size, os.path.join(tmp, f"petastorm-{r}")
                        )
                        rates.add("petastorm_converter", conv["rows_per_s"])
                        details[-1]["petastorm_converter"] = conv
                    except Exception as exc:  # report, keep measuring the rest
                        log.warning("petastorm converter failed: %s", exc)
                        result["petastorm_converter_error"] = f"{type(exc).__name__}: {exc}"
                        args.petastorm = False
                if args.tfos and r == args.rounds - 1:
                    # Last: TFCluster.shutdown leaves a PySpark worker whose TFSparkNode.mgr
                    # points at a manager it shut down, and the next TensorFlowOnSpark
                    # cluster started in that worker fails.
                    out = os.path.join(tmp, "tfos")
                    os.makedirs(out)
                    result["tfos_datafeed"] = tfos_datafeed(spark, df, args.batch_size, out)
                log.info(
                    "round %d: %s",
                    r,
                    {k: round(v[-1]) for k, v in rates.values.items()},
                )
        result["rows_per_s"] = rates.report(0)
        result["startup_s"]["tensorflow_cluster"] = round(startup.median("tensorflow_cluster"), 2)
        result["startup_s"]["tensorflow_cluster_rounds"] = startup.values["tensorflow_cluster"]
        result["sparktf_feed_detail"] = details
        best = rates.medians()
        if "tfos_datafeed" in result:
            best["tfos_datafeed"] = result["tfos_datafeed"]["rows_per_s"]
        result["ratios"] = {
            f"sparktf_feed_vs_{k}": round(best["sparktf_feed"] / v, 3)
            for k, v in best.items()
            if k != "sparktf_feed"
        }
        result["goals"] = {
            "sparktf / Spark Arrow pass": common.goal(
                common.ratio(best["sparktf_feed"], best["spark_arrow_pass"]), 0.7
            ),
        }
        if "petastorm_converter" in best:  # measured on the petastorm stack only
            result["goals"]["sparktf / petastorm converter"] = common.goal(
                common.ratio(best["sparktf_feed"], best["petastorm_converter"]), 1.0
            )
        result.update(memory.report())
    finally:
        spark.stop()
    common.write_results("feed", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
