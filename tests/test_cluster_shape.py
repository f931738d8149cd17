"""Any cluster shape: a run of N TensorFlow processes takes any N task slots of the session.

A session with more executors than the run needs just works (the others stay free for other
work), an executor with several task slots holds several processes, and only too few slots
is an error (``test_tracking.py`` fails a run of 3 on 2 slots). In the ``spark`` input mode a
feeding task writes to a process of its own host, whichever executor it runs in.
"""

from __future__ import annotations

import json
import sys

import pytest

from tests import helpers
from tests.conftest import ROOT
from tests.helpers import assert_nothing_left

pytestmark = pytest.mark.integration


def test_one_process_on_a_session_of_two_executors_fed_by_spark(spark, mnist_data, tmp_path):
    """One all-reduce worker on the suite's two executors: the barrier stage takes one slot,
    and the feeding tasks that run on the executor without a process feed the process of
    their host, so every row of the epoch reaches it."""
    from sparktf.spark import registered_executors
    from sparktf.train import RunConfig, ScalingConfig, TrainConfig, fit

    assert registered_executors(spark.sparkContext) == 2
    result = fit(
        TrainConfig(
            model="mnist_softmax",
            data=str(mnist_data / "data"),
            epochs=1,
            batch_size=10,
            input_mode="spark",
        ),
        ScalingConfig(strategy="allreduce", num_workers=1, threads_per_worker=1),
        RunConfig(model_dir=str(tmp_path / "model"), failure={"feed_timeout_s": 60.0}),
        spark=spark,
    )
    assert result.fed_rows == {"executor-0": 100}  # the epoch, from tasks on both executors
    assert result.final_step == 10
    assert_nothing_left()


@pytest.mark.e2e
def test_two_processes_in_one_executor_with_two_slots(mnist_data, tmp_path):
    """A profile whose one executor has two task slots (local-cluster[1,2,2048]): the job
    keeps it (it holds the run), both all-reduce processes run in that executor, fed by
    Spark, and train to the requested step."""
    profile = tmp_path / "two-slots.conf"
    local = (ROOT / "conf" / "spark" / "local.conf").read_text()
    profile.write_text(local + "\nspark.master local-cluster[1,2,2048]\n")
    result = tmp_path / "result.json"
    args = ["--profile", profile, "--strategy", "allreduce", "--num-workers", "2"]
    args += ["--input-mode", "spark", "--data", mnist_data / "data", "--steps", "4"]
    args += ["--batch-size", "8", "--model-dir", tmp_path / "model", "--result-json", result]
    command = [sys.executable, ROOT / "jobs" / "train_mnist.py", *args, "--log-level", "INFO"]
    run = helpers.run_command(command, cwd=ROOT, timeout=400)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "master local-cluster[1,2,2048]" in run.stderr  # not resized to two executors
    summary = json.loads(result.read_text())
    assert (summary["final_step"], summary["strategy"]) == (4, "allreduce")
    fed = summary["fed_rows"]
    assert len(fed) == 2 and all(rows > 0 for rows in fed.values()), fed  # both were fed
    assert_nothing_left()
