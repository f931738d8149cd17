"""Optimisation pieces every family shares, correct under ``tf.distribute``.

* Learning-rate schedules keyed on ``optimizer.iterations``, so they resume from a
  checkpoint (:func:`learning_rate_schedule`, :class:`EpochDecay`).
* Optimizer construction from a config (:func:`build_optimizer`), with its slot variables
  built up front as a distributed step needs.
* The book's ``train_image_classifier`` (9.2) optimizers ``adadelta``, ``adagrad``,
  ``adam``, ``ftrl``, ``momentum``, ``rmsprop``, ``sgd`` (:data:`OPTIMIZERS`), checked
  up front (:func:`check_optimizer_spec`) and built with an exponential moving average of
  the weights and fp16 loss scaling when the config asks (:func:`optimizer_from_config`).
* Weight decay (:func:`regularization_loss`; under ``ParameterServerStrategy`` computed
  where the variables live, :func:`decay_on_servers`) and gradient clipping across replicas
  (:func:`clip_by_global_norm_across_replicas`, :func:`apply_gradients`, which also scales
  the loss for a :class:`keras.optimizers.LossScaleOptimizer`).
* The moving averages as exportable weights (:func:`weights_for_export`) and the Keras
  dtype policy of a ``precision`` (:func:`precision_policy`).
* :func:`reduce_metrics`, combining the replica-local metric means a step returns.

The *optimised* loss is the per-example loss summed and divided by the global batch size
(``tf.nn.compute_average_loss``), with regularisation scaled by ``1 / num_replicas_in_sync``,
so gradients summed over replicas are the gradient of the global mean loss.
"""

from __future__ import annotations

import contextlib
import inspect
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from sparktf.errors import SparktfValueError
from sparktf.models.layers import SERIALIZABLE_PACKAGE

__all__ = [
    "EpochDecay",
    "LR_SCHEDULES",
    "OPTIMIZERS",
    "PRECISIONS",
    "apply_gradients",
    "build_optimizer",
    "check_optimizer_spec",
    "check_schedule",
    "clip_by_global_norm_across_replicas",
    "current_learning_rate",
    "decay_on_servers",
    "inner_optimizer",
    "learning_rate_schedule",
    "loss_scale",
    "optimizer_from_config",
    "polynomial_decay_steps",
    "precision_policy",
    "reduce_metrics",
    "regularization_loss",
    "weights_for_export",
]

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


LR_SCHEDULES = ("constant", "fixed", "piecewise", "exponential", "polynomial", "epoch_decay")


def _positive(config: Mapping[str, Any], key: str, *, allow_zero: bool = False) -> float:
    value = config.get(key)
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if not ok or not (value >= 0 if allow_zero else value > 0):
        bound = ">= 0" if allow_zero else "> 0"
        raise SparktfValueError(f"{key} must be a number {bound}, got {value!r}")
    return float(value)


def polynomial_decay_steps(config: Mapping[str, Any], steps_per_epoch: int) -> int:
    """Steps over which ``polynomial`` decays: ``lr_decay_total_epochs`` epochs, else the
    config's ``epochs``, else its ``max_steps``."""
    epochs = config.get("lr_decay_total_epochs") or config.get("epochs")
    if epochs:
        return max(1, int(round(float(epochs) * steps_per_epoch)))
    if config.get("max_steps"):
        return int(config["max_steps"])
    raise SparktfValueError(
        "lr_schedule 'polynomial' decays over lr_decay_total_epochs epochs (default: the "
        "config's epochs or max_steps), but none of them is set"
    )


def check_schedule(config: Mapping[str, Any]) -> None:
    """Raises ``ValueError`` naming the key when the schedule of ``config`` cannot work."""
    kind = config.get("lr_schedule", "constant")
    if kind not in LR_SCHEDULES:
        raise SparktfValueError(
            f"unknown lr_schedule {kind!r}; expected one of {list(LR_SCHEDULES)}"
        )
    _positive(config, "learning_rate")
    if kind == "piecewise":
        boundaries = config.get("lr_boundaries_epochs") or []
        if not boundaries:
            raise SparktfValueError("lr_schedule 'piecewise' needs lr_boundaries_epochs (epochs)")
        if any(not isinstance(b, (int, float)) or b <= 0 for b in boundaries) or list(
            boundaries
        ) != sorted(set(boundaries)):
            raise SparktfValueError(
                f"lr_boundaries_epochs must be increasing positive epochs, got {boundaries}"
            )
        _positive(config, "lr_decay_factor")
    elif kind == "exponential":
        _positive(config, "lr_decay_epochs")
        _positive(config, "lr_decay_factor")
    elif kind == "polynomial":
        _positive(config, "end_learning_rate", allow_zero=True)
        if config.get("lr_decay_total_epochs") is not None:
            _positive(config, "lr_decay_total_epochs")
        polynomial_decay_steps(config, 1)
    elif kind == "epoch_decay":
        _positive(config, "lr_decay")
        if not isinstance(config.get("max_epoch"), int):
            raise SparktfValueError(
                f"max_epoch must be an integer, got {config.get('max_epoch')!r}"
            )


