"""A model as a column function and a SQL function: :func:`predict_udf` and :func:`register_udf`.

``sparktf.predict_udf(export)`` returns a function of columns, as Spark's
``predict_batch_udf`` does::

    classify = sparktf.predict_udf("hdfs:///models/mnist", output="prediction")
    df.withColumn("digit", classify("image"))

and :func:`register_udf` makes it callable from SQL::

    sparktf.inference.register_udf(spark, "classify", "hdfs:///models/mnist", output="prediction")
    spark.sql("SELECT id, classify(image) AS digit FROM images")

Both plan the prediction on the driver as :func:`sparktf.predict` does (the signature, its
data contract, the added columns) and run it with the same executor code: ``batch_size``
rows per model call, the model loaded once per Python worker (:class:`ModelCache`), every
batch decoded and checked before the model runs, a bad row failing the query with
``PredictInputError`` (the row is named by its place in the batch: a UDF sees no ``id``).
The function runs as an Arrow UDF (``arrow_udf``, Spark 4.1 on), or as a pandas UDF on
Spark 4.0.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sparktf.errors import SparktfValueError
from sparktf.inference.execute import predict_chunks
from sparktf.inference.prediction_plan import Plan, choose_signature, make_plan
from sparktf.inference.saved_model import inspect_export

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pyarrow as pa
    from pyspark.sql import Column, SparkSession
    from pyspark.sql.types import DataType

__all__ = ["predict_udf", "register_udf"]


def predict_udf(
    export: str | os.PathLike,
    *,
    signature: str | None = None,
    batch_size: int = 128,
    input_order: Sequence[str] | None = None,
    outputs: Mapping[str, str] | Sequence[str] | None = None,
    binary_outputs: Sequence[str] = (),
    output: str | None = None,
    top_k: int | None = None,
    lm_output: str = "perplexity",
) -> Callable[..., Column]:
    """A function of columns that applies the SavedModel ``export`` to them (the arguments
    and the model as for :func:`sparktf.predict`).

    * Its arguments are the model's inputs, one column each: the one input of a signature
      of one input (a conditional generator: ``z``, then ``label``); for a signature of
      several inputs, in the order ``input_order`` lists their names (default: sorted by
      name).
    * It returns the columns :func:`sparktf.predict` would add: the one column's value, or
      a struct of them (a classifier: ``struct<prediction: bigint, probability:
      array<float>, rawPrediction: array<float>>``); ``output`` picks one of them by name
      (e.g. ``"prediction"``).

    Raises ValueError on the driver for an argument that does not fit the model; a column
    of the wrong type or shape fails the query at its first batch, naming the column by
    the input it feeds.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise SparktfValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    info = inspect_export(export)
    sig = choose_signature(info, signature)
    plan, fields = make_plan(
        None,
        info,
        sig,
        input_col=None,
        output_col="prediction",
        probability_col="probability",
        raw_prediction_col="rawPrediction",
        log_probabilities_col="log_probabilities",
        batch_size=batch_size,
        top_k=top_k,
        lm_output=lm_output,
        label_col="label",
        outputs=outputs,
        binary_outputs=binary_outputs,
    )
    names = _argument_names(plan, input_order)
    picked = None
    if output is not None:
        if output not in plan.outputs:
            raise SparktfValueError(
                f"output={output!r}: the model gives {list(plan.outputs)} ({sig.describe()})"
            )
        picked = plan.outputs.index(output)
    from pyspark.sql import types as T

    result: DataType = (
        fields[picked].dataType
        if picked is not None
        else fields[0].dataType
        if len(fields) == 1
        else T.StructType([T.StructField(f.name, f.dataType, True) for f in fields])
    )  # a struct's fields nullable: what a pandas UDF's DataFrame gives
    single = picked if picked is not None else (0 if len(fields) == 1 else None)
    run = _udf(plan, names, single, result)

    def apply(*columns: Column | str) -> Column:
        if len(columns) != len(names):
            raise SparktfValueError(
                f"the model reads {len(names)} column(s) ({', '.join(names)}), got {len(columns)}"
            )
        return run(*columns)

    apply.__name__ = apply.__qualname__ = "predict_udf"
    apply.udf = run  # what register_udf registers
    return apply


def register_udf(
    spark: SparkSession, name: str, export: str | os.PathLike, **options: Any
) -> Callable[..., Column]:
    """Registers the model as the SQL function ``name`` (``SELECT name(col) FROM t``) in
    ``spark``'s session; ``options`` are :func:`predict_udf`'s. Returns the column
    function too."""
    apply = predict_udf(export, **options)
    spark.udf.register(name, apply.udf)
    return apply


