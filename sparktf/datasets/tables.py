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
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from sparktf import storage
from sparktf.datasets import formats
from sparktf.datasets.columns import is_integral, is_vector, leaf_type, spark_types
from sparktf.errors import SparktfError

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pyarrow as pa
    from pyspark.sql import DataFrame, Row
    from pyspark.sql.types import DataType

__all__ = [
    "FEATURE",
    "TableInputError",
    "TableRows",
    "check_inputs",
    "check_table",
    "write_table",
]

log = logging.getLogger(__name__)

FEATURE = "features"  # the feature column's default name in the written dataset
_OUT_COLUMNS = ("label", "id")  # written after the feature column, in this order


class TableInputError(SparktfError, ValueError):
    """A DataFrame that cannot be written as a ``table`` dataset: a missing column, a null,
    a label that is not a class, a row of the wrong size or type."""


@dataclass(frozen=True)
class TableRows:
    """A DataFrame's rows once checked for training (:func:`check_table`): what
    :func:`write_table` writes and what a run fed straight from the DataFrame reads.

    ``rows`` has the columns ``feature`` (``array<float>``, or the input's ``numpy.save``
    bytes), ``label`` (``bigint`` classes, ``float`` values or ``array<float>``) and ``id``;
    ``fields`` describe the feature and label as the model reads them."""

    rows: DataFrame
    fields: tuple[formats.Field, ...]  # the inputs, then the label
    count: int
    num_classes: int | None  # classes; None for values
    # one input: its rows as numpy.save bytes (write_table); None for several inputs
    encoder: Callable[[Iterator[pa.RecordBatch]], Iterator[pa.RecordBatch]] | None
    binary: bool  # the feature column holds numpy.save bytes (else array<float>)

    @property
    def feature(self) -> formats.Field:
        return self.fields[0]

    @property
    def label(self) -> formats.Field:
        return self.fields[-1]


def check_table(
    df: DataFrame,
    *,
    input_col: str,
    label_col: str,
    id_col: str,
    feature: str = FEATURE,
    shape: tuple[int, ...] | None = None,
    dtype: str | None = None,
    num_classes: int | None = None,
    labels: str = "classes",
) -> TableRows:
    """Checks ``df``'s feature, label and id columns for training (the arguments of
    :func:`write_table`), in one Spark job over the rows (a second names a bad row), and
    returns them as :class:`TableRows`. Raises what :func:`write_table` raises."""
    return _check(df, {feature: input_col}, label_col, id_col, labels, num_classes, shape, dtype)


def check_inputs(
    df: DataFrame,
    inputs: dict[str, str],
    *,
    label_col: str | None,
    id_col: str,
    num_classes: int | None = None,
    labels: str | None = "classes",
) -> TableRows:
    """Checks the columns of a model with several named inputs (``inputs``: input name ->
    column of ``df``) as :func:`check_table` checks one. An input may be a number (``float``
    or ``double``: float32; an integer type: int64), a string, a Vector or array of numbers
    of one size in every row (float32), or ``numpy.save`` bytes of one dtype and shape.
    ``labels=None`` (and ``label_col=None``): no label (``sparktf.train.run``'s data).
    ``TableRows.encoder`` is None: such rows are fed as they are, not written."""
    return _check(df, dict(inputs), label_col, id_col, labels, num_classes, None, None)


