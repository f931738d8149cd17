"""The on-disk format of a converted dataset: the one description writers and readers share.

A dataset directory ``OUT`` holds::

    OUT/manifest.json                         what is in it (see ``load_manifest``)
    OUT/vocab.txt                             PTB only: one word per line, id = line number
    OUT/<split>/tfrecord/part-00000.tfrecord  one tf.train.Example per record
    OUT/<split>/parquet/part-00000.parquet    Parquet, sparktf's schema in its footer
    OUT/<split>/parquet/_common_metadata      the split's schema and row groups (see below)

Splits are ``train`` and ``test`` for images, ``train``, ``valid`` and ``test`` for PTB.

A third kind, ``table`` (written by :class:`sparktf.ml.TFEstimator` from a DataFrame, see
:func:`table_manifest`), holds Parquet only: its columns are listed, in order, in the
manifest's ``schema`` (``{name: {"dtype": ..., "shape": [...] | null}}``), e.g. a float32
``features`` vector, an int64 ``label`` (with ``num_classes``) and an int64 ``id``.

TFRecord features (``feature_spec``):

- images: ``image`` bytes (raw uint8, height x width x channels order), ``label`` int64,
  ``height``, ``width``, ``channels`` int64, ``id`` int64;
- PTB: ``tokens`` int64 list of ``seq_len`` token ids, ``id`` int64.

Parquet columns (``parquet_fields``): ``image`` an ndarray field (petastorm ``NdarrayCodec``:
the bytes of ``numpy.save``) of shape (H, W, C) uint8, ``label`` int64, ``id`` int64; PTB
``tokens`` an ndarray field of shape (seq_len,) int64, ``id`` int64.

Every Parquet file carries sparktf's own schema as plain JSON in its key-value metadata
(``SCHEMA_KEY``: the columns with their dtype and shape, see ``schema_metadata``), and each
split's ``_common_metadata`` holds it too, with the row groups per file (``ROW_GROUPS_KEY``,
the key petastorm's readers look for).
Readers parse it as JSON, never unpickle it. Written where petastorm is installed (the second
stack), ``_common_metadata`` also holds petastorm's Unischema, so ``petastorm.make_reader``
opens the split; elsewhere ``sparktf.datasets.petastorm_io.add_unischema`` adds it later.

Ids are stable and unique within a dataset: ``id = file_index << 32 | record_index``, where
``file_index`` is the position of the record's source file in the manifest's ``sources``
(every raw file of the dataset, sorted by name, ``.gz`` dropped) and ``record_index`` the
record's index in that file (for PTB: the index of the chunk in that file).
"""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from sparktf import storage
from sparktf.errors import SparktfError, SparktfValueError

__all__ = [
    "COMMON_METADATA",
    "DATASETS",
    "DEFAULT_SEQ_LEN",
    "DatasetSpec",
    "EOS",
    "FORMATS",
    "FORMAT_VERSION",
    "Field",
    "ID_SCHEME",
    "ID_SHIFT",
    "IMAGE_SPLITS",
    "MANIFEST_FILE",
    "ManifestError",
    "NPY_MAGIC",
    "NdarrayColumnError",
    "NpyHeader",
    "PARQUET",
    "PARQUET_PART",
    "ParquetSchemaError",
    "ROW_GROUPS_KEY",
    "SCHEMA_KEY",
    "SCHEMA_VERSION",
    "TABLE",
    "TEXT_SPLITS",
    "TFRECORD",
    "TFRECORD_PART",
    "VOCAB_FILE",
    "arrow_schema",
    "binary_matrix",
    "binary_parts",
    "check_manifest",
    "check_schema",
    "decode_ndarray_column",
    "describe_field",
    "describe_layout",
    "encode_ndarray_column",
    "feature_spec",
    "load_manifest",
    "load_vocab",
    "make_id",
    "manifest_fields",
    "manifest_path",
    "npy_header",
    "parquet_fields",
    "read_common_metadata",
    "read_npy_header",
    "schema_fields",
    "schema_metadata",
    "spark_type",
    "split_files",
    "split_id",
    "table_manifest",
    "write_common_metadata",
]

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
VOCAB_FILE = "vocab.txt"
TFRECORD = "tfrecord"
PARQUET = "parquet"
FORMATS = (TFRECORD, PARQUET)
COMMON_METADATA = "_common_metadata"
SCHEMA_KEY = b"sparktf.schema"  # Parquet key-value metadata: the columns, as JSON
SCHEMA_VERSION = 1  # of that JSON (the manifest has its own FORMAT_VERSION)
# In _common_metadata: {file name: row groups}, as JSON, under the key petastorm reads them from
# (its readers need it; sparktf writes it with or without petastorm).
ROW_GROUPS_KEY = b"dataset-toolkit.num_row_groups_per_file.v1"
TABLE = "table"  # the dataset kind of a DataFrame's columns (sparktf.ml)
TFRECORD_PART = "part-{:05d}.tfrecord"
PARQUET_PART = "part-{:05d}.parquet"
IMAGE_SPLITS = ("train", "test")
TEXT_SPLITS = ("train", "valid", "test")
EOS = "<eos>"
DEFAULT_SEQ_LEN = 21
ID_SHIFT = 32
ID_SCHEME = (
    "id = file_index << 32 | record_index; file_index is the position of the source "
    "file in 'sources' (sorted by name), record_index the record's (PTB: chunk's) index "
    "in that file"
)


