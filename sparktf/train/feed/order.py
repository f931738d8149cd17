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
batch) the shards hold other files: the next attempt starts the pass the chief's shard was in
(``epoch``), in the new split, from its beginning.

No Spark and no TensorFlow here: the driver, the feeding tasks and the TensorFlow processes
share it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = [
    "FEISTEL_ROUNDS",
    "FilesPosition",
    "Position",
    "PermutationSpec",
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
class FilesPosition:
    """Where the files input of a run stands (see the module): the shape it was read with,
    the pass its attempt started at, the steps trained since, and the chief's pass."""

    shards: int
    batch: int  # records each shard gives a step
    base_epoch: int = 0
    steps: int = 0
    epoch: int = 0

    def start(self, size: int) -> int:
        """The record of a shard of ``size`` records a pass that its stream goes on from."""
        return self.base_epoch * size + self.steps * self.batch

    def advance(self, steps: int, size: int) -> FilesPosition:
        """The position ``steps`` steps later; ``size``: the chief's shard's records a pass."""
        if steps < 0:
            raise ValueError(f"cannot go back {-steps} steps")
        later = self.steps + steps
        epoch = (self.base_epoch * size + later * self.batch) // size if size else 0
        return FilesPosition(self.shards, self.batch, self.base_epoch, later, epoch)

    def for_shape(self, shards: int, batch: int) -> FilesPosition:
        """This position for an attempt of ``shards`` readers of ``batch`` records a step:
        itself for the same shape, else the start of the chief's pass."""
        if (shards, batch) == (self.shards, self.batch):
            return self
        return FilesPosition(shards, batch, self.epoch, 0, self.epoch)

    def to_dict(self) -> dict[str, int]:
        return {
            "input": "files",
            "shards": self.shards,
            "batch": self.batch,
            "base_epoch": self.base_epoch,
            "steps": self.steps,
            "epoch": self.epoch,
        }

    @classmethod
    def from_dict(cls, data: dict | None, shards: int, batch: int, step: int) -> FilesPosition:
        """The position a checkpoint recorded (:meth:`to_dict`) for an attempt of this
        shape; a checkpoint without one (an older sparktf, or the other input mode) is
        placed by its ``step``, as if read with this shape all along."""
        if not data or data.get("input") != "files":
            return cls(shards, batch, steps=step)
        keys = ("shards", "batch", "base_epoch", "steps", "epoch")
        return cls(*(int(data[k]) for k in keys)).for_shape(shards, batch)


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
