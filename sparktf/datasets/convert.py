"""Spark conversion of raw CIFAR-10, MNIST and PTB into TFRecord and Parquet datasets.

The driver only plans: it lists the input files, reads headers and sizes, and hands out work
units; executors do the reading, parsing, validating and writing, each task one unit:

1. prepare: one task per input container: hash a plain file, or gunzip a ``.gz`` file, or
   unpack the members of a ``.tar.gz``, into ``_staging/`` of the temporary output;
2. images: one task per shard: a contiguous range of records (segments of one or more
   files, read by byte range), validated and written, in the same pass over the input, as
   the shard's TFRecord part file and its Parquet file (whichever formats were asked for);
   text (PTB): one task per byte range (line aligned) counts tokens and, for train, words;
   the driver builds the vocabulary; then one task per shard writes its chunks the same way;
3. the driver writes each split's ``_common_metadata`` (sparktf's schema and the row groups
   per file, as the tasks reported them: no pass reads the files back; petastorm's Unischema
   too where petastorm is installed).

Everything is written below a temporary sibling of the output and published with a rename
(``storage.publish``); on any error the temporary is deleted and nothing is published.
See ``sparktf.datasets.formats`` for the layout and docs/datasets.md for the contract.
The Spark plumbing (tasks, progress, readable failures) is ``sparktf.spark``; the command
line of the conversion jobs is ``sparktf.jobs.convert``.
"""

from __future__ import annotations

import bisect
import functools
import json
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import numpy as np

from sparktf import spark as sparkutil
from sparktf import storage
from sparktf.datasets import formats, sources, tfrecord
from sparktf.datasets.formats import DATASETS, FORMATS, PARQUET, TFRECORD
from sparktf.datasets.sources import SourceError
from sparktf.errors import SparktfError

log = logging.getLogger(__name__)

SHARD_TARGET_BYTES = 16 << 20  # --shards default: one shard per 16 MiB of raw input ...
SHARD_MULTIPLE = 4  # ... rounded up to a multiple of 4 (1, 2, 4 workers: even)
ROW_GROUP_MB = 256  # Parquet row group size: one row group per file below this
TEXT_RANGE_BYTES = 4 << 20  # PTB counting pass: bytes per task
BLOCK_RECORDS = 1024  # records parsed, encoded and written at once by a task


class ConversionError(SparktfError, RuntimeError):
    """A conversion that failed for a reason other than its input (the message says why)."""


class OptionError(SparktfError, ValueError):
    """Conversion options that cannot work (a usage error)."""


@dataclass(frozen=True)
class Options:
    """How one conversion is done (checked options of :func:`convert`)."""

    output_formats: tuple[str, ...]  # in FORMATS order
    shards: int | None = None  # per split; None: the size-based default
    seq_len: int = formats.DEFAULT_SEQ_LEN
    unk: str | None = None
    range_bytes: int = TEXT_RANGE_BYTES
    block_records: int = BLOCK_RECORDS


