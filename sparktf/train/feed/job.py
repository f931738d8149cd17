"""The driver's side of the ``spark`` input mode: the Spark job that feeds the rows.

A :class:`FeedJob` runs on a thread of the driver: it reads the split's Parquet (or a
DataFrame it is given), waits until every feeding process has said hello, then runs
``feed_passes`` passes (two at a time: :meth:`FeedJob._passes`) of ``DataFrame.mapInArrow`` with
:func:`sparktf.train.feed.chunks.make_feeder`
(``None``: until the run stops) and counts what each process received. When the passes are
done it publishes those counts (the readers end on them). Its Spark jobs carry a job tag of
their own, interrupted only when the thread does not end with the run. Only DataFrame
operations are used, so a Spark Connect client feeds the same way as a classic session.
"""

from __future__ import annotations

import functools
import logging
import threading
import time
import uuid
from collections import Counter

from sparktf import spark as spark_lib
from sparktf import storage
from sparktf.datasets import formats
from sparktf.remote import is_connect
from sparktf.train.feed import chunks
from sparktf.train.plan import RunPlan
from sparktf.train.wire.control import ControlServer

__all__ = ["PASSES_IN_FLIGHT", "FeedJob"]

log = logging.getLogger(__name__)

# A split of at most this many Parquet files that Spark packs into too few partitions is
# read file by file (a union of one scan per file) instead of being shuffled.
MAX_FILES_READ_APART = 64
# Feed passes submitted at once (see FeedJob._passes).
PASSES_IN_FLIGHT = 2


