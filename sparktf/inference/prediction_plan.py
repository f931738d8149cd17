"""The driver's plan of a prediction: which signature, how its input is fed, what it adds.

:func:`choose_signature` picks the signature, :func:`signature_kind` tells what kind of model
it serves, and :func:`make_plan` checks the DataFrame's schema against it and returns the
:class:`Plan` the executors follow (pickled into each task) with the Spark fields of the
added columns.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from sparktf.datasets.columns import is_integral, is_numeric_array, leaf_type, spark_types
from sparktf.errors import SparktfError, SparktfValueError
from sparktf.inference.output_columns import Output, plan_outputs
from sparktf.inference.saved_model import ExportInfo, Signature, TensorSpec

if TYPE_CHECKING:  # pragma: no cover - typing only
    from pyspark.sql.types import StructField, StructType

__all__ = [
    "CLASSIFIER_KINDS",
    "LM_OUTPUTS",
    "NamedInput",
    "Plan",
    "PredictInputError",
    "choose_signature",
    "make_plan",
    "signature_kind",
]

LM_OUTPUTS = ("perplexity", "next_word")
# The dtypes of a named input (any signature's input, fed from a column).
NAMED_DTYPES = (
    "float16",
    "float32",
    "float64",
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "bool",
    "string",
)
# The kinds of signature that map an input to ``classes`` and ``scores``.
CLASSIFIER_KINDS = ("images", "features", "examples")


class PredictInputError(SparktfError, ValueError):
    """The input DataFrame does not match what the model's signature expects.

    Raised on the driver when the schema shows it (a missing column, a wrong Spark type),
    otherwise on the executor at the first batch that shows it (wrong shape or dtype,
    nulls, values out of range); Spark then fails the action, and its exception text holds
    ``PredictInputError: column '...': ...``.
    """


class NamedInput(NamedTuple):
    """One input of a signature fed from a column: the signature's ``key``, the ``column``,
    the ``dtype`` and the per-row ``shape``."""

    key: str
    column: str
    dtype: str
    shape: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything an executor needs, decided on the driver (pickled into the task)."""

    # "images", "features", "examples", "values", "tokens", "generator"; "named": any other
    # signature, each input fed from a column
    kind: str
    export_uri: str
    fingerprint: str
    signature: str
    input_col: str
    input_key: str  # the signature's input name
    shape: tuple[int, ...]  # per-row shape expected: (H, W, C), (z_dim,) or ()
    batch_size: int
    outputs: tuple[str, ...]  # names of the added columns, in order
    top_k: int | None = None
    # a classifier: its rawPrediction column, the log of each probability, is added
    raw_prediction: bool = False
    lm_output: str = "perplexity"
    vocab_size: int | None = None
    label_col: str | None = None  # conditional generator
    id_col: str | None = None  # used to name rows in error messages
    keep: tuple[str, ...] | None = None  # input columns returned beside the outputs (None: all)
    # "named": each input of the signature and the column that feeds it
    named: tuple[NamedInput, ...] = ()
    # "named" other than a classifier's or ``predictions``: the outputs served, a column
    # each, or the fields of one struct column ``struct_col``
    typed: tuple[Output, ...] = ()
    struct_col: str | None = None

    @staticmethod
    def named_contract(dtype: str, shape: tuple[int, ...]) -> str:
        """What the column of a named input of ``dtype`` and ``shape`` must hold."""
        if dtype == "string":
            return "a string (or binary) per row"
        if dtype == "bool":
            return "a boolean per row"
        what = "an integer" if dtype.startswith(("int", "uint")) else "a number"
        if not shape:
            return f"{what} per row ({dtype})"
        size = math.prod(shape)
        one = f", or {what} per row" if size == 1 else ""
        return (
            f"{size} {dtype} values of shape {shape} per row: an array of numbers (flat or "
            f"nested), a Spark ML Vector or np.save bytes{one}"
        )

    def contract(self) -> str:
        """What the input column must hold, for error messages."""
        if self.kind == "named":
            return self.named_contract(self.named[0].dtype, self.named[0].shape)
        if self.kind == "images":
            h, w, c = self.shape
            return (
                f"a uint8 image of shape ({h}, {w}, {c}) per row: np.save bytes (as "
                f"petastorm's NdarrayCodec writes), {h * w * c} raw bytes, or an array of "
                f"{h * w * c} integers in [0, 255]"
            )
        if self.kind in ("features", "values"):
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


