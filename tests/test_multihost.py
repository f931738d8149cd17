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
import sys
from pathlib import Path

import pytest

from tests import helpers, multihost
from tests.conftest import ROOT

pytestmark = pytest.mark.e2e


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


def test_convert_train_predict_across_hosts(cluster):
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
    submit = [ROOT / "scripts" / "submit.sh", "--profile", "standalone"]
    _on_driver(cluster, *submit, "jobs/convert_mnist.py", "--input", raw, "--output", data)
    _on_driver(
        cluster, *submit, "jobs/train_mnist.py",
        "--strategy", "allreduce", "--num-workers", "2", "--input-mode", "files",
        "--data", data, "--steps", "4", "--batch-size", "8",
        "--model-dir", f"{uri}/models/mnist", "--result-json", "/tmp/result.json",
    )  # fmt: skip
    summary = json.loads(cluster.run("drv", "cat", "/tmp/result.json").stdout)
    assert (summary["final_step"], summary["strategy"]) == (4, "allreduce")
    assert summary["export_dir"].startswith(uri)
    _on_driver(
        cluster, *submit, "jobs/predict.py",
        "--export", summary["export_dir"], "--input", f"{data}/test/parquet",
        "--output", f"{uri}/predictions/mnist",
    )  # fmt: skip
