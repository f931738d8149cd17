"""MLflow experiment tracking (sparktf.train.driver.tracking, ``--mlflow-tracking-uri``).

One real training run on the session's local-cluster (all-reduce over its two executors, the
model directory on the session's HDFS) is recorded in a local MLflow file store and read back
with MLflow's own client: parameters, training metrics with their steps, evaluations with
their steps, and the export as an artifact (copied down from HDFS) byte for byte. The fast
tests check that a missing ``mlflow`` extra or a store MLflow refuses fails before Spark.
"""

from __future__ import annotations

import json
import math
import sys
import threading
import time
from pathlib import Path

import pytest

from sparktf import storage
from tests import helpers
from tests.helpers import assert_nothing_left

pytestmark = pytest.mark.unit  # tests of another tier carry their own mark

ROOT = Path(__file__).resolve().parents[1]
INSTALL_HINT = "pip install 'sparktf[mlflow]'"


@pytest.fixture
def file_store(tmp_path, monkeypatch) -> str:
    """A local MLflow file store (MLflow 3 wants the opt-in for it); skips the test when
    the mlflow extra is not installed (the fail-fast tests run either way)."""
    pytest.importorskip("mlflow.tracking", reason=f"the mlflow extra is missing: {INSTALL_HINT}")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    return f"file://{tmp_path}/mlruns"


def _client(uri: str):
    from mlflow.tracking import MlflowClient

    return MlflowClient(uri)


# ----------------------------------------------------------------------------- fast tests


@pytest.mark.e2e
def test_the_job_without_mlflow_fails_before_spark_naming_the_extra(tmp_path):
    """``import mlflow`` fails in the job's process (``sys.modules["mlflow"] = None`` is how
    Python spells a missing package); the job exits 2 with the install line, before it reads
    the (nonexistent) data or starts Spark."""
    argv = [
        "jobs/train.py",
        "--model",
        "mnist_softmax",
        "--data",
        str(tmp_path / "no-such-data"),
        "--model-dir",
        str(tmp_path / "model"),
        "--mlflow-tracking-uri",
        f"file://{tmp_path}/mlruns",
    ]
    code = (
        "import runpy, sys; sys.modules['mlflow'] = None; "
        f"sys.argv = {argv!r}; runpy.run_path('jobs/train.py', run_name='__main__')"
    )
    started = time.monotonic()
    out = helpers.run_command([sys.executable, "-c", code], cwd=ROOT, timeout=120)
    assert out.returncode == 2, out.stderr
    assert INSTALL_HINT in out.stderr and "--mlflow-tracking-uri needs MLflow" in out.stderr
    assert "SparkContext" not in out.stderr and "Spark version" not in out.stderr
    assert "no-such-data" not in out.stderr
    assert not (tmp_path / "mlruns").exists() and not (tmp_path / "model").exists()
    assert time.monotonic() - started < 60


def test_fit_without_mlflow_raises_before_reading_anything(tmp_path, monkeypatch):
    from sparktf.train import (
        ConfigError,
        RunConfig,
        ScalingConfig,
        TrackingConfig,
        TrainConfig,
        fit,
    )

    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(ConfigError, match=r"pip install 'sparktf\[mlflow\]'"):
        fit(
            TrainConfig(model="mnist_softmax", data=str(tmp_path / "no-such-data")),
            ScalingConfig(),
            RunConfig(
                model_dir=str(tmp_path / "m"),
                tracking=TrackingConfig(mlflow_tracking_uri=str(tmp_path / "mr")),
            ),
        )
    assert not (tmp_path / "m").exists() and not (tmp_path / "mr").exists()


