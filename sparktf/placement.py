"""Whether a run's executors fit the cluster, and executor sizes that do.

A training run needs one executor per TensorFlow process, all at once. When the cluster
cannot place them, Spark waits (standalone: the application stays WAITING; YARN: containers
stay pending) and the run would only fail at sparktf's registration deadline. This module
reads what the cluster offers (the standalone master's JSON API, the YARN ResourceManager's
REST API), says in numbers why an ask can never fit (``check``), and shrinks an ask that does
not fit to the largest that does (``fit``), which ``sparktf submit`` uses when the user did not
size the executors.

This is a bottom layer: it imports nothing of sparktf.
"""

from __future__ import annotations

import dataclasses
import json
import re
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sparktf.errors import SparktfError, SparktfValueError

__all__ = [
    "DYNAMIC",
    "declared_slots",
    "dynamic_allocation",
    "task_cpus",
    "task_slots",
    "Ask",
    "Cluster",
    "HTTP_TIMEOUT_S",
    "MIN_OVERHEAD_MB",
    "Node",
    "OVERHEAD_FRACTION",
    "PlacementError",
    "SMALLEST_MB",
    "STEP_MB",
    "ask_from_conf",
    "check",
    "cores_text",
    "fit",
    "get_json",
    "mb_text",
    "parse_mb",
    "placeable",
    "sizing_conf",
    "standalone_cluster",
    "yarn_cluster",
    "yarn_overhead_mb",
    "yarn_site",
    "yarn_webapp",
]

HTTP_TIMEOUT_S = 3.0
# Spark's executor memory overhead on YARN and Kubernetes when none is set: 10%, at least 384 MB.
MIN_OVERHEAD_MB = 384
OVERHEAD_FRACTION = 0.10
# fit() shrinks a container in steps of this many MB, never below SMALLEST_MB of heap.
STEP_MB = 128
SMALLEST_MB = 512


class PlacementError(SparktfError, RuntimeError):
    """The executors a run asks for cannot all be placed on the cluster (the message says why,
    in numbers)."""


@dataclass(frozen=True)
class Node:
    """What one standalone worker or YARN NodeManager has for executors, in all."""

    cores: int
    memory_mb: int


@dataclass(frozen=True)
class Cluster:
    """The resources of a cluster's nodes and, for YARN, its container limits. Placement is
    judged against all of them, not what is free now: an ask that fits waits for others to
    finish (Spark's way); one that can never fit fails at once."""

    kind: str  # "standalone" or "yarn"
    nodes: tuple[Node, ...]
    max_container_mb: int | None = None
    max_container_vcores: int | None = None
    min_container_mb: int = 1  # YARN rounds every container up to a multiple of this

    def describe(self) -> str:
        """'the 2 ALIVE workers offer 1 core and 1g each' (or each node's offer)."""
        what = "ALIVE worker" if self.kind == "standalone" else "RUNNING NodeManager"
        if not self.nodes:
            return f"the cluster has no {what}s"
        if len(self.nodes) == 1:
            node = self.nodes[0]
            return f"the 1 {what} offers {cores_text(node.cores)} and {mb_text(node.memory_mb)}"
        what += "s"
        offers = sorted({(n.cores, n.memory_mb) for n in self.nodes})
        if len(offers) == 1:
            cores, mb = offers[0]
            return f"the {len(self.nodes)} {what} offer {cores_text(cores)} and {mb_text(mb)} each"
        listed = ", ".join(f"{cores_text(n.cores)} and {mb_text(n.memory_mb)}" for n in self.nodes)
        return f"the {len(self.nodes)} {what} offer {listed}"


@dataclass(frozen=True)
class Ask:
    """What a Spark application asks: ``executors`` of ``cores`` and ``memory_mb`` (plus
    ``overhead_mb`` in the YARN container), and on YARN the application master's container."""

    executors: int
    cores: int
    memory_mb: int
    overhead_mb: int = 0
    am_mb: int = 0

    def describe(self) -> str:
        extra = f" (+{mb_text(self.overhead_mb)} overhead)" if self.overhead_mb else ""
        return f"each executor asks {cores_text(self.cores)} and {mb_text(self.memory_mb)}{extra}"


def cores_text(n: int) -> str:
    """1 -> '1 core', 4 -> '4 cores'."""
    return f"{n} core" if n == 1 else f"{n} cores"


def mb_text(mb: int) -> str:
    """512 -> '512m', 1024 -> '1g', 1536 -> '1536m' (Spark's memory notation)."""
    return f"{mb // 1024}g" if mb and mb % 1024 == 0 else f"{mb}m"


