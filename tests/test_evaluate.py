"""Tests for the evaluation job (jobs/evaluate.py, sparktf.jobs.evaluate) and sparktf.metrics.

Real datasets (synthetic raw files converted by the Spark conversion), real exports of
tiny models (an MNIST MLP with 16 hidden units trained for a few steps, so that it is right
about half the time; a PTB LSTM with 12 units), real Spark and HDFS. Every metric is checked
against numbers computed here, independently, from the SavedModel called directly on the
same records with numpy.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest

from sparktf import cli, inference, metrics, storage
from sparktf.datasets.synthetic import write_mnist, write_ptb
from sparktf.jobs import evaluate as job
from tests import helpers
from tests.helpers import call, export, remove_local_copy

pytestmark = pytest.mark.integration  # tests of another tier carry their own mark

REPO = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
N_TEST = 60
PTB_SEQ_LEN = 6


# ----------------------------------------------------------------------------- helpers


def expected_classifier_metrics(scores: np.ndarray, labels: np.ndarray) -> dict:
    """The metrics, computed the plain way from the model's scores and the true labels."""
    n, num_classes = scores.shape
    predicted = scores.argmax(axis=1)
    confusion = [[0] * num_classes for _ in range(num_classes)]
    for t, p in zip(labels, predicted):
        confusion[int(t)][int(p)] += 1
    # A label is in the top 5 when fewer than 5 classes score higher than it.
    higher = (scores > scores[np.arange(n), labels][:, None]).sum(axis=1)
    per_class, present = [], []
    for c in range(num_classes):
        tp = sum(1 for t, p in zip(labels, predicted) if t == c and p == c)
        support = sum(1 for t in labels if t == c)
        guessed = sum(1 for p in predicted if p == c)
        precision = tp / guessed if guessed else 0.0
        recall = tp / support if support else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        per_class.append(
            {
                "class": c,
                "precision": precision,
                "recall": recall,
                "f1": f1,
                "support": support,
                "predicted": guessed,
            }
        )
        if support or guessed:
            present.append(c)
    return {
        "examples": n,
        "accuracy": float(np.mean(predicted == labels)),
        "top_5_accuracy": float(np.mean(higher < 5)),
        "macro_precision": float(np.mean([per_class[c]["precision"] for c in present])),
        "macro_recall": float(np.mean([per_class[c]["recall"] for c in present])),
        "macro_f1": float(np.mean([per_class[c]["f1"] for c in present])),
        "per_class": per_class,
        "confusion_matrix": confusion,
    }


def assert_classifier_metrics(got: dict, want: dict) -> None:
    assert got["kind"] == "classifier"
    assert got["examples"] == want["examples"]
    assert got["confusion_matrix"] == want["confusion_matrix"]
    for key in ("accuracy", "top_5_accuracy", "macro_precision", "macro_recall", "macro_f1"):
        assert got[key] == pytest.approx(want[key], abs=1e-12), key
    assert len(got["per_class"]) == len(want["per_class"])
    for g, w in zip(got["per_class"], want["per_class"]):
        assert g == pytest.approx(w, abs=1e-12)


def assert_png(data: bytes) -> tuple[int, int]:
    """``data`` is a PNG that decodes; returns its (height, width)."""
    import io

    from matplotlib import image

    assert data[:8] == PNG_MAGIC
    pixels = image.imread(io.BytesIO(data), format="png")
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
    return pixels.shape[:2]


