"""Bring your own model: a user's Keras builder trained, exported and served like the book's.

A *build function* makes the network::

    def build(input_shape, num_classes, hidden_units=32):      # keyword defaults: config keys
        inputs = keras.Input(input_shape)
        x = keras.layers.Dense(hidden_units, activation="relu")(inputs)
        return keras.Model(inputs, keras.layers.Dense(num_classes)(x))   # logits

It takes the per-row input shape (a tuple), the number of outputs and its own keyword
arguments, and returns a :class:`keras.Model` from float32 inputs ``[B, *input_shape]`` to
outputs ``[B, num_outputs]`` (a scalar regression or binary model may return ``[B]``): for
a classifier ``num_classes`` logits, for a binary model one logit, for a multi-label model
one logit per label, for a regression model the label's size (1 for a scalar label). Every
keyword parameter with a default becomes a config key of the model (``--model-config`` /
``TrainConfig.model_config`` / ``TFEstimator.modelConfig`` override it). sparktf wraps it in
a task (:class:`CustomTask`): the same training loop, checkpoints, moving averages,
precision policies, evaluation and SavedModel export as the registry's models, and
``sparktf.predict`` serves the export.

Two ways to name it, anywhere a registry name goes (``TrainConfig.model``, the jobs'
``--model``, ``TFEstimator(model=...)``):

* ``sparktf.models.register("my_mlp", build, input_shape=(4,), num_classes=3, ...)`` in the
  driver program, then ``model="my_mlp"``. The registration travels with the run's plan to
  every TensorFlow process: the build function (and a ``loss`` function) is pickled *by
  value* with cloudpickle, together with what it uses from its own module; the modules it
  imports (keras, numpy, ...) must be importable on the executors.
* ``"my_pkg.module:build"``: each process imports ``my_pkg.module`` and takes ``build``, a
  build function or a :class:`CustomModel` made by :func:`custom_model` (which also sets
  the options below). The module must be importable in the driver and on every executor
  (an installed package, ``PYTHONPATH``, or Spark's ``--py-files``).

Options (:func:`register` / :func:`custom_model` keyword arguments; all but ``build_fn``,
``loss`` and ``config`` are also config keys):

* ``kind`` (default: implied by ``loss``; ``"classifier"`` when neither is given):

  - ``"classifier"``: integer class labels ``[0, num_classes)``, ``num_classes`` logits;
  - ``"binary"``: labels 0 or 1 (integer or float), one logit;
  - ``"multilabel"``: a vector of ``num_classes`` 0/1 labels per row, a logit per label;
  - ``"regression"``: float labels (a scalar or a fixed-shape vector per row), outputs of
    the label's size;
  - ``"custom"``: a loss given by name or function and nothing else assumed (float labels,
    outputs as the regression's);
* ``input_shape``, ``input_dtype``, ``num_classes``, ``feature``: the input column
  (default: ``image`` for ``uint8``, else ``features``), its per-row shape, ``"float32"``
  (a feature vector or tensor, fed as it is) or ``"uint8"`` (images, scaled by
  :class:`~sparktf.models.layers.ScaleImage` with ``scaling`` first). ``None`` (the
  default): taken from the dataset when a run is planned (the dataset's only ndarray
  column, its dtype and shape, and its label's ``num_classes``);
* ``inputs``: several named inputs instead of one (:mod:`sparktf.models.named`): a list of
  column names, whose dtypes (``float32``, ``int64`` or ``string``) and shapes are read
  from the data, or ``{name: {"dtype": ..., "shape": [...]}}``. The build function then
  takes ``{name: keras.Input}`` (instead of the input shape) and the number of outputs, and
  returns a ``keras.Model`` of that dict: a wide-and-deep model with ``StringLookup`` and
  ``Embedding`` layers inside, for instance. Its export's ``serving_default`` takes each
  input by name;
* ``outputs``: several outputs, a loss each (:mod:`sparktf.models.outputs`):
  ``{name: "mse"}`` or ``{name: {"loss": ..., "weight": ...}}``; each label is the column of
  the output's name, the build function gets ``{name: 1}`` and returns a dict of outputs;
* ``loss``: the kind's own by default: ``"sparse_categorical_crossentropy"`` (classifier,
  on logits), ``"binary_crossentropy"`` (binary and multilabel, on logits), ``"mse"``
  (regression). Any Keras loss name (``"huber"``, ``"mae"``, ``"log_cosh"``, ...) applies
  to ``(labels, outputs)`` as Keras applies it; a regression name (:data:`REGRESSION_LOSSES`)
  implies ``kind="regression"``, another name ``kind="custom"``. Or a function
  ``loss(labels, outputs) -> per-example losses [B]`` (register only: it travels with the
  plan). ``label_smoothing`` (classifier) and ``weight_decay`` as the registry's
  classifiers;
* ``metrics``: names reported per training step besides ``loss`` and by evaluation
  (:data:`STEP_METRICS` of the kind); evaluation also computes any other Keras metric name
  (``"auc"`` for a binary model, ``"mean_absolute_percentage_error"``, ...). A classifier's
  evaluation always reports loss, accuracy and top-5 accuracy; a regression model's
  defaults are ``mae`` and ``rmse``, a binary or multi-label model's ``accuracy`` and
  ``auc``;
* ``optimizer`` (a name of :data:`sparktf.models.optim.OPTIMIZERS` or ``{"name": ...,
  **keras_kwargs}``), ``learning_rate``, ``batch_size``, ``epochs``, ``max_steps`` and the
  schedule keys every task has;
* ``config``: more defaults for the build function's keyword arguments (needed for those
  without a default, or with ``**kwargs``).

Exports: a classifier with a ``uint8`` input of rank 3 gets exactly the image classifier's
signatures (``serving_default`` on serialized ``tf.train.Example`` with raw ``image`` bytes,
``predict_images``); any other model gets ``serving_default`` (a ``tf.train.Example`` with a
float list under the feature's name) and ``predict_features`` (``float32[B, *shape]``).
Classifiers and binary models give ``classes`` (int64) and ``scores`` (the probability of
each class; a binary model's ``[1 - p, p]``); multi-label models give ``predictions``, the
probability of each label; regression and custom models give ``predictions``, the outputs
as they are (``[B]`` for a scalar label).
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import logging
import math
import re
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar

import keras
import tensorflow as tf

from sparktf.errors import SparktfTypeError, SparktfValueError
from sparktf.models.classifier import ClassifierTask, check_regularisation
from sparktf.models.export import Endpoint
from sparktf.models.from_data import INPUT_DTYPES, config_from_dataset
from sparktf.models.kinds import (
    CALLABLE_LOSS,
    KINDS,
    LOSSES,
    REGRESSION_LOSSES,
    STEP_METRICS,
    KindMixin,
    check_kind_and_loss,
    check_metrics,
    kind_of,
)
from sparktf.models.layers import ScaleImage, count_params
from sparktf.models.named import NAMED_INPUT_DTYPES, NamedInputs, check_inputs
from sparktf.models.outputs import SeveralOutputs, check_outputs, outputs_config
from sparktf.models.task import (
    RegistryModel,
    add_resolver,
    task_class,
    task_names,
)

__all__ = [
    "CALLABLE_LOSS",
    "INPUT_DTYPES",
    "NAMED_INPUT_DTYPES",
    "KINDS",
    "LOSSES",
    "REGRESSION_LOSSES",
    "STEP_METRICS",
    "CustomModel",
    "CustomTask",
    "config_from_dataset",
    "custom_model",
    "dumps_by_value",
    "install_payload",
    "module_task_class",
    "plan_payload",
    "register",
    "registered",
]

logger = logging.getLogger(__name__)

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")


@dataclasses.dataclass(frozen=True)
class CustomModel:
    """A build function and its options (see the module docstring); made by
    :func:`custom_model`, entered by :func:`register`."""

    build_fn: Callable[..., keras.Model]
    kind: str | None = None
    loss: str | Callable[..., Any] | None = None
    metrics: tuple[str, ...] | None = None
    optimizer: str | Mapping[str, Any] = "adam"
    learning_rate: float = 1e-3
    input_shape: tuple[int, ...] | None = None
    input_dtype: str | None = None
    num_classes: int | None = None
    label_shape: tuple[int, ...] | None = None
    feature: str | None = None
    inputs: tuple[str, ...] | Mapping[str, Any] | None = None
    outputs: Mapping[str, Any] | None = None
    scaling: str = "unit"
    batch_size: int = 32
    epochs: int | None = 1
    max_steps: int | None = None
    config: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    description: str = ""

    def __post_init__(self) -> None:
        if not callable(self.build_fn):
            raise SparktfTypeError(f"build_fn must be callable, got {self.build_fn!r}")
        check_kind_and_loss(self.kind, self.loss)

    def defaults(self) -> dict[str, Any]:
        """The task config this model starts from."""
        optimizer = (
            {"name": self.optimizer} if isinstance(self.optimizer, str) else dict(self.optimizer)
        )
        out = {
            **_build_defaults(self.build_fn),
            **dict(self.config),
        }
        clash = sorted(set(out) & set(_TASK_KEYS))
        if clash:
            raise SparktfValueError(
                f"build function {_describe(self.build_fn)}: keyword argument(s) {clash} clash "
                "with the task's own config keys; rename them"
            )
        out.update(
            {
                "kind": self.kind,
                "input_shape": None if self.input_shape is None else list(self.input_shape),
                "input_dtype": self.input_dtype,
                "num_classes": self.num_classes,
                "label_shape": None if self.label_shape is None else list(self.label_shape),
                "feature": self.feature,
                "inputs": _inputs_config(self.inputs),
                "outputs": outputs_config(self.outputs),
                "scaling": self.scaling,
                "loss": CALLABLE_LOSS if callable(self.loss) else self.loss,
                "metrics": None if self.metrics is None else list(self.metrics),
                "optimizer": optimizer,
                "learning_rate": self.learning_rate,
                "batch_size": self.batch_size,
                "epochs": self.epochs,
                "max_steps": self.max_steps,
                "clip_norm": None,
            }
        )
        return out


def custom_model(build_fn: Callable[..., keras.Model], **options: Any) -> CustomModel:
    """A :class:`CustomModel` (the options of :func:`register`), for a module's
    ``"my_pkg.module:NAME"`` entry."""
    if options.get("metrics") is not None:
        options["metrics"] = tuple(options["metrics"])
    for key in ("input_shape", "label_shape"):
        if options.get(key) is not None:
            options[key] = tuple(int(d) for d in options[key])
    if options.get("inputs") is not None and not isinstance(options["inputs"], Mapping):
        options["inputs"] = tuple(options["inputs"])
    return CustomModel(build_fn, **options)


def _inputs_config(inputs: Sequence[str] | Mapping[str, Any] | None) -> Any:
    """``inputs`` as a config value: a list of names, or ``{name: {"dtype", "shape"}}``."""
    if inputs is None:
        return None
    if isinstance(inputs, Mapping):
        return {str(k): {"dtype": v["dtype"], "shape": list(v["shape"])} for k, v in inputs.items()}
    return [str(name) for name in inputs]


# The config keys of the task (a build function's own keyword arguments must not reuse one).
_TASK_KEYS = (
    "kind",
    "input_shape",
    "input_dtype",
    "num_classes",
    "label_shape",
    "feature",
    "inputs",
    "outputs",
    "scaling",
    "loss",
    "metrics",
    "optimizer",
    "learning_rate",
    "batch_size",
    "epochs",
    "max_steps",
    "clip_norm",
    "weight_decay",
    "label_smoothing",
    "lr_schedule",
    "lr_boundaries_epochs",
    "lr_decay_factor",
    "lr_decay_epochs",
    "end_learning_rate",
    "lr_decay_total_epochs",
    "moving_average_decay",
    "precision",
)


def _describe(fn: Any) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _build_parameters(fn: Callable) -> tuple[list[inspect.Parameter], bool]:
    """The build function's parameters after (input_shape, num_classes); whether it takes
    ``**kwargs``."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return [], True
    positional = [
        p
        for p in params
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    if len(positional) < 2:
        raise SparktfTypeError(
            f"build function {_describe(fn)} must take (input_shape, num_classes, **config)"
        )
    rest = [p for p in params if p not in positional[:2]]
    var_kw = any(p.kind == inspect.Parameter.VAR_KEYWORD for p in rest)
    return [p for p in rest if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)], var_kw


