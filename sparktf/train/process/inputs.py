"""Where a TensorFlow process's batches come from, for both input modes.

:func:`open_batches` returns a :class:`Source` of numpy batches of exactly ``batch_size``
rows, from the plan's dataset description (:class:`~sparktf.train.plan.DataInfo`):

* ``spark``: the process's :class:`~sparktf.train.feed.chunks.FeedReader`;
* ``files``: the process's shard of the split, repeated and reshuffled every pass, read
  with :mod:`sparktf.datasets.readers` (TFRecord or Parquet, local or ``hdfs://``; by
  files when their number is a multiple of the workers, else by records).

Under the ``ps`` strategy the chief is the only reader: it reads every shard and hands
batches to the workers (TF2 parameter-server workers run only the graph functions the
coordinator sends; a Python reader -- and TensorFlow has no HDFS file system -- cannot run
there).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from sparktf.train.config import ConfigError
from sparktf.train.plan import DataInfo, ProcessSpec, Role

__all__ = ["Primed", "Source", "file_batches", "open_batches", "stream_layout"]

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


def open_batches(spec: ProcessSpec, role: Role, control, batch_size: int) -> Source:
    """This process's batches (``batch_size`` rows each)."""
    plan = spec.plan
    if role.strategy == "ps":
        num_shards, shard = 1, 0
    else:
        num_shards, shard = role.num_workers, role.rank
    seed = plan.train.seed + 1000 * shard if plan.train.shuffle else None
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
            shuffle_seed=seed,
        ).open()
        exit_hooks.on_exit(lambda: reader.close("failed"))
        return Source(reader.batches(batch_size), finite=True, close_fn=reader.close, reader=reader)
    batches = file_batches(plan.data, plan.train.file_format, batch_size, num_shards, shard, seed)
    # Endless (epochs repeat; an empty shard is an error): all-reduce workers need not agree
    # every step that none has run out, which would cost a collective and a sync per step.
    return Source(batches, finite=False)


def file_batches(
    data: DataInfo, fmt: str, batch_size: int, num_shards: int, shard: int, seed: int | None
) -> Iterator[dict[str, Any]]:
    """Endless exact batches of this shard, from :mod:`sparktf.datasets.readers`."""
    import tensorflow as tf

    from sparktf.datasets import readers

    names = data.names
    if "tokens" in names and seed is None:
        yield from _token_stream_batches(data, fmt, batch_size, num_shards, shard)
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
    )
    if fmt == "tfrecord":
        dataset = readers.tfrecord_dataset(data.data, verify_checksums=True, **options)
    else:
        dataset = readers.parquet_dataset(data.data, **options)
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
            raise _locate_corruption(data.files[fmt], num_shards, shard, exc) from None
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
