"""The driver side of a conversion: what to read, how to partition it, and the manifest.

Nothing here starts Spark or reads more than file sizes and headers. Each function turns what
the driver knows (the input files, the options, the results the tasks returned) into the next
plan or record, as plain dicts that travel to the tasks of ``sparktf.datasets.tasks``:

- options: :class:`Options`, :func:`check_options`, :func:`precheck` (bad input fails before
  Spark starts), :func:`shard_count`;
- input files: :func:`input_files` (the raw files, numbered and assigned to splits) and
  :func:`plan_hashing` (the plain files hashed by tasks; :meth:`HashPlan.check` checks the
  digests those tasks return);
- images: :func:`image_inputs` and :func:`image_units` (record ranges of files per shard);
- text: :func:`text_ranges` (the counting pass), :func:`vocabulary`, :func:`text_units`
  (chunk ranges per shard, from the token counts);
- the manifest: :func:`split_entry`, :func:`source_entries`, :func:`manifest`, and
  :func:`write_common_metadata` (each split's Parquet ``_common_metadata``).
"""

from __future__ import annotations

import bisect
import logging
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from sparktf import paths, storage
from sparktf.datasets import formats, sources
from sparktf.datasets.formats import DATASETS, FORMATS, PARQUET, TFRECORD, DatasetSpec
from sparktf.datasets.sources import SourceError
from sparktf.datasets.tasks import HashTask
from sparktf.errors import SparktfError

__all__ = [
    "BLOCK_RECORDS",
    "SHARD_MULTIPLE",
    "SHARD_TARGET_BYTES",
    "TEXT_RANGE_BYTES",
    "HashPlan",
    "OptionError",
    "Options",
    "Vocabulary",
    "check_options",
    "image_inputs",
    "image_schema",
    "image_units",
    "input_files",
    "manifest",
    "mnist_headers",
    "packed_containers",
    "plain_files",
    "plan_hashing",
    "precheck",
    "shard_count",
    "source_entries",
    "split_entry",
    "text_header",
    "text_pieces",
    "text_ranges",
    "text_schema",
    "text_units",
    "vocabulary",
    "write_common_metadata",
]

log = logging.getLogger(__name__)

SHARD_TARGET_BYTES = 16 << 20  # --shards default: one shard per 16 MiB of raw input ...
SHARD_MULTIPLE = 4  # ... rounded up to a multiple of 4 (1, 2, 4 workers: even)
TEXT_RANGE_BYTES = 4 << 20  # PTB counting pass: bytes per task
BLOCK_RECORDS = 1024  # records parsed, encoded and written at once by a task

