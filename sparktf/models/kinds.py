"""The kinds of a user's model (:mod:`sparktf.models.custom`): what each reads as labels, its
loss, metrics, evaluation and what its export returns.

* ``classifier``: integer classes, softmax cross-entropy on logits (the registry's
  :class:`~sparktf.models.classifier.ClassifierTask` does the work);
* ``binary``: 0/1 labels, sigmoid cross-entropy on one logit;
* ``multilabel``: a 0/1 vector per row, sigmoid cross-entropy per label;
* ``regression``: float labels (a scalar or a fixed-shape vector), ``mse`` unless a loss is
  named;
* ``custom``: a loss given by Keras name or function, float labels.

:class:`KindMixin` holds the steps, evaluation and export outputs of the kinds other than
classifier; :class:`~sparktf.models.custom.CustomTask` mixes it in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from sparktf.errors import SparktfValueError
from sparktf.models.task import Batch, Metrics

__all__ = [
    "CALLABLE_LOSS",
    "DEFAULT_METRICS",
    "KINDS",
    "LOSSES",
    "REGRESSION_LOSSES",
    "STEP_METRICS",
    "KindMixin",
    "check_kind_and_loss",
    "check_metrics",
    "kind_of",
    "per_example",
    "with_last_axis",
]

KINDS = ("classifier", "binary", "multilabel", "regression", "custom")
# Each kind's loss when none is given.
LOSSES = {
    "classifier": "sparse_categorical_crossentropy",
    "binary": "binary_crossentropy",
    "multilabel": "binary_crossentropy",
    "regression": "mse",
    "custom": "mse",
}
# Keras loss names that imply kind="regression" when no kind is given.
REGRESSION_LOSSES = (
    "mse",
    "mean_squared_error",
    "mae",
    "mean_absolute_error",
    "huber",
    "log_cosh",
    "mean_squared_logarithmic_error",
    "msle",
    "mean_absolute_percentage_error",
    "mape",
)
CALLABLE_LOSS = "callable"  # the config's ``loss`` when a loss function was registered
# The metrics a training step can report, per kind (evaluation takes any Keras metric name).
STEP_METRICS = {
    "classifier": ("accuracy", "top5_accuracy"),
    "binary": ("accuracy",),
    "multilabel": ("accuracy",),
    "regression": ("mae", "mse", "rmse"),
    "custom": ("mae", "mse", "rmse"),
}
# Each kind's metrics when none are given.
DEFAULT_METRICS = {
    "classifier": ("accuracy",),
    "binary": ("accuracy", "auc"),
    "multilabel": ("accuracy", "auc"),
    "regression": ("mae", "rmse"),
    "custom": (),
}


def kind_of(kind: str | None, loss: Any) -> str:
    """The kind a model has: ``kind``, else the one ``loss`` implies (classifier when
    neither is given)."""
    if kind is not None:
        return kind
    if loss is None or callable(loss) or loss in (CALLABLE_LOSS, LOSSES["classifier"]):
        return "classifier"
    if loss == "binary_crossentropy":
        return "binary"
    return "regression" if loss in REGRESSION_LOSSES else "custom"


def check_kind_and_loss(kind: Any, loss: Any) -> None:
    """ValueError for a kind sparktf does not train or a loss Keras does not know."""
    if kind is not None and kind not in KINDS:
        raise SparktfValueError(f"kind {kind!r} is not supported; custom models are {KINDS}")
    if loss is None or callable(loss) or loss == CALLABLE_LOSS:
        return
    if not isinstance(loss, str):
        raise SparktfValueError(
            f"loss must be a Keras loss name or a function (labels, outputs) -> per-example "
            f"losses, got {loss!r}"
        )
    try:
        keras.losses.get(loss)
    except ValueError:
        raise SparktfValueError(
            f"loss must be a Keras loss name (e.g. {sorted(set(LOSSES.values()))}, 'huber') or "
            f"a function (labels, outputs) -> per-example losses, got {loss!r}"
        ) from None
    if kind_of(kind, loss) == "classifier" and loss != LOSSES["classifier"]:
        raise SparktfValueError(
            f"loss {loss!r}: a classifier trains on {LOSSES['classifier']!r} or a function "
            "(labels, logits) -> per-example losses"
        )


def check_metrics(kind: str, names: Any) -> None:
    """ValueError for metric names a model of ``kind`` cannot report: a classifier's must be
    among its step metrics; another kind's may be any Keras metric name."""
    if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
        raise SparktfValueError(f"metrics must be a list of names, got {names!r}")
    if kind == "classifier":
        unknown = sorted(set(names) - set(STEP_METRICS["classifier"]))
        if unknown:
            raise SparktfValueError(
                f"metrics {unknown} are not known for a classifier; choose from "
                f"{STEP_METRICS['classifier']}"
            )
        return
    for name in names:
        if name not in STEP_METRICS[kind] and name not in ("auc", "rmse"):
            try:
                keras.metrics.get(name)
            except ValueError:
                raise SparktfValueError(
                    f"metric {name!r} is not a Keras metric name (the {kind} kind reports "
                    f"{STEP_METRICS[kind]} per step, and any Keras metric name in evaluation)"
                ) from None


