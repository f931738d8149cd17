"""TFRecord part files on HDFS streamed into ``tf.data``: the generator behind
``readers.tfrecord_dataset`` for paths TensorFlow cannot open.

Each open file is received by a thread of its own straight into numpy blocks
(``storage.open_scan``: one streaming request per file), framed where it lies
(``tfrecord.index_records``: record offsets, no Python object per record) and interleaved in
exactly the order of ``tf.data``'s deterministic interleave over local files. Each element
handed to TensorFlow is one ``bytes`` holding a batch's records back to back with their
offsets and lengths; ``split_records`` cuts it into a string tensor inside TensorFlow.
"""

from __future__ import annotations

import contextlib
import queue
import threading
from collections.abc import Iterator

import numpy as np
import tensorflow as tf

from sparktf import storage
from sparktf.datasets import tfrecord

__all__ = [
    "HDFS_FIRST_BLOCK",
    "HDFS_READ_AHEAD",
    "HDFS_READ_BLOCK",
    "INTERLEAVE_BLOCK",
    "TFRecordStreams",
    "split_records",
]

HDFS_READ_BLOCK = 4 << 20  # bytes received per block of an HDFS file's one streaming request
HDFS_FIRST_BLOCK = 256 << 10  # a small first block: records flow before a whole block is in
HDFS_READ_AHEAD = 2  # blocks each open HDFS file holds ready ahead of use
INTERLEAVE_BLOCK = 16  # records taken from one file before the next (tf.data interleave)

# A run of records of one block: (block, data offsets, lengths).
Run = tuple[np.ndarray, np.ndarray, np.ndarray]


class FileRecords:
    """One TFRecord file read by a background thread: one streaming request for the whole
    file, received into blocks and framed as they arrive, up to ``depth`` blocks ahead of use.
    Several of these read concurrently (one per open file)."""

    def __init__(self, path: str, verify: bool, block: int, depth: int):
        self.path = path
        self._queue: queue.Queue = queue.Queue(depth)
        self._stop = threading.Event()
        self._run: Run | None = None
        self._at = 0
        self._done = False
        self._thread = threading.Thread(
            target=self._fetch, args=(verify, block), daemon=True, name=f"tfrecord {path}"
        )
        self._thread.start()

    def _blocks(self, scan, verify: bool, block: int) -> Iterator[Run]:
        """Framed blocks of the file; a record cut by a block's end starts the next one."""
        carry = np.empty(0, dtype=np.uint8)
        offset, want = 0, min(block, HDFS_FIRST_BLOCK)  # offset: file offset of carry[0]
        while True:
            need = want
            if len(carry) >= tfrecord.HEADER_BYTES:  # its length checked: it must fit whole
                need = max(need, int(carry[:8].view("<u8")[0]) + 16 - len(carry))
            buf = np.empty(len(carry) + need, dtype=np.uint8)
            buf[: len(carry)] = carry
            got = storage.fill(scan, memoryview(buf)[len(carry) :])
            size = len(carry) + got
            starts, lengths, used = tfrecord.index_records(
                buf, size, name=self.path, offset=offset, verify_data=verify
            )
            if len(starts):
                yield buf, starts, lengths
            carry, offset, want = buf[used:size], offset + used, block
            if got < need:
                break
        if len(carry):
            raise tfrecord.TFRecordError(
                f"{self.path}: truncated TFRecord file: {len(carry)} bytes at byte offset "
                f"{offset} do not hold a whole record"
            )

    def _fetch(self, verify: bool, block: int) -> None:
        try:
            with storage.open_scan(self.path) as scan:
                for run in self._blocks(scan, verify, block):
                    if not self._put(run):
                        return
            self._put(None)
        except BaseException as exc:  # handed to the reading thread
            self._put(exc)

    def _put(self, item) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def take(self, n: int) -> Run | None:
        """Up to ``n`` next records as a run; None once the file is done."""
        while self._run is None or self._at >= len(self._run[1]):
            if self._done:
                return None
            item = self._queue.get()
            if isinstance(item, BaseException):
                self._done = True
                raise item
            if item is None:
                self._done = True
                return None
            self._run, self._at = item, 0
        buf, starts, lengths = self._run
        end = self._at + n
        run = (buf, starts[self._at : end], lengths[self._at : end])
        self._at = min(end, len(starts))
        return run

    def close(self) -> None:
        self._stop.set()
        with contextlib.suppress(queue.Empty):
            while True:
                self._queue.get_nowait()
        self._thread.join(timeout=5)


