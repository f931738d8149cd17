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
import stat
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
        self, job: str, *args: str, spark_options=(), timeout: float = 540
    ) -> tuple[subprocess.CompletedProcess, dict]:
        """``scripts/submit.sh --profile yarn JOB ARGS``; returns the run and the one
        application it submitted."""
        before = set(self.apps())
        env = dict(os.environ, HADOOP_CONF_DIR=str(self.conf_dir), TF_CPP_MIN_LOG_LEVEL="2")
        run = helpers.run_command(
            ["./scripts/submit.sh", "--profile", "yarn", *spark_options, job, *args],
            cwd=ROOT,
            env=env,
            timeout=timeout,
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


def test_a_state_directory_others_can_write_is_refused_before_anything_is_read(tmp_path):
    """yarn.sh sources DIR/ready.env, hdfs.sh prints it for the user to eval, and both kill
    the process of DIR's pid file: all of it is trusted only from a directory of the user's
    own that no one else can write to. A directory others can write to, holding a planted
    ready.env and the pid of a process whose command line says MiniYarn/MiniHdfs, is refused
    by every subcommand before anything of it is read; a directory of the user's that only
    they could write to is tightened to 0700, and a new one is made 0700."""
    hdfs_sh = ROOT / "scripts" / "hdfs.sh"
    marker = tmp_path / "planted-code-ran"
    decoy = subprocess.Popen(["bash", "-c", "exec -a MiniYarn-MiniHdfs sleep 300"])
    try:
        for script, pid_file, args in (
            (YARN_SH, "yarn.pid", ["--conf-dir", str(tmp_path / "conf")]),
            (hdfs_sh, "hdfs.pid", ["--conf-dir", str(tmp_path / "conf")]),
        ):
            state = tmp_path / f"shared-{pid_file}"
            state.mkdir()
            state.chmod(0o777)  # another user's to write into
            (state / pid_file).write_text(f"{decoy.pid}\n")
            planted = f"HDFS_URI=hdfs://x:1\nYARN_RM=x:1\nYARN_WEBAPP=x:2\ntouch {marker}\n"
            (state / "ready.env").write_text(planted)
            for command in ("start", "status", "stop"):
                run = helpers.run_command([script, command, "--dir", state, *args], timeout=60)
                assert run.returncode == 1, (script.name, command, run.stdout, run.stderr)
                assert "is writable by others (mode 777)" in run.stderr, run.stderr
                assert "touch" not in run.stdout and not marker.exists()
            assert decoy.poll() is None  # not killed by a planted pid file
            assert (state / "ready.env").read_text() == planted
        own = tmp_path / "own"
        own.mkdir()
        own.chmod(0o755)  # the user's, as an older yarn.sh made it: no one else could write
        status = helpers.run_command([YARN_SH, "status", "--dir", own])
        assert status.returncode == 3 and "not running" in status.stdout, status.stderr
        assert stat.S_IMODE(own.stat().st_mode) == 0o700
        helpers.run_command([YARN_SH, "status", "--dir", tmp_path / "new"])
        assert stat.S_IMODE((tmp_path / "new").stat().st_mode) == 0o700
    finally:
        decoy.kill()
        decoy.wait()


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


def _train_on_yarn(yarn, hdfs, mnist_hdfs, tmp_path, *spark_options) -> tuple[str, dict]:
    """ps with 2 workers reading files, 3 steps, on YARN: the model directory and the
    application, checked as a user would (result, export, final state, containers) and with
    Spark's transport protected (the profile's settings; YARN made the application's
    secret)."""
    model_dir = hdfs.fresh("yarn-train")
    result_file = tmp_path / "result.json"
    events = tmp_path / "events"
    events.mkdir()
    run, app = yarn.submit(
        "jobs/train_mnist.py",
        *("--strategy", "ps", "--num-workers", "2", "--num-ps", "1", "--input-mode", "files"),
        *("--data", mnist_hdfs, "--model-dir", model_dir, "--steps", "3"),
        *("--batch-size", "20", "--result-json", str(result_file)),
        spark_options=(*spark_options, *event_log_conf(events)),
        # packing the stack comes first with --ship-env (unless another test packed it): 9
        # minutes were not enough once, on a machine busy with other tests
        timeout=900,
    )
    assert run.returncode == 0, explain(run)
    assert_transport_protected(app_settings(events))
    assert "transport is not protected" not in run.stdout + run.stderr
    result = json.loads(result_file.read_text())
    assert (result["final_step"], result["strategy"], result["input_mode"]) == (3, "ps", "files")
    assert storage.exists(storage.join(result["export_dir"], "saved_model.pb"))
    assert (app["state"], app["finalStatus"]) == ("FINISHED", "SUCCEEDED"), app
    # chief + 2 workers in executors (conf/jobs/train_mnist.json keeps the ps on the driver)
    assert len(yarn.containers(app["id"])) == 1 + 3
    return model_dir, app | {"stderr": run.stderr}


def _pythons(yarn, app_id: str) -> list[str]:
    """The interpreter each TensorFlow process in a container logged."""
    return re.findall(
        r"role \S+ in .* \(python (\S+)\)",
        "".join(
            f.read_text(errors="replace")
            for d in yarn.container_logs(app_id)
            for f in d.glob("stderr*")
        ),
    )


def test_ps_from_files_trains_on_yarn(yarn, hdfs, mnist_hdfs, tmp_path):
    """A training on YARN as a user with the stack installed on every node runs it: the
    containers run this venv's Python. (A YARN application costs minutes of this machine's
    two cores, so this is CI's one training on YARN: the strategies and input modes train on
    the local and standalone masters, tests/test_train.py and tests/test_standalone.py, where
    they are not YARN's business.)"""
    _, app = _train_on_yarn(yarn, hdfs, mnist_hdfs, tmp_path)
    pythons = _pythons(yarn, app["id"])
    assert len(pythons) == 3 and all(p.startswith(str(ROOT / ".venv")) for p in pythons), pythons


@pytest.mark.full  # not in CI (pyproject.toml): test_ps_from_files_trains_on_yarn trains on
# YARN, and the shipped environment trains and predicts across hosts in test_multihost and
# goes to S3 once in test_s3_spark; unpacking it in five containers cost 10-15 minutes of CI
@pytest.mark.timeout(1500)  # packing the whole stack once takes minutes on 2 cores
def test_shipped_environment_trains_then_predicts(yarn, hdfs, mnist_hdfs, spark, tmp_path):
    """--ship-env: the executors' Python is the packed venv unpacked in each container
    (spark.pyspark.python=./environment/bin/python), for training (ps, the workers reading
    files) and then prediction; the archive goes to HDFS once and YARN localizes it from
    there."""
    model_dir, app = _train_on_yarn(yarn, hdfs, mnist_hdfs, tmp_path, "--ship-env")
    # Each TensorFlow process in a container logged its interpreter: the environment there.
    pythons = _pythons(yarn, app["id"])
    assert len(pythons) == 3, pythons
    for python in pythons:
        assert re.search(r"/container_[^/]+/environment/bin/python3?(\.\d+)?$", python), python
        assert not python.startswith(str(ROOT / ".venv"))
    # (sparktf submit's own log is on stderr; the driver's, through spark-submit, on stdout)
    shared = [line for line in app["stderr"].splitlines() if "copying the environment to" in line]
    assert len(shared) == 1 and f"{hdfs.uri}/user/" in shared[0], app["stderr"][-2000:]

    output = hdfs.fresh("yarn-ship-env-predictions")
    run, app = yarn.submit(
        "jobs/predict.py",
        *("--export", model_dir, "--input", storage.join(mnist_hdfs, "test", "parquet")),
        *("--output", output),
        spark_options=("--ship-env", "--num-executors", "1"),
    )
    assert run.returncode == 0, explain(run)
    assert (app["state"], app["finalStatus"]) == ("FINISHED", "SUCCEEDED"), app
    assert "copying the environment" not in run.stdout + run.stderr  # already there
    predictions = spark.read.parquet(output)
    assert predictions.count() == N_TEST
    assert {"prediction", "probability"} <= set(predictions.columns)


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
