"""Everything sparktf does with petastorm, in one place (petastorm 0.13.1 is unmaintained).

petastorm is the ``petastorm`` extra of the second stack (Spark 4.0, pyarrow 14, numpy 1.26:
its import fails from pyarrow 16 on); nothing else in sparktf needs it. sparktf's datasets
carry their own schema (JSON, ``sparktf.datasets.formats``); where petastorm is installed, a
conversion adds petastorm's Unischema to ``_common_metadata`` (``unischema_metadata``), and
``add_unischema`` adds it to a dataset written without petastorm, so that ``make_reader``
opens it. ``make_batch_reader`` reads any sparktf Parquet split as it is (the row groups per
file are always written under petastorm's key).

petastorm opens ``hdfs://`` through libhdfs (JNI), which sparktf does not have, and ``s3://``
through s3fs, which the stack does not have. Its readers and ``materialize_dataset`` accept a
legacy ``pyarrow.filesystem`` object instead; here that is the fsspec file system of
``sparktf.storage`` (WebHDFS for ``hdfs://``, pyarrow's S3 for ``s3://``, the local one else)
wrapped as ``pyarrow.filesystem.DaskFileSystem`` with the few methods pyarrow 14's legacy
Parquet code calls (``isdir``, ``isfile``, ``walk``, ``_isfilestore``).

Data contract of the Parquet files: an ndarray column (NdarrayCodec) holds the bytes that
``numpy.save`` writes for the value, so Spark SQL sees a ``binary`` column; scalars are
``bigint``.
"""

from __future__ import annotations

import functools
import json
import logging
import warnings
from collections.abc import Sequence

import numpy as np

from sparktf import storage
from sparktf.datasets import formats
from sparktf.datasets.formats import Field

_log = logging.getLogger(__name__)

__all__ = [
    "CompleteReader",
    "add_unischema",
    "available",
    "legacy_filesystem",
    "make_batch_reader",
    "make_reader",
    "unischema",
    "unischema_metadata",
]


@functools.cache
def _wrapper_class():
    import pyarrow.filesystem

    class FsspecLegacyFileSystem(pyarrow.filesystem.DaskFileSystem):
        """An fsspec file system (WebHDFS or local) as a legacy pyarrow file system."""

        def isdir(self, path):
            return self.fs.isdir(path)

        def isfile(self, path):
            return self.fs.isfile(path)

        def walk(self, path):
            return self.fs.walk(path)

        def _isfilestore(self):
            return True

        def __reduce__(self):
            return legacy_filesystem, (self._sparktf_path,)

    return FsspecLegacyFileSystem


def legacy_filesystem(path: str):
    """A legacy pyarrow file system for ``path``'s file system (for petastorm)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        fs = _wrapper_class()(storage.fsspec_filesystem(path))
    fs._sparktf_path = path
    return fs


def unischema(name: str, fields: Sequence[Field]):
    """A petastorm Unischema: NdarrayCodec for ndarray fields, int64 scalars else."""
    from petastorm.codecs import NdarrayCodec, ScalarCodec
    from petastorm.unischema import Unischema, UnischemaField
    from pyspark.sql.types import LongType

    out = []
    for f in fields:
        dtype = np.dtype(f.dtype).type
        if f.shape is not None:
            out.append(UnischemaField(f.name, dtype, tuple(f.shape), NdarrayCodec(), False))
        else:
            out.append(UnischemaField(f.name, dtype, (), ScalarCodec(LongType()), False))
    return Unischema(name, out)


def available() -> bool:
    """Whether petastorm imports here (the second stack). A broken install counts as absent
    (petastorm imports pyarrow modules that newer pyarrow lacks, and may fail otherwise)."""
    try:
        import petastorm  # noqa: F401
    except Exception:
        return False
    return True


def unischema_metadata(name: str, fields: Sequence[Field]) -> dict:
    """What petastorm's ``materialize_dataset`` adds to ``_common_metadata`` besides the row
    groups (which ``formats.write_common_metadata`` always writes): the pickled Unischema of
    ``fields`` named ``name``. Only petastorm's readers unpickle it; sparktf reads its own JSON
    schema."""
    import pickle

    from petastorm.etl.dataset_metadata import UNISCHEMA_KEY

    return {UNISCHEMA_KEY: pickle.dumps(unischema(name, fields))}


def add_unischema(path: str, name: str | None = None) -> None:
    """Adds petastorm's Unischema to the Parquet split ``path`` (a dataset's
    ``<split>/parquet``) written where petastorm was not installed, from the sparktf schema and
    row groups of its ``_common_metadata``; ``name`` defaults to ``sparktf_<dataset>``.
    Rewrites that one small file; a split that has a Unischema already is left as it is."""
    from petastorm.etl.dataset_metadata import UNISCHEMA_KEY

    metadata = formats.read_common_metadata(path)
    where = storage.join(path, formats.COMMON_METADATA)
    if UNISCHEMA_KEY in metadata:
        return
    fields = formats.schema_fields(metadata, where)
    if fields is None or formats.ROW_GROUPS_KEY not in metadata:
        raise formats.ParquetSchemaError(
            f"{where}: no sparktf schema and row groups to build a Unischema from "
            "(is this the parquet directory of a split sparktf converted?)"
        )
    row_groups = json.loads(metadata[formats.ROW_GROUPS_KEY])
    if name is None:
        manifest = formats.load_manifest(path.rstrip("/").rsplit("/", 2)[0])
        name = f"sparktf_{manifest['dataset']}"
    formats.write_common_metadata(path, fields, row_groups, unischema_metadata(name, fields))


def _url(path: str) -> str:
    """What petastorm is given as the URL of ``path`` (it reads through the file system it is
    given). An object on S3 goes as ``file:///bucket/key``: petastorm finds the path of any
    other scheme through fsspec's class for it, which for ``s3`` is s3fs, not installed here
    (docs/versions.md), and sparktf's S3 file system takes ``/bucket/key``."""
    loc = storage.parse(path)
    if loc.scheme == "s3":
        return f"file:///{loc.netloc}{loc.path}"
    return storage.spark_uri(path)