def choose_signature(info: ExportInfo, signature: str | None) -> Signature:
    """``signature`` of the model, else the first it has of ``predict_images``,
    ``predict_features`` and ``serving_default``; ValueError naming the model's signatures
    when there is none."""
    if signature is not None:
        if signature not in info.signatures:
            raise SparktfValueError(
                f"model {info.uri} has no signature {signature!r}; it has {sorted(info.signatures)}"
            )
        return info.signatures[signature]
    for name in ("predict_images", "predict_features", "serving_default"):
        if name in info.signatures:
            return info.signatures[name]
    raise SparktfValueError(
        f"model {info.uri} has neither a predict_images, a predict_features nor a serving_default "
        f"signature (it has {sorted(info.signatures)}); pass signature="
    )


def _fixed_rank(spec: TensorSpec, rank: int | None = None, least: int | None = None) -> bool:
    """The shape is known, of this rank (or at least ``least``), every non-batch dim fixed."""
    if spec.shape is None:
        return False
    if rank is not None and len(spec.shape) != rank:
        return False
    if least is not None and len(spec.shape) < least:
        return False
    return all(d is not None for d in spec.shape[1:])


def signature_kind(sig: Signature, *, served: bool = False) -> str:
    """What a signature serves, from its inputs and outputs: ``images``, ``features`` or
    ``examples`` (classifiers), ``values`` (float features -> float ``predictions``: a
    regression or multi-label model), ``tokens`` (a language model), ``generator``, or
    ``named`` for any other signature whose inputs columns can feed and whose outputs
    columns can hold (:func:`feed_problem`); ValueError naming the input or output that
    cannot be. ``served``: the caller asks for the outputs as they are (``outputs=``,
    ``struct_col=``): ``named`` for any signature columns can feed."""
    ins, outs = sig.inputs, sig.outputs
    if served:
        return _named_or_raise(sig)
    one = next(iter(ins.values())) if len(ins) == 1 else None
    if {"classes", "scores"} <= set(outs) and one is not None:
        if one.dtype == "uint8" and _fixed_rank(one, rank=4):
            return "images"
        if one.dtype in ("float32", "float64") and _fixed_rank(one, least=2):
            return "features"
        if one.dtype == "string" and one.shape is not None and len(one.shape) == 1:
            return "examples"
    if (
        one is not None
        and one.dtype in ("float32", "float64")
        and _fixed_rank(one, least=2)
        and _values_output(outs)
    ):
        return "values"
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
    return _named_or_raise(sig)


def _named_or_raise(sig: Signature) -> str:
    problem = feed_problem(sig)
    if problem is not None:
        raise SparktfValueError(
            f"sparktf.predict cannot serve signature {sig.describe()}: {problem}. It feeds "
            "each input from a column (a number, a boolean or a string per row, or an array "
            "of numbers of fixed shape); pass signature= to choose another signature"
        )
    return "named"


def feed_problem(sig: Signature) -> str | None:
    """Why columns cannot feed ``sig``'s inputs (naming the input), or None when they can
    (the outputs are checked when they are chosen:
    :func:`~sparktf.inference.output_columns.plan_outputs`)."""
    if not sig.inputs:
        return "it has no inputs"
    if not sig.outputs:
        return "it has no outputs"
    for key, spec in sorted(sig.inputs.items()):
        if spec.dtype not in NAMED_DTYPES:
            return f"input {key!r} has dtype {spec.dtype}, which no column feeds"
        if not _fixed_rank(spec, least=1):
            return f"input {key!r} ({spec.describe()}) has a dimension of unknown size"
        if spec.dtype in ("string", "bool") and len(spec.shape) != 1:
            return f"input {key!r} ({spec.describe()}) is not one {spec.dtype} per row"
    return None


def _values_output(outs: dict[str, TensorSpec]) -> bool:
    """Float ``predictions`` of one value or one vector per row."""
    predictions = outs.get("predictions")
    return (
        set(outs) == {"predictions"}
        and predictions.dtype in ("float32", "float64")
        and _fixed_rank(predictions, least=1)
        and len(predictions.shape) <= 2
    )


def _is_binary(dtype: Any) -> bool:
    return isinstance(dtype, spark_types().BinaryType)