@dataclass(frozen=True)
class DatasetSpec:
    """What kind of dataset a name stands for."""

    name: str
    kind: str  # "image" or "text"
    splits: tuple[str, ...]
    image_shape: tuple[int, int, int] | None = None  # (height, width, channels)
    num_classes: int | None = None


DATASETS = {
    "cifar10": DatasetSpec("cifar10", "image", IMAGE_SPLITS, (32, 32, 3), 10),
    "mnist": DatasetSpec("mnist", "image", IMAGE_SPLITS, (28, 28, 1), 10),
    "ptb": DatasetSpec("ptb", "text", TEXT_SPLITS),
}


class ManifestError(SparktfError, ValueError):
    """A dataset directory without a usable manifest."""


# ----------------------------------------------------------------------------- ids


def make_id(file_index: int, record_index: int | np.ndarray) -> int | np.ndarray:
    """The record id: ``file_index << 32 | record_index`` (vectorised over record_index)."""
    if isinstance(record_index, np.ndarray):
        return (np.int64(file_index) << ID_SHIFT) | record_index.astype(np.int64)
    return (int(file_index) << ID_SHIFT) | int(record_index)


def split_id(record_id: int) -> tuple[int, int]:
    """``(file_index, record_index)`` of an id."""
    return int(record_id) >> ID_SHIFT, int(record_id) & ((1 << ID_SHIFT) - 1)


# ----------------------------------------------------------------------------- TFRecord


def feature_spec(kind: str = "image", *, seq_len: int | None = None) -> dict:
    """The ``tf.io.parse_example`` spec of the TFRecord Examples of a ``kind`` of dataset.

    Images: ``image`` (string of H*W*C uint8 bytes, HWC order), ``label``, ``height``,
    ``width``, ``channels``, ``id`` (int64 scalars). Text: ``tokens`` (int64, ``seq_len``
    long) and ``id``.
    """
    import tensorflow as tf

    if kind == "image":
        spec = {"image": tf.io.FixedLenFeature([], tf.string)}
        for name in ("label", "height", "width", "channels", "id"):
            spec[name] = tf.io.FixedLenFeature([], tf.int64)
        return spec
    if kind == "text":
        if not seq_len:
            raise SparktfValueError("feature_spec('text') needs seq_len")
        return {
            "tokens": tf.io.FixedLenFeature([seq_len], tf.int64),
            "id": tf.io.FixedLenFeature([], tf.int64),
        }
    raise SparktfValueError(f"unknown dataset kind {kind!r}: expected 'image' or 'text'")


def arrow_schema(fields: Sequence[Field]):
    """The Arrow schema of the Parquet files of ``fields``: ndarray fields ``binary`` (the
    ``numpy.save`` bytes), scalars of their dtype (``int64``, a ``float32`` label), none
    nullable (as Spark writes a petastorm Unischema's columns), with sparktf's schema as
    metadata (``schema_metadata``)."""
    import pyarrow as pa

    return pa.schema(
        [
            pa.field(
                f.name,
                pa.from_numpy_dtype(np.dtype(f.dtype)) if f.shape is None else pa.binary(),
                nullable=False,
            )
            for f in fields
        ],
        metadata=schema_metadata(fields),
    )


