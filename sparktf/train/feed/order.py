"""The order of the ``spark`` input mode: every row once per epoch, equal shares, a seeded
global shuffle, and a position that a restart or a resize goes on from exactly.

The rows of the fed DataFrame are numbered once, densely: ``g`` in ``[0, T)``, a partition's
rows after those of the partitions before it (the partitions' row counts are counted before
the first pass; every pass must find the same rows in the same partitions, which a
deterministic plan does).

**Epoch order.** Epoch ``e`` puts the rows in the order of ``x = permutation(g)``, a bijection
of ``[0, T)`` seeded by ``TrainConfig.seed`` and ``e`` (:func:`permutation_spec`): a rotation,
then four Feistel rounds over a ``R x C`` grid (``C = floor(sqrt(T))``), their round
functions ``xxhash64``; the fewer than ``C`` rows past the grid keep their rotated place. It is
evaluated by Spark's own expressions (:mod:`sparktf.train.feed.job`); ``shuffle=False`` keeps
``x = g``, the stored order.

**Position.** :class:`Position` ``(epoch, cursor)``: the rows ``x < cursor`` of the epoch are
trained. An attempt of ``N`` training processes with a global batch ``B`` feeds from its
position the rows ``cursor <= x < cursor + M``, ``M = floor((T - cursor) / B) * B``
(:func:`epoch_rows`): process ``j`` gets those with ``(x - cursor) % N == j``, in ascending
``x``, so each step takes the next ``B`` rows of the order, ``B / N`` from each process. The
fewer than ``B`` rows left (:func:`left_over`) are not trained in that epoch, and the next
epoch starts at cursor 0. Every process gets the same number of rows, every row of the
order once; a checkpoint at step ``s`` records where its epoch stands
(:meth:`Position.advance`), and the next attempt, with any number of processes and any
batch, goes on from there: no row trained twice, none skipped.

**The files input** (:class:`FilesPosition`). Each training process reads its own shard of
the dataset's files as an endless stream of passes, pass ``p`` shuffled with its own seed
(:mod:`sparktf.datasets.readers`), so record ``n`` of a shard's stream is always the same
record. A checkpoint records, for the shape the attempt ran with (``shards`` readers of
``batch`` records a step), the pass the attempt started at (``base_epoch``) and the steps
trained since: shard ``i`` stands at record ``base_epoch * size_i + steps * batch``. A restart
with the same shape goes on from exactly there. With another shape (a resize, or another
batch) the shards hold other files, so the attempt first *drains* the pass in progress
(``E``: the last pass any old shard has begun; shards of unequal sizes drift apart by their
difference each pass): the rest of each old shard's stream up to the end of its pass ``E``
(:class:`Segment`, ``pending``), laid end to end and dealt to the new processes in equal
runs of whole steps (:meth:`FilesPosition.deal`); the fewer than one global batch left over
are not trained. Then every process starts pass ``E + 1`` of the new split from its
beginning: every record has been trained ``E + 1`` times, those left over ``E``. A
checkpoint during the drain records what of it is still pending (each process's rest, in
process order), so a restart, or another resize, deals that again: no record of the pass is
trained twice, none skipped beyond that remainder.

No Spark and no TensorFlow here: the driver, the feeding tasks and the TensorFlow processes
share it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

__all__ = [
    "FEISTEL_ROUNDS",
    "FilesPosition",
    "Position",
    "PermutationSpec",
    "Segment",
    "epoch_rows",
    "left_over",
    "permutation_spec",
]

FEISTEL_ROUNDS = 4
_SEED_MASK = (1 << 62) - 1


def epoch_rows(rows: int, cursor: int, batch: int) -> int:
    """The rows an attempt feeds from ``cursor`` to the end of its epoch: whole global
    batches of ``batch`` rows."""
    return max(0, rows - cursor) // batch * batch


def left_over(rows: int, cursor: int, batch: int) -> int:
    """The rows of the epoch past ``cursor`` that do not fill a last global batch."""
    return max(0, rows - cursor) - epoch_rows(rows, cursor, batch)


@dataclass(frozen=True)
class Position:
    """Where the feed of a run stands: the epoch, and the rows of its order trained."""

    epoch: int = 0
    cursor: int = 0

    def advance(self, steps: int, batch: int, rows: int) -> Position:
        """The position ``steps`` global batches of ``batch`` rows later, in a table of
        ``rows`` rows (an epoch ends when less than a batch is left)."""
        if steps < 0:
            raise ValueError(f"cannot go back {-steps} steps")
        if epoch_rows(rows, 0, batch) == 0:
            raise ValueError(f"{rows} rows cannot fill a global batch of {batch}")
        position = self.normalized(batch, rows)
        epoch, cursor = position.epoch, position.cursor
        while steps:
            take = min(steps, epoch_rows(rows, cursor, batch) // batch)
            cursor, steps = cursor + take * batch, steps - take
            if epoch_rows(rows, cursor, batch) == 0:
                epoch, cursor = epoch + 1, 0
        return Position(epoch, cursor)

    def normalized(self, batch: int, rows: int) -> Position:
        """This position, or the start of the next epoch when what is left of this one
        cannot fill a global batch of ``batch`` rows."""
        if self.cursor and epoch_rows(rows, self.cursor, batch) == 0:
            return Position(self.epoch + 1, 0)
        return self

    def to_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "cursor": self.cursor}

    @classmethod
    def from_dict(cls, data: dict | None) -> Position:
        if not data:
            return cls()
        return cls(int(data["epoch"]), int(data["cursor"]))


@dataclass(frozen=True)
class Segment:
    """Records ``[start, stop)`` of the endless stream of shard ``shard`` of a split into
    ``shards`` shards."""

    shards: int
    shard: int
    start: int
    stop: int

    @property
    def records(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class FilesPosition:
    """Where the files input of a run stands (see the module): the shape it was read with,
    the pass its attempt started at, the steps trained since, the pass in progress, and the
    records of an earlier shape still to drain before the stream (``steps`` is 0 while
    any are pending)."""

    shards: int
    batch: int  # records each shard gives a step
    base_epoch: int = 0
    steps: int = 0
    epoch: int = 0
    pending: tuple[Segment, ...] = ()

    @property
    def drain_steps(self) -> int:
        """The steps the pending records fill (whole global batches)."""
        step = self.shards * self.batch
        return epoch_rows(sum(s.records for s in self.pending), 0, step) // step

    @property
    def left_over(self) -> int:
        """The pending records past the last whole global batch: not trained."""
        return left_over(sum(s.records for s in self.pending), 0, self.shards * self.batch)

    def deal(self, index: int, done: int = 0) -> list[Segment]:
        """Process ``index``'s part of the drain, in order, past the ``done`` records of it
        already trained: records ``[index * n + done, (index + 1) * n)`` of the pending
        segments laid end to end, ``n`` the drain's steps times ``batch``."""
        n = self.drain_steps * self.batch
        return _cut(self.pending, index * n + done, (index + 1) * n)

    def start(self, size: int) -> int:
        """The record of a shard of ``size`` records a pass that its stream goes on from
        (after the drain)."""
        return self.base_epoch * size + self.steps * self.batch

    def advance(self, steps: int, size: int) -> FilesPosition:
        """The position ``steps`` steps later; ``size``: the chief's shard's records a pass."""
        if steps < 0:
            raise ValueError(f"cannot go back {-steps} steps")
        if self.pending:
            drain = self.drain_steps
            if steps < drain:
                # each process's rest, in process order: dealt again the same way
                done = steps * self.batch
                rest = tuple(s for i in range(self.shards) for s in self.deal(i, done))
                return FilesPosition(self.shards, self.batch, self.base_epoch, 0, self.epoch, rest)
            steps -= drain
        later = self.steps + steps
        epoch = (self.base_epoch * size + later * self.batch) // size if size else 0
        return FilesPosition(self.shards, self.batch, self.base_epoch, later, epoch)

    def for_shape(self, shards: int, batch: int, sizes: Callable[[int, int], int]) -> FilesPosition:
        """This position for an attempt of ``shards`` readers of ``batch`` records a step:
        itself for the same shape; else a drain (what is pending, or the rest of every
        shard's stream up to the end of the last pass any shard has begun), then the next
        pass. ``sizes(n, i)``: the records a pass of shard ``i`` of a split into ``n``
        holds."""
        if (shards, batch) == (self.shards, self.batch):
            return self
        if self.pending:  # a drain not finished: the new shape takes what is left of it
            return FilesPosition(shards, batch, self.base_epoch, 0, self.epoch, self.pending)
        sized = [(i, sizes(self.shards, i)) for i in range(self.shards)]
        # the last pass any shard has begun (shards of unequal sizes drift apart)
        last = max((-(-self.start(size) // size) - 1 for _, size in sized if size), default=-1)
        ends = [Segment(self.shards, i, self.start(size), (last + 1) * size) for i, size in sized]
        pending = tuple(s for s in ends if s.records > 0)
        return FilesPosition(shards, batch, last + 1, 0, max(last, 0), pending)

    def without_pending(self) -> FilesPosition:
        """This position with nothing to drain: the pass in progress from its beginning (a
        stream that cannot be read in spans: the language model's token streams)."""
        if not self.pending:
            return self
        return FilesPosition(self.shards, self.batch, self.epoch, 0, self.epoch)

    def to_dict(self) -> dict:
        out: dict = {
            "input": "files",
            "shards": self.shards,
            "batch": self.batch,
            "base_epoch": self.base_epoch,
            "steps": self.steps,
            "epoch": self.epoch,
        }
        if self.pending:
            out["pending"] = [[s.shards, s.shard, s.start, s.stop] for s in self.pending]
        return out

    @classmethod
    def from_dict(
        cls,
        data: dict | None,
        shards: int,
        batch: int,
        step: int,
        sizes: Callable[[int, int], int] | None = None,
    ) -> FilesPosition:
        """The position a checkpoint recorded (:meth:`to_dict`) for an attempt of this
        shape (``sizes``: as for :meth:`for_shape`, asked only for another shape); a
        checkpoint without one (an older sparktf, or the other input mode) is placed by its
        ``step``, as if read with this shape all along."""
        if not data or data.get("input") != "files":
            return cls(shards, batch, steps=step)
        keys = ("shards", "batch", "base_epoch", "steps", "epoch")
        pending = tuple(Segment(*(int(v) for v in s)) for s in data.get("pending", ()))
        recorded = cls(*(int(data[k]) for k in keys), pending=pending)
        return recorded.for_shape(shards, batch, sizes or _no_sizes)


def _no_sizes(shards: int, index: int) -> int:
    raise ValueError("another shape needs the sizes of the recorded shards")


def _cut(segments: tuple[Segment, ...], begin: int, end: int) -> list[Segment]:
    """Records ``[begin, end)`` of ``segments`` laid end to end, as segments."""
    out, at = [], 0
    for s in segments:
        lo, hi = max(begin, at), min(end, at + s.records)
        if lo < hi:
            out.append(Segment(s.shards, s.shard, s.start + lo - at, s.start + hi - at))
        at += s.records
    return out


@dataclass(frozen=True)
class PermutationSpec:
    """The constants of epoch ``epoch``'s permutation of ``[0, rows)``."""

    rows: int
    seed: int  # the epoch's seed (run seed and epoch mixed)
    rotation: int
    grid_rows: int  # R
    grid_cols: int  # C

    @property
    def grid(self) -> int:
        return self.grid_rows * self.grid_cols


def epoch_seed(seed: int, epoch: int) -> int:
    """A seed of its own for each epoch of a run (a 62-bit mix of both)."""
    z = (seed * 0x9E3779B97F4A7C15 + (epoch + 1) * 0xBF58476D1CE4E5B9) & ((1 << 64) - 1)
    z ^= z >> 31
    z = (z * 0x94D049BB133111EB) & ((1 << 64) - 1)
    return (z ^ (z >> 29)) & _SEED_MASK


def permutation_spec(rows: int, seed: int, epoch: int) -> PermutationSpec:
    """The permutation of epoch ``epoch`` of a run seeded ``seed`` over ``rows`` rows."""
    if rows <= 0:
        raise ValueError("no rows to order")
    s = epoch_seed(seed, epoch)
    cols = max(1, math.isqrt(rows))
    return PermutationSpec(
        rows=rows, seed=s, rotation=s % rows, grid_rows=rows // cols, grid_cols=cols
    )
