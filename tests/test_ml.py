"""Spark ML stages (sparktf.ml.TFEstimator / TFModel), the tabular Pipeline example, Spark
ML's evaluators and CrossValidator on them, and a user's model named 'package.module:build'
trained by jobs/train.py.

Runs on the session's local-cluster (two executors): all-reduce with two workers. The
trainings: the example's Pipeline (once, shared by the tests that read it), a
CrossValidator over a TFEstimator (two folds of one param map, then the best map on all
rows) and the job, which starts its own Spark application; the error cases fail before any
training starts.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import pytest

from tests import helpers
from tests.helpers import assert_nothing_left

pytestmark = pytest.mark.integration  # tests of another tier carry their own mark

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "tabular_pipeline.py"

BUILD_MODULE = """
import keras

def build(input_shape, num_classes, hidden_units=16):
    inputs = keras.Input(input_shape)
    x = keras.layers.Flatten()(inputs)
    x = keras.layers.Dense(hidden_units, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))
"""


@pytest.fixture(scope="module")
def example():
    with helpers.imported_example(EXAMPLE, "tabular_pipeline_example") as module:
        yield module


@pytest.fixture(scope="module")
def small_export(tmp_path_factory):
    """An untrained export of a registered 3-feature model (no Spark needed to make it)."""
    from sparktf import models

    def build(input_shape, num_classes):
        import keras

        inputs = keras.Input(input_shape)
        return keras.Model(inputs, keras.layers.Dense(num_classes)(inputs))

    models.register("ml_three_features", build, input_shape=(3,), num_classes=2)
    task = models.get_task("ml_three_features")
    path = tmp_path_factory.mktemp("export") / "1"
    return task.export(task.build_model(), str(path))


@pytest.mark.e2e
@pytest.mark.parametrize("name", ["tabular_pipeline", "regression_pipeline", "wide_and_deep"])
def test_examples_have_help(name):
    done = helpers.run_command(
        [sys.executable, REPO / "examples" / f"{name}.py", "--help"], timeout=120
    )
    assert done.returncode == 0, done.stderr
    for flag in ("--csv", "--model-dir", "--output", "--demo-rows"):
        assert flag in done.stdout


@pytest.mark.unit
def test_stages_have_pyspark_params():
    from sparktf.ml import TFEstimator, TFModel

    est = TFEstimator(
        model="m:build", modelConfig={"hidden_units": 4}, numWorkers=2, steps=3, modelDir="/x"
    )
    for name in (
        "model",
        "modelConfig",
        "strategy",
        "numWorkers",
        "numPs",
        "epochs",
        "steps",
        "batchSize",
        "modelDir",
        "inputCol",
        "labelCol",
        "predictionCol",
    ):
        assert est.hasParam(name), name
    assert est.getRawPredictionCol() == "rawPrediction"  # Spark ML's classifiers' columns
    assert est.getOrDefault("strategy") == "allreduce" and est.getInputCol() == "features"
    model = TFModel(exportDir="/e")
    assert model.getPredictionCol() == "prediction"
    assert model.getProbabilityCol() == "probability"
    assert model.getRawPredictionCol() == "rawPrediction"


@pytest.mark.unit
def test_a_model_not_made_by_fit_has_no_summary():
    from sparktf import SparktfError
    from sparktf.ml import NoSummaryError, TFModel
    from sparktf.train import ConfigError

    model = TFModel(exportDir="/e")
    assert not model.hasSummary
    with pytest.raises(NoSummaryError, match="no training summary") as info:
        model.summary  # noqa: B018 - the property raises
    assert isinstance(info.value, SparktfError) and isinstance(info.value, RuntimeError)
    with pytest.raises(ConfigError, match="exportDir is not set"):
        TFModel().getExportDir()


def test_estimator_persists_in_a_pipeline(spark, tmp_path):
    from pyspark.ml import Pipeline
    from pyspark.ml.feature import VectorAssembler

    from sparktf.ml import TFEstimator

    est = TFEstimator(model="m:build", modelConfig={"hidden_units": 4}, steps=3, modelDir="/x")
    pipeline = Pipeline(stages=[VectorAssembler(inputCols=["a"], outputCol="features"), est])
    pipeline.save(str(tmp_path / "p"))
    again = Pipeline.load(str(tmp_path / "p")).getStages()[1]
    assert isinstance(again, TFEstimator)
    assert again.getOrDefault("modelConfig") == {"hidden_units": 4}
    assert again.getOrDefault("steps") == 3 and again.uid == est.uid


def test_transform_adds_spark_ml_columns_reads_vectors_and_arrays_and_names_a_bad_row(
    spark, small_export
):
    from pyspark.ml.linalg import DenseVector, Vectors, VectorUDT
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    import sparktf
    from sparktf.inference import PredictInputError
    from sparktf.ml import TFModel

    rows = [
        (10, Vectors.dense([0.5, -1.0, 2.0]), [0.5, -1.0, 2.0]),
        (11, Vectors.sparse(3, {1: 3.0}), [0.0, 3.0, 0.0]),
    ]
    df = spark.createDataFrame(rows, ["id", "features", "values"])
    model = TFModel(exportDir=small_export)
    # Spark ML's classifier columns, which sparktf.predict adds under the same names.
    added = ["prediction", "probability", "rawPrediction"]
    plain = sparktf.predict(df.select("id", "features"), small_export, input_col="features")
    scored = model.transform(df)
    assert scored.columns == [*df.columns, *added] and plain.columns[-3:] == added
    types = {f.name: f.dataType for f in scored.schema.fields}
    assert isinstance(types["prediction"], T.DoubleType)
    assert isinstance(types["probability"], VectorUDT)
    assert isinstance(types["rawPrediction"], VectorUDT)
    by_vector = scored.orderBy("id").collect()
    assert [r["id"] for r in by_vector] == [10, 11]
    assert by_vector[0]["features"] == Vectors.dense([0.5, -1.0, 2.0])  # kept as it was
    by_array = model.setInputCol("values").transform(df).orderBy("id").collect()
    direct = helpers.call(
        small_export, "predict_features", features=np.array([r[2] for r in rows], np.float32)
    )
    for got in (by_vector, by_array):
        assert all(isinstance(r["probability"], DenseVector) for r in got)
        probabilities = np.array([r["probability"].toArray() for r in got])
        np.testing.assert_allclose(probabilities, direct["scores"], rtol=1e-5, atol=1e-6)
        raw = np.array([r["rawPrediction"].toArray() for r in got])
        np.testing.assert_allclose(raw, np.log(direct["scores"]), rtol=1e-5, atol=1e-5)
        assert [r["prediction"] for r in got] == [float(c) for c in direct["classes"]]

    # An empty column name leaves that column out; an added column may not exist already.
    model.setRawPredictionCol("").setProbabilityCol("")
    assert model.transform(df).columns == [*df.columns, "prediction"]
    model.setRawPredictionCol("rawPrediction").setProbabilityCol("probability")
    with pytest.raises(PredictInputError, match=r"\['rawPrediction'\] already exist"):
        model.transform(df.withColumn("rawPrediction", F.lit(1.0)))

    bad = spark.createDataFrame(
        [(1, [1.0, 2.0, 3.0]), (7, [1.0, 2.0, 3.0, 4.0])], ["id", "values"]
    ).coalesce(1)
    with pytest.raises(Exception) as info:
        model.transform(bad).collect()
    text = str(info.value)
    assert "column 'values'" in text and "id=7" in text and "shape (4,)" in text, text[-2000:]
    assert "shape (3,)" in text
    # idCol names the row by another column (sparktf.predict's id_col)
    with pytest.raises(Exception, match=r"the row with row=7 has"):
        model.setIdCol("row").transform(bad.withColumnRenamed("id", "row")).collect()
    model.setIdCol("id")
    wide = bad.select("id", F.col("values").alias("v"))
    with pytest.raises(Exception, match="input column 'features' is missing"):
        model.setInputCol("features").transform(wide)


def test_fit_refuses_rows_that_do_not_fit_the_model_before_training(spark, small_export, tmp_path):
    from pyspark.ml.linalg import Vectors

    from sparktf.ml import TFEstimator

    est = TFEstimator(
        model="ml_three_features", steps=2, batchSize=2, modelDir=str(tmp_path / "model")
    )
    ragged = spark.createDataFrame(
        [(1, Vectors.dense([1.0, 2.0, 3.0]), 0), (7, Vectors.dense([1.0, 2.0]), 1)],
        ["id", "features", "label"],
    )
    with pytest.raises(
        ValueError,
        match=r"column 'features': the row with id=7 has 2 values; "
        r"expected shape \(3,\)",
    ):
        est.fit(ragged)
    labels = spark.createDataFrame(
        [(1, [1.0, 2.0, 3.0], 0), (4, [1.0, 2.0, 3.0], 5)], ["id", "features", "label"]
    )
    with pytest.raises(
        ValueError,
        match=r"the row with id=4 has label 5; expected a class in "
        r"\[0, 2\)",
    ):
        est.fit(labels)
    assert not (tmp_path / "model").exists()  # refused before anything was written
    from sparktf import models
    from sparktf.train import ConfigError

    models.register("ml_two_outputs", lambda shape, outputs: None, outputs={"a": "mse", "b": "mae"})
    with pytest.raises(ConfigError, match="several outputs .* one labelCol"):
        TFEstimator(model="ml_two_outputs", modelDir=str(tmp_path / "two")).fit(labels)


def test_training_data_from_npy_bytes_and_arrays_is_what_the_model_reads(spark, tmp_path):
    """The dataset format's ndarray column (np.save bytes) passes through unchanged; numbers
    for a uint8 model must be integers in [0, 255]."""
    import io

    import pyarrow.parquet as pq

    from sparktf import ml
    from sparktf.datasets import formats
    from sparktf.datasets.tables import TableInputError, write_table

    assert ml.write_table is write_table  # still importable where it was

    images = np.arange(4 * 2 * 2, dtype=np.uint8).reshape(4, 2, 2, 1) * 7

    def npy(a) -> bytearray:
        buf = io.BytesIO()
        np.save(buf, a)
        return bytearray(buf.getvalue())

    df = spark.createDataFrame(
        [(10 + i, npy(images[i]), i % 3) for i in range(4)], ["id", "image", "label"]
    )
    target = tmp_path / "images"
    out = write_table(
        df,
        str(target),
        input_col="image",
        label_col="label",
        id_col="id",
        feature="image",
        shape=(2, 2, 1),
        num_classes=3,
    )
    assert out == {
        "rows": 4,
        "shape": (2, 2, 1),
        "dtype": "uint8",
        "num_classes": 3,
        "label_shape": (),
    }
    manifest = formats.load_manifest(str(target))
    assert formats.manifest_fields(manifest) == [
        formats.Field("image", "uint8", (2, 2, 1)),
        formats.Field("label", "int64"),
        formats.Field("id", "int64"),
    ]
    assert manifest["schema"]["label"]["num_classes"] == 3
    table = pq.read_table(target / "train" / "parquet")
    order = np.argsort(table["id"].to_numpy())
    decoded = formats.decode_ndarray_column(table["image"], "uint8", (2, 2, 1))
    np.testing.assert_array_equal(decoded[order], images)
    np.testing.assert_array_equal(table["label"].to_numpy()[order], [0, 1, 2, 0])

    # Float targets (a regression model's): a number per row as float32, a vector per row
    # as numpy.save float32 bytes.
    targets = spark.createDataFrame(
        [(1, [1.0, 2.0], 0.5, [0.0, 1.0]), (2, [3.0, 4.0], -1.25, [1.0, 1.0])],
        ["id", "features", "y", "tags"],
    ).coalesce(1)
    for col, shape in (("y", ()), ("tags", (2,))):
        target = tmp_path / f"values-{col}"
        out = write_table(
            targets, str(target), input_col="features", label_col=col, id_col="id", labels="values"
        )
        assert out["num_classes"] is None and out["label_shape"] == shape
        label = formats.manifest_fields(formats.load_manifest(str(target)))[1]
        assert label == formats.Field("label", "float32", shape or None)
        table = pq.read_table(target / "train" / "parquet").sort_by("id")
        got = (
            formats.decode_ndarray_column(table["label"], "float32", shape)
            if shape
            else table["label"].to_numpy()
        )
        np.testing.assert_array_equal(got, [0.5, -1.25] if col == "y" else [[0, 1], [1, 1]])

    numbers = spark.createDataFrame(
        [(1, [0.0, 1.0, 2.0, 3.0], 0), (2, [0.0, 1.0, 2.5, 300.0], 1)],
        ["id", "pixels", "label"],
    ).coalesce(1)
    with pytest.raises(TableInputError, match="no label column 'y' \\(label_col\\)"):
        write_table(numbers, str(tmp_path / "none"), input_col="pixels", label_col="y", id_col="id")
    with pytest.raises(Exception) as info:
        write_table(
            numbers,
            str(tmp_path / "numbers"),
            input_col="pixels",
            label_col="label",
            id_col="id",
            feature="image",
            shape=(2, 2, 1),
            dtype="uint8",
        )
    assert "column 'pixels': the row with id=2 has values that are not integers" in str(info.value)
    # the failed write left nothing: neither the dataset nor its temporary sibling
    assert not [p for p in os.listdir(tmp_path) if "numbers" in p], os.listdir(tmp_path)
    from sparktf import storage

    with pytest.raises(storage.PathExistsError, match="already exists"):
        write_table(
            targets,
            str(tmp_path / "values-y"),
            input_col="features",
            label_col="y",
            id_col="id",
            labels="values",
        )


@pytest.fixture(scope="module")
def tabular(spark, example, tmp_path_factory):
    """The example's Pipeline, fitted once on a synthetic 3-class CSV: what ``run`` returns,
    and its working directory."""
    from sparktf import cli

    root = tmp_path_factory.mktemp("tabular")
    csv = example.write_demo_csv(root / "data.csv", rows=400, seed=1)
    args = cli.parse(
        example.parser(),
        [
            "--csv",
            csv,
            "--model-dir",
            str(root / "model"),
            "--output",
            str(root / "predictions"),
            "--epochs",
            "12",
            "--batch-size",
            "16",
        ],
    )
    return {**example.run(args, spark), "root": root}


def test_tabular_pipeline_example_trains_saves_loads_and_predicts(tabular):
    from pyspark.ml import PipelineModel

    from sparktf.ml import TFModel
    from sparktf.train import TrainResult

    summary = tabular["summary"]
    assert summary["features"] == ["x1", "x2", "x3", "x4"]
    assert summary["test_rows"] > 60
    assert summary["test_accuracy"] > 0.85, summary  # three classes: chance is 1/3
    assert_nothing_left()

    # The saved and loaded PipelineModel predicts what the fitted one does.
    fitted = tabular["fitted"].transform(tabular["test"]).orderBy("id").collect()
    loaded = tabular["loaded"].transform(tabular["test"]).orderBy("id").collect()
    assert [r["prediction"] for r in loaded] == [r["prediction"] for r in fitted]
    np.testing.assert_allclose(
        [r["probability"].toArray() for r in loaded],
        [r["probability"].toArray() for r in fitted],
        rtol=1e-6,
    )
    stage = PipelineModel.load(summary["pipeline"]).stages[-1]
    assert isinstance(stage, TFModel)
    assert stage.getExportDir().endswith("/savedmodel")  # its own copy of the SavedModel
    # The copy lies where Spark wrote the stage's metadata: a path without a scheme is on
    # fs.defaultFS, the suite's HDFS.
    assert stage.getExportDir().startswith("hdfs://")
    # The fit's TrainResult is the model's summary, saved with it.
    result = tabular["fitted"].stages[-1].summary
    assert isinstance(result, TrainResult) and result.final_step > 100
    assert stage.summary == result and tabular["loaded"].stages[-1].summary == result
    assert not list((tabular["root"] / "model").glob("_fit_data-*"))


def test_multiclass_evaluator_scores_the_fitted_pipeline(tabular):
    from pyspark.ml.evaluation import MulticlassClassificationEvaluator

    scored = tabular["loaded"].transform(tabular["test"])
    evaluator = MulticlassClassificationEvaluator(metricName="accuracy")
    accuracy = evaluator.evaluate(scored)
    assert accuracy == pytest.approx(tabular["summary"]["test_accuracy"])
    log_loss = MulticlassClassificationEvaluator(metricName="logLoss").evaluate(scored)
    assert math.isfinite(log_loss) and log_loss < 1.0  # read from the probability Vectors


WIDE_AND_DEEP_EXAMPLE = REPO / "examples" / "wide_and_deep.py"
REGRESSION_EXAMPLE = REPO / "examples" / "regression_pipeline.py"


@pytest.fixture(scope="module")
def regression_example():
    with helpers.imported_example(REGRESSION_EXAMPLE, "regression_example") as module:
        yield module


def test_regression_example_tunes_a_learning_rate_and_reaches_the_noise(
    spark, regression_example, tmp_path
):
    """A user's linear model with loss="mse" on y = w.x + 1 + noise: CrossValidator over two
    learning rates (2 folds each, then the best on all rows), RegressionEvaluator on the
    TFModel's double prediction; the held-out RMSE comes within 10% of the noise's std."""
    from pyspark.sql import types as T

    from sparktf import cli, storage

    args = cli.parse(
        regression_example.parser(),
        [
            "--demo-rows",
            "1200",  # few passes of many rows: a feed pass is a Spark job
            "--epochs",
            "8",
            "--csv",
            str(tmp_path / "data.csv"),
            "--model-dir",
            str(tmp_path / "model"),
            "--output",
            str(tmp_path / "predictions"),
        ],
    )
    out = regression_example.run(args, spark)
    summary = out["summary"]
    assert summary["features"] == ["x1", "x2", "x3", "x4"]
    assert len(summary["cv_rmse"]) == 2
    # The slow rate (0.0005) cannot fit in 8 epochs: the cross-validation picks the other.
    assert summary["best_learning_rate"] == 0.05, summary
    assert summary["cv_rmse"][0] < summary["cv_rmse"][1]
    assert summary["test_rmse"] < 1.1 * summary["noise_std"], summary
    scored = spark.read.parquet(storage.spark_uri(summary["predictions"]))
    assert isinstance(scored.schema["prediction"].dataType, T.DoubleType)
    assert scored.count() == summary["test_rows"] > 200
    # Each fold and rate trained in a directory of its own; no temporary dataset is left.
    assert len(list((tmp_path / "model").glob("fits-*/*"))) == 2 * 2
    assert not list((tmp_path / "model").rglob("_fit_data-*"))
    assert_nothing_left()


@pytest.fixture(scope="module")
def wide_and_deep_example():
    with helpers.imported_example(WIDE_AND_DEEP_EXAMPLE, "wide_and_deep_example") as module:
        yield module


def test_wide_and_deep_example_trains_on_numbers_and_strings_without_a_copy(
    spark, wide_and_deep_example, tmp_path
):
    """Two numeric columns (one Vector) and two string columns, each a named input of the
    model (StringLookup, one-hot and Embedding inside it): trained by TFEstimator straight
    from the DataFrame (no dataset written in the model directory), served by TFModel from
    the same columns, raw strings included, and scored by Spark's evaluator."""
    from pyspark.sql import types as T

    from sparktf import cli, storage

    model_dir = tmp_path / "model"
    args = cli.parse(
        wide_and_deep_example.parser(),
        [
            "--demo-rows",
            "1600",
            "--epochs",
            "4",
            "--csv",
            str(tmp_path / "data.csv"),
            "--model-dir",
            str(model_dir),
            "--output",
            str(tmp_path / "predictions"),
        ],
    )
    summary = wide_and_deep_example.run(args, spark)["summary"]
    assert summary["numeric"] == ["tenure", "spend"] and summary["strings"] == ["city", "plan"]
    assert summary["vocabulary_sizes"] == {"city": 5, "plan": 3}
    assert 0 < summary["final_step"] <= 4 * (summary["train_rows"] // 32)
    assert summary["test_accuracy"] > 0.85, summary  # the numbers alone reach about 0.8
    scored = spark.read.parquet(storage.spark_uri(summary["predictions"]))
    assert isinstance(scored.schema["prediction"].dataType, T.DoubleType)
    assert scored.count() == summary["test_rows"] > 300
    written = [p.name for p in model_dir.rglob("*") if p.is_file()]
    assert not [n for n in written if n.endswith(".parquet") or n == "manifest.json"], written
    assert_nothing_left()


def _blobs(spark, rows: int, seed: int):
    """Two separable classes in 3-D: label 1 around (1.5, 1.5, 1.5), 0 around its opposite."""
    from pyspark.ml.linalg import Vectors

    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, size=rows)
    points = (2 * labels[:, None] - 1) * 1.5 + rng.normal(0.0, 1.0, size=(rows, 3))
    data = [(i, Vectors.dense(p.tolist()), int(y)) for i, (p, y) in enumerate(zip(points, labels))]
    return spark.createDataFrame(data, ["id", "features", "label"])


