"""No lost data: checkpoint retention across resumes, atomic run info, and a conversion whose
HDFS goes away (the storage layer's publish guarantees are in test_storage.py)."""

from __future__ import annotations

import json
import os
import posixpath
import re
import subprocess
import sys
import time

import pytest

from sparktf import storage
from sparktf.train import artifacts
from tests import helpers
from tests.conftest import HDFS_SH, ROOT, start_hdfs

pytestmark = pytest.mark.unit  # tests of another tier carry their own mark


@pytest.fixture(params=["local", pytest.param("hdfs", marks=pytest.mark.integration)])
def base(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "store")
    return request.getfixturevalue("hdfs").fresh("nolost")


def _names(directory: str) -> list[str]:
    return sorted(posixpath.basename(storage.parse(p).path) for p in storage.listdir(directory))


def _checkpoints(model_dir: str) -> tuple[list[str], list[str]]:
    """(the checkpoints with files in the model directory, those its state file lists)."""
    ckpt_dir = storage.join(model_dir, artifacts.CHECKPOINTS)
    stems = {n.split(".")[0] for n in _names(ckpt_dir) if n.startswith("ckpt-")}
    state = storage.read_text(storage.join(ckpt_dir, artifacts.STATE_FILE))
    listed = re.findall(r'^all_model_checkpoint_paths:\s*"([^"]+)"', state, re.M)
    return sorted(stems, key=lambda s: int(s.split("-")[1])), listed


def _run(model_dir: str, steps: list[int], *, keep: int, after_save=None) -> tuple[int, str]:
    """One run of a writer: attach (restore), save ``steps``; returns (restored step, prefix)."""
    import tensorflow as tf

    value = tf.Variable(0.0)
    global_step = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(value=value, global_step=global_step)
    md = artifacts.ModelDir(model_dir, writer=True)
    try:
        restored = md.attach(checkpoint, keep=keep)
        start = int(global_step.numpy())
        assert value.numpy() == float(start)
        for step in steps:
            value.assign(float(step))
            global_step.assign(step)
            md.save(step)
            if after_save is not None:
                after_save(step)
        return start, restored
    finally:
        md.close()


def test_checkpoint_retention_holds_across_resumes(base):
    import tensorflow as tf

    model_dir = storage.join(base, "model")
    start, restored = _run(model_dir, [1, 2, 3], keep=2)
    assert (start, restored) == (0, None)
    assert _checkpoints(model_dir) == (["ckpt-2", "ckpt-3"], ["ckpt-2", "ckpt-3"])

    # Remains of a save that died before its state file was published: never "newest".
    ckpt_dir = storage.join(model_dir, artifacts.CHECKPOINTS)
    storage.write_bytes(storage.join(ckpt_dir, "ckpt-9.data-00000-of-00001"), b"partial")

    seen = {}
    start, restored = _run(
        model_dir, [4, 5], keep=2, after_save=lambda s: seen.update({s: _checkpoints(model_dir)})
    )
    assert start == 3 and restored.endswith("ckpt-3")
    # The checkpoint restored from survives until a newer one is complete ...
    assert seen[4] == (["ckpt-3", "ckpt-4"], ["ckpt-3", "ckpt-4"])
    # ... and the run keeps exactly `keep` newest, whichever run wrote them.
    assert seen[5] == (["ckpt-4", "ckpt-5"], ["ckpt-4", "ckpt-5"])
    assert artifacts.latest_checkpoint_step(model_dir) == 5

    with storage.local_copy(ckpt_dir) as local:  # TensorFlow reads the state and the files
        state = tf.train.get_checkpoint_state(local)
        assert [os.path.basename(p) for p in state.all_model_checkpoint_paths] == [
            "ckpt-4",
            "ckpt-5",
        ]
        reader = tf.train.load_checkpoint(os.path.join(local, "ckpt-5"))
        assert reader.get_tensor("value/.ATTRIBUTES/VARIABLE_VALUE") == 5.0

    # A third run with a smaller `keep` trims to it at its first save.
    start, _ = _run(model_dir, [6], keep=1)
    assert start == 5
    assert _checkpoints(model_dir) == (["ckpt-6"], ["ckpt-6"])


