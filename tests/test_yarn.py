"""A real YARN next to the real HDFS: scripts/yarn.sh (Hadoop's MiniYARNCluster, a
ResourceManager and one NodeManager), and jobs submitted to it with
``scripts/submit.sh --profile yarn`` as a user submits them, with no sizing flags: client mode,
executors sized by sparktf submit to what the NodeManager offers (the profile asks more than
this YARN holds), running the venv's python or, with ``--ship-env``, the packed environment.

What a user checks: the job's exit code, the export and the predictions on HDFS, the
application's final status in the ResourceManager's REST API, one YARN container per executor
(plus the application master), that ``yarn.sh stop`` leaves nothing running, and that the
applications ran with Spark's authentication, RPC and I/O encryption on (the profile's).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest

from sparktf import storage
from sparktf.datasets.synthetic import write_mnist
from tests import helpers
from tests.conftest import ROOT
from tests.test_transport import app_settings, assert_transport_protected, event_log_conf

pytestmark = pytest.mark.e2e

YARN_SH = ROOT / "scripts" / "yarn.sh"
N_TRAIN, N_TEST = 100, 10


@dataclass
class Yarn:
    rm: str
    webapp: str
    pid: int
    base: Path
    conf_dir: Path
    args: list[str]

    def apps(self) -> dict[str, dict]:
        """The ResourceManager's applications (REST API), by id."""
        with urllib.request.urlopen(f"{self.webapp}/ws/v1/cluster/apps", timeout=30) as r:
            listed = json.load(r).get("apps") or {}
        return {app["id"]: app for app in listed.get("app", [])}

    def container_logs(self, app_id: str) -> list[Path]:
        """Container log directories the NodeManager kept for an application."""
        return sorted((self.base / "yarn" / "cluster").glob(f"*/*/*logDir*/{app_id}/container_*"))

    def containers(self, app_id: str) -> list[str]:
        return [p.name for p in self.container_logs(app_id)]

    def submit(
        self, job: str, *args: str, spark_options=()
    ) -> tuple[subprocess.CompletedProcess, dict]:
        """``scripts/submit.sh --profile yarn JOB ARGS``; returns the run and the one
        application it submitted."""
        before = set(self.apps())
        env = dict(os.environ, HADOOP_CONF_DIR=str(self.conf_dir), TF_CPP_MIN_LOG_LEVEL="2")
        run = helpers.run_command(
            ["./scripts/submit.sh", "--profile", "yarn", *spark_options, job, *args],
            cwd=ROOT,
            env=env,
            timeout=540,
        )
        new = [app for app_id, app in self.apps().items() if app_id not in before]
        assert len(new) == 1, f"expected one new YARN application, got {new}\n{explain(run)}"
        return run, new[0]


def explain(run: subprocess.CompletedProcess) -> str:
    """What a failed submit said: the driver's own log (spark-submit sends the Python
    driver's stderr to stdout) without Java stack frames, then the end of stderr."""
    driver = [
        line for line in run.stdout.splitlines() if line.strip() and not line.startswith("\t")
    ]
    return "\n".join(["driver:", *driver[-40:], "stderr:", run.stderr[-1500:]])


def _start(args: list[str]) -> subprocess.CompletedProcess:
    return helpers.run_command(
        [YARN_SH, "start", *args], capture_output=True, text=True, timeout=240
    )


@pytest.fixture(scope="module")
def yarn(hdfs, tmp_path_factory):
    """A YARN of its own, its yarn-site.xml in a copy of the session's Hadoop conf dir (the
    other tests' conf dir stays as it is); stopped at the end, also when tests fail."""
    base = tmp_path_factory.mktemp("yarn")
    conf_dir = base / "hadoop-conf"
    shutil.copytree(os.environ["HADOOP_CONF_DIR"], conf_dir)
    args = ["--dir", str(base / "yarn"), "--conf-dir", str(conf_dir)]
    try:
        out = _start(args)
        assert out.returncode == 0, f"yarn.sh start failed:\n{out.stdout}\n{out.stderr}"
        values = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
        pid = int((base / "yarn" / "yarn.pid").read_text())
        yield Yarn(values["YARN_RM"], values["YARN_WEBAPP"], pid, base, conf_dir, args)
    finally:
        helpers.run_command([YARN_SH, "stop", *args], timeout=180)


@pytest.fixture(scope="module")
def mnist_hdfs(spark, hdfs, tmp_path_factory):
    """A tiny MNIST-format dataset on HDFS (TFRecord and Parquet, 2 shards)."""
    from sparktf.datasets.conversion import convert

    raw = tmp_path_factory.mktemp("mnist-raw")
    write_mnist(raw, n_train=N_TRAIN, n_test=N_TEST)
    uri = hdfs.fresh("mnist-yarn")
    convert("mnist", str(raw), uri, shards=2, spark=spark)
    return uri


