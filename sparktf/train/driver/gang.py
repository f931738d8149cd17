"""Gang scheduling: a run's TensorFlow nodes start in one Spark barrier stage.

A barrier stage launches all of its tasks together or none of them, so a run never holds
part of the cluster while it waits for the rest. The stage is a ``DataFrame.mapInArrow(...,
barrier=True)`` over ``spark.range(n)`` in ``n`` partitions: the same call on a classic
session and on a Spark Connect client, so both bring the cluster up the same way. Task ``i``
receives the one number ``i`` (TensorFlowOnSpark's executor id) and runs the node function.

Before it submits the stage, :func:`check_slots` compares the task slots the cluster has
(:func:`declared_slots` from the master and its settings; on a classic session also what the
scheduler reports) with the ``n`` the run needs, and fails at once naming both, rather than
letting the stage wait for slots that never come. Spark's own check (``[SPARK-24819]``) is
translated the same way.

The stage runs on a thread of the driver (the Connect client) under a job tag of its own
(``SparkSession.addTag``), so that it can be interrupted without touching other jobs.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from sparktf.placement import DYNAMIC, declared_slots, dynamic_allocation
from sparktf.remote import is_connect
from sparktf.train.errors import ConfigError

__all__ = [
    "SLOT_KEYS",
    "BarrierStage",
    "SlotsError",
    "busy_with_other_jobs",
    "carries",
    "check_slots",
    "conf_values",
    "dynamic_allocation_message",
    "node_task",
    "scheduler_slots",
    "slots_message",
]

log = logging.getLogger(__name__)

# The settings that size a cluster's task slots.
SLOT_KEYS = (
    "spark.master",
    "spark.task.cpus",
    "spark.executor.cores",
    "spark.executor.instances",
    "spark.cores.max",
    "spark.dynamicAllocation.enabled",
)
SPARK_SLOTS_CHECK = "SPARK-24819"  # Spark's message when a barrier stage cannot fit
SPARK_DYNAMIC_CHECK = "SPARK-24942"  # Spark's refusal of a barrier stage under dynamic allocation


class SlotsError(ConfigError):
    """The cluster has fewer task slots than the TensorFlow processes of the run."""


def conf_values(spark, keys: tuple[str, ...] = SLOT_KEYS) -> dict[str, str]:
    """The session's values of ``keys`` that are set, on a classic session or a Connect
    client alike."""
    if not is_connect(spark):
        conf = dict(spark.sparkContext.getConf().getAll())
        return {k: conf[k] for k in keys if k in conf}
    values = {}
    for key in keys:
        try:
            value = spark.conf.get(key, None)
        except Exception as exc:  # a setting the server will not tell
            log.debug("cannot read %s from the Connect server: %s", key, exc)
            value = None
        if value is not None:
            values[key] = value
    return values


def dynamic_allocation_message(needed: int) -> str:
    """Why the run cannot start under dynamic allocation."""
    return (
        f"the run's {needed} TensorFlow processes start together in one barrier stage, which "
        f"Spark refuses while dynamic allocation is on ({DYNAMIC}=true): turn it off and give "
        f"the application {needed} executors (spark.executor.instances)"
    )


def slots_message(needed: int, have: int | None, how: str) -> str:
    """Why the run cannot start: the slots it needs against those the cluster has."""
    has = (
        f"the cluster has {have} ({how})" if have is not None else f"the cluster has fewer ({how})"
    )
    return (
        f"the run needs {needed} task slots at once (one barrier task per TensorFlow process) "
        f"and {has}; give the application more executors or cores, or train with fewer "
        "processes (ScalingConfig / --num-executors)"
    )


def scheduler_slots(spark) -> tuple[int, int] | None:
    """A classic session's (task slots, tasks running) as the scheduler counts them now."""
    from sparktf.spark.failures import task_slots

    slots = task_slots(spark.sparkContext)
    if slots is None:  # another Spark version: Spark's own check remains
        return None
    try:
        jsc = spark.sparkContext._jsc.sc()
        running = sum(int(e.numRunningTasks()) for e in jsc.statusTracker().getExecutorInfos())
    except Exception as exc:
        log.debug("cannot read the tasks running: %s", exc)
        return None
    return slots, running


def carries(tags, own_tags) -> bool:
    """Whether a Spark job's ``tags`` hold one of ``own_tags``: as given to
    ``SparkSession.addTag``, or as a classic session hands it to the SparkContext (prefixed:
    ``spark-session-<id>-thread-<id>-<tag>``)."""
    return any(tag == own or tag.endswith("-" + own) for tag in tags for own in own_tags)