class KindMixin:
    """The training, evaluation and export of a user's model of each kind; a classifier's
    steps are its base class's (the mixin comes first in the class's bases)."""

    @property
    def metric_names(self) -> tuple[str, ...]:
        metrics = self.config["metrics"]
        return DEFAULT_METRICS[self.kind] if metrics is None else tuple(metrics)

    @property
    def num_outputs(self) -> int:
        """The second argument of the build function: classes, labels or the label's size."""
        if self.kind == "classifier":
            return self.num_classes
        return math.prod(self.label_shape)

    def step_metrics(self, batch: Batch, logits: tf.Tensor, correct: tf.Tensor) -> Metrics:
        if self.kind != "classifier":  # ``correct`` holds the labels (KindMixin.forward)
            return self.value_metrics(logits, correct)
        out = {}
        if "accuracy" in self.metric_names:
            out["accuracy"] = tf.reduce_mean(correct)
        if "top5_accuracy" in self.metric_names:
            labels = tf.reshape(tf.cast(batch["label"], tf.int64), [-1])
            k = min(5, self.num_classes)
            out["top5_accuracy"] = tf.reduce_mean(
                tf.cast(tf.math.in_top_k(labels, logits, k), tf.float32)
            )
        return out

    def outputs(self, model: keras.Model, values: tf.Tensor, training: bool) -> tf.Tensor:
        """The model's float32 outputs: a classifier's logits ``[B, K]``, else in the
        label's shape ``[B, *label_shape]``."""
        out = tf.cast(model(values, training=training), tf.float32)
        if self.kind == "classifier":
            return out
        return tf.reshape(out, [-1, *self.label_shape])

    def per_example_loss(
        self, labels: tf.Tensor, logits: tf.Tensor, label_smoothing: float = 0.0
    ) -> tf.Tensor:
        loss_fn = type(self).spec.loss
        if callable(loss_fn):  # the user's loss(labels, outputs) -> per-example losses
            return tf.reshape(tf.cast(loss_fn(labels, logits), tf.float32), [-1])
        if self.kind == "classifier":
            return super().per_example_loss(labels, logits, label_smoothing)
        if self.kind in ("binary", "multilabel") and self.loss_name == "binary_crossentropy":
            per_value = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=logits)
        else:  # a Keras loss reduces the last axis: give it one
            per_value = keras.losses.get(self.loss_name)(
                with_last_axis(labels, self.label_shape), with_last_axis(logits, self.label_shape)
            )
        return per_example(tf.cast(per_value, tf.float32))

    def _labels(self, batch: Batch) -> tf.Tensor:
        """Another kind's labels: float32 ``[B, *label_shape]``."""
        return tf.reshape(tf.cast(batch["label"], tf.float32), [-1, *self.label_shape])

    def value_metrics(self, outputs: tf.Tensor, labels: tf.Tensor) -> Metrics:
        """The step metrics of a kind other than classifier, from one batch."""
        out: Metrics = {}
        names = self.metric_names
        if "accuracy" in names:
            hits = tf.equal(tf.cast(outputs > 0.0, tf.float32), tf.round(labels))
            out["accuracy"] = tf.reduce_mean(tf.cast(hits, tf.float32))
        error = outputs - labels
        if "mae" in names:
            out["mae"] = tf.reduce_mean(tf.abs(error))
        if "mse" in names or "rmse" in names:
            mse = tf.reduce_mean(tf.square(error))
            if "mse" in names:
                out["mse"] = mse
            if "rmse" in names:
                out["rmse"] = tf.sqrt(mse)
        return out

    def forward(
        self, model: keras.Model, batch: Batch, training: bool, label_smoothing: float = 0.0
    ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """The base's step reads this: a classifier's logits, losses and hits, else the
        outputs in the label's shape, the losses and the labels (for the step metrics)."""
        if self.kind == "classifier":
            return super().forward(model, batch, training, label_smoothing)
        labels = self._labels(batch)
        outputs = self.outputs(model, self.model_inputs(batch), training=training)
        return outputs, self.per_example_loss(labels, outputs), labels

    def eval_step(self, model: keras.Model, batch: Batch, global_batch_size: int) -> Metrics:
        if self.kind == "classifier":
            return super().eval_step(model, batch, global_batch_size)
        outputs, per_example, labels = self.forward(model, batch, training=False)
        return {"loss": tf.reduce_mean(per_example), **self.value_metrics(outputs, labels)}

    # -- evaluation -------------------------------------------------------------------------

    def evaluation_metrics(self) -> dict[str, keras.metrics.Metric] | None:
        """Fresh Keras metrics for one pass over an evaluation split (``None`` for a
        classifier, evaluated as the registry's are): ``loss`` and the config's metrics,
        accumulated over every row by :meth:`update_evaluation`."""
        if self.kind == "classifier":
            return None
        metrics: dict[str, keras.metrics.Metric] = {"loss": keras.metrics.Mean(name="loss")}
        for name in self.metric_names:
            if name == "accuracy" and self.kind in ("binary", "multilabel"):
                metrics[name] = keras.metrics.BinaryAccuracy(name=name)
            elif name == "auc":
                metrics[name] = keras.metrics.AUC(
                    name=name,
                    multi_label=self.kind == "multilabel",
                    num_labels=self.num_classes if self.kind == "multilabel" else None,
                )
            elif name == "rmse":  # not a name Keras knows
                metrics[name] = keras.metrics.RootMeanSquaredError(name=name)
            else:  # a fresh metric object ("mae" and "mse" included)
                metrics[name] = keras.metrics.get(name)
        return metrics

    def update_evaluation(
        self, metrics: Mapping[str, keras.metrics.Metric], model: keras.Model, batch: Batch
    ) -> None:
        """Adds one batch to :meth:`evaluation_metrics`' metrics (binary and multi-label
        metrics see probabilities, the others the outputs as they are)."""
        outputs, per_example, labels = self.forward(model, batch, training=False)
        metrics["loss"].update_state(per_example)
        if self.kind in ("binary", "multilabel"):
            outputs = tf.sigmoid(outputs)
        shaped = (
            with_last_axis(labels, self.label_shape),
            with_last_axis(outputs, self.label_shape),
        )
        for name, metric in metrics.items():
            if name != "loss":
                metric.update_state(*shaped)

    def predictions(self, model: keras.Model, values: tf.Tensor) -> dict[str, tf.Tensor]:
        """What the export's signatures return for a batch of inputs (see the module
        docstring)."""
        outputs = self.outputs(model, values, training=False)
        if self.kind == "classifier":
            scores = tf.nn.softmax(outputs, axis=-1)
            return {"classes": tf.argmax(scores, axis=-1), "scores": scores}
        if self.kind == "binary":
            p = tf.sigmoid(outputs)
            return {
                "classes": tf.cast(p > 0.5, tf.int64),
                "scores": tf.stack([1.0 - p, p], axis=-1),
            }
        if self.kind == "multilabel":
            return {"predictions": tf.sigmoid(outputs)}
        return {"predictions": outputs}

    def example_batch(self, batch_size: int, seed: int = 0) -> dict[str, tf.Tensor]:
        rng = np.random.default_rng(seed)
        if self.input_names is not None:
            inputs = {
                name: example_values(rng, dtype, (batch_size, *shape))
                for name, (dtype, shape) in self.input_specs.items()
            }
        elif self.input_dtype == "uint8":
            values = rng.integers(0, 256, size=(batch_size, *self.input_shape), dtype=np.uint8)
        else:
            values = rng.standard_normal((batch_size, *self.input_shape)).astype(np.float32)
        if self.input_names is None:
            inputs = {self.feature: values}
        if self.kind == "classifier":
            labels = rng.integers(0, self.num_classes, size=(batch_size,), dtype=np.int64)
        elif self.kind in ("binary", "multilabel"):
            labels = rng.integers(0, 2, size=(batch_size, *self.label_shape)).astype(np.float32)
        else:
            labels = rng.standard_normal((batch_size, *self.label_shape)).astype(np.float32)
        ids = np.arange(batch_size, dtype=np.int64)
        return {
            **{name: tf.constant(v) for name, v in inputs.items()},
            "label": tf.constant(labels),
            "id": tf.constant(ids),
        }


def example_values(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    """Random inputs of ``dtype`` (float32, int64 or string) and ``shape``."""
    if dtype == "string":
        return rng.choice(np.array(["a", "b", "c"], dtype=object), size=shape)
    if dtype == "int64":
        return rng.integers(0, 10, size=shape, dtype=np.int64)
    return rng.standard_normal(shape).astype(np.float32)


def with_last_axis(values: tf.Tensor, label_shape: tuple[int, ...]) -> tf.Tensor:
    """``[B]`` as ``[B, 1]`` (a Keras loss or metric reduces the last axis); others as
    they are."""
    return tf.expand_dims(values, -1) if not label_shape else values


def per_example(values: tf.Tensor) -> tf.Tensor:
    """The mean over every axis but the batch's: ``[B]``."""
    if values.shape.rank is not None and values.shape.rank <= 1:
        return tf.reshape(values, [-1])
    return tf.reduce_mean(tf.reshape(values, [tf.shape(values)[0], -1]), axis=-1)
