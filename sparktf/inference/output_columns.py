"""A signature's outputs as Spark columns, for any SavedModel: the column types from the
TensorSpecs (on the driver) and the model's numpy results as Arrow arrays (on the executors).

One output gives one column (or one field of a struct column). Its Spark type follows the
output's dtype and its dimensions per row (the batch dimension aside; a trailing dimension of
exactly 1, as Keras' ``Dense(1)`` gives, counts as none):

============================  =================  ======================
dtype                         one value per row  d dimensions per row
============================  =================  ======================
float16, float32              double             d-deep array<float>
float64                       double             d-deep array<double>
int8..int64, uint8..uint32    long               d-deep array<long>
bool                          boolean            d-deep array<boolean>
string                        string (binary)    d-deep array<string>
============================  =================  ======================

A ``string`` output is UTF-8 text unless it is named in ``binary_outputs`` (bytes, e.g. an
encoded image); text that is not UTF-8 fails naming the output.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from sparktf.errors import SparktfValueError
from sparktf.inference.saved_model import Signature, TensorSpec

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pyarrow as pa
    from pyspark.sql.types import DataType

__all__ = ["OUTPUT_DTYPES", "Output", "list_array", "output_problem", "plan_outputs"]

# numpy dtype names of the outputs a column can hold -> the numpy type of its values.
OUTPUT_DTYPES = {
    "float16": np.float32,
    "float32": np.float32,
    "float64": np.float64,
    "int8": np.int64,
    "int16": np.int64,
    "int32": np.int64,
    "int64": np.int64,
    "uint8": np.int64,
    "uint16": np.int64,
    "uint32": np.int64,
    "bool": np.bool_,
    "string": object,
}


def output_problem(spec: TensorSpec) -> str | None:
    """Why the output ``spec`` cannot become a column, or None when it can."""
    if spec.dtype not in OUTPUT_DTYPES:
        return f"output {spec.name!r} has dtype {spec.dtype}, which no Spark column holds"
    if spec.shape is None:
        return f"output {spec.name!r} has a shape of unknown rank ({spec.describe()})"
    if not spec.shape:
        return f"output {spec.name!r} has no batch dimension ({spec.describe()})"
    return None


def list_array(flat: pa.Array, n: int, shape: tuple[int, ...]) -> pa.Array:
    """The ``n`` rows of ``flat`` (``prod(shape)`` values per row, row-major) as arrays
    nested ``len(shape)`` deep, over its buffer; ``flat`` itself for ``shape == ()``."""
    import pyarrow as pa

    if len(flat) >= 2**31:
        raise SparktfValueError(
            f"an output of {len(flat)} values is too large for one Arrow batch; lower batch_size"
        )
    for depth in range(len(shape) - 1, -1, -1):
        lists = n * math.prod(shape[:depth])  # how many lists this level has
        offsets = np.arange(lists + 1, dtype=np.int64) * shape[depth]
        flat = pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), flat)
    return flat


@dataclasses.dataclass(frozen=True)
class Output:
    """One output served as a column: the signature's ``key``, the ``column`` (or struct
    field) it becomes, its ``dtype``, ``dims`` dimensions per row (after ``squeeze``: a
    per-row shape of ``(1,)`` served as one value) and whether a string is ``binary``."""

    key: str
    column: str
    dtype: str
    dims: int
    squeeze: bool = False
    binary: bool = False

    def spark_type(self) -> DataType:
        """The Spark type of the column (see the module's table)."""
        from pyspark.sql import types as T

        if self.dtype == "string":
            base: DataType = T.BinaryType() if self.binary else T.StringType()
        elif self.dtype == "bool":
            base = T.BooleanType()
        elif self.dtype.startswith("float"):
            wide = self.dims == 0 or self.dtype == "float64"
            base = T.DoubleType() if wide else T.FloatType()
        else:
            base = T.LongType()
        for _ in range(self.dims):
            base = T.ArrayType(base, False)
        return base

    def arrow(self, values: Any, n: int) -> pa.Array:
        """The model's result for ``n`` rows as this column's Arrow array."""
        import pyarrow as pa

        values = np.asarray(values)
        if values.shape[:1] != (n,):
            raise SparktfValueError(
                f"output {self.key!r} has shape {values.shape} for a batch of {n} rows: it must "
                "give one result per row (its first dimension is the batch)"
            )
        if self.squeeze and values.shape[1:] in ((1,), ()):
            values = values.reshape(n)
        shape = values.shape[1:]
        if len(shape) != self.dims:
            raise SparktfValueError(
                f"output {self.key!r} has shape {values.shape}, not the {self.dims} dimension(s) "
                "per row its signature declares"
            )
        if self.dtype == "string":
            flat = pa.array(values.reshape(-1).tolist(), type=pa.binary())
            if not self.binary:
                try:
                    flat = flat.cast(pa.string())  # checks that it is UTF-8
                except pa.ArrowInvalid:
                    raise SparktfValueError(
                        f"output {self.key!r} holds bytes that are not UTF-8 text: serve it as "
                        f"bytes with binary_outputs=[{self.key!r}]"
                    ) from None
        else:
            scalar_float = self.dims == 0 and self.dtype.startswith("float")
            target = np.float64 if scalar_float else OUTPUT_DTYPES[self.dtype]
            flat = pa.array(values.reshape(-1).astype(target, copy=False))
        return list_array(flat, n, tuple(shape))


def plan_outputs(
    sig: Signature,
    outputs: Mapping[str, str] | Sequence[str] | None = None,
    binary_outputs: Sequence[str] = (),
) -> tuple[Output, ...]:
    """The columns of ``sig``'s outputs: every output under its own name (sorted by name),
    or those ``outputs`` lists (a sequence of names, or a mapping of names to columns), in
    that order. ValueError naming an unknown output, an output no column can hold, or a
    ``binary_outputs`` entry that is not a string output."""
    for name, given in (("outputs", outputs), ("binary_outputs", binary_outputs)):
        if isinstance(given, str):
            raise SparktfValueError(f"{name} must be a list or a mapping of names, got {given!r}")
    if outputs is None:
        chosen = {key: key for key in sorted(sig.outputs)}
    elif isinstance(outputs, Mapping):
        chosen = dict(outputs)
    else:
        chosen = {key: key for key in outputs}
    if not chosen:
        raise SparktfValueError(f"outputs: name at least one output of {sig.describe()}")
    unknown = [k for k in [*chosen, *binary_outputs] if k not in sig.outputs]
    if unknown:
        raise SparktfValueError(
            f"signature {sig.describe()} has no output(s) {unknown}; choose among "
            f"{sorted(sig.outputs)}"
        )
    served = []
    for key, column in chosen.items():
        spec = sig.outputs[key]
        problem = output_problem(spec)
        if problem:
            raise SparktfValueError(f"{problem}: choose other outputs (outputs=[...])")
        if key in binary_outputs and spec.dtype != "string":
            raise SparktfValueError(f"binary_outputs: output {key!r} is {spec.dtype}, not string")
        per_row = spec.shape[1:]
        squeeze = per_row == (1,)
        served.append(
            Output(
                key=key,
                column=column,
                dtype=spec.dtype,
                dims=0 if squeeze else len(per_row),
                squeeze=squeeze,
                binary=key in binary_outputs,
            )
        )
    return tuple(served)