def _build_defaults(fn: Callable) -> dict[str, Any]:
    params, _ = _build_parameters(fn)
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


# ----------------------------------------------------------------------------- the task


class CustomTask(SeveralOutputs, KindMixin, NamedInputs, ClassifierTask):
    """A model whose network comes from a user's build function (one subclass per
    registered name; see the module docstring). A classifier behaves exactly as the
    registry's classifiers; the other kinds get their own loss, metrics and signatures."""

    description: ClassVar[str] = "a user's Keras model (sparktf.models.register)"
    spec: ClassVar[CustomModel | None] = None
    defaults: ClassVar[Mapping[str, Any]] = {}
    losses_are_decay: ClassVar[bool] = False  # its layers may add losses of their own

    # -- config ---------------------------------------------------------------------------

    @property
    def kind(self) -> str:  # type: ignore[override]
        if self.config.get("outputs"):  # several outputs: a loss each (SeveralOutputs)
            return "custom"
        return kind_of(self.config["kind"], self.config["loss"])

    @property
    def loss_name(self) -> str:
        """The loss by name (``"callable"`` for a function)."""
        return self.config["loss"] or LOSSES[self.kind]

    @property
    def input_dtype(self) -> str:
        return self.config["input_dtype"] or "float32"

    @property
    def feature(self) -> str:
        return self.config["feature"] or ("image" if self.input_dtype == "uint8" else "features")

    @property
    def input_shape(self) -> tuple[int, ...]:
        shape = self.config["input_shape"]
        if shape is None:
            raise SparktfValueError(
                f"model {self.name!r}: input_shape is not known: set it (register, "
                "--model-config, modelConfig) or train on a dataset (it is read from there)"
            )
        return tuple(int(d) for d in shape)

    @property
    def image_shape(self) -> tuple[int, int, int]:
        shape = self.input_shape
        if len(shape) != 3:
            raise SparktfValueError(
                f"model {self.name!r} takes inputs of shape {shape}, not images"
            )
        return shape  # type: ignore[return-value]

    @property
    def num_classes(self) -> int:
        if self.kind == "binary":
            return 2
        if self.config["num_classes"] is None:
            what = "labels" if self.kind == "multilabel" else "classes"
            raise SparktfValueError(
                f"model {self.name!r}: num_classes (the number of {what}) is not known: set it "
                "or train on a dataset that records it"
            )
        return int(self.config["num_classes"])

    @property
    def label_shape(self) -> tuple[int, ...]:
        """The per-row shape of a label: () for a class, a binary or a scalar target."""
        if self.kind == "multilabel":
            return (self.num_classes,)
        if self.kind in ("classifier", "binary"):
            return ()
        return tuple(int(d) for d in self.config["label_shape"] or ())

    @property
    def serves_images(self) -> bool:
        """A classifier on uint8 images: the registry classifiers' signatures."""
        return (
            self.input_names is None
            and self.kind == "classifier"
            and self.input_dtype == "uint8"
            and len(self.input_shape) == 3
        )

    @property
    def build_config(self) -> dict[str, Any]:
        params, var_kw = _build_parameters(type(self).spec.build_fn)
        names = {p.name for p in params}
        return {
            k: v
            for k, v in self.config.items()
            if k in names or (var_kw and k not in self.shared_defaults and k not in _TASK_KEYS)
        }

    def validate(self) -> None:
        c = self.config
        check_kind_and_loss(c["kind"], c["loss"])
        _check_input(c)
        least = 1 if self.kind == "multilabel" else 2
        if c["num_classes"] is not None and (
            not isinstance(c["num_classes"], int) or c["num_classes"] < least
        ):
            raise SparktfValueError(
                f"num_classes must be an integer >= {least}, got {c['num_classes']!r}"
            )
        if c["scaling"] not in ScaleImage.MODES:
            raise SparktfValueError(
                f"scaling must be one of {ScaleImage.MODES}, got {c['scaling']!r}"
            )
        if c["loss"] == CALLABLE_LOSS and not callable(type(self).spec.loss):
            raise SparktfValueError("loss 'callable' names a function, but none was registered")
        check_outputs(c["outputs"])
        if c["outputs"] is None:
            check_metrics(self.kind, self.metric_names)
        check_regularisation(c)
        params, _ = _build_parameters(type(self).spec.build_fn)
        missing = [p.name for p in params if p.name not in c]
        if missing:
            raise SparktfValueError(
                f"build function {_describe(type(self).spec.build_fn)} needs {missing}: give "
                "them defaults, or set them with config= / --model-config"
            )

    def data_overrides(self, fields: Sequence[Any], manifest: Mapping[str, Any]) -> dict:
        """Config entries left ``None`` (input column, shape, dtype, classes, label shape),
        read from a dataset's columns (``formats.Field``) and manifest
        (:func:`config_from_dataset`)."""
        return config_from_dataset(self, fields, manifest)

    # -- model ------------------------------------------------------------------------------

    def build_model(self) -> keras.Model:
        num_outputs = self.num_outputs
        fn = type(self).spec.build_fn
        if self.input_names is not None:  # several named inputs: the build function gets them
            inputs = {
                name: keras.Input(shape, dtype=dtype, name=name)
                for name, (dtype, shape) in self.input_specs.items()
            }
            network = fn(dict(inputs), num_outputs, **self.build_config)
            x = inputs
        else:
            shape = self.input_shape
            inputs = keras.Input(shape, dtype=self.input_dtype, name=self.feature)
            x = inputs
            if self.input_dtype == "uint8":
                x = ScaleImage(self.config["scaling"], dtype="float32", name="scale_image")(inputs)
            network = fn(tuple(shape), num_outputs, **self.build_config)
        if not isinstance(network, keras.Model):
            raise SparktfTypeError(
                f"build function {_describe(fn)} returned {type(network).__name__}, "
                "not a keras.Model"
            )
        outputs = network(x)
        if not isinstance(num_outputs, dict):  # several outputs: checked by name when called
            _check_output_shape(self.kind, fn, outputs, num_outputs)
        safe = re.sub(r"[^A-Za-z0-9_]", "_", self.name)
        model = RegistryModel(inputs, outputs, self.name, self.config, name=safe)
        logger.info(
            "built %s (%s): %d trainable parameters",
            self.name,
            self.kind,
            count_params(model.trainable_weights),
        )
        return model

    # -- export -----------------------------------------------------------------------------

    def serving_endpoints(self, model: keras.Model) -> dict[str, Endpoint]:
        if self.serves_images:
            return super().serving_endpoints(model)
        if self.input_names is not None:
            return self.named_endpoints(model)
        shape, feature = list(self.input_shape), self.feature
        dtype = tf.as_dtype(self.input_dtype)

        def classify(inputs: tf.Tensor) -> dict[str, tf.Tensor]:
            parsed = tf.io.parse_example(
                inputs, {feature: tf.io.FixedLenFeature(shape, tf.float32)}
            )
            return self.predictions(model, tf.cast(parsed[feature], dtype))

        def predict_features(features: tf.Tensor) -> dict[str, tf.Tensor]:
            return self.predictions(model, features)

        return {
            "serving_default": (classify, [tf.TensorSpec([None], tf.string, name="inputs")]),
            "predict_features": (
                predict_features,
                [tf.TensorSpec([None, *shape], dtype, name="features")],
            ),
        }

    def signature_info(self) -> dict[str, dict[str, dict[str, str]]]:
        if self.serves_images:
            return super().signature_info()
        if self.output_specs is not None:
            outputs = self.outputs_info()
        elif self.kind in ("classifier", "binary"):
            outputs = {"classes": "int64[B]", "scores": f"float32[B,{self.num_classes}]"}
        else:
            label = "".join(f",{d}" for d in self.label_shape)
            outputs = {"predictions": f"float32[B{label}]"}
        if self.input_names is not None:
            return {"serving_default": {"inputs": self.named_info(), "outputs": outputs}}
        dims = ",".join(str(d) for d in self.input_shape)
        return {
            "serving_default": {
                "inputs": {
                    "inputs": f"string[B] (tf.train.Example, {self.feature!r}: "
                    f"{math.prod(self.input_shape)} floats)"
                },
                "outputs": outputs,
            },
            "predict_features": {
                "inputs": {"features": f"{self.input_dtype}[B,{dims}]"},
                "outputs": outputs,
            },
        }


