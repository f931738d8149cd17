"""What each executor runs: the ``mapInArrow`` function of :func:`sparktf.inference.predict`.

:func:`predict_partition` decodes each Arrow batch of a partition
(:func:`~sparktf.inference.decode.decode`), runs the model ``batch_size`` rows at a time
(loaded through :class:`~sparktf.inference.cache.ModelCache`) and sends the kept columns
back with the outputs.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from sparktf.datasets import formats
from sparktf.inference.cache import LoadedSignature, ModelCache
from sparktf.inference.decode import decode
from sparktf.inference.output_columns import list_array
from sparktf.inference.prediction_plan import CLASSIFIER_KINDS, Plan

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pyarrow as pa

__all__ = ["OUTPUT_BATCH_BYTES", "predict_chunks", "predict_partition", "raw_prediction"]

# Outputs of one input Arrow batch are sent back as one batch, cut when they pass this many
# bytes (a language model's next-word log-probabilities are V floats per row).
OUTPUT_BATCH_BYTES = 8 << 20


def predict_partition(plan: Plan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function: decode and check, run the model ``batch_size`` rows at a
    time, and send the kept columns with the outputs back, one Arrow batch per input batch
    (fewer, larger batches cost less on both sides of the Arrow stream)."""
    import pyarrow as pa

    model: list[LoadedSignature] = []
    for batch in batches:
        keep = list(batch.schema.names) if plan.keep is None else list(plan.keep)
        names = keep + list(plan.outputs)
        parts: list[list[pa.Array]] = []
        size = first = 0
        for end, columns in predict_chunks(plan, batch, model):
            parts.append(columns)
            size += sum(c.nbytes for c in columns)
            if size >= OUTPUT_BATCH_BYTES or end == batch.num_rows:
                kept = batch.slice(first, end - first)
                outputs = [
                    part[0] if len(parts) == 1 else pa.concat_arrays(list(part))
                    for part in zip(*parts)
                ]
                yield pa.RecordBatch.from_arrays(
                    [kept.column(kept.schema.get_field_index(c)) for c in keep] + outputs,
                    names=names,
                )
                parts, size, first = [], 0, end


def predict_chunks(
    plan: Plan, batch: pa.RecordBatch, model: list[LoadedSignature]
) -> Iterator[tuple[int, list[pa.Array]]]:
    """The added columns of ``batch``, ``plan.batch_size`` rows at a time: (end row, columns)
    per chunk. Each chunk is decoded and checked before the model is loaded (into ``model``,
    empty until the first chunk, then kept by the caller across batches)."""
    for start in range(0, batch.num_rows, plan.batch_size):
        chunk = batch.slice(start, plan.batch_size)
        inputs = decode(plan, chunk, start)  # input errors surface before the model loads
        if not model:
            model.append(ModelCache.get(plan.export_uri, plan.fingerprint, plan.signature))
        columns = _run(plan, model[0], inputs, chunk.num_rows)
        ModelCache.stats[plan.fingerprint]["batches"] += 1
        yield start + chunk.num_rows, columns


def _list_array(matrix: np.ndarray) -> pa.Array:
    """An ``array<...>`` column of the rows of ``matrix``, over its buffer."""
    import pyarrow as pa

    flat = pa.array(np.ascontiguousarray(matrix).reshape(-1))
    return list_array(flat, matrix.shape[0], matrix.shape[1:])


def raw_prediction(scores: np.ndarray) -> np.ndarray:
    """A classifier's raw prediction, as Spark ML's classifiers name their raw scores: the
    log of each probability (float32), which is the logits less their log-sum-exp (the
    exported signatures give probabilities, not logits). A probability the model rounded to
    0 gets the log of the smallest normal float32 (about -87.3) instead of -inf."""
    tiny = np.finfo(np.float32).tiny
    return np.log(np.maximum(scores, tiny, dtype=np.float32))


def _values_columns(predictions: Any, n: int) -> list[pa.Array]:
    """A model's float ``predictions``: a double per row, or ``array<float>`` per row."""
    import pyarrow as pa

    values = np.asarray(predictions)
    if values.ndim == 1:
        return [pa.array(values.astype(np.float64))]
    return [_list_array(values.reshape(n, -1).astype(np.float32, copy=False))]


def _run(plan: Plan, model: LoadedSignature, inputs: dict[str, Any], n: int) -> list[pa.Array]:
    """The added columns of one chunk of ``n`` rows: the model run on the decoded inputs."""
    import pyarrow as pa

    if plan.kind == "named":
        out = model(**inputs)
        if plan.typed:  # outputs as they are: a column each, or one struct
            columns = [o.arrow(out[o.key], n) for o in plan.typed]
            if plan.struct_col is None:
                return columns
            return [pa.StructArray.from_arrays(columns, names=[o.column for o in plan.typed])]
        if "scores" not in out:
            return _values_columns(out["predictions"], n)
    if plan.kind in CLASSIFIER_KINDS or plan.kind == "named":
        out = out if plan.kind == "named" else model(**inputs)
        scores = out["scores"].astype(np.float32, copy=False)
        columns = [pa.array(out["classes"].astype(np.int64, copy=False)), _list_array(scores)]
        if plan.raw_prediction:
            columns.append(_list_array(raw_prediction(scores)))
        if plan.top_k is not None:
            best = np.argsort(-scores, axis=1, kind="stable")[:, : plan.top_k]
            columns += [
                _list_array(best.astype(np.int64)),
                _list_array(np.take_along_axis(scores, best, axis=1)),
            ]
        return columns
    if plan.kind == "values":
        return _values_columns(model(**inputs)["predictions"], n)
    if plan.kind == "tokens":
        if plan.lm_output == "perplexity":
            perplexity = np.empty(n, np.float64)
            for index, tokens in inputs["groups"]:
                log_probs = model(**{plan.input_key: tokens[:, :-1]})["log_probs"]
                target = np.take_along_axis(log_probs, tokens[:, 1:, None], axis=2)[..., 0]
                perplexity[index] = np.exp(-target.astype(np.float64).mean(axis=1))
            return [pa.array(perplexity)]
        next_words = np.empty(n, np.int64)
        log_probs_out = np.empty((n, plan.vocab_size or 0), np.float32)
        for index, tokens in inputs["groups"]:
            last = model(**{plan.input_key: tokens})["log_probs"][:, -1, :]
            if log_probs_out.shape[1] != last.shape[1]:
                log_probs_out = np.empty((n, last.shape[1]), np.float32)
            log_probs_out[index] = last
            next_words[index] = last.argmax(axis=1)
        return [pa.array(next_words), _list_array(log_probs_out)]
    images = model(**inputs)["images"]
    return [formats.encode_ndarray_column(np.asarray(images, dtype=np.uint8))]
