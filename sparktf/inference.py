"""Batch inference over Spark DataFrames with an exported SavedModel: :func:`predict`.

``sparktf.predict(df, model, ...)`` (this module's :func:`predict`) applies a SavedModel
written by a task's ``export`` (``MODEL_DIR/export/<version>/``) to every row of a
DataFrame and returns the rows with the predictions added. It runs on the executors over
Arrow record batches (``DataFrame.mapInArrow``): a batch's column buffers are turned into
numpy arrays without a Python object per row, cut into ``batch_size`` rows and passed to
one signature of the model.

Where the model comes from (the driver reads only ``saved_model.pb`` and
``variables/variables.index`` to learn the signatures; no Spark job runs for it):

* a local path, ``file://`` or ``hdfs://`` URI of a version directory (holding
  ``saved_model.pb``), of ``MODEL_DIR/export`` (the highest numbered version is used) or of
  ``MODEL_DIR`` itself (then ``MODEL_DIR/export``);
* on each executor the model is loaded once per Python worker and kept in
  :class:`ModelCache`; an ``hdfs://`` model is first copied once per machine into
  ``$SPARKTF_MODEL_CACHE_DIR`` (default ``<tempdir>/sparktf-models-<uid>/<fingerprint>``),
  a directory private to the user (0700; one that another user owns or can write, or a
  symbolic link, is refused). A copy is used only while its contents match the
  fingerprint the driver computed from the source (:func:`model_fingerprint`); one that
  does not match is copied again.
"""

from __future__ import annotations

import dataclasses
import fcntl
import functools
import hashlib
import io
import logging
import math
import os
import posixpath
import shutil
import tempfile
import threading
from collections import Counter, OrderedDict, defaultdict
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from sparktf import paths, storage
from sparktf.datasets import formats
from sparktf.errors import SparktfError

if TYPE_CHECKING:  # pragma: no cover - typing only
    import pyarrow as pa
    from pyspark.sql import DataFrame
    from pyspark.sql.types import DataType, StructField, StructType

log = logging.getLogger(__name__)

NPZ_MAGIC = b"PK\x03\x04"  # np.savez_compressed, as petastorm's CompressedNdarrayCodec writes
LM_OUTPUTS = ("perplexity", "next_word")
# TensorFlow DataType enum values (tensorflow/core/framework/types.proto) -> numpy names.
_TF_DTYPES = {
    1: "float32",
    2: "float64",
    3: "int32",
    4: "uint8",
    5: "int16",
    6: "int8",
    7: "string",
    9: "int64",
    10: "bool",
    19: "float16",
}


class PredictInputError(SparktfError, ValueError):
    """The input DataFrame does not match what the model's signature expects.

    Raised on the driver when the schema shows it (a missing column, a wrong Spark type),
    otherwise on the executor at the first batch that shows it (wrong shape or dtype,
    nulls, values out of range); Spark then fails the action, and its exception text holds
    ``PredictInputError: column '...': ...``.
    """


class ModelCacheError(SparktfError, PermissionError):
    """The executors' model cache cannot be used safely (the message names the path)."""


class ModelCacheMismatchError(SparktfError, RuntimeError):
    """A fresh copy of a model does not match the fingerprint the driver computed (the model
    changed after ``predict`` read it, or the copy was corrupted)."""


class ModelNotFoundError(storage.PathNotFoundError):
    """No SavedModel at the given model path."""


