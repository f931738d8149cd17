"""Gang-scheduled bring-up: the task slots a cluster declares, the check that fails a run that
cannot fit before anything starts, and TensorFlowOnSpark's roles by executor id.

The runs themselves (classic sessions) go through the barrier stage in every training test;
from a Spark Connect client in tests/test_connect.py.
"""

from __future__ import annotations

import time

import pytest

from sparktf import placement
from sparktf.train.driver import gang
from sparktf.train.driver.bringup import cluster_template
from tests.helpers import ConfSession, assert_nothing_left

pytestmark = pytest.mark.unit  # tests of another tier carry their own mark


@pytest.mark.parametrize(
    ("conf", "slots"),
    [
        ({"spark.master": "local-cluster[2,1,1024]"}, 2),
        ({"spark.master": "local-cluster[3, 4, 2048]", "spark.task.cpus": "2"}, 6),
        ({"spark.master": "local-cluster[2,1,1024]", "spark.task.cpus": "2"}, 0),
        ({"spark.master": "spark://h:7077", "spark.cores.max": "6", "spark.task.cpus": "2"}, 3),
        (
            {
                "spark.master": "yarn",
                "spark.executor.instances": "4",
                "spark.executor.cores": "2",
            },
            8,
        ),
        ({"spark.master": "k8s://https://api:6443", "spark.executor.instances": "3"}, 3),
    ],
)
def test_declared_slots_from_the_master_and_its_settings(conf, slots):
    have, how = placement.declared_slots(conf)
    assert have == slots
    assert how  # says where the number comes from


@pytest.mark.parametrize(
    "conf",
    [
        {"spark.master": "local[4]"},  # no executors: the executor check says so
        {"spark.master": "spark://h:7077"},  # the workers decide
        {
            "spark.master": "yarn",
            "spark.executor.instances": "2",
            "spark.dynamicAllocation.enabled": "true",
        },
        {"spark.master": "yarn"},
        {},
    ],
)
def test_no_declared_slots_where_the_settings_do_not_fix_them(conf):
    assert placement.declared_slots(conf) is None


def test_slots_message_names_both_numbers_and_what_to_change():
    text = gang.slots_message(3, 2, "local-cluster[2,1,1024]: 2 executors x 1 cores")
    assert "needs 3 task slots" in text and "the cluster has 2 (local-cluster[2,1,1024]" in text
    assert "--num-executors" in text


@pytest.mark.parametrize(
    ("executors", "ps", "expected"),
    [
        (2, 0, {"chief": [0], "worker": [1]}),
        (4, 0, {"chief": [0], "worker": [1, 2, 3]}),
        (2, 1, {"ps": [0], "chief": [1]}),
        (4, 2, {"ps": [0, 1], "chief": [2], "worker": [3]}),
    ],
)
def test_cluster_template_is_tensorflowonsparks_layout(executors, ps, expected):
    """The same roles by executor id as TensorFlowOnSpark's TFCluster.run with
    master_node="chief": the parameter servers first, then the chief, then the workers."""
    assert cluster_template(executors, ps) == expected


@pytest.mark.integration
def test_a_run_that_needs_more_slots_than_the_cluster_fails_at_once(spark, mnist_data, tmp_path):
    """The session has two one-core executors; three all-reduce workers cannot start together.
    The run fails before any TensorFlow process starts (instead of waiting out the executor
    deadline), naming 3 and 2."""
    from sparktf.train import RunConfig, ScalingConfig, TrainConfig, fit

    started = time.monotonic()
    with pytest.raises(gang.SlotsError) as caught:
        fit(
            TrainConfig(model="mnist_mlp", data=str(mnist_data / "data"), batch_size=9, steps=3),
            ScalingConfig(strategy="allreduce", num_workers=3, threads_per_worker=1),
            RunConfig(model_dir=str(tmp_path / "model")),
            spark=spark,
        )
    took = time.monotonic() - started
    text = str(caught.value)
    assert "needs 3 task slots" in text and "the cluster has 2" in text
    assert took < 60, f"took {took:.0f} s: the check did not fail fast"
    assert_nothing_left()


# The unit tests below: a session's settings (ConfSession), the scheduler's count
# monkeypatched (a real one is in the integration test above).


