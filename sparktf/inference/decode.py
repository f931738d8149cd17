"""Arrow record batches to model inputs, checked against the plan on the executors.

:func:`decode` turns one chunk of an Arrow batch into the numpy arrays a signature takes,
from the column buffers (no Python object per row where the rows are alike). Every check
(nulls, shapes, dtypes, value ranges) happens here, before the model runs, and a failure
raises :class:`~sparktf.inference.prediction_plan.PredictInputError` naming the column, the row (by
``id`` when the batch has it) and the plan's contract.
"""

from __future__ import annotations

import io
import math
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import numpy as np

from sparktf.datasets import formats
from sparktf.inference.prediction_plan import Plan, PredictInputError

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pyarrow as pa

__all__ = ["NPZ_MAGIC", "decode"]

NPZ_MAGIC = b"PK\x03\x04"  # np.savez_compressed, as petastorm's CompressedNdarrayCodec writes


class _Rows:
    """Names rows in error messages: by the ``id`` column when there is one."""

    def __init__(self, plan: Plan, chunk: pa.RecordBatch, offset: int = 0):
        self._ids = chunk.column(chunk.schema.get_field_index(plan.id_col)) if plan.id_col else None
        self._name = plan.id_col
        self._offset = offset

    def __call__(self, i: int) -> str:
        if self._ids is not None:
            return f"the row with {self._name}={self._ids[i].as_py()}"
        return f"row {self._offset + i} of its batch"


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _check_nulls(arr: pa.Array, col: str, contract: str, row: Callable[[int], str]) -> None:
    if arr.null_count:
        nulls = arr.is_null().to_numpy(zero_copy_only=False)
        raise PredictInputError(
            f"column {col!r}: {row(_first(nulls))} is null; expected {contract}"
        )


def _decode_binary(
    arr: pa.Array,
    col: str,
    contract: str,
    row: Callable[[int], str],
    raw: tuple[np.dtype, tuple[int, ...]] | None,
) -> np.ndarray | list[np.ndarray]:
    """Rows of a binary column: stacked [n, *shape] when they are alike, else a list.

    ``np.save`` bytes of one dtype and shape (petastorm's NdarrayCodec) are decoded in one
    step by the dataset codec (:func:`sparktf.datasets.formats.decode_ndarray_column`);
    ``raw`` (dtype, shape) also allows plain bytes of that exact size, sliced out of the
    Arrow buffer at once when every row is. Anything else (``np.savez_compressed`` bytes of
    petastorm's CompressedNdarrayCodec, mixed forms, a bad row) is read row by row, so that
    an error names the row.
    """
    n = len(arr)
    rows = formats.binary_matrix(arr)  # None unless every row has the same length
    if rows is not None and n:
        npy = _starts_with(rows, formats.NPY_MAGIC)
        if npy.all():
            try:
                return formats.decode_ndarray_column(arr, name=col)
            except formats.NdarrayColumnError:
                pass  # read row by row below, naming the bad row
        elif raw is not None and not npy.any():
            dtype, shape = raw
            if (
                rows.shape[1] == dtype.itemsize * math.prod(shape)
                and not _starts_with(rows, NPZ_MAGIC).any()
            ):
                return rows.view(dtype).reshape(n, *shape)
    offsets, data = formats.binary_parts(arr)
    out = []
    for i in range(n):
        value = data[offsets[i] : offsets[i + 1]].tobytes()
        if value.startswith(formats.NPY_MAGIC) or value.startswith(NPZ_MAGIC):
            try:
                loaded = np.load(io.BytesIO(value), allow_pickle=False)
                if isinstance(loaded, np.lib.npyio.NpzFile):  # CompressedNdarrayCodec
                    with loaded:
                        loaded = loaded[loaded.files[0]]
                out.append(loaded)
            except (ValueError, OSError, EOFError) as exc:
                raise PredictInputError(
                    f"column {col!r}: {row(i)} holds np.save bytes that cannot be read "
                    f"({exc}); expected {contract}"
                ) from None
        elif raw is not None:
            dtype, shape = raw
            want = dtype.itemsize * math.prod(shape)
            if len(value) != want:
                raise PredictInputError(
                    f"column {col!r}: {row(i)} holds {len(value)} raw bytes, not np.save bytes "
                    f"nor {want} raw bytes; expected {contract}"
                )
            out.append(np.frombuffer(value, dtype).reshape(shape))
        else:
            raise PredictInputError(
                f"column {col!r}: {row(i)} is not np.save bytes "
                f"({len(value)} bytes); expected {contract}"
            )
    return out