def _check_output_shape(kind: str, fn: Callable, outputs: Any, num_outputs: int) -> None:
    """ValueError unless the network's outputs are ``[B, num_outputs]`` (or ``[B]`` for one
    value of a binary, regression or custom model)."""
    got = tuple(outputs.shape[1:])
    scalar = kind in ("binary", "regression", "custom") and num_outputs == 1
    if got != (num_outputs,) and not (scalar and got == ()):
        what = {"classifier": "logits", "binary": "one logit", "multilabel": "logits"}
        raise SparktfValueError(
            f"build function {_describe(fn)} returns outputs of shape "
            f"{tuple(outputs.shape)}; expected {what.get(kind, 'outputs')} "
            f"[B, {num_outputs}]" + (" or [B]" if scalar else "")
        )


def _check_input(c: Mapping[str, Any]) -> None:
    """The shapes and the dtype of a model's input and label in its config."""
    for key in ("input_shape", "label_shape"):
        shape = c[key]
        if shape is not None and (
            not isinstance(shape, list)
            or (key == "input_shape" and not shape)
            or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape)
        ):
            raise SparktfValueError(f"{key} must be a list of positive integers, got {shape!r}")
    if c["input_dtype"] not in (None, *INPUT_DTYPES):
        raise SparktfValueError(
            f"input_dtype must be one of {INPUT_DTYPES}, got {c['input_dtype']!r}"
        )
    check_inputs(c["inputs"])


