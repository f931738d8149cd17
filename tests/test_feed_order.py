"""The feed's order without Spark (sparktf.train.feed.order): positions, whole global
batches, what is left over, the epochs' seeds and permutation constants; the files input's
place in its shards' streams."""

from __future__ import annotations

import functools
import random
from collections import Counter

import pytest

from sparktf.train.feed.order import (
    FilesPosition,
    Position,
    Segment,
    epoch_rows,
    left_over,
    permutation_spec,
)

pytestmark = pytest.mark.unit


def test_an_epoch_feeds_whole_global_batches_and_reports_the_rest():
    assert epoch_rows(100, 0, 16) == 96 and left_over(100, 0, 16) == 4
    assert epoch_rows(100, 32, 16) == 64 and left_over(100, 32, 16) == 4
    assert epoch_rows(100, 96, 16) == 0 and left_over(100, 96, 16) == 4
    assert epoch_rows(10, 0, 16) == 0 and left_over(10, 0, 16) == 10


def test_a_position_moves_by_global_batches_and_on_to_the_next_epoch():
    start = Position()
    assert start.advance(0, 16, 100) == Position(0, 0)
    assert start.advance(5, 16, 100) == Position(0, 80)
    assert start.advance(6, 16, 100) == Position(1, 0)  # 96 trained, 4 left over
    assert start.advance(14, 16, 100) == Position(2, 32)
    # a resize changes the batch: the rest of the epoch in batches of the new size
    assert Position(0, 80).advance(1, 8, 100) == Position(0, 88)
    assert Position(0, 80).advance(0, 24, 100) == Position(1, 0)  # 20 left < 24: next epoch
    assert Position(0, 80).normalized(24, 100) == Position(1, 0)
    assert Position(0, 80).normalized(16, 100) == Position(0, 80)
    assert Position.from_dict(Position(3, 48).to_dict()) == Position(3, 48)
    assert Position.from_dict(None) == Position()
    with pytest.raises(ValueError, match="cannot fill a global batch"):
        start.advance(1, 16, 10)


def test_each_epoch_has_its_own_permutation_over_a_grid_of_the_rows():
    first, second = permutation_spec(1000, 7, 0), permutation_spec(1000, 7, 1)
    assert first.seed != second.seed and permutation_spec(1000, 7, 0) == first
    assert permutation_spec(1000, 8, 0).seed != first.seed  # another run's seed
    assert (first.grid_rows, first.grid_cols) == (32, 31) and first.grid <= 1000
    assert 1000 - first.grid < first.grid_cols
    assert 0 <= first.rotation < 1000
    assert permutation_spec(1, 0, 0).grid == 1


def test_the_files_input_goes_on_at_the_same_record_of_each_shard_for_the_same_shape():
    fresh = FilesPosition.from_dict(None, shards=2, batch=8, step=0)
    assert fresh == FilesPosition(2, 8) and fresh.start(50) == 0
    later = fresh.advance(13, size=50)  # 104 records of the chief's 50-record shard
    assert later == FilesPosition(2, 8, base_epoch=0, steps=13, epoch=2)
    again = FilesPosition.from_dict(later.to_dict(), shards=2, batch=8, step=13)
    assert again == later
    assert again.start(50) == 104 and again.start(46) == 104  # every shard: 13 steps in
    assert again.advance(2, size=50).steps == 15
    # a checkpoint without a files place (an older sparktf): placed by its step
    assert FilesPosition.from_dict(None, 2, 8, step=7).start(50) == 56
    assert FilesPosition.from_dict({"epoch": 1, "cursor": 32}, 2, 8, step=7).start(50) == 56


