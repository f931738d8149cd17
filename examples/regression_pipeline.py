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
from pathlib import Path

import _common  # examples/_common.py: the flags, the CSV, the session (puts sparktf on sys.path)
import numpy as np

from sparktf import cli

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
    columns = {f"x{i + 1}": x[:, i] for i in range(len(WEIGHTS))}
    return _common.write_csv(path, {"id": range(rows), **columns, "y": y})


def parser() -> argparse.ArgumentParser:
    p = _common.parser(
        "Tune and train a regression model with CrossValidator, then score held-out rows.",
        label="y",
        label_help="the numeric target column",
        epochs=10,
        batch_size=32,
    )
    p.add_argument(
        "--learning-rates",
        default="0.05,0.0005",
        help="comma-separated learning rates CrossValidator chooses from",
    )
    p.add_argument("--folds", type=int, default=2, help="CrossValidator folds")
    p.add_argument("--hidden-units", type=int, default=0, help="0: a linear model")
    p.add_argument("--noise", type=float, default=0.5, help="--demo-rows: the noise's std dev")
    return p


def run(args: argparse.Namespace, spark) -> dict:
    """The example end to end; returns the numbers and the objects (for tests)."""
    from pyspark.ml.evaluation import RegressionEvaluator
    from pyspark.ml.feature import VectorAssembler
    from pyspark.ml.tuning import CrossValidator, ParamGridBuilder
    from pyspark.sql import types as T

    from sparktf import models
    from sparktf.ml import TFEstimator

    rates = [float(r) for r in args.learning_rates.split(",") if r.strip()]
    if not rates:
        raise cli.UsageError("--learning-rates: give at least one learning rate")
    df = _common.read_csv(spark, args, write_demo_csv, noise=args.noise)
    _common.check_label(df, args, T.NumericType, "numeric ")
    features = _common.feature_columns(df, args)
    models.register(MODEL_NAME, build_net, config={"hidden_units": args.hidden_units})
    assembled = VectorAssembler(inputCols=features, outputCol="features").transform(df)
    train, test = _common.split(assembled, args)
    estimator = TFEstimator(model=MODEL_NAME, loss="mse", **_common.estimator_params(args))
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
    scored = _common.write_predictions(spark, fitted.bestModel.transform(test).select(*keep), args)
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
    return _common.main(parser(), run, "sparktf-regression-pipeline", argv)


if __name__ == "__main__":
    cli.run(main)
