"""The executor side of a conversion: the functions Spark runs, one work unit per task.

Each takes a plain dict (a unit planned by ``sparktf.datasets.conversion_plan``) plus keyword
settings
bound with ``functools.partial``, reads and validates its part of the input, writes its
files, and returns a small dict of counts for the driver:

- :func:`prepare_container`: one gzip file or archive, unpacked into the staging directory
  and hashed;
- :func:`hash_files`: the size and SHA-256 of plain input files (a :class:`HashTask`);
- :func:`write_image_shard`: one shard of CIFAR-10 or MNIST records, read by byte range and
  written as its TFRecord part and/or Parquet file in one pass (:class:`ShardOutput`);
- :func:`count_range`: the tokens (and train words) of one line-aligned byte range of PTB;
- :func:`write_text_shard`: one shard of PTB chunks, written the same way.

Bad input raises :class:`sparktf.datasets.sources.SourceError` naming the file and the byte
offset or record. Everything here is module-level or a small class, so Spark pickles it by
reference; nothing of the driver travels with a task but its unit and settings.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from sparktf import storage
from sparktf.datasets import formats, sources, tfrecord
from sparktf.datasets.sources import SourceError

__all__ = [
    "ROW_GROUP_MB",
    "HashTask",
    "ShardOutput",
    "count_range",
    "hash_files",
    "hash_or_run",
    "image_blocks",
    "prepare_container",
    "token_blocks",
    "write_image_shard",
    "write_text_shard",
]

log = logging.getLogger(__name__)

ROW_GROUP_MB = 256  # Parquet row group size: one row group per file below this


# ----------------------------------------------------------------------------- input files


def _wanted(dataset: str, name: str) -> bool:
    if dataset == "cifar10":
        return bool(sources.CIFAR_TRAIN.match(name)) or name == sources.CIFAR_TEST
    return False


def prepare_container(container: dict, *, dataset: str, staging: str) -> list[dict]:
    """Task: the raw files of a gzip file or an archive, unpacked into ``staging``, hashed."""
    path, kind = container["path"], container["kind"]
    if kind == "gzip":
        target = storage.join(staging, container["name"])
        stats = sources.gunzip(path, target)
        return [
            {
                "name": container["name"],
                "path": target,
                "label": f"{path} (gunzipped)",
                "origin": path,
                **stats,
            }
        ]
    members, archive = sources.extract_members(path, functools.partial(_wanted, dataset), staging)
    names = {m["name"] for m in members}
    if sources.CIFAR_TEST not in names or not any(sources.CIFAR_TRAIN.match(n) for n in names):
        raise SourceError(
            path,
            "archive does not hold data_batch_*.bin and test_batch.bin "
            f"(found {', '.join(sorted(names)) or 'none of them'})",
        )
    return [
        {
            "name": m["name"],
            "path": m["path"],
            "label": f"{path}[{m['member']}]",
            "origin": path,
            "member": m["member"],
            "size": m["size"],
            "sha256": m["sha256"],
            "container": archive,
        }
        for m in members
    ]


@dataclass(frozen=True)
class HashTask:
    """Plain input files that one task hashes (their paths)."""

    paths: tuple[str, ...]


def hash_files(task: HashTask) -> dict[str, dict]:
    """Task: ``{path: {"size", "sha256"}}`` of the files of ``task``, each streamed once."""
    return {path: sources.file_digest(path) for path in task.paths}


def hash_or_run(fn: Callable, item):
    """Task: hashes a :class:`HashTask`; any other item goes to ``fn``. Hash tasks so share a
    Spark job with another pass and run beside it."""
    if isinstance(item, HashTask):
        return hash_files(item)
    return fn(item)


# ----------------------------------------------------------------------------- image tasks


def image_blocks(
    dataset: str, unit: dict, block: int
) -> Iterator[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``(images, labels, ids)`` blocks of one unit's records, in order (runs on executors)."""
    for seg in unit["segments"]:
        if dataset == "cifar10":
            blocks = sources.read_cifar(
                seg["path"], seg["start"], seg["stop"], block=block, label=seg["label"]
            )
        else:
            blocks = sources.read_mnist(
                seg["path"],
                seg["labels_path"],
                seg["rows"],
                seg["cols"],
                seg["start"],
                seg["stop"],
                block=block,
                images_label=seg["label"],
                labels_label=seg["labels_label"],
            )
        for first, labels, images in blocks:
            ids = formats.make_id(seg["file_index"], np.arange(first, first + len(labels)))
            yield images, labels, ids