# ----------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def mnist_eval(spark, tmp_path_factory) -> dict:
    """A converted MNIST-format dataset (2 shards), an MLP trained a little on its train
    split and exported, and the model's own scores on the test records."""
    from sparktf.datasets.conversion import convert

    base = tmp_path_factory.mktemp("eval-mnist")
    raw = write_mnist(base / "raw", n_train=40, n_test=N_TEST, gzip=False, seed=4, learnable=True)
    convert("mnist", str(base / "raw"), str(base / "data"), shards=2, spark=spark)
    train = (raw["train"]["images"], raw["train"]["labels"])
    model = export("mnist_mlp", base / "model" / "export" / "7", 3, train, hidden_units=16)
    images, labels = raw["test"]["images"], raw["test"]["labels"]
    scores = call(model, "predict_images", images=images)["scores"]
    want = expected_classifier_metrics(scores, labels)
    # The model must be neither always right nor always wrong, and leave classes out.
    assert 0.1 < want["accuracy"] < 0.9 and want["top_5_accuracy"] > want["accuracy"]
    return {
        "data": str(base / "data"),
        "model_dir": str(base / "model"),
        "export": model,
        "want": want,
        "base": base,
    }


@pytest.fixture(scope="module")
def ptb(spark, tmp_path_factory) -> dict:
    """A converted PTB-format dataset of 6-token records and an exported tiny LSTM."""
    from sparktf.datasets import formats
    from sparktf.datasets.conversion import convert

    base = tmp_path_factory.mktemp("eval-ptb")
    raw = write_ptb(
        base / "raw", lines=(30, 6, 6), vocab_size=30, seed=6, seq_len=PTB_SEQ_LEN, learnable=True
    )
    convert(
        "ptb", str(base / "raw"), str(base / "data"), shards=2, seq_len=PTB_SEQ_LEN, spark=spark
    )
    vocab = formats.load_manifest(str(base / "data"))["text"]["vocab_size"]
    model = export(
        "ptb_small",
        base / "model" / "1",
        5,
        vocab_size=vocab,
        hidden_size=12,
        num_steps=PTB_SEQ_LEN - 1,
        batch_size=4,
    )
    return {"data": str(base / "data"), "model": model, "chunks": raw["chunks"], "base": base}


def expected_perplexity(model: str, chunks: np.ndarray) -> tuple[float, np.ndarray]:
    """exp(mean token NLL) over all predicted tokens, and each record's own perplexity,
    from the export's log_probs (each record from a zero state, tokens[1:] given
    tokens[:-1])."""
    log_probs = call(model, "serving_default", tokens=chunks[:, :-1])["log_probs"]
    rows = np.arange(len(chunks))[:, None]
    steps = np.arange(chunks.shape[1] - 1)[None, :]
    nll = -log_probs[rows, steps, chunks[:, 1:]].astype(np.float64)  # [records, steps]
    return float(np.exp(nll.mean())), np.exp(nll.mean(axis=1))


# ----------------------------------------------------------------------------- no Spark


@pytest.mark.unit
def test_metrics_of_a_hand_computed_confusion_matrix():
    labels = [0, 0, 0, 1, 1, 2, 3]
    predictions = [0, 0, 1, 1, 0, 1, 3]
    confusion = metrics.confusion_matrix(labels, predictions, 5)
    assert confusion.tolist() == [
        [2, 1, 0, 0, 0],
        [1, 1, 0, 0, 0],
        [0, 1, 0, 0, 0],
        [0, 0, 0, 1, 0],
        [0, 0, 0, 0, 0],
    ]
    got = metrics.classification_metrics(confusion, top_k_correct=6)
    assert got["examples"] == 7 and got["accuracy"] == pytest.approx(4 / 7)
    assert got["top_5_accuracy"] == pytest.approx(6 / 7)
    by_class = {c["class"]: c for c in got["per_class"]}
    assert by_class[0]["precision"] == pytest.approx(2 / 3)
    assert by_class[0]["recall"] == pytest.approx(2 / 3)
    assert by_class[1]["precision"] == pytest.approx(1 / 3)
    assert by_class[1]["recall"] == pytest.approx(1 / 2)
    assert by_class[1]["f1"] == pytest.approx(2 * (1 / 3) * (1 / 2) / (1 / 3 + 1 / 2))
    # Class 2 is never predicted (precision 0 by convention), class 4 never occurs at all.
    assert by_class[2] == {
        "class": 2,
        "precision": 0.0,
        "recall": 0.0,
        "f1": 0.0,
        "support": 1,
        "predicted": 0,
    }
    # Macro averages over classes 0-3 (present), not class 4.
    assert got["macro_recall"] == pytest.approx((2 / 3 + 1 / 2 + 0 + 1) / 4)
    assert got["macro_precision"] == pytest.approx((2 / 3 + 1 / 3 + 0 + 1) / 4)
    counted = metrics.confusion_matrix([0, 1, 2], [1, 1, 0], 3, counts=[5, 2, 3])
    assert counted.tolist() == [[0, 5, 0], [0, 2, 0], [3, 0, 0]]
    with pytest.raises(ValueError, match="label 7 is outside"):
        metrics.confusion_matrix([7], [0], 5)
    with pytest.raises(ValueError, match="no examples"):
        metrics.classification_metrics(np.zeros((3, 3), np.int64))