def _starts_with(rows: np.ndarray, prefix: bytes) -> np.ndarray:
    """Per row of an (n, length) uint8 matrix: does it start with ``prefix``?"""
    if rows.shape[1] < len(prefix):
        return np.zeros(len(rows), dtype=bool)
    return (rows[:, : len(prefix)] == np.frombuffer(prefix, np.uint8)).all(axis=1)


def _decode_list(
    arr: pa.Array, col: str, contract: str, row: Callable[[int], str]
) -> np.ndarray | list[np.ndarray]:
    """Rows of an (optionally nested) array column: stacked when regular, else 1-D rows."""
    import pyarrow as pa

    n = len(arr)
    dims: list[int] = []
    level = arr
    while pa.types.is_list(level.type) or pa.types.is_large_list(level.type):
        if level.null_count:
            nulls = level.is_null().to_numpy(zero_copy_only=False)
            where = row(_first(nulls)) if level is arr else "a row"
            raise PredictInputError(
                f"column {col!r}: {where} has a null array; expected {contract}"
            )
        lengths = level.value_lengths().to_numpy(zero_copy_only=False)
        if len(lengths) and not (lengths == lengths[0]).all():
            if level is not arr:
                raise PredictInputError(
                    f"column {col!r}: nested arrays of different lengths; expected {contract}"
                )
            values = level.flatten()
            if pa.types.is_list(values.type) or pa.types.is_large_list(values.type):
                raise PredictInputError(
                    f"column {col!r}: nested arrays of different lengths "
                    f"in {row(0)}...; expected {contract}"
                )
            return _split_rows(values, lengths, col, contract, row)
        dims.append(int(lengths[0]) if len(lengths) else 0)
        level = level.flatten()
    if level.null_count:
        raise PredictInputError(
            f"column {col!r}: an array holds a null element; expected {contract}"
        )
    return level.to_numpy(zero_copy_only=False).reshape(n, *dims)


def _split_rows(
    values: pa.Array, lengths: np.ndarray, col: str, contract: str, row: Callable[[int], str]
) -> list[np.ndarray]:
    if values.null_count:
        raise PredictInputError(
            f"column {col!r}: an array holds a null element; expected {contract}"
        )
    flat = values.to_numpy(zero_copy_only=False)
    return np.split(flat, np.cumsum(lengths)[:-1])


def _column_rows(
    chunk: pa.RecordBatch,
    col: str,
    contract: str,
    row: Callable[[int], str],
    raw: tuple[np.dtype, tuple[int, ...]] | None = None,
) -> np.ndarray | list[np.ndarray]:
    import pyarrow as pa

    arr = chunk.column(chunk.schema.get_field_index(col))
    _check_nulls(arr, col, contract, row)
    if pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type):
        return _decode_binary(arr, col, contract, row, raw)
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        return _decode_list(arr, col, contract, row)
    if pa.types.is_integer(arr.type) or pa.types.is_floating(arr.type):
        return arr.to_numpy(zero_copy_only=False)
    raise PredictInputError(f"column {col!r} has Arrow type {arr.type}; expected {contract}")


def _stack(
    rows: np.ndarray | list[np.ndarray],
    shape: tuple[int, ...],
    col: str,
    contract: str,
    row: Callable[[int], str],
) -> np.ndarray:
    """[n, *shape]; a row may also be flat with the same number of values."""
    size = math.prod(shape)
    if isinstance(rows, np.ndarray):
        if rows.shape[1:] == shape:
            return rows
        if rows.shape[1:] == (size,) or (size == 1 and rows.ndim == 1):
            return rows.reshape(len(rows), *shape)
        raise PredictInputError(
            f"column {col!r}: {row(0)} has shape {rows.shape[1:]}; expected {contract}"
        )
    for i, r in enumerate(rows):
        if r.shape != shape and r.shape != (size,):
            raise PredictInputError(
                f"column {col!r}: {row(i)} has shape {r.shape}; expected {contract}"
            )
    return np.stack([r.reshape(shape) for r in rows])


