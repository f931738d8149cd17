"""Spark conversion of raw CIFAR-10, MNIST and PTB into TFRecord and Parquet datasets.

The driver only plans (``sparktf.datasets.conversion_plan``): it lists the input files, reads
headers
and sizes, and hands out work units; executors do the reading, parsing, validating and
writing (``sparktf.datasets.tasks``), each task one unit. This module runs the passes:

1. unpack: one task per gzip file or ``.tar.gz`` archive: its raw files, unpacked and hashed
   into ``_staging/`` of the temporary output;
2. images: one task per shard: a contiguous range of records (segments of one or more
   files, read by byte range), validated and written, in the same pass over the input, as
   the shard's TFRecord part file and its Parquet file (whichever formats were asked for);
   text (PTB): one task per byte range (line aligned) counts tokens and, for train, words;
   the driver builds the vocabulary; then one task per shard writes its chunks the same way.
   The plain input files are hashed by tasks of the first of these Spark jobs, beside its
   other tasks; their digests are a result of that job like the others;
3. the driver writes each split's ``_common_metadata`` (sparktf's schema and the row groups
   per file, as the tasks reported them: no pass reads the files back; petastorm's Unischema
   too where petastorm is installed) and the manifest.

Everything is written below a temporary sibling of the output and published with a rename
(``storage.publish``); on any error the temporary is deleted and nothing is published.
See ``sparktf.datasets.formats`` for the layout and docs/datasets.md for the contract.
The Spark plumbing (tasks, progress, readable failures) is ``sparktf.spark``; the command
line of the conversion jobs is ``sparktf.jobs.convert``.
"""

from __future__ import annotations

import functools
import json
import logging
import re
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import numpy as np

from sparktf import remote, storage
from sparktf import spark as sparkutil
from sparktf.datasets import conversion_plan as plan
from sparktf.datasets import formats, sources, tasks
from sparktf.datasets.conversion_plan import (
    BLOCK_RECORDS,
    TEXT_RANGE_BYTES,
    HashPlan,
    OptionError,
    Options,
)
from sparktf.datasets.formats import FORMATS, PARQUET
from sparktf.datasets.sources import SourceError
from sparktf.errors import SparktfError

__all__ = ["ConversionError", "OptionError", "convert", "for_command_line", "run_tasks"]

log = logging.getLogger(__name__)


class ConversionError(SparktfError, RuntimeError):
    """A conversion that failed for a reason other than its input (the message says why)."""


_FLAGS = {"output_formats": "--format"}  # the parameters whose flag is not their own name


def for_command_line(text: str) -> str:
    """``text`` with each parameter of :func:`convert` it names (``convert(unk=...)``) replaced
    by its flag of the convert jobs (``--unk``): an error message as a command-line user reads
    it."""
    return re.sub(
        r"convert\((\w+)=\.\.\.\)",
        lambda m: _FLAGS.get(m.group(1), "--" + m.group(1).replace("_", "-")),
        text,
    )


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
    spec = plan.check_options(dataset, output_formats, options)
    if not overwrite and storage.exists(output):
        raise storage.PathExistsError(
            f"{output} already exists: refusing to replace it (replace it with "
            "convert(overwrite=...))"
        )
    containers = sources.discover(dataset, input_path)
    plan.precheck(dataset, containers)
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
    job = _Conversion(remote.classic_context(session, "converting a dataset"), spec, options)
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


def _session(spark, dataset):
    if spark is None:
        return sparkutil.get_session(f"sparktf-convert-{dataset}")
    return spark() if callable(spark) else spark


def run_tasks(sc, what: str, items: Sequence, fn: Callable) -> list:
    """``sparktf.spark.run_tasks`` for conversion tasks: a SourceError in any task is raised
    here (the first one in item order); other Spark failures are ConversionErrors."""
    return sparkutil.run_tasks(
        sc, what, items, fn, expected=(SourceError,), failure=ConversionError
    )


