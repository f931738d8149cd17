"""Optimisation pieces every family shares, correct under ``tf.distribute``.

* Learning-rate schedules keyed on ``optimizer.iterations``, so they resume from a
  checkpoint (:func:`learning_rate_schedule`, :class:`EpochDecay`).
* Optimizer construction from a config (:func:`build_optimizer`), with its slot variables
  built up front as a distributed step needs.
* Weight decay (:func:`regularization_loss`) and gradient clipping across replicas
  (:func:`clip_by_global_norm_across_replicas`, :func:`apply_gradients`).
* :func:`reduce_metrics`, combining the replica-local metric means a step returns.

The *optimised* loss is the per-example loss summed and divided by the global batch size
(``tf.nn.compute_average_loss``), with regularisation scaled by ``1 / num_replicas_in_sync``,
so gradients summed over replicas are the gradient of the global mean loss.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf

from sparktf.models.layers import SERIALIZABLE_PACKAGE

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


# --------------------------------------------------------------------------- optimizers

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


def reduce_metrics(
    strategy: tf.distribute.Strategy, per_replica: Mapping[str, Any]
) -> dict[str, tf.Tensor]:
    """Combines the replica-local metric means a step returned (``ReduceOp.MEAN``)."""
    return {
        key: strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None)
        for key, value in per_replica.items()
    }
