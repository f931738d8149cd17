"""Elastic runs on a real Spark standalone cluster of three one-core workers
(scripts/spark-cluster.sh), as a user runs them: ``scripts/submit.sh --profile standalone
jobs/train_mnist.py --num-workers MIN:MAX``.

Mid-run a worker JVM is killed with SIGKILL (its executor goes with it). The run goes on from
its latest checkpoint with the workers that can be placed, without waiting for the worker;
``spark-cluster.sh start-worker`` brings it back and the run grows again at its next
checkpoint. It finishes the steps asked for; the step counter never goes back more than one
checkpoint interval (after the loss) and not at all at the planned grow. Losing workers below
``MIN`` fails the job within ``--below-min-timeout``, naming what happened.

These tests run on the second stack in CI (``-m elastic``, beside the default stack's suite:
scripts/test.sh), where they fit in the time the first stack takes anyway.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from sparktf.datasets.synthetic import write_mnist
from tests import helpers
from tests.test_standalone import cluster_jvms, cluster_sh, parse_env

pytestmark = [pytest.mark.e2e, pytest.mark.elastic]

ROOT = Path(__file__).resolve().parent.parent
SUBMIT_SH = ROOT / "scripts" / "submit.sh"
EVERY = 100  # steps between checkpoints
STEPS = 4000  # long enough, at a few hundred tiny steps a second, to lose and regain a worker


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """Three workers of one core, the daemons of this test's Python (either stack), and a
    tiny MNIST converted to local files."""
    base = tmp_path_factory.mktemp("elastic")
    directory = base / "cluster"
    env = {
        **os.environ,
        "SPARKTF_HOME": str(base / "home"),
        "SPARKTF_SPARK_CLUSTER_DIR": str(directory),
        "SPARKTF_PYTHON": sys.executable,
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    write_mnist(base / "raw", n_train=240, n_test=12)
    command = [sys.executable, "jobs/convert_mnist.py", "--input", f"file://{base}/raw"]
    command += ["--output", f"file://{base}/data", "--shards", "2"]
    converted = helpers.run_command(command, cwd=ROOT, env=env, timeout=300)
    assert converted.returncode == 0, converted.stderr[-3000:]
    try:
        started = cluster_sh("start", "--workers", "3", "--dir", str(directory), env=env)
        assert started.returncode == 0, started.stderr[-3000:]
        yield {"dir": directory, "env": env, "data": f"file://{base}/data", "base": base,
               **parse_env(started.stdout)}  # fmt: skip
    finally:
        stopped = cluster_sh("stop", "--dir", str(directory), env=env, timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        assert cluster_jvms(directory) == []


class Job:
    """A training job through submit.sh, in a session of its own (killed whole if left)."""

    def __init__(self, cluster, name: str, *flags: str):
        self.cluster = cluster
        self.model_dir = cluster["base"] / name
        self.log_path = cluster["base"] / f"{name}.log"
        self.result_path = cluster["base"] / f"{name}.json"
        command = ["bash", str(SUBMIT_SH), "--profile", "standalone", "jobs/train_mnist.py"]
        command += ["--data", cluster["data"], "--model-dir", f"file://{self.model_dir}"]
        command += ["--batch-size", "12", "--checkpoint-every", str(EVERY), "--eval-split", "none"]
        command += ["--input-mode", "files", "--threads-per-worker", "1", "--grow-after", "3"]
        command += ["--result-json", str(self.result_path), *flags]
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                command, cwd=ROOT, env=cluster["env"], stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    @property
    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, what, timeout_s: float = 300.0):
        """Polls ``what()`` until it is truthy; fails (with the log) if the job ends first."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = what()
            if found:
                return found
            assert self.proc.poll() is None, f"the job ended early:\n{self.log[-5000:]}"
            time.sleep(0.2)
        raise AssertionError(f"not within {timeout_s} s:\n{self.log[-5000:]}")

    def checkpoints(self) -> list[int]:
        found = (self.model_dir / "checkpoints").glob("ckpt-*.index")
        return sorted(int(p.name.split("-")[1].split(".")[0]) for p in found)

    def worker_of(self, role: str) -> tuple[int, int]:
        """(worker number, JVM pid) of the standalone worker whose executor runs ``role`` in
        the latest attempt (the executor's address from the driver's log)."""
        where = re.findall(rf"  {role}\s+\S+ on \S+ \(executor [\d.]+:(\d+)\)", self.log)
        port = int(where[-1])
        pids = {int(p.read_text()): p.stem for p in (self.cluster["dir"] / "pids").glob("worker-*")}
        # the executor's end of its connection to the driver; other processes of the machine
        # (other tests' applications) may use the same port number on another address
        for socket in psutil.net_connections("inet"):
            if not (socket.laddr and socket.laddr.port == port and socket.pid):
                continue
            with contextlib.suppress(psutil.Error):
                for ancestor in psutil.Process(socket.pid).parents():
                    if ancestor.pid in pids:
                        return int(pids[ancestor.pid].split("-")[1]), ancestor.pid
        raise AssertionError(f"no worker of this cluster holds the executor at port {port}")

    def finish(self, timeout_s: float = 400.0) -> int | None:
        """The job's exit code; a job still running after ``timeout_s`` is killed whole
        (None)."""
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)
            return None