@pytest.mark.unit
def test_corpus_perplexity_weighs_tokens_not_sequences():
    # Two sequences: 10 tokens at NLL 1 each, 2 tokens at NLL 4 each.
    total_nll, tokens = 10 * 1.0 + 2 * 4.0, 12
    assert metrics.corpus_perplexity(total_nll, tokens) == pytest.approx(np.exp(18 / 12))
    mean_of_sequences = (np.exp(1.0) + np.exp(4.0)) / 2
    assert metrics.corpus_perplexity(total_nll, tokens) < mean_of_sequences / 5
    assert metrics.corpus_perplexity(1e6, 1) == float("inf")
    with pytest.raises(ValueError, match="no predicted tokens"):
        metrics.corpus_perplexity(0.0, 0)


@pytest.mark.unit
def test_confusion_matrix_png_is_a_png():
    confusion = metrics.confusion_matrix([0, 1, 2, 2], [0, 2, 2, 1], 3)
    assert_png(metrics.confusion_matrix_png(confusion))
    big = np.random.default_rng(0).integers(0, 5, (100, 100))  # no per-cell numbers
    assert_png(metrics.confusion_matrix_png(big))


@pytest.mark.unit
def test_png_path_is_beside_the_json():
    assert job.confusion_png_path("out/metrics.json") == "out/metrics.confusion.png"
    assert job.confusion_png_path("hdfs://nn:8020/e/m.JSON") == "hdfs://nn:8020/e/m.confusion.png"
    assert job.confusion_png_path("/x/report") == "/x/report.confusion.png"


@pytest.mark.e2e
def test_job_help():
    out = helpers.run_job("evaluate.py", "--help", timeout=60)
    assert out.returncode == 0
    for flag in ("--export", "--data", "--split", "--output", "--batch-size", "--overwrite"):
        assert flag in out.stdout


# ----------------------------------------------------------------------------- classifier


def test_classifier_metrics_equal_the_savedmodel(spark, mnist_eval):
    result = job.evaluate(
        spark, mnist_eval["model_dir"], mnist_eval["data"], split="test", batch_size=7
    )
    assert_classifier_metrics(result, mnist_eval["want"])
    assert result["model"] == mnist_eval["export"] and result["model_version"] == 7
    assert result["dataset"] == "mnist" and result["split"] == "test"


def test_report_is_published_with_its_png_and_not_overwritten(spark, mnist_eval, tmp_path):
    result = job.evaluate(spark, mnist_eval["export"], mnist_eval["data"], batch_size=64)
    output = str(tmp_path / "reports" / "mlp.json")
    written = job.write_report(result, output)
    png = str(tmp_path / "reports" / "mlp.confusion.png")
    assert written == [png, output]
    assert sorted(os.listdir(tmp_path / "reports")) == ["mlp.confusion.png", "mlp.json"]
    report = json.loads(Path(output).read_text())
    assert_classifier_metrics(report, mnist_eval["want"])
    assert report["confusion_png"] == png
    assert_png(Path(png).read_bytes())
    with pytest.raises(storage.PathExistsError):
        job.write_report(result, output)
    assert json.loads(Path(output).read_text()) == report


