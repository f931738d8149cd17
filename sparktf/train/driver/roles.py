"""Which TensorFlow role each process of a run plays: pure functions over TensorFlowOnSpark's
cluster description, with no Spark, network or TensorFlow.

TensorFlowOnSpark places one node per executor and names it ``chief:0``, ``worker:i`` or
``ps:i``; a node's key here is ``executor-<executor id>``. Under ``allreduce`` its chief and
workers are the all-reduce workers as they are. Under ``ps`` the chief coordinates and every
other node is one of TensorFlowOnSpark's *ps* nodes (such a node keeps its executor busy for
the whole run): the first ``num_workers`` of them are TensorFlow's workers, the rest its
parameter servers. With ``ps_on_driver`` the parameter servers are processes of the driver,
keyed ``driver-ps-<i>``.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sparktf.errors import SparktfValueError
from sparktf.train.config import ScalingConfig
from sparktf.train.plan import Role

__all__ = [
    "DRIVER_PREFIX",
    "assign_roles",
    "chief_key",
    "driver_ps_count",
    "driver_ps_keys",
    "feeding_keys",
    "is_driver_key",
    "name_tf_tasks",
    "node_key",
    "placement",
    "tfos_ps_count",
    "training_keys",
]

DRIVER_PREFIX = "driver-"
_TF_TASK = re.compile(r"/job:(chief|worker|ps)/(?:replica:\d+/)?task:(\d+)")


def node_key(info: dict) -> str:
    """The key of one of TensorFlowOnSpark's nodes (an entry of its ``cluster_info``)."""
    return f"executor-{info['executor_id']}"


def placement(
    cluster_info: Sequence[dict], roles: dict[str, Role], driver_host: str
) -> dict[str, dict[str, str | None]]:
    """Where each process of the run is, by role name (``chief:0``): its host (the address
    its TensorFlow server is reached at) and its Spark executor (``host:port``; ``driver``
    for a parameter server of the driver)."""
    nodes = {node_key(info): info for info in cluster_info}
    where: dict[str, dict[str, str | None]] = {}
    for key, role in sorted(roles.items(), key=lambda kv: (kv[1].role, kv[1].index)):
        info = nodes.get(key)
        if info is None:  # a parameter server of the driver
            where[role.name] = {"host": driver_host, "executor": "driver"}
        else:
            where[role.name] = {"host": info["host"], "executor": info.get("executor")}
    return where


def is_driver_key(key: str) -> bool:
    """Whether ``key`` names a process of the driver (a parameter server)."""
    return key.startswith(DRIVER_PREFIX)


def tfos_ps_count(scaling: ScalingConfig) -> int:
    """How many of TensorFlowOnSpark's nodes must be *ps* nodes (its ``num_ps``): under
    ``ps`` the workers and the parameter servers that run on executors, else none."""
    if scaling.strategy != "ps":
        return 0
    return scaling.num_workers + (0 if scaling.ps_on_driver else scaling.num_ps)


def driver_ps_count(scaling: ScalingConfig) -> int:
    """How many parameter servers run on the driver."""
    return scaling.num_ps if scaling.strategy == "ps" and scaling.ps_on_driver else 0


def driver_ps_keys(scaling: ScalingConfig) -> list[str]:
    """The keys of the parameter servers that run on the driver, by index."""
    return [f"{DRIVER_PREFIX}ps-{i}" for i in range(driver_ps_count(scaling))]


def assign_roles(
    cluster_info: Sequence[dict],
    scaling: ScalingConfig,
    driver_ps_addresses: Sequence[str] = (),
) -> dict[str, Role]:
    """Every process's TensorFlow role and the cluster spec they share.

    ``cluster_info`` is TensorFlowOnSpark's list of nodes (``executor_id``, ``host``,
    ``port``, ``job_name``, ``task_index``); ``driver_ps_addresses`` holds one ``host:port``
    per parameter server on the driver (:func:`driver_ps_count`). Returns ``{key: Role}``;
    in the cluster spec every job lists its addresses by task index.

    Raises:
        ValueError: when ``driver_ps_addresses`` does not hold one address per parameter
            server on the driver.
    """
    expected = driver_ps_count(scaling)
    if len(driver_ps_addresses) != expected:
        raise SparktfValueError(
            f"{len(driver_ps_addresses)} addresses for {expected} parameter servers on the driver"
        )
    places: dict[str, tuple[str, int]] = {}
    addresses: dict[str, str] = {}
    for info in cluster_info:
        key = node_key(info)
        addresses[key] = f"{info['host']}:{info['port']}"
        job, index = info["job_name"], int(info["task_index"])
        if job == "chief":
            places[key] = ("chief", 0)
        elif scaling.strategy == "allreduce" or index < scaling.num_workers:
            places[key] = ("worker", index)
        else:
            places[key] = ("ps", index - scaling.num_workers)
    for i, (key, address) in enumerate(zip(driver_ps_keys(scaling), driver_ps_addresses)):
        places[key] = ("ps", i)
        addresses[key] = address
    cluster: dict[str, list[str]] = {"chief": [], "worker": [], "ps": []}
    for key, (role, _) in sorted(places.items(), key=lambda kv: kv[1]):
        cluster[role].append(addresses[key])
    cluster = {k: v for k, v in cluster.items() if v}
    return {
        key: Role(
            key=key,
            role=role,
            index=index,
            strategy=scaling.strategy,
            num_workers=scaling.num_workers,
            cluster=cluster,
        )
        for key, (role, index) in places.items()
    }


def chief_key(roles: dict[str, Role]) -> str:
    """The key of the chief.

    Raises:
        ValueError: when no role is the chief.
    """
    for key, role in roles.items():
        if role.is_chief:
            return key
    raise SparktfValueError("no process of the run is the chief")


def training_keys(roles: dict[str, Role]) -> list[str]:
    """The processes that run the training loop."""
    return [k for k, r in roles.items() if r.trains]


def feeding_keys(roles: dict[str, Role]) -> list[str]:
    """The processes that read rows from Spark (``spark`` input mode): the training
    processes on executors, by rank (process ``j`` is fed share ``j`` of each pass)."""
    fed = [k for k, r in roles.items() if not is_driver_key(k) and r.trains]
    return sorted(fed, key=lambda k: roles[k].rank)


def name_tf_tasks(text: str, roles: dict[str, Role]) -> list[tuple[str, str]]:
    """TensorFlow names processes ``/job:worker/task:0``; for each such name in ``text``
    (once, in order), the name and the key of the process it is."""
    named = []
    for job, index in dict.fromkeys(_TF_TASK.findall(text)):
        for key, role in roles.items():
            if (role.role, role.index) == (job, int(index)):
                named.append((f"/job:{job}/task:{index}", key))
    return named
