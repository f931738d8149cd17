"""Serving any SavedModel: a Keras ``model.export`` of two inputs and two outputs, outputs
typed from their TensorSpecs, a streaming query, and the model as a SQL function.

Every prediction is compared with the SavedModel called directly in this process.
"""

from __future__ import annotations

import io
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pyarrow as pa
import pytest

import sparktf
from sparktf import inference
from sparktf.inference import PredictInputError
from sparktf.inference.output_columns import Output, plan_outputs
from sparktf.inference.prediction_plan import feed_problem, signature_kind
from sparktf.inference.saved_model import Signature, TensorSpec
from tests.helpers import call, export, worker_stats

pytestmark = pytest.mark.integration  # tests of another tier carry their own mark

N = 48
CITIES = ["paris", "oslo", "lima"]


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def signature(inputs: dict, outputs: dict) -> Signature:
    def specs(d):
        return {k: TensorSpec(k, dtype, shape) for k, (dtype, shape) in d.items()}

    return Signature("serving_default", specs(inputs), specs(outputs))


# ----------------------------------------------------------------------------- no Spark


@pytest.mark.unit
def test_output_columns_are_typed_from_their_tensor_specs():
    sig = signature(
        {"x": ("float32", (None, 4))},
        {
            "price": ("float32", (None, 1)),
            "scores": ("float32", (None, 3)),
            "grid": ("float64", (None, 2, 2)),
            "count": ("int32", (None,)),
            "flag": ("bool", (None,)),
            "label": ("string", (None,)),
            "png": ("string", (None,)),
        },
    )
    typed = {o.key: o for o in plan_outputs(sig, binary_outputs=["png"])}
    types = {k: o.spark_type().simpleString() for k, o in typed.items()}
    assert types == {
        "price": "double",
        "scores": "array<float>",
        "grid": "array<array<double>>",
        "count": "bigint",
        "flag": "boolean",
        "label": "string",
        "png": "binary",
    }
    n = 3
    grid = np.arange(12, dtype=np.float64).reshape(n, 2, 2)
    assert typed["grid"].arrow(grid, n).to_pylist()[1] == [[4.0, 5.0], [6.0, 7.0]]
    assert typed["price"].arrow(np.array([[1.5], [2.5], [3.5]], np.float32), n).to_pylist() == [
        1.5,
        2.5,
        3.5,
    ]
    assert typed["label"].arrow(np.array([b"a", b"b", "é".encode()], object), n).to_pylist() == [
        "a",
        "b",
        "é",
    ]
    with pytest.raises(ValueError, match="not UTF-8 text.*binary_outputs=\\['label'\\]"):
        typed["label"].arrow(np.array([b"\xff", b"b", b"c"], object), n)
    assert typed["png"].arrow(np.array([b"\xff", b"", b"c"], object), n).to_pylist()[0] == b"\xff"
    # chosen and renamed; unknown names are named
    assert [(o.key, o.column) for o in plan_outputs(sig, {"price": "p", "count": "c"})] == [
        ("price", "p"),
        ("count", "c"),
    ]
    with pytest.raises(ValueError, match=r"no output\(s\) \['nope'\]"):
        plan_outputs(sig, ["nope"])
    with pytest.raises(ValueError, match="binary_outputs: output 'count' is int32"):
        plan_outputs(sig, binary_outputs=["count"])
    assert Output("c", "c", "int64", 0).arrow(np.arange(3), 3).type == pa.int64()
    with pytest.raises(ValueError, match=r"output 'price' has shape \(3, 2\)"):
        typed["price"].arrow(np.zeros((3, 2), np.float32), n)  # declared [B, 1]
    with pytest.raises(ValueError, match="binary_outputs must be a list"):
        plan_outputs(sig, binary_outputs="png")


@pytest.mark.unit
def test_any_signature_is_served_unless_an_input_or_output_cannot_be_a_column():
    keras_like = signature(
        {"numbers": ("float32", (None, 4)), "city": ("string", (None,))},
        {"output_0": ("float32", (None, 1)), "output_1": ("float32", (None, 3))},
    )
    assert signature_kind(keras_like) == "named"
    ragged = signature({"x": ("float32", (None, None))}, {"y": ("float32", (None,))})
    assert "input 'x' (float32[B,?]) has a dimension of unknown size" in feed_problem(ragged)
    with pytest.raises(ValueError, match="cannot serve signature .*input 'x'"):
        signature_kind(ragged)
    flags = signature({"x": ("bool", (None, 2))}, {"y": ("float32", (None,))})
    assert "input 'x' (bool[B,2]) is not one bool per row" in feed_problem(flags)
    # an output no column holds is refused when served, named; leaving it out serves the rest
    odd = signature(
        {"x": ("float32", (None, 2))}, {"y": ("dtype8", (None,)), "z": ("int64", (None,))}
    )
    assert signature_kind(odd) == "named"
    with pytest.raises(ValueError, match=r"output 'y' has dtype dtype8.*outputs=\[...\]"):
        plan_outputs(odd)
    assert [o.key for o in plan_outputs(odd, ["z"])] == ["z"]
    # sparktf's own kinds keep their contracts; outputs= serves one as it is
    classifier = signature(
        {"features": ("float32", (None, 4))},
        {"classes": ("int64", (None,)), "scores": ("float32", (None, 3))},
    )
    assert signature_kind(classifier) == "features"
    assert signature_kind(classifier, served=True) == "named"


