"""Training straight from a DataFrame against copying it first, end to end, in the same run.

    .venv/bin/python bench/frame.py [--rows 1000000] [--features 8] [--epochs 1]
        [--batch-size 1024] [--rounds 3] [--budget SECONDS]

The DataFrame is a plan over ``spark.range`` (``--features`` float features from Spark's
``rand``, an integer class label that depends on them): nothing is cached, as a table read or
a join would not be. In a local-cluster[2,1,1024] session a small registered classifier (one
hidden layer) trains for ``--epochs`` epochs of ``--batch-size`` rows on two all-reduce
workers, fed by Spark (the ``spark`` input mode), in each round, round robin (the one that
goes first alternates: the first run of a session pays Spark's warm-up):

* ``copy_then_train``: the baseline, what a user (and ``TFEstimator`` until now) would write:
  :func:`sparktf.datasets.tables.write_table` the DataFrame to a dataset, then
  ``sparktf.train.fit`` on that dataset; timed from the write to the fit's return;
* ``direct``: ``sparktf.train.fit`` with the DataFrame as ``TrainConfig.data`` (its columns
  checked in one Spark job, then its rows fed as they are); timed from the call to its return.

Both train on the same rows (the plan is deterministic) with the same steps. Per variant: the
wall time, the rows trained per second over it, the time to the first step, and for the copy
the bytes it wrote. Goal ``frame.over_copy``: the direct run's rows/s >= 1.0x the copy's
(same rows, same steps: it saves the write and the read). Peak memory of the process tree is
sampled. Prints JSON and writes it to bench/results/.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

from sparktf import cli

log = logging.getLogger("bench.frame")
MODEL = "bench_frame_mlp"
GOAL = 1.0


def build(input_shape, num_classes, hidden_units=16):
    import keras

    inputs = keras.Input(input_shape)
    x = keras.layers.Dense(hidden_units, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))


def frame(spark, rows: int, features: int):
    """``id``, ``features`` (array<float>) and ``label`` (1 when the first half of the
    features outweighs the second), computed by Spark from the row id: a plan, not a cache."""
    from pyspark.sql import functions as F

    xs = [F.rand(seed=i).cast("float") for i in range(features)]
    df = spark.range(rows, numPartitions=4).select("id", F.array(*xs).alias("features"))
    half = features // 2
    first = sum(F.col("features")[i] for i in range(half))
    second = sum(F.col("features")[i] for i in range(half, features))
    return df.withColumn("label", (first > second).cast("long"))


def configs(args, model_dir: str):
    from sparktf.train import RunConfig, ScalingConfig, TrainConfig

    train = TrainConfig(
        model=MODEL,
        data="set below",
        input_mode="spark",
        epochs=args.epochs,
        batch_size=args.batch_size,
        shuffle=False,
    )
    scaling = ScalingConfig(strategy="allreduce", num_workers=2, threads_per_worker=1)
    run = RunConfig.from_dict(
        {
            "model_dir": model_dir,
            "checkpoint": {"every_steps": 10**9, "export": False},
            "evaluation": {"split": "none"},
        }
    )
    return train, scaling, run


def copy_then_train(spark, df, args, work: Path) -> dict:
    import dataclasses

    from sparktf.datasets.tables import write_table
    from sparktf.train import fit

    data, model_dir = work / "data", work / "copy-model"
    train, scaling, run = configs(args, str(model_dir))
    started = time.perf_counter()
    write_table(df, str(data), input_col="features", label_col="label", id_col="id")
    written = time.perf_counter()
    result = fit(dataclasses.replace(train, data=str(data)), scaling, run, spark=spark)
    seconds = time.perf_counter() - started
    size = sum(p.stat().st_size for p in data.rglob("*") if p.is_file())
    shutil.rmtree(data)
    shutil.rmtree(model_dir)
    return _numbers(result, seconds, args) | {
        "seconds_writing": round(written - started, 2),
        "bytes_written": size,
    }


def direct(spark, df, args, work: Path) -> dict:
    import dataclasses

    from sparktf.train import fit

    model_dir = work / "direct-model"
    train, scaling, run = configs(args, str(model_dir))
    started = time.perf_counter()
    result = fit(dataclasses.replace(train, data=df), scaling, run, spark=spark)
    seconds = time.perf_counter() - started
    shutil.rmtree(model_dir)
    return _numbers(result, seconds, args)


def _numbers(result, seconds: float, args) -> dict:
    rows = result.final_step * args.batch_size
    return {
        "seconds": round(seconds, 2),
        "rows_per_s": rows / seconds,
        "rows_trained": rows,
        "steps": result.final_step,
        "time_to_first_step_s": round(result.time_to_first_step_s or 0.0, 2),
        "training_examples_per_s": round(result.examples_per_sec),
    }


def parser() -> argparse.ArgumentParser:
    p = cli.parser(
        "Train straight from a DataFrame against write_table + train, same rows, same steps."
    )
    p.add_argument("--rows", type=common.positive_int, default=1_000_000, help="rows")
    p.add_argument("--features", type=common.positive_int, default=8, help="float features")
    p.add_argument("--epochs", type=float, default=1.0, help="passes over the rows")
    p.add_argument("--batch-size", type=common.positive_int, default=1024, help="global batch")
    common.add_rounds(p)
    return p


def main(argv: list[str] | None = None) -> int:
    args = cli.parse(parser(), argv)
    from sparktf import models
    from sparktf.spark import get_session, stop_session

    models.register(MODEL, build, num_classes=2, learning_rate=0.01)
    spark = get_session(
        "sparktf-bench-frame",
        profile="local",
        overrides={"spark.master": "local-cluster[2,1,1024]", "spark.task.maxFailures": "1"},
    )
    rounds = common.Rounds()
    details: dict[str, list[dict]] = {"copy_then_train": [], "direct": []}
    work = Path(tempfile.mkdtemp(prefix="sparktf-bench-frame-"))
    try:
        df = frame(spark, args.rows, args.features)
        with common.PeakMemory() as memory:
            budget = common.RoundBudget.from_args(args)
            for index in budget:
                order = [("copy_then_train", copy_then_train), ("direct", direct)]
                for name, fn in order[:: 1 if index % 2 == 0 else -1]:  # who goes first alternates
                    out = fn(spark, df, args, work)
                    details[name].append(out)
                    rounds.add(name, out["rows_per_s"])
                    log.info("round %d %s: %s", index + 1, name, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        stop_session(spark)
    medians = rounds.medians()
    over = common.ratio(medians["direct"], medians["copy_then_train"])
    common.write_results(
        "frame",
        {
            "goals": {"frame.over_copy": common.goal(over, GOAL)},
            "rows_per_s": rounds.report(),
            **budget.report(),
            "direct_over_copy": round(over, 3),
            "details": details,
            "sizes": {
                "rows": args.rows,
                "features": args.features,
                "epochs": args.epochs,
                "batch_size": args.batch_size,
            },
            **memory.report(),
            "machine": common.machine(),
        },
    )
    return 0


if __name__ == "__main__":
    cli.run(main)