def _integers(
    values: np.ndarray,
    low: int,
    high: int | None,
    dtype: type,
    col: str,
    contract: str,
    row: Callable[[int], str],
) -> np.ndarray:
    """``values`` as ``dtype`` after checking they are integers in [low, high)."""
    if values.dtype.kind not in "iub":
        raise PredictInputError(
            f"column {col!r}: {row(0)} has dtype {values.dtype}; expected {contract}"
        )
    flat = values.reshape(len(values), -1)
    bad = (flat < low).any(axis=1)
    if high is not None:
        bad |= (flat >= high).any(axis=1)
    if bad.any():
        i = _first(bad)
        span = f"[{low}, {high})" if high is not None else f">= {low}"
        raise PredictInputError(
            f"column {col!r}: {row(i)} has values outside {span} (min {flat[i].min()}, "
            f"max {flat[i].max()}); expected {contract}"
        )
    return values.astype(dtype, copy=False)


def _decode_images(plan: Plan, chunk: pa.RecordBatch, row: _Rows, contract: str) -> np.ndarray:
    col = plan.input_col
    raw = (np.dtype(np.uint8), plan.shape)
    rows = _column_rows(chunk, col, contract, row, raw)
    if isinstance(rows, list):
        bad = next((i for i, r in enumerate(rows) if r.dtype.kind not in "iub"), None)
        if bad is not None:
            raise PredictInputError(
                f"column {col!r}: {row(bad)} has dtype {rows[bad].dtype}; expected {contract}"
            )
    images = _stack(rows, plan.shape, col, contract, row)
    if images.dtype != np.uint8:
        images = _integers(images, 0, 256, np.uint8, col, contract, row)
    return images


def _decode_features(plan: Plan, chunk: pa.RecordBatch, row: _Rows, contract: str) -> np.ndarray:
    col = plan.input_col
    rows = _column_rows(chunk, col, contract, row)
    if isinstance(rows, list):
        bad = next((i for i, r in enumerate(rows) if r.dtype.kind not in "fiub"), None)
    else:
        bad = 0 if rows.dtype.kind not in "fiub" else None
    if bad is not None:
        dtype = rows[bad].dtype if isinstance(rows, list) else rows.dtype
        raise PredictInputError(
            f"column {col!r}: {row(bad)} has dtype {dtype}; expected {contract}"
        )
    values = _stack(rows, plan.shape, col, contract, row)
    return values.astype(np.float32, copy=False)


def _decode_tokens(
    plan: Plan, chunk: pa.RecordBatch, row: _Rows, contract: str
) -> list[tuple[np.ndarray, np.ndarray]]:
    """The sequences grouped by length: (row indexes, int64 tokens [rows, length]) pairs."""
    col = plan.input_col
    rows = _column_rows(chunk, col, contract, row)
    seqs = list(rows) if isinstance(rows, np.ndarray) else rows
    least = 2 if plan.lm_output == "perplexity" else 1
    for i, seq in enumerate(seqs):
        if seq.ndim != 1 or len(seq) < least:
            raise PredictInputError(
                f"column {col!r}: {row(i)} has shape {seq.shape}; expected {contract}"
            )
    if isinstance(rows, np.ndarray):
        tokens = _integers(rows, 0, plan.vocab_size, np.int64, col, contract, row)
        return [(np.arange(len(rows)), tokens)]
    groups = []
    lengths = np.array([len(s) for s in seqs])
    for length in np.unique(lengths):
        index = np.flatnonzero(lengths == length)
        block = np.stack([seqs[i] for i in index])
        sub = lambda j, _index=index: row(int(_index[j]))  # noqa: E731
        groups.append((index, _integers(block, 0, plan.vocab_size, np.int64, col, contract, sub)))
    return groups