# ----------------------------------------------------------------------------- the names

# Names entered by register() in this process -> their CustomModel (what a plan carries).
_REGISTERED: dict[str, CustomModel] = {}


def _task_class_for(name: str, spec: CustomModel) -> type[CustomTask]:
    """A CustomTask subclass for ``name`` (entered into the name table)."""
    attrs = {
        "family": name,
        "spec": spec,
        "defaults": spec.defaults(),
        "description": spec.description or f"custom model {_describe(spec.build_fn)}",
        "__module__": __name__,
        "__qualname__": f"CustomTask[{name}]",
    }
    return type(f"CustomTask[{name}]", (CustomTask,), attrs)


def _is_custom(name: str) -> bool:
    try:
        return issubclass(task_class(name), CustomTask)
    except ValueError:
        return False


def register(name: str, build_fn: Callable[..., keras.Model], **options: Any) -> str:
    """Makes ``build_fn`` trainable under ``name`` (see the module docstring for the build
    function and ``options``: kind, loss, metrics, optimizer, learning_rate, input_shape,
    input_dtype, num_classes, label_shape, feature, scaling, batch_size, epochs, max_steps, config,
    description). Registering a name again replaces it; the registry's own names cannot be
    taken. Returns ``name``."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise SparktfValueError(
            f"model name {name!r}: use letters, digits, '_', '.', '-' (a 'module:attr' name "
            "needs no registration)"
        )
    if name in task_names() and not _is_custom(name):
        raise SparktfValueError(f"model name {name!r} is one of the registry's own models")
    spec = custom_model(build_fn, **options)
    _task_class_for(name, spec).make(name, {})  # a config that cannot work fails here
    _REGISTERED[name] = spec
    return name


def module_task_class(name: str) -> type[CustomTask]:
    """The task class of a ``"package.module:attr"`` name (imported, then entered into the
    name table); a ValueError naming what is missing."""
    module_name, _, attr = name.partition(":")
    if not module_name or not attr:
        raise SparktfValueError(f"model {name!r}: expected 'package.module:attribute'")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise SparktfValueError(
            f"model {name!r}: cannot import module {module_name!r} ({exc}); it must be "
            "importable in the driver and on every executor (an installed package, "
            "PYTHONPATH or --py-files)"
        ) from None
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise SparktfValueError(f"model {name!r}: module {module_name!r} has no {attr!r}")
        target = getattr(target, part)
    if isinstance(target, CustomModel):
        spec = target
    elif callable(target):
        spec = CustomModel(target)
    else:
        raise SparktfValueError(
            f"model {name!r}: {attr!r} is {type(target).__name__}; expected a build function "
            "(input_shape, num_classes, **config) -> keras.Model or a "
            "sparktf.models.custom_model(...)"
        )
    return _task_class_for(name, spec)


def _resolve(name: str) -> type[CustomTask] | None:
    return module_task_class(name) if isinstance(name, str) and ":" in name else None


add_resolver(_resolve)


def plan_payload(name: str) -> bytes | None:
    """The registration of ``name`` as bytes for a run's plan (None unless ``name`` was
    entered by :func:`register` in this process): the build and loss functions pickled by
    value (cloudpickle), so a TensorFlow process need not import their module."""
    spec = _REGISTERED.get(name)
    if spec is None:
        return None
    return dumps_by_value((name, spec), [spec.build_fn, spec.loss])


def dumps_by_value(obj: Any, functions: list[Any]) -> bytes:
    """``obj`` pickled with cloudpickle, the modules that define ``functions`` pickled by
    value with it (a user's module, not sparktf's, Keras's or TensorFlow's; ``__main__`` is
    by value anyway), so a process that has not that module can load it. The modules the
    functions import still travel by name."""
    import cloudpickle

    modules = set()
    for fn in functions:
        module = getattr(fn, "__module__", None)
        if (
            callable(fn)
            and module
            and module != "__main__"
            and module in sys.modules
            and not module.startswith(("sparktf.", "keras", "tensorflow"))
        ):
            modules.add(module)
    added = []
    try:
        for module in modules:
            try:
                cloudpickle.register_pickle_by_value(sys.modules[module])
                added.append(module)
            except ValueError:  # already by value
                pass
        return cloudpickle.dumps(obj)
    finally:
        for module in added:
            cloudpickle.unregister_pickle_by_value(sys.modules[module])


def install_payload(payload: bytes) -> str:
    """Enters the registration a plan carries (:func:`plan_payload`); returns its name."""
    import cloudpickle

    name, spec = cloudpickle.loads(payload)
    _task_class_for(name, spec)
    _REGISTERED[name] = spec
    return name


def registered() -> list[str]:
    """The names entered by :func:`register` in this process."""
    return sorted(_REGISTERED)