def busy_with_other_jobs(spark, own_tags=()) -> int | None:
    """The tasks a classic session runs now in Spark jobs that carry none of ``own_tags`` (a
    run's job tags: its barrier stages', its feed's; :func:`carries`), counted by stage;
    None when Spark does not say."""
    try:
        sc = spark.sparkContext
        tracker = sc.statusTracker()
        store = sc._jsc.sc().statusStore() if own_tags else None
        ours: set[int] = set()
        for job_id in tracker.getActiveJobsIds() if own_tags else ():
            try:  # a job that has just ended is no longer in the store
                tags = str(store.job(job_id).jobTags().mkString("\n")).split("\n")
            except Exception:
                continue
            info = tracker.getJobInfo(job_id)
            if info is not None and carries(tags, own_tags):
                ours.update(int(stage) for stage in info.stageIds)
        busy = 0
        for stage_id in tracker.getActiveStageIds():
            info = None if stage_id in ours else tracker.getStageInfo(stage_id)
            busy += int(info.numActiveTasks) if info is not None else 0
        return busy
    except Exception as exc:  # another Spark version, or the session is going away
        log.debug("cannot count the tasks of other jobs: %s", exc)
        return None


def check_slots(spark, needed: int, *, scheduler: bool = True, free_wait_s: float = 10.0) -> None:
    """Fails at once when the cluster cannot run ``needed`` tasks together.

    The settings' slots are checked first (any session). With ``scheduler``, on a classic
    session, the scheduler's count follows (its executors must be registered by then); slots
    busy with other tasks (other jobs of the session) are waited for up to ``free_wait_s``,
    with a log line every 15 s.

    Raises:
        SlotsError: naming the slots needed and those the cluster has, or dynamic allocation.
    """
    conf = conf_values(spark)
    if dynamic_allocation(conf):
        raise SlotsError(dynamic_allocation_message(needed))
    declared = declared_slots(conf)
    if declared is not None and declared[0] < needed:
        raise SlotsError(slots_message(needed, *declared))
    if not scheduler or is_connect(spark):
        return
    start = time.monotonic()
    next_log = start  # when to say again that it waits
    while True:
        counted = scheduler_slots(spark)
        if counted is None:
            return
        slots, running = counted
        if slots < needed:
            raise SlotsError(slots_message(needed, slots, "registered executors"))
        if slots - running >= needed:
            if next_log > start:  # it said it waited
                log.info(
                    "%d task slots free after %.0f s", slots - running, time.monotonic() - start
                )
            return
        busy = f"free of {slots}: {running} busy with other tasks"
        if time.monotonic() - start > free_wait_s:
            raise SlotsError(
                slots_message(needed, slots - running, busy)
                + f"; waited {free_wait_s:.0f} s (FailureConfig.startup_timeout_s)"
            )
        if time.monotonic() >= next_log:
            log.info(
                "waiting for %d free task slots (%d %s), at most %.0f s",
                needed, slots - running, busy, free_wait_s,
            )  # fmt: skip
            next_log = time.monotonic() + 15.0
        time.sleep(0.2)


def node_task(run: Callable[[Iterator[int]], Any], batches: Iterator) -> Iterator:
    """One barrier task (``mapInArrow``): runs ``run`` on the executor id of its partition
    and returns no rows."""
    ids = [int(i) for batch in batches for i in batch.column(0).to_pylist()]
    run(iter(ids))
    yield from ()


class BarrierStage:
    """``n`` tasks of ``run`` (each given its executor id) in one barrier stage, on a thread.

    ``error`` holds Spark's failure once the stage failed (with a too-small cluster: the slots
    message); ``interrupt`` cancels it.
    """

    SCHEMA = "node long"

    def __init__(self, spark, n: int, run: Callable[[Iterator[int]], Any], *, what: str):
        self.spark = spark
        self.n = n
        self.run = run
        self.what = what
        self.tag = f"sparktf-nodes-{uuid.uuid4().hex[:8]}"
        self.error: str | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> BarrierStage:
        self._thread = threading.Thread(target=self._run, name="sparktf-nodes", daemon=True)
        self._thread.start()
        return self

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def _run(self) -> None:
        spark = self.spark
        try:
            spark.addTag(self.tag)
            nodes = spark.range(0, self.n, 1, self.n)
            task = functools.partial(node_task, self.run)
            nodes.mapInArrow(task, self.SCHEMA, barrier=True).collect()
        except BaseException as exc:
            text = str(exc)
            if SPARK_DYNAMIC_CHECK in text:
                text = dynamic_allocation_message(self.n)
            elif SPARK_SLOTS_CHECK in text:
                declared = declared_slots(conf_values(spark))
                have, how = declared if declared else (None, "Spark's barrier check")
                text = slots_message(self.n, have, how)
            self.error = text
            log.debug("%s ended: %s", self.what, text)
        finally:
            try:
                spark.removeTag(self.tag)
            except Exception as exc:  # the session is gone
                log.debug("removing the job tag: %s", exc)

    def join(self, timeout_s: float) -> bool:
        """Waits up to ``timeout_s`` for the stage to end; whether it has."""
        if self._thread is not None:
            self._thread.join(max(0.0, timeout_s))
        return not self.running

    def interrupt(self) -> None:
        """Cancels the stage's Spark job (its tasks are interrupted)."""
        try:
            self.spark.interruptTag(self.tag)
        except Exception as exc:  # the session is gone
            log.debug("interrupting %s: %s", self.what, exc)