def start_worker(cluster, number: int) -> float:
    """Brings worker ``number`` back (as a user would); returns when it started."""
    began = time.time()
    back = cluster_sh(
        "start-worker", "--worker", str(number), "--dir", str(cluster["dir"]), env=cluster["env"]
    )
    assert back.returncode == 0, back.stderr[-2000:]
    return began


def workers_in_tensorboard(model_dir: Path) -> list[tuple[int, int]]:
    """(step, workers) of every ``elastic/workers`` scalar the chief wrote."""
    import tensorflow as tf

    found = []
    for path in sorted((model_dir / "events" / "train").glob("events.out.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag == "elastic/workers":
                    found.append((event.step, int(tf.make_ndarray(value.tensor))))
    return sorted(found)


def lose_and_regain(cluster, name: str, role: str, *flags: str) -> tuple[dict, dict]:
    """Runs an elastic job; kills the worker JVM under ``role`` after the first checkpoint,
    starts it again once the run has shrunk. The result and the timings."""
    job = Job(cluster, name, "--steps", str(STEPS), *flags)
    try:
        job.wait_for(lambda: job.checkpoints() and f"  {role}" in job.log)
        number, pid = job.worker_of(role)
        os.kill(pid, signal.SIGKILL)
        killed = time.time()
        job.wait_for(lambda: "elastic run: shrink from" in job.log, timeout_s=120)
        back = start_worker(cluster, number)
        assert job.finish() == 0, job.log[-6000:]
    finally:
        job.finish(0)
    result = json.loads(job.result_path.read_text())
    return result, {"killed": killed, "back": back, "model_dir": job.model_dir, "log": job.log}


def assert_steps_never_repeat_beyond_one_interval(result: dict) -> None:
    shrink, grow = result["resizes"]
    # the loss: back to the last checkpoint, less than one interval of steps trained again
    assert shrink["resumed_from_step"] % EVERY == 0
    assert 0 <= shrink["step"] - shrink["resumed_from_step"] <= EVERY
    # the planned grow: from the checkpoint where every process stopped, nothing repeated
    assert grow["resumed_from_step"] == grow["step"] and grow["step"] % EVERY == 0
    assert grow["step"] > shrink["resumed_from_step"]
    assert result["final_step"] == STEPS and result["restarts"] == []


def assert_went_on_without_the_worker(result: dict, seen: dict) -> None:
    """The smaller run was decided before the worker was started again (the test starts it
    only then), it trained (the grow came steps later), and it took under a minute."""
    shrink, grow = result["resizes"]
    assert seen["killed"] < shrink["time"] < seen["back"]
    assert grow["step"] > shrink["resumed_from_step"]
    assert shrink["training_again_at"] - seen["killed"] < 60
    assert grow["training_again_at"] > seen["back"]


def test_allreduce_run_shrinks_on_a_lost_worker_and_grows_back(cluster):
    flags = ("--strategy", "allreduce", "--num-workers", "1:3")
    result, seen = lose_and_regain(cluster, "allreduce", "worker:0", *flags)
    shrink, grow = result["resizes"]
    assert (shrink["kind"], shrink["from"], shrink["to"]) == ("shrink", 3, 2)
    assert (grow["kind"], grow["from"], grow["to"]) == ("grow", 2, 3)
    assert "failed" in shrink["reason"] and "task slots free" in grow["reason"]
    assert_steps_never_repeat_beyond_one_interval(result)
    assert sorted(result["processes"]) == ["chief:0", "worker:0", "worker:1"]
    assert_went_on_without_the_worker(result, seen)
    assert grow["training_again_at"] > seen["back"]
    sizes = workers_in_tensorboard(seen["model_dir"])
    assert sizes == [(0, 3), (shrink["resumed_from_step"], 2), (grow["step"], 3)]
    assert "elastic run: grow from 2 to 3 workers" in seen["log"]
    print(
        f"allreduce: kill -> training at 2: {shrink['training_again_at'] - seen['killed']:.1f} s;"
        f" worker started -> training at 3: {grow['training_again_at'] - seen['back']:.1f} s"
    )


def test_ps_run_shrinks_on_a_lost_worker_and_grows_back(cluster):
    """ps fed by Spark: the chief and the workers are placed again at each resize, the
    parameter server stays on the driver."""
    flags = ("--strategy", "ps", "--ps-on-driver", "--num-workers", "1:2")
    # fed by Spark (the all-reduce run reads files): both input modes go through resizes
    result, seen = lose_and_regain(cluster, "ps", "worker:1", *flags, "--input-mode", "spark")
    shrink, grow = result["resizes"]
    assert (shrink["from"], shrink["to"], grow["from"], grow["to"]) == (2, 1, 1, 2)
    assert_steps_never_repeat_beyond_one_interval(result)
    assert sorted(result["processes"]) == ["chief:0", "ps:0", "worker:0", "worker:1"]
    assert result["processes"]["ps:0"]["executor"] == "driver"
    assert_went_on_without_the_worker(result, seen)
    print(
        f"ps: kill -> training at 1 worker: {shrink['training_again_at'] - seen['killed']:.1f} s;"
        f" worker started -> training at 2: {grow['training_again_at'] - seen['back']:.1f} s"
    )


def test_losing_workers_below_the_minimum_fails_within_the_bound(cluster):
    """Two of three workers lost, min 2: no slots come back, the job fails after
    --below-min-timeout, naming the bound and the loss. (Last: the cluster stays short.)"""
    flags = ("--strategy", "allreduce", "--steps", "100000", "--num-workers", "2:3")
    job = Job(cluster, "below", *flags, "--below-min-timeout", "10")
    try:
        job.wait_for(lambda: job.checkpoints() and "  worker:1" in job.log)
        victims = [job.worker_of(role)[1] for role in ("worker:0", "worker:1")]
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        killed = time.monotonic()
        code = job.finish(timeout_s=180)
        took = time.monotonic() - killed
    finally:
        job.finish(0)
    assert code not in (None, 0)  # it ended by itself, failing
    error = next(line for line in job.log.splitlines() if "ERROR sparktf: TrainingError" in line)
    assert "the elastic run needs task slots for at least 2 workers" in error
    assert "(--below-min-timeout) after: " in error and "failed" in error
    assert not job.result_path.exists()
    # detection (heartbeats, the barrier stage) + 10 s of waiting + taking the run down
    assert took < 10 + 60, took
    assert job.checkpoints()  # what was trained is kept for a rerun
