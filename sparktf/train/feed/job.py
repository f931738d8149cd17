"""The driver's side of the ``spark`` input mode: the Spark job that feeds the rows.

A :class:`FeedJob` runs on a thread of the driver: it reads the split's Parquet (or a
DataFrame it is given), counts the rows of its partitions (one Spark job, while TensorFlow
starts), then runs one pass per epoch, from the attempt's position to the plan's last
epoch (``feed_passes``; ``None``: until the run stops), in the order of
:mod:`sparktf.train.feed.order`: each pass is one shuffle of the epoch's rows into a
partition per process (:mod:`sparktf.train.feed.passes`) fed by a barrier stage of
``DataFrame.mapInArrow`` with :func:`sparktf.train.feed.chunks.make_feeder`. It checks that
every process got its share, records each epoch (:attr:`FeedJob.epochs`, logged one line
each, with the seconds its pass took in Spark), and when the passes are done publishes the
chunks each process received (the readers end on them). What the driver's input-bound check
names comes from here too: the frame's partitions and what its plan does
(:attr:`FeedJob.partitions`, :attr:`FeedJob.plan_facts`). Its Spark jobs carry a job tag
of their own, interrupted only when the thread does not end with the run. Only DataFrame
operations are used, so a Spark Connect client feeds the same way as a classic session.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import Counter

from sparktf import spark as spark_lib
from sparktf import storage
from sparktf.datasets import formats
from sparktf.train.feed import chunks, passes
from sparktf.train.feed.chunks import FeedError
from sparktf.train.feed.order import Position, epoch_rows, left_over
from sparktf.train.plan import RunPlan
from sparktf.train.wire.control import ControlServer

__all__ = ["MAX_EPOCHS_PER_PASS", "PASS_BYTES", "FeedJob"]

# A small table's epochs go several to a pass (one Spark job, one shuffle): up to about this
# many bytes of rows a pass, at most MAX_EPOCHS_PER_PASS epochs. A pass costs Spark a second
# or two whatever its rows (its stages, a barrier stage's start): a table of 240 rows fed an
# epoch a pass spent 1.8 s a pass for 20 steps of training.
PASS_BYTES = 64 << 20
MAX_EPOCHS_PER_PASS = 64

log = logging.getLogger(__name__)


class FeedJob:
    """Feeds one run's TensorFlow processes from Spark, on a thread of the driver.

    ``nodes`` maps each feeding process's key to its TensorFlowOnSpark node (its manager's
    ``addr`` and ``authkey``, its ``executor_id``, its ``host``), in rank order: process
    ``j`` is fed share ``j`` of every pass (:mod:`sparktf.train.feed.order`). ``df``: a
    DataFrame to feed instead of the split's Parquet.

    Each pass is one epoch from the attempt's position on (the plan's ``feed_start``):
    the frame's rows numbered once (:func:`~sparktf.train.feed.passes.numbered`), then per
    epoch one shuffle into a partition per process, fed by a barrier stage
    (``mapInArrow(..., barrier=True)``: all its tasks run at once, one per process, so no
    process waits on rows another's task holds back). The global batch is the plan's
    (``fit``), or the one the processes open their feed with (``run(train_fn)``: the
    ``feed`` event). :attr:`epochs` records what each pass fed.
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
        # per pass: {"epoch", "from_cursor", "rows", "left_over", "skipped", "seconds"}
        self.epochs: list[dict] = []
        self.batch: int | None = None  # the global batch, once known
        self.partitions: int | None = None  # of the frame fed, whose tasks run its plan
        self.plan_facts: dict[str, bool] = {}  # passes.plan_facts of the frame fed
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

    def _await_batch(self, keys: list[str]) -> int | None:
        """The global batch: the plan's (``fit``), or the one every feeding process opened
        its feed with (``run(train_fn)``: they must agree). None when the run stopped first
        (a process that never opens its feed is the monitor's to report)."""
        if not self.plan.function:
            return self.plan.global_batch
        while not self.control.stop and not self.control.abort:
            nodes = self.control.snapshot()
            opened = [nodes[k].feed for k in keys if k in nodes and nodes[k].feed]
            if len(opened) == len(keys):
                batches = {int(f["batch"]) for f in opened}
                if len(batches) > 1:
                    raise FeedError(
                        f"the processes opened their feeds with different global batches "
                        f"{sorted(batches)}: every process must call dataset(batch_size=...) "
                        "with the same global batch"
                    )
                return batches.pop()
            self.control.wait(0.1)
        return None

    def _frame(self):
        """The rows to feed: the DataFrame's columns the model reads, or the split's
        Parquet read with the schema its fields imply (sparktf writes ``numpy.save`` bytes
        as ``binary`` and scalars as ``bigint``: Spark then runs no job to infer it)."""
        data = self.plan.data
        if self.df is not None:
            return self.df.select(*data.names)
        schema = ", ".join(f"`{f.name}` {formats.spark_type(f)}" for f in data.fields)
        frame = self.spark.read.schema(schema).parquet(storage.spark_uri(data.parquet))
        return frame.select(*data.names)

    def _run(self) -> None:
        try:
            self.spark.addTag(self.group)
            keys = list(self.nodes)
            frame = self._frame()
            counts = passes.partition_rows(frame)  # while TensorFlow starts
            self.partitions, self.plan_facts = len(counts), passes.plan_facts(frame)
            total = sum(counts)
            if total != self.plan.data.rows:
                raise FeedError(
                    f"the rows to feed number {total}, not the {self.plan.data.rows} counted "
                    "when the run was planned: the data changed, or its plan is not "
                    "deterministic (cache the DataFrame)"
                )
            numbered = passes.numbered(frame, counts)
            share_keys = passes.share_keys(self.spark, len(keys))
            shares = [
                {
                    "addr": self.nodes[key]["addr"],
                    "authkey": self.nodes[key]["authkey"],
                    "key": key,
                    "host": self.nodes[key]["host"],
                }
                for key in keys
            ]
            feeder = chunks.make_feeder(
                shares,
                self.control.token,
                self.control.url,
                feed_timeout_s=self.plan.run.failure.feed_timeout_s,
            )
            batch = self.batch = self._await_batch(keys)
            if batch is None:
                return
            self.started_wall = time.time()
            done = self._passes(numbered, feeder, keys, share_keys, total, batch)
            if done is None:  # the run stopped
                return
            self.control.set_feed_end({key: self.chunks.get(key, 0) for key in keys})
            log.info("feed complete: %d epochs, %d rows", done, self.rows)
        except BaseException as exc:
            if not self._ending and not self.control.abort:
                self.error = exc
        finally:
            try:
                self.spark.removeTag(self.group)
            except Exception as exc:  # the session is gone
                log.debug("removing the feed's job tag: %s", exc)

    def _passes(self, numbered, feeder, keys, share_keys, total: int, batch: int) -> int | None:
        """Runs the epochs from the plan's position on to the plan's last epoch
        (``feed_passes``; None: until the run stops), a pass each or, for a small table,
        several to a pass (:data:`PASS_BYTES`); returns how many epochs ran, or None when
        the run stopped."""
        plan = self.plan
        position = Position.from_dict(plan.feed_start).normalized(batch, total)
        full = epoch_rows(total, 0, batch)
        pass_bytes = max(1, full * row_bytes(plan.data.fields))
        per_pass = max(1, min(MAX_EPOCHS_PER_PASS, PASS_BYTES // pass_bytes))
        ran = 0
        while plan.feed_passes is None or position.epoch < plan.feed_passes:
            if self.control.stop:
                return None
            started = time.monotonic()
            last = position.epoch + per_pass
            if plan.feed_passes is not None:
                last = min(last, plan.feed_passes)
            positions = [position, *(Position(e, 0) for e in range(position.epoch + 1, last))]
            rows_frame, counts = passes.epochs_frame(
                numbered,
                rows=total,
                first=position,
                epochs=len(positions),
                batch=batch,
                parts=len(keys),
                seed=plan.train.seed,
                shuffle=plan.train.shuffle,
            )
            frame = passes.shares_frame(rows_frame, share_keys)
            summary = frame.mapInArrow(feeder, chunks.SUMMARY_SCHEMA, barrier=True).collect()
            fed = Counter()
            skipped = 0
            for row in summary:
                self.chunks[row.executor] += row.chunks
                self.rows_by[row.executor] += row.rows
                fed[row.executor] += row.rows
                skipped += row.skipped
                self.rows += row.rows
            count = sum(counts)
            share = count // len(keys)
            short = {k: fed.get(k, 0) for k in keys if fed.get(k, 0) != share}
            if short and not skipped and not self.control.stop:
                raise FeedError(
                    f"epochs {positions[0].epoch}-{positions[-1].epoch}: the processes got "
                    f"{short} rows, not {share} each: the DataFrame's rows changed between "
                    "passes (its plan is not deterministic: cache it)"
                )
            # the epochs every process got whole (a pass the run's end cut short has fed
            # only its first ones)
            least = min(fed.get(k, 0) for k in keys)
            seconds = (time.monotonic() - started) / len(positions)
            recorded = 0
            for p, n in zip(positions, counts):
                least -= n // len(keys)
                if least < 0:
                    break
                record_epoch(self.epochs, p, n, keys, total, batch, seconds)
                recorded += 1
            ran += recorded
            if recorded:
                log_pass(
                    self.epochs, positions[:recorded], counts[:recorded], len(keys), total, batch
                )
            if self.control.stop or skipped:
                return None
            position = Position(last, 0)
        return ran

    def trained(self, step: int) -> list[dict]:
        """The epochs fed that training reached by global step ``step`` (a pass may feed
        several epochs ahead of the training)."""
        if self.batch is None or not self.epochs:
            return list(self.epochs)
        plan = self.plan
        start = Position.from_dict(plan.feed_start).normalized(self.batch, plan.data.rows)
        steps = max(0, step - plan.feed_start_step)
        end = start.advance(steps, self.batch, plan.data.rows)
        last = end.epoch if end.cursor else end.epoch - 1
        return [e for e in self.epochs if e["epoch"] <= last]


def record_epoch(epochs: list, position, count, keys, total, batch, seconds) -> None:
    """Records and logs an epoch a pass fed whole to every process (``seconds``:
    Spark's time for it, its share of the pass's when a pass fed several epochs)."""
    share = count // len(keys)
    record = {
        "epoch": position.epoch,
        "from_cursor": position.cursor,
        "rows": {k: share for k in keys},
        "left_over": left_over(total, position.cursor, batch),
        # Spark's time for the pass: the frame's plan, the shuffle, the feeding
        "seconds": round(seconds, 3),
    }
    epochs.append(record)
    log.debug("epoch %d fed: %s", position.epoch, record)


def log_pass(epochs: list, positions, counts, processes: int, total: int, batch: int) -> None:
    """One line for what a pass fed whole: an epoch, or several of a small table."""
    first, seconds = positions[0], sum(e["seconds"] for e in epochs[-len(positions) :])
    which = (
        f"epoch {first.epoch}"
        if len(positions) == 1
        else f"epochs {first.epoch}-{positions[-1].epoch} (a pass)"
    )
    log.info(
        "%s fed in %.1f s: %d rows%s to each of %d processes%s; %d left over (less than "
        "a global batch of %d)",
        which,
        seconds,
        counts[-1] // processes,
        "" if len(positions) == 1 else " of each epoch",
        processes,
        f", from row {first.cursor} of epoch {first.epoch}'s order" if first.cursor else "",
        epochs[-1]["left_over"],
        batch,
    )


def row_bytes(fields) -> int:
    """About the bytes of a row the feed moves: its fields' sizes (8 for a string)."""
    import numpy as np

    size = 0
    for f in fields:
        item = 8 if f.dtype == "string" else np.dtype(f.dtype).itemsize
        size += item * int(np.prod(f.shape or (1,)))
    return max(1, size)
