"""The task contract every model family implements, and how a model finds its task again.

* :class:`ModelTask` -- the base of every family: a name plus a JSON config, and the
  contract the training loop codes against (``build_model``, ``make_optimizer``,
  ``train_step``, ``eval_step``, ``export``, and ``summary_images`` for what a family
  draws while it trains).
* The name table: a :class:`ModelTask` subclass that sets its own ``family`` is entered,
  when the class is defined, under its family name and each of its presets
  (:func:`task_class`, :func:`task_names`).  :mod:`sparktf.models.registry` imports every
  family and is the public face of the table; this module never imports the families, so
  a model can be rebuilt from its config here without importing the registry back.
* :class:`RegistryConfigMixin` / :class:`RegistryModel` -- Keras models whose
  ``get_config`` is ``(task_name, task_config)``: ``from_config`` rebuilds them through
  the task, not from their layer graph.

Metric convention: every ``train_step`` / ``eval_step`` returns *replica-local means*
(scalar tensors).  Combine them across replicas with ``ReduceOp.MEAN`` (see
:func:`sparktf.models.optim.reduce_metrics`); :mod:`sparktf.models.optim` describes how
the optimised loss is scaled.
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import keras
import numpy as np
import tensorflow as tf

from sparktf.errors import SparktfRuntimeError, SparktfTypeError, SparktfValueError
from sparktf.models.export import Endpoint, write_saved_model
from sparktf.models.layers import SERIALIZABLE_PACKAGE
from sparktf.models.optim import (
    PRECISIONS,
    check_optimizer_spec,
    check_schedule,
    optimizer_from_config,
)

__all__ = [
    "Batch",
    "KINDS",
    "Metrics",
    "ModelTask",
    "RegistryConfigMixin",
    "RegistryModel",
    "add_resolver",
    "task_class",
    "task_names",
    "to_jsonable",
]

KINDS = ("classifier", "language_model", "gan", "regression", "binary", "multilabel", "custom")

Metrics = dict[str, tf.Tensor]
Batch = Mapping[str, tf.Tensor]


def to_jsonable(value: Any) -> Any:
    """Returns ``value`` with tuples turned into lists and numpy scalars into Python ones.

    Raises ``TypeError`` naming the offending value when something cannot be written as
    JSON, so a config is always JSON-serialisable.
    """
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, np.generic):
        return value.item()
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise SparktfTypeError(
        f"config value {value!r} ({type(value).__name__}) is not JSON-serialisable"
    )


# --------------------------------------------------------------------------- name table

# Every family and preset name -> the task class that builds it.  Filled by
# ModelTask.__init_subclass__ as the family modules are imported (the package __init__
# imports them all through sparktf.models.registry before anything can look a name up).
_TASK_CLASSES: dict[str, type[ModelTask]] = {}


# Resolvers of names that are not in the table: each returns a task class or None
# (sparktf.models.custom adds the one for "package.module:attr").
_RESOLVERS: list[Callable[[str], type[ModelTask] | None]] = []


def add_resolver(resolve: Callable[[str], type[ModelTask] | None]) -> None:
    """Makes :func:`task_class` ask ``resolve(name)`` about names not in the table."""
    if resolve not in _RESOLVERS:
        _RESOLVERS.append(resolve)


def _register(cls: type[ModelTask]) -> None:
    """Enters ``cls`` under its family name and its presets; a clash is an error."""
    for preset, overrides in cls.presets.items():
        unknown = sorted(set(overrides) - set(cls.defaults))
        if unknown:
            raise SparktfRuntimeError(f"preset {preset!r} sets unknown config keys {unknown}")
    names = (cls.family, *cls.presets)
    for name in names:
        existing = _TASK_CLASSES.get(name)
        # Re-defining the same class (a module reload) replaces it; another class clashes.
        if existing is not None and _qualified(existing) != _qualified(cls):
            raise SparktfRuntimeError(f"model name {name!r} registered twice")
    for name in names:
        _TASK_CLASSES[name] = cls


def _qualified(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def task_names() -> list[str]:
    """Every registered family and preset name, sorted."""
    return sorted(_TASK_CLASSES)


def task_class(name: str) -> type[ModelTask]:
    """The :class:`ModelTask` subclass registered under ``name`` (a family or a preset).

    A ``"package.module:attr"`` name (a user's build function, see
    :mod:`sparktf.models.custom`) is imported and entered on first use.
    """
    try:
        return _TASK_CLASSES[name]
    except KeyError:
        for resolve in _RESOLVERS:
            found = resolve(name)
            if found is not None:
                return found
        raise SparktfValueError(
            f"unknown model {name!r}; known models: {task_names()} (or a user's build "
            "function: sparktf.models.register(name, build_fn) or 'package.module:build')"
        ) from None


# --------------------------------------------------------------------------- tasks


@dataclasses.dataclass(frozen=True)
class ModelTask:
    """One model family with one full config.

    ``sparktf.models.get_task(task.name, **task.config)`` rebuilds the same task.
    Subclasses set the class attributes, ``build_model`` and the steps; one that sets its
    own ``family`` is registered under it and its ``presets`` when it is defined.  Common
    config keys: ``batch_size`` (the global batch size the book trains with), ``epochs`` /
    ``max_steps`` (its length, either may be ``None``), ``optimizer`` (``{"name": ...,
    **keras_kwargs}``, see :data:`sparktf.models.optim.OPTIMIZERS`), ``learning_rate`` and
    ``lr_schedule`` (see :func:`sparktf.models.optim.learning_rate_schedule`).

    Every family also has the keys of :attr:`shared_defaults` (a family's own
    ``defaults`` win): the schedule parameters of the book's ``train_image_classifier``
    (slim's defaults), ``moving_average_decay`` (``None``: off; else the decay of an
    exponential moving average of the trainable weights, kept by the optimizer and
    used by :func:`sparktf.models.optim.weights_for_export`) and ``precision``
    (``"fp32"``, ``"bf16"``, ``"fp16"``; see :func:`sparktf.models.optim.precision_policy`).
    """

    name: str
    config: dict

    family: ClassVar[str] = ""
    kind: ClassVar[str] = ""
    description: ClassVar[str] = ""
    defaults: ClassVar[Mapping[str, Any]] = {}
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = {}
    # Whether the model's losses are its weights' regularizers alone, which the optimizer
    # may then apply where the variables live (optim.decay_on_servers; the classifiers).
    losses_are_decay: ClassVar[bool] = False
    # Keys every family has, under its own defaults; a subclass adds its own (merged along
    # the class hierarchy when a class defines ``defaults``).
    shared_defaults: ClassVar[Mapping[str, Any]] = {
        "lr_schedule": "constant",
        "lr_boundaries_epochs": [],  # piecewise
        "lr_decay_factor": 0.94,  # piecewise, exponential (slim --learning_rate_decay_factor)
        "lr_decay_epochs": 2.0,  # exponential (slim --num_epochs_per_decay)
        "end_learning_rate": 1e-4,  # polynomial (slim --end_learning_rate)
        "lr_decay_total_epochs": None,  # polynomial; None: the config's epochs / max_steps
        "moving_average_decay": None,
        "precision": "fp32",
    }

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "defaults" in cls.__dict__:
            shared: dict[str, Any] = {}
            for base in reversed(cls.__mro__):
                shared.update(base.__dict__.get("shared_defaults", {}))
            cls.defaults = {**shared, **cls.__dict__["defaults"]}
        if cls.__dict__.get("family"):  # shared bases (ClassifierTask) name no family
            _register(cls)

    def __hash__(self) -> int:
        return hash((self.name, json.dumps(self.config, sort_keys=True)))

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise SparktfValueError(f"{type(self).__name__}.kind must be one of {KINDS}")
        try:
            self._validate_training()
        except ValueError as exc:
            raise SparktfValueError(f"model {self.name!r}: {exc}") from None
        self.validate()

    def _validate_training(self) -> None:
        """The keys every family shares: optimizer, schedule, averages, precision."""
        check_optimizer_spec(self.config["optimizer"])
        check_schedule(self.config)
        decay = self.config.get("moving_average_decay")
        if decay is not None and not (
            isinstance(decay, (int, float)) and not isinstance(decay, bool) and 0 < decay < 1
        ):
            raise SparktfValueError(
                f"moving_average_decay must be None or in (0, 1), got {decay!r}"
            )
        if self.config.get("precision", "fp32") not in PRECISIONS:
            raise SparktfValueError(
                f"precision must be one of {sorted(PRECISIONS)}, got {self.config['precision']!r}"
            )

    @classmethod
    def make(cls, name: str, overrides: Mapping[str, Any]) -> ModelTask:
        """Defaults, then ``presets[name]`` (if any), then ``overrides``."""
        unknown = sorted(set(overrides) - set(cls.defaults))
        if unknown:
            raise SparktfValueError(
                f"unknown config key(s) {unknown} for model {name!r}; "
                f"known keys: {sorted(cls.defaults)}"
            )
        config = copy.deepcopy(dict(cls.defaults))
        config.update(copy.deepcopy(dict(cls.presets.get(name, {}))))
        config.update(copy.deepcopy(dict(overrides)))
        return cls(name=name, config=to_jsonable(config))

    def validate(self) -> None:
        """Raises ``ValueError`` for an inconsistent config (subclasses extend)."""

    # -- what the training loop reads --------------------------------------------------

    @property
    def features(self) -> tuple[str, ...]:
        """Dataset features a batch must carry."""
        raise NotImplementedError

    @property
    def batch_size(self) -> int:
        return int(self.config["batch_size"])

    @property
    def epochs(self) -> int | None:
        return self.config.get("epochs")

    @property
    def max_steps(self) -> int | None:
        return self.config.get("max_steps")

    def build_model(self) -> keras.Model:
        """A built Keras model (weights exist).  Call inside ``strategy.scope()``."""
        raise NotImplementedError

    def make_optimizer(self, steps_per_epoch: int, model: keras.Model | None = None) -> Any:
        """The declared optimizer and learning-rate schedule.

        Pass ``model`` to build the optimizer's slot variables now (needed before the
        first ``strategy.run``).  With ``moving_average_decay`` it keeps the moving
        averages; with ``precision == "fp16"`` it is a
        :class:`keras.optimizers.LossScaleOptimizer` (the train steps scale the loss
        through :func:`sparktf.models.optim.apply_gradients`).
        """
        variables = model.trainable_variables if model is not None else None
        return optimizer_from_config(self.config, steps_per_epoch, variables, self.losses_are_decay)

    def train_step(
        self, model: keras.Model, optimizer: Any, batch: Batch, global_batch_size: int
    ) -> Metrics:
        raise NotImplementedError

    def eval_step(self, model: keras.Model, batch: Batch, global_batch_size: int) -> Metrics:
        raise NotImplementedError

    def export(self, model: keras.Model, export_dir: str) -> str:
        """Writes a SavedModel to the local ``export_dir``; returns it."""
        return write_saved_model(model, export_dir, self.serving_endpoints(model))

    def serving_endpoints(self, model: keras.Model) -> dict[str, Endpoint]:
        raise NotImplementedError

    def signature_info(self) -> dict[str, dict[str, dict[str, str]]]:
        """``{signature: {"inputs": {name: "dtype[shape]"}, "outputs": {...}}}``."""
        raise NotImplementedError

    def example_batch(self, batch_size: int, seed: int = 0) -> dict[str, tf.Tensor]:
        """A random batch with the dataset's features, dtypes and shapes (for smoke tests)."""
        raise NotImplementedError

    def summary_images(self) -> Callable[[list[np.ndarray]], dict[str, tf.Tensor]]:
        """What training draws for TensorBoard beside each weight snapshot.

        Returns a function from the model's weights (``get_weights()`` order) to uint8
        images ``[N, H, W, C]`` by summary name; it may keep state between calls (a model to
        draw with). Call it outside any strategy scope. Most tasks draw nothing: the default
        function returns ``{}``.
        """
        return lambda weights: {}


