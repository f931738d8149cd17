"""The on-disk format of a converted dataset: the one description writers and readers share.

A dataset directory ``OUT`` holds::

    OUT/manifest.json                         what is in it (see ``load_manifest``)
    OUT/vocab.txt                             PTB only: one word per line, id = line number
    OUT/<split>/tfrecord/part-00000.tfrecord  one tf.train.Example per record
    OUT/<split>/parquet/part-*.parquet        a petastorm dataset (Unischema in _common_metadata)

Splits are ``train`` and ``test`` for images, ``train``, ``valid`` and ``test`` for PTB.

TFRecord features (``feature_spec``):

- images: ``image`` bytes (raw uint8, height x width x channels order), ``label`` int64,
  ``height``, ``width``, ``channels`` int64, ``id`` int64;
- PTB: ``tokens`` int64 list of ``seq_len`` token ids, ``id`` int64.

Parquet columns (``parquet_fields``): ``image`` an ndarray field (petastorm ``NdarrayCodec``:
the bytes of ``numpy.save``) of shape (H, W, C) uint8, ``label`` int64, ``id`` int64; PTB
``tokens`` an ndarray field of shape (seq_len,) int64, ``id`` int64.

Ids are stable and unique within a dataset: ``id = file_index << 32 | record_index``, where
``file_index`` is the position of the record's source file in the manifest's ``sources``
(every raw file of the dataset, sorted by name, ``.gz`` dropped) and ``record_index`` the
record's index in that file (for PTB: the index of the chunk in that file).
"""

from __future__ import annotations

import io
import json
from dataclasses import dataclass

import numpy as np

from sparktf import storage

FORMAT_VERSION = 1
MANIFEST_FILE = "manifest.json"
VOCAB_FILE = "vocab.txt"
TFRECORD = "tfrecord"
PARQUET = "parquet"
FORMATS = (TFRECORD, PARQUET)
TFRECORD_PART = "part-{:05d}.tfrecord"
IMAGE_SPLITS = ("train", "test")
TEXT_SPLITS = ("train", "valid", "test")
EOS = "<eos>"
DEFAULT_SEQ_LEN = 21
ID_SHIFT = 32
ID_SCHEME = ("id = file_index << 32 | record_index; file_index is the position of the source "
             "file in 'sources' (sorted by name), record_index the record's (PTB: chunk's) index "
             "in that file")


@dataclass(frozen=True)
class DatasetSpec:
    """What kind of dataset a name stands for."""

    name: str
    kind: str                       # "image" or "text"
    splits: tuple[str, ...]
    image_shape: tuple[int, int, int] | None = None   # (height, width, channels)
    num_classes: int | None = None


DATASETS = {
    "cifar10": DatasetSpec("cifar10", "image", IMAGE_SPLITS, (32, 32, 3), 10),
    "mnist": DatasetSpec("mnist", "image", IMAGE_SPLITS, (28, 28, 1), 10),
    "ptb": DatasetSpec("ptb", "text", TEXT_SPLITS),
}


class ManifestError(ValueError):
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
            raise ValueError("feature_spec('text') needs seq_len")
        return {"tokens": tf.io.FixedLenFeature([seq_len], tf.int64),
                "id": tf.io.FixedLenFeature([], tf.int64)}
    raise ValueError(f"unknown dataset kind {kind!r}: expected 'image' or 'text'")


# ----------------------------------------------------------------------------- Parquet

@dataclass(frozen=True)
class Field:
    """One Parquet column: an ndarray field (``shape`` set, NdarrayCodec) or an int64 scalar."""

    name: str
    dtype: str
    shape: tuple[int, ...] | None = None


def parquet_fields(kind: str, *, image_shape=None, seq_len: int | None = None) -> list[Field]:
    """The Parquet columns of a dataset, in order."""
    if kind == "image":
        return [Field("image", "uint8", tuple(image_shape)), Field("label", "int64"),
                Field("id", "int64")]
    if kind == "text":
        return [Field("tokens", "int64", (int(seq_len),)), Field("id", "int64")]
    raise ValueError(f"unknown dataset kind {kind!r}: expected 'image' or 'text'")


def manifest_fields(manifest: dict) -> list[Field]:
    """The Parquet columns described by a manifest's ``schema``."""
    if manifest["kind"] == "image":
        return parquet_fields("image", image_shape=manifest["schema"]["image"]["shape"])
    return parquet_fields("text", seq_len=manifest["schema"]["tokens"]["shape"][0])


def unischema(manifest: dict):
    """The petastorm Unischema of a dataset's Parquet files."""
    from sparktf.datasets import petastorm_io

    return petastorm_io.unischema(f"sparktf_{manifest['dataset']}", manifest_fields(manifest))


