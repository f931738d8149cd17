"""A tabular classifier in a Spark ML Pipeline: your own Keras model over a CSV's columns.

    .venv/bin/python examples/tabular_pipeline.py --csv data.csv --label species \\
        --model-dir /tmp/tabular/model --pipeline-dir /tmp/tabular/pipeline \\
        --output /tmp/tabular/predictions
    .venv/bin/python examples/tabular_pipeline.py --demo-rows 600 --csv /tmp/demo.csv ...

What it does: reads the CSV (header row; numeric feature columns, an integer or string
label), holds out ``--test-fraction`` of the rows, and fits

    Pipeline([StringIndexer (string labels only), VectorAssembler, StandardScaler,
              TFEstimator(model="tabular_mlp", ...)])

where ``tabular_mlp`` is the small Keras network below, registered with
``sparktf.models.register`` (the registration travels to the executors with the run).
Training runs on the Spark executors (``--strategy allreduce`` with ``--num-workers``
executors, or ``ps``). The fitted PipelineModel is saved to ``--pipeline-dir``, loaded back,
and applied to the held-out rows; their predictions go to ``--output`` (Parquet) and the
held-out accuracy is printed. ``--demo-rows N`` first writes a *synthetic* CSV of N rows
(three Gaussian blobs in four dimensions) to ``--csv``.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import _common  # examples/_common.py: the flags, the CSV, the session (puts sparktf on sys.path)
import numpy as np

from sparktf import cli

log = logging.getLogger("sparktf.examples.tabular")
MODEL_NAME = "tabular_mlp"


def build_mlp(input_shape, num_classes, hidden_units=16, dropout=0.0):
    """The network: float features [B, n] -> logits [B, num_classes]."""
    import keras

    inputs = keras.Input(input_shape, name="features")
    x = keras.layers.Flatten()(inputs)
    x = keras.layers.Dense(hidden_units, activation="relu", name="hidden")(x)
    if dropout:
        x = keras.layers.Dropout(dropout)(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes, name="logits")(x), name="mlp")


def write_demo_csv(path: str | Path, rows: int = 600, classes: int = 3, seed: int = 0) -> str:
    """A synthetic CSV: ``rows`` points of ``classes`` separable Gaussian blobs in 4-D
    (columns x1..x4 on different scales, ``label`` 0..classes-1, ``id``)."""
    rng = np.random.default_rng(seed)
    centers = rng.normal(0.0, 4.0, size=(classes, 4))
    labels = rng.integers(0, classes, size=rows)
    points = centers[labels] + rng.normal(0.0, 1.0, size=(rows, 4))
    points *= np.array([1.0, 10.0, 0.1, 100.0])  # scales differ: the pipeline standardises
    x = {f"x{i + 1}": points[:, i] for i in range(4)}
    return _common.write_csv(path, {"id": range(rows), **x, "label": labels})


def parser() -> argparse.ArgumentParser:
    p = _common.parser(
        "Train, save, load and apply a Spark ML Pipeline with a sparktf model.",
        label="label",
        label_help="label column (integers or strings)",
        epochs=20,
        batch_size=16,
    )
    p.add_argument(
        "--pipeline-dir",
        default=None,
        help="where the fitted PipelineModel is saved (default: MODEL_DIR/pipeline)",
    )
    p.add_argument("--strategy", choices=["allreduce", "ps"], default="allreduce")
    p.add_argument("--num-ps", type=int, default=1, help="parameter servers (ps)")
    p.add_argument("--steps", type=int, default=None, help="global steps (with --epochs: first)")
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument("--hidden-units", type=int, default=16)
    return p


def run(args: argparse.Namespace, spark) -> dict:
    """The pipeline end to end; returns the numbers and the objects (for tests)."""
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import StandardScaler, StringIndexer, VectorAssembler
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from sparktf import models, storage
    from sparktf.ml import TFEstimator

    df = _common.read_csv(spark, args, write_demo_csv)
    _common.check_label(df, args)
    features = _common.feature_columns(df, args)
    stages = []
    label = args.label
    if not isinstance(df.schema[label].dataType, T.NumericType):
        stages.append(StringIndexer(inputCol=label, outputCol="label_index"))
        label = "label_index"
    models.register(
        MODEL_NAME,
        build_mlp,
        learning_rate=args.learning_rate,
        config={"hidden_units": args.hidden_units},
    )
    stages += [
        VectorAssembler(inputCols=features, outputCol="raw_features"),
        StandardScaler(inputCol="raw_features", outputCol="features", withMean=True),
        TFEstimator(
            model=MODEL_NAME,
            strategy=args.strategy,
            numPs=args.num_ps,
            psOnDriver=args.strategy == "ps",
            steps=args.steps,
            **_common.estimator_params(args, label),
        ),
    ]
    train, test = _common.split(df, args)
    log.info(
        "fitting %d stages on %d rows (features %s), %d rows held out",
        len(stages),
        train.count(),
        features,
        test.count(),
    )
    fitted = Pipeline(stages=stages).fit(train)
    pipeline_dir = args.pipeline_dir or storage.join(args.model_dir, "pipeline")
    fitted.write().overwrite().save(pipeline_dir)
    loaded = PipelineModel.load(pipeline_dir)
    predictions = loaded.transform(test)
    keep = [
        c
        for c in ("id", args.label, label, "prediction", "probability")
        if c in predictions.columns
    ]
    scored = _common.write_predictions(spark, predictions.select(*dict.fromkeys(keep)), args)
    accuracy = scored.agg(
        F.avg((F.col(label).cast("long") == F.col("prediction")).cast("double"))
    ).first()[0]
    summary = {
        "model": MODEL_NAME,
        "train_rows": train.count(),
        "test_rows": scored.count(),
        "features": features,
        "test_accuracy": accuracy,
        "export": fitted.stages[-1].getExportDir(),
        "pipeline": pipeline_dir,
        "predictions": args.output,
        "synthetic_data": bool(args.demo_rows),
    }
    return {"summary": summary, "fitted": fitted, "loaded": loaded, "test": test}


def main(argv: list[str] | None = None) -> int:
    return _common.main(parser(), run, "sparktf-tabular-pipeline", argv)


if __name__ == "__main__":
    cli.run(main)