def learning_rate_schedule(
    config: Mapping[str, Any], steps_per_epoch: int
) -> float | keras.optimizers.schedules.LearningRateSchedule:
    """The learning rate a config declares, keyed on ``optimizer.iterations``.

    ``config["lr_schedule"]`` is one of (the book's ``--learning-rate-decay-type`` names
    plus PTB's):

    * ``"constant"`` / ``"fixed"`` -- ``learning_rate``.
    * ``"piecewise"`` -- ``learning_rate`` multiplied by ``lr_decay_factor`` at each of
      ``lr_boundaries_epochs`` (ResNet's step schedule).
    * ``"exponential"`` -- ``learning_rate * lr_decay_factor ** floor(epoch /
      lr_decay_epochs)`` (slim's staircase exponential decay).
    * ``"polynomial"`` -- linear from ``learning_rate`` down to ``end_learning_rate`` over
      :func:`polynomial_decay_steps`, then constant (slim's polynomial decay, power 1).
    * ``"epoch_decay"`` -- :class:`EpochDecay` with ``lr_decay`` and ``max_epoch`` (PTB).
    """
    if steps_per_epoch < 1:
        raise SparktfValueError(f"steps_per_epoch must be >= 1, got {steps_per_epoch}")
    check_schedule(config)
    kind = config.get("lr_schedule", "constant")
    lr = float(config["learning_rate"])
    if kind in ("constant", "fixed"):
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
    if kind == "polynomial":
        return keras.optimizers.schedules.PolynomialDecay(
            lr,
            polynomial_decay_steps(config, steps_per_epoch),
            float(config["end_learning_rate"]),
            power=1.0,
        )
    return EpochDecay(lr, config["lr_decay"], steps_per_epoch, config["max_epoch"])


# --------------------------------------------------------------------------- optimizers

# The book's optimizer names (slim's train_image_classifier --optimizer) -> Keras 3 classes.
# "momentum" is SGD with momentum (default 0.9, slim's --momentum; nesterov as an option);
# "sgd" is Keras SGD, plain unless its spec sets a momentum.
OPTIMIZERS: dict[str, type[keras.optimizers.Optimizer]] = {
    "adadelta": keras.optimizers.Adadelta,
    "adagrad": keras.optimizers.Adagrad,
    "adam": keras.optimizers.Adam,
    "ftrl": keras.optimizers.Ftrl,
    "momentum": keras.optimizers.SGD,
    "rmsprop": keras.optimizers.RMSprop,
    "sgd": keras.optimizers.SGD,
}
_SPEC_DEFAULTS: dict[str, dict[str, Any]] = {"momentum": {"momentum": 0.9}}
# Set from the config itself (learning_rate, moving_average_decay, precision), never
# in the optimizer spec.
_MANAGED = {
    "learning_rate": "the config's learning_rate / lr_schedule",
    "use_ema": "the config's moving_average_decay",
    "ema_momentum": "the config's moving_average_decay",
    "ema_overwrite_frequency": "the config's moving_average_decay (the averages are "
    "exported, never written over the weights)",
    "loss_scale_factor": 'the config\'s precision ("fp16" scales the loss)',
}


def _optimizer_arguments(cls: type[keras.optimizers.Optimizer]) -> set[str]:
    params = inspect.signature(cls.__init__).parameters.values()
    return {p.name for p in params if p.kind is p.POSITIONAL_OR_KEYWORD} - {"self"}


def check_optimizer_spec(spec: Any) -> None:
    """Raises ``ValueError`` when ``spec`` is not ``{"name": one of OPTIMIZERS, **kwargs}``
    with keyword arguments the Keras class takes."""
    if not isinstance(spec, Mapping) or "name" not in spec:
        raise SparktfValueError(f'optimizer must be {{"name": ..., **keras_kwargs}}, got {spec!r}')
    name = spec["name"]
    if name not in OPTIMIZERS:
        raise SparktfValueError(f"unknown optimizer {name!r}; expected one of {sorted(OPTIMIZERS)}")
    kwargs = set(spec) - {"name"}
    managed = sorted(kwargs & set(_MANAGED))
    if managed:
        raise SparktfValueError(
            f"optimizer {name!r}: do not set {managed[0]!r} in its spec; it comes from "
            f"{_MANAGED[managed[0]]}"
        )
    unknown = sorted(kwargs - _optimizer_arguments(OPTIMIZERS[name]))
    if unknown:
        allowed = sorted(_optimizer_arguments(OPTIMIZERS[name]) - set(_MANAGED) - {"name"})
        raise SparktfValueError(
            f"optimizer {name!r} ({OPTIMIZERS[name].__name__}) takes no {unknown}; "
            f"it takes {allowed}"
        )