def _argument_names(plan: Plan, input_order: Sequence[str] | None) -> list[str]:
    """The Arrow column names of the UDF's arguments, in order (the plan's input columns)."""
    if isinstance(input_order, (str, Mapping)):
        raise SparktfValueError(
            f"input_order is a list of the model's input names, got {input_order!r} (the "
            "arguments are the columns, in this order)"
        )
    if plan.kind != "named":
        if input_order is not None and list(input_order) != [plan.input_key]:
            raise SparktfValueError(
                f"input_order: the model reads one input, {plan.input_key!r}, got "
                f"{list(input_order)}"
            )
        return [plan.input_col] + ([plan.label_col] if plan.label_col else [])
    keys = [each.key for each in plan.named]
    order = list(input_order) if input_order is not None else keys
    if sorted(order) != sorted(keys):
        raise SparktfValueError(
            f"input_order must list the model's inputs {keys} once each, got {order}"
        )
    column = {each.key: each.column for each in plan.named}
    return [column[key] for key in order]


def _udf(plan: Plan, names: list[str], single: int | None, result: DataType) -> Any:
    """The Spark UDF: an iterator Arrow UDF where Spark has them (4.1 on), else an iterator
    pandas UDF; the kind is told by the function's type hints, as Spark prefers."""
    import typing

    from pyspark.sql import functions as F

    several = len(names) > 1
    if hasattr(F, "arrow_udf") and _session_runs_arrow_udfs():
        import pyarrow as pa

        run = _arrow_function(plan, names, single, result)
        batch = typing.Tuple[pa.Array, ...] if several else pa.Array  # noqa: UP006 (Spark)
        run.__annotations__ = {
            "batches": typing.Iterator[batch],
            "return": typing.Iterator[pa.Array],
        }
        return F.arrow_udf(run, result)
    import pandas as pd

    run = _pandas_function(plan, names, single, result)
    batch = typing.Tuple[pd.Series, ...] if several else pd.Series  # noqa: UP006 (Spark)
    out = pd.Series if single is not None else pd.DataFrame
    run.__annotations__ = {"batches": typing.Iterator[batch], "return": typing.Iterator[out]}
    return F.pandas_udf(run, result)


def _session_runs_arrow_udfs() -> bool:
    """Whether the active session's Spark (a Connect server's, too) runs Arrow UDFs (4.1 on);
    True when there is no active session (the client's pyspark has them)."""
    from pyspark.sql import SparkSession

    session = SparkSession.getActiveSession()
    if session is None:
        return True
    major, minor = (int(part) for part in session.version.split(".")[:2])
    return (major, minor) >= (4, 1)


def _predict_arrays(
    plan: Plan,
    names: list[str],
    single: int | None,
    result: DataType,
    arrays: list[pa.Array],
    model: list,
) -> pa.Array:
    """The UDF's result for one batch of argument arrays."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_type

    batch = pa.RecordBatch.from_arrays(arrays, names=names)
    parts = [columns for _, columns in predict_chunks(plan, batch, model)]
    if not parts:
        return pa.array([], type=to_arrow_type(result))
    columns = [part[0] if len(parts) == 1 else pa.concat_arrays(list(part)) for part in zip(*parts)]
    if single is not None:
        return columns[single]
    return pa.StructArray.from_arrays(columns, names=list(plan.outputs))


def _arrow_function(plan: Plan, names: list[str], single: int | None, result: DataType) -> Callable:
    def run(batches: Iterator[Any]) -> Iterator[pa.Array]:
        model: list = []
        for arrays in batches:
            arrays = list(arrays) if isinstance(arrays, (tuple, list)) else [arrays]
            yield _predict_arrays(plan, names, single, result, arrays, model)

    return run


def _pandas_function(
    plan: Plan, names: list[str], single: int | None, result: DataType
) -> Callable:
    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa

        model: list = []
        for series in batches:
            series = list(series) if isinstance(series, (tuple, list)) else [series]
            arrays = [pa.Array.from_pandas(s) for s in series]
            out = _predict_arrays(plan, names, single, result, arrays, model)
            if single is not None:
                yield out.to_pandas()
            else:
                yield pa.Table.from_arrays(out.flatten(), names=list(plan.outputs)).to_pandas()

    return run