def npy_header(dtype: str, shape: tuple[int, ...]) -> bytes:
    """The bytes ``numpy.save`` writes before the data of a C-order array (NdarrayCodec).

    Every value of an ndarray column has the same dtype and shape, so the same header: the
    readers and writers encode and decode whole columns at once with it.
    """
    buf = io.BytesIO()
    empty = np.zeros(shape, dtype=dtype)
    np.save(buf, empty)
    data = buf.getvalue()
    return data[:len(data) - empty.nbytes]


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
    data[:, :header.size] = header
    data[:, header.size:] = values.reshape(n, -1).view(np.uint8)
    offsets = np.arange(n + 1, dtype=np.int64) * item
    return pa.Array.from_buffers(pa.large_binary(), n, [None, pa.py_buffer(offsets),
                                                        pa.py_buffer(data)]).cast(pa.binary())


def decode_ndarray_column(values, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Decodes a column of ``numpy.save`` bytes (NdarrayCodec) into one [n, *shape] array.

    ``values``: a sequence of bytes (a numpy object array, a list) or a pyarrow binary array.
    Every value must carry the header of ``dtype`` and ``shape``; anything else is a
    ValueError (a file not written by sparktf, or corrupt).
    """
    header = npy_header(dtype, tuple(shape))
    item = len(header) + int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    n = len(values)
    matrix = _packed_binary(values, item) if hasattr(values, "buffers") or \
        hasattr(values, "combine_chunks") else None
    if matrix is None:
        if hasattr(values, "to_pylist"):
            values = values.to_pylist()
        joined = b"".join(values)
        if len(joined) != n * item:
            raise ValueError(f"ndarray column: expected {n} values of {item} bytes "
                             f"({dtype} {tuple(shape)}), got {len(joined)} bytes in all")
        matrix = np.frombuffer(joined, dtype=np.uint8).reshape(n, item)
    if n and not (matrix[:, :len(header)] == np.frombuffer(header, dtype=np.uint8)).all():
        raise ValueError(f"ndarray column: values are not numpy.save bytes of {dtype} "
                         f"{tuple(shape)}")
    return np.ascontiguousarray(matrix[:, len(header):]).view(dtype).reshape(n, *shape)


def _packed_binary(values, item: int) -> np.ndarray | None:
    """The values of a pyarrow binary array as an (n, item) matrix, without copying them one
    by one; None when they are not all ``item`` bytes long or hold nulls."""
    import pyarrow as pa

    if isinstance(values, pa.ChunkedArray):
        values = values.combine_chunks() if values.num_chunks != 1 else values.chunk(0)
    if values.null_count or not pa.types.is_binary(values.type):
        return None
    n = len(values)
    _, offsets_buf, data_buf = values.buffers()
    offsets = np.frombuffer(offsets_buf, dtype=np.int32)[values.offset:values.offset + n + 1]
    if n and not (np.diff(offsets) == item).all():
        return None
    data = np.frombuffer(data_buf, dtype=np.uint8)[offsets[0]:offsets[0] + n * item] if n else \
        np.zeros(0, dtype=np.uint8)
    return data.reshape(n, item)


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
    try:
        manifest = json.loads(storage.read_text(file))
    except storage.PathNotFoundError as exc:
        raise ManifestError(f"no dataset manifest at {file}: not a converted dataset "
                            "(run one of jobs/convert_*.py)") from exc
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
        raise ManifestError(f"{where}: format_version {version!r} is not supported "
                            f"(this sparktf reads version {FORMAT_VERSION}); convert again")
    missing = [k for k in ("dataset", "kind", "formats", "sources", "schema", "splits")
               if k not in manifest]
    if missing:
        raise ManifestError(f"{where}: missing keys {', '.join(missing)}")


def split_files(manifest: dict, dataset_dir: str, split: str, fmt: str) -> list[str]:
    """Full paths of the part files of one split in one format, in order."""
    if split not in manifest["splits"]:
        raise ManifestError(f"dataset {dataset_dir} has no split {split!r} "
                            f"(it has {', '.join(manifest['splits'])})")
    if fmt not in manifest["formats"]:
        raise ManifestError(f"dataset {dataset_dir} was not written as {fmt} "
                            f"(it has {', '.join(manifest['formats'])})")
    return [storage.join(dataset_dir, rel) for rel in manifest["splits"][split][fmt]["files"]]


def split_records(manifest: dict, split: str, fmt: str) -> list[int]:
    """Record counts of the part files of one split in one format, in order."""
    return list(manifest["splits"][split][fmt]["records"])


def load_vocab(dataset_dir: str, manifest: dict | None = None) -> list[str]:
    """The PTB vocabulary: word of id i at position i."""
    manifest = manifest or load_manifest(dataset_dir)
    if manifest["kind"] != "text":
        raise ManifestError(f"dataset {dataset_dir} is not a text dataset: it has no vocabulary")
    text = storage.read_text(storage.join(dataset_dir, manifest["text"]["vocab_file"]))
    return text.split("\n")[:-1] if text.endswith("\n") else text.split("\n")
