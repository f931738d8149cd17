"""Tests for batch inference (sparktf.inference, sparktf.predict) and jobs/predict.py.

Tiny models (an MNIST MLP with 16 hidden units, a PTB LSTM with a 40-word vocabulary, a
DCGAN with 4 filters) exported through the model registry; tens of rows. Every prediction
is compared with the SavedModel called directly in this process.
"""

from __future__ import annotations

import dataclasses
import io
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pyarrow as pa
import pytest

import sparktf
from sparktf import inference, storage
from sparktf.inference import ModelNotFoundError, PredictInputError, execute
from sparktf.inference.decode import decode
from sparktf.inference.prediction_plan import Plan, choose_signature, make_plan
from tests import helpers
from tests.helpers import call, export, remove_local_copy, worker_stats

pytestmark = pytest.mark.integration  # tests of another tier carry their own mark

REPO = Path(__file__).resolve().parents[1]
SHAPE = (28, 28, 1)
N = 40


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def npz(array: np.ndarray) -> bytes:
    """What petastorm's CompressedNdarrayCodec stores."""
    buffer = io.BytesIO()
    np.savez_compressed(buffer, arr=array)
    return buffer.getvalue()


def file_uri(path) -> str:
    return "file://" + os.path.abspath(path)


@pytest.fixture(scope="module")
def mlp(tmp_path_factory) -> dict:
    """MODEL_DIR with export/3 and export/12 (different weights); direct predictions of 12."""
    root = tmp_path_factory.mktemp("mlp")
    export("mnist_mlp", root / "export" / "3", seed=3, hidden_units=16)
    latest = export("mnist_mlp", root / "export" / "12", seed=12, hidden_units=16)
    images = np.random.default_rng(0).integers(0, 256, (N, *SHAPE), dtype=np.uint8)
    direct = call(latest, "predict_images", images=images)
    return {
        "model_dir": str(root),
        "export": str(root / "export"),
        "latest": latest,
        "images": images,
        "classes": direct["classes"],
        "scores": direct["scores"],
    }


def image_rows(images: np.ndarray) -> list[tuple]:
    return [(i, i % 10, npy(images[i])) for i in range(len(images))]


@pytest.fixture
def images_df(spark, mlp):
    """Rows like a converted split: id, label, image as np.save bytes; 4 partitions."""
    return spark.createDataFrame(
        image_rows(mlp["images"]), "id long, label long, image binary"
    ).repartition(4)


def by_id(rows) -> list:
    return sorted(rows, key=lambda r: r["id"])


def assert_matches(rows, mlp, prediction="prediction", probabilities="probability"):
    rows = by_id(rows)
    assert [r["id"] for r in rows] == list(range(N))
    np.testing.assert_array_equal([r[prediction] for r in rows], mlp["classes"])
    np.testing.assert_allclose(
        np.array([r[probabilities] for r in rows]), mlp["scores"], rtol=1e-5, atol=1e-6
    )


# ----------------------------------------------------------------------------- no Spark