def _check(
    df: DataFrame,
    inputs: dict[str, str],
    label_col: str,
    id_col: str,
    labels: str,
    num_classes: int | None,
    shape: tuple[int, ...] | None,
    dtype: str | None,
) -> TableRows:
    from pyspark.sql import functions as F

    if labels not in ("classes", "values", None):
        raise ValueError(f"labels must be 'classes', 'values' or None, got {labels!r}")
    rows, where = _select_rows(df, inputs, label_col, id_col, labels)
    kinds = {}  # x<i> -> binary | array | float | int | string
    for i, col in enumerate(inputs.values()):
        x, ftype = f"x{i}", df.schema[col].dataType
        kinds[x] = _input_kind(ftype, col, len(inputs) == 1 and labels is not None)
        if kinds[x] == "array":
            rows = rows.withColumn(x, _float_array(F.col(x), ftype, col))
        elif kinds[x] in ("float", "int"):
            rows = rows.withColumn(x, F.col(x).cast("float" if kinds[x] == "float" else "long"))
    ltype = df.schema[label_col].dataType if labels else None
    vector_label = labels == "values" and not isinstance(ltype, spark_types().NumericType)
    if vector_label:
        rows = rows.withColumn("y", _float_array(F.col("y"), ltype, label_col))
    elif labels == "values":
        rows = rows.withColumn("y", F.col("y").cast("float"))
    arrays = [x for x, kind in kinds.items() if kind == "array"]
    profile = _profile(rows, list(kinds), arrays, labels, vector_label)
    if not profile["n"]:
        raise TableInputError("the DataFrame is empty: nothing to train on")
    labelled = [("y", label_col)] if labels else []
    for col, name in (*zip(kinds, inputs.values()), *labelled):
        if profile[f"{col}_null"]:
            bad = rows.where(F.col(col).isNull()).first()
            raise TableInputError(f"column {name!r}: {where(bad)} is null")
    label_field, classes = None, None
    if labels == "classes":
        rows, classes = _check_labels(rows, profile, label_col, where, num_classes)
        label_field = formats.Field("label", "int64")
    elif labels == "values":
        label_shape = _value_label_shape(rows, profile, label_col, where) if vector_label else ()
        if not vector_label and profile["y_nan"]:
            bad = rows.where(F.isnan("y")).first()
            raise TableInputError(f"label column {label_col!r}: {where(bad)} has label NaN")
        label_field = formats.Field("label", "float32", label_shape or None)
    fields, encoder = [], None
    for (x, kind), (name, col) in zip(kinds.items(), inputs.items()):
        if kind == "binary":
            dtype, row_shape = _binary_layout(rows, x, col)
            if shape is not None and math.prod(shape) != math.prod(row_shape):
                raise TableInputError(
                    f"column {col!r} holds numpy.save bytes of {dtype} {row_shape}; the "
                    f"model expects shape {shape}"
                )
            out_shape = tuple(shape or row_shape)
            fields.append(formats.Field(name, dtype, out_shape))
            if len(inputs) == 1:
                encoder = _binary_encoder(name, col, dtype, row_shape, out_shape)
        elif kind == "array":
            out_shape = _feature_shape(rows, profile, x, col, shape, where)
            fields.append(formats.Field(name, dtype or "float32", out_shape))
            if len(inputs) == 1:
                encoder = _list_encoder(name, col, out_shape, dtype or "float32")
        else:
            fields.append(formats.Field(name, {"float": "float32", "int": "int64"}.get(kind, kind)))
    if label_field is not None and label_field.shape and encoder is not None:
        encoder = _with_label_arrays(encoder, label_field.shape)
    names = [F.col(x).alias(name) for x, name in zip(kinds, inputs)]
    if label_field is not None:
        names.append(F.col("y").alias("label"))
        fields.append(label_field)
    return TableRows(
        rows=rows.select(*names, *([] if "id" in inputs else ["id"])),
        fields=tuple(fields),
        count=int(profile["n"]),
        num_classes=classes,
        encoder=encoder,
        binary="binary" in kinds.values(),
    )