def test_job_flags_reach_the_run_config(file_store):
    from sparktf import cli
    from sparktf.jobs import train as job

    argv = ["--model", "mnist_softmax", "--data", "/d", "--model-dir", "/m"]
    parser = job.parser("", "train", None)
    help_text = " ".join(parser.format_help().split())  # unwrapped
    assert "--mlflow-tracking-uri URI" in help_text and INSTALL_HINT in help_text
    _, _, run = job.configs(cli.parse(parser, argv))
    assert (run.tracking.mlflow_tracking_uri, run.tracking.mlflow_experiment) == (None, "sparktf")
    more = ["--mlflow-tracking-uri", file_store, "--mlflow-experiment", "e1"]
    _, _, run = job.configs(cli.parse(parser, argv + more))
    assert (run.tracking.mlflow_tracking_uri, run.tracking.mlflow_experiment) == (file_store, "e1")


def test_tracking_settings_are_checked(tmp_path, file_store):
    from sparktf.jobs import train as job
    from sparktf.train import ConfigError, RunConfig, TrackingConfig
    from sparktf.train.driver import tracking

    with pytest.raises(ConfigError, match=r"TrackingConfig\.mlflow_tracking_uri"):
        TrackingConfig(mlflow_tracking_uri="  ")
    with pytest.raises(ConfigError, match=r"TrackingConfig\.mlflow_experiment"):
        RunConfig(
            model_dir="/m",
            tracking={"mlflow_tracking_uri": file_store, "mlflow_experiment": ""},
        )
    # A store MLflow cannot open: the error names the setting and the URI (without a
    # password); the job shows the flag in its place.
    bad = RunConfig(model_dir="/m", tracking={"mlflow_tracking_uri": "nosuch://u:secret@h/x"})
    named = r"nosuch://u:<redacted>@h/x \(TrackingConfig\.mlflow_tracking_uri\)"
    with pytest.raises(ConfigError, match=named) as e:
        tracking.check(bad)
    assert "secret" not in str(e.value)
    assert "(--mlflow-tracking-uri)" in job.for_command_line(str(e.value))
    # A local path is the driver's: made absolute.
    assert tracking.tracking_uri("mlruns") == (Path.cwd() / "mlruns").as_uri()
    assert tracking.tracking_uri("http://mlflow:5000") == "http://mlflow:5000"
    tracking.check(RunConfig(model_dir="/m", tracking={"mlflow_tracking_uri": file_store}))
    client = _client(file_store)
    assert client.get_experiment_by_name("sparktf") is not None  # created when missing


# ----------------------------------------------------------------------------- runs


def _history(client, run_id: str, key: str) -> list[tuple[int, float]]:
    return [(m.step, m.value) for m in client.get_metric_history(run_id, key)]