# --------------------------------------------------------------------------- models


class RegistryConfigMixin:
    """``get_config`` / ``from_config`` through the task table: a model is rebuilt from
    ``(task_name, task_config)`` rather than from its layer graph."""

    def _set_task(self, task_name: str, task_config: Mapping[str, Any]) -> None:
        # Stored as a JSON string so Keras does not wrap it in a tracked dict.
        self._task_name = task_name
        self._task_json = json.dumps(to_jsonable(task_config), sort_keys=True)

    @property
    def task_name(self) -> str:
        return self._task_name

    @property
    def task_config(self) -> dict:
        return json.loads(self._task_json)

    def get_task(self) -> ModelTask:
        """The :class:`ModelTask` that built this model."""
        return task_class(self.task_name).make(self.task_name, self.task_config)

    def get_config(self) -> dict:
        return {"task_name": self.task_name, "task_config": self.task_config}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> keras.Model:
        name = config["task_name"]
        return task_class(name).make(name, config["task_config"]).build_model()


@keras.saving.register_keras_serializable(package=SERIALIZABLE_PACKAGE)
class RegistryModel(RegistryConfigMixin, keras.Model):
    """A functional Keras model that remembers the registry entry that built it."""

    def __init__(
        self,
        inputs: Any,
        outputs: Any,
        task_name: str,
        task_config: Mapping[str, Any],
        **kwargs: Any,
    ) -> None:
        super().__init__(inputs=inputs, outputs=outputs, **kwargs)
        self._set_task(task_name, task_config)