@pytest.mark.unit
def test_sparktf_predict_is_the_function_and_import_is_light():
    code = (
        "import sys, sparktf; assert 'tensorflow' not in sys.modules; "
        "assert 'pyspark' not in sys.modules; "
        "from sparktf.inference import predict; assert sparktf.predict is predict"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


@pytest.mark.unit
def test_the_package_keeps_its_public_names():
    """sparktf.inference re-exports the names its submodules define."""
    from sparktf.inference import cache, saved_model
    from sparktf.inference import prediction_plan as plan

    assert inference.predict is sparktf.predict
    assert inference.ModelNotFoundError is saved_model.ModelNotFoundError
    assert inference.PredictInputError is plan.PredictInputError
    assert inference.ModelCache is cache.ModelCache
    assert not hasattr(inference, "OUTPUT_BATCH_BYTES"), "a setting lives in its own module"
    assert issubclass(inference.ModelNotFoundError, storage.PathNotFoundError)
    assert set(inference.__all__) >= {
        "LM_OUTPUTS",
        "NPZ_MAGIC",
        "ModelCache",
        "ModelCacheError",
        "ModelCacheMismatchError",
        "ExportInfo",
        "ModelNotFoundError",
        "PredictInputError",
        "Signature",
        "TensorSpec",
        "inspect_export",
        "model_cache_dir",
        "export_fingerprint",
        "predict",
        "resolve_export",
    }


@pytest.mark.unit
def test_resolve_export_picks_the_highest_version(mlp, tmp_path):
    for given in (mlp["model_dir"], mlp["export"], mlp["latest"]):
        assert inference.resolve_export(given) == mlp["latest"]
    info = inference.inspect_export(mlp["export"])
    assert info.version == 12 and info.uri == mlp["latest"]
    assert set(info.signatures) == {"serving_default", "predict_images"}
    assert info.signatures["predict_images"].inputs["images"].shape == (None, *SHAPE)
    older = inference.inspect_export(os.path.join(mlp["export"], "3"))
    assert info.fingerprint != older.fingerprint
    with pytest.raises(ModelNotFoundError, match="holds no SavedModel"):
        inference.resolve_export(str(tmp_path))


@pytest.mark.unit
def test_decoders_accept_npy_raw_and_arrays():
    images = np.random.default_rng(1).integers(0, 256, (5, *SHAPE), dtype=np.uint8)
    plan = Plan(
        kind="images",
        export_uri="m",
        fingerprint="f",
        signature="predict_images",
        input_col="image",
        input_key="images",
        shape=SHAPE,
        batch_size=8,
        outputs=("prediction",),
    )
    columns = {
        "npy": pa.array([npy(x) for x in images], pa.binary()),
        "npy_flat": pa.array([npy(x.reshape(-1)) for x in images], pa.binary()),
        "raw": pa.array([x.tobytes() for x in images], pa.binary()),
        "npz": pa.array([npz(x) for x in images], pa.binary()),
        "npy_large": pa.array([npy(x) for x in images], pa.large_binary()),
        "ints": pa.array(
            [x.reshape(-1).astype(int).tolist() for x in images], pa.list_(pa.int32())
        ),
        "nested": pa.array(images.astype(int).tolist(), pa.list_(pa.list_(pa.list_(pa.int64())))),
        "mixed": pa.array(
            [
                npy(images[0]),
                images[1].tobytes(),
                npy(images[2]),
                npy(images[3]),
                images[4].tobytes(),
            ],
            pa.binary(),
        ),
    }
    batch = pa.RecordBatch.from_pydict(columns)
    for name in columns:
        for chunk in (batch, batch.slice(2, 3)):  # sliced batches keep buffer offsets
            plan_col = dataclasses.replace(plan, input_col=name)
            got = decode(plan_col, chunk)["images"]
            expected = images[2:] if chunk is not batch else images
            assert got.dtype == np.uint8
            np.testing.assert_array_equal(got, expected, err_msg=name)


@pytest.mark.unit
def test_a_bad_row_among_npy_rows_is_named_by_its_id():
    plan = Plan(
        kind="images",
        export_uri="m",
        fingerprint="f",
        signature="predict_images",
        input_col="image",
        input_key="images",
        shape=SHAPE,
        batch_size=8,
        outputs=("prediction",),
        id_col="id",
    )
    good = npy(np.zeros(SHAPE, np.uint8))
    for bad, found in (
        (npy(np.zeros(SHAPE, np.float32)), "has dtype float32"),
        (npy(np.zeros((27, 27, 1), np.uint8)), "has shape (27, 27, 1)"),
        (good[:-1], "holds np.save bytes that cannot be read"),
    ):
        chunk = pa.RecordBatch.from_pydict(
            {
                "id": pa.array(np.arange(10, 16), pa.int64()),
                "image": pa.array([good, good, bad, good, good, good], pa.binary()),
            }
        )
        with pytest.raises(
            PredictInputError, match=r"column 'image': the row with id=12 " + re.escape(found)
        ):
            decode(plan, chunk)


@pytest.mark.unit
def test_input_error_is_found_in_a_spark_failure_text():
    from sparktf.jobs import predict as job

    text = (
        "Traceback...\n  File x\nsparktf.inference.PredictInputError: column 'image': "
        "the row with id=2 has shape (27, 27, 1); expected ...\n\tat org.apache..."
    )
    assert job.input_error(Exception(text)).startswith("column 'image': the row with id=2")
    assert job.input_error(Exception("other")) is None


# ----------------------------------------------------------------------------- classifier


def test_classifier_predictions_equal_the_savedmodel(spark, images_df, mlp):
    result = sparktf.predict(images_df, mlp["export"], batch_size=8, top_k=3)
    assert result.columns == [
        "id",
        "label",
        "image",
        "prediction",
        "probability",
        "rawPrediction",
        "top_classes",
        "top_probabilities",
    ]
    types = {f.name: f.dataType.simpleString() for f in result.schema.fields}
    assert types["prediction"] == "bigint" and types["probability"] == "array<float>"
    assert types["rawPrediction"] == "array<float>"
    rows = result.collect()
    assert_matches(rows, mlp)
    # Spark ML's raw prediction: the log of each probability (the logits less a constant)
    np.testing.assert_allclose(
        np.array([r["rawPrediction"] for r in by_id(rows)]),
        np.log(np.maximum(mlp["scores"], np.finfo(np.float32).tiny)),
        rtol=1e-5,
        atol=1e-5,
    )
    for r in rows:
        assert r["image"] == npy(mlp["images"][r["id"]])  # input columns pass through
        best = np.argsort(-mlp["scores"][r["id"]], kind="stable")[:3]
        assert r["top_classes"] == best.tolist()
        np.testing.assert_allclose(r["top_probabilities"], mlp["scores"][r["id"]][best], rtol=1e-5)


def test_keep_columns_sends_only_what_the_result_needs(spark, images_df, mlp):
    result = sparktf.predict(images_df, mlp["export"], batch_size=8, keep_columns=["id"])
    assert result.columns == ["id", "prediction", "probability", "rawPrediction"]
    assert_matches(result.collect(), mlp)
    # What goes into the Python stage: the image (read by the model) and id, not label.
    plan = result._jdf.queryExecution().executedPlan().toString().splitlines()
    at = next(i for i, line in enumerate(plan) if "MapInArrow" in line)
    child = plan[at + 1]
    assert "image" in child and "id" in child and "label" not in child, plan
    # A kept column may come before the input; label kept, id still names bad rows.
    result = sparktf.predict(images_df, mlp["export"], keep_columns=["label", "image"])
    assert result.columns == ["label", "image", "prediction", "probability", "rawPrediction"]
    rows = result.collect()
    assert sorted(r["label"] for r in rows) == sorted(i % 10 for i in range(N))
    with pytest.raises(PredictInputError, match=r"keep_columns \['nope'\]"):
        sparktf.predict(images_df, mlp["export"], keep_columns=["id", "nope"])


@pytest.mark.unit
def test_outputs_go_back_as_one_batch_per_input_batch_cut_by_size(mlp, monkeypatch):
    """In this process, with the real model: a 40-row Arrow batch run 8 rows at a time comes
    back as one batch; with a tiny size limit it is cut after every model call."""
    info = inference.inspect_export(mlp["latest"])
    from pyspark.sql import types as T

    schema = T.StructType(
        [
            T.StructField("id", T.LongType()),
            T.StructField("label", T.LongType()),
            T.StructField("image", T.BinaryType()),
        ]
    )
    sig = choose_signature(info, None)
    plan, _ = make_plan(
        schema,
        info,
        sig,
        input_col=None,
        output_col="prediction",
        probability_col="probability",
        raw_prediction_col="rawPrediction",
        log_probabilities_col="log_probabilities",
        batch_size=8,
        top_k=None,
        lm_output="perplexity",
        label_col="label",
    )
    plan = dataclasses.replace(plan, keep=("id",))
    rows = image_rows(mlp["images"])
    batch = pa.RecordBatch.from_pydict(
        {
            "id": pa.array([r[0] for r in rows], pa.int64()),
            "label": pa.array([r[1] for r in rows], pa.int64()),
            "image": pa.array([r[2] for r in rows], pa.binary()),
        }
    )
    for limit, sizes in ((execute.OUTPUT_BATCH_BYTES, [N]), (1, [8] * (N // 8))):
        monkeypatch.setattr(execute, "OUTPUT_BATCH_BYTES", limit)
        out = list(execute.predict_partition(plan, iter([batch])))
        assert [b.num_rows for b in out] == sizes
        assert out[0].schema.names == ["id", "prediction", "probability", "rawPrediction"]
        table = pa.Table.from_batches(out)
        assert table["id"].to_pylist() == list(range(N))
        np.testing.assert_array_equal(table["prediction"].to_numpy(), mlp["classes"])
        probability = np.array(table["probability"].to_pylist())
        np.testing.assert_allclose(probability, mlp["scores"], rtol=1e-5, atol=1e-6)
        raw = np.array(table["rawPrediction"].to_pylist())
        np.testing.assert_allclose(np.exp(raw), probability, rtol=1e-5, atol=1e-6)


@pytest.mark.unit
def test_a_raw_prediction_is_the_log_probability_and_finite_for_a_zero():
    from sparktf.inference import execute

    scores = np.array([[0.25, 0.75], [0.0, 1.0]], np.float32)
    raw = execute.raw_prediction(scores)
    assert raw.dtype == np.float32 and np.isfinite(raw).all()
    np.testing.assert_allclose(raw[0], np.log([0.25, 0.75]), rtol=1e-6)
    assert raw[1, 1] == 0.0 and raw[1, 0] == pytest.approx(-87.3365, abs=1e-3)


def test_model_is_loaded_once_per_worker_and_reused_across_partitions(spark, mlp):
    fingerprint = inference.inspect_export(mlp["export"]).fingerprint
    df = spark.createDataFrame(image_rows(mlp["images"]), "id long, label long, image binary")
    rows = sparktf.predict(df.repartition(8), mlp["model_dir"], batch_size=4).collect()
    assert_matches(rows, mlp)
    stats = worker_stats(spark, fingerprint)
    assert stats, "no worker reported"
    assert all(s["loads"] <= 1 for s in stats.values()), stats
    assert max(s["uses"] for s in stats.values()) >= 2, stats  # several partitions, one load


def test_raw_bytes_and_integer_array_columns(spark, mlp):
    images = mlp["images"]
    df = spark.createDataFrame(
        [(i, images[i].tobytes(), images[i].reshape(-1).astype(int).tolist()) for i in range(N)],
        "id long, raw binary, pixels array<int>",
    ).repartition(3)
    first = sparktf.predict(df, mlp["latest"], input_col="raw", batch_size=16)
    both = sparktf.predict(
        first,
        mlp["latest"],
        input_col="pixels",
        output_col="p2",
        probability_col="probs2",
        raw_prediction_col="raw2",  # the first call added rawPrediction
        batch_size=5,
    )
    rows = both.collect()
    assert_matches(rows, mlp)
    assert_matches(rows, mlp, prediction="p2", probabilities="probs2")
    np.testing.assert_allclose(
        [r["raw2"] for r in rows], [r["rawPrediction"] for r in rows], rtol=1e-5, atol=1e-5
    )


def test_serving_default_signature_takes_serialized_examples(spark, mlp):
    import tensorflow as tf

    def example(image: np.ndarray) -> bytes:
        feature = {
            "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()]))
        }
        return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()

    df = spark.createDataFrame(
        [(i, example(mlp["images"][i])) for i in range(N)], "id long, example binary"
    )
    rows = sparktf.predict(df, mlp["latest"], signature="serving_default").collect()
    assert_matches(rows, mlp)


def test_empty_dataframe_gives_an_empty_result(spark, mlp):
    empty = spark.createDataFrame([], "id long, label long, image binary")
    result = sparktf.predict(empty, mlp["latest"])
    assert result.collect() == []
    assert result.columns[-3:] == ["prediction", "probability", "rawPrediction"]
    without_raw = sparktf.predict(empty, mlp["latest"], raw_prediction_col="")
    assert without_raw.columns[-2:] == ["prediction", "probability"]


# ----------------------------------------------------------------------------- HDFS


def test_model_and_table_on_hdfs(spark, hdfs, mlp):
    # Version 3 has run in no worker yet, so the workers must copy it from HDFS.
    version3 = os.path.join(mlp["export"], "3")
    base = hdfs.fresh("predict")
    model = storage.join(base, "model", "export", "3")
    storage.copy_tree(version3, model)
    table = storage.join(base, "test", "parquet")
    spark.createDataFrame(
        image_rows(mlp["images"]), "id long, label long, image binary"
    ).repartition(2).write.parquet(table)
    info = inference.inspect_export(storage.join(base, "model"))
    assert info.uri == model and info.version == 3
    copy = os.path.join(inference.model_cache_dir(), info.fingerprint[:32])
    direct = call(version3, "predict_images", images=mlp["images"])
    try:
        rows = sparktf.predict(
            spark.read.parquet(table), storage.join(base, "model"), batch_size=16
        ).collect()
        assert_matches(rows, {**mlp, **direct})
        stats = worker_stats(spark, info.fingerprint)
        assert sum(s["copies"] for s in stats.values()) == 1, stats  # both executors share it
        assert all(s["loads"] <= 1 for s in stats.values()), stats
        assert os.path.isfile(os.path.join(copy, "saved_model.pb"))
    finally:
        remove_local_copy(info.fingerprint)
        storage.delete(base)


# ----------------------------------------------------------------------------- bad input


def no_jobs_started(spark, action) -> Exception:
    """Runs ``action``; returns what it raised after checking no Spark job ran."""
    group = f"predict-test-{uuid.uuid4().hex[:8]}"
    sc = spark.sparkContext
    sc.setJobGroup(group, "must start no job")
    try:
        with pytest.raises(Exception) as raised:
            action()
    finally:
        sc.setLocalProperty("spark.jobGroup.id", None)
    assert sc.statusTracker().getJobIdsForGroup(group) == []
    return raised.value


def test_missing_model_is_named_before_any_job(spark, images_df, tmp_path):
    missing = str(tmp_path / "no" / "model")
    error = no_jobs_started(spark, lambda: sparktf.predict(images_df, missing))
    assert isinstance(error, ModelNotFoundError) and missing in str(error)


@pytest.mark.parametrize(
    "schema, kwargs, message",
    [
        ("id long, picture binary", {}, r"input column 'image' is missing.*\(28, 28, 1\)"),
        ("id long, image string", {}, r"column 'image' has Spark type string.*\(28, 28, 1\)"),
        ("id long, image array<double>", {}, r"column 'image' has Spark type array<double>"),
        ("id long, image binary, prediction long", {}, r"output column\(s\) \['prediction'\]"),
    ],
    ids=["missing", "string", "array-of-double", "output-exists"],
)
def test_schema_errors_are_raised_on_the_driver(spark, mlp, schema, kwargs, message):
    df = spark.createDataFrame([], schema)
    error = no_jobs_started(spark, lambda: sparktf.predict(df, mlp["latest"], **kwargs))
    assert isinstance(error, PredictInputError)
    assert re.search(message, str(error)), str(error)


GOOD = np.zeros(SHAPE, np.uint8)


@pytest.mark.parametrize(
    "value, column_type, found",
    [
        (npy(np.zeros((27, 27, 1), np.uint8)), "binary", "has shape (27, 27, 1)"),
        (npy(np.zeros(SHAPE, np.float32)), "binary", "has dtype float32"),
        (None, "binary", "is null"),
        (b"\x01" * 100, "binary", "holds 100 raw bytes"),
        ([1] * 700, "array<int>", "has shape (700,)"),
        ([300] * 784, "array<int>", "outside [0, 256)"),
    ],
    ids=["npy-shape", "npy-dtype", "null", "raw-size", "array-size", "array-range"],
)
def test_bad_rows_fail_at_the_first_batch_with_a_clear_message(
    spark, mlp, value, column_type, found
):
    good = npy(GOOD) if column_type == "binary" else [0] * 784
    rows = [(i, value if i == 5 else good) for i in range(8)]
    df = spark.createDataFrame(rows, f"id long, image {column_type}").coalesce(1)
    with pytest.raises(Exception) as raised:
        sparktf.predict(df, mlp["latest"], batch_size=64).collect()
    text = str(raised.value)
    assert "PredictInputError: column 'image'" in text, text
    assert "the row with id=5" in text and found in text, text
    assert "shape (28, 28, 1)" in text, text


# ----------------------------------------------------------------------------- PTB, DCGAN


def test_language_model_perplexity_and_next_word(spark, tmp_path):
    model = export(
        "ptb_small",
        tmp_path / "ptb" / "1",
        seed=5,
        vocab_size=40,
        hidden_size=12,
        num_steps=5,
        batch_size=4,
    )
    rng = np.random.default_rng(2)
    seqs = [rng.integers(0, 40, 6 if i % 3 else 4) for i in range(12)]  # two lengths
    df = spark.createDataFrame(
        [(i, npy(s), s.tolist()) for i, s in enumerate(seqs)],
        "id long, tokens binary, token_list array<long>",
    ).repartition(2)
    perplexity = by_id(sparktf.predict(df, model, batch_size=5).collect())
    next_word = by_id(
        sparktf.predict(
            df, model, input_col="token_list", lm_output="next_word", output_col="next"
        ).collect()
    )
    for i, seq in enumerate(seqs):
        log_probs = call(model, "serving_default", tokens=seq[None, :-1])["log_probs"][0]
        expected = np.exp(-np.mean(log_probs[np.arange(len(seq) - 1), seq[1:]]))
        assert perplexity[i]["prediction"] == pytest.approx(expected, rel=1e-5)
        last = call(model, "serving_default", tokens=seq[None, :])["log_probs"][0, -1]
        assert next_word[i]["next"] == int(np.argmax(last))
        np.testing.assert_allclose(next_word[i]["log_probabilities"], last, rtol=1e-5, atol=1e-5)
    bad = spark.createDataFrame([(0, [1, 2, 99])], "id long, tokens array<long>")
    with pytest.raises(
        Exception,
        match=r"column 'tokens': the row with id=0 has values "
        r"outside \[0, 40\)",
    ):
        sparktf.predict(bad, model).collect()


def test_dcgan_generates_images_from_seeds_and_z(spark, tmp_path):
    model = export(
        "dcgan", tmp_path / "dcgan" / "1", seed=7, gf_dim=4, df_dim=4, gfc_dim=16, dfc_dim=16
    )
    seeds = list(range(100, 110))
    z = np.stack([np.random.default_rng(s).uniform(-1, 1, 100) for s in seeds]).astype(np.float32)
    labels = np.arange(10) % 10
    direct = call(model, "serving_default", z=z, label=labels.astype(np.int64))["images"]
    df = spark.createDataFrame(
        [(i, s, z[i].tolist(), int(labels[i])) for i, s in enumerate(seeds)],
        "id long, seed long, z array<float>, label long",
    ).repartition(2)
    rows = by_id(
        sparktf.predict(df, model, input_col="seed", output_col="from_seed", batch_size=4).collect()
    )
    rows_z = by_id(sparktf.predict(df, model, output_col="from_z").collect())
    for i in range(len(seeds)):
        for got in (rows[i]["from_seed"], rows_z[i]["from_z"]):
            image = np.load(io.BytesIO(got))
            assert image.dtype == np.uint8 and image.shape == SHAPE
            assert np.abs(image.astype(int) - direct[i]).max() <= 1  # float rounding only
    no_label = df.drop("label")
    with pytest.raises(PredictInputError, match="label column 'label' is missing"):
        sparktf.predict(no_label, model)


# ----------------------------------------------------------------------------- the job


@pytest.mark.e2e
def test_job_help():
    out = helpers.run_job("predict.py", "--help")
    assert out.returncode == 0
    for flag in ("--export", "--input", "--output", "--batch-size", "--overwrite"):
        assert flag in out.stdout


def test_job_writes_predictions_to_hdfs(spark, hdfs, mlp, tmp_path):
    """jobs/predict.py's logic on the session (its process boundary, exit codes and console,
    is what tests/test_readme.py runs as written)."""
    from sparktf import cli
    from sparktf.jobs import predict as job

    base = hdfs.fresh("predict-job")
    storage.copy_tree(mlp["latest"], storage.join(base, "model", "export", "12"))
    split = tmp_path / "dataset" / "test"
    spark.createDataFrame(
        image_rows(mlp["images"]), "id long, label long, image binary"
    ).repartition(3).write.parquet(file_uri(split / "parquet"))
    output = storage.join(base, "predictions")
    model = storage.join(base, "model")
    try:
        missing = str(tmp_path / "nope")
        with pytest.raises(cli.UsageError, match=re.escape(missing)):
            job.main(["--model", missing, "--input", str(split), "--output", output], spark=spark)
        assert not storage.exists(output)

        argv = ["--model", model, "--input", str(split), "--output", output]
        assert job.main([*argv, "--batch-size", "16"], spark=spark) == 0
        result = spark.read.parquet(output)
        assert result.columns == [
            "id",
            "label",
            "prediction",
            "probability",
            "rawPrediction",
            "model_version",
        ]
        rows = result.collect()
        assert_matches(rows, mlp)
        assert {r["model_version"] for r in rows} == {12}
        assert {r["label"] for r in rows} == set(range(10))
        assert [os.path.basename(p) for p in storage.listdir(base)] == ["model", "predictions"]

        with pytest.raises(cli.UsageError, match="already exists"):
            job.main(argv, spark=spark)
        assert spark.read.parquet(output).count() == len(rows)  # the session lives on
    finally:
        remove_local_copy(inference.inspect_export(mlp["latest"]).fingerprint)
        storage.delete(base)