def build_optimizer(
    spec: Mapping[str, Any],
    learning_rate: float | keras.optimizers.schedules.LearningRateSchedule,
    variables: Sequence[tf.Variable] | None = None,
    *,
    moving_average_decay: float | None = None,
    loss_scale: bool = False,
    decay: Decay = (),
) -> keras.optimizers.Optimizer:
    """A Keras optimizer from ``{"name": <one of OPTIMIZERS>, **keras_kwargs}``.

    ``moving_average_decay`` keeps an exponential moving average of the trainable weights
    in the optimizer (Keras ``use_ema``: ``average = decay * average + (1 - decay) *
    weight`` after every update, the first update copying the weight); the averages are
    optimizer variables, so they are checkpointed with it.  ``loss_scale`` wraps the
    optimizer in a dynamic :class:`keras.optimizers.LossScaleOptimizer` (fp16).

    When ``variables`` are given the optimizer is built on them now (creating its slot
    variables), which a distributed step needs: slots cannot be created inside
    ``strategy.run``.  Call it inside ``strategy.scope()``.
    """
    check_optimizer_spec(spec)
    kwargs = dict(spec)
    name = kwargs.pop("name")
    kwargs = {**_SPEC_DEFAULTS.get(name, {}), **kwargs}
    if moving_average_decay is not None:
        kwargs.update(use_ema=True, ema_momentum=float(moving_average_decay))
    if decay and not loss_scale:  # (variable, regularizer): see decay_on_servers
        optimizer = _decaying(OPTIMIZERS[name])(learning_rate=learning_rate, **kwargs)
        optimizer.decay_on_servers = _DecayOnServers(decay)
    else:
        optimizer = OPTIMIZERS[name](learning_rate=learning_rate, **kwargs)
    if loss_scale:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    if variables is not None:
        optimizer.build(list(variables))
    return optimizer


def optimizer_from_config(
    config: Mapping[str, Any],
    steps_per_epoch: int,
    variables: Sequence[tf.Variable] | None = None,
    decay_on_servers: bool = False,
) -> keras.optimizers.Optimizer:
    """The optimizer a model config declares: ``optimizer`` spec, learning-rate schedule,
    ``moving_average_decay`` and (``precision == "fp16"``) loss scaling. With
    ``decay_on_servers`` (the model's losses are its weights' decay alone) and under
    ``ParameterServerStrategy`` its updates add the decay's gradient (:func:`decay_on_servers`)."""
    loss_scale = config.get("precision") == "fp16"
    decay = (
        _decay_wanted(variables, config.get("clip_norm"), loss_scale)
        if decay_on_servers and variables is not None
        else []
    )
    return build_optimizer(
        config["optimizer"],
        learning_rate_schedule(config, steps_per_epoch),
        variables,
        moving_average_decay=config.get("moving_average_decay"),
        loss_scale=loss_scale,
        decay=decay,
    )