@pytest.mark.integration
def test_run_is_recorded_params_metrics_evaluations_and_export(
    spark, hdfs, mnist_data, tmp_path, file_store
):
    from sparktf import models
    from sparktf.train import (
        CheckpointConfig,
        EvalConfig,
        FailureConfig,
        RunConfig,
        ScalingConfig,
        TrackingConfig,
        TrainConfig,
        fit,
    )

    model_dir = hdfs.fresh("tracked")
    result = fit(
        TrainConfig(model="mnist_softmax", data=str(mnist_data / "data"), steps=30, batch_size=8),
        ScalingConfig(strategy="allreduce", num_workers=2, threads_per_worker=1),
        RunConfig(
            model_dir=model_dir,
            checkpoint=CheckpointConfig(every_steps=15),
            failure=FailureConfig(failure_timeout_s=60.0),
            evaluation=EvalConfig(every_steps=15),
            tracking=TrackingConfig(
                summary_every_steps=2,
                progress_every_s=1.0,
                mlflow_tracking_uri=file_store,
                mlflow_experiment="sparktf-tests",
            ),
        ),
        spark=spark,
    )
    assert result.final_step == 30 and result.mlflow_run_id
    client = _client(file_store)
    run = client.get_run(result.mlflow_run_id)
    experiment = client.get_experiment(run.info.experiment_id)
    assert experiment.name == "sparktf-tests"
    assert run.info.status == "FINISHED"
    assert run.info.run_name == "mnist_softmax-allreduce"

    # Parameters: the layout, the length and the model's effective config.
    config = models.get_task("mnist_softmax", batch_size=8).config
    params = run.data.params
    expected = {
        "model": "mnist_softmax",
        "strategy": "allreduce",
        "num_workers": "2",
        "num_ps": "0",
        "batch_size": "8",
        "per_process_batch": "4",
        "steps": "30",
        "steps_per_epoch": str(100 // 8),
        "input_mode": "files",
        "file_format": "tfrecord",
        "eval_split": "test",
        "eval_every_steps": "15",
        "train_rows": "100",
        "dataset": "mnist",
    }
    assert {k: params.get(k) for k in expected} == expected
    assert float(params["learning_rate"]) == config["learning_rate"]
    assert params["optimizer"] == config["optimizer"]["name"]
    assert json.loads(params["model_config.batch_size"]) == 8
    assert "epochs" not in params  # not set: left out

    # Training metrics with their steps, as the driver received them; the last at step 30.
    for name in ("loss", "accuracy", "learning_rate", "examples_per_sec", "epoch"):
        history = _history(client, run.info.run_id, name)
        steps = [step for step, _ in history]
        assert steps == sorted(set(steps)) and 1 <= steps[0] and steps[-1] == 30, (name, steps)
        assert all(math.isfinite(v) for _, v in history)
    loss = _history(client, run.info.run_id, "loss")
    assert loss[-1][1] == pytest.approx(result.metrics["loss"])
    epoch = dict(_history(client, run.info.run_id, "epoch"))
    assert epoch[30] == pytest.approx(30 / 12)

    # Both evaluations, at their steps, with the values of the result.
    assert [e["step"] for e in result.eval_history] == [15, 30]
    for name in ("loss", "accuracy", "top5_accuracy"):
        assert _history(client, run.info.run_id, f"eval_{name}") == [
            (e["step"], pytest.approx(e[name])) for e in result.eval_history
        ]
    assert run.data.metrics["run_elapsed_s"] == pytest.approx(result.elapsed_s)

    # The export: copied down from HDFS, the same files.
    assert run.data.tags["sparktf.export"] == result.export_dir
    assert run.data.tags["sparktf.model_dir"] == model_dir
    listed = {a.path for a in client.list_artifacts(run.info.run_id, "export")}
    assert {"export/saved_model.pb", "export/variables"} <= listed
    local = Path(client.download_artifacts(run.info.run_id, "", str(tmp_path / "artifacts")))
    with storage.local_copy(result.export_dir) as exported:
        for path in Path(exported).rglob("*"):
            if path.is_file():
                copy = local / "export" / path.relative_to(exported)
                assert copy.read_bytes() == path.read_bytes(), copy
    summary = json.loads((local / "sparktf_train.json").read_text())
    assert summary["final_step"] == 30 and summary["export"] == result.export_dir

    assert [t for t in threading.enumerate() if t.name == "sparktf-mlflow"] == []
    assert_nothing_left()


@pytest.mark.integration
def test_a_run_that_fails_is_recorded_failed_with_its_error(
    spark, mnist_data, tmp_path, file_store
):
    """Three all-reduce workers on the session's two task slots cannot start: the MLflow run
    exists with its parameters, ends FAILED and carries the error."""
    from sparktf.train import ConfigError, RunConfig, ScalingConfig, TrainConfig, fit

    with pytest.raises(ConfigError, match="needs 3 task slots") as error:
        fit(
            TrainConfig(
                model="mnist_softmax", data=str(mnist_data / "data"), steps=2, batch_size=6
            ),
            ScalingConfig(strategy="allreduce", num_workers=3),
            RunConfig(
                model_dir=str(tmp_path / "model"), tracking={"mlflow_tracking_uri": file_store}
            ),
            spark=spark,
        )
    client = _client(file_store)
    experiment = client.get_experiment_by_name("sparktf")
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FAILED"
    assert str(error.value) in run.data.tags["sparktf.error"]
    assert run.data.params["num_workers"] == "3"