class ShardOutput:
    """The part files of one shard, written from the same blocks: the TFRecord part (when
    ``unit["file"]`` is given) and the Parquet file (when ``unit["parquet_file"]`` is), whose
    rows are buffered up to ``ROW_GROUP_MB`` per row group (one row group per file below)."""

    def __init__(self, out: str, unit: dict, fields: Sequence[formats.Field]):
        self._tfrecord = (
            storage.open_file(storage.join(out, unit["file"]), "wb") if unit.get("file") else None
        )
        self._parquet_path = (
            storage.join(out, unit["parquet_file"]) if unit.get("parquet_file") else None
        )
        self._fields = fields
        self._name = f"{unit['split']} shard {unit['shard']}"
        self._schema = formats.arrow_schema(fields) if self._parquet_path else None
        self._pending: list = []
        self._pending_bytes = 0
        self._parquet_file = self._parquet_writer = None
        self.bytes = self.parquet_bytes = self.row_groups = 0

    @property
    def tfrecord(self) -> bool:
        return self._tfrecord is not None

    @property
    def parquet(self) -> bool:
        return self._parquet_path is not None

    def log_written(self, records: int, noun: str, started: float) -> None:
        """Logs what the shard holds once written (``noun``: "records", "chunks")."""
        log.info(
            "%s: %d %s, %d TFRecord bytes, %d Parquet bytes in %.1f s",
            self._name,
            records,
            noun,
            self.bytes,
            self.parquet_bytes,
            time.monotonic() - started,
        )

    def write_tfrecord(self, data: bytes) -> None:
        self._tfrecord.write(data)
        self.bytes += len(data)

    def write_parquet(self, arrays: Sequence) -> None:
        """Appends one block of rows (one pyarrow array per field, in ``fields`` order)."""
        import pyarrow as pa

        batch = pa.RecordBatch.from_arrays(list(arrays), schema=self._schema)
        self._pending.append(batch)
        self._pending_bytes += batch.nbytes
        if self._pending_bytes >= ROW_GROUP_MB << 20:
            self._flush()

    def _flush(self) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        if not self._pending:
            return
        table = pa.Table.from_batches(self._pending)
        if self._parquet_writer is None:
            self._parquet_file = storage.open_file(self._parquet_path, "wb")
            # Dictionary encoding only pays for the scalar columns (image bytes are unique);
            # pixels (uint8) barely compress with snappy and would slow the write: those stay
            # plain, the rest is snappy.
            scalars = [f.name for f in self._fields if f.shape is None]
            compression = {
                f.name: "NONE" if f.shape is not None and f.dtype == "uint8" else "SNAPPY"
                for f in self._fields
            }
            self._parquet_writer = pq.ParquetWriter(
                self._parquet_file, table.schema, compression=compression, use_dictionary=scalars
            )
        self._parquet_writer.write_table(table, row_group_size=table.num_rows)
        self.row_groups += 1
        self._pending, self._pending_bytes = [], 0

    def close(self, ok: bool = True) -> None:
        """Writes what is buffered (``ok``) and closes every file."""
        try:
            if ok and self.parquet:
                self._flush()
        finally:
            for f in (self._parquet_writer, self._parquet_file, self._tfrecord):
                if f is not None:
                    f.close()
            if self._parquet_file is not None:
                self.parquet_bytes = storage.size(self._parquet_path) if ok else 0

    def __enter__(self) -> ShardOutput:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(ok=exc_type is None)

    def result(self, records: int) -> dict:
        return {
            "records": records,
            "bytes": self.bytes,
            "parquet_bytes": self.parquet_bytes,
            "row_groups": self.row_groups,
        }