class _Conversion:
    """One conversion: runs the Spark passes that ``plan`` lays out, returns the manifest."""

    def __init__(self, sc, spec: formats.DatasetSpec, options: Options):
        self.sc, self.spec, self.options = sc, spec, options

    def run(self, containers: Sequence[sources.Container], input_path: str, tmp: str) -> dict:
        """Converts the input ``containers`` into ``tmp``; returns the manifest to write."""
        created_at = datetime.now(UTC)
        staging = storage.join(tmp, "_staging")
        unpack = functools.partial(tasks.prepare_container, dataset=self.spec.name, staging=staging)
        unpacked = run_tasks(self.sc, "unpack input", plan.packed_containers(containers), unpack)
        plain = plan.plain_files(containers)
        files = plan.input_files(self.spec.name, plain, [f for fs in unpacked for f in fs])
        hashing = plan.plan_hashing(plain, self.sc.defaultParallelism)
        if self.spec.kind == "image":
            digests, written = self._images(files, tmp, hashing)
        else:
            digests, written = self._text(files, tmp, hashing)
        entries, packed = plan.source_entries(files, digests)
        manifest = plan.manifest(
            self.spec,
            input_path,
            self.options.output_formats,
            created_at=created_at,
            sources=entries,
            containers=packed,
            **written,
        )
        if storage.exists(staging):
            storage.delete(staging)
        return manifest

    def _run_hashing(self, hashing: HashPlan, what: str, items: list, fn: Callable):
        """Runs ``fn`` on ``items`` and the hash tasks of ``hashing`` in one Spark job, so
        that hashing runs beside the pass; returns the digests by path (checked against the
        planned sizes) and the results of ``items`` in order."""
        hashes = list(hashing.tasks)
        results = run_tasks(
            self.sc, what, hashes + list(items), functools.partial(tasks.hash_or_run, fn)
        )
        return hashing.check(results[: len(hashes)]), results[len(hashes) :]

    def _write_splits(self, units: dict[str, list[dict]], fn, hashing: HashPlan | None = None):
        """One Spark job over the shards of every split (and the hash tasks of ``hashing``):
        validate and write every format. Returns the digests and each split's results."""
        what = " and ".join(self.options.output_formats) + " shards"
        flat = [u for split in units for u in units[split]]
        digests, results = self._run_hashing(hashing or HashPlan(), what, flat, fn)
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
        return digests, out

    def _split_entry(self, tmp: str, split: str, units, results, fields) -> dict:
        """The split's manifest entry; writes its ``_common_metadata`` when Parquet is asked."""
        entry = plan.split_entry(split, units, results, self.options.output_formats)
        if PARQUET in self.options.output_formats:
            plan.write_common_metadata(tmp, self.spec.name, split, units, results, fields)
        return entry

    def _images(self, files: list[dict], tmp: str, hashing: HashPlan) -> tuple[dict, dict]:
        """Writes the shards of every split; returns the digests of the plain input files and
        the manifest's schema and splits."""
        spec, options = self.spec, self.options
        shape, record_files = plan.image_inputs(spec, files)
        fields = formats.parquet_fields("image", image_shape=shape)
        units = {
            split: plan.image_units(split, split_files, files, options)
            for split, split_files in record_files.items()
        }
        fn = functools.partial(
            tasks.write_image_shard,
            dataset=spec.name,
            block=options.block_records,
            out=tmp,
            fields=fields,
            num_classes=spec.num_classes,
        )
        digests, results = self._write_splits(units, fn, hashing)
        splits = {}
        for split in spec.splits:
            entry = self._split_entry(tmp, split, units[split], results[split], fields)
            entry["label_counts"] = np.sum(
                [r["label_counts"] for r in results[split]], axis=0
            ).tolist()
            splits[split] = entry
        schema = plan.image_schema(shape, spec.num_classes)
        return digests, {"schema": schema, "splits": splits}

    def _text(self, files: list[dict], tmp: str, hashing: HashPlan) -> tuple[dict, dict]:
        """Counts the tokens, writes the vocabulary and the shards of every split; returns the
        digests of the plain input files and the manifest's schema, splits and text."""
        spec, options = self.spec, self.options
        by_split = {f["split"]: f for f in files}
        ranges = plan.text_ranges(files, options.range_bytes)
        digests, counted = self._run_hashing(hashing, "count tokens", ranges, tasks.count_range)
        pieces = plan.text_pieces(ranges, counted)
        train = by_split["train"]
        vocab = plan.vocabulary(train, pieces[train["file_index"]], options.unk)
        storage.write_text(storage.join(tmp, formats.VOCAB_FILE), "\n".join(vocab.words) + "\n")
        log.info("vocabulary: %d words from %s", len(vocab.words), train["label"])
        fields = formats.parquet_fields("text", seq_len=options.seq_len)
        units = {
            split: plan.text_units(
                split, by_split[split], pieces[by_split[split]["file_index"]], options
            )
            for split in spec.splits
        }
        broadcast = self.sc.broadcast(vocab.ids)
        try:
            fn = functools.partial(
                tasks.write_text_shard,
                vocab=broadcast,
                seq_len=options.seq_len,
                unk_id=vocab.unk_id,
                block=options.block_records,
                out=tmp,
                fields=fields,
            )
            _, results = self._write_splits(units, fn)
        finally:
            broadcast.destroy()
        splits = {}
        for split in spec.splits:
            entry = self._split_entry(tmp, split, units[split], results[split], fields)
            source = by_split[split]
            entry.update(
                tokens=source["tokens"],
                dropped_tokens=source["tokens"] - entry["records"] * options.seq_len,
                unk_mapped=sum(r["unk_mapped"] for r in results[split]),
            )
            splits[split] = entry
        schema = plan.text_schema(options.seq_len)
        return digests, {
            "schema": schema,
            "splits": splits,
            "text": plan.text_header(vocab, options),
        }