def test_spark_evaluators_read_a_fitted_models_columns_with_no_column_set(spark, tmp_path):
    """Spark's evaluators read the model's columns with no column set, as they read a
    LogisticRegressionModel's; the model's summary is saved with it. (CrossValidator over
    the estimator, a directory per fold and the final fit on all rows: in
    test_regression_example_tunes_a_learning_rate_and_reaches_the_noise.)"""
    from pyspark.ml.evaluation import (
        BinaryClassificationEvaluator,
        MulticlassClassificationEvaluator,
    )
    from pyspark.ml.linalg import VectorUDT

    from sparktf import models
    from sparktf.ml import TFEstimator, TFModel

    def build(input_shape, num_classes):
        import keras

        inputs = keras.Input(input_shape)
        return keras.Model(inputs, keras.layers.Dense(num_classes)(inputs))

    models.register("ml_binary", build, input_shape=(3,), num_classes=2, learning_rate=0.1)
    est = TFEstimator(
        model="ml_binary",
        modelDir=str(tmp_path / "cv"),
        threadsPerWorker=1,
        epochs=20,
        steps=12,
        batchSize=8,
        seed=3,
    )
    best = est.fit(_blobs(spark, 96, seed=1))
    evaluator = BinaryClassificationEvaluator()  # areaUnderROC of rawPrediction
    assert isinstance(best, TFModel)
    assert (best.summary.start_step, best.summary.final_step) == (0, 12)
    assert "/cv/export/" in best.getExportDir()

    test = _blobs(spark, 64, seed=2)
    scored = best.transform(test)
    assert isinstance(scored.schema["rawPrediction"].dataType, VectorUDT)
    assert evaluator.evaluate(scored) > 0.9
    assert BinaryClassificationEvaluator(metricName="areaUnderPR").evaluate(scored) > 0.9
    assert MulticlassClassificationEvaluator().evaluate(scored) > 0.8  # f1 of prediction
    log_loss = MulticlassClassificationEvaluator(metricName="logLoss").evaluate(scored)
    assert math.isfinite(log_loss) and log_loss < math.log(2)  # of probability: < chance
    rows = scored.collect()
    raw = np.array([r["rawPrediction"].toArray() for r in rows])
    probability = np.array([r["probability"].toArray() for r in rows])
    np.testing.assert_allclose(np.exp(raw), probability, rtol=1e-5, atol=1e-6)
    assert evaluator.setRawPredictionCol("probability").evaluate(scored) == pytest.approx(
        evaluator.setRawPredictionCol("rawPrediction").evaluate(scored)
    )  # log-probabilities order the rows as the probabilities do

    saved = (tmp_path / "saved").as_uri()  # a local path without a scheme is on fs.defaultFS
    best.write().save(saved)
    again = TFModel.load(saved)
    assert again.getExportDir() == str(tmp_path / "saved" / "savedmodel")
    assert again.summary == best.summary
    (part,) = (tmp_path / "saved" / "metadata").glob("part-*")
    metadata = json.loads(part.read_text())
    assert metadata["summary"]["final_step"] == 12  # JSON in Spark ML's metadata
    assert_nothing_left()


