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
  ``shuffle_buffer`` records; ``seed`` makes it repeatable. ``repeat``: endless epochs.
- Batches are parsed as batches (``tf.io.parse_example`` on a batch of records; Parquet
  columns decoded per row group), never row by row.

TensorFlow cannot open ``hdfs://``: HDFS TFRecord files are streamed through sparktf.storage
and their framing parsed here (length checksums verified, data checksums with
``verify_checksums``; HDFS verifies its own block checksums on every read). Parquet goes
with pyarrow, row group by row group, through sparktf.storage (the
files are petastorm datasets: ``petastorm_io.make_reader`` reads them too; petastorm's own
thread-pool readers are not used here: in 0.13.1 they can end an epoch early, a race between
their ventilator and ``get_results``).
"""

from __future__ import annotations

import contextlib
import posixpath
import queue
import threading
from collections.abc import Iterator

import numpy as np
import tensorflow as tf

from sparktf import storage
from sparktf.datasets import formats, tfrecord
from sparktf.datasets.formats import PARQUET, TFRECORD

AUTOTUNE = tf.data.AUTOTUNE
DEFAULT_SHUFFLE_BUFFER = 4096


def dataset_info(dataset_dir: str) -> dict:
    """The manifest of a converted dataset (see ``formats.load_manifest``)."""
    return formats.load_manifest(dataset_dir)


def _resolve(path: str, split: str | None) -> tuple[str, str, dict]:
    """``(dataset_dir, split, manifest)`` for a split directory or a dataset directory."""
    path = path.rstrip("/")
    if storage.exists(formats.manifest_path(path)):
        if split is None:
            raise ValueError(f"{path} is a dataset directory: pass split= (or give {path}/train)")
        return path, split, formats.load_manifest(path)
    loc = storage.parse(path)
    if posixpath.basename(loc.path) in (TFRECORD, PARQUET):
        path = storage.Location(loc.scheme, loc.netloc, posixpath.dirname(loc.path)).uri
        loc = storage.parse(path)
    name = posixpath.basename(loc.path)
    if split is not None and split != name:
        raise ValueError(f"split={split!r} does not match the split directory {path}")
    parent = storage.Location(loc.scheme, loc.netloc, posixpath.dirname(loc.path)).uri
    return parent, name, formats.load_manifest(parent)


def _plan(files: list[str], num_shards: int, shard_index: int) -> tuple[list[str], bool]:
    """This worker's files, and whether it must shard by records instead of by files."""
    if num_shards < 1 or not 0 <= shard_index < num_shards:
        raise ValueError(
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
        raise ValueError(f"batch_size must be positive, got {batch_size}")


# ----------------------------------------------------------------------------- TFRecord

HDFS_READ_BLOCK = 16 << 20  # bytes per WebHDFS request: fewer, larger requests read faster


class _ReadAhead:
    """A read-only stream over a sparktf path whose next block is fetched by a thread while
    the current one is parsed (each block is one WebHDFS range request). Holds up to about
    three blocks per open file."""

    def __init__(self, path: str, block: int = HDFS_READ_BLOCK, depth: int = 1):
        self._queue: queue.Queue = queue.Queue(depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._fetch, args=(path, block), daemon=True, name=f"read-ahead {path}"
        )
        self._thread.start()

    def _fetch(self, path: str, block: int) -> None:
        try:
            with storage.open_file(path, "rb") as f:
                while not self._stop.is_set():
                    data = f.read(block)
                    self._put(data)
                    if not data:
                        return
        except BaseException as exc:  # handed to the reading thread
            self._put(exc)

    def _put(self, item) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def read(self, _size: int = -1) -> bytes:
        item = self._queue.get()
        if isinstance(item, BaseException):
            raise item
        return item

    def close(self) -> None:
        self._stop.set()
        self._thread.join()


def _stream_batches(path: bytes, verify: bool) -> Iterator[np.ndarray]:
    name = path.decode()
    stream = (
        _ReadAhead(name) if storage.parse(name).scheme != "file" else storage.open_file(name, "rb")
    )
    try:
        for batch in tfrecord.iter_record_batches(stream, name=name, verify_data=bool(verify)):
            yield np.array(batch, dtype=object)
    finally:
        stream.close()


def _records(
    files: tf.data.Dataset, *, local: bool, parallel: int, deterministic: bool, verify: bool
) -> tf.data.Dataset:
    if local:

        def open_one(path):
            return tf.data.TFRecordDataset(path, buffer_size=1 << 20)
    else:

        def open_one(path):
            return tf.data.Dataset.from_generator(
                _stream_batches,
                args=(path, verify),
                output_signature=tf.TensorSpec([None], tf.string),
            ).unbatch()

    return files.interleave(
        open_one,
        cycle_length=parallel,
        block_length=16,
        num_parallel_calls=parallel,
        deterministic=deterministic,
    )


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
) -> tf.data.Dataset:
    """Batches of the TFRecord part files of one split (local or HDFS); see the module doc.

    Returns a ``tf.data.Dataset`` of dicts: images ``{"image": uint8 [B, H, W, C], "label":
    int64 [B], "id": int64 [B]}``, PTB ``{"tokens": int64 [B, seq_len], "id": int64 [B]}``.
    With ``drop_remainder`` the batch dimension is static.
    """
    _check_batch(batch_size)
    dataset_dir, split, manifest = _resolve(path, split)
    files = formats.split_files(manifest, dataset_dir, split, TFRECORD)
    mine, by_records = _plan(files, num_shards, shard_index)
    local = storage.parse(dataset_dir).scheme == "file"
    if local:
        mine = [storage.parse(f).path for f in mine]
    deterministic = not shuffle or seed is not None
    parallel = max(1, min(num_parallel_reads, len(mine)))
    names = tf.data.Dataset.from_tensor_slices(tf.constant(mine, dtype=tf.string))
    if by_records:
        records = _records(
            names, local=local, parallel=parallel, deterministic=True, verify=verify_checksums
        ).shard(num_shards, shard_index)
        if repeat:
            records = records.repeat()
    else:
        if shuffle:
            names = names.shuffle(len(mine), seed=seed, reshuffle_each_iteration=True)
        if repeat:
            names = names.repeat()
        records = _records(
            names,
            local=local,
            parallel=parallel,
            deterministic=deterministic,
            verify=verify_checksums,
        )
    if shuffle:
        records = records.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    batches = records.batch(batch_size, drop_remainder=drop_remainder)
    batches = batches.map(
        _parser(manifest), num_parallel_calls=AUTOTUNE, deterministic=deterministic
    )
    return batches.prefetch(AUTOTUNE)