def convert(
    dataset: str,
    input_path: str,
    output: str,
    *,
    output_formats: Sequence[str] = FORMATS,
    shards: int | None = None,
    overwrite: bool = False,
    seq_len: int = formats.DEFAULT_SEQ_LEN,
    unk: str | None = None,
    spark: Any = None,
    range_bytes: int = TEXT_RANGE_BYTES,
    block_records: int = BLOCK_RECORDS,
) -> dict:
    """Converts the raw ``dataset`` ("cifar10", "mnist", "ptb") at ``input_path`` to ``output``.

    ``output_formats``: any of "tfrecord", "parquet". ``shards``: part files (and Parquet files)
    per split; default one per 16 MiB of input rounded up to a multiple of 4, never more
    than the split's records. ``seq_len`` and ``unk``: PTB only (tokens per record; the word
    that stands for words of valid/test missing from the vocabulary, else they are errors).
    ``spark``: a SparkSession, a function returning one (called only once the input has been
    found), or None for ``sparktf.spark.get_session``.

    Returns the manifest written. Raises SourceError for bad input (naming the file and the
    byte offset or record), PathExistsError if ``output`` exists and not ``overwrite``,
    OptionError for bad options, ConversionError when Spark fails otherwise; nothing is
    published then.
    """
    options = Options(
        output_formats=tuple(f for f in FORMATS if f in output_formats),
        shards=shards,
        seq_len=seq_len,
        unk=unk,
        range_bytes=range_bytes,
        block_records=block_records,
    )
    spec = _check_options(dataset, output_formats, options)
    if not overwrite and storage.exists(output):
        raise storage.PathExistsError(
            f"{output} already exists: refusing to replace it (pass --overwrite to replace it)"
        )
    containers = sources.discover(dataset, input_path)
    _precheck(dataset, containers)
    log.info(
        "converting %s from %s (%d input files) to %s as %s",
        dataset,
        input_path,
        len(containers),
        output,
        " and ".join(options.output_formats),
    )
    session = _session(spark, dataset)
    started = time.monotonic()
    job = _Job(session, spec, options)
    with storage.publish(output, overwrite=overwrite) as tmp:
        storage.makedirs(tmp)
        manifest = job.run(containers, input_path, tmp)
        storage.write_text(
            storage.join(tmp, formats.MANIFEST_FILE), json.dumps(manifest, indent=2) + "\n"
        )
    log.info(
        "converted %s in %.1f s: %s",
        dataset,
        time.monotonic() - started,
        ", ".join(f"{s} {v['records']} records" for s, v in manifest["splits"].items()),
    )
    return manifest


def _precheck(dataset: str, containers) -> None:
    """Checks that need no Spark (sizes, headers of plain files): bad input fails fast."""
    plain = [
        {"name": c.name, "path": c.path, "label": c.path, "size": storage.size(c.path)}
        for c in containers
        if c.kind == "plain"
    ]
    if dataset == "cifar10":
        for f in plain:
            sources.cifar_records(f["label"], f["size"])
    elif dataset == "mnist":
        mnist_headers(plain)


def mnist_headers(files: list[dict]) -> tuple[int, int, int] | None:
    """Checks the IDX headers of the MNIST files given (dicts with name, path, label, size)
    and that each images file matches its labels file; sets ``records`` (and ``rows``,
    ``cols``, ``labels_of`` on images files). Returns the image shape (H, W, 1)."""
    by_name = {f["name"]: f for f in files}
    shape = None
    for prefix in ("train", "t10k"):
        images = by_name.get(f"{prefix}-images-idx3-ubyte")
        labels = by_name.get(f"{prefix}-labels-idx1-ubyte")
        hi = hl = None
        if images is not None:
            hi = sources.read_idx_header(
                images["path"], "images", images["size"], label=images["label"]
            )
            if shape is not None and shape != (hi.rows, hi.cols, 1):
                raise SourceError(
                    images["label"],
                    f"bad IDX dimensions {hi.rows}x{hi.cols}: "
                    f"the train images are {shape[0]}x{shape[1]}",
                    offset=8,
                )
            shape = (hi.rows, hi.cols, 1)
            images.update(
                records=hi.count,
                rows=hi.rows,
                cols=hi.cols,
                labels_of=f"{prefix}-labels-idx1-ubyte",
            )
        if labels is not None:
            hl = sources.read_idx_header(
                labels["path"], "labels", labels["size"], label=labels["label"]
            )
            labels.update(records=hl.count)
        if hi is not None and hl is not None and hi.count != hl.count:
            raise SourceError(
                labels["label"],
                f"label count {hl.count} does not match the "
                f"image count {hi.count} of {images['label']}",
                offset=4,
            )
    return shape


def _check_options(dataset: str, requested_formats: Sequence[str], options: Options):
    """The dataset's spec, once ``dataset``, the formats asked for and ``options`` can work."""
    if dataset not in DATASETS:
        raise OptionError(f"unknown dataset {dataset!r}: expected one of {', '.join(DATASETS)}")
    unknown = sorted(set(requested_formats) - set(FORMATS))
    if unknown or not requested_formats:
        raise OptionError(
            f"unknown or no output formats {unknown or list(requested_formats)}: "
            f"choose from {', '.join(FORMATS)}"
        )
    if options.shards is not None and options.shards < 1:
        raise OptionError(f"shards must be at least 1, got {options.shards}")
    if options.seq_len < 2:
        raise OptionError(
            f"seq_len must be at least 2 (inputs and shifted targets), got {options.seq_len}"
        )
    unk = options.unk
    if unk is not None and (not unk or unk.split() != [unk]):
        raise OptionError(f"unk must be one word without spaces, got {unk!r}")
    if options.range_bytes < 1 or options.block_records < 1:
        raise OptionError("range_bytes and block_records must be positive")
    return DATASETS[dataset]


