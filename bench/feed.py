"""Rows/s that the ``spark`` input mode delivers into the TensorFlow processes, against
Spark's own pass over the same cached rows, in the same run.

    .venv/bin/python bench/feed.py [--rows 120000] [--min-window 10] [--passes N]
        [--batch-size 256] [--rounds 3] [--budget SECONDS] [--rdd] [--no-tfos] [--no-petastorm]

CIFAR-sized rows (``image``: numpy.save bytes of a 32x32x3 uint8 array, ``label``, ``id``)
are cached in a local-cluster[2,1,1024] session. In a round every variant moves the same rows:
``--passes`` passes over the cached rows (default: as many as make the Arrow pass last
``--min-window`` seconds twice over, from a timed run of three passes after a warm-up pass, and
after each round from that round's Arrow pass, never fewer: more rows per window, not fewer
rounds, so that one slow second does not decide a ratio; with ``--budget``, as many rounds as
fit, at least 2: bench/common.py). Per round, every rate over the same window, from
submitting the job that moves the rows to the last row arriving (see the contract in
bench/common.py):

* ``spark_arrow_pass``: Spark's pass over the cached rows into Python as Arrow batches
  (``mapInArrow``, touching every batch) -- the baseline, and the transport the feed uses;
* ``spark_rdd_pass`` (``--rdd``): Spark's classic pass, one Python row object per row
  (``df.rdd.map(...).sum()``);
* ``sparktf_feed``: :mod:`sparktf.train.feed.chunks` into the two TensorFlow processes of an
  all-reduce layout, which decode every row into exact numpy batches of ``--batch-size`` and
  drop them (no training); from the feed job's submit to the last row read. Starting the
  TensorFlow cluster is reported apart under ``startup_s`` (the driver submits the feed job
  once every feeding process has said hello; the detail keeps how long after the submit the
  last one had opened its feed, and the first-to-last-batch rate);
* ``petastorm_converter`` (``--petastorm``): petastorm's ``make_spark_converter`` (the
  DataFrame written to cached Parquet, then ``make_tf_dataset`` read in one process for
  ``--passes`` epochs), from the converter's creation to the last row;
* ``tfos_datafeed`` (``--tfos``): TensorFlowOnSpark's own feed (``TFCluster.train`` +
  ``DataFeed.next_batch``) for scale, once, after the last round, over one pass (it is an
  order of magnitude slower).

``passes`` and ``rows_per_window`` record each round's size and ``windows_s`` every variant's
window in every round; ``windows_met`` says whether
each measured variant's windows all lasted ``--min-window`` seconds (a warning otherwise).
Goals: ``feed.over_arrow_pass``: sparktf_feed >= 0.8x the Arrow pass, and >= 1.0x
petastorm's converter (measured where petastorm is installed). Peak memory of the whole
process tree is sampled. Prints JSON and writes it to bench/results/.
"""

from __future__ import annotations

import argparse
import logging
import math
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
ARROW_PASS_GOAL = 0.8
# Windows are sized for the Arrow pass to last --min-window x WINDOW_SPARE: Spark gets faster
# over the first rounds (its JIT), so a window sized on an early pass comes out shorter.
WINDOW_SPARE = 1.25
# The first round's size comes from a short timed run, slower per pass than the rounds' longer
# jobs (Spark's per-job cost and the JIT's warm-up weigh more there): twice the window.
CALIBRATION_SPARE = 2.0
CALIBRATION_PASSES = 3


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


def arrow_pass(df, passes: int = 1) -> tuple[float, int, float]:
    """Spark's Arrow pass, ``passes`` times: (rows/s, rows, seconds)."""

    def touch(batches):
        import pyarrow as pa

        rows = nbytes = 0
        for batch in batches:
            rows += batch.num_rows
            nbytes += sum(b.size for b in batch.column(0).buffers() if b is not None)
        yield pa.RecordBatch.from_pydict({"rows": [rows], "bytes": [nbytes]})

    started = time.perf_counter()
    rows = 0
    for _ in range(passes):
        rows += sum(r.rows for r in df.mapInArrow(touch, "rows long, bytes long").collect())
    seconds = time.perf_counter() - started
    return rows / seconds, rows, seconds


