"""Elastic runs: how many workers an attempt gets, and when a running one grows.

An elastic run (``ScalingConfig.min_workers`` below ``num_workers``) is a sequence of
attempts, each a whole TensorFlow cluster of a fixed size started from the run's resume
point (:mod:`sparktf.train.driver.attempts`, the one loop of ``fit`` and ``run(train_fn)``).
Between attempts the driver decides the next size:

* **At the start, and after a loss** (:func:`size_now`): as many workers as the free task
  slots hold beside the run's other processes (ps: the chief and the parameter servers on
  executors), up to ``num_workers``. Free means held by no task of another Spark job
  (:func:`free_for_run`, the count of both decisions). A lost executor is not waited for:
  its slots are gone from the scheduler's count once Spark has removed the executor. Below
  ``min_workers`` it waits for slots up to ``FailureConfig.below_min_timeout_s``, then fails
  naming what happened (:class:`BelowMinimum`).
* **While it runs** (:class:`GrowWatch`): a run below ``num_workers`` watches for task slots
  that neither it nor another job uses (:func:`spare_slots`, from the same count); once some
  have stayed free for ``ScalingConfig.grow_after_s`` it asks the training processes to pause
  at their next checkpoint (``ControlServer.request_pause``; a user's function learns it
  from ``report()``). The chief reports ``done`` with
  ``end_reason`` ``"paused"`` after that checkpoint; the next attempt starts from it with
  more workers: no step is lost or run twice.

The global batch stays the same at every size (each worker's share changes;
``plan.check_layout`` refuses a batch that some size in the range cannot divide). Each
attempt reads its input afresh, sharded over its own workers: the epoch in progress at a
resize starts again (the steps already trained stay counted).

Spark's barrier stages are refused under dynamic allocation (SPARK-24942), so elastic runs,
like every run, need it off: slots come back when the cluster manager gives the
application executors again (a standalone master relaunches them on a returning worker;
YARN asks for ``spark.executor.instances`` again).

Importing this module imports neither TensorFlow nor TensorFlowOnSpark.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Collection

from sparktf.remote import is_connect
from sparktf.train.config import ScalingConfig
from sparktf.train.errors import TrainingError

__all__ = [
    "BelowMinimum",
    "GrowWatch",
    "fit_workers",
    "free_for_run",
    "initial_size",
    "size_now",
    "spare_slots",
]

log = logging.getLogger("sparktf.train")

POLL_S = 1.0  # how often slots are counted
SETTLE_S = 5.0  # after a loss: how long the scheduler's count may take to settle


class BelowMinimum(TrainingError):
    """An elastic run could not place ``min_workers`` workers within the bound."""


def fit_workers(scaling: ScalingConfig, free_slots: int) -> int:
    """The workers an attempt gets from ``free_slots`` task slots: as many as fit beside the
    run's other processes, at most ``num_workers``; 0 when fewer than ``min_workers`` fit."""
    workers = min(scaling.num_workers, free_slots - scaling.other_processes)
    return workers if workers >= scaling.worker_counts.start else 0


def free_for_run(spark, own_tags: Collection[str] = ()) -> int | None:
    """The task slots a run may have: those of the registered executors that no task of
    another Spark job holds now (the run's own jobs carry ``own_tags``: their tasks, its
    processes' and its feed's, are the run's). The one count of both decisions, how many
    workers an attempt gets (:func:`size_now`) and whether a running one may grow
    (:func:`spare_slots`), so that a pause to grow always finds the slots it counted. None:
    unknown (Spark Connect, another Spark version)."""
    if is_connect(spark):
        return None
    from sparktf.spark.failures import task_slots
    from sparktf.train.driver.gang import busy_with_other_jobs

    total = task_slots(spark.sparkContext)
    busy = None if total is None else busy_with_other_jobs(spark, tuple(own_tags))
    return None if busy is None else total - busy