def _decode_generator(
    plan: Plan, chunk: pa.RecordBatch, row: _Rows, contract: str
) -> dict[str, np.ndarray]:
    col = plan.input_col
    (z_dim,) = plan.shape
    rows = _column_rows(chunk, col, contract, row)
    if isinstance(rows, np.ndarray) and rows.ndim == 1 and rows.dtype.kind in "iu":
        z = np.stack(
            [np.random.default_rng(int(s)).uniform(-1.0, 1.0, z_dim) for s in rows]
        ).astype(np.float32)
    else:
        z = _stack(rows, plan.shape, col, contract, row)
        if z.dtype.kind not in "fiu":
            raise PredictInputError(
                f"column {col!r}: {row(0)} has dtype {z.dtype}; expected {contract}"
            )
        z = z.astype(np.float32, copy=False)
    inputs = {plan.input_key: z}
    if plan.label_col is not None:
        label_contract = "an integer class label per row (int64, not null)"
        labels = _column_rows(chunk, plan.label_col, label_contract, row)
        inputs["label"] = _integers(
            np.asarray(labels), 0, None, np.int64, plan.label_col, label_contract, row
        )
    return inputs


def decode(plan: Plan, chunk: pa.RecordBatch, offset: int = 0) -> dict[str, Any]:
    """The model inputs of one chunk, checked against the plan: ``{input_key: array}`` (a
    generator also ``label``); for a language model ``{"groups": [(row indexes, tokens),
    ...]}``, one group per sequence length. Raises :class:`PredictInputError` at the first
    row that does not match the plan's contract."""
    row = _Rows(plan, chunk, offset)  # offset: where the chunk starts in its Arrow batch
    contract = plan.contract()
    if plan.kind == "images":
        return {plan.input_key: _decode_images(plan, chunk, row, contract)}
    if plan.kind in ("features", "values"):
        return {plan.input_key: _decode_features(plan, chunk, row, contract)}
    if plan.kind == "examples":
        arr = chunk.column(chunk.schema.get_field_index(plan.input_col))
        _check_nulls(arr, plan.input_col, contract, row)
        return {plan.input_key: np.asarray(arr.to_pylist(), dtype=object)}
    if plan.kind == "tokens":
        return {"groups": _decode_tokens(plan, chunk, row, contract)}
    if plan.kind == "named":
        return {
            each.key: _decode_named(plan, chunk, row, each.column, each.dtype, each.shape)
            for each in plan.named
        }
    return _decode_generator(plan, chunk, row, contract)


def _decode_named(
    plan: Plan, chunk: pa.RecordBatch, row: _Rows, col: str, dtype: str, shape: tuple[int, ...]
) -> np.ndarray:
    """The column ``col`` as the named input of ``dtype`` and per-row ``shape``: integers
    are checked to fit ``dtype``, a ``[B, 1]`` input may come from a column of numbers."""
    import pyarrow as pa

    contract = plan.named_contract(dtype, shape)
    arr = chunk.column(chunk.schema.get_field_index(col))
    if dtype == "string" or not shape:
        _check_nulls(arr, col, contract, row)
        if dtype == "string":
            text = pa.types.is_string(arr.type) or pa.types.is_large_string(arr.type)
            if not (text or pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)):
                raise PredictInputError(
                    f"column {col!r} has Arrow type {arr.type}; expected {contract}"
                )
            return np.asarray(arr.to_pylist(), dtype=object)
        values = arr.to_numpy(zero_copy_only=False)
    else:
        raw = (np.dtype(np.uint8), shape) if dtype == "uint8" else None
        values = _stack(_column_rows(chunk, col, contract, row, raw), shape, col, contract, row)
    kinds = {"bool": "b", "int": "iub", "uint": "iub"}.get(dtype.rstrip("0123456789"), "fiub")
    if values.dtype.kind not in kinds:
        raise PredictInputError(
            f"column {col!r}: {row(0)} has dtype {values.dtype}; expected {contract}"
        )
    if kinds == "iub" and values.dtype != np.dtype(dtype):
        info = np.iinfo(dtype)
        return _integers(values, int(info.min), int(info.max) + 1, dtype, col, contract, row)
    return values.astype(dtype, copy=False)