def test_job_reads_and_writes_hdfs(spark, hdfs, mnist_eval, capsys, caplog):
    """jobs/evaluate.py's logic on the session (its process boundary, exit codes and console,
    is what tests/test_readme.py runs as written)."""
    caplog.set_level("INFO", logger="sparktf")
    base = hdfs.fresh("evaluate")
    data = storage.join(base, "datasets", "mnist")
    storage.copy_tree(mnist_eval["data"], data)
    storage.copy_tree(mnist_eval["model_dir"], storage.join(base, "model"))
    output = storage.join(base, "eval", "metrics.json")
    fingerprint = inference.inspect_export(mnist_eval["export"]).fingerprint
    try:
        argv = ["--export", storage.join(base, "model"), "--data", data, "--output", output]
        assert job.main([*argv, "--batch-size", "16"], spark=spark) == 0
        stdout = capsys.readouterr().out
        report = json.loads(storage.read_text(output))
        assert_classifier_metrics(report, mnist_eval["want"])
        assert report["data"] == data and report["model_version"] == 7
        png = storage.join(base, "eval", "metrics.confusion.png")
        assert report["confusion_png"] == png
        assert_png(storage.read_bytes(png))
        assert sorted(os.path.basename(p) for p in storage.listdir(storage.join(base, "eval"))) == [
            "metrics.confusion.png",
            "metrics.json",
        ]
        accuracy = mnist_eval["want"]["accuracy"]
        assert f"accuracy {accuracy:.4f}" in stdout, stdout
        assert "evaluated 60 records" in caplog.text

        with pytest.raises(cli.UsageError, match="already exists"):
            job.main(
                ["--export", mnist_eval["export"], "--data", data, "--output", output], spark=spark
            )
    finally:
        remove_local_copy(fingerprint)
        storage.delete(base)


def test_a_corrupt_parquet_part_fails_with_a_one_line_reason(spark, mnist_eval, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(mnist_eval["data"], data)
    part = sorted((data / "test" / "parquet").glob("part-*.parquet"))[0]
    part.write_bytes(b"not parquet at all" * 100)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=r"^evaluating .* failed: ") as raised:
        job.evaluate(spark, mnist_eval["export"], str(data))
    print(f"failed in {time.monotonic() - started:.1f} s: {raised.value}")
    assert "\n" not in str(raised.value) and part.name in str(raised.value)


def test_a_bad_record_is_a_usage_error_naming_it(spark, mnist_eval, tmp_path):
    import io

    data = tmp_path / "data"
    shutil.copytree(mnist_eval["data"], data)
    table = data / "test" / "parquet"
    shutil.rmtree(table)

    def npy(array: np.ndarray) -> bytes:
        buffer = io.BytesIO()
        np.save(buffer, array)
        return buffer.getvalue()

    rows = [
        (i, i % 10, npy(np.zeros((27, 27, 1) if i == 5 else (28, 28, 1), np.uint8)))
        for i in range(8)
    ]
    spark.createDataFrame(rows, "id long, label long, image binary").coalesce(1).write.parquet(
        f"file://{table}"
    )
    with pytest.raises(cli.UsageError, match=r"the row with id=5 has shape \(27, 27, 1\)"):
        job.evaluate(spark, mnist_eval["export"], str(data))


# ----------------------------------------------------------------------------- language model


def test_language_model_corpus_perplexity_is_token_weighted(spark, ptb):
    chunks = ptb["chunks"]["test"]
    want, per_record = expected_perplexity(ptb["model"], chunks)
    result = job.evaluate(spark, ptb["model"], ptb["data"], split="test", batch_size=3)
    assert result["kind"] == "language_model"
    assert result["sequences"] == len(chunks)
    assert result["tokens"] == len(chunks) * (PTB_SEQ_LEN - 1)
    assert result["perplexity"] == pytest.approx(want, rel=1e-6)
    assert result["cross_entropy"] == pytest.approx(np.log(want), rel=1e-6)
    # Not the mean of the per-record perplexities (always larger unless all are equal).
    assert per_record.mean() > want * (1 + 1e-4)
    valid = job.evaluate(spark, ptb["model"], ptb["data"], split="valid")
    want_valid, _ = expected_perplexity(ptb["model"], ptb["chunks"]["valid"])
    assert valid["perplexity"] == pytest.approx(want_valid, rel=1e-6)