def rdd_pass(df, passes: int = 1) -> tuple[float, int, float]:
    """Spark's classic pass, ``passes`` times: (rows/s, rows, seconds)."""
    started = time.perf_counter()
    rows = 0
    for _ in range(passes):
        rows += df.rdd.map(lambda r: 1 if len(r.image) else 0).sum()
    seconds = time.perf_counter() - started
    return rows / seconds, rows, seconds


def sparktf_feed(spark, df, rows: int, batch_size: int, model_dir: str, passes: int = 1) -> dict:
    """The spark input mode into two TensorFlow processes that only read, ``passes`` passes
    over the ``rows`` rows of ``df``."""
    from sparktf.datasets.formats import Field
    from sparktf.train import RunConfig, RunPlan, ScalingConfig, TrainConfig
    from sparktf.train.driver.cluster import BenchOptions, ClusterRun
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
        feed_passes=passes,
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
    with ClusterRun(spark, plan, frame=df, bench=BenchOptions(consume_only=True)) as cluster:
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


def petastorm_converter(spark, df, batch_size: int, cache_dir: str, passes: int = 1) -> dict:
    """petastorm's make_spark_converter: DataFrame -> cached Parquet -> tf.data, one process."""
    from petastorm.spark import SparkDatasetConverter, make_spark_converter

    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, "file://" + cache_dir)
    started = time.perf_counter()
    converter = make_spark_converter(df)
    written = time.perf_counter()
    try:
        with converter.make_tf_dataset(
            batch_size=batch_size, num_epochs=passes, workers_count=2
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


def tfos_datafeed(spark, df, batch_size: int, out: str, passes: int = 1) -> dict:
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
    cluster.train(rdd, num_epochs=passes, feed_timeout=600)
    cluster.shutdown(timeout=120)
    results = []
    for name in os.listdir(out):
        if name.startswith("tfos-"):
            rows, _, end = open(os.path.join(out, name)).read().split()
            results.append((int(rows), float(end)))
    rows = sum(r for r, _ in results)
    seconds = max(e for _, e in results) - started
    return {"rows_per_s": rows / seconds, "rows_read": rows, "seconds": round(seconds, 2)}


def passes_for(rate: float, rows: int, min_window: float, spare: float = WINDOW_SPARE) -> int:
    """Passes over ``rows`` rows that keep a pass at ``rate`` rows/s busy for
    ``min_window`` seconds times ``spare``."""
    return max(1, math.ceil(min_window * spare * rate / rows))


def choose_passes(df, rows: int, min_window: float) -> tuple[int, dict]:
    """Passes per window, from the Arrow pass's rate: one warm-up pass (it starts the Python
    workers), then a timed run of :data:`CALIBRATION_PASSES` passes, sized with
    :data:`CALIBRATION_SPARE`."""
    arrow_pass(df)
    rate, _, seconds = arrow_pass(df, CALIBRATION_PASSES)
    passes = passes_for(rate, rows, min_window, CALIBRATION_SPARE)
    return passes, {
        "timed_arrow_passes": CALIBRATION_PASSES,
        "timed_arrow_pass_s": round(seconds, 2),
        "rows_per_s": round(rate),
    }


def check_windows(windows: common.Rounds, min_window: float) -> dict:
    """``{variant: every window >= min_window}``; a warning for each variant short of it."""
    met = {}
    for name, values in windows.values.items():
        met[name] = min(values) >= min_window
        if not met[name]:
            log.warning(
                "%s: a window of %.1f s, shorter than --min-window %.0f s: use more --rows "
                "or --passes",
                name,
                min(values),
                min_window,
            )
    return met


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=120000, help="rows cached (default 120000)")
    p.add_argument(
        "--min-window",
        type=float,
        default=10.0,
        help="seconds each variant's window should last at least; sets --passes (default 10)",
    )
    p.add_argument(
        "--passes",
        type=int,
        default=0,
        help="passes over the cached rows per window (default: from --min-window)",
    )
    p.add_argument("--batch-size", type=int, default=256, help="rows per batch per process")
    p.add_argument("--partitions", type=int, default=8)
    common.add_rounds(p)
    p.add_argument(
        "--rdd",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="also measure Spark's classic row-by-row pass (for scale, no goal; its windows "
        "last about three times the Arrow pass's)",
    )
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

    seconds, spark = common.local_session("sparktf-bench-feed")
    result: dict = {
        "benchmark": "feed",
        "rows": args.rows,
        "row_bytes": 3072,
        "batch_size": args.batch_size,
        "partitions": args.partitions,
        "min_window_s": args.min_window,
        "machine": common.machine(),
        "window": "job submit to last row, every variant, --passes passes over the cached rows",
        "startup_s": {"spark_session": round(seconds, 2)},
    }
    rates, windows, startup = common.Rounds(), common.Rounds(), common.Rounds()
    details: list = []
    try:
        with common.PeakMemory() as memory, tempfile.TemporaryDirectory() as tmp:
            df = (
                spark.range(args.rows, numPartitions=args.partitions)
                .mapInArrow(make_rows, "image binary, label long, id long")
                .cache()
            )
            seconds, _ = common.timed(df.count)
            result["startup_s"]["cache_rows"] = round(seconds, 2)
            passes, calibration = args.passes, {}
            if passes < 1:
                passes, calibration = choose_passes(df, args.rows, args.min_window)
            result["passes_from"] = calibration or "--passes"
            result["passes"] = []
            log.info("%d passes over %d rows per window (%s)", passes, args.rows, calibration)
            rounds = common.RoundBudget.from_args(args)
            for r in rounds:
                result["passes"].append(passes)
                measure_round(spark, df, args, passes, r, tmp, rates, windows, startup, details)
                if calibration:  # the next round's windows from this round's Arrow pass
                    rate = rates.values["spark_arrow_pass"][-1]
                    passes = max(passes, passes_for(rate, args.rows, args.min_window))
                log.info(
                    "round %d: %s rows/s, windows %s s",
                    r,
                    {k: round(v[-1]) for k, v in rates.values.items()},
                    {k: round(v[-1], 1) for k, v in windows.values.items()},
                )
            rounds.record(result)
            if args.tfos:
                # After the last round: TFCluster.shutdown leaves a PySpark worker whose
                # TFSparkNode.mgr points at a manager it shut down, and the next
                # TensorFlowOnSpark cluster started in that worker fails.
                out = os.path.join(tmp, "tfos")
                os.makedirs(out)
                result["tfos_datafeed"] = tfos_datafeed(spark, df, args.batch_size, out)
        for detail in details:
            if "petastorm_converter_error" in detail:
                result["petastorm_converter_error"] = detail.pop("petastorm_converter_error")
        result["rows_per_window"] = [n * args.rows for n in result["passes"]]
        result["rows_per_s"] = rates.report(0)
        result["windows_s"] = windows.report(2)["rounds"]
        result["windows_met"] = check_windows(windows, args.min_window)
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
            "feed.over_arrow_pass": common.goal(
                common.ratio(best["sparktf_feed"], best["spark_arrow_pass"]), ARROW_PASS_GOAL
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


def measure_round(spark, df, args, passes, r, tmp, rates, windows, startup, details) -> None:
    """One round, round robin: the Arrow pass, the row pass, sparktf's feed, petastorm's
    converter; each over ``passes`` passes of the cached rows."""
    rate, _, seconds = arrow_pass(df, passes)
    rates.add("spark_arrow_pass", rate)
    windows.add("spark_arrow_pass", seconds)
    if args.rdd:
        rate, _, seconds = rdd_pass(df, passes)
        rates.add("spark_rdd_pass", rate)
        windows.add("spark_rdd_pass", seconds)
    feed = sparktf_feed(
        spark, df, args.rows, args.batch_size, os.path.join(tmp, f"model-{r}"), passes
    )
    rates.add("sparktf_feed", feed["rows_per_s"])
    windows.add("sparktf_feed", feed["seconds_from_feed_job_submit"])
    startup.add("tensorflow_cluster", feed["cluster_startup_s"])
    details.append(feed)
    if args.petastorm:
        try:
            conv = petastorm_converter(
                spark, df, args.batch_size, os.path.join(tmp, f"petastorm-{r}"), passes
            )
            rates.add("petastorm_converter", conv["rows_per_s"])
            windows.add("petastorm_converter", conv["seconds"])
            details[-1]["petastorm_converter"] = conv
        except Exception as exc:  # report, keep measuring the rest
            log.warning("petastorm converter failed: %s", exc)
            details[-1]["petastorm_converter_error"] = f"{type(exc).__name__}: {exc}"
            args.petastorm = False


if __name__ == "__main__":
    sys.exit(main())
