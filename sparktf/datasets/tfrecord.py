"""TFRecord files and tf.train.Example records without TensorFlow, for any sparktf path.

Spark tasks write TFRecord shards through ``sparktf.storage`` (HDFS included) and readers
stream them back the same way; neither needs TensorFlow's file systems (TensorFlow 2.21 cannot
open ``hdfs://``) nor TensorFlow itself on the executors.

The TFRecord framing of one record is::

    uint64 length (little endian) | uint32 masked_crc32c(length) | data | uint32 masked_crc32c(data)

CRC-32C is computed with numpy, batched over many records at once (a table walk over the
columns of a records x bytes matrix), which runs at a few hundred MB/s per core.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import IO

import numpy as np

from sparktf.errors import SparktfError

__all__ = [
    "FOOTER_BYTES",
    "HEADER_BYTES",
    "READ_BLOCK",
    "TFRecordError",
    "bytes_feature",
    "crc32c",
    "crc32c_many",
    "example",
    "frame",
    "frame_images",
    "image_examples",
    "index_records",
    "int64_feature",
    "iter_record_batches",
    "mask",
    "read_records",
    "token_examples",
]

_POLY = 0x82F63B78  # CRC-32C (Castagnoli), reflected
_MASK_DELTA = 0xA282EAD8
HEADER_BYTES = 12  # length + its crc
FOOTER_BYTES = 4  # crc of the data
READ_BLOCK = 4 << 20


class TFRecordError(SparktfError, ValueError):
    """A TFRecord file whose framing or checksums are wrong."""


def _tables() -> tuple[np.ndarray, np.ndarray, np.ndarray, list[int]]:
    byte = np.zeros(256, dtype=np.uint32)
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ _POLY if c & 1 else c >> 1
        byte[i] = c
    slices = [byte]
    for _ in range(3):
        prev = slices[-1]
        slices.append((prev >> 8) ^ byte[prev & 0xFF])
    x = np.arange(65536, dtype=np.uint32)
    low = slices[3][x & 0xFF] ^ slices[2][x >> 8]  # 4 bytes at once, low 16 bits of (crc^word)
    high = slices[1][x & 0xFF] ^ slices[0][x >> 8]  # ... and its high 16 bits
    return low, high, byte, [int(v) for v in byte]


_LOW, _HIGH, _BYTE, _BYTE_LIST = _tables()
_LOW_LIST, _HIGH_LIST = _LOW.tolist(), _HIGH.tolist()


@lru_cache(maxsize=8192)
def _init_term(length: int) -> int:
    """Register after feeding ``length`` zero bytes from the initial 0xFFFFFFFF."""
    reg = 0xFFFFFFFF
    for _ in range(length // 4):
        reg = _LOW_LIST[reg & 0xFFFF] ^ _HIGH_LIST[reg >> 16]
    for _ in range(length % 4):
        reg = _BYTE_LIST[reg & 0xFF] ^ (reg >> 8)
    return reg


def _raw_registers(matrix: np.ndarray) -> np.ndarray:
    """Zero-initialised CRC-32C registers of the rows of a (n, 4k) uint8 matrix."""
    words = np.ascontiguousarray(matrix).view("<u4")
    columns = np.ascontiguousarray(words.T)
    reg = np.zeros(matrix.shape[0], dtype=np.uint32)
    for word in columns:
        c = reg ^ word
        reg = _LOW[c & 0xFFFF] ^ _HIGH[c >> 16]
    return reg


def crc32c_many(buffers: Sequence[bytes]) -> np.ndarray:
    """CRC-32C of each buffer (uint32 array), computed together.

    Zero bytes in front of a message leave a zero-initialised register at zero, so messages of
    different lengths are left-padded into one matrix; the standard initial value is added
    back per length (``_init_term``).
    """
    n = len(buffers)
    if n == 0:
        return np.zeros(0, dtype=np.uint32)
    lengths = np.fromiter((len(b) for b in buffers), dtype=np.int64, count=n)
    width = int(lengths.max())
    width += (-width) % 4
    if width == 0:
        return np.zeros(n, dtype=np.uint32)
    if lengths.min() == lengths.max() == width:
        matrix = np.frombuffer(b"".join(buffers), dtype=np.uint8).reshape(n, width)
    else:
        matrix = np.zeros((n, width), dtype=np.uint8)
        for row, (buf, length) in enumerate(zip(buffers, lengths)):
            if length:
                matrix[row, width - length :] = np.frombuffer(buf, dtype=np.uint8)
    reg = _raw_registers(matrix)
    init = np.fromiter((_init_term(int(k)) for k in lengths), dtype=np.uint32, count=n)
    return reg ^ init ^ np.uint32(0xFFFFFFFF)


def crc32c(data: bytes) -> int:
    return int(crc32c_many([data])[0])


def mask(crc: np.ndarray) -> np.ndarray:
    """TFRecord's masked CRC: rotate right by 15 bits, add a constant."""
    crc = crc.astype(np.uint32)
    return (((crc >> np.uint32(15)) | (crc << np.uint32(17))) + np.uint32(_MASK_DELTA)).astype(
        np.uint32
    )