def _session(spark, dataset):
    if spark is None:
        return sparkutil.get_session(f"sparktf-convert-{dataset}")
    return spark() if callable(spark) else spark


def shard_count(requested: int | None, raw_bytes: int, records: int) -> int:
    """Shards of a split: ``requested``, or the size-based default; at most ``records``."""
    if requested is None:
        n = max(1, math.ceil(raw_bytes / SHARD_TARGET_BYTES))
        n = SHARD_MULTIPLE * math.ceil(n / SHARD_MULTIPLE)
    else:
        n = requested
    return max(1, min(n, records))


def _version() -> str:
    try:
        from importlib.metadata import version

        return version("sparktf")
    except Exception:  # not installed: running from a checkout
        return "dev"


# ----------------------------------------------------------------------------- running tasks


def run_tasks(sc, what: str, items: Sequence, fn: Callable) -> list:
    """``sparktf.spark.run_tasks`` for conversion tasks: a SourceError in any task is raised
    here (the first one in item order); other Spark failures are ConversionErrors."""
    return sparkutil.run_tasks(
        sc, what, items, fn, expected=(SourceError,), failure=ConversionError
    )


# ----------------------------------------------------------------------------- prepare


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


def _digest_or_run(fn: Callable, item):
    """Task: ``{"digest": [paths]}`` hashes those files; any other item goes to ``fn``."""
    if isinstance(item, dict) and "digest" in item:
        return {path: sources.file_digest(path) for path in item["digest"]}
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
            # snappy gains ~5% on pixels (uint8) for 3x the write time: those stay plain.
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
    log.info(
        "%s shard %d: %d records, %d TFRecord bytes, %d Parquet bytes in %.1f s",
        unit["split"],
        unit["shard"],
        records,
        output.bytes,
        output.parquet_bytes,
        time.monotonic() - started,
    )
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
                            "from ptb.train.txt (pass --unk WORD to map such words to WORD)",
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
    log.info(
        "%s shard %d: %d chunks, %d TFRecord bytes, %d Parquet bytes in %.1f s",
        unit["split"],
        unit["shard"],
        records,
        output.bytes,
        output.parquet_bytes,
        time.monotonic() - started,
    )
    return {**output.result(records), "unk_mapped": stats.get("unk_mapped", 0)}


# ----------------------------------------------------------------------------- the job