class ParquetSchemaError(SparktfError, ValueError):
    """A Parquet file whose sparktf schema is unreadable or disagrees with its dataset."""


def schema_metadata(fields: Sequence[Field]) -> dict[bytes, bytes]:
    """sparktf's schema of ``fields`` as Parquet key-value metadata: ``{SCHEMA_KEY: JSON}``,
    the JSON ``{"schema_version": 1, "fields": [{"name", "dtype", "shape"}]}`` with ``shape``
    null for an int64 scalar and a list for an ndarray column of ``numpy.save`` bytes."""
    doc = {
        "schema_version": SCHEMA_VERSION,
        "fields": [{"name": f.name, **f.spec()} for f in fields],
    }
    return {SCHEMA_KEY: json.dumps(doc, separators=(",", ":")).encode()}


def schema_fields(metadata: dict | None, where: str) -> list[Field] | None:
    """The fields of sparktf's schema in Parquet key-value ``metadata`` (None when the file has
    none, e.g. one Spark wrote); ``where`` names the file in errors."""
    raw = (metadata or {}).get(SCHEMA_KEY)
    if raw is None:
        return None
    try:
        doc = json.loads(raw)
        if doc.get("schema_version") != SCHEMA_VERSION:
            raise SparktfValueError(
                f"schema_version {doc.get('schema_version')!r}, this sparktf reads {SCHEMA_VERSION}"
            )
        return [Field.from_spec(f["name"], f) for f in doc["fields"]]
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise ParquetSchemaError(
            f"{where}: the sparktf schema in its Parquet metadata ({SCHEMA_KEY.decode()}) is "
            f"not readable ({exc}); expected JSON "
            '{"schema_version": 1, "fields": [{"name", "dtype", "shape"}]}'
        ) from exc


def check_schema(metadata: dict | None, fields: Sequence[Field], where: str) -> None:
    """Raises ParquetSchemaError when the sparktf schema in ``metadata`` (if any) lacks one of
    ``fields`` or gives it another dtype or shape."""
    found = schema_fields(metadata, where)
    if found is None:
        return
    have = {f.name: f for f in found}
    for want in fields:
        got = have.get(want.name)
        if got != want:
            raise ParquetSchemaError(
                f"{where}: column {want.name!r} is "
                f"{'missing' if got is None else describe_field(got)} in the file's sparktf "
                f"schema; its dataset expects {describe_field(want)}"
            )


def describe_field(f: Field) -> str:
    return "int64 scalar" if f.shape is None else describe_layout(f.dtype, f.shape)


def write_common_metadata(
    path: str, fields: Sequence[Field], row_groups: dict[str, int], extra: dict | None = None
) -> None:
    """Writes ``path/_common_metadata``: the Arrow schema of ``fields`` with sparktf's schema,
    ``ROW_GROUPS_KEY`` (``{file name: row groups}``) and ``extra`` key-value metadata."""
    import pyarrow.parquet as pq

    schema = arrow_schema(fields)
    metadata = {
        **schema.metadata,
        ROW_GROUPS_KEY: json.dumps(row_groups, sort_keys=True).encode(),
        **(extra or {}),
    }
    buffer = io.BytesIO()  # write_metadata seeks: a WebHDFS file cannot
    pq.write_metadata(schema.with_metadata(metadata), buffer)
    with storage.open_file(storage.join(path, COMMON_METADATA), "wb") as f:
        f.write(buffer.getvalue())


def read_common_metadata(path: str) -> dict[bytes, bytes]:
    """The key-value metadata of ``path/_common_metadata`` ({} when there is none)."""
    import pyarrow.parquet as pq

    file = storage.join(path, COMMON_METADATA)
    if not storage.exists(file):
        return {}
    try:
        return dict(pq.read_schema(io.BytesIO(storage.read_bytes(file))).metadata or {})
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        raise ParquetSchemaError(
            f"{file}: not a Parquet metadata file ({exc}); expected the schema footer "
            "that sparktf (or petastorm) writes"
        ) from exc


# ----------------------------------------------------------------------------- Parquet


def spark_type(field: Field) -> str:
    """The Spark SQL type of a column of ``field`` in the Parquet files: ``binary`` for an
    ndarray, else ``bigint``, ``float`` or ``double``."""
    if field.shape is not None:
        return "binary"
    return {"int64": "bigint", "float32": "float", "float64": "double"}[field.dtype]


