"""Locating TFRecord records in received blocks (tfrecord.index_records): the same records
as the streaming parser, cut records left whole for the next block, checksums checked."""

from __future__ import annotations

import io
import os

import numpy as np
import pytest

from sparktf.datasets import tfrecord

pytestmark = pytest.mark.unit


def _records() -> list[bytes]:
    sizes = [100] * 40 + [7, 300, 0] + [100] * 9
    return [os.urandom(n) for n in sizes]


def test_index_gives_the_records_of_the_stream_parser():
    records = _records()
    blob = tfrecord.frame(records)
    parsed = [r for batch in tfrecord.iter_record_batches(io.BytesIO(blob)) for r in batch]
    buf = np.frombuffer(blob, dtype=np.uint8)
    starts, lengths, used = tfrecord.index_records(buf, len(buf), verify_data=True)
    assert used == len(blob)
    assert [bytes(buf[a : a + n]) for a, n in zip(starts, lengths)] == parsed == records


def test_a_cut_record_is_left_for_the_next_block():
    blob = tfrecord.frame(_records())
    buf = np.frombuffer(blob, dtype=np.uint8)
    starts, _, used = tfrecord.index_records(buf, 1000)
    assert len(starts) == 8 and used == 8 * 116  # 100-byte records take 116 bytes framed
    starts, _, used = tfrecord.index_records(buf, 5)  # not even a header
    assert len(starts) == 0 and used == 0


@pytest.mark.parametrize("flip,what", [(116 * 4 + 1, "length"), (116 * 3 + 20, "data")])
def test_a_corrupt_record_is_named_by_its_offset(flip, what):
    bad = bytearray(tfrecord.frame(_records()))
    bad[flip] ^= 1
    buf = np.frombuffer(bytes(bad), dtype=np.uint8)
    with pytest.raises(tfrecord.TFRecordError, match=f"{what} checksum mismatch.*offset"):
        tfrecord.index_records(buf, len(buf), verify_data=True)
