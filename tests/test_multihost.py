"""sparktf across hosts: HDFS, a Spark standalone master, two workers and the driver each on a
host of their own (``tests/multihost.py``), with Spark's authentication and encryption on.

HDFS is Kerberized, as on a real cluster: every host is named ``HOST.NAME.test``, and the
services' principals are ``hdfs/`` and ``HTTP/`` of the NameNode's name. The user has what a
site gives: krb5.conf, their keytab on the driver's host, the Hadoop configuration. The
executors have no keytab and no ticket: they read and write HDFS with the run's delegation
token.

Nothing runs on loopback across hosts and nothing relies on a shared ``/tmp``: the raw data
goes to HDFS from the driver's host, and every result is read back from there. Skipped where
namespaces cannot be made (not root, or a container without the capability).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter

import pytest

from sparktf import paths
from tests import multihost
from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

STANDALONE, SUBMIT, SUBMIT_TWO = multihost.STANDALONE, multihost.SUBMIT, multihost.SUBMIT_TWO


@pytest.fixture(scope="module")
def cluster():
    # 4 task slots per worker host; HDFS Kerberized, its services' principals of its host name
    with multihost.started(kerberos=True, cores=4, memory="4g") as made:
        yield made


@pytest.fixture(scope="module")
def mnist(cluster):
    return multihost.convert_mnist(cluster, SUBMIT_TWO)


def test_eight_processes_on_two_hosts_train_in_the_shipped_environment_then_predict(cluster, mnist):
    """8 all-reduce processes fed by Spark: one executor of 4 task slots on each worker
    host, 4 processes in each, each fed by the tasks of its own host. They train and export
    to HDFS, every process ends, and the export predicts the test split.

    The training ships the driver's environment (``--ship-env``) and the worker hosts do not
    have it: the venv is hidden there, so every Python of the executors is the archive's,
    unpacked in the executor's work directory. The archive is packed in the user's sparktf
    home (the checkout's ``.local``), once for the suite (tests/test_yarn.py ships the same
    one, and predicts with it)."""
    uri = cluster.hdfs["HDFS_URI"]
    assert uri.startswith(f"hdfs://{cluster.name_of('nn')}:")  # the NameNode by its name
    home = {"SPARKTF_HOME": str(paths.home())}
    with cluster.hidden(sys.prefix):
        for host in ("w1", "w2"):  # what the executors would run without the archive
            assert cluster.run(host, "test", "-e", sys.executable).returncode == 1
        multihost.on_driver(
            cluster, *STANDALONE, "--ship-env", "--executor-cores", "4",
            "--executor-memory", "2g", "--conf", "spark.task.cpus=1", "jobs/train_mnist.py",
            "--strategy", "allreduce", "--num-workers", "8", "--input-mode", "spark",
            "--data", mnist, "--steps", "2", "--batch-size", "32",
            "--model-dir", f"{uri}/models/mnist-8", "--result-json", "/tmp/result-8.json",
            env=home,
        )  # fmt: skip
        pythons = {host: multihost.executor_pythons(cluster, host) for host in ("w1", "w2")}
    summary = json.loads(cluster.run("drv", "cat", "/tmp/result-8.json").stdout)
    assert (summary["final_step"], summary["strategy"]) == (2, "allreduce")
    fed = summary["fed_rows"]  # every process fed by Spark's tasks of its own host
    assert len(fed) == 8 and all(rows > 0 for rows in fed.values()), fed
    assert summary["export_dir"].startswith(uri)
    processes = summary["processes"]
    assert len(processes) == 8
    by_host = Counter(where["host"] for where in processes.values())
    assert by_host == {cluster.hosts["w1"]: 4, cluster.hosts["w2"]: 4}, by_host
    assert len({where["executor"] for where in processes.values()}) == 2
    for host in ("w1", "w2"):  # no TensorFlow process outlives the run
        tf = [l for l in multihost.listeners(cluster, host) if multihost.TF_PROCESS in str(l)]
        assert tf == [], tf
    multihost.on_driver(
        cluster, *SUBMIT_TWO, "jobs/predict.py",
        "--export", summary["export_dir"], "--input", f"{mnist}/test/parquet",
        "--output", f"{uri}/predictions/mnist",
    )  # fmt: skip
    assert multihost.count_rows(cluster, f"{uri}/predictions/mnist") == 16
    # each TensorFlow process ran the interpreter of the archive its executor unpacked
    for host, found in pythons.items():
        assert len(found) == 4, (host, found)
        unpacked = r"/tmp/work/app-[^/]+/\d+/(\./)?environment/bin/python3?[.\d]*"
        assert all(re.fullmatch(unpacked, python) for python in found), found
    # no keytab and no ticket cache reached the worker hosts: the executors ran on the token
    for host in ("w1", "w2"):
        find = ["find", "/tmp", "-name", "*.keytab", "-o", "-name", "krb5cc*"]
        found = cluster.run(host, *find).stdout
        assert found.strip() == "", found


def test_ps_from_files_across_hosts_and_an_outsider_reaches_nothing(cluster, mnist):
    """ps with its parameter server on the driver's host, the chief and the worker on the
    worker hosts, the worker reading its files from HDFS. While it trains, the outsider host
    tries every port the run listens on (the driver's and the executors' processes): none
    answers it but TensorFlow's gRPC servers, the documented exception. The driver's UI asks
    for the token sparktf gave its user, and answers with it."""
    uri = cluster.hdfs["HDFS_URI"]
    command = cluster.command(
        "drv", *SUBMIT, "jobs/train_mnist.py",
        "--strategy", "ps", "--num-workers", "1", "--num-ps", "1", "--input-mode", "files",
        "--data", mnist, "--steps", "400", "--batch-size", "8",
        "--model-dir", f"{uri}/models/mnist-ps", "--result-json", "/tmp/result-ps.json",
    )  # fmt: skip
    log = cluster.shared / "train-ps.log"
    ui_seen: list[str] = []

    def with_token(listener):  # the user, on the driver's host, with the token sparktf wrote
        if listener["host"] == "drv" and listener["port"] == 4040:
            env = cluster.driver_env()
            seen = cluster.run("drv", sys.executable, "-c", UI_WITH_TOKEN, env=env)
            ui_seen.append(seen.stdout if seen.returncode == 0 else seen.stdout + seen.stderr)

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
    assert (summary["final_step"], summary["input_mode"]) == (400, "files")
    hosts = {name: where["host"] for name, where in summary["processes"].items()}
    assert hosts["ps:0"] in cluster.known_as("drv")  # the driver's address: maybe its name
    assert {hosts["chief:0"], hosts["worker:0"]} == {cluster.hosts["w1"], cluster.hosts["w2"]}

    def where(a):
        return f"{a['host']}:{a['port']} ({a['commands'][0][:60] if a['commands'] else '?'})"

    tensorflow = [a for a in answers if any(multihost.TF_PROCESS in c for c in a["commands"])]
    others = [a for a in answers if a not in tensorflow]
    # the documented exception: TensorFlow's gRPC servers of ps:0, chief:0 and worker:0
    assert sorted(a["host"] for a in tensorflow) == ["drv", "w1", "w2"], (
        tensorflow,
        [(where(a), a["pids"], a["outcome"]) for a in others],
    )
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
for _ in range(600):  # written once the SparkContext is up, seconds after its UI listens
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
