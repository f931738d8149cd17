"""Which Spark column types can hold a model input or a training feature: predicates on
``pyspark.sql.types``, shared by the table writer and batch inference.

Spark is imported when a predicate is first called, not with this module (executors decode
Arrow batches without it).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - typing only
    from pyspark.sql.types import DataType

__all__ = ["is_integral", "is_numeric_array", "is_vector", "leaf_type", "spark_types"]


def spark_types() -> Any:
    """The module ``pyspark.sql.types``, imported on first use."""
    from pyspark.sql import types as T

    return T


def is_integral(dtype: DataType) -> bool:
    """A byte, short, int or long column."""
    T = spark_types()
    return isinstance(dtype, (T.ByteType, T.ShortType, T.IntegerType, T.LongType))


def is_numeric_array(dtype: DataType) -> bool:
    """An array (possibly nested) of integers or floating point numbers."""
    T = spark_types()
    numeric = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType)
    return isinstance(dtype, T.ArrayType) and isinstance(leaf_type(dtype), numeric)


def is_vector(dtype: DataType) -> bool:
    """A Spark ML Vector column (``VectorAssembler``'s output)."""
    return getattr(dtype, "typeName", lambda: "")() == "vector" or (
        type(dtype).__name__ == "VectorUDT"
    )


def leaf_type(dtype: DataType) -> DataType:
    """The element type of a (possibly nested) array type; any other type itself."""
    T = spark_types()
    while isinstance(dtype, T.ArrayType):
        dtype = dtype.elementType
    return dtype