# ----------------------------------------------------------------------------- Spark


@pytest.fixture(scope="module")
def keras_export(tmp_path_factory) -> dict:
    """A Keras model of two inputs (4 numbers, a city name) and two outputs (a price, three
    class probabilities), exported by Keras' own ``model.export``; rows and its outputs."""
    import keras

    keras.utils.set_random_seed(7)
    numbers = keras.Input((4,), name="numbers")
    city = keras.Input((), dtype="string", name="city")
    index = keras.layers.StringLookup(vocabulary=CITIES)(city)
    embedded = keras.layers.Flatten()(keras.layers.Embedding(len(CITIES) + 1, 2)(index[:, None]))
    hidden = keras.layers.Dense(8, activation="relu")(
        keras.layers.Concatenate()([numbers, embedded])
    )
    price = keras.layers.Dense(1, name="price")(hidden)
    kind = keras.layers.Dense(3, activation="softmax", name="kind")(hidden)
    model = keras.Model({"numbers": numbers, "city": city}, {"price": price, "kind": kind})
    path = str(tmp_path_factory.mktemp("keras") / "export")
    model.export(path)  # Keras' exporter, not sparktf's
    rng = np.random.default_rng(1)
    x = rng.normal(size=(N, 4)).astype(np.float32)
    cities = np.array([CITIES[i % 3] for i in range(N)], dtype=object)
    direct = call(path, "serving_default", numbers=x, city=cities)
    return {"path": path, "x": x, "cities": cities, **direct}


@pytest.fixture
def keras_rows(spark, keras_export):
    rows = [(i, keras_export["x"][i].tolist(), str(keras_export["cities"][i])) for i in range(N)]
    return spark.createDataFrame(rows, "id long, num array<float>, city string").repartition(3)


def by_id(rows) -> list:
    return sorted(rows, key=lambda r: r["id"])


def test_a_keras_export_of_two_inputs_and_two_outputs_equals_the_model(keras_rows, keras_export):
    out = sparktf.predict(keras_rows, keras_export["path"], inputs={"numbers": "num"})
    assert out.schema["price"].dataType.simpleString() == "double"
    assert out.schema["kind"].dataType.simpleString() == "array<float>"
    rows = by_id(out.collect())
    assert [r["id"] for r in rows] == list(range(N))
    np.testing.assert_allclose([r["price"] for r in rows], keras_export["price"][:, 0], rtol=1e-5)
    np.testing.assert_allclose([r["kind"] for r in rows], keras_export["kind"], rtol=1e-5)
    # one struct of chosen, renamed outputs
    out = sparktf.predict(
        keras_rows,
        keras_export["path"],
        inputs={"numbers": "num"},
        outputs={"price": "p"},
        struct_col="model",
        keep_columns=["id"],
    )
    assert out.columns == ["id", "model"]
    assert out.schema["model"].dataType.simpleString() == "struct<p:double>"
    rows = by_id(out.collect())
    np.testing.assert_allclose(
        [r["model"]["p"] for r in rows], keras_export["price"][:, 0], rtol=1e-5
    )


def test_bad_input_to_any_signature_is_named(spark, keras_rows, keras_export):
    path = keras_export["path"]
    with pytest.raises(PredictInputError, match="input column 'numbers' is missing"):
        sparktf.predict(keras_rows, path)  # no column of the input's name, no mapping
    with pytest.raises(ValueError, match=r"no input\(s\) \['nums'\]"):
        sparktf.predict(keras_rows, path, inputs={"nums": "num"})
    with pytest.raises(PredictInputError, match="column 'id' has Spark type bigint"):
        sparktf.predict(keras_rows, path, inputs={"numbers": "num", "city": "id"})
    short = keras_rows.selectExpr("id", "slice(num, 1, 3) AS num", "city")
    with pytest.raises(Exception, match=r"column 'num': the row with id=\d+ has shape \(3,\)"):
        sparktf.predict(short, path, inputs={"numbers": "num"}).collect()


@pytest.fixture(scope="module")
def mlp(tmp_path_factory) -> dict:
    """sparktf's MNIST MLP (16 hidden units) and its direct predictions on N images."""
    path = export(
        "mnist_mlp", tmp_path_factory.mktemp("mlp") / "export" / "1", seed=5, hidden_units=16
    )
    images = np.random.default_rng(3).integers(0, 256, (N, 28, 28, 1), dtype=np.uint8)
    direct = call(path, "predict_images", images=images)
    return {"path": path, "images": images, **direct}


def images_df(spark, mlp, ids=range(N)):
    rows = [(i, npy(mlp["images"][i])) for i in ids]
    return spark.createDataFrame(rows, "id long, image binary")