# ----------------------------------------------------------------------------- the model


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One input or output of a signature: numpy dtype name ("string" for tf.string) and
    shape (``None`` for an unknown dimension; the first is the batch)."""

    name: str
    dtype: str
    shape: tuple[int | None, ...] | None

    def describe(self) -> str:
        if self.shape is None:
            return f"{self.dtype}[?]"
        dims = [
            "B" if i == 0 and d is None else ("?" if d is None else str(d))
            for i, d in enumerate(self.shape)
        ]
        return f"{self.dtype}[{','.join(dims)}]"


@dataclasses.dataclass(frozen=True)
class Signature:
    name: str
    inputs: Mapping[str, TensorSpec]
    outputs: Mapping[str, TensorSpec]

    def describe(self) -> str:
        ins = ", ".join(f"{k}: {v.describe()}" for k, v in sorted(self.inputs.items()))
        outs = ", ".join(f"{k}: {v.describe()}" for k, v in sorted(self.outputs.items()))
        return f"{self.name}({ins}) -> ({outs})"


@dataclasses.dataclass(frozen=True)
class ModelInfo:
    """What the driver knows about a SavedModel without loading it.

    ``uri``: the version directory; ``version``: its name when numeric, else ``None``;
    ``fingerprint``: :func:`model_fingerprint` of the directory, which names the executors'
    local copies and verifies them.
    """

    uri: str
    version: int | None
    fingerprint: str
    signatures: Mapping[str, Signature]


def resolve_model(model: str | os.PathLike) -> str:
    """The SavedModel directory that ``model`` names (see the module docstring).

    Raises :class:`ModelNotFoundError` naming the path when there is none.
    """
    path = os.fspath(model)
    if not storage.exists(path):
        raise ModelNotFoundError(f"model {path} does not exist")
    if storage.exists(storage.join(path, "saved_model.pb")):
        return path
    versions = []
    if storage.isdir(path):
        for entry in storage.listdir(path):
            name = posixpath.basename(storage.parse(entry).path)
            if name.isdigit() and storage.exists(storage.join(entry, "saved_model.pb")):
                versions.append((int(name), entry))
    if versions:
        return max(versions)[1]
    export = storage.join(path, "export")
    if storage.isdir(export):
        return resolve_model(export)
    raise ModelNotFoundError(
        f"model {path} holds no SavedModel: expected saved_model.pb in it, or numbered version "
        "directories holding one (MODEL_DIR/export/<version>/), or MODEL_DIR/export"
    )


def model_fingerprint(uri: str, *, graph: bytes | None = None) -> str:
    """SHA-256 over a SavedModel directory (local or ``hdfs://``): the bytes of
    ``saved_model.pb`` and ``variables/variables.index`` (the index holds the offset, size
    and CRC32C of every variable, which TensorFlow checks when it reads one) and the
    relative path and size of every file. The driver computes it from the source; an
    executor recomputes it on its local copy and trusts the copy only when both agree."""
    root = storage.parse(uri).path.rstrip("/")
    digest = hashlib.sha256()
    if graph is None:
        graph = storage.read_bytes(storage.join(uri, "saved_model.pb"))
    digest.update(b"saved_model.pb\0%d\0" % len(graph) + graph)
    index = storage.join(uri, "variables", "variables.index")
    if storage.exists(index):
        data = storage.read_bytes(index)
        digest.update(b"variables.index\0%d\0" % len(data) + data)
    for path in storage.walk_files(uri):
        rel = posixpath.relpath(storage.parse(path).path, root)
        digest.update(f"file\0{rel}\0{storage.size(path)}\0".encode())
    return digest.hexdigest()


def inspect_model(model: str | os.PathLike) -> ModelInfo:
    """Resolves ``model`` and reads its signatures from ``saved_model.pb`` (no variables)."""
    uri = resolve_model(model)  # before importing TensorFlow: a missing model fails fast
    from tensorflow.core.protobuf import saved_model_pb2  # imports TensorFlow (driver only)

    graph = storage.read_bytes(storage.join(uri, "saved_model.pb"))
    fingerprint = model_fingerprint(uri, graph=graph)
    proto = saved_model_pb2.SavedModel()
    try:
        proto.ParseFromString(graph)
    except Exception as exc:  # protobuf's DecodeError
        raise ModelNotFoundError(f"{uri}/saved_model.pb is not a SavedModel: {exc}") from exc
    if not proto.meta_graphs:
        raise ModelNotFoundError(f"{uri}/saved_model.pb holds no meta graph")

    def spec(key: str, info: Any) -> TensorSpec:
        shape = (
            None
            if info.tensor_shape.unknown_rank
            else tuple(None if d.size < 0 else int(d.size) for d in info.tensor_shape.dim)
        )
        return TensorSpec(key, _TF_DTYPES.get(info.dtype, f"dtype{info.dtype}"), shape)

    signatures = {
        name: Signature(
            name,
            {k: spec(k, v) for k, v in sig.inputs.items()},
            {k: spec(k, v) for k, v in sig.outputs.items()},
        )
        for name, sig in proto.meta_graphs[0].signature_def.items()
        if not name.startswith("__")
    }
    name = posixpath.basename(storage.parse(uri).path)
    return ModelInfo(
        uri=uri,
        version=int(name) if name.isdigit() else None,
        fingerprint=fingerprint,
        signatures=signatures,
    )


# ----------------------------------------------------------------------------- the plan


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Everything an executor needs, decided on the driver (pickled into the task)."""

    kind: str  # "images", "features", "examples", "tokens" or "generator"
    model_uri: str
    fingerprint: str
    signature: str
    input_col: str
    input_key: str  # the signature's input name
    shape: tuple[int, ...]  # per-row shape expected: (H, W, C), (z_dim,) or ()
    batch_size: int
    outputs: tuple[str, ...]  # names of the added columns, in order
    top_k: int | None = None
    lm_output: str = "perplexity"
    vocab_size: int | None = None
    label_col: str | None = None  # conditional generator
    id_col: str | None = None  # used to name rows in error messages
    keep: tuple[str, ...] | None = None  # input columns returned beside the outputs (None: all)

    def contract(self) -> str:
        """What the input column must hold, for error messages."""
        if self.kind == "images":
            h, w, c = self.shape
            return (
                f"a uint8 image of shape ({h}, {w}, {c}) per row: np.save bytes (as "
                f"petastorm's NdarrayCodec writes), {h * w * c} raw bytes, or an array of "
                f"{h * w * c} integers in [0, 255]"
            )
        if self.kind == "features":
            size = math.prod(self.shape)
            return (
                f"a float vector of shape {self.shape} per row: an array of {size} numbers "
                f"(array<float|double|int>, flat or nested), a Spark ML Vector of size {size} "
                "(dense or sparse), or np.save bytes of that shape"
            )
        if self.kind == "examples":
            return "a serialized tf.train.Example per row (binary)"
        if self.kind == "tokens":
            least = 2 if self.lm_output == "perplexity" else 1
            return (
                f"a 1-D sequence of at least {least} int64 token ids in [0, {self.vocab_size}) "
                "per row: np.save bytes or an array of integers"
            )
        (z_dim,) = self.shape
        return (
            f"a float32 vector of shape ({z_dim},) per row (np.save bytes or an array of "
            f"numbers), or an integer seed that draws z ~ U(-1, 1)"
        )


def _choose_signature(info: ModelInfo, signature: str | None) -> Signature:
    if signature is not None:
        if signature not in info.signatures:
            raise ValueError(
                f"model {info.uri} has no signature {signature!r}; it has {sorted(info.signatures)}"
            )
        return info.signatures[signature]
    for name in ("predict_images", "predict_features", "serving_default"):
        if name in info.signatures:
            return info.signatures[name]
    raise ValueError(
        f"model {info.uri} has neither a predict_images, a predict_features nor a serving_default "
        f"signature (it has {sorted(info.signatures)}); pass signature="
    )


def _kind(sig: Signature) -> str:
    ins, outs = sig.inputs, sig.outputs
    one = next(iter(ins.values())) if len(ins) == 1 else None
    if {"classes", "scores"} <= set(outs) and one is not None:
        if (
            one.dtype == "uint8"
            and one.shape is not None
            and len(one.shape) == 4
            and all(d is not None for d in one.shape[1:])
        ):
            return "images"
        if (
            one.dtype in ("float32", "float64")
            and one.shape is not None
            and len(one.shape) >= 2
            and all(d is not None for d in one.shape[1:])
        ):
            return "features"
        if one.dtype == "string" and one.shape is not None and len(one.shape) == 1:
            return "examples"
    if (
        "log_probs" in outs
        and one is not None
        and one.dtype in ("int64", "int32")
        and one.shape is not None
        and len(one.shape) == 2
    ):
        return "tokens"
    z = ins.get("z")
    if (
        "images" in outs
        and z is not None
        and z.shape is not None
        and len(z.shape) == 2
        and z.shape[1] is not None
        and set(ins) <= {"z", "label"}
    ):
        return "generator"
    raise ValueError(
        f"sparktf.predict does not know how to feed signature {sig.describe()}: it serves "
        "classifiers (uint8 images, float features or serialized Examples -> classes, "
        "scores), language "
        "models (int64 tokens -> log_probs) and generators (float32 z [+ int64 label] -> "
        "images)"
    )


def _spark_types():
    from pyspark.sql import types as T

    return T


def _is_integral(dtype: DataType) -> bool:
    T = _spark_types()
    return isinstance(dtype, (T.ByteType, T.ShortType, T.IntegerType, T.LongType))


def _numeric_array(dtype: DataType) -> bool:
    T = _spark_types()
    numeric = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.FloatType, T.DoubleType)
    return isinstance(dtype, T.ArrayType) and isinstance(_leaf_type(dtype), numeric)