# The keys of an input file's dict that its entry in the manifest's "sources" keeps, in order.
SOURCE_KEYS = (
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


class OptionError(SparktfError, ValueError):
    """Conversion options that cannot work (a usage error)."""


@dataclass(frozen=True)
class Options:
    """How one conversion is done (checked options of ``sparktf.datasets.conversion.convert``)."""

    output_formats: tuple[str, ...]  # in FORMATS order
    shards: int | None = None  # per split; None: the size-based default
    seq_len: int = formats.DEFAULT_SEQ_LEN
    unk: str | None = None
    range_bytes: int = TEXT_RANGE_BYTES
    block_records: int = BLOCK_RECORDS


# ----------------------------------------------------------------------------- options


def check_options(dataset: str, requested_formats: Sequence[str], options: Options) -> DatasetSpec:
    """The dataset's spec, once ``dataset``, the formats asked for and ``options`` can work.

    Raises OptionError naming the option and what it accepts.
    """
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


def precheck(dataset: str, containers: Sequence[sources.Container]) -> None:
    """Checks that need no Spark (sizes, headers of plain files), so bad input fails fast.

    Raises SourceError naming the file and the byte offset.
    """
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
    ``cols``, ``labels_of`` on images files). Returns the image shape (H, W, 1), None
    without an images file. Raises SourceError naming the file and the byte offset."""
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


def shard_count(requested: int | None, raw_bytes: int, records: int) -> int:
    """Shards of a split: ``requested``, or the size-based default; at most ``records``."""
    if requested is None:
        n = max(1, math.ceil(raw_bytes / SHARD_TARGET_BYTES))
        n = SHARD_MULTIPLE * math.ceil(n / SHARD_MULTIPLE)
    else:
        n = requested
    return max(1, min(n, records))


def _shard_ranges(split: str, total: int, nbytes: int, options: Options) -> list[tuple[int, int]]:
    """``[start, stop)`` of each shard of a split of ``total`` records (or chunks)."""
    n = shard_count(options.shards, nbytes, total)
    if options.shards and n < options.shards:
        log.warning(
            "%s: %d shards requested but only %d records: writing %d shards",
            split,
            options.shards,
            total,
            n,
        )
    return [(total * s // n, total * (s + 1) // n) for s in range(n)]


def _shard_files(split: str, shard: int, options: Options) -> dict:
    """The part files a shard unit writes (None for a format not asked for)."""
    return {
        "file": (
            f"{split}/{TFRECORD}/{formats.TFRECORD_PART.format(shard)}"
            if TFRECORD in options.output_formats
            else None
        ),
        "parquet_file": (
            f"{split}/{PARQUET}/{formats.PARQUET_PART.format(shard)}"
            if PARQUET in options.output_formats
            else None
        ),
    }


# ----------------------------------------------------------------------------- input files


def packed_containers(containers: Sequence[sources.Container]) -> list[dict]:
    """The gzip files and archives to unpack, one ``prepare_container`` task each."""
    return [
        {"path": c.path, "kind": c.kind, "name": c.name} for c in containers if c.kind != "plain"
    ]


def plain_files(containers: Sequence[sources.Container]) -> list[dict]:
    """The plain input files, read where they are, with their sizes now."""
    return [
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


def input_files(dataset: str, plain: list[dict], unpacked: list[dict]) -> list[dict]:
    """Every raw file of the conversion (plain ones and those the unpack tasks returned),
    ordered by name, each with its ``file_index`` (the high part of its records' ids),
    ``split`` and ``role``."""
    files = sorted(unpacked + plain, key=lambda f: f["name"])
    for index, f in enumerate(files):
        f["file_index"] = index
        f["split"], f["role"] = sources.canonical_split(dataset, f["name"])
    return files


@dataclass(frozen=True)
class HashPlan:
    """The hash tasks of the plain input files, and each file's size when it was planned."""

    tasks: tuple[HashTask, ...] = ()
    sizes: Mapping[str, int] = field(default_factory=dict)

    def check(self, results: Iterable[dict[str, dict]]) -> dict[str, dict]:
        """``{path: {"size", "sha256"}}`` from the results of :attr:`tasks`.

        Raises SourceError for a file whose size changed since it was planned.
        """
        digests: dict[str, dict] = {}
        for result in results:
            for path, digest in result.items():
                if digest["size"] != self.sizes[path]:
                    raise SourceError(
                        path,
                        f"file changed during the conversion: "
                        f"{self.sizes[path]} bytes at the start, "
                        f"{digest['size']} when hashed",
                    )
            digests.update(result)
        return digests


def plan_hashing(plain: list[dict], parallelism: int) -> HashPlan:
    """Hash tasks for the ``plain`` files: as many as ``parallelism`` (the executor cores),
    not one per file, each given about the same bytes (largest files first)."""
    groups: list[list[str]] = [[] for _ in range(max(1, min(len(plain), parallelism)))]
    loads = [0] * len(groups)
    for f in sorted(plain, key=lambda f: -f["size"]):
        k = loads.index(min(loads))
        groups[k].append(f["path"])
        loads[k] += f["size"]
    return HashPlan(
        tasks=tuple(HashTask(tuple(g)) for g in groups if g),
        sizes={f["path"]: f["size"] for f in plain},
    )


# ----------------------------------------------------------------------------- images


def image_inputs(spec: DatasetSpec, files: list[dict]) -> tuple[tuple, dict[str, list[dict]]]:
    """The image shape and the files holding each split's records, in record order; sets
    ``records`` on the files. Raises SourceError for a bad size or header."""
    if spec.name == "cifar10":
        for f in files:
            f["records"] = sources.cifar_records(f["label"], f["size"])
        record_files = {s: [f for f in files if f["split"] == s] for s in spec.splits}
        return sources.CIFAR_IMAGE_SHAPE, record_files
    shape = mnist_headers(files)
    record_files = {
        s: [f for f in files if f["split"] == s and f["role"] == "images"] for s in spec.splits
    }
    return shape, record_files


def image_schema(shape: Sequence[int], num_classes: int) -> dict:
    """The manifest's ``schema`` of an image dataset."""
    return {
        "image": {"dtype": "uint8", "shape": list(shape), "order": "HWC"},
        "label": {"dtype": "int64", "num_classes": num_classes},
        "id": {"dtype": "int64"},
    }


def image_units(
    split: str, files: list[dict], all_files: list[dict], options: Options
) -> list[dict]:
    """The shard units of an image split: each a contiguous range of its records, as the
    segments of ``files`` that hold them (``all_files`` gives MNIST's labels files)."""
    total = sum(f["records"] for f in files)
    nbytes = sum(f["size"] for f in files)
    by_name = {f["name"]: f for f in all_files}
    starts = np.cumsum([0] + [f["records"] for f in files]).tolist()
    units = []
    for shard, (a, b) in enumerate(_shard_ranges(split, total, nbytes, options)):
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
                **_shard_files(split, shard, options),
                "segments": segments,
            }
        )
    return units


