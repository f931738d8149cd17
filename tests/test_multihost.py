"""sparktf across hosts: HDFS, a Spark standalone master, two workers and the driver each on a
host of their own (``tests/multihost.py``), with Spark's authentication and encryption on.

Nothing runs on loopback across hosts and nothing relies on a shared ``/tmp``: the raw data
goes to HDFS from the driver's host, and every result is read back from there. Skipped where
namespaces cannot be made (not root, or a container without the capability).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests import helpers, multihost
from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

SUBMIT = [ROOT / "scripts" / "submit.sh", "--profile", "standalone"]


@pytest.fixture(scope="module")
def cluster():
    why = multihost.namespaces_usable()
    if why:
        pytest.skip(f"multi-host tests {why}")
    name = multihost.new_name()
    # not under /tmp: each host has its own /tmp, and the shared files live here
    state = Path("/run") / f"sparktf-test-{name}"
    out = helpers.run_command(
        [multihost.SCRIPT, "start", *multihost.HOSTS, "--name", name],
        env={**os.environ, "SPARKTF_NETCLUSTER_DIR": str(state)},
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    hosts = dict(line.split("=", 1) for line in out.stdout.split())
    made = multihost.MultiHost(name, state, hosts)
    try:
        made.start_hdfs()
        made.start_spark()
        yield made
    finally:
        made.stop()
        shutil.rmtree(state, ignore_errors=True)


def _on_driver(cluster, *argv, timeout=600):
    out = cluster.run("drv", *argv, env=cluster.driver_env(), timeout=timeout)
    assert out.returncode == 0, (out.stdout + out.stderr)[-5000:]
    return out


@pytest.fixture(scope="module")
def mnist(cluster):
    """A tiny MNIST, its raw files put on HDFS from the driver's host, converted there by
    ``submit.sh``: the dataset's URI."""
    uri = cluster.hdfs["HDFS_URI"]
    raw, data = f"{uri}/raw/mnist", f"{uri}/datasets/mnist"
    upload = (
        "import os, sys\n"
        "from sparktf import storage\n"
        "from sparktf.datasets.synthetic import write_mnist\n"
        "write_mnist('/tmp/raw', n_train=64, n_test=16)\n"
        f"storage.makedirs({raw!r})\n"
        "for f in os.listdir('/tmp/raw'):\n"
        f"    storage.copy_file('/tmp/raw/' + f, {raw!r} + '/' + f)\n"
    )
    _on_driver(cluster, sys.executable, "-c", upload)
    _on_driver(cluster, *SUBMIT, "jobs/convert_mnist.py", "--input", raw, "--output", data)
    return data


def test_train_allreduce_from_files_then_predict_across_hosts(cluster, mnist):
    uri = cluster.hdfs["HDFS_URI"]
    _on_driver(
        cluster, *SUBMIT, "jobs/train_mnist.py",
        "--strategy", "allreduce", "--num-workers", "2", "--input-mode", "files",
        "--data", mnist, "--steps", "4", "--batch-size", "8",
        "--model-dir", f"{uri}/models/mnist", "--result-json", "/tmp/result.json",
    )  # fmt: skip
    summary = json.loads(cluster.run("drv", "cat", "/tmp/result.json").stdout)
    assert (summary["final_step"], summary["strategy"]) == (4, "allreduce")
    assert summary["export_dir"].startswith(uri)
    workers = {cluster.hosts["w1"], cluster.hosts["w2"]}  # one process on each worker host
    assert {where["host"] for where in summary["processes"].values()} == workers
    _on_driver(
        cluster, *SUBMIT, "jobs/predict.py",
        "--export", summary["export_dir"], "--input", f"{mnist}/test/parquet",
        "--output", f"{uri}/predictions/mnist",
    )  # fmt: skip


