"""A DataFrame's feature, label and id columns written as a ``table`` dataset: :func:`write_table`.

The ``table`` kind (:func:`sparktf.datasets.formats.table_manifest`) is what
:class:`sparktf.ml.TFEstimator` trains on: one ``train`` split of Parquet files whose feature
column holds ``numpy.save`` bytes, beside an int64 ``label`` and an int64 ``id``, with a
manifest that records the feature's dtype and shape and the number of classes. The
DataFrame is checked on Spark before anything is written (nulls, labels, row sizes), so a bad
row fails with its column, its id and what was expected rather than inside training.

The feature column may be a Spark ML ``Vector`` (dense or sparse), an ``array`` of numbers
(nested arrays are flattened) or ``numpy.save`` bytes (``binary``, e.g. the images of a
converted dataset). Rows are encoded on the executors over Arrow batches
(``DataFrame.mapInArrow``), without a Python object per row.
"""

from __future__ import annotations

import json
import logging
import math
import posixpath
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from sparktf import storage
from sparktf.datasets import formats
from sparktf.datasets.columns import is_vector, leaf_type
from sparktf.errors import SparktfError

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pyarrow as pa
    from pyspark.sql import DataFrame, Row
    from pyspark.sql.types import DataType

__all__ = ["FEATURE", "TableInputError", "write_table"]

log = logging.getLogger(__name__)

FEATURE = "features"  # the feature column's default name in the written dataset
_OUT_COLUMNS = ("label", "id")  # written after the feature column, in this order


class TableInputError(SparktfError, ValueError):
    """A DataFrame that cannot be written as a ``table`` dataset: a missing column, a null,
    a label that is not a class, a row of the wrong size or type."""


def write_table(
    df: DataFrame,
    data_dir: str,
    *,
    input_col: str,
    label_col: str,
    id_col: str,
    feature: str = FEATURE,
    shape: tuple[int, ...] | None = None,
    dtype: str | None = None,
    num_classes: int | None = None,
    labels: str = "classes",
) -> dict[str, Any]:
    """Writes ``df``'s feature, label and id columns as a ``table`` dataset (one ``train``
    split) in ``data_dir``.

    Args:
        df: the rows to write.
        data_dir: the dataset directory (local path, ``file://`` or ``hdfs://``); it gets
            ``train/parquet/*.parquet`` and the manifest.
        input_col: the feature column: a Spark ML ``Vector``, an ``array`` of numbers (nested
            arrays are flattened) or ``numpy.save`` bytes.
        label_col: the label column: integer class labels (integral doubles, as
            ``StringIndexer`` gives, are accepted).
        id_col: an integer column that names rows in errors and becomes the dataset's ``id``;
            when ``df`` has no such integer column, ids are generated.
        feature: the feature column's name in the dataset.
        shape: the per-row shape the feature must have (default: the first row's).
        dtype: the dtype vectors and arrays are stored as (default ``float32``; ``uint8``
            values must be integers in [0, 255]); ``numpy.save`` bytes keep their own.
        num_classes: the number of classes (default: the largest label + 1, at least 2).
        labels: ``"classes"`` (integer classes, written as int64) or ``"values"`` (float
            targets: a number per row, written as float32, or a Vector or array of numbers of
            the same size in every row, written as ``numpy.save`` float32 bytes).

    Returns:
        ``{"rows", "shape", "dtype", "num_classes", "label_shape"}`` of what was written
        (``num_classes`` is None and ``label_shape`` the per-row shape for ``"values"``;
        ``label_shape`` is ``()`` for classes).

    Raises:
        TableInputError: (a ``ValueError``) naming the column and the row (by ``id_col``
            when ``df`` has it) for a missing column, a null, a label that is not an integer
            in ``[0, num_classes)``, a feature row of another size than ``shape`` (or than the
            first row's) or of an unsupported Spark type, or an empty DataFrame. A bad value
            found while encoding on the executors (a ``uint8`` value outside [0, 255]) fails
            the Spark job with that message in its text.
    """
    if labels not in ("classes", "values"):
        raise ValueError(f"labels must be 'classes' or 'values', got {labels!r}")
    rows, where = _select_rows(df, input_col, label_col, id_col, labels)
    if labels == "classes":
        rows, classes = _check_labels(rows, label_col, where, num_classes)
        label_field, label_type = formats.Field("label", "int64"), "bigint"
    else:
        rows, label_shape = _value_labels(rows, df.schema[label_col].dataType, label_col, where)
        classes = None
        label_field = formats.Field("label", "float32", label_shape or None)
        label_type = "binary" if label_shape else "float"
    encoded, encoder, dtype, out_shape = _plan_features(
        rows, df.schema[input_col].dataType, input_col, feature, shape, dtype, where
    )
    if label_field.shape:
        encoder = _with_label_arrays(encoder, label_field.shape)
    parquet = storage.join(data_dir, "train", "parquet")
    out_schema = f"`{feature}` binary, label {label_type}, id bigint"
    encoded.mapInArrow(encoder, out_schema).write.parquet(storage.spark_uri(parquet))
    files, records = _parquet_records(df.sparkSession, parquet)
    total = sum(records)
    if total == 0:
        raise TableInputError("the DataFrame is empty: nothing to train on")
    fields = [
        formats.Field(feature, dtype, out_shape),
        label_field,
        formats.Field("id", "int64"),
    ]
    split = {
        "records": total,
        "files": [f"train/parquet/{name}" for name in files],
        "file_records": records,
    }
    manifest = formats.table_manifest("dataframe", fields, {"train": split}, num_classes=classes)
    storage.write_text(formats.manifest_path(data_dir), json.dumps(manifest, indent=1))
    log.info(
        "wrote %d rows (%s %s features, %s) to %s",
        total,
        dtype,
        out_shape,
        f"{classes} classes" if classes else f"float32 {tuple(label_field.shape or ())} labels",
        data_dir,
    )
    return {
        "rows": total,
        "shape": out_shape,
        "dtype": dtype,
        "num_classes": classes,
        "label_shape": tuple(label_field.shape or ()),
    }