def _is_int_array(dtype: Any) -> bool:
    return isinstance(dtype, spark_types().ArrayType) and is_integral(leaf_type(dtype))


@dataclasses.dataclass(frozen=True)
class _Layout:
    """How one kind of signature is fed and what it adds: the per-row input shape, the
    default input column, the Spark types accepted there and the added fields."""

    shape: tuple[int, ...]
    default_col: str
    accepts: Callable[[Any], bool]
    fields: list[StructField]
    vocab_size: int | None = None
    label_col: str | None = None


def _classifier_layout(
    kind: str,
    sig: Signature,
    spec: TensorSpec,
    output_col: str,
    probability_col: str,
    raw_prediction_col: str,
    top_k: int | None,
) -> _Layout:
    T = spark_types()
    num_classes = sig.outputs["scores"].shape[-1] if sig.outputs["scores"].shape else None
    if top_k is not None and (top_k < 1 or (num_classes is not None and top_k > num_classes)):
        raise SparktfValueError(f"top_k must be in [1, {num_classes}], got {top_k}")
    accepts: Callable[[Any], bool] = {
        "images": lambda t: _is_binary(t) or _is_int_array(t),
        "features": lambda t: _is_binary(t) or is_numeric_array(t),
    }.get(kind, _is_binary)
    fields = [
        T.StructField(output_col, T.LongType(), False),
        T.StructField(probability_col, T.ArrayType(T.FloatType(), False), False),
    ]
    if raw_prediction_col:
        fields.append(T.StructField(raw_prediction_col, T.ArrayType(T.FloatType(), False), False))
    if top_k is not None:
        fields += [
            T.StructField("top_classes", T.ArrayType(T.LongType(), False), False),
            T.StructField("top_probabilities", T.ArrayType(T.FloatType(), False), False),
        ]
    return _Layout(
        shape=tuple(spec.shape[1:]) if kind in ("images", "features") else (),
        default_col={"images": "image", "features": "features"}.get(kind, "example"),
        accepts=accepts,
        fields=fields,
    )


def _values_layout(sig: Signature, spec: TensorSpec, output_col: str) -> _Layout:
    """Float features -> ``predictions``: a double per row, or ``array<float>`` per row."""
    T = spark_types()
    scalar = len(sig.outputs["predictions"].shape) == 1
    dtype = T.DoubleType() if scalar else T.ArrayType(T.FloatType(), False)
    return _Layout(
        shape=tuple(spec.shape[1:]),
        default_col="features",
        accepts=lambda t: _is_binary(t) or is_numeric_array(t),
        fields=[T.StructField(output_col, dtype, False)],
    )


def _outputs_layout(typed: tuple[Output, ...], struct_col: str | None) -> _Layout:
    """Outputs as they are: a column each (:mod:`~sparktf.inference.output_columns`), or the
    fields of one struct column ``struct_col``."""
    T = spark_types()
    fields = [T.StructField(o.column, o.spark_type(), False) for o in typed]
    if struct_col is not None:
        names = [f.name for f in fields]
        if len(set(names)) != len(names):
            raise SparktfValueError(f"output column names collide: {names}")
        fields = [T.StructField(struct_col, T.StructType(fields), False)]
    return _Layout(shape=(), default_col="features", accepts=lambda t: True, fields=fields)


def _named_accepts(spec: TensorSpec) -> Callable[[Any], bool]:
    """The Spark types that can feed a named input of ``spec``."""
    T = spark_types()
    if spec.dtype == "string":
        return lambda t: isinstance(t, (T.StringType, T.BinaryType))
    if spec.dtype == "bool":
        return lambda t: isinstance(t, T.BooleanType)
    integer = spec.dtype.startswith(("int", "uint"))
    scalar: Callable[[Any], bool] = (
        is_integral if integer else (lambda t: isinstance(t, T.NumericType))
    )
    if len(spec.shape) > 1:
        if math.prod(spec.shape[1:]) == 1:  # [B, 1]: also a number per row
            return lambda t: _is_binary(t) or is_numeric_array(t) or scalar(t)
        return lambda t: _is_binary(t) or is_numeric_array(t)
    return scalar


