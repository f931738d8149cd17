"""Where a TensorFlow process's batches come from, for both input modes.

:func:`open_batches` returns a :class:`Source` of numpy batches of exactly ``batch_size``
rows, from the plan's dataset description (:class:`~sparktf.train.plan.DataInfo`):

* ``spark``: the process's :class:`~sparktf.train.feed.chunks.FeedReader`: its share of each
  epoch, already in the epoch's order (:mod:`sparktf.train.feed.order`);
* ``files``: the process's shard of the split, repeated and reshuffled every pass, read
  with :mod:`sparktf.datasets.readers` (TFRecord or Parquet, local or ``hdfs://``; by
  files when their number is a multiple of the workers, else by records), from where the
  checkpoint the attempt resumed from left it (:class:`FilesFeed`).

Under the ``ps`` strategy the chief is the only reader: it reads every shard and hands
batches to the workers (TF2 parameter-server workers run only the graph functions the
coordinator sends; a Python reader -- and TensorFlow has no HDFS file system -- cannot run
there).

:class:`InputClock` measures how long a process waits for its next batch against the time
between batches (its steps): the driver's input-bound check reads it
(:mod:`sparktf.train.driver.doctor`).
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sparktf.train.errors import ConfigError
from sparktf.train.plan import DataInfo, ProcessSpec, Role

__all__ = [
    "FilesFeed",
    "InputClock",
    "Primed",
    "Source",
    "cpu_times",
    "drain_records",
    "file_batches",
    "open_batches",
    "read_split",
    "shard_seed",
    "stream_layout",
]

log = logging.getLogger(__name__)


# ----------------------------------------------------------------------------- process side


@dataclass
class Source:
    batches: Iterator[dict[str, Any]]
    finite: bool
    close_fn: Callable[[str], None] | None = None
    reader: Any = None

    @property
    def rows(self) -> int | None:
        return getattr(self.reader, "rows", None)

    @property
    def dropped_rows(self) -> int | None:
        return getattr(self.reader, "dropped_rows", None)

    def close(self, state: str) -> None:
        if self.close_fn is not None:
            self.close_fn(state)
            self.close_fn = None


class FilesFeed:
    """The files input of one training process: its shard, and where the attempt starts in
    the shard's endless stream (:class:`~sparktf.train.feed.order.FilesPosition`, from the
    checkpoint the run resumes from: ``RunPlan.feed_start``, at ``feed_start_step``)."""

    def __init__(self, data: str, split: str, fmt: str, shard: int, start, start_step: int):
        self.data, self.split, self.fmt, self.shard = data, split, fmt, shard
        self.position, self.start_step = start, start_step
        self._sizes: dict[int, int] = {}

    @classmethod
    def for_attempt(
        cls,
        feed_start: dict | None,
        start_step: int,
        data: str,
        split: str,
        fmt: str,
        shards: int,
        shard: int,
        batch: int,
    ) -> FilesFeed:
        """Shard ``shard`` of ``shards`` (``batch`` records a step each) of ``split`` of
        the dataset ``data``, from ``feed_start`` (the position the checkpoint of step
        ``start_step`` recorded, a :class:`~sparktf.train.feed.order.FilesPosition` as a
        dict; None: from the start)."""
        from sparktf.train.feed.order import FilesPosition

        def sizes(num_shards: int, index: int) -> int:  # of the recorded split, on a resize
            return _pass_records(data, fmt, split, num_shards, index)

        start = FilesPosition.from_dict(feed_start, shards, batch, start_step, sizes)
        return cls(data, split, fmt, shard, start, start_step)

    def size(self, shard: int) -> int:
        """Records of one pass of shard ``shard`` (the manifest's counts)."""
        if shard not in self._sizes:
            self._sizes[shard] = _pass_records(
                self.data, self.fmt, self.split, self.position.shards, shard
            )
        return self._sizes[shard]

    @property
    def start(self) -> int:
        """The record of this process's shard its stream starts from."""
        return self.position.start(self.size(self.shard))

    def drain(self, seed: int | None, log_as: str):
        """This process's part of the drain of an earlier shape's pass (a resize: see
        :mod:`sparktf.train.feed.order`), as a ``tf.data.Dataset`` of records, or None when
        nothing is pending. ``seed``: the run's (each old shard ``i`` read with ``seed + 1000
        * i``), None unshuffled."""
        position = self.position
        if not position.pending:
            return None
        segments = position.deal(self.shard)
        log.info(
            "%s: shard %d of %d first finishes pass %d of the earlier split of %d shards: "
            "%d records, %d steps (%d records of the pass, less than a global batch, "
            "left over), then pass %d from its beginning",
            log_as,
            self.shard,
            position.shards,
            position.epoch,
            position.pending[0].shards,
            sum(s.records for s in segments),
            position.drain_steps,
            position.left_over,
            position.base_epoch,
        )
        return drain_records(self.data, self.split, self.fmt, segments, seed)

    def at(self, step: int) -> dict[str, int]:
        """Where the files input stands after global step ``step`` (the chief's shard
        gives the pass), to keep with the checkpoint of that step."""
        steps = max(0, step - self.start_step)
        return self.position.advance(steps, self.size(0)).to_dict()


class Primed:
    """An iterator over ``items`` whose first item is fetched on a thread from the start
    (the input fills while the process builds its model); the rest come from ``items``
    itself. The first ``next`` waits for that thread and raises what it raised."""

    _END = object()

    def __init__(self, items: Iterator[Any]):
        self._items = items
        self._first: Any = self._END
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = threading.Thread(
            target=self._fetch, name="sparktf-first-batch", daemon=True
        )
        self._thread.start()

    def _fetch(self) -> None:
        try:
            self._first = next(self._items, self._END)
        except BaseException as exc:  # raised in the consumer's thread
            self._error = exc

    def __iter__(self) -> Primed:
        return self

    def __next__(self) -> Any:
        if self._thread is None:
            return next(self._items)
        self._thread.join()
        self._thread = None
        if self._error is not None:
            error, self._error = self._error, None
            raise error
        first, self._first = self._first, self._END
        if first is self._END:
            raise StopIteration
        return first


_END, _NO_DEFAULT = object(), object()


def cpu_times() -> tuple[float, float] | None:
    """This host's CPU time so far, busy and in all, over all its CPUs (``/proc/stat``, in
    clock ticks); None where there is no such file."""
    try:
        with open("/proc/stat") as f:
            fields = [float(v) for v in f.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle and iowait
    return sum(fields) - idle, sum(fields)


class InputClock:
    """How long one process waits for its next batch, against the time between batches.

    Counted from the second batch on: the first one's wait is the start-up (the input fills
    while the model is built) and the first step traces its function. A step's time is
    the time from one batch handed over to the next one asked for (the training step, its
    checkpoints and reports; in a user's function whatever it does between batches), its
    wait the time inside the iterator's ``next``. An end of the data is not a wait.

    ``source``: the process's :class:`~sparktf.train.feed.chunks.FeedReader` (``spark``
    input mode): how long its thread waited for Spark's chunks (``wait_s``) and decoded
    them (``decode_s``), counted over the same span. Thread-safe: ``tf.data`` may call
    from its own threads.
    """

    def __init__(self, source: Any = None):
        self.source = source
        self.wait_s = self.step_s = 0.0
        self.batches = 0  # handed over, the first included
        self._last: float | None = None  # when the last batch was handed over
        self._ended: float | None = None  # stop(): the end of the measured span
        self._base: dict[str, Any] = {}  # the counters when the measured span began
        self._lock = threading.Lock()

    def next(self, iterator: Iterator[Any], default: Any = _NO_DEFAULT) -> Any:
        """``next(iterator[, default])``, timed."""
        started = time.monotonic()
        item = next(iterator) if default is _NO_DEFAULT else next(iterator, default)
        if item is not default:
            self._count(started, time.monotonic())
        return item

    def timed(self, iterator: Iterator[Any]) -> Iterator[Any]:
        """The items of ``iterator``, each ``next`` timed."""
        while True:
            item = self.next(iterator, _END)
            if item is _END:
                return
            yield item

    def _count(self, started: float, ended: float) -> None:
        with self._lock:
            if self._ended is not None:  # a pipeline reading ahead after the training ended
                return
            self.batches += 1
            if self.batches == 2:  # the measured span starts with the second batch's wait
                self._base = self._counters()
            if self.batches >= 2:
                self.wait_s += ended - started
            if self.batches >= 3:  # tf.data's threads may overlap: never below 0
                self.step_s += max(0.0, started - self._last)
            self._last = ended

    def _counters(self) -> dict[str, Any]:
        reader = self.source
        found: dict[str, Any] = {"cpu": cpu_times()}
        for name in ("wait_s", "decode_s", "chunks", "rows"):
            if hasattr(reader, name):
                found[name] = getattr(reader, name)
        return found

    def stop(self) -> None:
        """Ends the measured span (the training ended): what follows is neither a step nor
        a wait."""
        with self._lock:
            if self._ended is None:
                self._ended = time.monotonic()

    def fraction(self) -> float | None:
        """The share of the measured time spent waiting for batches (None before the
        second batch): ``wait / (wait + steps)``, the step in progress included."""
        with self._lock:
            if self.batches < 2:
                return None
            step_s = self.step_s + max(0.0, (self._ended or time.monotonic()) - self._last)
            total = self.wait_s + step_s
            return self.wait_s / total if total > 0 else 0.0

    def stats(self) -> dict[str, Any]:
        """What a process reports at its end: ``wait_fraction``, ``wait_s``, ``step_s``,
        ``steps`` measured; with a feed reader its ``feed_wait_s``, ``decode_s``, ``chunks``
        and ``rows`` over the span; ``cpu_busy``, the host's CPUs busy over the span (0-1).
        Empty before the second batch."""
        fraction = self.fraction()
        if fraction is None:
            return {}
        with self._lock:
            end = self._ended or time.monotonic()
            out: dict[str, Any] = {
                "wait_fraction": round(fraction, 4),
                "wait_s": round(self.wait_s, 3),
                "step_s": round(self.step_s + max(0.0, end - self._last), 3),
                "steps": self.batches - 1,
            }
            now, base = self._counters(), self._base
        for name, key in (("wait_s", "feed_wait_s"), ("decode_s", "decode_s")):
            if name in now and name in base:
                out[key] = round(now[name] - base[name], 3)
        for name in ("chunks", "rows"):
            if name in now and name in base:
                out[name] = now[name] - base[name]
        if now["cpu"] and base.get("cpu") and now["cpu"][1] > base["cpu"][1]:
            busy, total = (a - b for a, b in zip(now["cpu"], base["cpu"]))
            out["cpu_busy"] = round(busy / total, 3)
        return out


def open_batches(spec: ProcessSpec, role: Role, control, batch_size: int) -> Source:
    """This process's batches (``batch_size`` rows each)."""
    plan = spec.plan
    if role.strategy == "ps":
        num_shards, shard = 1, 0
    else:
        num_shards, shard = role.num_workers, role.rank
    if plan.train.input_mode == "spark":
        from sparktf import exit_hooks
        from sparktf.train.feed.chunks import FeedReader

        reader = FeedReader(
            mgr_address=spec.mgr_address,
            authkey=spec.mgr_authkey,
            token=spec.token,
            key=spec.key,
            fields=list(plan.data.fields),
            control=control,
            feed_timeout_s=plan.run.failure.feed_timeout_s,
        ).open()
        exit_hooks.on_exit(lambda: reader.close("failed"))
        return Source(reader.batches(batch_size), finite=True, close_fn=reader.close, reader=reader)
    base_seed = plan.train.seed if plan.train.shuffle else None
    seed = shard_seed(base_seed, shard)
    fmt = plan.train.file_format
    feed = FilesFeed.for_attempt(
        plan.feed_start,
        plan.feed_start_step,
        plan.data.data,
        plan.data.split,
        fmt,
        num_shards,
        shard,
        batch_size,
    )
    drain = None
    if _token_streams(plan.data.names, seed):
        feed.position = feed.position.without_pending()
    else:
        drain = feed.drain(base_seed, "files input")
    if feed.start and drain is None:
        log.info(
            "files input: shard %d of %d goes on from its record %d (%s)",
            shard,
            num_shards,
            feed.start,
            feed.position,
        )
    batches = file_batches(
        plan.data, fmt, batch_size, num_shards, shard, seed, feed.start, drain=drain
    )
    # Endless (epochs repeat; an empty shard is an error): all-reduce workers need not agree
    # every step that none has run out, which would cost a collective and a sync per step.
    return Source(batches, finite=False, reader=feed)


def read_split(data_dir: str, fmt: str, **options):
    """A training input's reader of ``data_dir`` (``readers.tfrecord_dataset``, data
    checksums verified, or ``readers.parquet_dataset``) with ``options``."""
    from sparktf.datasets import readers

    if fmt == "tfrecord":
        return readers.tfrecord_dataset(data_dir, verify_checksums=True, **options)
    return readers.parquet_dataset(data_dir, **options)


def shard_seed(seed: int | None, shard: int) -> int | None:
    """The seed the stream of shard ``shard`` is shuffled with (None: unshuffled)."""
    return None if seed is None else seed + 1000 * shard


def _token_streams(names, seed: int | None) -> bool:
    """Whether the files input reads the language model's unshuffled token streams (a
    layout of their own: :func:`stream_layout`)."""
    return "tokens" in names and seed is None


def _pass_records(data: str, fmt: str, split: str, num_shards: int, shard: int) -> int:
    """Records of one pass of shard ``shard`` of ``num_shards`` (the manifest's counts)."""
    from sparktf.datasets import readers

    return readers.shard_records(data, fmt, split=split, num_shards=num_shards, shard_index=shard)


def drain_records(data_dir: str, split: str, fmt: str, segments, seed: int | None):
    """The records of ``segments`` (:class:`~sparktf.train.feed.order.Segment`: spans of the
    streams of an earlier split's shards, shard ``i`` shuffled with ``seed + 1000 * i``; None:
    unshuffled) one after another, as a ``tf.data.Dataset`` of records."""

    records = None
    for segment in segments:
        options = dict(
            batch_size=min(segment.records, DRAIN_READ_BATCH),
            split=split,
            num_shards=segment.shards,
            shard_index=segment.shard,
            shuffle=seed is not None,
            seed=shard_seed(seed, segment.shard),
            repeat=True,
            drop_remainder=True,
            start=segment.start,
        )
        part = read_split(data_dir, fmt, **options).unbatch().take(segment.records)
        records = part if records is None else records.concatenate(part)
    return records


DRAIN_READ_BATCH = 1024  # records a batch when a drain reads an earlier split's shard


def file_batches(
    data: DataInfo,
    fmt: str,
    batch_size: int,
    num_shards: int,
    shard: int,
    seed: int | None,
    start: int = 0,
    drain=None,
) -> Iterator[dict[str, Any]]:
    """Endless exact batches of this shard, from :mod:`sparktf.datasets.readers`, from record
    ``start`` of its stream on; after the records of ``drain`` (a ``tf.data.Dataset`` of
    records, :meth:`FilesFeed.drain`), when there is one, in whole batches."""
    import tensorflow as tf

    names = data.names
    if _token_streams(names, seed):
        batches = _token_stream_batches(data, fmt, batch_size, num_shards, shard)
        yield from itertools.islice(batches, start // batch_size, None)
        return
    options = dict(
        batch_size=batch_size,
        split=data.split,
        num_shards=num_shards,
        shard_index=shard,
        shuffle=seed is not None,
        seed=seed,
        repeat=True,
        drop_remainder=True,
        start=start,
    )
    dataset = read_split(data.data, fmt, **options)
    if drain is not None:
        dataset = drain.batch(batch_size, drop_remainder=True).concatenate(dataset)
    batches = iter(dataset)
    while True:
        try:
            batch = next(batches)
        except StopIteration:  # the epochs repeat: only a shard without rows ends
            raise ConfigError(
                f"shard {shard} of {num_shards} of the {data.split!r} split has no rows: "
                "use fewer workers or a dataset with more rows (or files)"
            ) from None
        except tf.errors.DataLossError as exc:  # TensorFlow's TFRecord reader: no file name
            # a drain reads the shards of an earlier split: every file is a suspect
            split = (1, 0) if drain is not None else (num_shards, shard)
            raise _locate_corruption(data.files[fmt], *split, exc) from None
        yield {name: batch[name] for name in names}


def stream_layout(tokens, ids, batch_size: int, num_shards: int = 1, shard: int = 0):
    """The book's PTB batching (11.2 reader) over consecutive chunks of a token stream.

    ``tokens`` [N, L] are the split's chunks in text order and ``ids`` [N] their ids. The
    chunks are cut into ``batch_size * num_shards`` contiguous streams (rows) of
    ``N // (batch_size * num_shards)`` chunks; step t's global batch is chunk t of every
    stream, so a row of step t+1 continues the text of the same row of step t and the LSTM
    state carried across batches follows it. Returns this shard's rows: tokens [B, T, L]
    and ids [B, T], with T the steps of one pass.
    """
    import numpy as np

    rows = batch_size * num_shards
    steps = len(tokens) // rows
    if steps == 0:
        raise ConfigError(
            f"the split has {len(tokens)} token chunks, fewer than the global "
            f"batch of {rows} streams: use a smaller TrainConfig.batch_size"
        )
    order = np.argsort(ids, kind="stable")
    used = order[: rows * steps]
    mine = slice(shard * batch_size, (shard + 1) * batch_size)
    return (
        np.asarray(tokens)[used].reshape(rows, steps, -1)[mine],
        np.asarray(ids)[used].reshape(rows, steps)[mine],
    )


def _token_stream_batches(
    data: DataInfo, fmt: str, batch_size: int, num_shards: int, shard: int
) -> Iterator[dict[str, Any]]:
    """Endless passes of PTB batches in stream layout (:func:`stream_layout`), with a
    ``reset`` flag on each pass's first step so that every stream starts from a zero state."""
    import numpy as np

    from sparktf.datasets import readers

    read = readers.tfrecord_dataset if fmt == "tfrecord" else readers.parquet_dataset
    chunks = list(read(data.data, split=data.split, batch_size=4096))
    tokens = np.concatenate([c["tokens"].numpy() for c in chunks])
    ids = np.concatenate([c["id"].numpy() for c in chunks])
    rows, row_ids = stream_layout(tokens, ids, batch_size, num_shards, shard)
    log.info("PTB streams: %d rows of %d steps for this process", rows.shape[0], rows.shape[1])
    while True:
        for t in range(rows.shape[1]):
            batch = {
                "tokens": rows[:, t],
                "id": row_ids[:, t],
                "reset": np.full(batch_size, 1 if t == 0 else 0, np.int64),
            }
            yield {name: batch[name] for name in (*data.names, "reset") if name in batch}


def _locate_corruption(files: list[str], num_shards: int, shard: int, exc) -> Exception:
    """The error of a corrupt TFRecord file, naming it (TensorFlow's message gives only the
    offset): the files this shard reads are checked one by one."""
    import re

    from sparktf.datasets import tfrecord

    candidates = files[shard::num_shards] if len(files) % num_shards == 0 else files
    said = re.sub(r"\{\{.*?\}\}\s*|\s*\[Op:.*$", "", exc.message.splitlines()[0]).strip()
    for path in candidates:
        try:
            tfrecord.read_records(path, verify_data=True)
        except (tfrecord.TFRecordError, OSError) as bad:
            return tfrecord.TFRecordError(f"{bad} (TensorFlow: {said})")
    return exc