def size_now(
    spark,
    scaling: ScalingConfig,
    *,
    wait_s: float,
    prefer: int = 0,
    own_tags: Collection[str] = (),
) -> int:
    """The workers the next attempt of an elastic run gets (see the module's docstring),
    from :func:`free_for_run` (``own_tags``: the run's job tags so far).

    ``prefer``: the size to take at once when it fits (the size of the attempt that just
    ended); otherwise the count is given ``SETTLE_S`` to settle (a lost executor's slots
    leave it), and below ``min_workers`` it waits up to ``wait_s``.

    Raises:
        BelowMinimum: ``min_workers`` do not fit within ``wait_s``.
    """
    start = time.monotonic()
    best, logged = 0, False
    while True:
        free = free_for_run(spark, own_tags)
        if free is None:  # nothing to count (Spark Connect): the largest size, as planned
            return scaling.num_workers
        workers = fit_workers(scaling, free)
        best = max(best, workers)
        waited = time.monotonic() - start
        if prefer and workers >= prefer:
            return workers
        if best and (waited >= SETTLE_S or best == scaling.num_workers):
            return best
        if waited >= max(wait_s, SETTLE_S):
            raise BelowMinimum(
                f"the elastic run needs task slots for at least {scaling.worker_counts.start} "
                f"workers (plus {scaling.other_processes} other processes) and {free} were "
                f"free for {waited:.0f} s (FailureConfig.below_min_timeout_s)"
            )
        if not best and waited >= SETTLE_S and not logged:
            log.warning(
                "elastic run: %d task slots free, fewer than %d workers need; waiting up to "
                "%.0f s (FailureConfig.below_min_timeout_s)",
                free, scaling.worker_counts.start + scaling.other_processes, wait_s,
            )  # fmt: skip
            logged = True
        time.sleep(POLL_S / 4)


def spare_slots(spark, placement: dict[str, dict], own_tags: Collection[str] = ()) -> int | None:
    """Task slots a running attempt could grow into: the slots :func:`free_for_run` counts
    (none held by another job's task; ``own_tags``: the attempt's job tags) less its own
    processes on executors (None when the scheduler does not say). Slots busy with other
    jobs are not spare: :func:`size_now` would not give them to the next attempt either."""
    free = free_for_run(spark, own_tags)
    if free is None:
        return None
    ours = [p for p in placement.values() if p.get("executor") not in (None, "driver")]
    return free - len(ours)


class GrowWatch:
    """While an elastic attempt below ``num_workers`` runs: asks it to pause at its next
    checkpoint once task slots for another worker have stayed free for ``grow_after_s``.
    Use as a context manager around the attempt's wait; :attr:`requested` says whether it
    asked."""

    def __init__(self, spark, cluster, scaling: ScalingConfig, target: int):
        self.spark, self.cluster, self.scaling = spark, cluster, scaling
        self.target = target  # the run's num_workers (the attempt's scaling has fewer)
        self.requested: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> GrowWatch:
        if self.scaling.num_workers < self.target:
            self._thread = threading.Thread(target=self._watch, name="sparktf-grow", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def _watch(self) -> None:
        since: float | None = None
        while not self._stop.wait(POLL_S):
            try:
                spare = spare_slots(self.spark, self.cluster.placement, self.cluster.job_tags)
            except Exception as exc:  # the session is going away
                log.debug("counting spare slots: %s", exc)
                continue
            if not spare or spare < 1:
                since = None
                continue
            now = time.monotonic()
            since = now if since is None else since
            if now - since >= self.scaling.grow_after_s:
                grow_to = min(self.target, self.scaling.num_workers + spare)
                self.requested = (
                    f"{spare} task slots free for {now - since:.0f} s "
                    f"(ScalingConfig.grow_after_s): growing towards {grow_to} workers"
                )
                log.info("elastic run: %s, at the next checkpoint", self.requested)
                self.cluster.control.request_pause(self.requested)
                return


def initial_size(spark, scaling: ScalingConfig, failure) -> int:
    """The workers of an elastic run's first attempt: the executors get up to
    ``grow_after_s`` (at most ``startup_timeout_s``) to register slots for ``num_workers``,
    then the run starts with what is free (:func:`size_now`)."""
    if not is_connect(spark):
        from sparktf.spark.failures import ExecutorCountError, wait_for_executors

        try:
            wait_for_executors(
                spark.sparkContext,
                scaling.num_executors,
                min(scaling.grow_after_s, failure.startup_timeout_s),
            )
        except ExecutorCountError as exc:
            log.info("elastic run: starting with the slots there are (%s)", exc)
    workers = size_now(spark, scaling, wait_s=failure.below_min_timeout_s)
    log.info(
        "elastic run: starting with %d workers (%d to %d)",
        workers, scaling.worker_counts.start, scaling.num_workers,
    )  # fmt: skip
    return workers