def test_start_writes_yarn_site_and_a_second_start_is_harmless(yarn):
    site = (yarn.conf_dir / "yarn-site.xml").read_text()
    assert f"<name>yarn.resourcemanager.address</name><value>{yarn.rm}</value>" in site
    assert yarn.rm.startswith("127.0.0.1:") and yarn.webapp.startswith("http://127.0.0.1:")
    with urllib.request.urlopen(f"{yarn.webapp}/ws/v1/cluster/metrics", timeout=30) as r:
        metrics = json.load(r)["clusterMetrics"]
    assert metrics["activeNodes"] == 1 and metrics["totalMB"] >= 8192
    # Every port of the cluster listens on loopback only.
    ports = helpers.listening(yarn.pid)
    assert ports and all(addr.ip == "127.0.0.1" for addr in ports), ports

    again = _start(yarn.args)
    assert again.returncode == 0 and "already running" in again.stderr
    assert f"YARN_RM={yarn.rm}" in again.stdout
    status = helpers.run_command([YARN_SH, "status", *yarn.args])
    assert status.returncode == 0 and f"running (pid {yarn.pid})" in status.stdout


def test_start_refuses_bad_options_and_a_yarn_site_it_did_not_write(tmp_path):
    bad = helpers.run_command([YARN_SH, "start", "--rm-port", "x"])
    assert bad.returncode == 2 and "expected a number, got 'x'" in bad.stderr
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "yarn-site.xml").write_text("<configuration/>\n")  # a real cluster's, say
    args = ["--dir", str(tmp_path / "yarn"), "--conf-dir", str(conf)]
    refused = helpers.run_command([YARN_SH, "start", *args])
    assert refused.returncode == 1 and "was not written by yarn.sh" in refused.stderr
    assert (conf / "yarn-site.xml").read_text() == "<configuration/>\n"
    assert not (tmp_path / "yarn" / "yarn.pid").exists()


def test_allreduce_spark_feed_then_predict_on_yarn(yarn, hdfs, mnist_hdfs, spark, tmp_path):
    model_dir = hdfs.fresh("yarn-allreduce")
    result_file = tmp_path / "result.json"
    events = tmp_path / "events"
    events.mkdir()
    run, app = yarn.submit(
        "jobs/train_mnist.py",
        *("--strategy", "allreduce", "--num-workers", "2", "--input-mode", "spark"),
        *("--data", mnist_hdfs, "--model-dir", model_dir, "--steps", "4"),
        *("--batch-size", "20", "--result-json", str(result_file)),
        spark_options=tuple(event_log_conf(events)),
    )
    assert run.returncode == 0, explain(run)
    # Spark's transport protected (the profile's settings; YARN made the application's
    # secret), and the run did not warn about it
    assert_transport_protected(app_settings(events))
    assert "transport is not protected" not in run.stdout + run.stderr
    result = json.loads(result_file.read_text())
    trained = (result["final_step"], result["strategy"], result["input_mode"])
    assert trained == (4, "allreduce", "spark")
    assert result["export_dir"] == storage.join(model_dir, "export", "4")
    assert storage.exists(storage.join(result["export_dir"], "saved_model.pb"))
    assert (app["state"], app["finalStatus"]) == ("FINISHED", "SUCCEEDED"), app
    assert len(yarn.containers(app["id"])) == 1 + 2  # the application master + 2 executors

    output = hdfs.fresh("yarn-predictions")
    run, app = yarn.submit(
        "jobs/predict.py",
        *("--export", model_dir, "--input", storage.join(mnist_hdfs, "test", "parquet")),
        *("--output", output),
        spark_options=("--num-executors", "1"),
    )
    assert run.returncode == 0, explain(run)
    assert (app["state"], app["finalStatus"]) == ("FINISHED", "SUCCEEDED"), app
    predictions = spark.read.parquet(output)
    assert predictions.count() == N_TEST
    assert {"prediction", "probability"} <= set(predictions.columns)


def test_ps_files_feed_on_yarn(yarn, hdfs, mnist_hdfs, tmp_path):
    model_dir = hdfs.fresh("yarn-ps")
    result_file = tmp_path / "result.json"
    run, app = yarn.submit(
        "jobs/train_mnist.py",
        *("--strategy", "ps", "--num-workers", "2", "--num-ps", "1", "--input-mode", "files"),
        *("--data", mnist_hdfs, "--model-dir", model_dir, "--steps", "4"),
        *("--batch-size", "20", "--result-json", str(result_file)),
    )
    assert run.returncode == 0, explain(run)
    result = json.loads(result_file.read_text())
    assert (result["final_step"], result["strategy"], result["input_mode"]) == (4, "ps", "files")
    assert storage.exists(storage.join(result["export_dir"], "saved_model.pb"))
    assert (app["state"], app["finalStatus"]) == ("FINISHED", "SUCCEEDED"), app
    # chief + 2 workers in executors (conf/jobs/train_mnist.json keeps the ps on the driver)
    assert len(yarn.containers(app["id"])) == 1 + 3


