"""``tf.data`` readers of converted datasets: TFRecord and Parquet, local disk and HDFS.

    from sparktf.datasets import readers
    ds = readers.tfrecord_dataset(f"{data}/train", batch_size=64, num_shards=2,
                                  shard_index=0, shuffle=True)
    for batch in ds:      # {"image": uint8 [B, H, W, C], "label": int64 [B], "id": int64 [B]}
        ...               # PTB: {"tokens": int64 [B, seq_len], "id": int64 [B]}

Both readers take the same arguments and give the same batches (``id`` tells records apart).

- ``path``: a split directory (``OUT/train``), or the dataset directory with ``split=``.
- Sharding (``num_shards`` workers, this one ``shard_index``): by part files when their
  number is a multiple of ``num_shards`` (each worker reads only its files; shards are equal
  within a record per file), else by records (every worker reads all files and keeps its
  share: TFRecord keeps every ``num_shards``-th record in file order, Parquet the records
  with ``id % num_shards == shard_index``). The shards are disjoint and together hold every
  record once per epoch.
- ``shuffle``: part files in a new order each epoch and records through a buffer of
  ``shuffle_buffer`` records that empties at the end of each epoch (TFRecord: 4 files
  interleaved into it; Parquet: windows of whole row groups, at least ``shuffle_buffer``
  records and 4 row groups, permuted; a shard smaller than the buffer is not read many
  times over first); ``seed`` makes it repeatable. ``repeat``:
  endless epochs; shuffled, pass ``p`` of the shard is shuffled with the seed ``seed + p``
  alone, so any pass can be built without the ones before it.
- ``start`` (with ``repeat``; shuffled, with a ``seed``): the shard's endless stream from its
  record ``start`` on, exactly as it goes on after the ``start`` records before it (a
  training process resuming mid-epoch: :func:`shard_records` gives the records of one pass).
  Shuffled, pass ``start // shard_records`` is built alone and its first records skipped
  (read, not parsed); unshuffled, the stream runs from its beginning, the records before
  ``start`` read and skipped.
- Batches are parsed as batches (``tf.io.parse_example`` on a batch of records; Parquet
  columns decoded per row group), never row by row.

- Without ``shuffle`` the order is fixed, and the same on HDFS as on local disk.

TensorFlow cannot open ``hdfs://``: HDFS TFRecord files are streamed through sparktf.storage
(``storage.open_scan``: one streaming request per file, received straight into numpy blocks)
and their framing located there (``tfrecord_streams``; length checksums verified, data
checksums with ``verify_checksums``; HDFS verifies its own block checksums on every read).
``num_parallel_reads`` files stream at once, each fetched and framed by a thread of its own
with the next files already opened, and one generator interleaves their records exactly as
``tf.data``'s interleave does for local files and hands over whole batches, packed into one
string that TensorFlow cuts into records. Parquet goes with pyarrow, row group by row group,
``workers`` at once; on HDFS a row group's column chunks come with one ranged request
(``storage.read_range``) and the footers are read once, concurrently (the file's tail, one
request), and each file's sparktf schema is checked against the manifest (petastorm's
readers read the files too, see ``petastorm_io``; its thread-pool readers are not used
here: in 0.13.1 they can end an epoch early, a race between their ventilator and
``get_results``). Figures: docs/hdfs-client.md.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator

import numpy as np
import tensorflow as tf

from sparktf import storage
from sparktf.datasets import formats
from sparktf.datasets.formats import PARQUET, TFRECORD
from sparktf.datasets.tfrecord_streams import (
    HDFS_FIRST_BLOCK,
    HDFS_READ_AHEAD,
    HDFS_READ_BLOCK,
    INTERLEAVE_BLOCK,
    TFRecordStreams,
    split_records,
)
from sparktf.errors import SparktfError, SparktfValueError

__all__ = [
    "AUTOTUNE",
    "DEFAULT_SHUFFLE_BUFFER",
    "HDFS_FIRST_BLOCK",
    "HDFS_READ_AHEAD",
    "HDFS_READ_BLOCK",
    "INTERLEAVE_BLOCK",
    "PARQUET_CHUNK_ROWS",
    "PARQUET_TAIL_BYTES",
    "SHUFFLE_CHUNK",
    "dataset_info",
    "parquet_dataset",
    "shard_records",
    "tfrecord_dataset",
]

AUTOTUNE = tf.data.AUTOTUNE
DEFAULT_SHUFFLE_BUFFER = 4096


def dataset_info(dataset_dir: str) -> dict:
    """The manifest of a dataset written by ``sparktf convert``.

    Args:
        dataset_dir: the dataset directory (``hdfs://...`` or a local path), the one holding
            ``manifest.json`` and a directory per split.

    Returns:
        The manifest as a dict: ``dataset``, ``formats``, ``fields`` (name, dtype, shape) and
        per split its files, record counts and checksums.

    Raises:
        sparktf.datasets.formats.ManifestError: no manifest there, or one that does not parse
            (the message names the file).
        sparktf.storage.StorageError: the storage cannot be reached or read.
    """
    return formats.load_manifest(dataset_dir)


def _resolve(path: str, split: str | None) -> tuple[str, str, dict]:
    """``(dataset_dir, split, manifest)`` for a split directory or a dataset directory."""
    path = path.rstrip("/")
    if storage.exists(formats.manifest_path(path)):
        if split is None:
            raise SparktfValueError(
                f"{path} is a dataset directory: pass split= (or give {path}/train)"
            )
        return path, split, formats.load_manifest(path)
    loc = storage.parse(path)
    if posixpath.basename(loc.path) in (TFRECORD, PARQUET):
        path = storage.Location(loc.scheme, loc.netloc, posixpath.dirname(loc.path)).uri
        loc = storage.parse(path)
    name = posixpath.basename(loc.path)
    if split is not None and split != name:
        raise SparktfValueError(f"split={split!r} does not match the split directory {path}")
    parent = storage.Location(loc.scheme, loc.netloc, posixpath.dirname(loc.path)).uri
    return parent, name, formats.load_manifest(parent)


def _plan(files: list[str], num_shards: int, shard_index: int) -> tuple[list[str], bool]:
    """This worker's files, and whether it must shard by records instead of by files."""
    if num_shards < 1 or not 0 <= shard_index < num_shards:
        raise SparktfValueError(
            f"need 0 <= shard_index < num_shards, got shard_index={shard_index}, "
            f"num_shards={num_shards}"
        )
    if num_shards == 1:
        return files, False
    if len(files) % num_shards == 0:
        return files[shard_index::num_shards], False
    return files, True


def _check_batch(batch_size: int) -> None:
    if batch_size < 1:
        raise SparktfValueError(f"batch_size must be positive, got {batch_size}")


def _check_start(start: int, *, shuffle: bool, seed, repeat: bool) -> None:
    if start < 0:
        raise SparktfValueError(f"start must be 0 or more, got {start}")
    if start and not repeat:
        raise SparktfValueError("start= needs repeat=True: it places an endless stream")
    if start and shuffle and seed is None:
        raise SparktfValueError(
            "start= with shuffle=True needs a seed: an unseeded order cannot be found again"
        )


def shard_records(
    path: str,
    fmt: str,
    *,
    split: str | None = None,
    num_shards: int = 1,
    shard_index: int = 0,
) -> int:
    """The records one pass of a shard holds (the shards of :func:`tfrecord_dataset` and
    :func:`parquet_dataset`): from the manifest's records per file, except for Parquet
    sharded by records, whose ``id`` column is read (one column of every file)."""
    dataset_dir, split, manifest = _resolve(path, split)
    return _shard_size(manifest, dataset_dir, split, fmt, num_shards, shard_index)


def _shard_size(manifest, dataset_dir, split, fmt, num_shards: int, shard_index: int) -> int:
    files = formats.split_files(manifest, dataset_dir, split, fmt)
    mine, by_records = _plan(files, num_shards, shard_index)
    per_file = [int(n) for n in manifest["splits"][split][fmt]["records"]]
    if not by_records:
        return sum(per_file[shard_index::num_shards]) if num_shards > 1 else sum(per_file)
    if fmt == TFRECORD:  # every num_shards-th record of the interleaved stream
        return len(range(shard_index, sum(per_file), num_shards))
    return sum(_ids_in_shard(f, num_shards, shard_index) for f in mine)


def _ids_in_shard(path: str, num_shards: int, shard_index: int) -> int:
    import pyarrow.parquet as pq

    loc = storage.parse(path)
    if loc.scheme == "file":
        ids = pq.read_table(loc.path, columns=["id"]).column("id").to_numpy()
    else:
        with storage.open_file(path, "rb") as stream:
            ids = pq.read_table(stream, columns=["id"]).column("id").to_numpy()
    return int(np.count_nonzero(ids % num_shards == shard_index))


def _pass_seed(seed, index):
    """The seed of pass ``index`` (a tensor in a ``flat_map``) of a shard seeded ``seed``."""
    return None if seed is None else tf.constant(seed, tf.int64) + index


# ----------------------------------------------------------------------------- TFRecord

SHUFFLE_CHUNK = 1024  # records per element handed to tf.data's record shuffle
PARQUET_CHUNK_ROWS = 2048  # rows per element the Parquet generator hands to tf.data
PARQUET_TAIL_BYTES = 64 << 10  # bytes read from a Parquet file's end: its footer, mostly
# row groups a shuffled Parquet window mixes at least (the end of a pass empties it): files
# often hold one row group of one key's rows (a table written sorted), and TFRecord's
# readers interleave 4 files too
MIX_ROW_GROUPS = 4


def _local_records(
    files: tf.data.Dataset, *, parallel: int, deterministic: bool
) -> tf.data.Dataset:
    return files.interleave(
        lambda path: tf.data.TFRecordDataset(path, buffer_size=1 << 20),
        cycle_length=parallel,
        block_length=INTERLEAVE_BLOCK,
        num_parallel_calls=parallel,
        deterministic=deterministic,
    )


def _shuffled_pass(records: tf.data.Dataset, buffer: int, seed) -> tf.data.Dataset:
    """One pass of ``records`` shuffled through ``buffer`` records (a new order each time the
    dataset is iterated). Endless passes are shuffled one by one instead, each with its own
    seed (``_pass_seed``): the buffer empties at the end of each pass, so a shard far smaller
    than the buffer yields its first batch after one pass, not after reading ``buffer /
    shard`` passes (over HDFS each pass is a new request per file: minutes for a one-record
    shard)."""
    return records.shuffle(buffer, seed=seed, reshuffle_each_iteration=True)


def _parser(manifest: dict):
    if manifest["kind"] == "image":
        height, width, channels = manifest["schema"]["image"]["shape"]
        spec = formats.feature_spec("image")
        spec = {k: spec[k] for k in ("image", "label", "id")}

        def parse(serialized):
            f = tf.io.parse_example(serialized, spec)
            image = tf.reshape(
                tf.io.decode_raw(f["image"], tf.uint8), [-1, height, width, channels]
            )
            image.set_shape([serialized.shape[0], height, width, channels])
            return {"image": image, "label": f["label"], "id": f["id"]}
    else:
        spec = formats.feature_spec("text", seq_len=manifest["schema"]["tokens"]["shape"][0])

        def parse(serialized):
            f = tf.io.parse_example(serialized, spec)
            return {"tokens": f["tokens"], "id": f["id"]}

    return parse


def tfrecord_dataset(
    path: str,
    *,
    batch_size: int,
    split: str | None = None,
    num_shards: int = 1,
    shard_index: int = 0,
    shuffle: bool = False,
    seed: int | None = None,
    repeat: bool = False,
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
    drop_remainder: bool = False,
    num_parallel_reads: int = 4,
    verify_checksums: bool = False,
    start: int = 0,
) -> tf.data.Dataset:
    """Batches of the TFRecord part files of one split (local or HDFS); see the module doc.

    Args:
        path: a split directory (``.../mnist/train``) or a dataset directory with ``split``.
        batch_size: records per batch (at least 1).
        split: the split's name when ``path`` is the dataset directory.
        num_shards, shard_index: read only this reader's share (one per TensorFlow worker):
            whole files when there are enough, else every ``num_shards``-th record.
        shuffle: shuffle the files and the records (through a ``shuffle_buffer`` of records);
            with ``seed`` the order is the same on every run.
        repeat: start over at the end (each pass reshuffled).
        drop_remainder: drop a last short batch (the batch dimension is then static).
        num_parallel_reads: files read at once.
        verify_checksums: check each file's CRC32C against the manifest as it is read.
        start: begin at this record of the shard's endless stream (with ``repeat``; with a
            ``seed`` when shuffled), as it would have gone on after the records before it.

    Returns:
        A ``tf.data.Dataset`` of dicts: images ``{"image": uint8 [B, H, W, C], "label":
        int64 [B], "id": int64 [B]}``, PTB ``{"tokens": int64 [B, seq_len], "id": int64 [B]}``.

    Raises:
        ValueError: a bad ``batch_size``, a dataset directory without ``split``, or a shard
            outside ``num_shards``.
        sparktf.datasets.formats.ManifestError: no manifest, or a split it does not list.
        sparktf.datasets.tfrecord.TFRecordError: while iterating, a corrupt record (naming
            the file and the record).
    """
    _check_batch(batch_size)
    _check_start(start, shuffle=shuffle, seed=seed, repeat=repeat)
    dataset_dir, split, manifest = _resolve(path, split)
    files = formats.split_files(manifest, dataset_dir, split, TFRECORD)
    mine, by_records = _plan(files, num_shards, shard_index)
    deterministic = _deterministic(shuffle, seed)
    # Shuffled endless passes are built one by one (pass p seeded seed + p), from the pass
    # `start` falls in; unshuffled, the records before `start` are skipped.
    passes, skip = None, start
    if shuffle and repeat:
        size = _shard_size(manifest, dataset_dir, split, TFRECORD, num_shards, shard_index)
        first_pass, skip = divmod(start, size) if size else (0, 0)
        passes = tf.data.Dataset.range(first_pass, tf.int64.max if size else first_pass)
    parallel = max(1, min(num_parallel_reads, len(mine)))
    parse = _parser(manifest)
    shuffling = dict(shuffle=shuffle, repeat=repeat, seed=seed, buffer=shuffle_buffer)
    if storage.parse(dataset_dir).scheme != "file":
        # TensorFlow cannot open hdfs://: one Python generator streams `parallel` files at
        # once (a thread each) and hands over whole batches (or chunks for the shuffle).
        whole = not (shuffle or skip)
        streams = TFRecordStreams(
            mine,
            cycle=parallel,
            chunk=batch_size if whole else SHUFFLE_CHUNK,
            by_records=by_records,
            num_shards=num_shards,
            shard_index=shard_index,
            shuffle_files=shuffle and not by_records,
            seed=seed,
            repeat=repeat and not shuffle,  # shuffled: one pass per call, repeated below
            drop_remainder=drop_remainder and whole,
            verify=verify_checksums,
        )
        if whole:  # the generator's batches, cut into records by TensorFlow
            packed = tf.data.Dataset.from_generator(
                streams, output_signature=_packed_signature(batch_size if drop_remainder else None)
            )
            return packed.map(
                lambda blob, starts, lengths: parse(split_records(blob, starts, lengths)),
                num_parallel_calls=AUTOTUNE,
                deterministic=deterministic,
            ).prefetch(AUTOTUNE)
        records = _streamed_records(streams, passes, **shuffling)
    else:
        paths = [storage.parse(f).path for f in mine]
        records = _local_records_of(
            paths, passes, parallel, by_records, num_shards, shard_index, **shuffling
        )
    batches = records.skip(skip).batch(batch_size, drop_remainder=drop_remainder)
    batches = batches.map(parse, num_parallel_calls=AUTOTUNE, deterministic=deterministic)
    return batches.prefetch(AUTOTUNE)


def _deterministic(shuffle: bool, seed: int | None) -> bool:
    """Whether parallel reads and parses must keep their order: unless the order is random
    anyway (shuffled without a seed), where handing results over as they come is faster."""
    return not shuffle or seed is not None


def _packed_signature(batch: int | None) -> tuple:
    return (
        tf.TensorSpec([], tf.string),
        tf.TensorSpec([batch], tf.int64),
        tf.TensorSpec([batch], tf.int64),
    )


def _streamed_records(streams, passes, *, shuffle, repeat, seed, buffer) -> tf.data.Dataset:
    """The records (serialized) of an HDFS generator's chunks: shuffled endless passes one by
    one (the generator shuffles the files of pass ``index``), else its stream."""
    if shuffle and repeat:

        def one_pass(index):
            packed = tf.data.Dataset.from_generator(
                streams, args=(index,), output_signature=_packed_signature(None)
            )
            records = packed.map(split_records).unbatch()
            return records.shuffle(buffer, seed=_pass_seed(seed, index))

        return passes.flat_map(one_pass)
    packed = tf.data.Dataset.from_generator(streams, output_signature=_packed_signature(None))
    records = packed.map(split_records).unbatch()
    return _shuffled_pass(records, buffer, seed) if shuffle else records


def _local_records_of(
    paths, passes, parallel, by_records, num_shards, shard_index, *, shuffle, repeat, seed, buffer
) -> tf.data.Dataset:
    """The records (serialized) of local TFRecord files: shuffled endless passes one by one
    (pass ``index`` shuffles the files, then the records, seeded ``seed + index``)."""
    deterministic = _deterministic(shuffle, seed)
    names = tf.data.Dataset.from_tensor_slices(tf.constant(paths, dtype=tf.string))
    if shuffle and repeat:

        def one_pass(index):
            pass_seed = _pass_seed(seed, index)
            if by_records:
                records = _local_records(names, parallel=parallel, deterministic=True)
                records = records.shard(num_shards, shard_index)
            else:
                order = names.shuffle(len(paths), seed=pass_seed)
                records = _local_records(order, parallel=parallel, deterministic=deterministic)
            return records.shuffle(buffer, seed=pass_seed)

        return passes.flat_map(one_pass)
    if by_records:
        records = _local_records(names, parallel=parallel, deterministic=True).shard(
            num_shards, shard_index
        )
        records = records.repeat() if repeat else records
    elif shuffle:  # one pass (each iteration over the dataset in a new order)
        names = names.shuffle(len(paths), seed=seed, reshuffle_each_iteration=True)
        records = _local_records(names, parallel=parallel, deterministic=deterministic)
    else:  # unshuffled epochs run on into each other (the HDFS generator's order)
        records = _local_records(
            names.repeat() if repeat else names, parallel=parallel, deterministic=deterministic
        )
    return _shuffled_pass(records, buffer, seed) if shuffle else records


# ----------------------------------------------------------------------------- Parquet


def _signature(manifest: dict, batch: int | None) -> dict:
    """One tensor per column of the manifest's fields (images, PTB chunks, or a table's)."""
    return {
        f.name: tf.TensorSpec(
            [batch, *(f.shape or ())], tf.string if f.dtype == "string" else tf.as_dtype(f.dtype)
        )
        for f in formats.manifest_fields(manifest)
    }


def _column_span(metadata, group: int, columns: list[str]) -> tuple[int, int] | None:
    """(offset, length) of the bytes holding ``columns`` of row group ``group`` (from the
    first page of the first to the end of the last), None when the offsets do not add up."""
    row_group = metadata.row_group(group)
    start, end = None, None
    for i in range(row_group.num_columns):
        chunk = row_group.column(i)
        if chunk.path_in_schema not in columns:
            continue
        first = chunk.data_page_offset
        if chunk.has_dictionary_page and chunk.dictionary_page_offset:
            first = min(first, chunk.dictionary_page_offset)
        last = first + chunk.total_compressed_size
        start = first if start is None else min(start, first)
        end = last if end is None else max(end, last)
    if start is None or start < 4:
        return None
    return start, end - start


class _OutsideRange(SparktfError, OSError):
    """pyarrow read outside the fetched range of a ``_RangeFile``."""


class _RangeFile(storage.SeekableReader):
    """A read-only file that holds one byte range of a Parquet file (its row group's column
    chunks), for pyarrow given the footer as ``metadata``: a read outside the range is an
    error naming the file, never a silent gap."""

    def __init__(self, footer_bytes: int, start: int, data: bytes, name: str):
        self._start, self._data, self._name = start, memoryview(data), name
        # pyarrow asks for the size; the range plus a footer is enough to satisfy it.
        self._size = start + len(data) + footer_bytes + 8
        self._pos = 0

    def read(self, size: int = -1):
        at = self._pos - self._start
        if size is None or size < 0:
            size = len(self._data) - at
        if at < 0 or at + size > len(self._data):
            raise _OutsideRange(
                f"{self._name}: pyarrow read bytes {self._pos}-{self._pos + size} outside the "
                f"fetched row group range {self._start}-{self._start + len(self._data)}"
            )
        self._pos += size
        return self._data[at : at + size]

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


class _ParquetBatches:
    """The generator behind ``parquet_dataset``: row groups in, (shuffled) batches out.

    Row groups are read with pyarrow (local files directly, HDFS through the WebHDFS file
    system of sparktf.storage), ``workers`` of them ahead of use; columns are decoded whole.
    """

    def __init__(
        self,
        manifest,
        files,
        *,
        batch_size,
        num_shards,
        shard_index,
        by_records,
        shuffle,
        seed,
        repeat,
        shuffle_buffer,
        drop_remainder,
        workers,
        first_pass=0,
        skip=0,
    ):
        self.files = files
        self.first_pass, self.skip = first_pass, skip
        self.fields = formats.manifest_fields(manifest)
        self.batch_size, self.drop_remainder = batch_size, drop_remainder
        self.num_shards, self.shard_index, self.by_records = num_shards, shard_index, by_records
        self.shuffle, self.seed, self.repeat = shuffle, seed, repeat
        self.shuffle_buffer, self.workers = shuffle_buffer, workers
        self.calls = 0

    @staticmethod
    def _metadata(path: str):
        """The footer of one Parquet file (on HDFS: its size, then its tail in one request)."""
        import pyarrow as pa
        import pyarrow.parquet as pq

        loc = storage.parse(path)
        if loc.scheme == "file":
            return pq.read_metadata(loc.path)
        size = storage.size(path)
        tail = storage.read_range(path, max(0, size - PARQUET_TAIL_BYTES), PARQUET_TAIL_BYTES)
        footer = int.from_bytes(tail[-8:-4], "little") + 8 if len(tail) >= 8 else size + 1
        if footer <= len(tail):  # the whole footer is there
            return pq.ParquetFile(pa.BufferReader(tail)).metadata
        with storage.open_file(path, "rb") as stream:  # a footer larger than the tail
            return pq.ParquetFile(stream).metadata

    def _units(self, pool) -> list[tuple[str, int, object]]:
        """(file, row group, file metadata) of every row group, footers read concurrently."""
        units = []
        for path, metadata in zip(self.files, pool.map(self._metadata, self.files)):
            formats.check_schema(metadata.metadata, self.fields, path)
            units += [(path, i, metadata) for i in range(metadata.num_row_groups)]
        return units

    def _table(self, path: str, group: int, metadata):
        import pyarrow.parquet as pq

        columns = [f.name for f in self.fields]
        loc = storage.parse(path)
        if loc.scheme == "file":
            with pq.ParquetFile(loc.path, memory_map=True, metadata=metadata) as pf:
                return pf.read_row_group(group, columns=columns)
        # HDFS: the row group's column chunks are contiguous: fetch them with one streamed
        # request and let pyarrow read them from memory (the footer is known already).
        span = _column_span(metadata, group, columns)
        if span is None:  # offsets that do not add up: let pyarrow seek its own way
            with storage.open_file(path, "rb") as stream:
                return pq.ParquetFile(stream).read_row_group(group, columns=columns)
        start, length = span
        data = storage.read_range(path, start, length)
        file = _RangeFile(metadata.serialized_size, start, data, path)
        try:
            return pq.ParquetFile(file, metadata=metadata).read_row_group(group, columns=columns)
        except _OutsideRange:  # pyarrow wanted more (an old writer's padding): plain reads
            with storage.open_file(path, "rb") as stream:
                return pq.ParquetFile(stream).read_row_group(group, columns=columns)

    def _read(self, unit: tuple[str, int, object]) -> dict[str, np.ndarray]:
        path, group, metadata = unit
        table = self._table(path, group, metadata)
        out = {}
        for field in self.fields:
            column = table.column(field.name)
            try:
                if field.shape is not None:
                    out[field.name] = formats.decode_ndarray_column(
                        column, field.dtype, field.shape
                    )
                else:
                    out[field.name] = np.array(column.to_numpy(), dtype=field.dtype)  # a copy
            except ValueError as exc:
                raise SparktfValueError(f"{path}, row group {group}: {exc}") from exc
        if self.by_records:
            keep = out["id"] % self.num_shards == self.shard_index
            out = {k: v[keep] for k, v in out.items()}
        return out

    def _rng(self, index: int):
        return np.random.default_rng(None if self.seed is None else self.seed + index)

    def _groups(self) -> Iterator[tuple[object, dict[str, np.ndarray] | None]]:
        """``(rng, columns)`` of the row groups (this shard's rows), pass after pass, each pass
        in the order of its own ``rng``; ``(rng, None)`` after each pass when repeating."""
        from collections import deque
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(self.workers, thread_name_prefix="parquet-read") as pool:
            units = self._units(pool)

            def one_pass(rng) -> Iterator[dict[str, np.ndarray]]:
                order = rng.permutation(len(units)) if self.shuffle else range(len(units))
                pending: deque = deque()
                for index in order:
                    pending.append(pool.submit(self._read, units[index]))
                    if len(pending) > self.workers:
                        yield pending.popleft().result()
                while pending:
                    yield pending.popleft().result()

            # tf.data calls this once per iteration over the dataset: a call of one pass is
            # seeded seed + call, the endless passes seed + pass (from first_pass on).
            if self.repeat:
                index = self.first_pass
            else:
                index, self.calls = self.calls, self.calls + 1
            while True:
                rng, rows = self._rng(index), 0
                for cols in one_pass(rng):
                    rows += len(cols["id"])
                    yield rng, cols
                if not self.repeat or not rows:  # repeating a pass without rows never ends
                    return
                yield rng, None  # a pass ends: the shuffle window does not wait for the next
                index += 1

    def __call__(self) -> Iterator[dict[str, np.ndarray]]:
        """Row-group columns in order (or windows of at least ``shuffle_buffer`` records and
        :data:`MIX_ROW_GROUPS` row groups, permuted),
        in slices of ``chunk`` rows, the first ``skip`` rows left out: views, not copies;
        ``rebatch`` cuts the batches."""
        chunk = -(-PARQUET_CHUNK_ROWS // self.batch_size) * self.batch_size
        skip = self.skip
        for cols in self._windows():
            if skip:
                n = len(cols["id"])
                cols, skip = {k: v[skip:] for k, v in cols.items()}, max(0, skip - n)
            if len(cols["id"]):
                yield from _slices(cols, chunk)

    def _windows(self) -> Iterator[dict[str, np.ndarray]]:
        if not self.shuffle:
            for _, cols in self._groups():
                if cols is not None:
                    yield cols
            return
        pending: list[dict[str, np.ndarray]] = []
        held, rng = 0, None
        for rng, cols in self._groups():
            if cols is not None:
                pending.append(cols)
                held += len(cols["id"])
            full = held >= self.shuffle_buffer and len(pending) >= MIX_ROW_GROUPS
            if pending and (cols is None or full):
                yield self._permuted(pending, rng)
                pending, held = [], 0
        if pending:
            yield self._permuted(pending, rng)

    @staticmethod
    def _permuted(pending, rng) -> dict[str, np.ndarray]:
        cols = {k: np.concatenate([p[k] for p in pending]) for k in pending[0]}
        order = rng.permutation(len(cols["id"]))
        return {k: v[order] for k, v in cols.items()}


def _slices(cols: dict[str, np.ndarray], rows: int) -> Iterator[dict[str, np.ndarray]]:
    n = len(cols["id"])
    for start in range(0, n, rows):
        yield {k: v[start : start + rows] for k, v in cols.items()}


def parquet_dataset(
    path: str,
    *,
    batch_size: int,
    split: str | None = None,
    num_shards: int = 1,
    shard_index: int = 0,
    shuffle: bool = False,
    seed: int | None = None,
    repeat: bool = False,
    shuffle_buffer: int = DEFAULT_SHUFFLE_BUFFER,
    drop_remainder: bool = False,
    workers: int | None = None,
    start: int = 0,
) -> tf.data.Dataset:
    """Batches of the Parquet files of one split (local or HDFS); see the module doc.

    Args:
        path, batch_size, split, num_shards, shard_index, shuffle, seed, repeat,
        shuffle_buffer, drop_remainder, start: as for :func:`tfrecord_dataset`.
        workers: row groups read ahead in parallel threads (default 2 on local disk, 4 on
            HDFS, where each one streams its row group with one request).

    Returns:
        A ``tf.data.Dataset`` of the same dicts as :func:`tfrecord_dataset`. Without
        ``shuffle`` the records come in file order.

    Raises:
        ValueError: as for :func:`tfrecord_dataset`.
        sparktf.datasets.formats.ManifestError: no manifest, or a split it does not list.
        sparktf.datasets.formats.ParquetSchemaError: a file whose schema disagrees with the
            manifest (naming the file and the column).
    """
    _check_batch(batch_size)
    dataset_dir, split, manifest = _resolve(path, split)
    _check_start(start, shuffle=shuffle, seed=seed, repeat=repeat)
    files = formats.split_files(manifest, dataset_dir, split, PARQUET)
    mine, by_records = _plan(files, num_shards, shard_index)
    first_pass, skip = 0, start
    if start and shuffle:
        size = _shard_size(manifest, dataset_dir, split, PARQUET, num_shards, shard_index)
        first_pass, skip = divmod(start, size) if size else (0, 0)
    generator = _ParquetBatches(
        manifest,
        mine,
        batch_size=batch_size,
        num_shards=num_shards,
        shard_index=shard_index,
        by_records=by_records,
        shuffle=shuffle,
        seed=seed,
        repeat=repeat,
        shuffle_buffer=shuffle_buffer,
        drop_remainder=drop_remainder,
        workers=max(1, workers or (2 if storage.parse(dataset_dir).scheme == "file" else 4)),
        first_pass=first_pass,
        skip=skip,
    )
    chunks = tf.data.Dataset.from_generator(generator, output_signature=_signature(manifest, None))
    return chunks.rebatch(batch_size, drop_remainder=drop_remainder).prefetch(AUTOTUNE)
