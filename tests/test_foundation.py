"""Foundation: Spark local-cluster against the real HDFS, the hdfs.sh script, TensorFlowOnSpark."""

from __future__ import annotations

import os
import subprocess
import time

import psutil
import pytest

from sparktf import storage
from tests.conftest import HDFS_SH, descendants, free_port

pytestmark = pytest.mark.spark


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


def test_second_hdfs_beside_the_first_and_stop_leaves_no_jvm(hdfs, tmp_path):
    args = ["--port", str(free_port()), "--http-port", str(free_port()),
            "--dir", str(tmp_path / "second"), "--conf-dir", str(tmp_path / "conf")]
    try:
        out = subprocess.run([str(HDFS_SH), "start", *args], capture_output=True, text=True,
                             timeout=240, check=True)
        values = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
        assert values["HDFS_URI"] != hdfs.uri
        assert (tmp_path / "conf" / "core-site.xml").read_text().count(values["HDFS_URI"]) == 1
        pid = int((tmp_path / "second" / "hdfs.pid").read_text())
        again = subprocess.run([str(HDFS_SH), "start", *args], capture_output=True, text=True,
                               timeout=60)
        assert again.returncode == 0 and "already running" in again.stderr
        status = subprocess.run([str(HDFS_SH), "status", *args], capture_output=True, text=True)
        assert status.returncode == 0 and "running" in status.stdout
        # Both answer, each with its own namespace.
        os.environ["SPARKTF_WEBHDFS_URL"], saved = values["WEBHDFS_URL"], hdfs.webhdfs_url
        try:
            storage.write_text(values["HDFS_URI"] + "/only-here.txt", "second")
        finally:
            os.environ["SPARKTF_WEBHDFS_URL"] = saved
        assert not storage.exists(hdfs.uri + "/only-here.txt")
    finally:
        stop = subprocess.run([str(HDFS_SH), "stop", *args], capture_output=True, text=True,
                              timeout=120)
    assert stop.returncode == 0
    assert not psutil.pid_exists(pid)
    stopped = subprocess.run([str(HDFS_SH), "stop", *args], capture_output=True, text=True)
    assert stopped.returncode == 0 and "not running" in stopped.stdout
    status = subprocess.run([str(HDFS_SH), "status", *args], capture_output=True, text=True)
    assert status.returncode == 3 and "not running" in status.stdout


def test_tensorflowonspark_allreduce_smoke(spark):
    """Two TF nodes on the two executors, data fed from Spark, a custom strategy.run loop."""
    from tensorflowonspark import TFCluster

    steps, batch = 4, 8

    def main_fun(args, ctx):
        import numpy as np
        import tensorflow as tf
        import keras

        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        with strategy.scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            optimizer = keras.optimizers.SGD(0.05)

        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(
                    tf.square(model(x)[:, 0] - y), global_batch_size=batch * 2)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        feed = ctx.get_data_feed(train_mode=True)
        losses = []
        for _ in range(args["steps"]):
            rows = np.array(feed.next_batch(batch), dtype=np.float32)
            per_replica = strategy.run(step, args=(rows[:, :4], rows[:, 4]))
            losses.append(float(strategy.reduce("SUM", per_replica, axis=None)))
        feed.terminate()
        with open(os.path.join(args["out"], f"losses-{ctx.task_index}-{ctx.job_name}"), "w") as f:
            f.write(" ".join(map(str, losses)))

    import tempfile

    out = tempfile.mkdtemp(prefix="tfos-smoke-")
    rng = __import__("numpy").random.default_rng(0)
    data = [[*map(float, x), float(x.sum())] for x in rng.normal(size=(steps * batch * 2, 4))]
    before = _executor_pids()
    cluster = TFCluster.run(spark.sparkContext, main_fun, {"steps": steps, "out": out},
                            num_executors=2, num_ps=0, input_mode=TFCluster.InputMode.SPARK,
                            master_node="chief", reservation_timeout=120)
    cluster.train(spark.sparkContext.parallelize(data, 2), num_epochs=1, feed_timeout=120)
    cluster.shutdown(grace_secs=5, timeout=120)
    results = sorted(os.listdir(out))
    assert len(results) == 2, results
    losses = [list(map(float, open(os.path.join(out, r)).read().split())) for r in results]
    assert all(len(l) == steps for l in losses)
    assert losses[0] == losses[1]  # synchronous all-reduce: both workers see the same loss
    # Nothing left behind: the same executors, no TF server still listening on the ports.
    assert _executor_pids() == before
    ports = {node["port"] for node in cluster.cluster_info}
    deadline = time.monotonic() + 30
    while True:
        held = {(c.laddr.port, c.pid) for c in psutil.net_connections("tcp")
                if c.status == psutil.CONN_LISTEN and c.laddr.port in ports}
        if not held or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert not held, [(port, psutil.Process(pid).cmdline()[:3]) for port, pid in held]