def _language_model_layout(
    sig: Signature, output_col: str, log_probabilities_col: str, lm_output: str
) -> _Layout:
    T = spark_types()
    if lm_output not in LM_OUTPUTS:
        raise SparktfValueError(f"lm_output must be one of {LM_OUTPUTS}, got {lm_output!r}")
    if lm_output == "perplexity":
        fields = [T.StructField(output_col, T.DoubleType(), False)]
    else:
        fields = [
            T.StructField(output_col, T.LongType(), False),
            T.StructField(log_probabilities_col, T.ArrayType(T.FloatType(), False), False),
        ]
    return _Layout(
        shape=(),
        default_col="tokens",
        accepts=lambda t: _is_binary(t) or _is_int_array(t),
        fields=fields,
        vocab_size=sig.outputs["log_probs"].shape[-1] if sig.outputs["log_probs"].shape else None,
    )


def _generator_layout(sig: Signature, spec: TensorSpec, output_col: str, label_col: str) -> _Layout:
    T = spark_types()
    return _Layout(
        shape=(int(spec.shape[1]),),
        default_col="z",
        accepts=lambda t: _is_binary(t) or is_integral(t) or is_numeric_array(t),
        fields=[T.StructField(output_col, T.BinaryType(), False)],
        label_col=label_col if "label" in sig.inputs else None,
    )


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


def _check_schema(schema: StructType | None, plan: Plan, layout: _Layout) -> None:
    """The input (and label) columns exist with a type that can hold them; the added
    columns clash neither with the input's nor with each other (``schema`` None: a UDF's
    arguments, checked batch by batch only)."""
    fields = layout.fields
    if len({f.name for f in fields}) != len(fields):
        raise SparktfValueError(f"output column names collide: {[f.name for f in fields]}")
    if schema is None:
        return
    _check_column(schema, plan.input_col, plan.contract(), layout.accepts)
    if plan.label_col is not None:
        _check_column(
            schema,
            plan.label_col,
            "an integer class label per row (int64)",
            is_integral,
            role="label",
        )
    clash = [f.name for f in fields if f.name in schema.names]
    if clash:
        raise PredictInputError(
            f"output column(s) {clash} already exist in the input DataFrame: rename them or "
            "choose other names (output_col=, probability_col=, raw_prediction_col=, "
            "log_probabilities_col=, outputs={name: column}, struct_col=)"
        )


def make_plan(
    schema: StructType | None,
    info: ExportInfo,
    sig: Signature,
    *,
    input_col: str | None,
    output_col: str,
    probability_col: str,
    log_probabilities_col: str,
    batch_size: int,
    top_k: int | None,
    lm_output: str,
    label_col: str,
    raw_prediction_col: str = "",
    id_col: str = "id",
    inputs: Mapping[str, str] | None = None,
    outputs: Mapping[str, str] | Sequence[str] | None = None,
    struct_col: str | None = None,
    binary_outputs: Sequence[str] = (),
) -> tuple[Plan, list[StructField]]:
    """The plan of feeding ``sig`` of the model ``info`` from a DataFrame of ``schema``, and
    the Spark fields of the columns it adds (the arguments are :func:`predict`'s; ``schema``
    None: the arguments of a UDF, whose columns are checked batch by batch only).

    Raises :class:`PredictInputError` when the schema cannot feed the signature or an added
    column exists already, ValueError for a signature it cannot feed or an argument out of
    range (``top_k``, ``lm_output``, an unknown input or output)."""
    served = outputs is not None or struct_col is not None or bool(binary_outputs)
    kind = signature_kind(sig, served=served)
    inputs = dict(inputs or {})
    _check_inputs_known(sig, inputs)
    key, spec = next(
        ((k, v) for k, v in sig.inputs.items() if k != "label"), next(iter(sig.inputs.items()))
    )
    named: tuple[NamedInput, ...] = ()
    typed: tuple[Output, ...] = ()
    if kind == "named":
        named = _named_inputs(sig, inputs, input_col)
        key, spec = named[0].key, sig.inputs[named[0].key]
        classifier = {"classes", "scores"} <= set(sig.outputs) and not served
        if classifier:
            layout = _classifier_layout(
                kind, sig, spec, output_col, probability_col, raw_prediction_col, top_k
            )
        elif _values_output(sig.outputs) and not served:
            layout = _values_layout(sig, spec, output_col)
        else:  # outputs as they are: a column each, or one struct
            typed = plan_outputs(sig, outputs, binary_outputs)
            layout = _outputs_layout(typed, struct_col)
        layout = dataclasses.replace(
            layout, default_col=named[0].column, accepts=_named_accepts(spec)
        )
        input_col = None
    else:
        if inputs:  # one of sparktf's own kinds reads one column
            if set(inputs) != {key} or input_col is not None:
                raise SparktfValueError(
                    f"signature {sig.describe()} reads {key!r} from one column: pass "
                    f"input_col= (or inputs={{{key!r}: column}})"
                )
            input_col = inputs[key]
        classifier = kind in CLASSIFIER_KINDS
        layout = _kind_layout(
            kind,
            sig,
            spec,
            (output_col, probability_col, raw_prediction_col, log_probabilities_col, label_col),
            top_k,
            lm_output,
        )
    _check_top_k(top_k, kind, sig, served_as_is=bool(typed))
    plan = Plan(
        kind=kind,
        export_uri=info.uri,
        fingerprint=info.fingerprint,
        signature=sig.name,
        input_col=input_col or layout.default_col,
        input_key=key,
        shape=layout.shape,
        batch_size=batch_size,
        outputs=tuple(f.name for f in layout.fields),
        top_k=top_k,
        raw_prediction=classifier and bool(raw_prediction_col),
        lm_output=lm_output,
        vocab_size=layout.vocab_size,
        label_col=layout.label_col,
        id_col=id_col if schema is not None and id_col in schema.names else None,
        named=named,
        typed=typed,
        struct_col=struct_col if typed else None,
    )
    _check_schema(schema, plan, layout)
    for each in named[1:] if schema is not None else ():
        _check_column(
            schema,
            each.column,
            plan.named_contract(each.dtype, each.shape),
            _named_accepts(sig.inputs[each.key]),
        )
    return plan, layout.fields


