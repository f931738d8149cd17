"""Everything sparktf does with petastorm, in one place (petastorm 0.13.1 is unmaintained).

petastorm opens ``hdfs://`` through libhdfs (JNI), which sparktf does not have. Its readers
and ``materialize_dataset`` accept a legacy ``pyarrow.filesystem`` object instead; here that is
the fsspec file system of ``sparktf.storage`` (WebHDFS for ``hdfs://``, the local one else)
wrapped as ``pyarrow.filesystem.DaskFileSystem`` with the few methods pyarrow 14's legacy
Parquet code calls (``isdir``, ``isfile``, ``walk``, ``_isfilestore``).

Data contract of the Parquet files: an ndarray column (NdarrayCodec) holds the bytes that
``numpy.save`` writes for the value, so Spark SQL sees a ``binary`` column; scalars are
``bigint``.
"""

from __future__ import annotations

import functools
import io
import json
import warnings
from collections.abc import Sequence

import numpy as np

from sparktf import storage
from sparktf.datasets.formats import Field, arrow_schema, manifest_fields


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


def filesystem_factory(path: str):
    """A picklable function that makes ``legacy_filesystem(path)`` (runs on executors too)."""
    return functools.partial(legacy_filesystem, path)


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


def dataset_unischema(manifest: dict):
    """The petastorm Unischema of a converted dataset's Parquet files (from its manifest)."""
    return unischema(f"sparktf_{manifest['dataset']}", manifest_fields(manifest))


def spark_schema(schema):
    """The Spark SQL schema of a Unischema (binary for ndarray fields, bigint for scalars)."""
    return schema.as_spark_schema()


def write_metadata(path: str, name: str, fields: Sequence[Field], row_groups: dict) -> None:
    """Makes the Parquet files of ``fields`` in ``path`` a petastorm dataset named ``name``:
    writes ``_common_metadata`` as petastorm's ``materialize_dataset`` does (the files' Arrow
    schema with the pickled Unischema and ``row_groups``, ``{file name: row groups}``), from
    what the writers reported, without reading the files back."""
    import pickle

    import pyarrow.parquet as pq
    from petastorm.etl.dataset_metadata import ROW_GROUPS_PER_FILE_KEY, UNISCHEMA_KEY

    schema = arrow_schema(fields).with_metadata(
        {
            # Written here; only petastorm's readers unpickle it, from the dataset's owner.
            UNISCHEMA_KEY: pickle.dumps(unischema(name, fields)),
            ROW_GROUPS_PER_FILE_KEY: json.dumps(row_groups).encode(),
        }
    )
    buffer = io.BytesIO()  # write_metadata seeks: a WebHDFS file cannot
    pq.write_metadata(schema, buffer)
    with storage.open_file(storage.join(path, "_common_metadata"), "wb") as f:
        f.write(buffer.getvalue())


def make_reader(path: str, **kwargs):
    """``petastorm.make_reader`` (decoded rows, one by one) on a sparktf path."""
    import petastorm

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        return petastorm.make_reader(
            storage.spark_uri(path), filesystem=legacy_filesystem(path), **kwargs
        )


def make_batch_reader(paths: str | Sequence[str], **kwargs):
    """``petastorm.make_batch_reader`` (undecoded column batches) on sparktf paths.

    ``paths``: a dataset directory or a list of its Parquet files. NdarrayCodec columns come
    back as arrays of ``numpy.save`` bytes: decode them with
    :func:`sparktf.datasets.formats.decode_ndarray_column`.
    """
    import petastorm

    first = paths if isinstance(paths, str) else paths[0]
    urls = (
        storage.spark_uri(paths)
        if isinstance(paths, str)
        else [storage.spark_uri(p) for p in paths]
    )
    with warnings.catch_warnings():
        # It warns that a petastorm dataset "may give unexpected results": sparktf decodes
        # the ndarray columns itself, in batches.
        warnings.simplefilter("ignore")
        return petastorm.make_batch_reader(urls, filesystem=legacy_filesystem(first), **kwargs)
