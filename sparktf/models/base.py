"""Shared pieces of the model registry.

Everything that more than one model family needs lives here once:

* :class:`ModelTask` -- the base of every family: a name plus a JSON config, and the
  contract the training loop codes against (``build_model``, ``make_optimizer``,
  ``train_step``, ``eval_step``, ``export``).
* :class:`ClassifierTask` -- the image-classifier step, eval step and SavedModel export
  (7.4-style ``serving_default`` / ``predict_images`` signatures) shared by ResNet,
  AlexNet and the MNIST models.
* :class:`ScaleImage` -- uint8 -> float scaling done *inside* the model, so an exported
  model accepts exactly what the datasets store.
* :func:`write_saved_model` -- ``tf.saved_model.save`` with named signatures.
* Learning-rate schedules keyed on ``optimizer.iterations`` (they resume from a
  checkpoint), optimizer construction, weight decay and gradient clipping that stay
  correct under ``tf.distribute``.

Metric convention: every ``train_step`` / ``eval_step`` returns *replica-local means*
(scalar tensors).  Combine them across replicas with ``ReduceOp.MEAN`` (see
:func:`reduce_metrics`).  The *optimised* loss, in contrast, is the per-example loss
summed and divided by the global batch size (``tf.nn.compute_average_loss``), with
regularisation scaled by ``1 / num_replicas_in_sync``, so gradients summed over replicas
are the gradient of the global mean loss.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import logging
import math
from typing import Any, Callable, ClassVar, Mapping, Sequence

import keras
import numpy as np
import tensorflow as tf

logger = logging.getLogger(__name__)

KINDS = ("classifier", "language_model", "gan", "regression")
SERIALIZABLE_PACKAGE = "sparktf"

Metrics = dict[str, tf.Tensor]
Batch = Mapping[str, tf.Tensor]


# --------------------------------------------------------------------------- config


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
    raise TypeError(f"config value {value!r} ({type(value).__name__}) is not JSON-serialisable")


def l2_regularizer(weight_decay: float) -> keras.regularizers.Regularizer | None:
    """L2 weight decay as TF1's ``weight_decay * tf.nn.l2_loss(w)`` (= wd/2 * sum(w**2))."""
    if not weight_decay:
        return None
    return keras.regularizers.L2(weight_decay / 2.0)


# --------------------------------------------------------------------------- layers