def _is_vector(dtype: DataType) -> bool:
    """A Spark ML Vector column (``VectorAssembler``'s output)."""
    return getattr(dtype, "typeName", lambda: "")() == "vector" or (
        type(dtype).__name__ == "VectorUDT"
    )


def _leaf_type(dtype: DataType) -> DataType:
    T = _spark_types()
    while isinstance(dtype, T.ArrayType):
        dtype = dtype.elementType
    return dtype


def _check_column(
    schema: StructType, col: str, plan_contract: str, ok: Callable[[Any], bool], role: str = "input"
) -> None:
    if col not in schema.names:
        raise PredictInputError(
            f"{role} column {col!r} is missing: expected {plan_contract}; the DataFrame has "
            f"columns {schema.names}"
        )
    dtype = schema[col].dataType
    if not ok(dtype):
        raise PredictInputError(
            f"column {col!r} has Spark type {dtype.simpleString()}: expected {plan_contract}"
        )


def _make_plan(
    schema: StructType,
    info: ModelInfo,
    sig: Signature,
    *,
    input_col: str | None,
    output_col: str,
    probabilities_col: str,
    log_probabilities_col: str,
    batch_size: int,
    top_k: int | None,
    lm_output: str,
    label_col: str,
) -> tuple[_Plan, list[StructField]]:
    T = _spark_types()
    kind = _kind(sig)
    key, spec = next((k, v) for k, v in sig.inputs.items() if k != "label")
    binary = lambda t: isinstance(t, T.BinaryType)  # noqa: E731
    int_array = lambda t: isinstance(t, T.ArrayType) and _is_integral(_leaf_type(t))  # noqa: E731
    fields: list[StructField]
    vocab = None
    extra: dict[str, Any] = {}
    if kind in ("images", "features", "examples"):
        num_classes = sig.outputs["scores"].shape[-1] if sig.outputs["scores"].shape else None
        if top_k is not None and (top_k < 1 or (num_classes is not None and top_k > num_classes)):
            raise ValueError(f"top_k must be in [1, {num_classes}], got {top_k}")
        shape = tuple(spec.shape[1:]) if kind in ("images", "features") else ()
        default_col = {"images": "image", "features": "features"}.get(kind, "example")
        accepts = {
            "images": lambda t: binary(t) or int_array(t),
            "features": lambda t: binary(t) or _numeric_array(t),
        }.get(kind, binary)
        fields = [
            T.StructField(output_col, T.LongType(), False),
            T.StructField(probabilities_col, T.ArrayType(T.FloatType(), False), False),
        ]
        if top_k is not None:
            fields += [
                T.StructField("top_classes", T.ArrayType(T.LongType(), False), False),
                T.StructField("top_probabilities", T.ArrayType(T.FloatType(), False), False),
            ]
    elif kind == "tokens":
        if lm_output not in LM_OUTPUTS:
            raise ValueError(f"lm_output must be one of {LM_OUTPUTS}, got {lm_output!r}")
        vocab = sig.outputs["log_probs"].shape[-1] if sig.outputs["log_probs"].shape else None
        shape, default_col = (), "tokens"
        accepts = lambda t: binary(t) or int_array(t)  # noqa: E731
        if lm_output == "perplexity":
            fields = [T.StructField(output_col, T.DoubleType(), False)]
        else:
            fields = [
                T.StructField(output_col, T.LongType(), False),
                T.StructField(log_probabilities_col, T.ArrayType(T.FloatType(), False), False),
            ]
    else:  # generator
        shape, default_col = (int(spec.shape[1]),), "z"

        def accepts(t: Any) -> bool:
            numeric = (
                T.ByteType,
                T.ShortType,
                T.IntegerType,
                T.LongType,
                T.FloatType,
                T.DoubleType,
            )
            return (
                binary(t)
                or _is_integral(t)
                or (isinstance(t, T.ArrayType) and isinstance(_leaf_type(t), numeric))
            )

        fields = [T.StructField(output_col, T.BinaryType(), False)]
        if "label" in sig.inputs:
            extra["label_col"] = label_col
    if top_k is not None and kind not in ("images", "features", "examples"):
        raise ValueError(f"top_k applies to classifiers; {sig.describe()} is not one")
    col = input_col or default_col
    plan = _Plan(
        kind=kind,
        model_uri=info.uri,
        fingerprint=info.fingerprint,
        signature=sig.name,
        input_col=col,
        input_key=key,
        shape=shape,
        batch_size=batch_size,
        outputs=tuple(f.name for f in fields),
        top_k=top_k,
        lm_output=lm_output,
        vocab_size=vocab,
        id_col="id" if "id" in schema.names else None,
        **extra,
    )
    _check_column(schema, col, plan.contract(), accepts)
    if plan.label_col is not None:
        _check_column(
            schema,
            plan.label_col,
            "an integer class label per row (int64)",
            _is_integral,
            role="label",
        )
    clash = [f.name for f in fields if f.name in schema.names]
    if clash:
        raise PredictInputError(
            f"output column(s) {clash} already exist in the input DataFrame: rename them or "
            "choose other names (output_col=, probabilities_col=, log_probabilities_col=)"
        )
    if len({f.name for f in fields}) != len(fields):
        raise ValueError(f"output column names collide: {[f.name for f in fields]}")
    return plan, fields