def _select_rows(
    df: DataFrame, input_col: str, label_col: str, id_col: str, labels: str = "classes"
) -> tuple[DataFrame, Callable[[Row], str]]:
    """``df`` as columns ``x`` (feature), ``y`` (label) and ``id``, and the function that
    names one of its rows in a message."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    schema = df.schema
    for col, what, param in (
        (input_col, "feature", "input_col"),
        (label_col, "label", "label_col"),
    ):
        if col not in schema.names:
            raise TableInputError(
                f"the DataFrame has no {what} column {col!r} ({param}); it has {schema.names}"
            )
    has_id = id_col in schema.names and isinstance(
        schema[id_col].dataType, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
    )
    label_type = schema[label_col].dataType
    if labels == "values" and (is_vector(label_type) or isinstance(label_type, T.ArrayType)):
        pass  # a vector target: checked by _value_labels
    elif not isinstance(label_type, T.NumericType):
        raise TableInputError(
            f"label column {label_col!r} has Spark type {label_type.simpleString()}: expected "
            + (
                "integer class labels (index strings with StringIndexer first)"
                if labels == "classes"
                else "numbers, or a Vector or array of numbers per row"
            )
        )
    ids = F.col(id_col).cast("long") if has_id else F.monotonically_increasing_id()
    rows = df.select(F.col(input_col).alias("x"), F.col(label_col).alias("y"), ids.alias("id"))

    def where(row: Row) -> str:
        return f"the row with {id_col}={row['id']}" if has_id else f"a row (label {row['y']})"

    bad = rows.where(F.col("x").isNull() | F.col("y").isNull()).first()
    if bad is not None:
        col = input_col if bad["x"] is None else label_col
        raise TableInputError(f"column {col!r}: {where(bad)} is null")
    return rows, where


def _check_labels(
    rows: DataFrame, label_col: str, where: Callable[[Row], str], num_classes: int | None
) -> tuple[DataFrame, int]:
    """The rows with int64 labels, and the number of classes, once every label is known to
    be an integer class."""
    from pyspark.sql import functions as F

    bad = rows.where(F.col("y") != F.floor(F.col("y"))).first()
    if bad is not None:
        raise TableInputError(
            f"label column {label_col!r}: {where(bad)} has label {bad['y']}; expected integers"
        )
    rows = rows.withColumn("y", F.col("y").cast("long"))
    low, high = rows.agg(F.min("y"), F.max("y")).first()
    if high is None:
        raise TableInputError("the DataFrame is empty: nothing to train on")
    classes = int(num_classes) if num_classes else max(2, int(high) + 1)
    if low < 0 or high >= classes:
        bad = rows.where((F.col("y") < 0) | (F.col("y") >= classes)).first()
        raise TableInputError(
            f"label column {label_col!r}: {where(bad)} has label {bad['y']}; expected a class "
            f"in [0, {classes})"
        )
    return rows, classes


def _value_labels(
    rows: DataFrame, ltype: DataType, label_col: str, where: Callable[[Row], str]
) -> tuple[DataFrame, tuple[int, ...]]:
    """The rows with float labels (a float, or ``array<float>`` of one size in every row),
    and the per-row label shape; a NaN or a row of another size fails naming the row."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if isinstance(ltype, T.NumericType):
        rows = rows.withColumn("y", F.col("y").cast("float"))
        bad = rows.where(F.isnan("y")).first()
        if bad is not None:
            raise TableInputError(f"label column {label_col!r}: {where(bad)} has label NaN")
        return rows, ()
    rows = rows.withColumn("y", _float_array(F.col("y"), ltype, label_col))
    first = rows.select(F.size("y").alias("n")).first()
    if first is None:
        raise TableInputError("the DataFrame is empty: nothing to train on")
    size = int(first["n"])
    bad = rows.where(F.size("y") != size).first()
    if bad is not None:
        raise TableInputError(
            f"label column {label_col!r}: {where(bad)} has {len(bad['y'])} values; the first "
            f"row has {size}"
        )
    return rows, (size,)


