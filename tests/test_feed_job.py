"""The Spark side of the feed's order (sparktf.train.feed.passes): every row numbered once,
each epoch's pass one partition per process, equal shares, a seeded global shuffle, exact
resume from a position; a plan that changes between passes is refused."""

from __future__ import annotations

import numpy as np
import pytest

from sparktf.train.feed import passes
from sparktf.train.feed.order import Position, epoch_rows

pytestmark = pytest.mark.integration


def _table(spark, rows: int, parts: int):
    """``id`` 0..rows-1, stored sorted, in ``parts`` range partitions of unequal sizes."""
    from pyspark.sql import functions as F

    df = spark.range(rows, numPartitions=1).withColumn("key", F.col("id") * F.col("id"))
    return df.repartitionByRange(parts, "key").select("id")


def _shares(spark, numbered, rows, position, batch, processes, seed=5, shuffle=True):
    """Each share's ids in the order fed, by partition."""
    keys = passes.share_keys(spark, processes)
    frame, count = passes.pass_frame(
        numbered, rows=rows, position=position, batch=batch, keys=keys, seed=seed, shuffle=shuffle
    )
    assert frame.rdd.getNumPartitions() == processes
    got = frame.rdd.glom().map(lambda part: [r.id for r in part]).collect()
    return got, count


@pytest.mark.parametrize("processes", [2, 3])
def test_each_epoch_feeds_every_row_once_in_equal_shares_shuffled_anew(spark, processes):
    rows, batch = 1003, 12
    df = _table(spark, rows, 7)
    counts = passes.partition_rows(df)
    assert len(counts) == 7 and sum(counts) == rows and len(set(counts)) > 1
    numbered = passes.numbered(df, counts)
    assert sorted(r[passes.INDEX] for r in numbered.collect()) == list(range(rows))
    orders = []
    for epoch in range(3):
        shares, count = _shares(spark, numbered, rows, Position(epoch, 0), batch, processes)
        assert count == epoch_rows(rows, 0, batch) == 996
        assert [len(s) for s in shares] == [count // processes] * processes
        fed = [i for share in shares for i in share]
        assert len(set(fed)) == count and set(fed) <= set(range(rows))
        # the global order: step k takes the k-th batch / processes rows of every share
        order = [shares[j][k] for k in range(count // processes) for j in range(processes)]
        orders.append(order)
    assert orders[0] != orders[1] != orders[2]
    # shuffled: the stored order (ids sorted) is gone, within a share and across epochs
    rho = np.corrcoef(np.arange(len(orders[0])), orders[0])[0, 1]
    assert abs(rho) < 0.1, rho
    # the same seed gives the same order; the stored order without shuffling
    again, _ = _shares(spark, numbered, rows, Position(0, 0), batch, processes)
    assert [again[j][k] for k in range(count // processes) for j in range(processes)] == orders[0]
    stored, _ = _shares(spark, numbered, rows, Position(0, 0), batch, processes, shuffle=False)
    assert stored[0] == list(range(0, 996, processes))


def test_a_resumed_epoch_feeds_exactly_the_rows_not_trained(spark):
    """After 5 steps of 3 processes (batch 12), the rest of the epoch goes to 2 processes
    with a batch of 8: no row of the first 60 again, none of the rest skipped."""
    rows = 1003
    df = _table(spark, rows, 5)
    numbered = passes.numbered(df, passes.partition_rows(df))
    first, _ = _shares(spark, numbered, rows, Position(1, 0), 12, 3)
    order = [first[j][k] for k in range(len(first[0])) for j in range(3)]
    trained = order[:60]
    position = Position(1, 0).advance(5, 12, rows)
    assert position == Position(1, 60)
    rest, count = _shares(spark, numbered, rows, position, 8, 2)
    assert count == 936 and [len(s) for s in rest] == [468, 468]
    again = [rest[j][k] for k in range(468) for j in range(2)]
    assert again == order[60 : 60 + 936]  # the epoch's order goes on, exactly
    assert not set(again) & set(trained)


def test_a_plan_whose_rows_change_between_passes_is_refused(spark):
    from pyspark.sql import functions as F

    df = spark.range(200, numPartitions=2)
    counts = passes.partition_rows(df)
    grown = spark.range(300, numPartitions=2)  # a partition now holds more rows
    numbered = passes.numbered(grown, counts)
    with pytest.raises(Exception, match="holds more rows than when its rows were counted"):
        numbered.agg(F.max(passes.INDEX)).collect()


def test_a_small_tables_epochs_go_several_to_a_pass_in_the_same_orders(spark):
    """Three epochs in one pass (one shuffle) feed each process its shares of the three,
    one after the other, exactly as three passes of one epoch each would."""
    rows, batch = 1003, 12
    df = _table(spark, rows, 5)
    numbered = passes.numbered(df, passes.partition_rows(df))
    keys = passes.share_keys(spark, 2)
    apart = [[], []]
    start = Position(0, 36)  # the first epoch resumed after 3 steps
    for epoch in range(3):
        position = start if epoch == 0 else Position(epoch, 0)
        shares, _ = _shares(spark, numbered, rows, position, batch, 2)
        for j in range(2):
            apart[j] += shares[j]
    frame, counts = passes.epochs_frame(
        numbered, rows=rows, first=start, epochs=3, batch=batch, parts=2, seed=5, shuffle=True
    )
    assert counts == [960, 996, 996]
    together = passes.shares_frame(frame, keys).rdd.glom()
    assert together.map(lambda part: [r.id for r in part]).collect() == apart
