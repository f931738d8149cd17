"""Wide and deep on mixed columns: numbers and strings into one Keras model, no preprocessing job.

    .venv/bin/python examples/wide_and_deep.py --csv data.csv --label churned \\
        --model-dir /tmp/wide_deep/model --output /tmp/wide_deep/predictions
    .venv/bin/python examples/wide_and_deep.py --demo-rows 2000 --csv /tmp/demo.csv ...

What it does: reads the CSV (header row; numeric columns, string columns and an integer
class label), holds out ``--test-fraction`` of the rows, assembles the numeric columns into
one ``numeric`` Vector with ``VectorAssembler`` and trains

    TFEstimator(model="wide_deep", featuresCols=["numeric", <each string column>])

straight from the DataFrame (no dataset is written first). ``wide_deep`` is the Keras model
below: each string column goes through a ``StringLookup`` *inside the model* (its vocabulary,
the column's distinct values in the training rows, travels in the model's config), then into
a one-hot "wide" linear part and an ``Embedding`` in the "deep" part beside the numbers; the
two parts' logits add up. The fitted model is applied to the held-out rows, which keep their
raw strings (the export's ``serving_default`` takes every column by name, a value never seen
in training maps to the out-of-vocabulary index); ``prediction`` and ``label`` go to
``--output`` (Parquet) and ``MulticlassClassificationEvaluator`` reads them. ``--demo-rows N``
first writes a *synthetic* CSV to ``--csv``: ``churned`` depends on two numbers, the city and
the plan.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

import _common  # examples/_common.py: the flags, the CSV, the session (puts sparktf on sys.path)
import numpy as np

from sparktf import cli

log = logging.getLogger("sparktf.examples.wide_and_deep")
MODEL_NAME = "wide_deep"
NUMERIC = "numeric"  # the assembled Vector of the numeric columns
CITIES = {"lisbon": 1.5, "oslo": -1.0, "rome": 0.5, "tunis": -1.5, "vienna": 0.0}
PLANS = {"basic": -0.5, "plus": 0.0, "pro": 1.0}


def build(inputs, num_classes, vocabularies=None, embed_dim=4, hidden_units=16):
    """``inputs``: ``numeric`` (float32 [B, n]) and one string input per categorical column
    (``vocabularies`` maps each to its values); returns the sum of the wide and the deep
    logits."""
    import keras

    wide, deep = [], [inputs[NUMERIC]]
    for name, vocabulary in sorted((vocabularies or {}).items()):
        index = keras.layers.StringLookup(vocabulary=vocabulary, name=f"{name}_index")(inputs[name])
        size = len(vocabulary) + 1  # index 0: a value not in the vocabulary
        wide.append(keras.layers.CategoryEncoding(size, output_mode="one_hot")(index))
        embedded = keras.layers.Embedding(size, embed_dim, name=f"{name}_embedding")(index)
        deep.append(keras.layers.Flatten()(embedded))
    x = keras.layers.Concatenate()(deep) if len(deep) > 1 else deep[0]
    x = keras.layers.Dense(hidden_units, activation="relu", name="deep_hidden")(x)
    logits = keras.layers.Dense(num_classes, name="deep_logits")(x)
    if wide:
        crossed = keras.layers.Concatenate()(wide) if len(wide) > 1 else wide[0]
        wide_logits = keras.layers.Dense(num_classes, name="wide_logits")(crossed)
        logits = keras.layers.Add()([logits, wide_logits])
    return keras.Model(inputs, logits, name="wide_deep")


def write_demo_csv(path: str | Path, rows: int = 2000, seed: int = 0) -> str:
    """A synthetic CSV: ``tenure`` and ``spend`` standard normal, ``city`` and ``plan``
    strings, ``churned`` = 1 when ``tenure - 1.5 spend + city + plan`` plus a little noise
    is positive; and ``id``."""
    rng = np.random.default_rng(seed)
    tenure, spend = rng.normal(size=(2, rows))
    cities = rng.choice(sorted(CITIES), size=rows)
    plans = rng.choice(sorted(PLANS), size=rows)
    score = tenure - 1.5 * spend + np.array([CITIES[c] + PLANS[p] for c, p in zip(cities, plans)])
    churned = (score + rng.normal(0.0, 0.3, size=rows) > 0).astype(int)
    return _common.write_csv(
        path,
        {
            "id": range(rows),
            "tenure": tenure,
            "spend": spend,
            "city": cities,
            "plan": plans,
            "churned": churned,
        },
    )


def parser() -> argparse.ArgumentParser:
    p = _common.parser(
        "Train a wide-and-deep model on numeric and string columns, score held-out rows.",
        label="churned",
        label_help="the integer class label column",
        features=False,
        epochs=5,
        batch_size=32,
    )
    p.add_argument("--learning-rate", type=float, default=0.01, help="Adam's learning rate")
    p.add_argument(
        "--max-vocabulary",
        type=int,
        default=1000,
        help="most frequent values kept per string column",
    )
    return p


def vocabularies(df, columns: list[str], limit: int) -> dict[str, list[str]]:
    """The ``limit`` most frequent values of each string column (one Spark job each)."""
    from pyspark.sql import functions as F

    out = {}
    for col in columns:
        rows = df.where(F.col(col).isNotNull()).groupBy(col).count()
        top = rows.orderBy(F.desc("count"), F.asc(col)).limit(limit).collect()
        out[col] = sorted(r[col] for r in top)
    return out


def run(args: argparse.Namespace, spark) -> dict:
    """The example end to end; returns the numbers and the objects (for tests)."""
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator
    from pyspark.ml.feature import VectorAssembler
    from pyspark.sql import types as T

    from sparktf import models
    from sparktf.ml import TFEstimator

    df = _common.read_csv(spark, args, write_demo_csv)
    _common.check_label(df, args, T.IntegralType, "integer ")
    others = [f for f in df.schema.fields if f.name not in (args.label, "id")]
    numeric = [f.name for f in others if isinstance(f.dataType, T.NumericType)]
    strings = [f.name for f in others if isinstance(f.dataType, T.StringType)]
    if not numeric:
        raise cli.UsageError(f"{args.csv} has no numeric feature column ({df.columns})")
    assembled = VectorAssembler(inputCols=numeric, outputCol=NUMERIC).transform(df)
    train, test = _common.split(assembled, args)
    train = train.cache()  # each epoch runs the plan again: keep the split's rows
    vocab = vocabularies(train, strings, args.max_vocabulary)
    models.register(MODEL_NAME, build, learning_rate=args.learning_rate)
    estimator = TFEstimator(
        model=MODEL_NAME,
        modelConfig={"vocabularies": vocab},
        featuresCols=[NUMERIC, *strings],
        **_common.estimator_params(args),
    )
    rows = train.count()
    log.info(
        "training %s on %d rows: numbers %s, strings %s",
        MODEL_NAME,
        rows,
        numeric,
        {c: len(v) for c, v in vocab.items()},
    )
    fitted = estimator.fit(train)
    train.unpersist()
    keep = [c for c in ("id", args.label) if c in test.columns] + ["prediction"]
    scored = _common.write_predictions(spark, fitted.transform(test).select(*keep), args)
    evaluator = MulticlassClassificationEvaluator(labelCol=args.label, metricName="accuracy")
    summary = {
        "model": MODEL_NAME,
        "numeric": numeric,
        "strings": strings,
        "vocabulary_sizes": {c: len(v) for c, v in vocab.items()},
        "train_rows": rows,
        "test_rows": scored.count(),
        "test_accuracy": evaluator.evaluate(scored),
        "final_step": fitted.summary.final_step,
        "export": fitted.getExportDir(),
        "predictions": args.output,
        "synthetic_data": bool(args.demo_rows),
    }
    return {"summary": summary, "fitted": fitted, "test": test}


def main(argv: list[str] | None = None) -> int:
    return _common.main(parser(), run, "sparktf-wide-and-deep", argv)


if __name__ == "__main__":
    cli.run(main)