@pytest.mark.e2e
def test_job_trains_a_module_build_function_on_a_converted_dataset(
    spark, mnist_data, tmp_path, monkeypatch
):
    """``--model MODULE:FUNCTION`` with the module on PYTHONPATH: jobs/train.py as its own
    application, so that the module path reaches its executors (the process boundary is the
    point here)."""
    from sparktf import predict

    (tmp_path / "mods").mkdir()
    (tmp_path / "mods" / "byo_job_models.py").write_text(BUILD_MODULE)
    paths = [str(tmp_path / "mods"), os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    result_file = tmp_path / "result.json"
    job = helpers.run_job(
        "train.py",
        "--model",
        "byo_job_models:build",
        "--model-config",
        '{"hidden_units": 8}',
        "--data",
        str(mnist_data / "data"),
        "--model-dir",
        str(tmp_path / "model"),
        "--strategy",
        "allreduce",
        "--num-workers",
        "2",
        "--threads-per-worker",
        "1",
        "--steps",
        "4",
        "--batch-size",
        "8",
        "--result-json",
        str(result_file),
        timeout=600,
    )
    assert job.returncode == 0, job.stderr[-3000:]
    result = json.loads(result_file.read_text())
    assert result["final_step"] == 4
    assert "accuracy" in result["eval_metrics"]  # evaluated on the test split
    train_json = json.loads((tmp_path / "model" / "sparktf_train.json").read_text())
    config = train_json["model_config"]
    assert config["input_shape"] == [28, 28, 1] and config["num_classes"] == 10
    assert config["input_dtype"] == "uint8" and config["hidden_units"] == 8
    images = spark.read.parquet(f"file://{mnist_data / 'data' / 'test' / 'parquet'}")
    rows = predict(images, result["export_dir"]).select("id", "prediction").collect()
    assert len(rows) == 10 and all(0 <= r["prediction"] < 10 for r in rows)
    assert_nothing_left()