# ----------------------------------------------------------------------------- Parquet


def _signature(manifest: dict, batch: int | None) -> dict:
    if manifest["kind"] == "image":
        shape = manifest["schema"]["image"]["shape"]
        return {
            "image": tf.TensorSpec([batch, *shape], tf.uint8),
            "label": tf.TensorSpec([batch], tf.int64),
            "id": tf.TensorSpec([batch], tf.int64),
        }
    seq_len = manifest["schema"]["tokens"]["shape"][0]
    return {
        "tokens": tf.TensorSpec([batch, seq_len], tf.int64),
        "id": tf.TensorSpec([batch], tf.int64),
    }


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
    ):
        self.files = files
        self.fields = formats.manifest_fields(manifest)
        self.batch_size, self.drop_remainder = batch_size, drop_remainder
        self.num_shards, self.shard_index, self.by_records = num_shards, shard_index, by_records
        self.shuffle, self.seed, self.repeat = shuffle, seed, repeat
        self.shuffle_buffer, self.workers = shuffle_buffer, workers
        self.calls = 0

    @staticmethod
    @contextlib.contextmanager
    def _open(path: str):
        import pyarrow.parquet as pq

        loc = storage.parse(path)
        if loc.scheme == "file":
            with pq.ParquetFile(loc.path, memory_map=True) as pf:
                yield pf
            return
        # pyarrow reads a column chunk with one read(n): one WebHDFS range request.
        with storage.open_file(path, "rb") as stream:
            yield pq.ParquetFile(stream)

    def _units(self) -> list[tuple[str, int]]:
        units = []
        for path in self.files:
            with self._open(path) as pf:
                units += [(path, i) for i in range(pf.metadata.num_row_groups)]
        return units

    def _read(self, unit: tuple[str, int]) -> dict[str, np.ndarray]:
        path, group = unit
        with self._open(path) as pf:
            table = pf.read_row_group(group, columns=[f.name for f in self.fields])
        out = {}
        for field in self.fields:
            column = table.column(field.name)
            try:
                if field.shape is not None:
                    out[field.name] = formats.decode_ndarray_column(
                        column, field.dtype, field.shape
                    )
                else:
                    out[field.name] = np.array(column.to_numpy(), dtype=np.int64)  # a copy
            except ValueError as exc:
                raise ValueError(f"{path}, row group {group}: {exc}") from exc
        if self.by_records:
            keep = out["id"] % self.num_shards == self.shard_index
            out = {k: v[keep] for k, v in out.items()}
        return out

    def _groups(self, rng) -> Iterator[dict[str, np.ndarray]]:
        from concurrent.futures import ThreadPoolExecutor

        units = self._units()
        with ThreadPoolExecutor(self.workers, thread_name_prefix="parquet-read") as pool:
            while True:
                order = rng.permutation(len(units)) if self.shuffle else range(len(units))
                pending = []
                for index in order:
                    pending.append(pool.submit(self._read, units[index]))
                    if len(pending) > self.workers:
                        yield pending.pop(0).result()
                for future in pending:
                    yield future.result()
                if not self.repeat:
                    return

    def __call__(self) -> Iterator[dict[str, np.ndarray]]:
        # tf.data calls this once per iteration over the dataset: vary the seed per call.
        seed = None if self.seed is None else self.seed + self.calls
        self.calls += 1
        rng = np.random.default_rng(seed)
        want = max(self.batch_size, self.shuffle_buffer if self.shuffle else 0)
        pending: list[dict[str, np.ndarray]] = []
        held = 0
        for cols in self._groups(rng):
            n = len(cols["id"])
            if n == 0:
                continue
            pending.append(cols)
            held += n
            if held >= want:
                rest = yield from self._emit(pending, rng, final=False)
                pending, held = ([rest], len(rest["id"])) if rest else ([], 0)
        if pending:
            yield from self._emit(pending, rng, final=True)

    def _emit(self, pending, rng, *, final: bool):
        cols = {k: np.concatenate([p[k] for p in pending]) for k in pending[0]}
        n = len(cols["id"])
        if self.shuffle:
            order = rng.permutation(n)
            cols = {k: v[order] for k, v in cols.items()}
        full = n // self.batch_size * self.batch_size
        for start in range(0, full, self.batch_size):
            yield {k: v[start : start + self.batch_size] for k, v in cols.items()}
        if full < n:
            rest = {k: v[full:] for k, v in cols.items()}
            if not final:
                return rest
            if not self.drop_remainder:
                yield rest
        return None


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
    workers: int = 2,
) -> tf.data.Dataset:
    """Batches of the Parquet (petastorm) files of one split (local or HDFS); see the module doc.

    Same arguments and batches as ``tfrecord_dataset``; ``workers``: row groups read ahead
    in parallel threads. Without ``shuffle`` the records come in file order.
    """
    _check_batch(batch_size)
    dataset_dir, split, manifest = _resolve(path, split)
    files = formats.split_files(manifest, dataset_dir, split, PARQUET)
    mine, by_records = _plan(files, num_shards, shard_index)
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
        workers=max(1, workers),
    )
    signature = _signature(manifest, batch_size if drop_remainder else None)
    dataset = tf.data.Dataset.from_generator(generator, output_signature=signature)
    return dataset.prefetch(AUTOTUNE)