# ----------------------------------------------------------------------------- framing


def frame(records: Sequence[bytes]) -> bytes:
    """The TFRecord bytes of ``records`` (framing and checksums included)."""
    if not records:
        return b""
    lengths = [struct.pack("<Q", len(r)) for r in records]
    length_crcs = mask(crc32c_many(lengths))
    data_crcs = mask(crc32c_many(records))
    parts = []
    for length, lcrc, record, dcrc in zip(
        lengths, length_crcs.tolist(), records, data_crcs.tolist()
    ):
        parts += (length, struct.pack("<I", lcrc), record, struct.pack("<I", dcrc))
    return b"".join(parts)


def iter_record_batches(
    stream: IO[bytes],
    *,
    name: str = "<stream>",
    verify_data: bool = False,
    block_bytes: int = READ_BLOCK,
) -> Iterator[list[bytes]]:
    """Yields the records of a TFRecord stream in batches (one per block read).

    Length checksums are always verified (cheap; they catch a file that is not TFRecord or
    is misaligned); data checksums only with ``verify_data`` (HDFS checksums blocks on every
    read already). A record cut short by the end of the file is an error naming the offset.
    """
    buf = b""
    pos = 0
    offset = 0  # file offset of buf[0]
    while True:
        chunk = stream.read(block_bytes)
        if not chunk:
            break
        if pos:
            offset += pos
            buf = buf[pos:]
            pos = 0
        buf = buf + chunk if buf else chunk
        records: list[bytes] = []
        heads: list[bytes] = []
        head_crcs: list[int] = []
        data_crcs: list[int] = []
        size = len(buf)
        while size - pos >= HEADER_BYTES:
            length, lcrc = struct.unpack_from("<QI", buf, pos)
            end = pos + HEADER_BYTES + length + FOOTER_BYTES
            if end > size:  # the record goes on in the next block: check its length first
                _verify([buf[pos : pos + 8]], [lcrc], name, offset + pos, [], "length")
                break
            heads.append(buf[pos : pos + 8])
            head_crcs.append(lcrc)
            records.append(buf[pos + HEADER_BYTES : end - FOOTER_BYTES])
            if verify_data:
                data_crcs.append(struct.unpack_from("<I", buf, end - FOOTER_BYTES)[0])
            pos = end
        if heads:
            _verify(heads, head_crcs, name, offset, records, "length")
        if verify_data and records:
            _verify(records, data_crcs, name, offset, records, "data")
        if records:
            yield records
    if pos < len(buf):
        raise TFRecordError(
            f"{name}: truncated TFRecord file: {len(buf) - pos} bytes at byte offset "
            f"{offset + pos} do not hold a whole record"
        )