def inner_optimizer(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """The optimizer doing the updates (unwraps a :class:`LossScaleOptimizer`)."""
    return getattr(optimizer, "inner_optimizer", optimizer)


def current_learning_rate(optimizer: keras.optimizers.Optimizer) -> tf.Tensor:
    """The learning rate the optimizer applies at its current iteration (float32)."""
    return tf.cast(tf.convert_to_tensor(optimizer.learning_rate), tf.float32)


# --------------------------------------------------------------------------- gradients


Decay = Sequence[tuple[Any, Any]]  # (variable, its regularizer)


def decay_on_servers(model: keras.Model, optimizer: Any) -> Decay | None:
    """The weight decay of ``model`` as (variable, regularizer) pairs when ``optimizer``
    adds its gradient where the variables live (:func:`build_optimizer` with ``decay``,
    under ``ParameterServerStrategy``); else None: the decay is then part of the loss.

    Under that strategy every read of a variable in a worker's step is a transfer from its
    parameter server: the decay's ``model.losses`` read every kernel a second time, which
    doubled what the workers pulled a step (bench/README.md, "Bytes on the wire"). So the
    step computes the decay's value there (:func:`regularization_loss`: one number crosses)
    and leaves it out of its loss, and the optimizer's update, which runs on the variable's
    device, adds the decay's gradient to the worker's. The same sum, in another place.
    """
    holder = getattr(optimizer, "decay_on_servers", None)
    return holder.pairs if isinstance(holder, _DecayOnServers) else None


class _DecayOnServers:
    """The pairs an optimizer decays (a plain object: neither Keras nor TensorFlow tracks
    it, so the optimizer's checkpoint is what it was)."""

    def __init__(self, pairs: Decay) -> None:
        self.pairs = list(pairs)
        self.of = {id(_tf_variable(v)): regularizer for v, regularizer in self.pairs}


def _decay_wanted(variables: Sequence[Any], clip_norm: float | None, loss_scale: bool) -> Decay:
    """The (variable, regularizer) pairs the optimizer should decay on the parameter
    servers: under ``ParameterServerStrategy`` only, and not with clipping or loss scaling
    (they need the whole gradient where it is computed)."""
    if clip_norm or loss_scale:
        return []
    if not isinstance(tf.distribute.get_strategy(), tf.distribute.ParameterServerStrategy):
        return []
    return [(v, v.regularizer) for v in variables if getattr(v, "regularizer", None) is not None]


_DECAYING: dict[type, type] = {}


def _decaying(base: type) -> type:
    """``base`` (a Keras optimizer class) whose update adds the weight decay's gradient of
    the variables in its ``decay_on_servers`` (the update runs on each variable's device)."""
    if base not in _DECAYING:

        def update_step(self, gradient, variable, learning_rate):
            regularizer = self.decay_on_servers.of.get(id(variable))
            if regularizer is not None:
                with tf.GradientTape() as tape:
                    tape.watch(variable)
                    term = tf.cast(regularizer(variable), tf.float32)
                gradient = gradient + tf.cast(tape.gradient(term, variable), gradient.dtype)
            return base.update_step(self, gradient, variable, learning_rate)

        _DECAYING[base] = type(base.__name__, (base,), {"update_step": update_step})
    return _DECAYING[base]


def _tf_variable(variable: Any) -> tf.Variable:
    """The TensorFlow variable of a Keras one (what the optimizer's update is given)."""
    return getattr(variable, "value", variable)


def regularization_loss(model: keras.Model, decay: Decay | None = None) -> tf.Tensor:
    """Sum of ``model.losses`` (weight decay), scaled by ``1 / num_replicas_in_sync``; with
    ``decay`` (:func:`decay_on_servers`) each term computed on its variable's device."""
    if decay is None:
        losses = model.losses
    else:
        losses = []
        for variable, regularizer in decay:
            with tf.device(_tf_variable(variable).device):
                losses.append(regularizer(variable))
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


def loss_scale(optimizer: keras.optimizers.Optimizer) -> tf.Tensor | None:
    """The factor ``optimizer.scale_loss`` multiplies the loss by (``None``: none)."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return tf.convert_to_tensor(optimizer.dynamic_scale)
    factor = getattr(optimizer, "loss_scale_factor", None)
    return None if factor is None else tf.constant(float(factor))


def _map_gradients(grads: list, fn: Any) -> list:
    """``fn`` applied to every gradient (the values of an ``IndexedSlices``)."""
    out = []
    for g in grads:
        if g is None:
            out.append(None)
        elif isinstance(g, tf.IndexedSlices):
            out.append(tf.IndexedSlices(fn(g.values), g.indices, g.dense_shape))
        else:
            out.append(fn(g))
    return out


def _agree_on_overflow(grads: list) -> list:
    """Makes every replica see non-finite gradients when any replica has them.

    A :class:`~keras.optimizers.LossScaleOptimizer` decides from the gradients it is
    given (replica-local, before Keras all-reduces them) whether to apply the step or
    to lower the loss scale; replicas deciding differently would run different
    collectives (a hang under ``MultiWorkerMirroredStrategy``) or apply an overflowed
    sum.  One scalar all-reduce makes the decision the same everywhere.
    """
    replica_context = tf.distribute.get_replica_context()
    if replica_context is None or tf.distribute.get_strategy().num_replicas_in_sync < 2:
        return grads
    present = [g.values if isinstance(g, tf.IndexedSlices) else g for g in grads if g is not None]
    if not present:
        return grads
    finite = tf.reduce_all([tf.reduce_all(tf.math.is_finite(g)) for g in present])
    overflows = replica_context.all_reduce(
        tf.distribute.ReduceOp.SUM, 1.0 - tf.cast(finite, tf.float32)
    )
    poison = tf.where(overflows > 0.0, float("nan"), 1.0)
    return _map_gradients(grads, lambda g: g * tf.cast(poison, g.dtype))


def apply_gradients(
    optimizer: keras.optimizers.Optimizer,
    loss: tf.Tensor,
    tape: tf.GradientTape,
    variables: Sequence[tf.Variable],
    clip_norm: float | None = None,
) -> None:
    """Gradient of ``loss``, optionally clipped across replicas, applied to ``variables``.

    The loss is scaled by ``optimizer.scale_loss`` first (a no-op except under a
    :class:`~keras.optimizers.LossScaleOptimizer`, fp16), recorded on ``tape`` so the
    gradient is that of the scaled loss; the optimizer unscales it.  Clipping works on
    the unscaled gradient.  Every family's train step goes through here.
    """
    variables = list(variables)
    with tape:  # resumes recording: the scaling is part of the differentiated graph
        scaled = optimizer.scale_loss(loss)
    grads = tape.gradient(scaled, variables)
    scale = loss_scale(optimizer)
    if scale is not None:
        grads = _agree_on_overflow(grads)
    if clip_norm:
        if scale is not None:
            grads = _map_gradients(grads, lambda g: g / tf.cast(scale, g.dtype))
        grads = clip_by_global_norm_across_replicas(grads, clip_norm)
        if scale is not None:
            grads = _map_gradients(grads, lambda g: g * tf.cast(scale, g.dtype))
    optimizer.apply_gradients(zip(grads, variables))


def reduce_metrics(
    strategy: tf.distribute.Strategy, per_replica: Mapping[str, Any]
) -> dict[str, tf.Tensor]:
    """Combines the replica-local metric means a step returned (``ReduceOp.MEAN``)."""
    return {
        key: strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None)
        for key, value in per_replica.items()
    }


# --------------------------------------------------------------------------- averages, precision


def weights_for_export(
    task: Any, model: keras.Model, optimizer: keras.optimizers.Optimizer | Mapping[str, Any]
) -> list[np.ndarray]:
    """``model.get_weights()``, with each trainable weight replaced by its moving average
    when the task's config sets ``moving_average_decay`` (unchanged otherwise).

    What evaluation and the export should use: slim evaluates and exports the averaged
    weights.  ``optimizer`` is what ``task.make_optimizer`` returned (a dict of them for
    a GAN; each covers its own part of the model).  Non-trainable weights (batch-norm
    statistics, ...) are the model's own.
    """
    if not task.config.get("moving_average_decay"):
        return model.get_weights()
    optimizers = list(optimizer.values()) if isinstance(optimizer, Mapping) else [optimizer]
    averages: dict[Any, Any] = {}
    for wrapped in optimizers:
        inner = inner_optimizer(wrapped)
        if not getattr(inner, "use_ema", False) or not inner.built:
            raise SparktfValueError(
                f"{task.name} sets moving_average_decay but its optimizer keeps no moving "
                "averages (build it with task.make_optimizer(steps_per_epoch, model))"
            )
        # Keras keys its per-variable state by _var_key (the distributed container's id).
        for variable, average in zip(
            inner._trainable_variables, inner._model_variables_moving_average
        ):
            if average is not None:
                averages[inner._var_key(variable)] = average
    key = inner_optimizer(optimizers[0])._var_key
    weights = []
    for variable in model.weights:
        average = averages.get(key(variable)) if variable.trainable else None
        weights.append(np.asarray((variable if average is None else average).numpy()))
    return weights


# --precision -> Keras dtype policy: compute in 16 bits, variables stay float32.
PRECISIONS: dict[str, str] = {
    "fp32": "float32",
    "bf16": "mixed_bfloat16",
    "fp16": "mixed_float16",
}


@contextlib.contextmanager
def precision_policy(name: str) -> Iterator[keras.DTypePolicy]:
    """Sets the Keras global dtype policy of ``name`` (a config ``precision``) while the
    block runs, and restores the previous policy after it.

    Wrap it around ``task.build_model()`` for the *training* model only: layers take the
    policy when they are created, so a model built outside the block (the export model)
    computes in float32 and takes the same float32 weights.  fp16 also needs loss
    scaling, which ``task.make_optimizer`` adds from the config's ``precision``.  Keras
    keeps the global policy per thread: build the model in the thread that enters this.
    """
    if name not in PRECISIONS:
        raise SparktfValueError(f"unknown precision {name!r}; expected one of {sorted(PRECISIONS)}")
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(PRECISIONS[name])
    try:
        yield keras.config.dtype_policy()
    finally:
        keras.config.set_dtype_policy(previous)