def test_ps_fed_by_spark_across_hosts_and_an_outsider_reaches_nothing(cluster, mnist):
    """ps with its parameter server on the driver's host, the chief and the worker on the
    worker hosts, the chief fed by Spark. While it trains, the outsider host tries every
    port the run listens on (the driver's and the executors' processes): none answers it but
    TensorFlow's gRPC servers, the documented exception. The driver's UI asks for the token
    sparktf gave its user, and answers with it."""
    uri = cluster.hdfs["HDFS_URI"]
    command = cluster.command(
        "drv", *SUBMIT, "jobs/train_mnist.py",
        "--strategy", "ps", "--num-workers", "1", "--num-ps", "1", "--input-mode", "spark",
        "--data", mnist, "--steps", "400", "--batch-size", "8",
        "--model-dir", f"{uri}/models/mnist-ps", "--result-json", "/tmp/result-ps.json",
    )  # fmt: skip
    log = cluster.shared / "train-ps.log"
    ui_seen: list[str] = []

    def with_token(listener):  # the user, on the driver's host, with the token sparktf wrote
        if listener["host"] == "drv" and listener["port"] == 4040:
            env = cluster.driver_env()
            ui_seen.append(cluster.run("drv", sys.executable, "-c", UI_WITH_TOKEN, env=env).stdout)

    with open(log, "w") as out:
        job = subprocess.Popen(
            [str(part) for part in command], env={**cluster.env, **cluster.driver_env()},
            cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
        try:
            answers = multihost.probe_run(cluster, job, on_new=with_token)
            assert job.wait(timeout=600) == 0, log.read_text()[-5000:]
        finally:
            if job.poll() is None:
                job.kill()
                job.wait()
    summary = json.loads(cluster.run("drv", "cat", "/tmp/result-ps.json").stdout)
    assert (summary["final_step"], summary["input_mode"]) == (400, "spark")
    hosts = {name: where["host"] for name, where in summary["processes"].items()}
    assert hosts["ps:0"] == cluster.hosts["drv"]
    assert {hosts["chief:0"], hosts["worker:0"]} == {cluster.hosts["w1"], cluster.hosts["w2"]}

    def where(a):
        return f"{a['host']}:{a['port']} ({a['commands'][0][:60] if a['commands'] else '?'})"

    tensorflow = [a for a in answers if any(multihost.TF_PROCESS in c for c in a["commands"])]
    others = [a for a in answers if a not in tensorflow]
    # the documented exception: TensorFlow's gRPC servers of ps:0, chief:0 and worker:0
    assert sorted(a["host"] for a in tensorflow) == ["drv", "w1", "w2"], tensorflow
    answered = [
        (where(a), a["outcome"], a["sample"])
        for a in others
        if a["outcome"] not in ("refused", "silent", "loopback", "http 401", "http 403")
    ]
    assert answered == [], answered
    ui = [a for a in others if (a["host"], a["port"]) == ("drv", 4040)]
    assert [a["outcome"] for a in ui] == ["http 403"], ui
    assert ui_seen and ui_seen[0].split() == ["0o600", "403", "200"], ui_seen
    # the run did listen across hosts: Spark's RPC on the driver and on both executors
    reached = {a["host"] for a in others if a["outcome"] == "silent"}
    assert reached == {"drv", "w1", "w2"}, others


UI_WITH_TOKEN = """
import glob, os, time, urllib.error, urllib.request
url = "http://" + os.environ["SPARK_LOCAL_IP"] + ":4040/jobs/"
tokens = []
for _ in range(50):  # written just after the UI starts
    tokens = glob.glob(os.environ["SPARKTF_HOME"] + "/ui/*.token")  # this run's only
    if tokens:
        break
    time.sleep(0.2)
assert len(tokens) == 1, tokens  # the tokens of ended applications are gone
token = open(tokens[0]).read().strip()
print(oct(os.stat(tokens[0]).st_mode & 0o777))
for headers in ({}, {"Authorization": "Bearer " + token}):
    try:
        print(urllib.request.urlopen(urllib.request.Request(url, headers=headers)).status)
    except urllib.error.HTTPError as exc:
        print(exc.code)
"""