def parse_mb(text: str | int) -> int:
    """A Spark memory setting in MB: '8g' -> 8192, '512m' -> 512, '1024' -> 1024 (MB)."""
    match = re.fullmatch(r"\s*(\d+)\s*([kmgt]?)b?\s*", str(text).lower())
    if not match:
        raise SparktfValueError(f"not a memory size: {text!r} (expected e.g. 512m or 8g)")
    value, unit = int(match.group(1)), match.group(2) or "m"
    return {"k": value // 1024, "m": value, "g": value << 10, "t": value << 20}[unit]


def yarn_overhead_mb(memory_mb: int) -> int:
    """Spark's default memory overhead of an executor or AM container of ``memory_mb``."""
    return max(MIN_OVERHEAD_MB, int(memory_mb * OVERHEAD_FRACTION))


def _container_mb(cluster: Cluster, mb: int) -> int:
    unit = max(1, cluster.min_container_mb)
    return -(-mb // unit) * unit


def placeable(cluster: Cluster, ask: Ask) -> int:
    """How many of the ask's executors the cluster's nodes hold (the YARN AM first, on the
    node with the most memory)."""
    need_mb = _container_mb(cluster, ask.memory_mb + ask.overhead_mb)
    if cluster.max_container_mb is not None and need_mb > cluster.max_container_mb:
        return 0
    if cluster.max_container_vcores is not None and ask.cores > cluster.max_container_vcores:
        return 0
    nodes = sorted(cluster.nodes, key=lambda n: n.memory_mb, reverse=True)
    if ask.am_mb and nodes:
        am = _container_mb(cluster, ask.am_mb)
        first = nodes[0]
        nodes[0] = Node(first.cores - 1, first.memory_mb - am)
    return sum(
        max(0, min(n.cores // max(1, ask.cores), n.memory_mb // max(1, need_mb))) for n in nodes
    )


def check(cluster: Cluster, ask: Ask) -> None:
    """Raises PlacementError, with the numbers, when the ask's executors do not all fit."""
    fits = placeable(cluster, ask)
    if fits >= ask.executors:
        return
    limit = ""
    container = _container_mb(cluster, ask.memory_mb + ask.overhead_mb)
    if cluster.max_container_mb is not None and container > cluster.max_container_mb:
        limit = (
            f"; a container of {mb_text(container)} is over YARN's maximum allocation of "
            f"{mb_text(cluster.max_container_mb)}"
        )
    elif cluster.max_container_vcores is not None and ask.cores > cluster.max_container_vcores:
        limit = f"; YARN allows at most {cores_text(cluster.max_container_vcores)} per container"
    raise PlacementError(
        f"{ask.describe()}; {cluster.describe()}{limit}: {fits} of the {ask.executors} executors "
        "the run needs fit"
    )


def fit(cluster: Cluster, ask: Ask) -> Ask:
    """``ask`` when it fits; else the largest smaller ask that does: cores down to what a node
    has, then the container (heap and overhead in the ask's proportion) in 128 MB steps.
    Raises PlacementError when even the smallest executors do not fit."""
    if placeable(cluster, ask) >= ask.executors:
        return ask
    smallest = dataclasses.replace(
        ask, memory_mb=SMALLEST_MB, overhead_mb=MIN_OVERHEAD_MB if ask.overhead_mb else 0
    )
    cores = ask.cores
    while (
        cores > 1 and placeable(cluster, dataclasses.replace(smallest, cores=cores)) < ask.executors
    ):
        cores -= 1
    total = ask.memory_mb + ask.overhead_mb
    heap_share = ask.memory_mb / total if total else 1.0
    container = total
    while True:
        memory = max(SMALLEST_MB, int(container * heap_share) // STEP_MB * STEP_MB)
        overhead = 0 if not ask.overhead_mb else max(MIN_OVERHEAD_MB, container - memory)
        candidate = dataclasses.replace(ask, cores=cores, memory_mb=memory, overhead_mb=overhead)
        if placeable(cluster, candidate) >= ask.executors:
            return candidate
        if memory <= SMALLEST_MB:
            check(cluster, candidate)  # raises with the smallest ask's numbers
        container -= STEP_MB


# ----------------------------------------------------------------------------- reading clusters


def get_json(url: str) -> dict:
    """The JSON document at ``url`` (a few seconds at most)."""
    with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
        return json.load(response)


def standalone_cluster(webui_url: str) -> Cluster:
    """The cores and memory of the ALIVE workers, from the master's ``/json/`` page."""
    state = get_json(webui_url.rstrip("/") + "/json/")
    nodes = tuple(
        Node(int(w["cores"]), int(w["memory"]))
        for w in state.get("workers", [])
        if w.get("state") == "ALIVE"
    )
    return Cluster("standalone", nodes)


def yarn_site(conf_dir: str | Path) -> dict[str, str]:
    """The properties of ``conf_dir/yarn-site.xml`` (empty when absent)."""
    path = Path(conf_dir) / "yarn-site.xml"
    if not path.is_file():
        return {}
    root = ET.parse(path).getroot()
    return {
        p.findtext("name", "").strip(): p.findtext("value", "").strip()
        for p in root.iter("property")
    }


def yarn_webapp(site: dict[str, str]) -> str | None:
    """The ResourceManager's web address (``http://host:port``) of a yarn-site, or None."""
    address = site.get("yarn.resourcemanager.webapp.address")
    if not address and site.get("yarn.resourcemanager.hostname"):
        address = f"{site['yarn.resourcemanager.hostname']}:8088"
    return f"http://{address}" if address else None


def yarn_cluster(webapp: str, site: dict[str, str]) -> Cluster:
    """The memory and vcores of the RUNNING NodeManagers (the ResourceManager's REST API) and
    the container limits of ``site`` (Hadoop's defaults where it sets none)."""
    listed = (get_json(webapp.rstrip("/") + "/ws/v1/cluster/nodes").get("nodes") or {}).get(
        "node", []
    )
    nodes = tuple(
        Node(
            int(n.get("availableVirtualCores", 0)) + int(n.get("usedVirtualCores", 0)),
            int(n.get("availMemoryMB", 0)) + int(n.get("usedMemoryMB", 0)),
        )
        for n in listed
        if n.get("state") == "RUNNING"
    )
    return Cluster(
        "yarn",
        nodes,
        max_container_mb=int(site.get("yarn.scheduler.maximum-allocation-mb", 8192)),
        max_container_vcores=int(site.get("yarn.scheduler.maximum-allocation-vcores", 4)),
        min_container_mb=int(site.get("yarn.scheduler.minimum-allocation-mb", 1024)),
    )


def ask_from_conf(conf: dict[str, str], executors: int, *, yarn: bool) -> Ask:
    """The executors a Spark configuration asks for (on YARN with the containers' overhead
    and the client-mode application master)."""
    cores = int(conf.get("spark.executor.cores", "1"))
    memory = parse_mb(conf.get("spark.executor.memory", "1g"))
    if not yarn:
        return Ask(executors, cores, memory)
    given = conf.get("spark.executor.memoryOverhead")
    overhead = parse_mb(given) if given else yarn_overhead_mb(memory)
    am = parse_mb(conf.get("spark.yarn.am.memory", "512m"))
    am_given = conf.get("spark.yarn.am.memoryOverhead")
    am_total = am + (parse_mb(am_given) if am_given else yarn_overhead_mb(am))
    return Ask(executors, cores, memory, overhead, am_total)


def sizing_conf(ask: Ask) -> dict[str, str]:
    """The Spark settings of an ask's executor size (one task per executor)."""
    conf = {
        "spark.executor.cores": str(ask.cores),
        "spark.task.cpus": str(ask.cores),
        "spark.executor.memory": mb_text(ask.memory_mb),
    }
    if ask.overhead_mb:
        conf["spark.executor.memoryOverhead"] = mb_text(ask.overhead_mb)
    return conf


# ----------------------------------------------------------------------------- task slots

DYNAMIC = "spark.dynamicAllocation.enabled"
_LOCAL_CLUSTER = re.compile(r"local-cluster\[\s*(\d+)\s*,\s*(\d+)\s*,\s*\d+\s*\]")
_LOCAL = re.compile(r"local\[(\d+|\*)(?:,\s*\d+)?\]")


def task_cpus(conf: Mapping[str, str]) -> int:
    """``spark.task.cpus`` of the settings (at least 1)."""
    return max(1, _int(conf, "spark.task.cpus", 1))


def task_slots(executors: int, cores: int, cpus: int) -> int:
    """How many tasks ``executors`` of ``cores`` each run at once at ``cpus`` per task: the
    one formula of a cluster's task slots."""
    return executors * (cores // max(1, cpus))


def _int(conf: Mapping[str, str], key: str, default: int) -> int:
    try:
        return int(conf.get(key, default))
    except ValueError:
        return default


def declared_slots(conf: Mapping[str, str]) -> tuple[int, str] | None:
    """The task slots the settings give the application (how many tasks run at once) and how
    that number comes about, or None when the settings do not fix it (dynamic allocation, a
    standalone master without ``spark.cores.max``, no executor count)."""
    master = conf.get("spark.master", "")
    cpus = task_cpus(conf)
    per_task = f"spark.task.cpus={cpus}"
    m = _LOCAL_CLUSTER.fullmatch(master)
    if m:
        executors, cores = int(m.group(1)), int(m.group(2))
        how = f"{master}: {executors} executors x {cores} cores, {per_task}"
        return task_slots(executors, cores, cpus), how
    if _LOCAL.fullmatch(master) or master == "local":
        return None  # no executors at all: the executor check says so
    if dynamic_allocation(conf):
        return None
    if master.startswith("spark://") and "spark.cores.max" in conf:
        cores = _int(conf, "spark.cores.max", 0)
        return task_slots(1, cores, cpus), f"spark.cores.max={cores}, {per_task}"
    if master.startswith(("yarn", "k8s://")) and "spark.executor.instances" in conf:
        executors = _int(conf, "spark.executor.instances", 0)
        cores = _int(conf, "spark.executor.cores", 1)
        how = f"spark.executor.instances={executors} x spark.executor.cores={cores}, {per_task}"
        return task_slots(executors, cores, cpus), how
    return None


def dynamic_allocation(conf: Mapping[str, str]) -> bool:
    """Whether the settings turn Spark's dynamic allocation on."""
    return conf.get(DYNAMIC, "false").strip().lower() == "true"
