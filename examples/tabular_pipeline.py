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
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))

from sparktf import cli  # noqa: E402

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
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        f.write("id,x1,x2,x3,x4,label\n")
        for i, (p, y) in enumerate(zip(points, labels)):
            f.write(f"{i},{p[0]:.5f},{p[1]:.5f},{p[2]:.5f},{p[3]:.5f},{y}\n")
    return str(path)


def parser() -> argparse.ArgumentParser:
    p = cli.parser("Train, save, load and apply a Spark ML Pipeline with a sparktf model.")
    p.add_argument("--csv", required=True, help="input CSV with a header row")
    p.add_argument("--label", default="label", help="label column (integers or strings)")
    p.add_argument(
        "--features",
        default=None,
        help="comma-separated feature columns (default: every numeric column but the label and id)",
    )
    p.add_argument("--model-dir", required=True, help="training model directory (local or hdfs://)")
    p.add_argument(
        "--pipeline-dir",
        default=None,
        help="where the fitted PipelineModel is saved (default: MODEL_DIR/pipeline)",
    )
    p.add_argument("--output", required=True, help="predictions of the held-out rows (Parquet)")
    p.add_argument("--test-fraction", type=float, default=0.25, help="rows held out")
    p.add_argument("--strategy", choices=["allreduce", "ps"], default="allreduce")
    p.add_argument("--num-workers", type=int, default=2, help="training processes")
    p.add_argument("--num-ps", type=int, default=1, help="parameter servers (ps)")
    p.add_argument("--epochs", type=float, default=20, help="passes over the training rows")
    p.add_argument("--steps", type=int, default=None, help="global steps (with --epochs: first)")
    p.add_argument("--batch-size", type=int, default=16, help="global batch size")
    p.add_argument("--learning-rate", type=float, default=0.01)
    p.add_argument("--hidden-units", type=int, default=16)
    p.add_argument("--seed", type=int, default=0, help="split and shuffle seed")
    p.add_argument(
        "--demo-rows",
        type=int,
        default=0,
        help="first write a synthetic CSV of this many rows to --csv (0: read --csv as it is)",
    )
    return p


def run(args: argparse.Namespace, spark) -> dict:
    """The pipeline end to end; returns the numbers and the objects (for tests)."""
    from pyspark.ml import Pipeline, PipelineModel
    from pyspark.ml.feature import StandardScaler, StringIndexer, VectorAssembler
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from sparktf import models, storage
    from sparktf.ml import TFEstimator

    if args.demo_rows:
        write_demo_csv(args.csv, rows=args.demo_rows, seed=args.seed)
        log.info("wrote a synthetic demo CSV of %d rows to %s", args.demo_rows, args.csv)
    df = spark.read.csv(storage.spark_uri(args.csv), header=True, inferSchema=True)
    if args.label not in df.columns:
        raise cli.UsageError(f"{args.csv} has no label column {args.label!r} ({df.columns})")
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
            modelDir=args.model_dir,
            strategy=args.strategy,
            numWorkers=args.num_workers,
            numPs=args.num_ps,
            psOnDriver=args.strategy == "ps",
            threadsPerWorker=1,
            epochs=args.epochs,
            steps=args.steps,
            batchSize=args.batch_size,
            seed=args.seed,
            labelCol=label,
        ),
    ]
    train, test = df.randomSplit([1.0 - args.test_fraction, args.test_fraction], seed=args.seed)
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
    predictions.select(*dict.fromkeys(keep)).write.mode("overwrite").parquet(
        storage.spark_uri(args.output)
    )
    scored = spark.read.parquet(storage.spark_uri(args.output))
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
    from sparktf.spark import get_session

    def session(args):
        return get_session("sparktf-tabular-pipeline", profile=args.profile)

    return cli.run_example(parser(), run, session, argv)


if __name__ == "__main__":
    cli.run(main)
