"""``run_tasks`` runs one Spark task per item with progress in the log; ``task_progress`` and
``stage_progress`` report a running job.
"""

from __future__ import annotations

import functools
import logging
import pickle
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from sparktf import remote as connect
from sparktf.remote import is_connect
from sparktf.spark.failures import is_spark_error, spark_failure

__all__ = [
    "PROGRESS_EVERY_S",
    "STAGE_PROGRESS_EVERY_S",
    "every",
    "run_tasks",
    "stage_progress",
    "task_progress",
]

log = logging.getLogger(__name__)


PROGRESS_EVERY_S = 1.0  # task_progress: how often the count is logged (when it changed)
STAGE_PROGRESS_EVERY_S = 15.0


@contextmanager
def every(seconds: float, report: Callable[[], None], name: str) -> Iterator[None]:
    """Calls ``report`` every ``seconds`` on a daemon thread named ``name`` while the block
    runs (progress logs of Spark jobs, the MLflow follower of a training run)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(seconds):
            report()

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextmanager
def task_progress(sc, what: str, total: int, every_s: float = PROGRESS_EVERY_S) -> Iterator[Any]:
    """An accumulator that tasks add 1 to; its count is logged while the job runs
    ("WHAT: n/total tasks done"), and once more with the time taken when the block ends.
    ``sc``: a SparkContext (a Spark Connect session has no accumulators)."""
    done = sc.accumulator(0)
    last = 0

    def report() -> None:
        nonlocal last
        value = done.value
        if value != last:
            log.info("%s: %d/%d tasks done", what, value, total)
            last = value

    started = time.monotonic()
    with every(every_s, report, f"progress {what}"):
        yield done
    log.info("%s: %d/%d tasks done in %.1f s", what, done.value, total, time.monotonic() - started)


@contextmanager
def stage_progress(sc, every_s: float = STAGE_PROGRESS_EVERY_S) -> Iterator[None]:
    """Logs the running stages' task counts every ``every_s`` seconds while the block runs
    (for Spark actions whose tasks do not count themselves, e.g. a DataFrame write).
    ``sc``: a SparkContext or a session; of a Spark Connect session, the stages its server
    reports to this client."""
    if is_connect(sc):
        with (
            connect.stage_counts(sc) as running,
            every(every_s, lambda: _log(running()), "progress"),
        ):
            yield
        return
    tracker = getattr(sc, "sparkContext", sc).statusTracker()

    def report() -> None:
        infos = (tracker.getStageInfo(stage_id) for stage_id in tracker.getActiveStageIds())
        _log([(i.stageId, i.numCompletedTasks, i.numTasks) for i in infos if i is not None])

    with every(every_s, report, "progress"):
        yield


def _log(stages: Sequence[tuple[int, int, int]]) -> None:
    for stage_id, done, total in stages:
        log.info("stage %d: %d of %d tasks done", stage_id, done, total)


def run_tasks(
    sc,
    what: str,
    items: Sequence,
    fn: Callable,
    *,
    expected: tuple[type[BaseException], ...] = (),
    failure: type[Exception] = RuntimeError,
) -> list:
    """Runs ``fn`` on each item, one Spark task per item; returns the results in order.

    An exception of a type in ``expected`` (errors of the input, which a retry cannot fix)
    comes back from its task as data and is raised here, the first one in item order; it
    travels pickled, so it must rebuild from its pickle (define ``__reduce__`` when its
    ``__init__`` takes other arguments than its message). Any other failure of the Spark job
    is raised as ``failure`` with the task's Python error (``spark_failure``).
    """
    if not items:
        return []
    sc = connect.classic_context(sc, what)
    with task_progress(sc, what, len(items)) as done:
        task = functools.partial(_counted, functools.partial(_catching, fn, tuple(expected)), done)
        try:
            outcomes = sc.parallelize(list(items), len(items)).map(task).collect()
        except Exception as exc:
            if is_spark_error(exc):
                raise spark_failure(what, exc, failure) from None
            raise
    for outcome in outcomes:
        if "error" in outcome:
            raise outcome["error"]
    return [o["result"] for o in outcomes]


def _catching(fn: Callable, expected: tuple, item) -> dict:
    """Runs one task; an expected exception comes back as data (no retries of a
    deterministic error), provided that it survives pickling; else it fails the task."""
    try:
        return {"result": fn(item)}
    except expected as exc:
        if not _pickles(exc):
            raise
        return {"error": exc}


def _pickles(obj) -> bool:
    try:
        pickle.loads(pickle.dumps(obj))
    except Exception:
        return False
    return True


def _counted(fn: Callable, done, item):
    result = fn(item)
    done.add(1)
    return result