@dataclass(frozen=True)
class Field:
    """One column of a dataset: a scalar (``shape`` None; int64, or a float32 label of a
    regression dataset) or an ndarray of one fixed
    ``dtype`` and ``shape`` stored as ``numpy.save`` bytes (petastorm's NdarrayCodec).

    The Parquet files, the training feed (``sparktf.train.feed.chunks``) and the readers describe
    their columns with it."""

    name: str
    dtype: str
    shape: tuple[int, ...] | None = None

    def spec(self) -> dict:
        """Its JSON form in a manifest's and a Parquet file's schema: ``{"dtype", "shape"}``,
        ``shape`` null for an int64 scalar."""
        return {"dtype": self.dtype, "shape": None if self.shape is None else list(self.shape)}

    @classmethod
    def from_spec(cls, name: str, spec: dict) -> Field:
        """The field ``name`` described by ``spec`` (see ``spec``)."""
        shape = spec.get("shape")
        return cls(
            str(name),
            str(np.dtype(spec["dtype"])),
            None if shape is None else tuple(map(int, shape)),
        )


def parquet_fields(kind: str, *, image_shape=None, seq_len: int | None = None) -> list[Field]:
    """The Parquet columns of a dataset, in order."""
    if kind == "image":
        return [
            Field("image", "uint8", tuple(image_shape)),
            Field("label", "int64"),
            Field("id", "int64"),
        ]
    if kind == "text":
        return [Field("tokens", "int64", (int(seq_len),)), Field("id", "int64")]
    raise SparktfValueError(f"unknown dataset kind {kind!r}: expected 'image' or 'text'")


def manifest_fields(manifest: dict) -> list[Field]:
    """The Parquet columns described by a manifest's ``schema``."""
    if manifest["kind"] == "image":
        return parquet_fields("image", image_shape=manifest["schema"]["image"]["shape"])
    if manifest["kind"] == TABLE:
        return [Field.from_spec(name, spec) for name, spec in manifest["schema"].items()]
    return parquet_fields("text", seq_len=manifest["schema"]["tokens"]["shape"][0])


def table_manifest(
    dataset: str,
    fields: list[Field],
    splits: dict[str, dict],
    *,
    num_classes: int | None = None,
    label: str = "label",
) -> dict:
    """The manifest of a ``table`` dataset (Parquet only).

    ``fields``: its columns in order (an ndarray column has a dtype and a shape and holds
    ``numpy.save`` bytes; an int64 scalar has no shape); ``splits``: per split ``{"records":
    N, "files": [paths relative to the dataset directory], "file_records": [N per file]}``;
    ``num_classes`` is recorded on the ``label`` column.
    """
    schema: dict[str, dict] = {}
    for f in fields:
        spec = f.spec()
        if f.name == label and num_classes is not None:
            spec["num_classes"] = int(num_classes)
        schema[f.name] = spec
    return {
        "format_version": FORMAT_VERSION,
        "dataset": dataset,
        "kind": TABLE,
        "formats": [PARQUET],
        "sources": [],
        "containers": [],
        "schema": schema,
        "splits": {
            name: {
                "records": int(split["records"]),
                "shards": len(split["files"]),
                PARQUET: {
                    "files": list(split["files"]),
                    "records": [int(n) for n in split["file_records"]],
                },
            }
            for name, split in splits.items()
        },
    }


# ----------------------------------------------------------------------------- npy codec
# An ndarray column holds, per row, the bytes ``numpy.save`` writes: a header (magic, version,
# a dict literal of dtype, order and shape, padding) and the C-order data. Every value of a
# column has the same dtype and shape, so the same header: whole columns are encoded and
# decoded at once, as one (rows, bytes per value) matrix over the Arrow buffer.

NPY_MAGIC = b"\x93NUMPY"
_HEADER_LIMIT = 1 << 16  # bytes of a value read to parse its header


class NdarrayColumnError(SparktfError, ValueError):
    """A column that does not hold ``numpy.save`` bytes of the expected dtype and shape."""


@dataclass(frozen=True)
class NpyHeader:
    """What the header of one ``numpy.save`` value says; ``size``: its length in bytes."""

    dtype: np.dtype
    shape: tuple[int, ...]
    fortran_order: bool
    size: int

    @property
    def data_bytes(self) -> int:
        return self.dtype.itemsize * int(np.prod(self.shape, dtype=np.int64))