# ----------------------------------------------------------------------------- public API


def predict(
    df: DataFrame,
    model: str | os.PathLike,
    *,
    input_col: str | None = None,
    output_col: str = "prediction",
    probabilities_col: str = "probabilities",
    log_probabilities_col: str = "log_probabilities",
    batch_size: int = 128,
    signature: str | None = None,
    top_k: int | None = None,
    lm_output: str = "perplexity",
    label_col: str = "label",
    keep_columns: Sequence[str] | None = None,
) -> DataFrame:
    """Applies the SavedModel ``model`` to every row of ``df``; returns ``df``'s columns plus
    the predictions (lazily: nothing runs until an action).

    ``keep_columns``: the columns of ``df`` returned beside the predictions, in this order
    (default: all of them). Only the model's input column(s), ``id`` (it names rows in error
    messages) and these columns travel to the Python workers, and only these columns and
    the predictions travel back: pass e.g. ``keep_columns=["id"]`` when the images
    themselves are not needed in the result (``select`` after ``predict`` does not prune
    what ``mapInArrow`` sends).

    ``model``: a SavedModel directory, local or ``hdfs://``; or ``MODEL_DIR/export`` (or
    ``MODEL_DIR``), whose highest numbered version is used. A missing model raises
    :class:`ModelNotFoundError` naming it, before any Spark job starts. A local path must
    be visible to every executor (same machine or a shared file system); on a cluster use
    ``hdfs://``, which each machine copies once into :func:`model_cache_dir`.

    The signature used is ``signature``, else ``predict_images`` or ``predict_features`` when
    the model has it, else ``serving_default``. What the signature looks like decides the data
    contract:

    * **Image classifier**, uint8 images ``[B, H, W, C]`` -> ``classes``, ``scores``
      (``predict_images``). ``input_col`` (default ``"image"``) holds one image per row as

      - ``binary``: ``np.save`` bytes of an array of shape (H, W, C) or (H*W*C,) (what
        petastorm's NdarrayCodec stores; ``np.savez_compressed`` bytes of its
        CompressedNdarrayCodec are read too, more slowly), or exactly H*W*C raw bytes
        (row-major uint8); values that start with the ``np.save`` magic are read as
        ``np.save`` bytes;
      - ``array<int>`` (any integer type, flat of H*W*C values or nested (H, W, C)), with
        values in [0, 255].

      Adds ``output_col`` (``long``, the class), ``probabilities_col`` (``array<float>``,
      one probability per class) and, with ``top_k=k``, ``top_classes`` (``array<long>``)
      and ``top_probabilities`` (``array<float>``), the k best, best first.
    * **Classifier on float features**, float32 ``[B, *shape]`` -> ``classes``, ``scores``
      (``predict_features``, a user's model: :mod:`sparktf.models.custom`). ``input_col``
      (default ``"features"``) holds per row an ``array<float|double|int>`` (flat or nested
      to ``shape``), a Spark ML ``Vector`` (dense or sparse, e.g. ``VectorAssembler``'s
      output; it is read through ``vector_to_array`` and kept in the result) or ``np.save``
      bytes. Same added columns as the image classifier.
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

    Errors: a missing input column, a Spark type that cannot hold the input, or an output
    column that already exists raise :class:`PredictInputError` here. Shapes, dtypes, nulls
    and value ranges are checked on the executors batch by batch, before the model runs;
    the first bad batch fails the Spark action with ``PredictInputError: column '...':
    ...`` in the exception text, naming the row (by ``id`` when ``df`` has that column) and
    the expected shape. An empty DataFrame gives an empty result (the model is not loaded).

    Execution: ``mapInArrow`` over each partition's Arrow batches (of the columns named
    above only), cut into ``batch_size`` rows per model call; the outputs of one Arrow batch
    go back as one batch (cut at about 8 MiB of outputs). The model is loaded once per
    Python worker (:class:`ModelCache`)
    and reused by every later task of that worker, which needs
    ``spark.python.worker.reuse=true`` (Spark's default; see ModelCache). TensorFlow in a
    worker uses as many threads as the task has CPUs (``spark.task.cpus``), or
    ``$SPARKTF_TF_THREADS``. The executors must be able to import ``sparktf``.
    """
    if not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}")
    if isinstance(keep_columns, str):
        raise TypeError(f"keep_columns must be a sequence of column names, got {keep_columns!r}")
    kept = list(df.columns) if keep_columns is None else list(dict.fromkeys(keep_columns))
    unknown = [c for c in kept if c not in df.columns]
    if unknown:
        raise PredictInputError(
            f"keep_columns {unknown} are not columns of the input DataFrame (it has {df.columns})"
        )
    info = inspect_model(model)
    sig = _choose_signature(info, signature)
    vector_col = None
    col = input_col or ("features" if _kind(sig) == "features" else None)
    if col is not None and col in df.schema.names and _is_vector(df.schema[col].dataType):
        # A Spark ML Vector (VectorAssembler): fed as array<float> under the column's own
        # name (so errors name it); the Vector itself comes back in the result.
        from pyspark.ml.functions import vector_to_array
        from pyspark.sql import functions as F

        vector_col = f"__sparktf_vector_{col}"
        df = df.withColumnRenamed(col, vector_col).withColumn(
            col, vector_to_array(F.col(vector_col), "float32")
        )
    plan, fields = _make_plan(
        df.schema,
        info,
        sig,
        input_col=input_col,
        output_col=output_col,
        probabilities_col=probabilities_col,
        log_probabilities_col=log_probabilities_col,
        batch_size=batch_size,
        top_k=top_k,
        lm_output=lm_output,
        label_col=label_col,
    )
    T = _spark_types()
    log.info(
        "predict with %s (version %s), signature %s, input column %r, batch size %d",
        info.uri,
        info.version,
        sig.describe(),
        plan.input_col,
        batch_size,
    )
    # Only what the model reads, what names rows in errors and what is kept goes to Python;
    # only the kept columns and the predictions come back.
    keep = [vector_col if c == col and vector_col is not None else c for c in kept]
    needed = [plan.input_col, plan.label_col, plan.id_col, *keep]
    sent = df.select(*(_column(c) for c in dict.fromkeys(c for c in needed if c is not None)))
    plan = dataclasses.replace(plan, keep=tuple(keep))
    schema = T.StructType([sent.schema[c] for c in keep] + fields)
    out = sent.mapInArrow(functools.partial(_predict_partition, plan), schema)
    if vector_col is not None and vector_col in keep:
        out = out.withColumnRenamed(vector_col, col)
    if keep != kept:
        out = out.select(*(_column(c) for c in [*kept, *(f.name for f in fields)]))
    return out