class _Job:
    """One conversion: plans on the driver, runs the Spark passes, returns the manifest."""

    def __init__(self, spark, spec, options: Options):
        self.spark, self.sc = spark, spark.sparkContext
        self.spec, self.options = spec, options
        self.formats, self.shards = options.output_formats, options.shards
        self.seq_len, self.unk = options.seq_len, options.unk
        self.range_bytes, self.block = options.range_bytes, options.block_records

    # -- common ---------------------------------------------------------------------------

    def run(self, containers, input_path: str, tmp: str) -> dict:
        staging = storage.join(tmp, "_staging")
        raw = self._prepare(containers, staging)
        manifest = {
            "format_version": formats.FORMAT_VERSION,
            "dataset": self.spec.name,
            "kind": self.spec.kind,
            "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "created_by": f"sparktf {_version()}",
            "input": input_path,
            "formats": list(self.formats),
            "id_scheme": formats.ID_SCHEME,
            "sources": [],
            "containers": [],
            "schema": {},
            "splits": {},
        }
        if self.spec.kind == "image":
            self._images(raw, manifest, tmp)
        else:
            self._text(raw, manifest, tmp)
        if self._digest_groups:  # no pass ran (cannot happen: every conversion has one)
            self._run("hash input", [], abs)
        containers_seen = {}
        for f in raw:
            if "sha256" not in f:
                f.update(self._digests[f["path"]])
            entry = {
                k: f[k]
                for k in (
                    "file_index",
                    "name",
                    "split",
                    "role",
                    "size",
                    "sha256",
                    "origin",
                    "member",
                    "records",
                    "tokens",
                )
                if k in f
            }
            manifest["sources"].append(entry)
            if "container" in f:
                containers_seen[f["origin"]] = {"path": f["origin"], **f["container"]}
        manifest["containers"] = list(containers_seen.values())
        if storage.exists(staging):
            storage.delete(staging)
        return manifest

    def _prepare(self, containers, staging: str) -> list[dict]:
        """The raw files: plain ones as they are (hashed later, alongside the first pass),
        gzip files and archives unpacked into ``staging`` by one task each."""
        packed = [
            {"path": c.path, "kind": c.kind, "name": c.name}
            for c in containers
            if c.kind != "plain"
        ]
        fn = functools.partial(prepare_container, dataset=self.spec.name, staging=staging)
        raw = [f for files in run_tasks(self.sc, "unpack input", packed, fn) for f in files]
        plain = [
            {
                "name": c.name,
                "path": c.path,
                "label": c.path,
                "origin": c.path,
                "size": storage.size(c.path),
            }
            for c in containers
            if c.kind == "plain"
        ]
        raw = sorted(raw + plain, key=lambda f: f["name"])
        for index, f in enumerate(raw):
            f["file_index"] = index
            f["split"], f["role"] = sources.canonical_split(self.spec.name, f["name"])
        # Hash plain files in as many tasks as there are executor cores, not one per file.
        groups = max(1, min(len(plain), self.sc.defaultParallelism))
        self._digest_groups = [[] for _ in range(groups)]
        loads = [0] * groups
        for f in sorted(plain, key=lambda f: -f["size"]):
            k = loads.index(min(loads))
            self._digest_groups[k].append(f["path"])
            loads[k] += f["size"]
        self._digest_groups = [g for g in self._digest_groups if g]
        self._digests: dict[str, dict] = {}
        self._planned_sizes = {f["path"]: f["size"] for f in plain}
        return raw

    def _run(self, what: str, items: list, fn: Callable) -> list:
        """``run_tasks``, with the pending hashing of plain input files riding along."""
        extra = [{"digest": group} for group in self._digest_groups]
        self._digest_groups = []
        results = run_tasks(
            self.sc, what, extra + list(items), functools.partial(_digest_or_run, fn)
        )
        for digests in results[: len(extra)]:
            for path, digest in digests.items():
                if digest["size"] != self._planned_sizes[path]:
                    raise SourceError(
                        path,
                        f"file changed during the conversion: "
                        f"{self._planned_sizes[path]} bytes at the start, "
                        f"{digest['size']} when hashed",
                    )
            self._digests.update(digests)
        return results[len(extra) :]

    def _shard_units(self, split: str, total: int, nbytes: int) -> list[tuple[int, int]]:
        n = shard_count(self.shards, nbytes, total)
        if self.shards and n < self.shards:
            log.warning(
                "%s: %d shards requested but only %d records: writing %d shards",
                split,
                self.shards,
                total,
                n,
            )
        return [(total * s // n, total * (s + 1) // n) for s in range(n)]

    def _shard_files(self, split: str, shard: int) -> dict:
        """The part files a shard unit writes (None for a format not asked for)."""
        return {
            "file": (
                f"{split}/{TFRECORD}/{formats.TFRECORD_PART.format(shard)}"
                if TFRECORD in self.formats
                else None
            ),
            "parquet_file": (
                f"{split}/{PARQUET}/{formats.PARQUET_PART.format(shard)}"
                if PARQUET in self.formats
                else None
            ),
        }

    def _write_common_metadata(self, tmp: str, split: str, units, results, fields) -> None:
        """The split's ``_common_metadata``: sparktf's schema and the row groups per file, as
        the tasks reported them, plus petastorm's Unischema where petastorm is installed."""
        from sparktf.datasets import petastorm_io

        path = storage.join(tmp, split, PARQUET)
        row_groups = {
            u["parquet_file"].rsplit("/", 1)[-1]: r["row_groups"] for u, r in zip(units, results)
        }
        extra = None
        if petastorm_io.available():
            extra = petastorm_io.unischema_metadata(f"sparktf_{self.spec.name}", fields)
        formats.write_common_metadata(path, fields, row_groups, extra)

    def _split_entry(self, tmp, split, units, results, fields) -> dict:
        entry: dict = {"records": sum(r["records"] for r in results), "shards": len(units)}
        if TFRECORD in self.formats:
            entry[TFRECORD] = {
                "files": [u["file"] for u in units],
                "records": [r["records"] for r in results],
                "bytes": [r["bytes"] for r in results],
            }
        if PARQUET in self.formats:
            self._write_common_metadata(tmp, split, units, results, fields)
            entry[PARQUET] = {
                "dir": f"{split}/{PARQUET}",
                "files": [u["parquet_file"] for u in units],
                "records": [r["records"] for r in results],
                "bytes": [r["parquet_bytes"] for r in results],
            }
        return entry

    # -- images ---------------------------------------------------------------------------

    def _images(self, raw: list[dict], manifest: dict, tmp: str) -> None:
        dataset = self.spec.name
        if dataset == "cifar10":
            for f in raw:
                f["records"] = sources.cifar_records(f["label"], f["size"])
            shape = sources.CIFAR_IMAGE_SHAPE
            record_files = {s: [f for f in raw if f["split"] == s] for s in self.spec.splits}
        else:
            shape = mnist_headers(raw)
            record_files = {
                s: [f for f in raw if f["split"] == s and f["role"] == "images"]
                for s in self.spec.splits
            }
        manifest["schema"] = {
            "image": {"dtype": "uint8", "shape": list(shape), "order": "HWC"},
            "label": {"dtype": "int64", "num_classes": self.spec.num_classes},
            "id": {"dtype": "int64"},
        }
        fields = formats.parquet_fields("image", image_shape=shape)
        units = {
            split: self._image_units(split, files, raw) for split, files in record_files.items()
        }
        fn = functools.partial(
            write_image_shard,
            dataset=dataset,
            block=self.block,
            out=tmp,
            fields=fields,
            num_classes=self.spec.num_classes,
        )
        results = self._run_splits(units, fn)
        for split in self.spec.splits:
            entry = self._split_entry(tmp, split, units[split], results[split], fields)
            entry["label_counts"] = np.sum(
                [r["label_counts"] for r in results[split]], axis=0
            ).tolist()
            manifest["splits"][split] = entry

    def _run_splits(self, units: dict[str, list[dict]], fn) -> dict[str, list[dict]]:
        """One Spark job over the shards of every split: validate and write every format."""
        what = " and ".join(self.formats) + " shards"
        flat = [u for split in units for u in units[split]]
        results = self._run(what, flat, fn)
        out: dict[str, list[dict]] = {split: [] for split in units}
        for unit, result in zip(flat, results):
            out[unit["split"]].append(result)
        for split in units:
            log.info(
                "%s: %d records in %d shards",
                split,
                sum(r["records"] for r in out[split]),
                len(out[split]),
            )
        return out

    def _image_units(self, split: str, files: list[dict], raw: list[dict]) -> list[dict]:
        total = sum(f["records"] for f in files)
        nbytes = sum(f["size"] for f in files)
        by_name = {f["name"]: f for f in raw}
        starts = np.cumsum([0] + [f["records"] for f in files]).tolist()
        units = []
        for shard, (a, b) in enumerate(self._shard_units(split, total, nbytes)):
            segments = []
            for f, f0, f1 in zip(files, starts, starts[1:]):
                lo, hi = max(a, f0), min(b, f1)
                if lo >= hi:
                    continue
                seg = {
                    "file_index": f["file_index"],
                    "path": f["path"],
                    "label": f["label"],
                    "start": lo - f0,
                    "stop": hi - f0,
                }
                if "labels_of" in f:
                    labels = by_name[f["labels_of"]]
                    seg.update(
                        labels_path=labels["path"],
                        labels_label=labels["label"],
                        rows=f["rows"],
                        cols=f["cols"],
                    )
                segments.append(seg)
            units.append(
                {
                    "split": split,
                    "shard": shard,
                    "records": b - a,
                    **self._shard_files(split, shard),
                    "segments": segments,
                }
            )
        return units

    # -- text -----------------------------------------------------------------------------

    def _text(self, raw: list[dict], manifest: dict, tmp: str) -> None:
        by_split = {f["split"]: f for f in raw}
        ranges = []
        for f in raw:
            for start in range(0, f["size"], self.range_bytes):
                ranges.append(
                    {
                        "file_index": f["file_index"],
                        "path": f["path"],
                        "label": f["label"],
                        "start": start,
                        "stop": min(start + self.range_bytes, f["size"]),
                        "count_words": f["split"] == "train",
                    }
                )
        counted = self._run("count tokens", ranges, count_range)
        per_file: dict[int, list[tuple[dict, dict]]] = {}
        for rng, result in zip(ranges, counted):
            per_file.setdefault(rng["file_index"], []).append((rng, result))

        counts: Counter = Counter()
        for _, result in per_file[by_split["train"]["file_index"]]:
            counts.update(result["counts"])
        if not counts:
            raise SourceError(by_split["train"]["label"], "empty input: no words", offset=0)
        vocab = sources.build_vocab(counts)
        word_to_id = {w: i for i, w in enumerate(vocab)}
        unk_id = None
        if self.unk is not None:
            if self.unk not in word_to_id:
                raise OptionError(
                    f"--unk {self.unk!r} is not a word of ptb.train.txt, so it is "
                    "not in the vocabulary"
                )
            unk_id = word_to_id[self.unk]
        storage.write_text(storage.join(tmp, formats.VOCAB_FILE), "\n".join(vocab) + "\n")
        log.info("vocabulary: %d words from %s", len(vocab), by_split["train"]["label"])
        manifest["text"] = {
            "vocab_file": formats.VOCAB_FILE,
            "vocab_size": len(vocab),
            "seq_len": self.seq_len,
            "eos": formats.EOS,
            "unk": self.unk,
        }
        manifest["schema"] = {
            "tokens": {"dtype": "int64", "shape": [self.seq_len]},
            "id": {"dtype": "int64"},
        }
        fields = formats.parquet_fields("text", seq_len=self.seq_len)
        broadcast = self.sc.broadcast(word_to_id)
        try:
            units = {}
            for split in self.spec.splits:
                f = by_split[split]
                pieces = per_file[f["file_index"]]
                tokens = sum(r["tokens"] for _, r in pieces)
                chunks = tokens // self.seq_len
                f.update(records=chunks, tokens=tokens)
                if chunks == 0:
                    raise SourceError(
                        f["label"],
                        f"{tokens} tokens is fewer than the "
                        f"{self.seq_len} of one record (--seq-len): "
                        "empty input",
                        offset=0,
                    )
                units[split] = self._text_units(split, f, pieces, chunks)
            fn = functools.partial(
                write_text_shard,
                vocab=broadcast,
                seq_len=self.seq_len,
                unk_id=unk_id,
                block=self.block,
                out=tmp,
                fields=fields,
            )
            results = self._run_splits(units, fn)
            for split in self.spec.splits:
                entry = self._split_entry(tmp, split, units[split], results[split], fields)
                source = by_split[split]
                entry.update(
                    tokens=source["tokens"],
                    dropped_tokens=source["tokens"] - entry["records"] * self.seq_len,
                    unk_mapped=sum(r["unk_mapped"] for r in results[split]),
                )
                manifest["splits"][split] = entry
        finally:
            broadcast.destroy()

    def _text_units(self, split: str, f: dict, pieces, chunks: int) -> list[dict]:
        starts = [r["start"] for _, r in pieces]
        prefix = np.cumsum([0] + [r["tokens"] for _, r in pieces]).tolist()
        units = []
        for shard, (c0, c1) in enumerate(self._shard_units(split, chunks, f["size"])):
            t0 = c0 * self.seq_len
            r = bisect.bisect_right(prefix, t0) - 1
            r = min(r, len(pieces) - 1)
            units.append(
                {
                    "split": split,
                    "shard": shard,
                    "records": c1 - c0,
                    "file_index": f["file_index"],
                    "path": f["path"],
                    "label": f["label"],
                    "start": starts[r],
                    "skip": t0 - prefix[r],
                    "chunk0": c0,
                    "chunks": c1 - c0,
                    **self._shard_files(split, shard),
                }
            )
        return units