def test_another_shape_drains_the_chief_s_pass_then_starts_the_next_in_the_new_split():
    place = FilesPosition(2, 8, base_epoch=0, steps=13, epoch=2).to_dict()  # 104 records in
    sizes = {(2, 0): 50, (2, 1): 46}.__getitem__
    shrunk = FilesPosition.from_dict(
        place, shards=1, batch=16, step=13, sizes=lambda n, i: sizes((n, i))
    )
    # shard 0 is 4 records into its pass 2, shard 1 12 records into it: the rest of pass 2
    assert shrunk.pending == (Segment(2, 0, 104, 150), Segment(2, 1, 104, 138))
    assert (shrunk.base_epoch, shrunk.steps, shrunk.epoch) == (3, 0, 2)
    assert shrunk.drain_steps == 80 // 16 and shrunk.left_over == 0
    assert shrunk.start(100) == 300  # after the drain: pass 3 of the new split
    assert shrunk.advance(5, size=100) == FilesPosition(1, 16, 3, 0, epoch=3)
    assert shrunk.advance(7, size=100) == FilesPosition(1, 16, 3, 2, epoch=3)
    again = FilesPosition.from_dict(shrunk.to_dict(), 1, 16, step=13)  # same shape: no sizes
    assert again == shrunk
    with pytest.raises(ValueError):
        shrunk.advance(-1, size=100)
    with pytest.raises(ValueError, match="sizes"):
        FilesPosition.from_dict(place, shards=3, batch=8, step=13)


def _stream(shards: int, shard: int, rows: int, start: int, count: int) -> list[int]:
    """Records ``start`` to ``start + count`` of a shard's endless stream: shard ``shard``
    holds the ids ``i % shards == shard``, each pass in an order of its own."""
    size = len(range(shard, rows, shards))
    return [_pass(shards, shard, rows, n // size)[n % size] for n in range(start, start + count)]


@functools.cache
def _pass(shards: int, shard: int, rows: int, index: int) -> list[int]:
    order = list(range(shard, rows, shards))
    random.Random(shards * 1000 + shard * 100 + index).shuffle(order)
    return order


def _attempt(position: FilesPosition, rows: int, steps: int) -> list[list[int]]:
    """The records each step of an attempt from ``position`` trains (all its processes)."""
    n, b = position.shards, position.batch
    size = lambda i: len(range(i, rows, n))  # noqa: E731
    drained = [
        [r for s in position.deal(j) for r in _stream(s.shards, s.shard, rows, s.start, s.records)]
        for j in range(n)
    ]
    out = []
    for k in range(steps):
        taken = []
        for j in range(n):
            if k < position.drain_steps:
                taken += drained[j][k * b : (k + 1) * b]
            else:
                at = position.start(size(j)) + (k - position.drain_steps) * b
                taken += _stream(n, j, rows, at, b)
        out.append(taken)
    return out


@pytest.mark.parametrize(
    ("shapes", "before"),
    [
        (((2, 6), (3, 4)), 9),
        (((3, 4), (2, 6)), 9),
        (((2, 6), (3, 4), (1, 12)), 9),  # a second resize in the middle of the drain
        (((2, 1), (1, 2)), 101),  # shard 1 (50 records) one into pass 2, shard 0 (51) not
    ],
)
def test_a_resize_mid_pass_trains_every_record_of_the_pass_once(shapes, before):
    """101 records, shards of unequal sizes: ``before`` steps, then attempts of other
    shapes. When the drain ends every record has been trained as often as every other,
    except fewer than one global batch left over, once less; the next step starts the next
    pass of the last split from its beginning."""
    rows = 101
    batch = shapes[0][0] * shapes[0][1]
    sizes = lambda n, i: len(range(i, rows, n))  # noqa: E731
    position = FilesPosition.from_dict(None, *shapes[0], step=0)
    trained: list[list[int]] = []
    drained = 0  # the steps of the drain, over the attempts after the first
    for index, shape in enumerate(shapes):
        if index:
            position = FilesPosition.from_dict(position.to_dict(), *shape, step=0, sizes=sizes)
        steps = before if index == 0 else (2 if index < len(shapes) - 1 else 99)
        drained += min(steps, position.drain_steps)
        trained += _attempt(position, rows, steps)
        position = position.advance(steps, size=sizes(position.shards, 0))
    counts = Counter(r for step in trained[: before + drained] for r in step)
    times = max(counts.values())
    short = [r for r in range(rows) if counts[r] != times]
    assert all(counts[r] == times - 1 for r in short), counts  # none twice more, none skipped
    assert len(short) < batch  # only what cannot fill a last global batch
    n, b = shapes[-1]
    assert trained[before + drained] == [
        r for j in range(n) for r in _stream(n, j, rows, times * sizes(n, j), b)
    ]  # then the next pass of the last split, from its beginning