def read_npy_header(value) -> NpyHeader:
    """Parses the header at the start of ``value`` (bytes or a uint8 array; ``numpy.save``
    format 1.0 or 2.0; the data after the header need not be there). A ValueError when
    ``value`` does not start with one.

    The header's length comes from its fixed-size prefix (magic, version, length); the
    header itself is parsed by numpy, once per distinct header (a column repeats one).
    """
    prefix = bytes(value[:12])
    if not prefix.startswith(NPY_MAGIC) or len(prefix) < 10:
        raise SparktfValueError(f"not numpy.save bytes (they start with {prefix[:8]!r})")
    version = tuple(prefix[6:8])
    if version == (1, 0):
        size = 10 + int.from_bytes(prefix[8:10], "little")
    elif version == (2, 0):
        size = 12 + int.from_bytes(prefix[8:12], "little")
    else:
        raise SparktfValueError(f"numpy.save format version {version} is not read here")
    if size > len(value) or size > _HEADER_LIMIT:
        raise SparktfValueError(f"a numpy.save header of {size} bytes in {len(value)} bytes")
    return _parse_header(bytes(value[:size]))


@functools.lru_cache(maxsize=256)
def _parse_header(header: bytes) -> NpyHeader:
    stream = io.BytesIO(header)
    try:
        if np.lib.format.read_magic(stream) == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(stream)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(stream)
    except EOFError as exc:
        raise SparktfValueError(f"a truncated numpy.save header: {exc}") from None
    return NpyHeader(np.dtype(dtype), tuple(int(d) for d in shape), bool(fortran), stream.tell())


def npy_header(dtype: str, shape: tuple[int, ...]) -> bytes:
    """The bytes ``numpy.save`` writes before the data of a C-order array (NdarrayCodec)."""
    return _npy_header(np.dtype(dtype).str, tuple(int(d) for d in shape))


@functools.lru_cache(maxsize=64)
def _npy_header(dtype: str, shape: tuple[int, ...]) -> bytes:
    buf = io.BytesIO()
    empty = np.zeros(shape, dtype=dtype)
    np.save(buf, empty)
    data = buf.getvalue()
    return data[: len(data) - empty.nbytes]


def describe_layout(dtype, shape) -> str:
    """``uint8 (28, 28, 1)``: a dtype and shape for messages."""
    return f"{np.dtype(dtype)} {tuple(shape)}"


def encode_ndarray_column(values: np.ndarray):
    """A pyarrow binary array of the ``numpy.save`` bytes of each ``values[i]`` (NdarrayCodec).

    Vectorised: one header for all rows (same dtype and shape), the data copied as one block.
    """
    import pyarrow as pa

    values = np.ascontiguousarray(values)
    n = values.shape[0]
    header = np.frombuffer(npy_header(values.dtype.str, values.shape[1:]), dtype=np.uint8)
    item = header.size + values[0:1].nbytes if n else header.size
    data = np.empty((n, item), dtype=np.uint8)
    data[:, : header.size] = header
    data[:, header.size :] = values.reshape(n, -1).view(np.uint8)
    offsets = np.arange(n + 1, dtype=np.int64) * item
    return pa.Array.from_buffers(
        pa.large_binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(data)]
    ).cast(pa.binary())


def binary_parts(values) -> tuple[np.ndarray, np.ndarray]:
    """Offsets (int64, n + 1 of them) and the data buffer (uint8) of a pyarrow binary or
    large_binary array, sliced or not, without touching the values one by one."""
    import pyarrow as pa

    _, offsets, data = values.buffers()
    otype = np.int64 if pa.types.is_large_binary(values.type) else np.int32
    offs = np.frombuffer(offsets, dtype=otype)[values.offset : values.offset + len(values) + 1]
    buf = np.frombuffer(data, dtype=np.uint8) if data is not None else np.empty(0, np.uint8)
    return offs.astype(np.int64), buf


def binary_matrix(values) -> np.ndarray | None:
    """The values of a binary column as one (n, length) uint8 matrix (a view of the Arrow
    buffer); None when they are not all of one length. ``values``: a pyarrow binary array
    without nulls."""
    offsets, data = binary_parts(values)
    n = len(values)
    if n == 0:
        return np.zeros((0, 0), dtype=np.uint8)
    length = int(offsets[1] - offsets[0])
    if not (np.diff(offsets) == length).all():
        return None
    return data[offsets[0] : offsets[-1]].reshape(n, length)


