"""Training straight from a DataFrame, no copy: a model of two named inputs (a numeric vector,
and a string through ``StringLookup`` + ``Embedding`` inside the model) is trained from the
caller's DataFrame -- a filtered plan, not a table -- with nothing written but the run's own
artifacts, then ``sparktf.predict`` serves its export from the same columns. A bad row is
refused naming its column and id before anything starts. Real local-cluster, real
TensorFlow (all-reduce over the session's two executors).
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from sparktf.train import RunConfig, ScalingConfig, TrainConfig

pytestmark = pytest.mark.integration

CITIES = ("paris", "rome", "oslo")
BONUS = {"paris": 2.0, "rome": -2.0, "oslo": 0.0}


def build(inputs, num_classes, embed_dim=3, hidden_units=16):
    """Wide and deep in one: the numbers, and an embedding of the city looked up by name."""
    import keras

    city = keras.layers.StringLookup(vocabulary=list(CITIES), name="city_index")(inputs["city"])
    embedded = keras.layers.Flatten()(keras.layers.Embedding(len(CITIES) + 1, embed_dim)(city))
    x = keras.layers.Concatenate()([inputs["num"], embedded])
    x = keras.layers.Dense(hidden_units, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))


def _frame(spark, rows: int, seed: int):
    """``id``, ``num`` (a Vector of 2), ``city`` and ``y`` = [x0 + x1 + bonus(city) > 0]."""
    from pyspark.ml.linalg import Vectors

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 2))
    cities = rng.choice(CITIES, size=rows)
    y = (x.sum(axis=1) + np.array([BONUS[c] for c in cities]) > 0).astype(int)
    data = [(i, Vectors.dense(x[i].tolist()), str(cities[i]), int(y[i])) for i in range(rows)]
    return spark.createDataFrame(data, ["id", "num", "city", "y"]).repartition(2)


def _scratch() -> set[str]:
    from sparktf import scratch

    return {
        os.path.join(base, name)
        for base in scratch.scratch_bases()
        if os.path.isdir(base)
        for name in os.listdir(base)
        if name.startswith(scratch.PREFIXES)
    }


def test_two_input_model_trains_from_a_dataframe_and_serves_from_its_columns(spark, tmp_path):
    from pyspark.sql import functions as F

    import sparktf
    from sparktf import models
    from sparktf.datasets.tables import TableInputError
    from sparktf.train import fit
    from tests import helpers

    models.register(
        "two_inputs",
        build,
        inputs=["num", "city"],
        num_classes=2,
        batch_size=32,
        learning_rate=0.02,
    )
    frame = _frame(spark, 1200, seed=0).where(F.col("id") < 1024)  # a plan, not a table
    scaling = ScalingConfig(strategy="allreduce", num_workers=2, threads_per_worker=1)
    model_dir = tmp_path / "model"
    before = _scratch()
    result = fit(
        TrainConfig(model="two_inputs", data=frame, epochs=3, seed=1),
        scaling,
        RunConfig(model_dir=str(model_dir)),
        spark=spark,
        columns={"label": "y"},
    )
    assert result.input_mode == "spark" and result.final_step == 3 * (1024 // 32)
    assert sum(result.fed_rows.values()) == 3 * 1024  # every row of every epoch, once
    written = [str(p.relative_to(model_dir)) for p in model_dir.rglob("*") if p.is_file()]
    assert not [p for p in written if p.endswith((".parquet", "manifest.json"))], written
    assert not [p for p in written if "_fit_data" in p or "data" in p.split(os.sep)[0]]
    assert _scratch() <= before  # no feed or copy left in the scratch directories
    helpers.assert_nothing_left()

    test = _frame(spark, 400, seed=1)
    scored = sparktf.predict(test, result.export_dir, keep_columns=["id", "y"]).collect()
    assert len(scored) == 400
    accuracy = np.mean([row["prediction"] == row["y"] for row in scored])
    assert accuracy > 0.85, accuracy

    # A null is refused naming its column and row, before anything starts or is written.
    holed = frame.withColumn("city", F.when(F.col("id") == 5, None).otherwise(F.col("city")))
    refused = tmp_path / "refused"
    with pytest.raises(TableInputError, match=r"column 'city': the row with id=5 is null"):
        fit(
            TrainConfig(model="two_inputs", data=holed, epochs=1),
            scaling,
            RunConfig(model_dir=str(refused)),
            spark=spark,
            columns={"label": "y"},
        )
    assert not refused.exists()