def _input_kind(ftype: DataType, col: str, only: bool) -> str:
    """How an input column of Spark type ``ftype`` is fed: ``binary`` (numpy.save bytes),
    ``array`` (a Vector or numbers; a model's ``only`` input is always one), or a number or
    string (``float``, ``int``, ``string``)."""
    T = spark_types()
    if isinstance(ftype, T.BinaryType):
        return "binary"
    if only or is_vector(ftype) or isinstance(ftype, T.ArrayType):
        return "array"  # _float_array names any other type
    if is_integral(ftype):
        return "int"
    if isinstance(ftype, (T.FloatType, T.DoubleType, T.DecimalType)):
        return "float"
    if isinstance(ftype, T.StringType):
        return "string"
    raise TableInputError(
        f"column {col!r} has Spark type {ftype.simpleString()}: an input is a number, a "
        "string, a Vector or an array of numbers"
    )


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
        data_dir: the dataset directory (local path, ``file://`` or ``hdfs://``), which must
            not exist: it gets ``train/parquet/*.parquet`` and the manifest, written beside
            it and renamed in whole once complete (:func:`sparktf.storage.publish`).
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
    table = check_table(
        df,
        input_col=input_col,
        label_col=label_col,
        id_col=id_col,
        feature=feature,
        shape=shape,
        dtype=dtype,
        num_classes=num_classes,
        labels=labels,
    )
    label_field = table.label
    label_type = "binary" if label_field.shape else formats.spark_type(label_field)
    out_schema = f"`{feature}` binary, label {label_type}, id bigint"
    # Written beside data_dir and renamed in whole: a failed or killed write leaves no
    # dataset that looks complete (storage.publish cleans its leftovers).
    with storage.publish(data_dir) as tmp:
        parquet = storage.join(tmp, "train", "parquet")
        encoded = table.rows.mapInArrow(table.encoder, out_schema)
        encoded.write.parquet(storage.spark_uri(parquet))
        files, records = _parquet_records(df.sparkSession, parquet)
        total = sum(records)
        fields = [*table.fields, formats.Field("id", "int64")]
        split = {
            "records": total,
            "files": [f"train/parquet/{name}" for name in files],
            "file_records": records,
        }
        classes = table.num_classes
        manifest = formats.table_manifest(
            "dataframe", fields, {"train": split}, num_classes=classes
        )
        storage.write_text(formats.manifest_path(tmp), json.dumps(manifest, indent=1))
    feature_field = table.feature
    log.info(
        "wrote %d rows (%s %s features, %s) to %s",
        total,
        feature_field.dtype,
        feature_field.shape,
        f"{classes} classes" if classes else f"float32 {tuple(label_field.shape or ())} labels",
        data_dir,
    )
    return {
        "rows": total,
        "shape": feature_field.shape,
        "dtype": feature_field.dtype,
        "num_classes": classes,
        "label_shape": tuple(label_field.shape or ()),
    }


def _select_rows(
    df: DataFrame, inputs: dict[str, str], label_col: str | None, id_col: str, labels: str | None
) -> tuple[DataFrame, Callable[[Row], str]]:
    """``df`` as columns ``x0``, ``x1``... (the inputs), ``y`` (label, unless ``labels`` is
    None) and ``id``, and the function that names one of its rows in a message."""
    from pyspark.sql import functions as F

    T = spark_types()
    schema = df.schema
    param = "input_col" if len(inputs) == 1 else "inputs"
    wanted = [(col, "feature", param) for col in inputs.values()]
    if labels is not None:
        wanted.append((label_col, "label", "label_col"))
    for col, what, name in wanted:
        if col not in schema.names:
            raise TableInputError(
                f"the DataFrame has no {what} column {col!r} ({name}); it has {schema.names}"
            )
    has_id = id_col in schema.names and is_integral(schema[id_col].dataType)
    label_type = schema[label_col].dataType if labels is not None else T.DoubleType()
    if labels == "values" and (is_vector(label_type) or isinstance(label_type, T.ArrayType)):
        pass  # a vector target: checked by _value_label_shape
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
    xs = [F.col(col).alias(f"x{i}") for i, col in enumerate(inputs.values())]
    ys = [F.col(label_col).alias("y")] if labels is not None else []
    rows = df.select(*xs, *ys, ids.alias("id"))

    def where(row: Row) -> str:
        if has_id:
            return f"the row with {id_col}={row['id']}"
        return f"a row (label {row['y']})" if labels is not None else "a row"

    return rows, where


def _profile(
    rows: DataFrame, inputs: list[str], arrays: list[str], labels: str | None, vector_label: bool
) -> dict[str, Any]:
    """One Spark job over ``rows``: the row count, the nulls of each input and of ``y``,
    the labels' range (classes), NaNs (float labels) and the smallest and largest size of
    each array."""
    from pyspark.sql import functions as F

    def nulls(col: str) -> Any:
        return F.sum(F.col(col).isNull().cast("long")).alias(f"{col}_null")

    def sizes(col: str) -> list[Any]:
        return [
            F.min(F.size(col)).alias(f"{col}_size_min"),
            F.max(F.size(col)).alias(f"{col}_size_max"),
        ]

    aggs = [F.count(F.lit(1)).alias("n"), *map(nulls, inputs)]
    if labels is not None:
        aggs.append(nulls("y"))
    if labels == "classes":
        fraction = (F.col("y") != F.floor(F.col("y"))).cast("long")
        aggs += [F.sum(fraction).alias("y_frac"), F.min("y").alias("y_min")]
        aggs.append(F.max("y").alias("y_max"))
    elif vector_label:
        aggs += sizes("y")
    elif labels == "values":
        aggs.append(F.sum(F.isnan("y").cast("long")).alias("y_nan"))
    for col in arrays:
        aggs += sizes(col)
    return rows.agg(*aggs).first().asDict()


def _check_labels(
    rows: DataFrame,
    profile: dict[str, Any],
    label_col: str,
    where: Callable[[Row], str],
    num_classes: int | None,
) -> tuple[DataFrame, int]:
    """The rows with int64 labels, and the number of classes, once the profile shows every
    label is an integer class (else the first bad row, named)."""
    from pyspark.sql import functions as F

    if profile["y_frac"]:
        bad = rows.where(F.col("y") != F.floor(F.col("y"))).first()
        raise TableInputError(
            f"label column {label_col!r}: {where(bad)} has label {bad['y']}; expected integers"
        )
    rows = rows.withColumn("y", F.col("y").cast("long"))
    low, high = profile["y_min"], profile["y_max"]
    classes = int(num_classes) if num_classes else max(2, int(high) + 1)
    if low < 0 or high >= classes:
        bad = rows.where((F.col("y") < 0) | (F.col("y") >= classes)).first()
        raise TableInputError(
            f"label column {label_col!r}: {where(bad)} has label {bad['y']}; expected a class "
            f"in [0, {classes})"
        )
    return rows, classes


def _value_label_shape(
    rows: DataFrame, profile: dict[str, Any], label_col: str, where: Callable[[Row], str]
) -> tuple[int, ...]:
    """The per-row shape of ``array<float>`` labels of one size in every row; a row of
    another size than the first fails naming the row."""
    from pyspark.sql import functions as F

    if profile["y_size_min"] == profile["y_size_max"]:
        return (int(profile["y_size_min"]),)
    size = int(rows.select(F.size("y").alias("n")).first()["n"])
    bad = rows.where(F.size("y") != size).first()
    raise TableInputError(
        f"label column {label_col!r}: {where(bad)} has {len(bad['y'])} values; the first "
        f"row has {size}"
    )


def _feature_shape(
    rows: DataFrame,
    profile: dict[str, Any],
    x: str,
    input_col: str,
    shape: tuple[int, ...] | None,
    where: Callable[[Row], str],
) -> tuple[int, ...]:
    """The per-row shape of the array column ``x``: ``shape``, else the size every row has;
    a row of another size (than ``shape``, else than the first row's) fails naming the row."""
    from pyspark.sql import functions as F

    low, high = profile[f"{x}_size_min"], profile[f"{x}_size_max"]
    if shape is None:
        if low == high:
            return (int(low),)
        shape = (int(rows.select(F.size(x).alias("n")).first()["n"]),)
    size = math.prod(shape)
    if low == high == size:
        return tuple(shape)
    bad = rows.where(F.size(x) != size).select("id", "y", F.size(x).alias("n")).first()
    raise TableInputError(
        f"column {input_col!r}: {where(bad)} has {bad['n']} values; expected shape "
        f"{tuple(shape)} ({size} values) for the model"
    )


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


def _binary_layout(rows: DataFrame, x: str, input_col: str) -> tuple[str, tuple[int, ...]]:
    """The dtype and shape of the first row's ``numpy.save`` bytes (column ``x``)."""
    first = rows.select(x).first()
    if first is None:
        raise TableInputError("the DataFrame is empty: nothing to train on")
    try:
        head = formats.read_npy_header(bytes(first[x]))
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