def test_run_info_is_written_atomically(base):
    md = artifacts.ModelDir(storage.join(base, "model"), writer=True)
    try:
        md.finish({"final_step": 1})
        md.finish({"final_step": 2})
    finally:
        md.close()
    run_file = storage.join(base, "model", artifacts.RUN_FILE)
    assert json.loads(storage.read_text(run_file)) == {"final_step": 2}
    assert [n for n in _names(storage.join(base, "model")) if n.startswith(".")] == []


# ----------------------------------------------------------------------------- HDFS goes away


@pytest.mark.e2e
def test_hdfs_stopped_mid_conversion_fails_naming_hdfs_and_publishes_nothing(tmp_path, monkeypatch):
    from sparktf.datasets.synthetic import write_cifar10

    server, args = start_hdfs(tmp_path)  # our own HDFS: this test stops it
    try:
        raw = tmp_path / "raw"
        write_cifar10(raw, n_train=20000, n_test=2000, train_files=5)
        out = server.uri + "/data/cifar10"
        monkeypatch.setenv("SPARKTF_WEBHDFS_URL", server.webhdfs_url)
        storage.write_text(server.uri + "/data/kept.txt", "survives a restart")
        env = dict(
            os.environ,
            PYSPARK_PYTHON=sys.executable,
            SPARKTF_LOG_LEVEL="INFO",
            SPARKTF_WEBHDFS_URL=server.webhdfs_url,
            HADOOP_CONF_DIR=str(tmp_path / "hadoop-conf"),
        )
        log_path = tmp_path / "job.log"
        with open(log_path, "w") as log_file:
            job = subprocess.Popen(
                [
                    sys.executable,
                    str(ROOT / "jobs" / "convert_cifar10.py"),
                    "--input",
                    str(raw),
                    "--output",
                    out,
                    "--shards",
                    "8",
                ],
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                cwd=ROOT,
            )
            try:
                deadline = time.monotonic() + 300
                while "tasks done" not in log_path.read_text() and job.poll() is None:
                    assert time.monotonic() < deadline, log_path.read_text()[-3000:]
                    time.sleep(0.2)
                assert job.poll() is None, log_path.read_text()[-3000:]
                stopping = time.monotonic()  # the NameNode and DataNode get SIGTERM now
                helpers.run_command([HDFS_SH, "stop", *args], timeout=120)
                code = job.wait(timeout=600)
                took = time.monotonic() - stopping
            finally:
                if job.poll() is None:
                    job.kill()
                    job.wait()
        text = log_path.read_text()
        print(f"conversion exited {code} {took:.1f} s after HDFS was told to stop")
        assert code != 0, text[-3000:]
        assert took < 60, text[-3000:]  # generous: the error comes within seconds
        errors = [line for line in text.splitlines() if " ERROR " in line]
        assert errors and re.search(r"HDFS|NameNode", errors[-1]), text[-3000:]
        print("its error:", errors[-1])

        restarted = helpers.run_command(
            [HDFS_SH, "start", *args], capture_output=True, text=True, timeout=240
        )
        assert restarted.returncode == 0, restarted.stderr
        # Else "nothing published" below would prove nothing.
        assert storage.exists(server.uri + "/data/kept.txt"), (
            "the restarted HDFS lost its data (scripts/hdfs/MiniHdfs.java formats when "
            "name-0-1/current/VERSION is missing)"
        )
        assert storage.read_text(server.uri + "/data/kept.txt") == "survives a restart"
        assert not storage.exists(out)
        assert not storage.exists(out + "/manifest.json")
        left = [n for n in _names(server.uri + "/data") if n != "kept.txt"]
        print("left after the failed conversion:", left)
        assert all(n.startswith(".cifar10.") for n in left), left  # nothing published
        # The next publish to that path cleans what the failed one could not.
        with storage.publish(out) as tmp:
            storage.write_text(storage.join(tmp, "x"), "x")
        assert _names(server.uri + "/data") == ["cifar10", "kept.txt"]
    finally:
        helpers.run_command([HDFS_SH, "stop", *args], timeout=120)