def write_image_shard(
    unit: dict, *, dataset: str, out: str, fields, block: int, num_classes: int
) -> dict:
    """Task: validates one shard's records and writes its TFRecord and/or Parquet file from
    the same blocks (one pass over the input)."""
    import pyarrow as pa

    started = time.monotonic()
    records = 0
    label_counts = np.zeros(num_classes, dtype=np.int64)
    with ShardOutput(out, unit, fields) as output:
        for images, labels, ids in image_blocks(dataset, unit, block):
            if output.tfrecord:
                output.write_tfrecord(tfrecord.frame_images(images, labels, ids))
            if output.parquet:
                output.write_parquet(
                    [
                        formats.encode_ndarray_column(images),
                        pa.array(labels, pa.int64()),
                        pa.array(ids, pa.int64()),
                    ]
                )
            records += len(labels)
            label_counts += np.bincount(labels, minlength=num_classes)
    output.log_written(records, "records", started)
    return {**output.result(records), "label_counts": label_counts.tolist()}


# ----------------------------------------------------------------------------- text tasks


def count_range(rng: dict) -> dict:
    """Task: tokens (and for train, word counts) of the lines starting in one byte range."""
    tokens, counts = 0, Counter()
    with storage.open_file(rng["path"], "rb") as f:
        start = sources.line_start(f, rng["start"])
        for pos, line in sources.iter_lines(f, start, rng["stop"]):
            words = sources.line_words(line, rng["label"], pos)
            tokens += len(words)
            if rng["count_words"]:
                counts.update(words)
    return {"start": start, "tokens": tokens, "counts": dict(counts)}


def token_blocks(
    unit: dict,
    vocab: dict[str, int],
    seq_len: int,
    unk_id: int | None,
    block: int,
    stats: dict | None = None,
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``(tokens [n, seq_len], ids)`` blocks of one text shard's chunks (runs on executors)."""
    need = unit["chunks"] * seq_len
    skip = unit["skip"]
    chunk = unit["chunk0"]
    pending: list[int] = []
    taken = 0
    unk_mapped = 0
    with storage.open_file(unit["path"], "rb") as f:
        for pos, line in sources.iter_lines(f, unit["start"]):
            words = sources.line_words(line, unit["label"], pos)
            first = 0
            if skip:
                first = min(skip, len(words))
                skip -= first
            ids = [vocab.get(w, -1) for w in words[first:]]
            if -1 in ids:
                for k, value in enumerate(ids):
                    if value >= 0:
                        continue
                    if unk_id is None:
                        word = words[first + k]
                        raise SourceError(
                            unit["label"],
                            f"word {word!r} is not in the vocabulary built "
                            "from ptb.train.txt (map such words to a word of it with "
                            "convert(unk=...))",
                            offset=sources.word_offset(line, pos, first + k),
                        )
                    ids[k] = unk_id
                    unk_mapped += 1
            pending.extend(ids[: need - taken])
            taken += min(len(ids), need - taken)
            while len(pending) >= block * seq_len or (taken == need and pending):
                n = min(block, len(pending) // seq_len)
                rows = np.asarray(pending[: n * seq_len], dtype=np.int64).reshape(n, seq_len)
                del pending[: n * seq_len]
                yield rows, formats.make_id(unit["file_index"], np.arange(chunk, chunk + n))
                chunk += n
            if taken == need:
                break
    if taken < need:
        raise SourceError(
            unit["label"],
            f"file ended after {taken} of the {need} tokens of "
            "this shard: did it change during the conversion?",
        )
    if stats is not None:
        stats["unk_mapped"] = unk_mapped


def write_text_shard(
    unit: dict, *, out: str, fields, vocab, seq_len: int, unk_id: int | None, block: int
) -> dict:
    """Task: validates one text shard's chunks and writes its TFRecord and/or Parquet file."""
    import pyarrow as pa

    started = time.monotonic()
    records, stats = 0, {}
    with ShardOutput(out, unit, fields) as output:
        for rows, ids in token_blocks(unit, vocab.value, seq_len, unk_id, block, stats):
            if output.tfrecord:
                output.write_tfrecord(tfrecord.frame(tfrecord.token_examples(rows, ids)))
            if output.parquet:
                output.write_parquet(
                    [formats.encode_ndarray_column(rows), pa.array(ids, pa.int64())]
                )
            records += len(ids)
    output.log_written(records, "chunks", started)
    return {**output.result(records), "unk_mapped": stats.get("unk_mapped", 0)}