def _strided_positions(buf: np.ndarray, size: int) -> int:
    """How many records from the start of ``buf[:size]`` have the first record's length
    (whole records, one after the other): with equal-length records, every block."""
    if size < HEADER_BYTES:
        return 0
    stride = int(buf[:8].view("<u8")[0]) + HEADER_BYTES + FOOTER_BYTES
    count = size // stride
    if count == 0 or stride > size:
        return 0
    lengths = np.ndarray((count,), "<u8", buffer=buf, offset=0, strides=(stride,))
    same = lengths == lengths[0]
    return count if same.all() else int(np.argmin(same))


def index_records(
    buf: np.ndarray,
    size: int,
    *,
    name: str = "<stream>",
    offset: int = 0,
    verify_data: bool = False,
) -> tuple[np.ndarray, np.ndarray, int]:
    """Where the whole records in ``buf[:size]`` (uint8, framed TFRecords from its start)
    lie: ``(starts, lengths, used)``, the data offsets and lengths of each (int64 arrays) and
    the bytes of framing they take; a record cut by ``size`` is left for the caller to
    complete. Equal-length records are located without a Python step per record.

    Length checksums are always verified, the cut record's included when its header is
    there; data checksums with ``verify_data``. ``offset`` is the file offset of ``buf[0]``
    (for error messages). Raises TFRecordError on a checksum mismatch."""
    count = _strided_positions(buf, size)
    stride = int(buf[:8].view("<u8")[0]) + HEADER_BYTES + FOOTER_BYTES if count else 0
    rest: list[int] = []
    pos, cut = count * stride, None
    while size - pos >= HEADER_BYTES:  # the rest one by one (records of other lengths)
        end = pos + HEADER_BYTES + int(struct.unpack_from("<Q", buf, pos)[0]) + FOOTER_BYTES
        if end > size:
            cut = pos
            break
        rest.append(pos)
        pos = end
    at = np.arange(0, count * stride, stride or 1, dtype=np.int64)
    if rest:
        at = np.concatenate([at, np.asarray(rest, dtype=np.int64)])
        lengths = _field(buf, at, 8, "<u8").astype(np.int64)
    else:
        lengths = np.full(count, stride - HEADER_BYTES - FOOTER_BYTES, dtype=np.int64)
    checked = at if cut is None else np.append(at, cut)
    _verify_at(_rows(buf, checked, 8), _field(buf, checked + 8, 4, "<u4"), name, offset + checked)
    if verify_data and len(at):
        stored = _field(buf, at + HEADER_BYTES + lengths, 4, "<u4")
        data = [buf[a : a + n] for a, n in zip((at + HEADER_BYTES).tolist(), lengths.tolist())]
        _verify_at(data, stored, name, offset + at, "data")
    return at + HEADER_BYTES, lengths, pos