def _pack(runs: list[Run]) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The records of ``runs`` as one ``bytes`` (each run's span copied once) with their
    offsets in it and lengths."""
    parts, starts, base = [], [], 0
    for buf, at, lengths in runs:
        first, end = int(at[0]), int(at[-1] + lengths[-1])
        parts.append(buf[first:end])
        starts.append(at + (base - first))
        base += end - first
    return b"".join(parts), np.concatenate(starts), np.concatenate([r[2] for r in runs])


def split_records(blob, starts, lengths):
    """The string tensor of the records packed in ``blob`` (an element of
    :class:`TFRecordStreams`)."""
    return tf.strings.substr(blob, starts, lengths)


class TFRecordStreams:
    """The generator behind ``tfrecord_dataset`` on HDFS: concurrent shard streams.

    ``cycle`` files are open at once, each streamed and framed by its own thread (and
    ``cycle`` more opened ahead, so a finished file's successor is already flowing); their
    records are interleaved in exactly the order of the local reader's ``tf.data``
    interleave (``cycle_length=cycle, block_length=INTERLEAVE_BLOCK``, deterministic), then
    sharded by records when asked. Elements: ``(blob, starts, lengths)`` of ``chunk`` records
    (the last one fewer unless ``drop_remainder``), for :func:`split_records`.
    """

    def __init__(
        self,
        files,
        *,
        cycle,
        chunk,
        by_records,
        num_shards,
        shard_index,
        shuffle_files,
        seed,
        repeat,
        drop_remainder,
        verify,
    ):
        self.files, self.cycle, self.chunk = list(files), cycle, chunk
        self.by_records, self.num_shards, self.shard_index = by_records, num_shards, shard_index
        self.shuffle_files, self.seed, self.repeat = shuffle_files, seed, repeat
        self.drop_remainder, self.verify = drop_remainder, verify
        self.calls = 0

    def _epochs(self, rng) -> Iterator[list[str]]:
        while True:
            if self.shuffle_files:
                yield [self.files[i] for i in rng.permutation(len(self.files))]
            else:
                yield self.files
            if not self.repeat:
                return

    def _interleave(self, names: Iterator[str]) -> Iterator[Run]:
        """Runs of records in tf.data's deterministic interleave order (see
        InterleaveDatasetOp: a finished file hands its turn to the next slot; an empty slot
        opens the next file when its turn comes)."""
        ahead: list[FileRecords] = []
        slots: list[FileRecords | None] = [None] * self.cycle
        names = iter(names)
        end_of_input = False

        def top_up() -> None:
            nonlocal end_of_input
            while not end_of_input and len(ahead) < self.cycle:
                name = next(names, None)
                if name is None:
                    end_of_input = True
                else:
                    ahead.append(FileRecords(name, self.verify, HDFS_READ_BLOCK, HDFS_READ_AHEAD))

        try:
            top_up()
            index, taken, open_ = 0, 0, 0
            while ahead or open_:
                current = slots[index]
                if current is not None:
                    run = current.take(INTERLEAVE_BLOCK - taken)
                    if run is not None:
                        yield run
                        taken += len(run[1])
                        if taken == INTERLEAVE_BLOCK:
                            index, taken = (index + 1) % self.cycle, 0
                        continue
                    current.close()
                    slots[index], open_ = None, open_ - 1
                elif ahead:
                    slots[index], open_ = ahead.pop(0), open_ + 1
                    top_up()
                    continue
                index, taken = (index + 1) % self.cycle, 0
        finally:
            for stream in [*ahead, *slots]:
                if stream is not None:
                    stream.close()

    def _records(self, rng) -> Iterator[Run]:
        """Runs of this worker's records, in order, epoch after epoch (an epoch without
        records ends the stream, as ``tf.data``'s repeat does)."""
        if not self.files:
            return
        if not self.by_records:  # tf.data: names.repeat() then interleave (epochs run on)
            yield from self._interleave(name for epoch in self._epochs(rng) for name in epoch)
            return
        for epoch in self._epochs(rng):  # interleave, .shard(n, i), then .repeat()
            position = kept = 0
            for buf, at, lengths in self._interleave(epoch):
                first = (self.shard_index - position) % self.num_shards
                position += len(at)
                if first < len(at):
                    kept += 1
                    step = self.num_shards
                    yield buf, at[first::step], lengths[first::step]
            if not kept:
                return

    def __call__(self, index=None) -> Iterator[tuple[bytes, np.ndarray, np.ndarray]]:
        # tf.data calls this once per iteration over the dataset: vary the seed per call, or
        # per pass: the shuffled endless passes give their number (seed + index).
        if index is None:
            index, self.calls = self.calls, self.calls + 1
        seed = None if self.seed is None else self.seed + int(index)
        rng = np.random.default_rng(seed)
        pending: list[Run] = []
        held = 0
        for run in self._records(rng):
            pending.append(run)
            held += len(run[1])
            while held >= self.chunk:
                out, cut = [], self.chunk
                while cut:
                    buf, at, lengths = pending.pop(0)
                    if len(at) > cut:  # split: the rest stays first in line
                        pending.insert(0, (buf, at[cut:], lengths[cut:]))
                        at, lengths = at[:cut], lengths[:cut]
                    out.append((buf, at, lengths))
                    cut -= len(at)
                held -= self.chunk
                yield _pack(out)
        if pending and not self.drop_remainder:
            yield _pack(pending)