# ----------------------------------------------------------------------------- text


def text_ranges(files: list[dict], range_bytes: int) -> list[dict]:
    """The byte ranges of the counting pass, one ``count_range`` task each (words are
    counted in the train file only)."""
    return [
        {
            "file_index": f["file_index"],
            "path": f["path"],
            "label": f["label"],
            "start": start,
            "stop": min(start + range_bytes, f["size"]),
            "count_words": f["split"] == "train",
        }
        for f in files
        for start in range(0, f["size"], range_bytes)
    ]


def text_pieces(ranges: list[dict], counted: list[dict]) -> dict[int, list[tuple[dict, dict]]]:
    """``{file_index: [(range, its count), ...]}`` in file order."""
    pieces: dict[int, list[tuple[dict, dict]]] = {}
    for rng, result in zip(ranges, counted):
        pieces.setdefault(rng["file_index"], []).append((rng, result))
    return pieces


@dataclass(frozen=True)
class Vocabulary:
    """The words of the train file, most frequent first, and their ids."""

    words: list[str]
    ids: dict[str, int]
    unk_id: int | None  # the id that words missing from ``words`` map to, if any


def vocabulary(train: dict, pieces: list[tuple[dict, dict]], unk: str | None) -> Vocabulary:
    """The vocabulary from the word counts of the ``train`` file's ``pieces``.

    Raises SourceError when the train file holds no word, OptionError when ``unk`` is given
    but is not one of its words.
    """
    counts: Counter = Counter()
    for _, result in pieces:
        counts.update(result["counts"])
    if not counts:
        raise SourceError(train["label"], "empty input: no words", offset=0)
    words = sources.build_vocab(counts)
    ids = {w: i for i, w in enumerate(words)}
    unk_id = None
    if unk is not None:
        if unk not in ids:
            raise OptionError(
                f"convert(unk=...) {unk!r} is not a word of ptb.train.txt, so it is not in the "
                "vocabulary"
            )
        unk_id = ids[unk]
    return Vocabulary(words, ids, unk_id)


def text_header(vocab: Vocabulary, options: Options) -> dict:
    """The manifest's ``text`` entry."""
    return {
        "vocab_file": formats.VOCAB_FILE,
        "vocab_size": len(vocab.words),
        "seq_len": options.seq_len,
        "eos": formats.EOS,
        "unk": options.unk,
    }


def text_schema(seq_len: int) -> dict:
    """The manifest's ``schema`` of a text dataset."""
    return {"tokens": {"dtype": "int64", "shape": [seq_len]}, "id": {"dtype": "int64"}}


