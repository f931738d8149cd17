"""sparktf across hosts on a Kerberized HDFS: the cluster of ``tests/test_multihost.py``
(HDFS on nn, a standalone master, two workers, the driver's host; Spark's authentication and
encryption on), with HDFS secured by a KDC and every host named ``HOST.NAME.test``: the
services' principals are ``hdfs/nn.NAME.test`` and ``HTTP/nn.NAME.test``. The user has what a
site gives: krb5.conf, their keytab on the driver's host, the Hadoop configuration. The
executors have no keytab: they read and write HDFS with the run's delegation token."""

from __future__ import annotations

import json

import pytest

from tests import multihost

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def cluster():
    with multihost.started(kerberos=True) as made:
        yield made


def test_convert_train_predict_on_a_kerberized_hdfs_across_hosts(cluster):
    uri = cluster.hdfs["HDFS_URI"]
    assert uri.startswith(f"hdfs://{cluster.name_of('nn')}:")  # the NameNode by its name
    data = multihost.convert_mnist(cluster, multihost.SUBMIT)
    multihost.on_driver(
        cluster, *multihost.SUBMIT, "jobs/train_mnist.py",
        "--strategy", "allreduce", "--num-workers", "2", "--input-mode", "files",
        "--data", data, "--steps", "4", "--batch-size", "8",
        "--model-dir", f"{uri}/models/mnist", "--result-json", "/tmp/result.json",
    )  # fmt: skip
    summary = json.loads(cluster.run("drv", "cat", "/tmp/result.json").stdout)
    assert summary["final_step"] == 4 and summary["export_dir"].startswith(uri)
    hosts = {where["host"] for where in summary["processes"].values()}
    assert hosts == {cluster.hosts["w1"], cluster.hosts["w2"]}
    multihost.on_driver(
        cluster, *multihost.SUBMIT, "jobs/predict.py",
        "--export", summary["export_dir"], "--input", f"{data}/test/parquet",
        "--output", f"{uri}/predictions/mnist",
    )  # fmt: skip
    assert multihost.count_rows(cluster, f"{uri}/predictions/mnist") == 16
    # no keytab reached the worker hosts: their executors ran on the delegation token
    for host in ("w1", "w2"):
        found = cluster.run(host, "sh", "-c", "find /tmp -name '*.keytab' | head -3").stdout
        assert found.strip() == "", found