def decode_ndarray_column(
    values, dtype: str | None = None, shape: tuple[int, ...] | None = None, *, name: str = "ndarray"
) -> np.ndarray:
    """Decodes a column of ``numpy.save`` bytes (NdarrayCodec) into one [n, *shape] array.

    ``values``: a pyarrow binary array (chunked or not, sliced or not) or a sequence of bytes.
    With ``dtype`` and ``shape``, every value must be a C-order array of them; without, of
    the dtype and shape the first value's header says. One vectorised pass over the column's
    buffer (the headers compared as one block, the data copied once). Anything else raises
    :class:`NdarrayColumnError` naming column ``name``, the row, what was expected and what
    was found (a file not written by sparktf, or corrupt).
    """
    want = None if dtype is None else (np.dtype(dtype), tuple(int(d) for d in shape or ()))
    matrix = _value_matrix(values, name, want)
    n = len(matrix)
    if n == 0:
        return np.zeros((0, *want[1]), dtype=want[0]) if want else np.zeros(0, np.uint8)
    if want is not None:  # the fast path: the header numpy writes today, byte for byte
        header = np.frombuffer(npy_header(want[0].str, want[1]), dtype=np.uint8)
        if (
            matrix.shape[1] == header.size + want[0].itemsize * int(np.prod(want[1]))
            and (matrix[:, : header.size] == header).all()
        ):
            return _body(matrix, header.size, *want)
    # Any other header (another numpy's padding, or no dtype and shape given): parse row 0's
    # and hold every row to it.
    try:
        head = read_npy_header(matrix[0])
    except ValueError:
        head = None
    if (
        head is None
        or head.fortran_order
        or head.dtype.hasobject
        or matrix.shape[1] != head.size + head.data_bytes
        or (want is not None and (head.dtype, head.shape) != want)
    ):
        raise _error(name, 0, _found(matrix[0]), want)
    same = (matrix[:, : head.size] == matrix[0, : head.size]).all(axis=1)
    if not same.all():
        i = int(np.flatnonzero(~same)[0])
        raise _error(
            name,
            i,
            _found(matrix[i]) + ", a header unlike row 0's",
            want or (head.dtype, head.shape),
        )
    return _body(matrix, head.size, head.dtype, head.shape)