def _check_inputs_known(sig: Signature, inputs: Mapping[str, str]) -> None:
    """ValueError naming the entries of ``inputs=`` that ``sig`` has no input for."""
    unknown = [k for k in inputs if k not in sig.inputs]
    if unknown:
        raise SparktfValueError(
            f"inputs: signature {sig.describe()} has no input(s) {unknown}; it has "
            f"{sorted(sig.inputs)}"
        )


def _check_top_k(top_k: int | None, kind: str, sig: Signature, *, served_as_is: bool) -> None:
    """ValueError for ``top_k`` on what is not a classifier served as such (``served_as_is``:
    its outputs are served as they are, with ``outputs=`` or ``struct_col=``)."""
    if top_k is not None and (
        served_as_is or (kind not in CLASSIFIER_KINDS and "scores" not in sig.outputs)
    ):
        raise SparktfValueError(
            f"top_k applies to classifiers served as such (not with outputs= or struct_col=); "
            f"{sig.describe()} is not one"
        )


def _named_inputs(
    sig: Signature, inputs: dict[str, str], input_col: str | None
) -> tuple[NamedInput, ...]:
    """Each input of ``sig`` (sorted by name) and the column that feeds it: ``inputs``, else
    the column of its name; ``input_col`` for a signature of one input."""
    if input_col is not None:
        if inputs:
            raise SparktfValueError("pass input_col= or inputs=, not both")
        if len(sig.inputs) > 1:
            raise SparktfValueError(
                f"signature {sig.describe()} reads several inputs, each from a column: map "
                "them with inputs={input: column} in sparktf.predict (by default the column "
                "of each input's name) instead of input_col"
            )
        inputs = {next(iter(sig.inputs)): input_col}
    return tuple(
        NamedInput(k, inputs.get(k, k), v.dtype, tuple(v.shape[1:]))
        for k, v in sorted(sig.inputs.items())
    )


def _kind_layout(
    kind: str,
    sig: Signature,
    spec: TensorSpec,
    columns: tuple[str, str, str, str, str],
    top_k: int | None,
    lm_output: str,
) -> _Layout:
    """The layout of one of sparktf's own kinds (not ``named``); ``columns``: the output,
    probability, raw prediction, log-probabilities and label columns."""
    output_col, probability_col, raw_prediction_col, log_probabilities_col, label_col = columns
    if kind in CLASSIFIER_KINDS:
        return _classifier_layout(
            kind, sig, spec, output_col, probability_col, raw_prediction_col, top_k
        )
    if kind == "values":
        return _values_layout(sig, spec, output_col)
    if kind == "tokens":
        return _language_model_layout(sig, output_col, log_probabilities_col, lm_output)
    return _generator_layout(sig, spec, output_col, label_col)