def test_sql_and_column_functions_return_what_predict_returns(spark, mlp, keras_rows, keras_export):
    images = images_df(spark, mlp).repartition(2)
    images.createOrReplaceTempView("serve_any_images")
    inference.register_udf(spark, "classify", mlp["path"], output="prediction", batch_size=16)
    rows = spark.sql("SELECT id, classify(image) AS digit FROM serve_any_images").collect()
    predicted = {r["id"]: r["prediction"] for r in sparktf.predict(images, mlp["path"]).collect()}
    assert {r["id"]: r["digit"] for r in rows} == predicted
    np.testing.assert_array_equal([r["digit"] for r in by_id(rows)], mlp["classes"])
    # the whole classifier result as a struct, from select
    both = sparktf.predict_udf(mlp["path"])
    row = images.select("id", both("image").alias("out")).where("id = 5").first()
    assert row["out"]["prediction"] == mlp["classes"][5]
    np.testing.assert_allclose(row["out"]["probability"], mlp["scores"][5], rtol=1e-5)
    # two inputs, in the order given; two outputs in a struct
    keras = sparktf.predict_udf(keras_export["path"], input_order=["numbers", "city"])
    rows = by_id(keras_rows.select("id", keras("num", "city").alias("out")).collect())
    np.testing.assert_allclose(
        [r["out"]["price"] for r in rows], keras_export["price"][:, 0], rtol=1e-5
    )
    np.testing.assert_allclose([r["out"]["kind"] for r in rows], keras_export["kind"], rtol=1e-5)
    with pytest.raises(ValueError, match="reads 2 column"):
        keras("num")
    # a bad row fails the query with the same error as predict
    bad = spark.createDataFrame([(0, b"\x01\x02")], "id long, image binary")
    with pytest.raises(Exception, match="PredictInputError: column 'image': row 0 of its batch"):
        bad.select(both("image")).collect()


def test_a_streaming_query_predicts_each_micro_batch_with_one_load_per_worker(spark, mlp, tmp_path):
    source, sink = tmp_path / "in", tmp_path / "out"
    import pyarrow.parquet as pq

    source.mkdir()
    for part, ids in enumerate((range(0, 24), range(24, N))):  # two files: two micro-batches
        table = pa.table(
            {"id": pa.array(ids, pa.int64()), "image": [npy(mlp["images"][i]) for i in ids]}
        )
        pq.write_table(table, source / f"part-{part}.parquet")
    stream = (
        spark.readStream.schema("id long, image binary")
        .option("maxFilesPerTrigger", 1)
        .parquet(source.as_uri())
    )
    query = (
        sparktf.predict(stream, mlp["path"], keep_columns=["id"])
        .writeStream.format("parquet")
        .option("checkpointLocation", (tmp_path / "checkpoint").as_uri())
        .trigger(availableNow=True)
        .start(sink.as_uri())
    )
    try:
        assert query.awaitTermination(240), "the query did not finish"
    finally:
        query.stop()
    batches = [p for p in query.recentProgress if p["numInputRows"]]
    assert [p["numInputRows"] for p in batches] == [24, 24]
    rows = by_id(spark.read.parquet(sink.as_uri()).collect())
    assert [r["id"] for r in rows] == list(range(N))
    np.testing.assert_array_equal([r["prediction"] for r in rows], mlp["classes"])
    np.testing.assert_allclose([r["probability"] for r in rows], mlp["scores"], rtol=1e-5)
    stats = worker_stats(spark, inference.inspect_export(mlp["path"]).fingerprint)
    assert stats and all(s["loads"] <= 1 for s in stats.values()), stats
    assert sum(s["batches"] for s in stats.values()) >= 2, stats


def test_tfmodel_streams_and_a_bad_record_fails_the_query_as_in_batch(spark, mlp, tmp_path):
    """TFModel.transform over a JSON file source: the first micro-batch is written, the second
    holds a bad record and fails the query with the error batch inference gives."""
    from pyspark.errors import StreamingQueryException

    from sparktf.ml import TFModel

    source, sink = tmp_path / "json", tmp_path / "out"
    source.mkdir()
    good = [f'{{"id": {i}, "image": {mlp["images"][i].reshape(-1).tolist()}}}' for i in range(3)]
    (source / "1.json").write_text("\n".join(good) + "\n")
    (source / "2.json").write_text('{"id": 7, "image": [1, 2]}\n')
    later = (source / "1.json").stat().st_mtime + 10  # the files are taken oldest first
    os.utime(source / "2.json", (later, later))
    stream = (
        spark.readStream.schema("id long, image array<int>")
        .option("maxFilesPerTrigger", 1)
        .json(source.as_uri())
    )
    model = TFModel(exportDir=mlp["path"], inputCol="image")
    query = (
        model.transform(stream)
        .select("id", "prediction")
        .writeStream.format("parquet")
        .option("checkpointLocation", (tmp_path / "checkpoint").as_uri())
        .trigger(availableNow=True)
        .start(sink.as_uri())
    )
    try:
        with pytest.raises(StreamingQueryException, match="column 'image': the row with id=7"):
            query.awaitTermination(240)
    finally:
        query.stop()
    rows = by_id(spark.read.parquet(sink.as_uri()).collect())
    assert [r["prediction"] for r in rows] == [float(c) for c in mlp["classes"][:3]]