class FeedJob:
    """Feeds one run's TensorFlow processes from Spark, on a thread of the driver.

    ``nodes`` maps each feeding process's key to its TensorFlowOnSpark node (its manager's
    ``addr`` and ``authkey``, its ``executor_id``); ``df``: a DataFrame to feed instead of
    the split's Parquet.
    """

    def __init__(
        self,
        spark,
        plan: RunPlan,
        control: ControlServer,
        nodes: dict[str, dict],
        *,
        df=None,
    ):
        self.spark = spark
        self.plan = plan
        self.control = control
        self.nodes = nodes
        self.df = df
        self.group = f"sparktf-feed-{uuid.uuid4().hex[:8]}"
        self.chunks: Counter = Counter()  # feed chunks per process key
        self.rows_by: Counter = Counter()  # rows per process key
        self.rows = 0
        self.started_wall: float | None = None  # when the first pass was submitted
        self.error: BaseException | None = None
        self._ending = False
        self._thread: threading.Thread | None = None

    def start(self) -> FeedJob:
        self._thread = threading.Thread(target=self._run, name="sparktf-feed", daemon=True)
        self._thread.start()
        return self

    def expect_end(self) -> None:
        """From now on the run is ending: a feed that fails is not an error of the run."""
        self._ending = True

    def failure(self, now: float | None = None) -> str | None:
        """A message when the feed failed, else None (a
        :class:`~sparktf.train.driver.monitor.RunMonitor` check)."""
        if self.error is None:
            return None
        return f"feeding rows to TensorFlow failed: {spark_lib.spark_error_text(str(self.error))}"

    def stop(self, deadline: float) -> None:
        """Waits for the thread until ``deadline`` (monotonic); cancels the feed's Spark
        jobs when it does not end."""
        thread = self._thread
        if thread is None:
            return
        thread.join(max(0.5, deadline - time.monotonic()))
        if thread.is_alive():
            log.warning("the feed job did not end; cancelling it")
            try:
                self.spark.interruptTag(self.group)
            except Exception as exc:  # the session is gone
                log.debug("interrupting the feed: %s", exc)
            thread.join(2.0)

    def _await_hello(self, keys: list[str]) -> None:
        """Returns once every feeding process has said hello (before it imports TensorFlow),
        or at the start-up deadline (the monitor reports a process that never does): the
        feed job's tasks then do not sit on executor cores waiting for a process that is
        still starting."""
        deadline = time.monotonic() + self.plan.run.failure.startup_timeout_s
        while not self.control.stop and not self.control.abort:
            nodes = self.control.snapshot()
            if all(k in nodes and nodes[k].pid for k in keys) or time.monotonic() > deadline:
                return
            self.control.wait(0.1)

    def _frame(self, parts: int):
        """The rows to feed, in at least ``parts`` partitions where that needs no shuffle.

        The split's Parquet is read with the schema its fields imply (sparktf writes
        ``numpy.save`` bytes as ``binary`` and scalars as ``bigint``): Spark then runs no job
        to infer it. Spark packs small files together; when that leaves fewer than ``parts``
        partitions, each file is read on its own (one partition or more each), which needs
        no shuffle. Only a frame that still has too few partitions is repartitioned; the
        frame is planned once and every pass runs the same plan, so that shuffle runs once.

        A Spark Connect client cannot count a frame's partitions: there a split of fewer than
        ``parts`` files is repartitioned, one of up to ``MAX_FILES_READ_APART`` files is read
        file by file (at least one partition each), and a given frame is repartitioned."""
        data = self.plan.data
        df = self.df.select(*data.names) if self.df is not None else self._read_split(parts)
        count = _partitions(df)
        if count is None and self.df is None:
            return df
        if count is None or count < parts:
            df = df.repartition(parts)
        return df

    def _read_split(self, parts: int):
        data = self.plan.data
        schema = ", ".join(f"`{f.name}` {formats.spark_type(f)}" for f in data.fields)
        reader = self.spark.read.schema(schema)
        df = reader.parquet(storage.spark_uri(data.parquet))
        count = _partitions(df)
        if count is None or count < parts:
            files = sorted(df.inputFiles())
            if count is None and len(files) < parts:
                return df.select(*data.names).repartition(parts)
            if 1 < len(files) <= MAX_FILES_READ_APART:
                df = functools.reduce(lambda a, b: a.union(b), map(reader.parquet, files))
        return df.select(*data.names)

    def _run(self) -> None:
        try:
            self.spark.addTag(self.group)
            keys = list(self.nodes)
            df = self._frame(2 * len(keys))
            executors = {
                int(n["executor_id"]): {
                    "addr": n["addr"],
                    "authkey": n["authkey"],
                    "key": key,
                    "host": n["host"],
                }
                for key, n in self.nodes.items()
            }
            feeder = chunks.make_feeder(
                executors,
                self.control.token,
                self.control.url,
                feed_timeout_s=self.plan.run.failure.feed_timeout_s,
            )
            fed = df.mapInArrow(feeder, chunks.SUMMARY_SCHEMA)  # one plan for every pass
            self._await_hello(keys)
            self.started_wall = time.time()
            done_passes = self._passes(fed, self.plan.feed_passes)
            if done_passes is None:  # the run stopped
                return
            self.control.set_feed_end({key: self.chunks.get(key, 0) for key in keys})
            log.info("feed complete: %d passes, %d rows", done_passes, self.rows)
        except BaseException as exc:
            if not self._ending and not self.control.abort:
                self.error = exc
        finally:
            try:
                self.spark.removeTag(self.group)
            except Exception as exc:  # the session is gone
                log.debug("removing the feed's job tag: %s", exc)

    def _passes(self, fed, passes: int | None) -> int | None:
        """Runs ``passes`` passes of ``fed`` (None: until the run stops), up to
        ``PASSES_IN_FLIGHT`` at once; returns how many ran, or None when the run stopped.

        Why more than one at once: Spark places a pass's tasks on whichever executors are
        free, and a task feeds the process of the executor it runs on, so one pass may give
        one process all its rows and another none. Under all-reduce a process that has rows
        waits at its next step for one that has none; its queue fills and its feeding task
        waits for room, so the pass never ends. With the next pass already submitted, its
        tasks run on the free executors and feed the process that waits."""
        from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

        pool = ThreadPoolExecutor(PASSES_IN_FLIGHT, thread_name_prefix="sparktf-feed-pass")
        pending: set = set()
        submitted = done = 0
        try:
            while True:
                if self.control.stop:  # the passes in flight end as their processes stop
                    wait(pending)
                    return None
                while len(pending) < PASSES_IN_FLIGHT and (passes is None or submitted < passes):
                    pending.add(pool.submit(self._one_pass, fed))
                    submitted += 1
                if not pending:
                    return done
                finished, pending = wait(pending, timeout=1.0, return_when=FIRST_COMPLETED)
                for future in finished:
                    for row in future.result():  # a failed pass raises here
                        self.chunks[row.executor] += row.chunks
                        self.rows_by[row.executor] += row.rows
                        self.rows += row.rows
                    done += 1
                    log.debug("fed pass %d: %d rows so far", done, self.rows)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)

    def _one_pass(self, fed) -> list:
        # Job tags belong to the thread that starts the job: each pass's thread sets it.
        self.spark.addTag(self.group)
        return fed.collect()


def _partitions(df) -> int | None:
    """The frame's partitions, or None on a Spark Connect client (it has no RDDs)."""
    return None if is_connect(df.sparkSession) else df.rdd.getNumPartitions()
