"""Regression with Spark ML: your own Keras model, a squared-error loss, tuned by CrossValidator.

    .venv/bin/python examples/regression_pipeline.py --csv data.csv --label y \\
        --model-dir /tmp/regression/model --output /tmp/regression/predictions
    .venv/bin/python examples/regression_pipeline.py --demo-rows 1200 --csv /tmp/demo.csv ...

What it does: reads the CSV (header row; numeric feature columns and a numeric label),
holds out ``--test-fraction`` of the rows, assembles the features with ``VectorAssembler``
and fits

    CrossValidator(TFEstimator(model="regression_net", loss="mse"),
                   learning rates --learning-rates, RegressionEvaluator(rmse))

where ``regression_net`` is the small Keras network below (linear, or one hidden layer with
``--hidden-units``), registered with ``sparktf.models.register``. Each fold and learning
rate trains on the Spark executors in a directory of its own under ``--model-dir``; the best
rate is then trained on all the training rows. The best model is applied to the held-out
rows: its ``prediction`` column (a double) goes to ``--output`` (Parquet) and
``RegressionEvaluator`` reads it. ``--demo-rows N`` first writes a *synthetic* CSV to
``--csv``: ``y = 2 x1 - 3 x2 + 0.5 x3 + 1`` plus Gaussian noise of standard deviation
``--noise`` (``x4`` is not used), so the best RMSE a model can reach is the noise's.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))

from sparktf import cli  # noqa: E402

log = logging.getLogger("sparktf.examples.regression")
MODEL_NAME = "regression_net"
WEIGHTS = np.array([2.0, -3.0, 0.5, 0.0])  # the demo data's true coefficients
BIAS = 1.0


def build_net(input_shape, num_outputs, hidden_units=0):
    """The network: float features [B, n] -> one value per row (linear unless hidden_units)."""
    import keras

    inputs = keras.Input(input_shape, name="features")
    x = keras.layers.Flatten()(inputs)
    if hidden_units:
        x = keras.layers.Dense(hidden_units, activation="relu", name="hidden")(x)
    return keras.Model(inputs, keras.layers.Dense(num_outputs, name="output")(x), name="net")


def write_demo_csv(path: str | Path, rows: int = 1200, noise: float = 0.5, seed: int = 0) -> str:
    """A synthetic CSV of ``rows`` rows: ``x1..x4`` standard normal, ``y = WEIGHTS . x + BIAS``
    plus noise of standard deviation ``noise``, and ``id``."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, len(WEIGHTS)))
    y = x @ WEIGHTS + BIAS + rng.normal(0.0, noise, size=rows)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        f.write("id,x1,x2,x3,x4,y\n")
        for i, (p, t) in enumerate(zip(x, y)):
            f.write(f"{i},{p[0]:.6f},{p[1]:.6f},{p[2]:.6f},{p[3]:.6f},{t:.6f}\n")
    return str(path)


def parser() -> argparse.ArgumentParser:
    p = cli.parser(
        "Tune and train a regression model with CrossValidator, then score held-out rows."
    )
    p.add_argument("--csv", required=True, help="input CSV with a header row")
    p.add_argument("--label", default="y", help="the numeric target column")
    p.add_argument(
        "--features",
        default=None,
        help="comma-separated feature columns (default: every numeric column but the label and id)",
    )
    p.add_argument("--model-dir", required=True, help="training model directory (local or hdfs://)")
    p.add_argument("--output", required=True, help="predictions of the held-out rows (Parquet)")
    p.add_argument("--test-fraction", type=float, default=0.25, help="rows held out")
    p.add_argument("--num-workers", type=int, default=2, help="all-reduce training processes")
    p.add_argument("--epochs", type=float, default=10, help="passes over the training rows")
    p.add_argument("--batch-size", type=int, default=32, help="global batch size")
    p.add_argument(
        "--learning-rates",
        default="0.05,0.0005",
        help="comma-separated learning rates CrossValidator chooses from",
    )
    p.add_argument("--folds", type=int, default=2, help="CrossValidator folds")
    p.add_argument("--hidden-units", type=int, default=0, help="0: a linear model")
    p.add_argument("--noise", type=float, default=0.5, help="--demo-rows: the noise's std dev")
    p.add_argument("--seed", type=int, default=0, help="split and shuffle seed")
    p.add_argument(
        "--demo-rows",
        type=int,
        default=0,
        help="first write a synthetic CSV of this many rows to --csv (0: read --csv as it is)",
    )
    return p