def test_an_executor_yarn_cannot_hold_fails_at_once_with_the_numbers(yarn, mnist_hdfs):
    before = set(yarn.apps())
    env = dict(os.environ, HADOOP_CONF_DIR=str(yarn.conf_dir))
    started = time.monotonic()
    run = helpers.run_command(
        ["./scripts/submit.sh", "--profile", "yarn", "--executor-memory", "9g"]
        + ["jobs/train_mnist.py", "--strategy", "allreduce", "--num-workers", "2"]
        + ["--data", mnist_hdfs, "--steps", "1"],
        cwd=ROOT, env=env, timeout=120,
    )  # fmt: skip
    assert run.returncode == 2, explain(run)
    assert time.monotonic() - started < 30
    assert "each executor asks 4 cores and 9g (+4g overhead)" in run.stderr
    assert "over YARN's maximum allocation of 8g" in run.stderr
    assert set(yarn.apps()) == before  # nothing was submitted


@pytest.mark.timeout(1200)  # packing the whole stack once takes minutes on 2 cores
def test_shipped_environment_trains_then_predicts(yarn, hdfs, mnist_hdfs, tmp_path):
    """--ship-env: the executors' Python is the packed venv unpacked in each container
    (spark.pyspark.python=./environment/bin/python), for training and then prediction; the
    archive goes to HDFS once and YARN localizes it from there."""
    model_dir = hdfs.fresh("yarn-ship-env")
    result_file = tmp_path / "result.json"
    run, app = yarn.submit(
        "jobs/train_mnist.py",
        *("--strategy", "allreduce", "--num-workers", "2", "--input-mode", "files"),
        *("--data", mnist_hdfs, "--model-dir", model_dir, "--steps", "3"),
        *("--batch-size", "20", "--result-json", str(result_file)),
        spark_options=("--ship-env",),
    )
    assert run.returncode == 0, explain(run)
    assert json.loads(result_file.read_text())["final_step"] == 3
    assert (app["state"], app["finalStatus"]) == ("FINISHED", "SUCCEEDED"), app
    # Each TensorFlow process logged its interpreter: the environment inside its container.
    pythons = re.findall(
        r"role \S+ in .* \(python (\S+)\)",
        "".join(
            f.read_text(errors="replace")
            for d in yarn.container_logs(app["id"])
            for f in d.glob("stderr*")
        ),
    )
    assert len(pythons) == 2, pythons
    for python in pythons:
        assert re.search(r"/container_[^/]+/environment/bin/python3?(\.\d+)?$", python), python
        assert not python.startswith(str(ROOT / ".venv"))
    # (sparktf submit's own log is on stderr; the driver's, through spark-submit, on stdout)
    shared = [line for line in run.stderr.splitlines() if "copying the environment to" in line]
    assert len(shared) == 1 and f"{hdfs.uri}/user/" in shared[0], run.stderr[-2000:]

    output = hdfs.fresh("yarn-ship-env-predictions")
    run, app = yarn.submit(
        "jobs/predict.py",
        *("--export", model_dir, "--input", storage.join(mnist_hdfs, "test", "parquet")),
        *("--output", output),
        spark_options=("--ship-env", "--num-executors", "1"),
    )
    assert run.returncode == 0, explain(run)
    assert (app["state"], app["finalStatus"]) == ("FINISHED", "SUCCEEDED"), app
    assert storage.exists(storage.join(output, "_SUCCESS"))
    assert "copying the environment" not in run.stdout + run.stderr  # already there


def test_stop_leaves_no_jvm_and_no_container(yarn):
    stop = helpers.run_command(
        [YARN_SH, "stop", *yarn.args], capture_output=True, text=True, timeout=180
    )
    assert stop.returncode == 0 and f"stopped (pid {yarn.pid})" in stop.stdout
    assert "leftover" not in stop.stderr  # the NodeManager's own shutdown stopped everything
    assert not psutil.pid_exists(yarn.pid)
    cluster = str(yarn.base / "yarn" / "cluster")
    left = []
    for proc in psutil.process_iter(["pid", "cmdline", "cwd"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        in_cluster = (proc.info["cwd"] or "").startswith(cluster + "/") or cluster + "/" in cmdline
        if in_cluster or ("MiniYarn" in cmdline and str(yarn.base) in cmdline):
            left.append((proc.info["pid"], cmdline[:200]))
    assert not left
    status = helpers.run_command([YARN_SH, "status", *yarn.args])
    assert status.returncode == 3 and "not running" in status.stdout
