"""The public entry point of batch inference: :func:`predict` (``sparktf.predict``).

On the driver it inspects the model (:mod:`~sparktf.inference.saved_model`), plans the prediction
against the DataFrame's schema (:mod:`~sparktf.inference.prediction_plan`) and applies
:func:`~sparktf.inference.execute.predict_partition` to the columns it needs with
``DataFrame.mapInArrow``.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import warnings
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sparktf.datasets.columns import is_vector
from sparktf.errors import SparktfTypeError, SparktfValueError
from sparktf.inference.execute import predict_partition
from sparktf.inference.prediction_plan import (
    PredictInputError,
    choose_signature,
    make_plan,
    signature_kind,
)
from sparktf.inference.saved_model import inspect_export

if TYPE_CHECKING:  # pragma: no cover - typing only
    from pyspark.sql import DataFrame

__all__ = ["predict"]

log = logging.getLogger(__name__)


def predict(
    df: DataFrame,
    export: str | os.PathLike | None = None,
    *,
    input_col: str | None = None,
    output_col: str = "prediction",
    probability_col: str = "probability",
    raw_prediction_col: str = "rawPrediction",
    log_probabilities_col: str = "log_probabilities",
    batch_size: int = 128,
    signature: str | None = None,
    top_k: int | None = None,
    lm_output: str = "perplexity",
    label_col: str = "label",
    keep_columns: Sequence[str] | None = None,
    probabilities_col: str | None = None,
    model: str | os.PathLike | None = None,
    id_col: str = "id",
    inputs: Mapping[str, str] | None = None,
    outputs: Mapping[str, str] | Sequence[str] | None = None,
    struct_col: str | None = None,
    binary_outputs: Sequence[str] = (),
) -> DataFrame:
    """Applies the SavedModel ``export`` to every row of ``df``; returns ``df``'s columns plus
    the predictions (lazily: nothing runs until an action).

    Parameters:

    * ``df``: the input DataFrame; its columns are described per model kind below.
    * ``export``: a SavedModel directory (holding ``saved_model.pb``), local, ``file://`` or
      ``hdfs://``; or ``MODEL_DIR/export`` (or ``MODEL_DIR``), whose highest numbered
      version is used. A local path must be visible to every executor (same machine or a
      shared file system); on a cluster use ``hdfs://``, which each machine copies once
      into :func:`~sparktf.inference.cache.model_cache_dir`.
    * ``input_col``: the column the model reads (default per kind: ``"image"``,
      ``"features"``, ``"example"``, ``"tokens"`` or ``"z"``).
    * ``output_col``: the name of the prediction column (default ``"prediction"``).
    * ``probability_col``: a classifier's per-class probabilities (default ``"probability"``,
      the name :class:`sparktf.ml.TFModel` and Spark ML's classifiers use;
      ``probabilities_col`` is its former name, accepted with a DeprecationWarning).
    * ``raw_prediction_col``: a classifier's raw scores, the log of each probability
      (default ``"rawPrediction"``, as Spark ML's classifiers and :class:`sparktf.ml.TFModel`
      name it; ``""`` leaves it out).
    * ``log_probabilities_col``: a language model's next-word log-probabilities, with
      ``lm_output="next_word"`` (default ``"log_probabilities"``).
    * ``batch_size``: rows per model call (a positive integer, default 128).
    * ``signature``: the signature used; default ``predict_images`` or ``predict_features``
      when the model has it, else ``serving_default``.
    * ``top_k``: a classifier also returns its ``k`` best classes (1 <= k <= classes).
    * ``lm_output``: what a language model returns, ``"perplexity"`` or ``"next_word"``.
    * ``label_col``: the class label column of a conditional generator (default ``"label"``).
    * ``id_col``: the column that names a bad row in error messages when ``df`` has it
      (default ``"id"``; it travels to the Python workers with the input).
    * ``inputs``: ``{signature input: column}`` for any signature (below); by default each
      input is fed from the column of its name (a signature of one input: ``input_col``).
    * ``outputs``: the outputs of any signature served as they are (below), a list of
      names or ``{output: column}``; default: every output under its own name. Giving it
      serves even one of sparktf's own kinds this way (e.g. ``outputs=["scores"]``).
    * ``struct_col``: the served outputs as the fields of one struct column of this name.
    * ``binary_outputs``: ``string`` outputs served as ``binary`` (bytes that are not text).
    * ``keep_columns``: the columns of ``df`` returned beside the predictions, in this order
      (default: all of them). Only the model's input column(s), ``id`` (it names rows in
      error messages) and these columns travel to the Python workers, and only these
      columns and the predictions travel back: pass e.g. ``keep_columns=["id"]`` when the
      images themselves are not needed in the result (``select`` after ``predict`` does not
      prune what ``mapInArrow`` sends).

    What the signature looks like decides the data contract and the columns added:

    * **Image classifier**, uint8 images ``[B, H, W, C]`` -> ``classes``, ``scores``
      (``predict_images``). ``input_col`` (default ``"image"``) holds one image per row as

      - ``binary``: ``np.save`` bytes of an array of shape (H, W, C) or (H*W*C,) (what
        petastorm's NdarrayCodec stores; ``np.savez_compressed`` bytes of its
        CompressedNdarrayCodec are read too, more slowly), or exactly H*W*C raw bytes
        (row-major uint8); values that start with the ``np.save`` magic are read as
        ``np.save`` bytes;
      - ``array<int>`` (any integer type, flat of H*W*C values or nested (H, W, C)), with
        values in [0, 255].

      Adds ``output_col`` (``long``, the class), ``probability_col`` (``array<float>``,
      one probability per class), ``raw_prediction_col`` (``array<float>``, the log of each
      probability: the logits less their log-sum-exp, so it orders the classes and the rows
      as the logits and the probabilities do; a probability rounded to 0 gets the log of
      the smallest normal float32, about -87.3) and, with ``top_k=k``, ``top_classes``
      (``array<long>``) and ``top_probabilities`` (``array<float>``), the k best, best first.
    * **Classifier on float features**, float32 ``[B, *shape]`` -> ``classes``, ``scores``
      (``predict_features``, a user's model: :mod:`sparktf.models.custom`). ``input_col``
      (default ``"features"``) holds per row an ``array<float|double|int>`` (flat or nested
      to ``shape``), a Spark ML ``Vector`` (dense or sparse, e.g. ``VectorAssembler``'s
      output; it is read through ``vector_to_array`` and kept in the result) or ``np.save``
      bytes. Same added columns as the image classifier.
    * **Regression or multi-label model on float features**, float32 ``[B, *shape]`` ->
      ``predictions`` (``predict_features`` of a user's model of kind ``regression``,
      ``multilabel`` or ``custom``). ``input_col`` as for the classifier on float features.
      Adds ``output_col``: a ``double`` when the model gives one value per row, else
      ``array<float>`` (a multi-label model's probability of each label).
    * **Several named inputs** -> ``classes`` and ``scores``, or ``predictions``
      (``serving_default`` of a user's model with ``inputs=``, or any signature of two
      inputs or more): each input is fed from a column as for any other signature (below).
      Adds the classifier's columns, or the regression model's ``output_col``. Other
      outputs (a user's model with ``outputs=``) are served as any other signature's: a
      column each, named as the output.
    * **Any other signature** (a SavedModel written by Keras ``model.export``,
      ``tf.saved_model.save`` or another framework), or any signature with ``outputs=`` or
      ``struct_col=``: each input is fed from a column (``inputs=``, else the column of its
      name): a ``string`` input from a string or binary column, a ``bool`` from a boolean
      column, a number from a numeric column, an array of fixed shape from an array of
      numbers (flat or nested), a Spark ML Vector or ``np.save`` bytes (uint8 also raw
      bytes), an input of shape ``[B, 1]`` also from a numeric column; integers are checked
      to fit the input's dtype. Each output becomes a column typed from its TensorSpec
      (:mod:`sparktf.inference.output_columns`): a float scalar (``[B]`` or ``[B, 1]``) a
      ``double``, a float vector ``array<float>`` (nested for more dimensions), an integer
      ``long``, a bool ``boolean``, a string ``string`` (``binary`` with
      ``binary_outputs``); with ``struct_col``, one struct of them all.
    * **Classifier on serialized examples**, ``string [B]`` (``serving_default`` of a
      classifier, chosen with ``signature="serving_default"``): ``input_col`` (default
      ``"example"``) is ``binary`` holding a serialized ``tf.train.Example`` per row, passed
      unchanged. Same added columns.
    * **Language model**, int64 tokens ``[B, T]`` -> ``log_probs [B, T, V]``. ``input_col``
      (default ``"tokens"``) holds a 1-D sequence of token ids per row (``np.save`` bytes or
      ``array<int|long>``); lengths may differ between rows. ``lm_output="perplexity"``
      adds ``output_col`` (``double``): ``exp`` of the mean negative log-probability of
      ``tokens[1:]`` given ``tokens[:-1]`` (the model starts from a zero state per row).
      ``lm_output="next_word"`` feeds the whole sequence and adds ``output_col`` (``long``,
      the most likely next word) and ``log_probabilities_col`` (``array<float>``, V
      log-probabilities of the next word). Memory: the model returns B*T*V floats per batch.
    * **Generator** (DCGAN), float32 ``z [B, z_dim]`` (+ int64 ``label [B]``) -> uint8
      ``images``. ``input_col`` (default ``"z"``) holds per row either a vector of z_dim
      numbers (``array<float|double>`` or ``np.save`` bytes) or an integer seed, from which
      ``z = np.random.default_rng(seed).uniform(-1, 1, z_dim)`` (float32) is drawn. A
      conditional generator also reads ``label_col`` (default ``"label"``, integer). Adds
      ``output_col`` (``binary``): ``np.save`` bytes of the uint8 image (H, W, C), the same
      encoding as the converted datasets.

    Returns: a DataFrame of the kept columns (``keep_columns``, else all of ``df``'s, with
    their types; a Vector input column comes back as the Vector) followed by the added
    columns above, all non-null, one row per input row. An empty DataFrame gives an empty
    result (the model is not loaded).

    Raises, before any Spark job starts:

    * :class:`~sparktf.inference.saved_model.ModelNotFoundError` (a
      :class:`~sparktf.storage.PathNotFoundError`) when ``export`` holds no SavedModel;
    * :class:`~sparktf.inference.prediction_plan.PredictInputError` when the input column (or a
      conditional generator's label column) is missing or has a Spark type that cannot hold
      the input, an added column already exists in ``df``, or ``keep_columns`` names a
      column ``df`` lacks;
    * ``ValueError`` for a ``batch_size`` that is not a positive integer, a ``signature``
      the model lacks (or no default one), a signature of a kind it cannot feed, ``top_k``
      out of range or given for a model that is not a classifier, an unknown ``lm_output``,
      or added column names that collide; ``TypeError`` when ``keep_columns`` is a string.

    Shapes, dtypes, nulls and value ranges are checked on the executors batch by batch,
    before the model runs; the first bad batch fails the Spark action with
    ``PredictInputError: column '...': ...`` in the exception text, naming the row (by
    ``id`` when ``df`` has that column) and the expected shape. An ``hdfs://`` copy that
    does not match the model the driver read fails the action with
    :class:`~sparktf.inference.cache.ModelCacheMismatchError`, an unsafe cache directory
    with :class:`~sparktf.inference.cache.ModelCacheError`.

    Execution: ``mapInArrow`` over each partition's Arrow batches (of the columns named
    above only), cut into ``batch_size`` rows per model call; the outputs of one Arrow batch
    go back as one batch (cut at about 8 MiB of outputs). The model is loaded once per
    Python worker (:class:`~sparktf.inference.cache.ModelCache`) and reused by every later
    task of that worker, which needs ``spark.python.worker.reuse=true`` (Spark's default).
    TensorFlow in a worker uses as many threads as the task has CPUs (``spark.task.cpus``),
    or ``$SPARKTF_TF_THREADS``. The executors must be able to import ``sparktf``.
    """
    from pyspark.sql import types as T

    export, probability_col = _former_names(export, model, probability_col, probabilities_col)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise SparktfValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if isinstance(keep_columns, str):
        raise SparktfTypeError(
            f"keep_columns must be a sequence of column names, got {keep_columns!r}"
        )
    kept = list(df.columns) if keep_columns is None else list(dict.fromkeys(keep_columns))
    unknown = [c for c in kept if c not in df.columns]
    if unknown:
        raise PredictInputError(
            f"keep_columns {unknown} are not columns of the input DataFrame (it has {df.columns})"
        )
    info = inspect_export(export)
    sig = choose_signature(info, signature)
    served = outputs is not None or struct_col is not None or bool(binary_outputs)
    kind = signature_kind(sig, served=served)
    # The columns that may hold a Spark ML Vector the model reads (others are left alone).
    cols = [input_col, *(inputs or {}).values()]
    if kind == "named":
        cols += list(sig.inputs)
    elif input_col is None and kind in ("features", "values"):
        cols.append("features")
    df, vectors = _vectors_as_arrays(df, cols)
    plan, fields = make_plan(
        df.schema,
        info,
        sig,
        input_col=input_col,
        output_col=output_col,
        probability_col=probability_col,
        raw_prediction_col=raw_prediction_col or "",
        log_probabilities_col=log_probabilities_col,
        batch_size=batch_size,
        top_k=top_k,
        lm_output=lm_output,
        label_col=label_col,
        id_col=id_col,
        inputs=inputs,
        outputs=outputs,
        struct_col=struct_col,
        binary_outputs=binary_outputs,
    )
    log.info(
        "predict with %s (version %s), signature %s, input column(s) %s, batch size %d",
        info.uri,
        info.version,
        sig.describe(),
        [each.column for each in plan.named] or [plan.input_col],
        batch_size,
    )
    # Only what the model reads, what names rows in errors and what is kept goes to Python;
    # only the kept columns and the predictions come back.
    keep = [vectors.get(c, c) for c in kept]
    read = [each.column for each in plan.named] or [plan.input_col]
    needed = [*read, plan.label_col, plan.id_col, *keep]
    sent = df.select(*(_column(c) for c in dict.fromkeys(c for c in needed if c is not None)))
    plan = dataclasses.replace(plan, keep=tuple(keep))
    schema = T.StructType([sent.schema[c] for c in keep] + fields)
    out = sent.mapInArrow(functools.partial(predict_partition, plan), schema)
    for col, vector_col in vectors.items():
        if vector_col in keep:
            out = out.withColumnRenamed(vector_col, col)
    if keep != kept:
        out = out.select(*(_column(c) for c in [*kept, *(f.name for f in fields)]))
    return out


def _former_names(
    export: Any, model: Any, probability_col: str, probabilities_col: str | None
) -> tuple[Any, str]:
    """``export`` and ``probability_col``, taking their former names (``model``,
    ``probabilities_col``) with a DeprecationWarning."""
    if model is not None:  # the former name of ``export``
        warnings.warn(
            "sparktf.predict(model=) is now export= (model names what is trained)",
            DeprecationWarning,
            stacklevel=3,
        )
        export = model if export is None else export
    if export is None:
        raise SparktfTypeError("sparktf.predict needs export=, the SavedModel to apply")
    if probabilities_col is not None:
        warnings.warn(
            "sparktf.predict(probabilities_col=) is now probability_col= (the column is "
            "'probability' by default, as TFModel and Spark ML name it)",
            DeprecationWarning,
            stacklevel=3,
        )
        probability_col = probabilities_col
    return export, probability_col


def _vectors_as_arrays(df: DataFrame, cols: list[str | None]) -> tuple[DataFrame, dict]:
    """``df`` with each Spark ML Vector column of ``cols`` (VectorAssembler's) as
    ``array<float>`` under the column's own name (so errors name it), and for each the name
    the Vector itself travels under (it comes back in the result)."""
    vectors = {}
    for col in cols:
        if col is not None and col in df.schema.names and is_vector(df.schema[col].dataType):
            from pyspark.ml.functions import vector_to_array
            from pyspark.sql import functions as F

            vectors[col] = f"__sparktf_vector_{col}"
            df = df.withColumnRenamed(col, vectors[col]).withColumn(
                col, vector_to_array(F.col(vectors[col]), "float32")
            )
    return df, vectors


def _column(name: str) -> Any:
    """The top-level column ``name`` (a dot or backtick in it is part of the name)."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")