def text_units(
    split: str, f: dict, pieces: list[tuple[dict, dict]], options: Options
) -> list[dict]:
    """The shard units of a text split: each a range of its ``seq_len``-token chunks, found
    from the token counts of the file's ``pieces``; sets ``tokens`` and ``records`` (chunks)
    on the file ``f``. Raises SourceError when the file holds less than one chunk."""
    seq_len = options.seq_len
    tokens = sum(r["tokens"] for _, r in pieces)
    chunks = tokens // seq_len
    f.update(records=chunks, tokens=tokens)
    if chunks == 0:
        raise SourceError(
            f["label"],
            f"{tokens} tokens is fewer than the {seq_len} of one record "
            "(convert(seq_len=...)): empty input",
            offset=0,
        )
    starts = [r["start"] for _, r in pieces]
    prefix = np.cumsum([0] + [r["tokens"] for _, r in pieces]).tolist()
    units = []
    for shard, (c0, c1) in enumerate(_shard_ranges(split, chunks, f["size"], options)):
        t0 = c0 * seq_len
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
                **_shard_files(split, shard, options),
            }
        )
    return units


# ----------------------------------------------------------------------------- the manifest


def split_entry(
    split: str, units: list[dict], results: list[dict], output_formats: Sequence[str]
) -> dict:
    """A split's entry in the manifest: its records and, per format, its files, their records
    and bytes, as the shard tasks reported them."""
    entry: dict = {"records": sum(r["records"] for r in results), "shards": len(units)}
    if TFRECORD in output_formats:
        entry[TFRECORD] = {
            "files": [u["file"] for u in units],
            "records": [r["records"] for r in results],
            "bytes": [r["bytes"] for r in results],
        }
    if PARQUET in output_formats:
        entry[PARQUET] = {
            "dir": f"{split}/{PARQUET}",
            "files": [u["parquet_file"] for u in units],
            "records": [r["records"] for r in results],
            "bytes": [r["parquet_bytes"] for r in results],
        }
    return entry


def write_common_metadata(
    out: str, dataset: str, split: str, units: list[dict], results: list[dict], fields
) -> None:
    """The ``_common_metadata`` of a split's Parquet files below ``out``: sparktf's schema and
    the row groups per file, as the tasks reported them, plus petastorm's Unischema where
    petastorm is installed."""
    from sparktf.datasets import petastorm_io

    path = storage.join(out, split, PARQUET)
    row_groups = {
        u["parquet_file"].rsplit("/", 1)[-1]: r["row_groups"] for u, r in zip(units, results)
    }
    extra = None
    if petastorm_io.available():
        extra = petastorm_io.unischema_metadata(f"sparktf_{dataset}", fields)
    formats.write_common_metadata(path, fields, row_groups, extra)


def source_entries(files: list[dict], digests: Mapping[str, dict]) -> tuple[list, list]:
    """The manifest's ``sources`` (one entry per raw file, hashed by the unpack tasks or as
    ``digests`` give it) and ``containers`` (the gzip files and archives they came from)."""
    entries, containers = [], {}
    for f in files:
        known = f if "sha256" in f else {**f, **digests[f["path"]]}
        entries.append({k: known[k] for k in SOURCE_KEYS if k in known})
        if "container" in f:
            containers[f["origin"]] = {"path": f["origin"], **f["container"]}
    return entries, list(containers.values())


def manifest(
    spec: DatasetSpec,
    input_path: str,
    output_formats: Sequence[str],
    *,
    created_at: datetime,
    sources: list[dict],
    containers: list[dict],
    schema: dict,
    splits: dict,
    text: dict | None = None,
) -> dict:
    """The manifest of a conversion (see ``sparktf.datasets.formats``), keys in their order;
    ``created_at`` is an aware datetime."""
    out = {
        "format_version": formats.FORMAT_VERSION,
        "dataset": spec.name,
        "kind": spec.kind,
        "created_at": created_at.isoformat(timespec="seconds"),
        "created_by": f"sparktf {paths.installed_version() or 'dev'}",
        "input": input_path,
        "formats": list(output_formats),
        "id_scheme": formats.ID_SCHEME,
        "sources": sources,
        "containers": containers,
        "schema": schema,
        "splits": splits,
    }
    if text is not None:
        out["text"] = text
    return out
