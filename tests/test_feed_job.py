"""The driver's side of the spark input mode (sparktf.train.feed.job): the frame it feeds."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from sparktf.datasets.formats import Field, arrow_schema, encode_ndarray_column
from sparktf.train.feed.job import FeedJob

pytestmark = pytest.mark.integration

FIELDS = (Field("image", "uint8", (2, 2)), Field("label", "int64"))


def _write_split(directory, sizes) -> list[int]:
    """Parquet parts of ``sizes`` rows as sparktf writes them; the labels written."""
    directory.mkdir(parents=True)
    schema = arrow_schema([*FIELDS, Field("id", "int64")])
    labels, start = [], 0
    for i, n in enumerate(sizes):
        ids = np.arange(start, start + n)
        images = np.broadcast_to((ids % 256).astype(np.uint8)[:, None, None], (n, 2, 2))
        table = pa.Table.from_arrays(
            [encode_ndarray_column(np.ascontiguousarray(images)), pa.array(ids % 7), pa.array(ids)],
            schema=schema,
        )
        pq.write_table(table, directory / f"part-{i:05d}.parquet")
        labels += list(ids % 7)
        start += n
    return labels


def _job(spark, parquet, df=None) -> FeedJob:
    data = SimpleNamespace(fields=FIELDS, names=[f.name for f in FIELDS], parquet=str(parquet))
    return FeedJob(spark, SimpleNamespace(data=data), control=None, nodes={}, df=df)


def _plan(df) -> str:
    return df._jdf.queryExecution().executedPlan().toString()


def test_small_files_are_read_apart_not_shuffled_and_the_schema_is_not_inferred(spark, tmp_path):
    """4 small files, which Spark packs into 2 partitions, come as 4 partitions without an
    exchange (shuffle); only the model's columns, as the fields say."""
    labels = _write_split(tmp_path / "parquet", [5, 6, 7, 8])
    assert spark.read.parquet(f"file://{tmp_path}/parquet").rdd.getNumPartitions() < 4
    df = _job(spark, tmp_path / "parquet")._frame(4)
    assert df.rdd.getNumPartitions() >= 4
    assert "Exchange" not in _plan(df)
    assert df.columns == ["image", "label"]
    assert sorted(r.label for r in df.collect()) == sorted(labels)


def test_enough_partitions_stay_as_they_are_and_too_few_are_repartitioned(spark, tmp_path):
    """A frame with partitions enough is fed as it is; one file (one partition) and a given
    DataFrame of one partition are repartitioned."""
    _write_split(tmp_path / "many", [3] * 6)
    df = _job(spark, tmp_path / "many")._frame(4)
    assert "Exchange" not in _plan(df)
    _write_split(tmp_path / "one", [9])
    df = _job(spark, tmp_path / "one")._frame(4)
    assert df.rdd.getNumPartitions() == 4 and "Exchange" in _plan(df)
    given = spark.read.parquet(f"file://{tmp_path}/one").coalesce(1)
    df = _job(spark, tmp_path / "unused", df=given)._frame(4)
    assert df.rdd.getNumPartitions() == 4
    assert sorted(r.label for r in df.collect()) == sorted(r.label for r in given.collect())
