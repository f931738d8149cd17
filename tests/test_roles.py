"""Role assignment (sparktf.train.driver.roles): TensorFlowOnSpark's nodes to TensorFlow's roles and
the cluster spec, for both strategies and parameter servers on the driver. Pure functions:
no Spark, no JVM, no network."""

from __future__ import annotations

import pytest

from sparktf.train.config import ScalingConfig
from sparktf.train.driver import roles

pytestmark = pytest.mark.unit


def tfos_nodes(*jobs: tuple[str, int]) -> list[dict]:
    """TensorFlowOnSpark's cluster_info for nodes (job, task index) on executors 0, 1, ..."""
    return [
        {
            "executor_id": i,
            "host": f"host{i}",
            "port": 2000 + i,
            "job_name": job,
            "task_index": index,
            "addr": ("host", 4000 + i),
            "authkey": b"k",
        }
        for i, (job, index) in enumerate(jobs)
    ]


def places(assigned: dict) -> dict[str, str]:
    return {key: role.name for key, role in assigned.items()}


def test_allreduce_chief_and_workers_keep_their_places():
    scaling = ScalingConfig(strategy="allreduce", num_workers=3)
    info = tfos_nodes(("worker", 1), ("chief", 0), ("worker", 0))
    assigned = roles.assign_roles(info, scaling)
    assert places(assigned) == {
        "executor-0": "worker:1",
        "executor-1": "chief:0",
        "executor-2": "worker:0",
    }
    cluster = {"chief": ["host1:2001"], "worker": ["host2:2002", "host0:2000"]}
    for role in assigned.values():
        assert role.cluster == cluster and role.strategy == "allreduce" and role.num_workers == 3
    assert roles.chief_key(assigned) == "executor-1"
    assert sorted(roles.training_keys(assigned)) == ["executor-0", "executor-1", "executor-2"]
    assert sorted(roles.feeding_keys(assigned)) == ["executor-0", "executor-1", "executor-2"]
    assert [assigned[k].rank for k in ("executor-1", "executor-2", "executor-0")] == [0, 1, 2]
    assert roles.tfos_ps_count(scaling) == 0 and roles.driver_ps_count(scaling) == 0


def test_ps_nodes_are_first_the_workers_then_the_parameter_servers():
    scaling = ScalingConfig(strategy="ps", num_workers=2, num_ps=2)
    assert scaling.num_executors == 5 and roles.tfos_ps_count(scaling) == 4
    info = tfos_nodes(("chief", 0), ("ps", 3), ("ps", 0), ("ps", 2), ("ps", 1))
    assigned = roles.assign_roles(info, scaling)
    assert places(assigned) == {
        "executor-0": "chief:0",
        "executor-1": "ps:1",
        "executor-2": "worker:0",
        "executor-3": "ps:0",
        "executor-4": "worker:1",
    }
    assert assigned["executor-0"].cluster == {
        "chief": ["host0:2000"],
        "ps": ["host3:2003", "host1:2001"],
        "worker": ["host2:2002", "host4:2004"],
    }
    # Only the chief runs the training loop (the coordinator) and reads the feed.
    assert roles.training_keys(assigned) == ["executor-0"]
    assert roles.feeding_keys(assigned) == ["executor-0"]


def test_parameter_servers_on_the_driver():
    scaling = ScalingConfig(strategy="ps", num_workers=1, num_ps=2, ps_on_driver=True)
    assert scaling.num_executors == 2
    assert roles.tfos_ps_count(scaling) == 1 and roles.driver_ps_count(scaling) == 2
    info = tfos_nodes(("chief", 0), ("ps", 0))
    assigned = roles.assign_roles(info, scaling, ["driver:7000", "driver:7001"])
    assert places(assigned) == {
        "executor-0": "chief:0",
        "executor-1": "worker:0",
        "driver-ps-0": "ps:0",
        "driver-ps-1": "ps:1",
    }
    assert assigned["driver-ps-1"].cluster == {
        "chief": ["host0:2000"],
        "ps": ["driver:7000", "driver:7001"],
        "worker": ["host1:2001"],
    }
    assert roles.is_driver_key("driver-ps-0") and not roles.is_driver_key("executor-0")
    assert roles.feeding_keys(assigned) == ["executor-0"]
    with pytest.raises(ValueError, match="1 addresses for 2 parameter servers on the driver"):
        roles.assign_roles(info, scaling, ["driver:7000"])


def test_no_chief_is_an_error():
    scaling = ScalingConfig(strategy="allreduce", num_workers=1)
    assigned = roles.assign_roles(tfos_nodes(("worker", 0)), scaling)
    with pytest.raises(ValueError, match="no process of the run is the chief"):
        roles.chief_key(assigned)


def test_tensorflow_task_names_are_mapped_to_processes():
    scaling = ScalingConfig(strategy="ps", num_workers=1, num_ps=1)
    assigned = roles.assign_roles(tfos_nodes(("chief", 0), ("ps", 0), ("ps", 1)), scaling)
    text = (
        "UnavailableError: /job:ps/replica:0/task:0 unreachable; "
        "/job:worker/task:0 lost; /job:ps/replica:0/task:0 again; /job:worker/task:9"
    )
    assert roles.name_tf_tasks(text, assigned) == [
        ("/job:ps/task:0", "executor-2"),
        ("/job:worker/task:0", "executor-1"),
    ]
    assert roles.name_tf_tasks("no task named", assigned) == []


def test_placement_names_each_process_host_and_executor():
    scaling = ScalingConfig(strategy="ps", num_workers=1, num_ps=1, ps_on_driver=True)
    info = tfos_nodes(("chief", 0), ("ps", 0))
    info[0]["executor"], info[1]["executor"] = "host0:7001", "host1:7002"
    assigned = roles.assign_roles(info, scaling, ["drv:9000"])
    assert roles.placement(info, assigned, "drv") == {
        "chief:0": {"host": "host0", "executor": "host0:7001"},
        "ps:0": {"host": "drv", "executor": "driver"},
        "worker:0": {"host": "host1", "executor": "host1:7002"},
    }
