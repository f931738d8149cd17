"""Training straight from a DataFrame, no copy: a model of two named inputs (a numeric vector,
and a string through ``StringLookup`` + ``Embedding`` inside the model) is trained from the
caller's DataFrame -- a filtered plan, not a table -- with nothing written but the run's own
artifacts, then ``sparktf.predict`` serves its export from the same columns. A bad row is
refused naming its column and id before anything starts. Real local-cluster, real
TensorFlow (all-reduce over the session's two executors).
"""

from __future__ import annotations

import os
import tempfile

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
    """The scratch directories where this test process's runs put theirs (its own temporary
    and feed directories: tests/conftest.py)."""
    from sparktf import scratch

    return {
        os.path.join(base, name)
        for base in (tempfile.gettempdir(), os.environ["SPARKTF_FEED_DIR"])
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
        TrainConfig(model="two_inputs", data=frame, epochs=4, seed=1),
        scaling,
        RunConfig(model_dir=str(model_dir)),
        spark=spark,
        columns={"label": "y"},
    )
    # Every row of every epoch fed once, half to each process: all the steps asked for.
    assert result.input_mode == "spark" and sum(result.fed_rows.values()) == 4 * 1024
    assert set(result.fed_rows.values()) == {2 * 1024}
    assert result.final_step == 4 * (1024 // 32)
    written = [str(p.relative_to(model_dir)) for p in model_dir.rglob("*") if p.is_file()]
    assert not [p for p in written if p.endswith((".parquet", "manifest.json"))], written
    assert not [p for p in written if "_fit_data" in p or "data" in p.split(os.sep)[0]]
    helpers.assert_nothing_left()  # the processes are gone, and with them their scratch
    assert _scratch() <= before  # no feed or copy left in the scratch directories

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


def two_outputs(inputs, outputs, hidden_units=16):
    """A shared layer under two heads: a price (a number) and a churn logit."""
    import keras

    city = keras.layers.StringLookup(vocabulary=list(CITIES), output_mode="one_hot")
    x = keras.layers.Concatenate()([inputs["num"], city(inputs["city"])])
    x = keras.layers.Dense(hidden_units, activation="relu")(x)
    heads = {name: keras.layers.Dense(1, name=name)(x) for name in outputs}
    return keras.Model(inputs, heads)


def test_a_model_of_two_outputs_trains_from_label_columns_and_serves_a_column_each(spark, tmp_path):
    """Two outputs, a loss each (mse for ``price``, a logit for ``y``), each label a column
    of the DataFrame by the output's name; ``sparktf.predict`` adds a column per output."""
    from pyspark.sql import functions as F

    import sparktf
    from sparktf import models
    from sparktf.train import fit

    models.register(
        "two_outputs",
        two_outputs,
        inputs=["num", "city"],
        outputs={"price": "mse", "y": "binary_crossentropy"},
        batch_size=32,
        learning_rate=0.02,
    )
    price = F.col("num")[0] * 2.0 + F.when(F.col("city") == "paris", 3.0).otherwise(0.0)

    def priced(df):
        from pyspark.ml.functions import vector_to_array

        return df.withColumn("num", vector_to_array("num")).withColumn("price", price)

    result = fit(
        TrainConfig(model="two_outputs", data=priced(_frame(spark, 1024, seed=2)), epochs=3),
        ScalingConfig(strategy="allreduce", num_workers=2, threads_per_worker=1),
        RunConfig(model_dir=str(tmp_path / "model")),
        spark=spark,
    )
    assert {"price_loss", "y_loss"} <= set(result.metrics)
    test = priced(_frame(spark, 300, seed=3))
    test = test.withColumnRenamed("price", "true_price").withColumnRenamed("y", "y_true")
    scored = sparktf.predict(test, result.export_dir).toPandas()
    assert {"price", "y"} <= set(scored.columns) and len(scored) == 300
    error = (scored["price"] - scored["true_price"]).abs().mean()
    assert error < 0.5, error  # the prices span about -6..9
    accuracy = ((scored["y"] > 0.5).astype(int) == scored["y_true"]).mean()
    assert accuracy > 0.85, accuracy