def run(args: argparse.Namespace, spark) -> dict:
    """The example end to end; returns the numbers and the objects (for tests)."""
    from pyspark.ml.evaluation import RegressionEvaluator
    from pyspark.ml.feature import VectorAssembler
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder
    from pyspark.sql import types as T

    from sparktf import models, storage
    from sparktf.ml import TFEstimator

    rates = [float(r) for r in args.learning_rates.split(",") if r.strip()]
    if not rates:
        raise cli.UsageError("--learning-rates: give at least one learning rate")
    if args.demo_rows:
        write_demo_csv(args.csv, rows=args.demo_rows, noise=args.noise, seed=args.seed)
        log.info("wrote a synthetic demo CSV of %d rows to %s", args.demo_rows, args.csv)
    df = spark.read.csv(storage.spark_uri(args.csv), header=True, inferSchema=True)
    if args.label not in df.columns or not isinstance(
        df.schema[args.label].dataType, T.NumericType
    ):
        raise cli.UsageError(
            f"{args.csv} has no numeric label column {args.label!r} ({df.columns})"
        )
    if args.features:
        features = [c.strip() for c in args.features.split(",") if c.strip()]
        missing = [c for c in features if c not in df.columns]
        if missing:
            raise cli.UsageError(f"{args.csv} has no column(s) {missing} ({df.columns})")
    else:
        features = [
            f.name
            for f in df.schema.fields
            if isinstance(f.dataType, T.NumericType) and f.name not in (args.label, "id")
        ]
    if not features:
        raise cli.UsageError(f"{args.csv} has no numeric feature columns")
    models.register(MODEL_NAME, build_net, config={"hidden_units": args.hidden_units})
    assembled = VectorAssembler(inputCols=features, outputCol="features").transform(df)
    train, test = assembled.randomSplit(
        [1.0 - args.test_fraction, args.test_fraction], seed=args.seed
    )
    estimator = TFEstimator(
        model=MODEL_NAME,
        loss="mse",
        modelDir=args.model_dir,
        numWorkers=args.num_workers,
        threadsPerWorker=1,
        epochs=args.epochs,
        batchSize=args.batch_size,
        seed=args.seed,
        labelCol=args.label,
    )
    grid = (
        ParamGridBuilder()
        .addGrid(estimator.modelConfig, [{"learning_rate": rate} for rate in rates])
        .build()
    )
    evaluator = RegressionEvaluator(labelCol=args.label, metricName="rmse")
    cv = CrossValidator(
        estimator=estimator,
        estimatorParamMaps=grid,
        evaluator=evaluator,
        numFolds=args.folds,
        seed=args.seed,
    )
    log.info(
        "cross-validating %d learning rates x %d folds on %d rows (features %s)",
        len(rates),
        args.folds,
        train.count(),
        features,
    )
    fitted = cv.fit(train)
    best = int(np.argmin(fitted.avgMetrics))
    keep = [c for c in ("id", args.label, "prediction") if c in test.columns or c == "prediction"]
    fitted.bestModel.transform(test).select(*keep).write.mode("overwrite").parquet(
        storage.spark_uri(args.output)
    )
    scored = spark.read.parquet(storage.spark_uri(args.output))
    summary = {
        "model": MODEL_NAME,
        "features": features,
        "train_rows": train.count(),
        "test_rows": scored.count(),
        "learning_rates": rates,
        "cv_rmse": [float(m) for m in fitted.avgMetrics],
        "best_learning_rate": rates[best],
        "test_rmse": evaluator.evaluate(scored),
        "test_mae": RegressionEvaluator(labelCol=args.label, metricName="mae").evaluate(scored),
        "export": fitted.bestModel.getExportDir(),
        "predictions": args.output,
        "synthetic_data": bool(args.demo_rows),
    }
    if args.demo_rows:
        summary["noise_std"] = args.noise
    return {"summary": summary, "fitted": fitted, "test": test}


def main(argv: list[str] | None = None) -> int:
    from sparktf.spark import get_session

    def session(args):
        return get_session("sparktf-regression-pipeline", profile=args.profile)

    return cli.run_example(parser(), run, session, argv)


if __name__ == "__main__":
    cli.run(main)