def test_job_language_model_writes_local_json(spark, ptb, tmp_path, capsys):
    output = tmp_path / "ptb" / "valid.json"
    argv = ["--export", ptb["model"], "--data", ptb["data"], "--split", "valid"]
    assert job.main([*argv, "--output", str(output)], spark=spark) == 0
    stdout = capsys.readouterr().out
    report = json.loads(output.read_text())
    want, _ = expected_perplexity(ptb["model"], ptb["chunks"]["valid"])
    assert report["perplexity"] == pytest.approx(want, rel=1e-6)
    assert report["split"] == "valid" and report["dataset"] == "ptb"
    assert os.listdir(output.parent) == ["valid.json"]  # no PNG for a language model
    assert f"perplexity {want:.3f}" in stdout, stdout


# ----------------------------------------------------------------------------- bad input


@pytest.mark.e2e
def test_bad_input_exits_2_before_spark_starts(mnist_eval, tmp_path):
    """The job as a user runs it: a refusal exits 2, names the problem and starts no Spark.
    (``--model``, the former name of ``--export``, still works, with a warning.)"""
    output = tmp_path / "out" / "metrics.json"
    argv = ["--model", mnist_eval["export"], "--data", mnist_eval["data"], "--split", "valid"]
    out = helpers.run_job("evaluate.py", *argv, "--output", str(output), timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert "has no split 'valid'" in out.stderr, out.stderr[-2000:]
    assert "--model is now --export" in out.stderr
    assert "sparktf-evaluate" not in out.stderr and "SparkContext" not in out.stderr
    assert not output.parent.exists()


def test_bad_input_is_refused_before_spark_starts(spark, mnist_eval, ptb, tmp_path):
    """Each refusal names the problem, writes nothing and comes before any Spark work."""
    wide = export("mnist_mlp", tmp_path / "wide" / "1", 1, hidden_units=8, image_shape=[32, 32, 3])
    few = export("mnist_mlp", tmp_path / "few" / "1", 1, hidden_units=8, num_classes=5)
    dcgan = export("dcgan", tmp_path / "dcgan" / "1", 7, gf_dim=4, df_dim=4, gfc_dim=16, dfc_dim=16)
    output = tmp_path / "out" / "metrics.json"
    cases = [
        ((mnist_eval["export"], mnist_eval["data"], "--split", "valid"), "has no split 'valid'"),
        ((wide, mnist_eval["data"]), "takes images of shape (32, 32, 3)"),
        ((few, mnist_eval["data"]), "predicts 5 classes but dataset"),
        ((dcgan, mnist_eval["data"]), "is a generator (DCGAN"),
        ((ptb["model"], mnist_eval["data"]), "is a language model but dataset"),
        ((mnist_eval["export"], ptb["data"]), "is an image classifier but dataset"),
        ((str(tmp_path / "nope"), mnist_eval["data"]), "does not exist"),
        ((mnist_eval["export"], str(tmp_path)), "no dataset manifest"),
    ]
    jobs_before = spark.sparkContext.statusTracker().getJobIdsForGroup()
    for (model, data, *extra), message in cases:
        argv = ["--export", model, "--data", data, *extra, "--output", str(output)]
        with pytest.raises(cli.UsageError) as refused:
            job.main(argv, spark=spark)
        assert message in str(refused.value)
        assert not output.parent.exists()
    # Nothing reached Spark: not one job on the session.
    assert spark.sparkContext.statusTracker().getJobIdsForGroup() == jobs_before
    with pytest.raises(cli.UsageError, match="is a generator"):
        job.evaluate(spark, dcgan, mnist_eval["data"])