def _body(matrix: np.ndarray, size: int, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    return np.ascontiguousarray(matrix[:, size:]).view(dtype).reshape(len(matrix), *shape)


def _value_matrix(values, name: str, want) -> np.ndarray:
    """``values`` as an (n, bytes per value) uint8 matrix, else NdarrayColumnError naming the
    first null value or the first value of another length (than the expected one when
    ``want`` is given, else than row 0's)."""
    import pyarrow as pa

    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    if isinstance(values, pa.Array):
        if not (pa.types.is_binary(values.type) or pa.types.is_large_binary(values.type)):
            raise _error(name, None, f"has Arrow type {values.type}", want)
        if values.null_count:
            i = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
            raise _error(name, i, f"is null (nulls in the column: {values.null_count})", want)
        matrix = binary_matrix(values)
        if matrix is not None:
            return matrix
        offsets, data = binary_parts(values)
        value = lambda i: data[offsets[i] : offsets[i + 1]]  # noqa: E731
        lengths = np.diff(offsets)
    else:
        values = list(values)
        if any(v is None for v in values):
            raise _error(name, values.index(None), "is null", want)
        if not values:
            return np.zeros((0, 0), dtype=np.uint8)
        lengths = np.array([len(v) for v in values], dtype=np.int64)
        if (lengths == lengths[0]).all():
            return np.frombuffer(b"".join(values), dtype=np.uint8).reshape(len(values), -1)
        value = lambda i: np.frombuffer(values[i], dtype=np.uint8)  # noqa: E731
    wrong = lengths != lengths[0]
    if want is not None:
        item = len(npy_header(want[0].str, want[1])) + want[0].itemsize * int(np.prod(want[1]))
        wrong = lengths != item
    i = int(np.flatnonzero(wrong)[0])
    raise _error(name, i, _found(value(i)), want)


def _found(value: np.ndarray) -> str:
    """What one value holds, for messages."""
    try:
        head = read_npy_header(value)
    except ValueError:
        return f"holds {len(value)} bytes that are not numpy.save bytes"
    order = "Fortran-order " if head.fortran_order else ""
    extra = len(value) - head.size - head.data_bytes
    tail = (
        ""
        if extra == 0
        else f", {-extra} bytes short"
        if extra < 0
        else f", with {extra} bytes more than its header says"
    )
    return f"holds numpy.save bytes of {order}{describe_layout(head.dtype, head.shape)}{tail}"


def _error(name: str, row: int | None, what: str, want) -> NdarrayColumnError:
    where = f"column {name!r}" if row is None else f"column {name!r}: row {row}"
    expected = (
        f"numpy.save bytes of {describe_layout(*want)}"
        if want is not None
        else "numpy.save bytes of one dtype and shape"
    )
    return NdarrayColumnError(f"{where} {what}; expected {expected}")


# ----------------------------------------------------------------------------- manifest


def manifest_path(dataset_dir: str) -> str:
    return storage.join(dataset_dir, MANIFEST_FILE)


def load_manifest(path: str) -> dict:
    """Reads ``manifest.json`` of a dataset (``path``: the dataset directory or the file).

    The manifest holds: ``format_version``; ``dataset`` (cifar10, mnist, ptb) and ``kind``
    (image, text); ``formats`` written; ``sources`` (every raw file: ``file_index``, ``name``,
    ``split``, ``size``, ``sha256``, records, where it came from); ``containers`` (archives and
    gzip files read, with size and sha256); ``schema``; ``splits`` (per split: ``records``,
    ``shards``, and per format the files relative to the dataset directory with their record
    counts); for PTB ``text`` (``vocab_file``, ``vocab_size``, ``seq_len``, ``eos``, ``unk``)
    and per split ``tokens`` and ``dropped_tokens``.
    """
    file = path if path.rstrip("/").endswith(".json") else manifest_path(path)
    # on an object store, a dataset whose publish did not finish is refused, naming its marker
    storage.require_committed(storage.parse(file).parent().uri)
    try:
        manifest = json.loads(storage.read_text(file))
    except storage.PathNotFoundError as exc:
        raise ManifestError(
            f"no dataset manifest at {file}: not a converted dataset (run one of jobs/convert_*.py)"
        ) from exc
    except json.JSONDecodeError as exc:
        raise ManifestError(f"dataset manifest {file} is not valid JSON: {exc}") from exc
    check_manifest(manifest, file)
    return manifest


def check_manifest(manifest: dict, where: str = "manifest") -> None:
    """Raises ManifestError unless ``manifest`` has the keys readers rely on."""
    if not isinstance(manifest, dict):
        raise ManifestError(f"{where}: expected a JSON object")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise ManifestError(
            f"{where}: format_version {version!r} is not supported "
            f"(this sparktf reads version {FORMAT_VERSION}); convert again"
        )
    missing = [
        k
        for k in ("dataset", "kind", "formats", "sources", "schema", "splits")
        if k not in manifest
    ]
    if missing:
        raise ManifestError(f"{where}: missing keys {', '.join(missing)}")


def split_files(manifest: dict, dataset_dir: str, split: str, fmt: str) -> list[str]:
    """Full paths of the part files of one split in one format, in order."""
    if split not in manifest["splits"]:
        raise ManifestError(
            f"dataset {dataset_dir} has no split {split!r} (it has {', '.join(manifest['splits'])})"
        )
    if fmt not in manifest["formats"]:
        raise ManifestError(
            f"dataset {dataset_dir} was not written as {fmt} "
            f"(it has {', '.join(manifest['formats'])})"
        )
    return [storage.join(dataset_dir, rel) for rel in manifest["splits"][split][fmt]["files"]]


def load_vocab(dataset_dir: str, manifest: dict | None = None) -> list[str]:
    """The PTB vocabulary: word of id i at position i."""
    manifest = manifest or load_manifest(dataset_dir)
    if manifest["kind"] != "text":
        raise ManifestError(f"dataset {dataset_dir} is not a text dataset: it has no vocabulary")
    text = storage.read_text(storage.join(dataset_dir, manifest["text"]["vocab_file"]))
    return text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")