@keras.saving.register_keras_serializable(package=SERIALIZABLE_PACKAGE)
class ScaleImage(keras.layers.Layer):
    """Scales raw uint8 images (0..255) to float inside the model.

    Modes: ``"unit"`` -> [0, 1]; ``"symmetric"`` -> [-1, 1]; ``"standardize"`` -> per-image
    zero mean and unit variance (``tf.image.per_image_standardization``).
    """

    MODES = ("unit", "symmetric", "standardize")

    def __init__(self, mode: str = "unit", **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if mode not in self.MODES:
            raise ValueError(f"ScaleImage mode must be one of {self.MODES}, got {mode!r}")
        self.mode = mode

    def call(self, images: tf.Tensor) -> tf.Tensor:
        x = tf.cast(images, self.compute_dtype)
        if self.mode == "unit":
            return x / 255.0
        if self.mode == "symmetric":
            return x / 127.5 - 1.0
        return tf.image.per_image_standardization(x)

    def compute_output_shape(self, input_shape: Sequence[int | None]) -> tuple:
        return tuple(input_shape)

    def get_config(self) -> dict:
        return {**super().get_config(), "mode": self.mode}


def images_to_uint8(images: tf.Tensor, mode: str) -> tf.Tensor:
    """Inverse of :class:`ScaleImage` for the ``unit`` / ``symmetric`` modes."""
    if mode == "unit":
        pixels = images * 255.0
    elif mode == "symmetric":
        pixels = (images + 1.0) * 127.5
    else:
        raise ValueError(f"cannot invert image scaling mode {mode!r}")
    return tf.cast(tf.clip_by_value(tf.round(pixels), 0.0, 255.0), tf.uint8)


# --------------------------------------------------------------------------- models


class RegistryConfigMixin:
    """``get_config`` / ``from_config`` through the registry: a model is rebuilt from
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

    def get_task(self) -> "ModelTask":
        """The :class:`ModelTask` that built this model."""
        from sparktf.models import get_task  # registry imports the families

        return get_task(self.task_name, **self.task_config)

    def get_config(self) -> dict:
        return {"task_name": self.task_name, "task_config": self.task_config}

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> keras.Model:
        from sparktf.models import get_model

        return get_model(config["task_name"], **config["task_config"])


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


# --------------------------------------------------------------------------- schedules


@keras.saving.register_keras_serializable(package=SERIALIZABLE_PACKAGE)
class EpochDecay(keras.optimizers.schedules.LearningRateSchedule):
    """PTB (11.2) schedule: ``lr * decay ** max(epoch + 1 - max_epoch, 0)``.

    ``epoch = step // steps_per_epoch`` (zero-based), so the first ``max_epoch`` epochs
    use the initial rate and every later epoch multiplies it by ``decay``.
    """

    def __init__(
        self, initial_learning_rate: float, decay: float, steps_per_epoch: int, max_epoch: int
    ) -> None:
        self.initial_learning_rate = float(initial_learning_rate)
        self.decay = float(decay)
        self.steps_per_epoch = int(steps_per_epoch)
        self.max_epoch = int(max_epoch)

    def __call__(self, step: tf.Tensor) -> tf.Tensor:
        epoch = tf.math.floordiv(tf.cast(step, tf.int64), self.steps_per_epoch)
        exponent = tf.maximum(epoch + 1 - self.max_epoch, 0)
        return self.initial_learning_rate * tf.pow(self.decay, tf.cast(exponent, tf.float32))

    def get_config(self) -> dict:
        return {
            "initial_learning_rate": self.initial_learning_rate,
            "decay": self.decay,
            "steps_per_epoch": self.steps_per_epoch,
            "max_epoch": self.max_epoch,
        }


def learning_rate_schedule(
    config: Mapping[str, Any], steps_per_epoch: int
) -> float | keras.optimizers.schedules.LearningRateSchedule:
    """The learning rate a config declares, keyed on ``optimizer.iterations``.

    ``config["lr_schedule"]`` is one of:

    * ``"constant"`` -- ``learning_rate``.
    * ``"piecewise"`` -- ``learning_rate`` multiplied by ``lr_decay_factor`` at each of
      ``lr_boundaries_epochs`` (ResNet's step schedule).
    * ``"exponential"`` -- ``learning_rate * lr_decay_factor ** floor(epoch /
      lr_decay_epochs)`` (slim's staircase exponential decay).
    * ``"epoch_decay"`` -- :class:`EpochDecay` with ``lr_decay`` and ``max_epoch`` (PTB).
    """
    if steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
    kind = config.get("lr_schedule", "constant")
    lr = float(config["learning_rate"])
    if kind == "constant":
        return lr
    if kind == "piecewise":
        # Keras switches *after* a boundary; iterations == epochs * steps_per_epoch means
        # that many epochs are done, so the next update already uses the lower rate.
        boundaries = [
            max(int(round(e * steps_per_epoch)) - 1, 0) for e in config["lr_boundaries_epochs"]
        ]
        factor = float(config["lr_decay_factor"])
        values = [lr * factor**i for i in range(len(boundaries) + 1)]
        return keras.optimizers.schedules.PiecewiseConstantDecay(boundaries, values)
    if kind == "exponential":
        decay_steps = max(1, int(round(config["lr_decay_epochs"] * steps_per_epoch)))
        return keras.optimizers.schedules.ExponentialDecay(
            lr, decay_steps, float(config["lr_decay_factor"]), staircase=True
        )
    if kind == "epoch_decay":
        return EpochDecay(lr, config["lr_decay"], steps_per_epoch, config["max_epoch"])
    raise ValueError(f"unknown lr_schedule {kind!r}")


_OPTIMIZERS: dict[str, type[keras.optimizers.Optimizer]] = {
    "sgd": keras.optimizers.SGD,
    "adam": keras.optimizers.Adam,
    "rmsprop": keras.optimizers.RMSprop,
}


def build_optimizer(
    spec: Mapping[str, Any],
    learning_rate: float | keras.optimizers.schedules.LearningRateSchedule,
    variables: Sequence[tf.Variable] | None = None,
) -> keras.optimizers.Optimizer:
    """A Keras optimizer from ``{"name": "sgd"|"adam"|"rmsprop", **keras_kwargs}``.

    When ``variables`` are given the optimizer is built on them now (creating its slot
    variables), which a distributed step needs: slots cannot be created inside
    ``strategy.run``.  Call it inside ``strategy.scope()``.
    """
    spec = dict(spec)
    name = spec.pop("name")
    if name not in _OPTIMIZERS:
        raise ValueError(f"unknown optimizer {name!r}; expected one of {sorted(_OPTIMIZERS)}")
    optimizer = _OPTIMIZERS[name](learning_rate=learning_rate, **spec)
    if variables is not None:
        optimizer.build(list(variables))
    return optimizer


def current_learning_rate(optimizer: keras.optimizers.Optimizer) -> tf.Tensor:
    """The learning rate the optimizer applies at its current iteration (float32)."""
    return tf.cast(tf.convert_to_tensor(optimizer.learning_rate), tf.float32)


# --------------------------------------------------------------------------- gradients


def regularization_loss(model: keras.Model) -> tf.Tensor:
    """Sum of ``model.losses`` (weight decay), scaled by ``1 / num_replicas_in_sync``."""
    losses = model.losses
    if not losses:
        return tf.constant(0.0)
    return tf.nn.scale_regularization_loss(tf.add_n([tf.cast(l, tf.float32) for l in losses]))


def clip_by_global_norm_across_replicas(
    grads: Sequence[tf.Tensor | None], clip_norm: float
) -> list[tf.Tensor | None]:
    """Clips the *aggregated* gradient to ``clip_norm``, as single-machine training does.

    Under a multi-replica strategy each replica only holds its share of the gradient, and
    Keras sums the shares inside ``apply_gradients``.  Clipping each share would not be
    the book's clip, so the shares are summed here first, clipped by their global norm,
    and divided by the number of replicas again; the optimizer's own sum then yields the
    clipped total.  With one replica this is plain ``tf.clip_by_global_norm``.
    """
    grads = list(grads)
    present = [i for i, g in enumerate(grads) if g is not None]
    values = [tf.convert_to_tensor(grads[i]) for i in present]
    replica_context = tf.distribute.get_replica_context()
    num_replicas = tf.distribute.get_strategy().num_replicas_in_sync
    if replica_context is not None and num_replicas > 1:
        values = replica_context.all_reduce(tf.distribute.ReduceOp.SUM, values)
        values, _ = tf.clip_by_global_norm(values, clip_norm)
        values = [v / num_replicas for v in values]
    else:
        values, _ = tf.clip_by_global_norm(values, clip_norm)
    for i, v in zip(present, values):
        grads[i] = v
    return grads


def apply_gradients(
    optimizer: keras.optimizers.Optimizer,
    loss: tf.Tensor,
    tape: tf.GradientTape,
    variables: Sequence[tf.Variable],
    clip_norm: float | None = None,
) -> None:
    """Gradient of ``loss``, optionally clipped across replicas, applied to ``variables``."""
    variables = list(variables)
    grads = tape.gradient(loss, variables)
    if clip_norm:
        grads = clip_by_global_norm_across_replicas(grads, clip_norm)
    optimizer.apply_gradients(zip(grads, variables))


def reduce_metrics(strategy: tf.distribute.Strategy, per_replica: Mapping[str, Any]) -> Metrics:
    """Combines the replica-local metric means a step returned (``ReduceOp.MEAN``)."""
    return {
        key: strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None)
        for key, value in per_replica.items()
    }


# --------------------------------------------------------------------------- export


Endpoint = tuple[Callable[..., Mapping[str, tf.Tensor]], Sequence[tf.TensorSpec]]


def write_saved_model(
    model: keras.Model, export_dir: str, endpoints: Mapping[str, Endpoint]
) -> str:
    """Writes ``tf.saved_model.save`` output with one signature per endpoint.

    The SavedModel root holds the model's variables and the endpoint functions only (not
    the Keras object graph), so it loads with plain ``tf.saved_model.load`` / TF Serving.
    """
    root = tf.Module()
    root.model_variables = list(model.variables)
    signatures = {}
    for name, (fn, input_signature) in endpoints.items():
        function = tf.function(fn, input_signature=list(input_signature), autograph=False)
        setattr(root, name, function)
        signatures[name] = function.get_concrete_function()
    tf.saved_model.save(root, export_dir, signatures=signatures)
    logger.info("exported %s to %s with signatures %s", model.name, export_dir, list(signatures))
    return export_dir


# --------------------------------------------------------------------------- tasks


@dataclasses.dataclass(frozen=True)
class ModelTask:
    """One model family with one full config.

    ``get_task(task.name, **task.config)`` rebuilds the same task.  Subclasses set the
    class attributes, ``build_model`` and the steps.  Common config keys: ``batch_size``
    (the global batch size the book trains with), ``epochs`` / ``max_steps`` (its length,
    either may be ``None``), ``optimizer`` (``{"name": ..., **keras_kwargs}``),
    ``learning_rate`` and ``lr_schedule`` (see :func:`learning_rate_schedule`).
    """

    name: str
    config: dict

    family: ClassVar[str] = ""
    kind: ClassVar[str] = ""
    description: ClassVar[str] = ""
    defaults: ClassVar[Mapping[str, Any]] = {}
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = {}

    def __hash__(self) -> int:
        return hash((self.name, json.dumps(self.config, sort_keys=True)))

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"{type(self).__name__}.kind must be one of {KINDS}")
        self.validate()

    @classmethod
    def make(cls, name: str, overrides: Mapping[str, Any]) -> "ModelTask":
        """Defaults, then ``presets[name]`` (if any), then ``overrides``."""
        unknown = sorted(set(overrides) - set(cls.defaults))
        if unknown:
            raise ValueError(
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
        first ``strategy.run``).
        """
        schedule = learning_rate_schedule(self.config, steps_per_epoch)
        variables = model.trainable_variables if model is not None else None
        return build_optimizer(self.config["optimizer"], schedule, variables)

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


class ClassifierTask(ModelTask):
    """Image classifiers: uint8 ``image`` [B,H,W,C] and int64 ``label`` [B].

    Subclasses implement :meth:`build_logits` on the scaled float images.  Config keys:
    ``image_shape``, ``num_classes``, ``scaling`` (a :class:`ScaleImage` mode),
    ``weight_decay`` (0 for none) and ``clip_norm`` (``None`` for no clipping).
    """

    kind: ClassVar[str] = "classifier"

    @property
    def features(self) -> tuple[str, ...]:
        return ("image", "label")

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(int(d) for d in self.config["image_shape"])  # type: ignore[return-value]

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return self.image_shape

    @property
    def num_classes(self) -> int:
        return int(self.config["num_classes"])

    def validate(self) -> None:
        if len(self.config["image_shape"]) != 3:
            raise ValueError(f"image_shape must be [H, W, C], got {self.config['image_shape']}")
        if self.num_classes < 2:
            raise ValueError(f"num_classes must be >= 2, got {self.num_classes}")

    def build_logits(self, images: keras.KerasTensor) -> keras.KerasTensor:
        """Logits [B, num_classes] from scaled float images (functional API)."""
        raise NotImplementedError

    def build_model(self) -> keras.Model:
        images = keras.Input(self.image_shape, dtype="uint8", name="image")
        scaled = ScaleImage(self.config["scaling"], name="scale_image")(images)
        logits = self.build_logits(scaled)
        model = RegistryModel(images, logits, self.name, self.config, name=self.name)
        logger.info(
            "built %s: %d trainable parameters", self.name, count_params(model.trainable_weights)
        )
        return model

    def _forward(
        self, model: keras.Model, batch: Batch, training: bool
    ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        labels = tf.reshape(tf.cast(batch["label"], tf.int64), [-1])
        logits = tf.cast(model(batch["image"], training=training), tf.float32)
        per_example = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
        correct = tf.cast(tf.equal(tf.argmax(logits, axis=-1), labels), tf.float32)
        return logits, per_example, correct

    def train_step(
        self, model: keras.Model, optimizer: Any, batch: Batch, global_batch_size: int
    ) -> Metrics:
        with tf.GradientTape() as tape:
            _, per_example, correct = self._forward(model, batch, training=True)
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch_size)
            reg = regularization_loss(model)
            total = loss + reg
        apply_gradients(
            optimizer, total, tape, model.trainable_variables, self.config.get("clip_norm")
        )
        num_replicas = tf.distribute.get_strategy().num_replicas_in_sync
        return {
            "loss": tf.reduce_mean(per_example),
            "accuracy": tf.reduce_mean(correct),
            "regularization_loss": reg * num_replicas,
            "learning_rate": current_learning_rate(optimizer),
        }

    def eval_step(self, model: keras.Model, batch: Batch, global_batch_size: int) -> Metrics:
        _, per_example, correct = self._forward(model, batch, training=False)
        return {"loss": tf.reduce_mean(per_example), "accuracy": tf.reduce_mean(correct)}

    def serving_endpoints(self, model: keras.Model) -> dict[str, Endpoint]:
        height, width, channels = self.image_shape

        def outputs(images: tf.Tensor) -> dict[str, tf.Tensor]:
            logits = tf.cast(model(images, training=False), tf.float32)
            scores = tf.nn.softmax(logits, axis=-1)
            return {"classes": tf.argmax(scores, axis=-1), "scores": scores}

        def classify(inputs: tf.Tensor) -> dict[str, tf.Tensor]:
            features = tf.io.parse_example(
                inputs, {"image": tf.io.FixedLenFeature([], tf.string)}
            )
            pixels = tf.io.decode_raw(features["image"], tf.uint8)
            return outputs(tf.reshape(pixels, [-1, height, width, channels]))

        def predict_images(images: tf.Tensor) -> dict[str, tf.Tensor]:
            return outputs(images)

        return {
            "serving_default": (classify, [tf.TensorSpec([None], tf.string, name="inputs")]),
            "predict_images": (
                predict_images,
                [tf.TensorSpec([None, height, width, channels], tf.uint8, name="images")],
            ),
        }

    def signature_info(self) -> dict[str, dict[str, dict[str, str]]]:
        h, w, c = self.image_shape
        k = self.num_classes
        outputs = {"classes": "int64[B]", "scores": f"float32[B,{k}]"}
        return {
            "serving_default": {
                "inputs": {
                    "inputs": f"string[B] (tf.train.Example, 'image': {h}*{w}*{c} raw uint8 bytes)"
                },
                "outputs": outputs,
            },
            "predict_images": {"inputs": {"images": f"uint8[B,{h},{w},{c}]"}, "outputs": outputs},
        }

    def example_batch(self, batch_size: int, seed: int = 0) -> dict[str, tf.Tensor]:
        rng = np.random.default_rng(seed)
        images = rng.integers(0, 256, size=(batch_size, *self.image_shape), dtype=np.uint8)
        labels = rng.integers(0, self.num_classes, size=(batch_size,), dtype=np.int64)
        ids = np.arange(batch_size, dtype=np.int64)
        return {"image": tf.constant(images), "label": tf.constant(labels), "id": tf.constant(ids)}


def count_params(weights: Sequence[Any]) -> int:
    """Number of scalars in ``weights``."""
    return int(sum(math.prod(int(d) for d in w.shape) for w in weights))
