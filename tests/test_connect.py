"""Training, inference and a Spark ML Pipeline from a Spark Connect client.

One local Connect server (``sparktf connect``) over ``local-cluster[2,1,1024]``; every client
is a job or the Pipeline example as a user runs it, in its own process (a Connect session and
the suite's classic SparkContext do not mix in one process), with the server's URL and token in
``SPARK_REMOTE`` (off every command line). The TensorFlow nodes start in one barrier stage from
the client (a training function too), the spark input mode feeds through DataFrame operations
only, and the driver-side
parts (reservation and control servers, parameter servers on the driver, the export, the
result) live in the client process. The same scenarios on a classic session are the rest of
the suite.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from sparktf.console import connect
from tests import helpers
from tests.conftest import ROOT
from tests.helpers import assert_nothing_left

pytestmark = pytest.mark.e2e

MASTER = "local-cluster[2,1,1024]"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    directory = tmp_path_factory.mktemp("connect") / "state"
    started = connect.start(directory, master=MASTER, timeout_s=240)
    try:
        yield started
    finally:
        connect.stop(directory)


def client(server, command: list, *, timeout: float = 300):
    """``command`` (a job or an example, as a user runs it) as a Connect client of ``server``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARK_CONNECT", "SPARK_RE"))}
    env.update(SPARK_REMOTE=server.remote, PYSPARK_PYTHON=sys.executable, SPARKTF_LOG_LEVEL="INFO")
    return helpers.run_command([sys.executable, *command], env=env, cwd=ROOT, timeout=timeout)


def job(server, script: str, *args: str, timeout: float = 300):
    return client(server, [ROOT / "jobs" / script, *args], timeout=timeout)


def train_args(
    data: Path, model_dir: Path, result: Path, *, steps: int = 6, batch_size: int = 8
) -> list[str]:
    return [
        "--model",
        "mnist_mlp",
        "--model-config",
        '{"hidden_units": 8}',
        "--data",
        str(data),
        "--model-dir",
        str(model_dir),
        "--steps",
        str(steps),
        "--batch-size",
        str(batch_size),
        "--result-json",
        str(result),
    ]


@pytest.fixture(scope="module")
def allreduce(server, mnist_data, tmp_path_factory) -> dict:
    """An all-reduce run over both executors, reading its files, trained from the client."""
    root = tmp_path_factory.mktemp("connect-allreduce")
    result = root / "result.json"
    args = train_args(mnist_data / "data", root / "model", result)
    done = job(server, "train.py", *args, "--strategy", "allreduce", "--num-workers", "2")
    assert done.returncode == 0, done.stderr[-4000:]
    return {"root": root, "result": json.loads(result.read_text()), "log": done.stderr}


def test_allreduce_trains_from_a_connect_client(allreduce):
    result = allreduce["result"]
    assert result["final_step"] == 6
    export = Path(result["export_dir"])
    assert export == allreduce["root"] / "model" / "export" / "6"
    assert (export / "saved_model.pb").is_file()
    # both processes ran on the server's executors, started from the client
    assert "starting TensorFlow on 2 executors" in allreduce["log"]
    assert_nothing_left()


def test_predict_and_evaluate_from_a_connect_client(server, allreduce, mnist_data):
    model = allreduce["root"] / "model"
    output = allreduce["root"] / "predictions"
    done = job(
        server,
        "predict.py",
        "--export",
        str(model),
        "--input",
        str(mnist_data / "data" / "test"),
        "--output",
        str(output),
    )
    assert done.returncode == 0, done.stderr[-4000:]
    table = pq.read_table(output)
    assert table.num_rows == 10
    assert {"id", "label", "prediction", "probability", "model_version"} <= set(table.column_names)
    assert set(table.column("model_version").to_pylist()) == {6}
    assert all(0 <= p < 10 for p in table.column("prediction").to_pylist())

    metrics_file = allreduce["root"] / "metrics.json"
    done = job(
        server,
        "evaluate.py",
        "--export",
        str(model),
        "--data",
        str(mnist_data / "data"),
        "--split",
        "test",
        "--output",
        str(metrics_file),
    )
    assert done.returncode == 0, done.stderr[-4000:]
    metrics = json.loads(metrics_file.read_text())
    assert metrics["examples"] == 10, metrics
    assert 0.0 <= metrics["accuracy"] <= 1.0, metrics