def _rows(buf: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    return buf[at[:, None] + np.arange(width)]


def _field(buf: np.ndarray, at: np.ndarray, width: int, dtype: str) -> np.ndarray:
    return np.ascontiguousarray(_rows(buf, at, width)).view(dtype).reshape(-1)


def _verify_at(parts, stored: np.ndarray, name: str, where: np.ndarray, what="length") -> None:
    """Checks the masked CRC-32C of each of ``parts`` (a uint8 matrix of 8-byte lengths, or
    a list of buffers) against ``stored``; ``where`` are the records' file offsets."""
    if not len(stored):
        return
    if isinstance(parts, np.ndarray):
        crcs = _raw_registers(parts) ^ np.uint32(_init_term(8)) ^ np.uint32(0xFFFFFFFF)
    else:
        crcs = crc32c_many(parts)
    ok = mask(crcs) == stored.astype(np.uint32)
    if not ok.all():
        raise TFRecordError(
            f"{name}: {what} checksum mismatch in the record at byte offset "
            f"{int(where[int(np.argmin(ok))])}: corrupt TFRecord file"
        )


def _verify(
    parts: list[bytes], stored: list[int], name: str, offset: int, records: list[bytes], what: str
) -> None:
    ok = mask(crc32c_many(parts)) == np.asarray(stored, dtype=np.uint32)
    if not ok.all():
        bad = int(np.argmin(ok))
        position = offset + sum(HEADER_BYTES + len(r) + FOOTER_BYTES for r in records[:bad])
        raise TFRecordError(
            f"{name}: {what} checksum mismatch in the record at byte offset "
            f"{position}: corrupt TFRecord file"
        )


def read_records(path: str, *, verify_data: bool = True) -> list[bytes]:
    """All records of one TFRecord file (any sparktf path). For small files and tests."""
    from sparktf import storage

    out: list[bytes] = []
    with storage.open_file(path, "rb") as f:
        for batch in iter_record_batches(f, name=path, verify_data=verify_data):
            out.extend(batch)
    return out


# ----------------------------------------------------------------------------- Example


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64 values are 10-byte two's complement varints
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _delimited(tag: int, payload: bytes) -> bytes:
    return bytes((tag,)) + _varint(len(payload)) + payload


def _entry(key: str, feature: bytes) -> bytes:
    """One ``map<string, Feature>`` entry of Features (field 1 of Features)."""
    return _delimited(0x0A, _delimited(0x0A, key.encode()) + _delimited(0x12, feature))


def bytes_feature(value: bytes) -> bytes:
    return _delimited(0x0A, _delimited(0x0A, value))  # Feature.bytes_list


def int64_feature(values: Sequence[int] | int) -> bytes:
    if isinstance(values, (int, np.integer)):
        values = (int(values),)
    packed = b"".join(_varint(int(v)) for v in values)
    return _delimited(0x1A, _delimited(0x0A, packed))  # Feature.int64_list, packed


def example(features: dict[str, bytes]) -> bytes:
    """A serialized tf.train.Example from encoded features (``bytes_feature`` etc.)."""
    body = b"".join(_entry(key, features[key]) for key in sorted(features))
    return _delimited(0x0A, body)


def image_examples(images: np.ndarray, labels: np.ndarray, ids: np.ndarray) -> list[bytes]:
    """Serialized Examples of a block of images (uint8, N x H x W x C), labels and ids."""
    n, height, width, channels = images.shape
    constant = {
        "height": int64_feature(height),
        "width": int64_feature(width),
        "channels": int64_feature(channels),
    }
    # Features are written in key order: channels, height, id, image, label, width.
    head = _entry("channels", constant["channels"]) + _entry("height", constant["height"])
    tail = _entry("width", constant["width"])
    size = height * width * channels
    block = np.ascontiguousarray(images, dtype=np.uint8).tobytes()
    out = []
    for i, (label, rid) in enumerate(zip(labels.tolist(), ids.tolist())):
        body = b"".join(
            (
                head,
                _entry("id", int64_feature(rid)),
                _entry("image", bytes_feature(block[i * size : (i + 1) * size])),
                _entry("label", int64_feature(label)),
                tail,
            )
        )
        out.append(_delimited(0x0A, body))
    return out


def token_examples(tokens: np.ndarray, ids: np.ndarray) -> list[bytes]:
    """Serialized Examples of a block of token chunks (N x seq_len int64) and ids."""
    return [
        example({"id": int64_feature(rid), "tokens": int64_feature(row)})
        for row, rid in zip(tokens.tolist(), ids.tolist())
    ]


def _varint_lengths(values: np.ndarray) -> np.ndarray:
    """Bytes of the varint of each non-negative int64 value."""
    v = values.astype(np.uint64)
    n = np.ones(v.shape, dtype=np.int64)
    for k in range(1, 10):
        n += v >= np.uint64(1 << (7 * k))
    return n


def _varint_matrix(values: np.ndarray, width: int) -> np.ndarray:
    """Varints of non-negative values that all take ``width`` bytes, one row per value."""
    v = values.astype(np.uint64)
    out = np.empty((v.shape[0], width), dtype=np.uint8)
    for k in range(width):
        byte = (v & np.uint64(0x7F)).astype(np.uint8)
        if k < width - 1:
            byte |= 0x80
        out[:, k] = byte
        v = v >> np.uint64(7)
    return out


def frame_images(images: np.ndarray, labels: np.ndarray, ids: np.ndarray) -> bytes:
    """TFRecord bytes of image Examples, built as one matrix per run of equal-length records.

    Byte for byte the same as ``frame(image_examples(images, labels, ids))``, without a
    Python step per record: within a run where the ``id`` and ``label`` varints have the same
    lengths, every record has the same layout, so the records, their lengths and checksums
    are columns of one uint8 matrix.
    """
    n = images.shape[0]
    if n == 0:
        return b""
    labels = np.asarray(labels, dtype=np.int64)
    ids = np.asarray(ids, dtype=np.int64)
    if (labels < 0).any() or (ids < 0).any():
        return frame(image_examples(images, labels, ids))
    id_len, label_len = _varint_lengths(ids), _varint_lengths(labels)
    change = np.flatnonzero((np.diff(id_len) != 0) | (np.diff(label_len) != 0)) + 1
    bounds = [0, *change.tolist(), n]
    return b"".join(
        _frame_image_run(images[a:b], labels[a:b], ids[a:b], int(id_len[a]), int(label_len[a]))
        for a, b in zip(bounds, bounds[1:])
    )


def _frame_image_run(images, labels, ids, id_width: int, label_width: int) -> bytes:
    n, height, width, channels = images.shape
    size = height * width * channels
    # One record with placeholder values of the right widths gives the constant pieces.
    id_probe, label_probe = (1 << (7 * (id_width - 1))), (1 << (7 * (label_width - 1)))
    probe = image_examples(
        np.zeros((1, height, width, channels), np.uint8),
        np.array([label_probe]),
        np.array([id_probe]),
    )[0]
    length = len(probe)
    id_entry = _entry("id", int64_feature(id_probe))
    image_entry = _entry("image", bytes_feature(bytes(size)))
    label_entry = _entry("label", int64_feature(label_probe))
    head = probe[: probe.index(id_entry) + len(id_entry) - id_width]  # ... up to id varint
    mid = image_entry[: len(image_entry) - size]  # image entry prefix
    after_image = len(head) + id_width + len(mid) + size
    tail_start = probe.index(label_entry, after_image) + len(label_entry)
    label_prefix = probe[after_image : tail_start - label_width]
    tail = probe[tail_start:]
    pad = (-length) % 4
    record = np.zeros((n, pad + length), dtype=np.uint8)
    col = pad
    for piece in (head, None, mid, "image", label_prefix, "label", tail):
        if piece is None:
            record[:, col : col + id_width] = _varint_matrix(ids, id_width)
            col += id_width
        elif piece == "image":
            record[:, col : col + size] = images.reshape(n, size)
            col += size
        elif piece == "label":
            record[:, col : col + label_width] = _varint_matrix(labels, label_width)
            col += label_width
        else:
            record[:, col : col + len(piece)] = np.frombuffer(piece, dtype=np.uint8)
            col += len(piece)
    data_crc = mask(_raw_registers(record) ^ np.uint32(_init_term(length)) ^ np.uint32(0xFFFFFFFF))
    length_bytes = struct.pack("<Q", length)
    framed = np.empty((n, HEADER_BYTES + length + FOOTER_BYTES), dtype=np.uint8)
    framed[:, :8] = np.frombuffer(length_bytes, dtype=np.uint8)
    framed[:, 8:12] = np.frombuffer(
        struct.pack("<I", int(mask(crc32c_many([length_bytes]))[0])), dtype=np.uint8
    )
    framed[:, 12 : 12 + length] = record[:, pad:]
    framed[:, 12 + length :] = data_crc.astype("<u4").view(np.uint8).reshape(n, 4)
    return framed.tobytes()
