"""Gang-scheduled bring-up: the task slots a cluster declares, the check that fails a run that
cannot fit before anything starts, and TensorFlowOnSpark's roles by executor id.

The runs themselves (classic sessions) go through the barrier stage in every training test;
from a Spark Connect client in tests/test_connect.py.
"""

from __future__ import annotations

import time

import pytest

from sparktf.train import gang
from sparktf.train.tfos_cluster import cluster_template
from tests.helpers import assert_nothing_left


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
    have, how = gang.declared_slots(conf)
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
    assert gang.declared_slots(conf) is None


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