@pytest.mark.full  # not in CI (pyproject.toml): ps fed by Spark trains on local-cluster in CI
def test_ps_fed_by_spark_from_a_connect_client(server, mnist_data, tmp_path):
    """The spark input mode from a client: the chief's feed runs mapInArrow passes on the
    server, its parameter server runs in the client process."""
    result_file = tmp_path / "result.json"
    args = train_args(mnist_data / "data", tmp_path / "model", result_file)
    done = job(
        server,
        "train.py",
        *args,
        "--strategy",
        "ps",
        "--num-workers",
        "1",
        "--num-ps",
        "1",
        "--ps-on-driver",
        "--input-mode",
        "spark",
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(result_file.read_text())
    assert result["final_step"] == 6 and result["strategy"] == "ps"
    assert sum(result["fed_rows"].values()) >= 6 * 8  # at least the rows of the steps run
    assert (tmp_path / "model" / "export" / "6" / "saved_model.pb").is_file()
    assert_nothing_left()


@pytest.mark.full  # not in CI (pyproject.toml): the example runs in test_ml and the README's test
def test_a_pipeline_fits_saves_loads_and_transforms_from_a_connect_client(server, tmp_path):
    """The Pipeline example (StringIndexer-free: integer labels; VectorAssembler,
    StandardScaler, TFEstimator) as a Connect client: fit, save, load, transform."""
    done = client(
        server,
        [
            ROOT / "examples" / "tabular_pipeline.py",
            "--demo-rows",
            "300",
            "--csv",
            str(tmp_path / "data.csv"),
            "--model-dir",
            str(tmp_path / "model"),
            "--pipeline-dir",
            str(tmp_path / "pipeline"),
            "--output",
            str(tmp_path / "predictions"),
            "--epochs",
            "8",
            "--batch-size",
            "16",
        ],
    )
    assert done.returncode == 0, done.stderr[-4000:]
    summary = json.loads(done.stdout[done.stdout.index("{") : done.stdout.rindex("}") + 1])
    assert summary["test_rows"] > 40
    assert summary["test_accuracy"] > 0.8, summary  # three classes: chance is 1/3
    predictions = pq.read_table(tmp_path / "predictions")
    assert predictions.num_rows == summary["test_rows"]
    assert_nothing_left()


@pytest.mark.full  # not in CI (pyproject.toml): run(train_fn) runs in test_function_run
def test_a_training_function_runs_from_a_connect_client(server, mnist_data, tmp_path):
    """``sparktf.train.run(train_fn)`` (the custom-loop example) as a Connect client: the
    function ships pickled from the client to both executors, reports each epoch with a
    checkpoint, and the chief's return value comes back."""
    model_dir = tmp_path / "model"
    command = [ROOT / "examples" / "custom_loop.py", "--data", str(mnist_data / "data")]
    command += ["--model-dir", str(model_dir), "--epochs", "2", "--steps-per-epoch", "5"]
    done = client(server, command)
    assert done.returncode == 0, done.stderr[-4000:]
    printed = json.loads(done.stdout[done.stdout.index('{\n  "value"') :])
    assert [entry["step"] for entry in printed["history"]] == [5, 10]
    assert printed["value"]["epochs"] == 2 and printed["value"]["workers"] == 2
    assert printed["last_checkpoint"].endswith("/checkpoints/report-000002")
    assert (Path(printed["last_checkpoint"]) / "model.weights.h5").is_file()
    assert_nothing_left()


def test_more_processes_than_slots_fail_fast_from_a_connect_client(server, mnist_data, tmp_path):
    started = time.monotonic()
    args = train_args(
        mnist_data / "data", tmp_path / "model", tmp_path / "result.json", steps=3, batch_size=9
    )
    done = job(server, "train.py", *args, "--strategy", "allreduce", "--num-workers", "3")
    took = time.monotonic() - started
    assert done.returncode != 0
    assert "needs 3 task slots" in done.stderr and "the cluster has 2" in done.stderr, done.stderr[
        -3000:
    ]
    assert took < 90, f"took {took:.0f} s: the run did not fail fast"
    assert not (tmp_path / "model" / "export").exists()
    assert_nothing_left()
