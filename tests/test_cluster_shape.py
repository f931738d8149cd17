"""Any cluster shape: a run of N TensorFlow processes takes any N task slots of the session.

A session with more executors than the run needs just works (the others stay free for other
work), an executor with several task slots holds several processes (``TrainResult.processes``
says where each ran), and only too few slots
is an error (``test_tracking.py`` fails a run of 3 on 2 slots). In the ``spark`` input mode a
feeding task writes to a process of its own host, whichever executor it runs in.
"""

from __future__ import annotations

import json
import logging
import sys
from collections import Counter

import pytest

from tests import helpers
from tests.conftest import ROOT
from tests.helpers import assert_nothing_left

pytestmark = pytest.mark.integration


SHAPES_SCRIPT = """
import json, sys
from sparktf.spark import get_session
from sparktf.train import RunConfig, ScalingConfig, TrainConfig, fit

data, out = sys.argv[1], sys.argv[2]
spark = get_session("shapes", overrides={"spark.master": "local-cluster[3,2,1024]"})
results = {}
for workers, mode in ((2, "spark"), (4, "files")):
    train = TrainConfig(model="mnist_softmax", data=data, steps=4, batch_size=8, input_mode=mode)
    scaling = ScalingConfig(strategy="allreduce", num_workers=workers, threads_per_worker=1)
    run = RunConfig(model_dir=f"{out}/model-{workers}", failure={"feed_timeout_s": 60.0})
    results[workers] = fit(train, scaling, run, spark=spark).to_dict()
spark.stop()
print(json.dumps(results))
"""


@pytest.mark.e2e
def test_two_and_four_processes_on_three_executors_of_two_slots(mnist_data, tmp_path):
    """A session of 3 executors with 2 task slots each (``local-cluster[3,2,1024]``, the
    Python API: nothing resizes it) trains 2 all-reduce workers fed by Spark, then 4 from
    files: two processes share an executor, and each run reaches its step."""
    script = tmp_path / "shapes.py"
    script.write_text(SHAPES_SCRIPT)
    run = helpers.run_command(
        [sys.executable, script, mnist_data / "data", tmp_path], cwd=ROOT, timeout=400
    )
    assert run.returncode == 0, run.stderr[-4000:]
    results = json.loads(run.stdout.strip().splitlines()[-1])
    two, four = results["2"], results["4"]
    assert (two["final_step"], four["final_step"]) == (4, 4)
    assert len(two["fed_rows"]) == 2 and all(rows > 0 for rows in two["fed_rows"].values())
    assert sorted(four["processes"]) == ["chief:0", "worker:0", "worker:1", "worker:2"]
    executors = Counter(where["executor"] for where in four["processes"].values())
    assert len(executors) <= 3 and max(executors.values()) == 2, executors
    assert all(where["host"] == "127.0.0.1" for where in four["processes"].values())
    assert_nothing_left()


def test_a_run_waits_for_slots_busy_with_another_job(spark, mnist_data, tmp_path, caplog):
    """Another job of the session holds both task slots when ``fit`` starts 2 all-reduce
    workers: the run waits for them, saying so, and trains once they are free (the other job
    lets them go when the run says it waits: no race with a busy machine's clock); the other
    job ends with its own result."""
    import threading
    import time

    from sparktf.train import RunConfig, ScalingConfig, TrainConfig, fit

    started, release = tmp_path / "started", tmp_path / "release"
    started.mkdir()

    def busy(index, _):  # in the executors: this machine's files
        (started / str(index)).touch()
        deadline = time.monotonic() + 120
        while not release.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        yield 1

    class ReleaseOnWait(logging.Handler):
        def emit(self, record):
            if "waiting for 2 free task slots" in record.getMessage():
                release.touch()

    other: list[int] = []
    worker = threading.Thread(
        target=lambda: other.append(
            spark.sparkContext.parallelize(range(2), 2).mapPartitionsWithIndex(busy).sum()
        )
    )
    worker.start()
    gang_log = logging.getLogger("sparktf.train.driver.gang")
    handler = ReleaseOnWait()
    gang_log.addHandler(handler)
    try:
        deadline = time.monotonic() + 120
        while len(list(started.iterdir())) < 2:  # both slots taken
            assert time.monotonic() < deadline, "the other job's tasks did not start"
            time.sleep(0.2)
        with caplog.at_level(logging.INFO, logger="sparktf.train.driver.gang"):
            result = fit(
                TrainConfig(
                    model="mnist_softmax", data=str(mnist_data / "data"), steps=2, batch_size=8
                ),
                ScalingConfig(strategy="allreduce", num_workers=2, threads_per_worker=1),
                RunConfig(model_dir=str(tmp_path / "model")),
                spark=spark,
            )
    finally:
        gang_log.removeHandler(handler)
        release.touch()
    worker.join(60)
    assert other == [2] and result.final_step == 2
    waited = [
        r.getMessage() for r in caplog.records if "waiting for 2 free task slots" in r.getMessage()
    ]
    assert waited and "busy with other tasks" in waited[0], waited
    assert_nothing_left()