def _require_committed(path: str) -> None:
    """On an object store, refuses the split ``path`` (``<dataset>/<split>/parquet``) of a
    dataset whose publish did not finish: its commit marker is at the dataset's root."""
    parts = path.rstrip("/").rsplit("/", 2)
    if storage.parse(path).scheme == "s3" and len(parts) == 3 and parts[2] == "parquet":
        storage.require_committed(parts[0])


def make_reader(path: str, **kwargs):
    """``petastorm.make_reader`` (decoded rows, one by one) on a sparktf path (a split's
    ``parquet`` directory with petastorm's Unischema: see ``add_unischema``)."""
    import petastorm
    from petastorm.etl.dataset_metadata import UNISCHEMA_KEY

    _require_committed(path)

    if UNISCHEMA_KEY not in formats.read_common_metadata(path):
        raise formats.ParquetSchemaError(
            f"{storage.join(path, formats.COMMON_METADATA)}: no petastorm Unischema (the "
            "dataset was written where petastorm is not installed); add it with "
            f"sparktf.datasets.petastorm_io.add_unischema({path!r}), or read the split with "
            "make_batch_reader or sparktf.datasets.readers"
        )

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return CompleteReader(
            petastorm.make_reader(_url(path), filesystem=legacy_filesystem(path), **kwargs)
        )


def make_batch_reader(paths: str | Sequence[str], **kwargs):
    """``petastorm.make_batch_reader`` (undecoded column batches) on sparktf paths.

    ``paths``: a dataset directory or a list of its Parquet files. NdarrayCodec columns come
    back as arrays of ``numpy.save`` bytes: decode them with
    :func:`sparktf.datasets.formats.decode_ndarray_column`.
    """
    import petastorm

    first = paths if isinstance(paths, str) else paths[0]
    _require_committed(first if isinstance(paths, str) else storage.parse(first).parent().uri)
    urls = _url(paths) if isinstance(paths, str) else [_url(p) for p in paths]
    with warnings.catch_warnings():
        # It warns that a petastorm dataset "may give unexpected results": sparktf decodes
        # the ndarray columns itself, in batches.
        warnings.simplefilter("ignore")
        reader = petastorm.make_batch_reader(urls, filesystem=legacy_filesystem(first), **kwargs)
    return CompleteReader(reader)


class CompleteReader:
    """A petastorm ``Reader`` that does not end before it has read everything.

    petastorm 0.13.1's thread pool ends a read when every worker has handed over what it was
    given *and then* the ventilator has given out every row group
    (``ThreadPool.get_results``: ``all_workers_done()`` is checked before
    ``ventilator.completed()``). If the ventilator hands out the row groups between those two
    checks, as it does at the start of a read when it wins the race (about 1 read in 6 here,
    1 in 20 on a 4-file split), the read ends with 0 rows, or at an epoch boundary with rows
    missing, and no error. This reader checks the same two conditions in the safe order when
    petastorm says the read is over, and reads on when rows are still to come (the next call
    blocks until they are there). Everything else is the wrapped ``Reader``'s (``schema``,
    ``stop``, ``join``, ``reset``, ``with``, ``make_petastorm_dataset``)."""

    def __init__(self, reader):
        self._reader = reader

    def __getattr__(self, name):
        return getattr(self._reader, name)

    def __iter__(self):
        return self

    def __next__(self):
        while True:
            try:
                return next(self._reader)
            except StopIteration:
                if self._finished():
                    raise
                _log.debug("petastorm ended a read with row groups still to read: reading on")

    def _finished(self) -> bool:
        """Whether the read is really over: no row group left to give out, then (in this
        order, so that none is given out between the checks) every worker done with its own.
        True where the pool is not petastorm's thread pool (nothing to check)."""
        pool = getattr(self._reader, "_workers_pool", None)
        ventilator = getattr(self._reader, "ventilator", None)
        if pool is None or not hasattr(pool, "all_workers_done"):
            return True
        if ventilator is not None and not ventilator.completed():
            return False
        return pool.all_workers_done()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return self._reader.__exit__(*exc)