def _column(name: str) -> Any:
    """The top-level column ``name`` (a dot or backtick in it is part of the name)."""
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


# ----------------------------------------------------------------------------- executors


class ModelCache:
    """SavedModel signatures loaded in this Python process, keyed by model fingerprint.

    A Spark Python worker imports this module once and keeps it between tasks only when
    ``spark.python.worker.reuse`` is true (the default); with reuse off every task starts a
    fresh worker and loads the model again (the local copy of an HDFS model is still made
    once per machine). Spark also stops a worker that stays idle for about a minute, which
    empties its cache. Each cached model holds its variables in the worker's memory (on
    top of the executor's JVM memory: budget ``spark.executor.memoryOverhead`` or
    ``spark.executor.pyspark.memory`` for it); at most ``capacity`` models are kept.
    """

    capacity = 2
    _models: OrderedDict[tuple[str, str], _LoadedSignature] = OrderedDict()
    _lock = threading.Lock()
    # Per model fingerprint: "loads", "uses" (one per partition), "batches", "copies".
    stats: defaultdict[str, Counter[str]] = defaultdict(Counter)

    @classmethod
    def get(cls, model_uri: str, fingerprint: str, signature: str) -> _LoadedSignature:
        key = (fingerprint, signature)
        with cls._lock:
            cls.stats[fingerprint]["uses"] += 1
            if key in cls._models:
                cls._models.move_to_end(key)
                return cls._models[key]
            loaded = _LoadedSignature(model_uri, fingerprint, signature)
            cls.stats[fingerprint]["loads"] += 1
            cls._models[key] = loaded
            while len(cls._models) > cls.capacity:
                cls._models.popitem(last=False)
            return loaded


