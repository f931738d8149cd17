"""Foundation: Spark local-cluster against the real HDFS, the hdfs.sh script, TensorFlowOnSpark."""

from __future__ import annotations

import os

import psutil
import pytest

from sparktf import storage
from sparktf.ports import free_port
from tests import helpers
from tests.conftest import HDFS_SH, ROOT, descendants

pytestmark = pytest.mark.integration  # tests of another tier carry their own mark


def _executor_pids() -> set[int]:
    """Executor JVMs of this test session's Spark."""
    return descendants("CoarseGrainedExecutorBackend")


def test_spark_runs_separate_executor_processes(spark):
    pids = spark.sparkContext.parallelize(range(8), 4).map(lambda _: os.getpid()).distinct()
    assert len(_executor_pids()) == 2
    assert len(set(pids.collect())) >= 2  # Python workers of two executors, not the driver
    assert os.getpid() not in pids.collect()


def test_spark_parquet_on_hdfs_read_back_from_python(spark, hdfs):
    import pyarrow.parquet as pq

    out = hdfs.fresh("parquet")
    df = spark.range(0, 1000, numPartitions=4).selectExpr("id", "id * 2 AS twice")
    df.write.parquet(out)
    files = [f for f in storage.listdir(out) if f.endswith(".parquet")]
    assert len(files) == 4 and storage.exists(storage.join(out, "_SUCCESS"))
    rows = []
    for path in files:
        with storage.open_file(path, "rb") as f:
            rows.extend(pq.read_table(f).to_pylist())
    assert sorted(r["id"] for r in rows) == list(range(1000))
    assert all(r["twice"] == 2 * r["id"] for r in rows)
    assert spark.read.parquet(out).count() == 1000


def test_a_test_cut_short_in_a_py4j_call_leaves_the_session_to_the_next(spark):
    """What tests/conftest.py does when a test ends on an exception. pytest-timeout's alarm
    cuts a test short wherever it is, in a Py4J call too. That call's answer then waits on
    the connection, and every later call of the session's Spark reads the answer of the one
    before it. After the connection is dropped, the next call opens a new one."""
    import signal
    import time

    jsc = spark.sparkContext._jsc
    sleep = spark.sparkContext._jvm.java.lang.Thread.sleep  # one round trip per call

    def alarm(signum, frame):
        pytest.fail("Timeout")  # what pytest-timeout's handler does

    before = signal.signal(signal.SIGALRM, alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        with pytest.raises(pytest.fail.Exception) as cut:  # its traceback holds the connection
            sleep(1500)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, before)
    time.sleep(1.5)
    assert jsc.defaultParallelism() is None  # the sleep's answer: the calls are out of step
    assert helpers.drop_py4j_connection()
    assert jsc.defaultParallelism() == 2
    assert spark.range(10).count() == 10
    del cut


@pytest.mark.e2e
def test_second_hdfs_beside_the_first_and_stop_leaves_no_jvm(hdfs, tmp_path):
    args = [
        "--port",
        str(free_port()),
        "--http-port",
        str(free_port()),
        "--dir",
        str(tmp_path / "second"),
        "--conf-dir",
        str(tmp_path / "conf"),
    ]
    try:
        out = helpers.run_command(
            [HDFS_SH, "start", *args], capture_output=True, text=True, timeout=240, check=True
        )
        values = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
        assert values["HDFS_URI"] != hdfs.uri
        assert (tmp_path / "conf" / "core-site.xml").read_text().count(values["HDFS_URI"]) == 1
        pid = int((tmp_path / "second" / "hdfs.pid").read_text())
        again = helpers.run_command(
            [HDFS_SH, "start", *args], capture_output=True, text=True, timeout=60
        )
        assert again.returncode == 0 and "already running" in again.stderr
        status = helpers.run_command([HDFS_SH, "status", *args])
        assert status.returncode == 0 and "running" in status.stdout
        # Both answer, each with its own namespace.
        os.environ["SPARKTF_WEBHDFS_URL"], saved = values["WEBHDFS_URL"], hdfs.webhdfs_url
        try:
            storage.write_text(values["HDFS_URI"] + "/only-here.txt", "second")
        finally:
            os.environ["SPARKTF_WEBHDFS_URL"] = saved
        assert not storage.exists(hdfs.uri + "/only-here.txt")
    finally:
        stop = helpers.run_command(
            [HDFS_SH, "stop", *args], capture_output=True, text=True, timeout=120
        )
    assert stop.returncode == 0
    assert not psutil.pid_exists(pid)
    # No client configuration naming the stopped cluster stays behind.
    assert not (tmp_path / "conf" / "core-site.xml").exists()
    stopped = helpers.run_command([HDFS_SH, "stop", *args])
    assert stopped.returncode == 0 and "not running" in stopped.stdout
    status = helpers.run_command([HDFS_SH, "status", *args])
    assert status.returncode == 3 and "not running" in status.stdout


@pytest.mark.e2e
def test_tensorflowonspark_allreduce_smoke_through_submit(spark, tmp_path):
    """scripts/submit.sh runs a 2-node all-reduce TensorFlowOnSpark job fed from Spark.

    It runs as its own Spark application (spark-submit, local-cluster[2,1,1024]): the job
    must exit 0 by itself and leave no executor, TF server or port behind.
    """
    import json
    import socket

    before = _executor_pids()
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2")
    run = helpers.run_command(
        [ROOT / "scripts" / "submit.sh", str(ROOT / "tests" / "tfos_smoke.py"), str(out)],
        capture_output=True,
        text=True,
        timeout=400,
        env=env,
    )
    assert run.returncode == 0, run.stderr[-3000:]
    losses = [
        list(map(float, (out / name).read_text().split()))
        for name in sorted(os.listdir(out))
        if name.startswith("losses-")
    ]
    assert len(losses) == 2 and all(len(l) == 4 for l in losses)
    assert losses[0] == losses[1]  # synchronous all-reduce: both nodes see the same loss
    # Nothing left behind: no new executor JVM, no TF node process, the TF ports free.
    assert _executor_pids() == before
    assert not descendants("tfos_smoke")
    for port in json.loads((out / "ports.json").read_text()):
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