@pytest.mark.integration
def test_the_tasks_of_other_jobs_are_told_from_the_runs_own_by_their_tags(spark, tmp_path):
    """What the elastic decisions read of a real session (local-cluster, 2 slots): one slot
    held by a job the run tagged (as its barrier stage and its feed tag theirs, from a thread
    of their own) and the other by a job the run did not start: one task is another job's,
    one slot is the run's to have; without the run's tags both tasks count."""
    import functools
    import threading
    import uuid

    from sparktf.train.driver import elastic

    ours, theirs = (f"{who}-{uuid.uuid4().hex[:8]}" for who in ("sparktf-nodes", "another"))
    release = tmp_path / "release"  # the executors are on this machine

    def hold(batches, until: str):
        import os
        import time

        deadline = time.monotonic() + 120
        while not os.path.exists(until) and time.monotonic() < deadline:
            time.sleep(0.1)
        yield from batches

    def job(tag: str) -> None:
        spark.addTag(tag)
        try:
            task = functools.partial(hold, until=str(release))
            spark.range(0, 1, 1, 1).mapInArrow(task, "id long").collect()
        finally:
            spark.removeTag(tag)

    threads = [threading.Thread(target=job, args=(tag,), daemon=True) for tag in (ours, theirs)]
    for thread in threads:
        thread.start()
    try:
        deadline = time.monotonic() + 60
        while gang.busy_with_other_jobs(spark) != 2 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert gang.busy_with_other_jobs(spark) == 2
        assert gang.busy_with_other_jobs(spark, {ours}) == 1
        assert elastic.free_for_run(spark, {ours}) == 1
        assert elastic.free_for_run(spark, {ours, theirs}) == 2
    finally:
        release.touch()
        for thread in threads:
            thread.join(30)
    assert not any(thread.is_alive() for thread in threads)


def test_the_scheduler_count_fails_a_run_that_cannot_fit_and_waits_for_busy_slots(monkeypatch):
    spark = ConfSession({"spark.master": "spark://h:7077"})  # the settings fix no count
    counts = iter([(4, 3), (4, 3), (4, 1)])  # 4 slots, 3 then 1 busy with another job
    monkeypatch.setattr(gang, "scheduler_slots", lambda s: next(counts))
    gang.check_slots(spark, 3, free_wait_s=5.0)  # returns once 3 are free
    monkeypatch.setattr(gang, "scheduler_slots", lambda s: (2, 0))
    with pytest.raises(gang.SlotsError, match=r"needs 3 task slots .* the cluster has 2 \("):
        gang.check_slots(spark, 3)
    monkeypatch.setattr(gang, "scheduler_slots", lambda s: (4, 2))
    with pytest.raises(gang.SlotsError, match=r"has 2 \(free of 4: 2 busy with other tasks\)"):
        gang.check_slots(spark, 3, free_wait_s=0.3)
    gang.check_slots(spark, 3, scheduler=False)  # the settings alone: nothing to say


def test_dynamic_allocation_is_refused_before_anything_starts():
    spark = ConfSession({"spark.master": "yarn", "spark.dynamicAllocation.enabled": "true"})
    with pytest.raises(gang.SlotsError, match="spark.dynamicAllocation.enabled=true"):
        gang.check_slots(spark, 2, scheduler=False)


class _FailingFrame:
    def __init__(self, error):
        self.error = error

    def mapInArrow(self, *args, **kwargs):  # noqa: N802 (DataFrame API)
        return self

    def collect(self):
        raise self.error


class _StageSession(ConfSession):
    """A session whose barrier stage fails with Spark's ``error``; records its job tags."""

    def __init__(self, pairs, error):
        super().__init__(pairs)
        self.error = error
        self.tags: list[tuple[str, str]] = []

    def range(self, *args):
        return _FailingFrame(self.error)

    def addTag(self, tag):  # noqa: N802 (SparkSession API)
        self.tags.append(("add", tag))

    def removeTag(self, tag):  # noqa: N802 (SparkSession API)
        self.tags.append(("remove", tag))


@pytest.mark.parametrize(
    ("spark_says", "we_say"),
    [
        (
            "[SPARK-24819]: Barrier execution mode does not allow run a barrier stage that "
            "requires more slots than the total number of slots in the cluster currently.",
            "needs 3 task slots at once (one barrier task per TensorFlow process) and the "
            "cluster has fewer (Spark's barrier check)",
        ),
        (
            "[SPARK-24942]: Barrier execution mode does not support dynamic resource allocation",
            "spark.dynamicAllocation.enabled=true",
        ),
        ("Job aborted: the node failed", "Job aborted: the node failed"),
    ],
)
def test_a_failed_barrier_stage_says_why_in_sparktfs_words(spark_says, we_say):
    spark = _StageSession({"spark.master": "spark://h:7077"}, RuntimeError(spark_says))
    stage = gang.BarrierStage(spark, 3, lambda ids: None, what="the nodes").start()
    assert stage.join(10.0)
    assert we_say in stage.error
    assert spark.tags == [("add", stage.tag), ("remove", stage.tag)]


def test_a_barrier_task_runs_its_function_on_its_executor_id():
    import pyarrow as pa

    seen = []
    batches = [pa.RecordBatch.from_pydict({"id": [2]})]
    assert list(gang.node_task(lambda ids: seen.extend(ids), iter(batches))) == []
    assert seen == [2]