def model_cache_dir() -> str:
    """Where executors keep local copies of HDFS models: ``$SPARKTF_MODEL_CACHE_DIR``, else
    ``<tempdir>/sparktf-models-<uid>`` (one per user: the directory must be private)."""
    path = os.environ.get("SPARKTF_MODEL_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), f"sparktf-models-{os.geteuid()}"
    )
    return os.path.abspath(path)  # no trailing "/": lstat must see a symbolic link itself


def _private_cache_dir() -> str:
    """:func:`model_cache_dir`, created 0700 if missing; ModelCacheError unless it is a real
    directory owned by this user that no one else can write (another user could otherwise
    plant a model that every later prediction would load)."""
    base = model_cache_dir()
    problem = paths.private_dir_problem(base)
    if problem:
        raise ModelCacheError(
            f"model cache directory {base} {problem}: refusing to use it, since a model "
            "placed there would be loaded and run. Remove it, or set "
            "SPARKTF_MODEL_CACHE_DIR to a directory only this user can write"
        )
    return base


def _open_lock(path: str) -> int:
    """The lock file at ``path``, opened without following a symbolic link (0600 if new)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o600)
    except OSError as exc:
        if os.path.islink(path):
            raise ModelCacheError(
                f"model cache lock file {path} is a symbolic link: refusing to follow it; remove it"
            ) from exc
        raise


def _verified(path: str, fingerprint: str) -> bool:
    """Whether the local copy at ``path`` exists and matches ``fingerprint``."""
    if not os.path.isfile(os.path.join(path, "saved_model.pb")):
        return False
    try:
        return model_fingerprint(path) == fingerprint
    except (OSError, storage.StorageError):  # being replaced by another worker
        return False


def _local_model_dir(model_uri: str, fingerprint: str) -> str:
    """A local directory holding the model: itself when local, else a copy made once per
    machine in the user's private cache (a lock file serialises the workers of all
    executors on it). A copy is used only when its contents match ``fingerprint``; a copy
    that does not (tampered, truncated) is replaced by a fresh one."""
    loc = storage.parse(model_uri)
    if loc.scheme == "file":
        if not os.path.isfile(os.path.join(loc.path, "saved_model.pb")):
            raise ModelNotFoundError(
                f"model {loc.path} is not on this executor's file system: on a cluster, give "
                "an hdfs:// model or a path that every executor sees"
            )
        return loc.path
    base = _private_cache_dir()
    target = os.path.join(base, fingerprint[:32])
    if _verified(target, fingerprint):
        return target
    lock = _open_lock(target + ".lock")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _verified(target, fingerprint):
            return target
        # Holding the lock, any partial copy of this model is a crashed worker's leftover.
        for name in os.listdir(base):
            if name.startswith(f"{fingerprint[:32]}.tmp-"):
                shutil.rmtree(os.path.join(base, name), ignore_errors=True)
        if os.path.lexists(target):
            log.warning(
                "the cached copy %s of model %s does not match its fingerprint: "
                "copying the model again",
                target,
                model_uri,
            )
        partial = tempfile.mkdtemp(prefix=f"{fingerprint[:32]}.tmp-", dir=base)
        try:
            copy = os.path.join(partial, "model")
            storage.copy_tree(model_uri, copy)
            if model_fingerprint(copy) != fingerprint:
                raise ModelCacheMismatchError(
                    f"the copy of model {model_uri} made on this executor does not match the "
                    "model the driver read (it changed since predict() was called?): "
                    "predict again"
                )
            if os.path.lexists(target):  # the rejected copy: out of the way, then deleted
                stale = os.path.join(partial, "stale")
                os.rename(target, stale)
            os.rename(copy, target)  # atomic: a complete, verified copy or none
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        ModelCache.stats[fingerprint]["copies"] += 1
        log.info("copied model %s to %s", model_uri, target)
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        os.close(lock)
    return target


def _configure_tensorflow_threads() -> None:
    import tensorflow as tf

    threads = os.environ.get("SPARKTF_TF_THREADS")
    if threads is None:
        from pyspark import TaskContext

        context = TaskContext.get()
        threads = context.cpus() if context is not None else 0
    try:
        tf.config.threading.set_intra_op_parallelism_threads(int(threads))
        tf.config.threading.set_inter_op_parallelism_threads(int(threads))
    except RuntimeError:  # TensorFlow already initialised in this process: keep its setting
        pass


class _LoadedSignature:
    """One signature of a loaded SavedModel, called with numpy arrays."""

    def __init__(self, model_uri: str, fingerprint: str, signature: str):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        _configure_tensorflow_threads()
        import tensorflow as tf

        self._tf = tf
        # The loaded root owns the variables: keep it as long as its signature is used.
        self._root = tf.saved_model.load(_local_model_dir(model_uri, fingerprint))
        self._fn = self._root.signatures[signature]

    def __call__(self, **inputs: np.ndarray) -> dict[str, np.ndarray]:
        tensors = {k: self._tf.constant(v) for k, v in inputs.items()}
        return {k: v.numpy() for k, v in self._fn(**tensors).items()}


# Outputs of one input Arrow batch are sent back as one batch, cut when they pass this many
# bytes (a language model's next-word log-probabilities are V floats per row).
OUTPUT_BATCH_BYTES = 8 << 20


def _predict_partition(plan: _Plan, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The ``mapInArrow`` function: decode and check, run the model ``batch_size`` rows at a
    time, and send the kept columns with the outputs back, one Arrow batch per input batch
    (fewer, larger batches cost less on both sides of the Arrow stream)."""
    import pyarrow as pa

    model = None
    for batch in batches:
        keep = list(batch.schema.names) if plan.keep is None else list(plan.keep)
        names = keep + list(plan.outputs)
        parts: list[list[pa.Array]] = []
        size = first = 0
        for start in range(0, batch.num_rows, plan.batch_size):
            chunk = batch.slice(start, plan.batch_size)
            inputs = _decode(plan, chunk)  # input errors surface before the model loads
            if model is None:
                model = ModelCache.get(plan.model_uri, plan.fingerprint, plan.signature)
            columns = _run(plan, model, inputs, chunk.num_rows)
            ModelCache.stats[plan.fingerprint]["batches"] += 1
            parts.append(columns)
            size += sum(c.nbytes for c in columns)
            end = start + chunk.num_rows
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


