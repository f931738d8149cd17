"""The feed's order without Spark (sparktf.train.feed.order): positions, whole global
batches, what is left over, the epochs' seeds and permutation constants; the files input's
place in its shards' streams."""

from __future__ import annotations

import pytest

from sparktf.train.feed.order import (
    FilesPosition,
    Position,
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


def test_another_shape_starts_the_chief_s_pass_afresh_in_the_new_split():
    place = FilesPosition(2, 8, base_epoch=0, steps=13, epoch=2).to_dict()
    shrunk = FilesPosition.from_dict(place, shards=1, batch=16, step=13)
    assert shrunk == FilesPosition(1, 16, base_epoch=2, steps=0, epoch=2)
    assert shrunk.start(100) == 200  # shard of 100 records: pass 2 from its beginning
    assert shrunk.advance(3, size=100) == FilesPosition(1, 16, 2, 3, epoch=2)
    assert shrunk.advance(7, size=100).epoch == 3  # 200 + 112 records
    with pytest.raises(ValueError):
        shrunk.advance(-1, size=100)