def _with_label_arrays(
    encoder: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]],
    shape: tuple[int, ...],
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """``encoder``, whose ``array<float>`` label column is then written as ``numpy.save``
    float32 bytes of ``shape`` per row."""

    def encode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        for batch in encoder(batches):
            columns = list(batch.columns)
            columns[1] = formats.encode_ndarray_column(_float_rows(batch.column(1), shape))
            yield pa.RecordBatch.from_arrays(columns, names=batch.schema.names)

    return encode


def _plan_features(
    rows: DataFrame,
    ftype: DataType,
    input_col: str,
    feature: str,
    shape: tuple[int, ...] | None,
    dtype: str | None,
    where: Callable[[Row], str],
) -> tuple[DataFrame, Callable, str, tuple[int, ...]]:
    """The rows to encode (``feature``, ``label``, ``id``), the executors' Arrow encoder, and
    the dtype and shape the feature is written with."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    def columns(frame: DataFrame) -> DataFrame:
        return frame.select(F.col("x").alias(feature), F.col("y").alias("label"), "id")

    if isinstance(ftype, T.BinaryType):
        dtype, row_shape = _binary_layout(rows, input_col)
        if shape is not None and math.prod(shape) != math.prod(row_shape):
            raise TableInputError(
                f"column {input_col!r} holds numpy.save bytes of {dtype} {row_shape}; the model "
                f"expects shape {shape}"
            )
        out_shape = tuple(shape or row_shape)
        encoder = _binary_encoder(feature, input_col, dtype, row_shape, out_shape)
        return columns(rows), encoder, dtype, out_shape
    rows = rows.withColumn("x", _float_array(F.col("x"), ftype, input_col))
    dtype = dtype or "float32"
    if shape is None:
        first = rows.select(F.size("x").alias("n")).first()
        if first is None:
            raise TableInputError("the DataFrame is empty: nothing to train on")
        shape = (int(first["n"]),)
    size = math.prod(shape)
    bad = rows.where(F.size("x") != size).select("id", "y", F.size("x").alias("n")).first()
    if bad is not None:
        raise TableInputError(
            f"column {input_col!r}: {where(bad)} has {bad['n']} values; expected shape "
            f"{tuple(shape)} ({size} values) for the model"
        )
    out_shape = tuple(shape)
    return columns(rows), _list_encoder(feature, input_col, out_shape, dtype), dtype, out_shape


def _float_array(x: Any, ftype: DataType, input_col: str) -> Any:
    """The Spark expression turning a Vector or a (nested) numeric array into ``array<float>``."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    if is_vector(ftype):  # pyspark.ml's or pyspark.mllib's Vector
        from pyspark.ml.functions import vector_to_array

        return vector_to_array(x, "float32")
    if not isinstance(ftype, T.ArrayType):
        raise TableInputError(
            f"column {input_col!r} has Spark type {ftype.simpleString()}: expected a Vector "
            "(VectorAssembler), an array of numbers or numpy.save bytes"
        )
    if not isinstance(leaf_type(ftype), T.NumericType):
        raise TableInputError(
            f"column {input_col!r} has Spark type {ftype.simpleString()}: expected a "
            "Vector, an array of numbers or numpy.save bytes"
        )
    depth = ftype
    while isinstance(depth.elementType, T.ArrayType):
        x, depth = F.flatten(x), depth.elementType
    return x.cast("array<float>")