# ----------------------------------------------------------------------------- decoding


class _Rows:
    """Names rows in error messages: by the ``id`` column when there is one."""

    def __init__(self, plan: _Plan, chunk: pa.RecordBatch):
        self._ids = chunk.column(chunk.schema.get_field_index(plan.id_col)) if plan.id_col else None

    def __call__(self, i: int) -> str:
        if self._ids is not None:
            return f"the row with id={self._ids[i].as_py()}"
        return f"row {i} of its batch"


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
        if rows.shape[1:] == (size,):
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


def _decode(plan: _Plan, chunk: pa.RecordBatch) -> dict[str, Any]:
    """The model inputs of one chunk, checked against the plan."""
    row = _Rows(plan, chunk)
    contract = plan.contract()
    col = plan.input_col
    if plan.kind == "images":
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
        return {plan.input_key: images}
    if plan.kind == "features":
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
        return {plan.input_key: values.astype(np.float32, copy=False)}
    if plan.kind == "examples":
        arr = chunk.column(chunk.schema.get_field_index(col))
        _check_nulls(arr, col, contract, row)
        return {plan.input_key: np.asarray(arr.to_pylist(), dtype=object)}
    if plan.kind == "tokens":
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
            return {"groups": [(np.arange(len(rows)), tokens)]}
        groups = []
        lengths = np.array([len(s) for s in seqs])
        for length in np.unique(lengths):
            index = np.flatnonzero(lengths == length)
            block = np.stack([seqs[i] for i in index])
            sub = lambda j, _index=index: row(int(_index[j]))  # noqa: E731
            groups.append(
                (index, _integers(block, 0, plan.vocab_size, np.int64, col, contract, sub))
            )  # type: ignore[arg-type]
        return {"groups": groups}
    # generator
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


# ----------------------------------------------------------------------------- outputs


def _list_array(matrix: np.ndarray) -> pa.Array:
    import pyarrow as pa

    n, m = matrix.shape
    offsets = np.arange(0, (n + 1) * m, m, dtype=np.int64)
    if offsets[-1] >= 2**31:
        raise ValueError(
            f"an output of {n} x {m} values is too large for one Arrow batch; lower batch_size"
        )
    return pa.ListArray.from_arrays(
        pa.array(offsets.astype(np.int32)), pa.array(np.ascontiguousarray(matrix).reshape(-1))
    )


def _run(plan: _Plan, model: _LoadedSignature, inputs: dict[str, Any], n: int) -> list[pa.Array]:
    import pyarrow as pa

    if plan.kind in ("images", "features", "examples"):
        out = model(**inputs)
        scores = out["scores"].astype(np.float32, copy=False)
        columns = [pa.array(out["classes"].astype(np.int64, copy=False)), _list_array(scores)]
        if plan.top_k is not None:
            best = np.argsort(-scores, axis=1, kind="stable")[:, : plan.top_k]
            columns += [
                _list_array(best.astype(np.int64)),
                _list_array(np.take_along_axis(scores, best, axis=1)),
            ]
        return columns
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