def _parquet_records(spark: Any, parquet: str) -> tuple[list[str], list[int]]:
    """The Parquet files Spark wrote in ``parquet`` (names, sorted) and their row counts."""
    from pyspark.sql import functions as F

    counted = (
        spark.read.parquet(storage.spark_uri(parquet))
        .groupBy(F.input_file_name().alias("f"))
        .agg(F.count("*").alias("n"))
        .collect()
    )
    counts = {posixpath.basename(r["f"]): int(r["n"]) for r in counted}
    files = sorted(
        posixpath.basename(storage.parse(p).path)
        for p in storage.listdir(parquet)
        if p.endswith(".parquet")
    )
    return files, [counts.get(name, 0) for name in files]


def _binary_layout(rows: DataFrame, input_col: str) -> tuple[str, tuple[int, ...]]:
    """The dtype and shape of the first row's ``numpy.save`` bytes."""
    first = rows.select("x").first()
    if first is None:
        raise TableInputError("the DataFrame is empty: nothing to train on")
    try:
        head = formats.read_npy_header(bytes(first["x"]))
    except ValueError as exc:
        raise TableInputError(
            f"column {input_col!r}: the first row is not numpy.save bytes: {exc}"
        ) from None
    return str(head.dtype), tuple(head.shape)


def _float_rows(column: pa.Array, shape: tuple[int, ...]):
    """An ``array<float>`` column as float32 ``[rows, *shape]``."""
    import numpy as np

    values = column.flatten().to_numpy(zero_copy_only=False)
    return np.asarray(values, dtype=np.float32).reshape(len(column), *shape)


def _list_encoder(
    feature: str, input_col: str, shape: tuple[int, ...], dtype: str
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The executors' encoder of ``array<float>`` rows into ``numpy.save`` bytes."""

    def encode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import numpy as np
        import pyarrow as pa

        for batch in batches:
            x = _float_rows(batch.column(0), shape)
            if dtype == "uint8":  # images given as numbers: integers in [0, 255]
                flat = x.reshape(len(x), -1)
                bad = ((flat < 0) | (flat > 255) | (flat != np.floor(flat))).any(axis=1)
                if bad.any():
                    i = int(np.flatnonzero(bad)[0])
                    raise TableInputError(
                        f"column {input_col!r}: the row with id={batch.column(2)[i].as_py()} "
                        "has values that are not integers in [0, 255]; the model reads uint8 "
                        "images"
                    )
            x = x.astype(dtype, copy=False)
            yield pa.RecordBatch.from_arrays(
                [formats.encode_ndarray_column(x), batch.column(1), batch.column(2)],
                names=[feature, *_OUT_COLUMNS],
            )

    return encode


def _binary_encoder(
    feature: str, input_col: str, dtype: str, shape: tuple[int, ...], out_shape: tuple[int, ...]
) -> Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]]:
    """The executors' check of ``numpy.save`` rows (dtype, shape), reshaped to ``out_shape``."""

    def encode(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        for batch in batches:
            try:
                x = formats.decode_ndarray_column(batch.column(0), dtype, shape, name=input_col)
            except formats.NdarrayColumnError as exc:
                raise TableInputError(f"{exc} (rows counted within one Arrow batch)") from None
            yield pa.RecordBatch.from_arrays(
                [
                    formats.encode_ndarray_column(x.reshape(len(x), *out_shape)),
                    batch.column(1),
                    batch.column(2),
                ],
                names=[feature, *_OUT_COLUMNS],
            )

    return encode
