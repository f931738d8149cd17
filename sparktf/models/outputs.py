"""A user's model of several outputs, each with its own label column and loss (``outputs=``).

:class:`SeveralOutputs` is the part of :class:`sparktf.models.custom.CustomTask` that reads the
config key ``outputs``: ``{name: {"loss": ..., "weight": ...}}`` (``register`` also takes
``{name: "mse"}``). The build function gets ``{name: 1}`` as its second argument and returns a
``keras.Model`` whose outputs are a dict by the same names, one value per row each (``[B]`` or
``[B, 1]``). Each output's label is the column of its name (a number; 0 or 1 for
``binary_crossentropy``). ``binary_crossentropy`` is applied to a logit (the export gives its
sigmoid, the probability); any other Keras loss name (``mse``, ``huber``, ``mae``...) to the
output as it is. A row's loss is the weighted sum of its outputs' losses; a step and an
evaluation report ``loss`` and ``<name>_loss`` for each output. The export's signatures
return one tensor per output, by name, which :func:`sparktf.predict` adds as one ``double``
column each.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import keras
import numpy as np
import tensorflow as tf

from sparktf.errors import SparktfValueError
from sparktf.models.task import Batch, Metrics

__all__ = ["SeveralOutputs", "check_outputs", "outputs_config"]

BINARY = "binary_crossentropy"


def outputs_config(outputs: Mapping[str, Any] | None) -> dict[str, dict[str, Any]] | None:
    """``outputs`` as a config value: ``{name: {"loss": str, "weight": float}}``."""
    if outputs is None:
        return None
    if not isinstance(outputs, Mapping):
        raise SparktfValueError(f"outputs must map output names to losses, got {outputs!r}")
    out = {}
    for name, spec in outputs.items():
        spec = {"loss": spec} if isinstance(spec, str) else dict(spec)
        out[str(name)] = {"loss": spec.get("loss"), "weight": float(spec.get("weight", 1.0))}
    return out


def check_outputs(outputs: Any) -> None:
    """ValueError unless ``outputs`` is None or names two outputs or more, each with a Keras
    loss name and a positive weight."""
    if outputs is None:
        return
    if not isinstance(outputs, Mapping) or len(outputs) < 2:
        raise SparktfValueError(
            f"outputs must name two outputs or more, each with its loss, got {outputs!r} "
            "(one output: use loss= and the label column)"
        )
    for name, spec in outputs.items():
        if not isinstance(name, str) or not name or name == "label":
            raise SparktfValueError(f"outputs: {name!r} cannot name an output")
        loss = spec.get("loss") if isinstance(spec, Mapping) else None
        try:
            keras.losses.get(loss)
        except (TypeError, ValueError):
            raise SparktfValueError(
                f"outputs[{name!r}]: loss {loss!r} is not a Keras loss name"
            ) from None
        weight = spec.get("weight", 1.0)
        if not isinstance(weight, (int, float)) or weight <= 0:
            raise SparktfValueError(f"outputs[{name!r}]: weight must be > 0, got {weight!r}")


class SeveralOutputs:
    """The outputs of a task whose config has ``outputs`` (None: the kind's one output);
    every method defers to the next class otherwise."""

    @property
    def output_specs(self) -> dict[str, tuple[str, float]] | None:
        """Each output's loss name and weight, or None."""
        outputs = self.config.get("outputs")
        if not outputs:
            return None
        return {n: (s["loss"], float(s.get("weight", 1.0))) for n, s in outputs.items()}

    @property
    def metric_names(self) -> tuple[str, ...]:
        if self.output_specs is None:
            return super().metric_names
        return tuple(f"{name}_loss" for name in self.output_specs)

    @property
    def features(self) -> tuple[str, ...]:
        if self.output_specs is None:
            return super().features
        return (*super().features[:-1], *self.output_specs)  # the label columns by name

    @property
    def num_outputs(self) -> Any:
        if self.output_specs is None:
            return super().num_outputs
        return {name: 1 for name in self.output_specs}

    def _values(self, model: keras.Model, inputs: Any, training: bool) -> dict[str, tf.Tensor]:
        out = model(inputs, training=training)
        missing = [n for n in self.output_specs if not isinstance(out, Mapping) or n not in out]
        if missing:
            raise SparktfValueError(
                f"model {self.name!r} returns no output(s) {missing}: its outputs must be a "
                f"dict by the names of outputs= ({list(self.output_specs)})"
            )
        return {n: tf.reshape(tf.cast(out[n], tf.float32), [-1]) for n in self.output_specs}

    def _losses(self, values: dict[str, tf.Tensor], batch: Batch) -> dict[str, tf.Tensor]:
        """Each output's per-example loss against the label column of its name."""
        losses = {}
        for name, (loss, _) in self.output_specs.items():
            labels = tf.reshape(tf.cast(batch[name], tf.float32), [-1])
            if loss == BINARY:
                value = tf.nn.sigmoid_cross_entropy_with_logits(labels=labels, logits=values[name])
            else:
                value = keras.losses.get(loss)(labels[:, None], values[name][:, None])
            losses[name] = tf.reshape(tf.cast(value, tf.float32), [-1])
        return losses

    def forward(
        self, model: keras.Model, batch: Batch, training: bool, label_smoothing: float = 0.0
    ) -> tuple[Any, tf.Tensor, Any]:
        """The outputs, the rows' weighted loss, and each output's losses (for the step's
        metrics)."""
        if self.output_specs is None:
            return super().forward(model, batch, training, label_smoothing)
        values = self._values(model, self.model_inputs(batch), training)
        losses = self._losses(values, batch)
        total = tf.add_n([w * losses[n] for n, (_, w) in self.output_specs.items()])
        return values, total, losses

    def step_metrics(self, batch: Batch, logits: Any, correct: Any) -> Metrics:
        if self.output_specs is None:
            return super().step_metrics(batch, logits, correct)
        return {f"{name}_loss": tf.reduce_mean(value) for name, value in correct.items()}

    def eval_step(self, model: keras.Model, batch: Batch, global_batch_size: int) -> Metrics:
        if self.output_specs is None:
            return super().eval_step(model, batch, global_batch_size)
        values, total, losses = self.forward(model, batch, training=False)
        return {"loss": tf.reduce_mean(total), **self.step_metrics(batch, values, losses)}

    def evaluation_metrics(self) -> dict[str, keras.metrics.Metric] | None:
        if self.output_specs is None:
            return super().evaluation_metrics()
        names = ["loss", *self.metric_names]
        return {name: keras.metrics.Mean(name=name) for name in names}

    def update_evaluation(
        self, metrics: Mapping[str, keras.metrics.Metric], model: keras.Model, batch: Batch
    ) -> None:
        if self.output_specs is None:
            return super().update_evaluation(metrics, model, batch)
        _, total, losses = self.forward(model, batch, training=False)
        metrics["loss"].update_state(total)
        for name, value in losses.items():
            metrics[f"{name}_loss"].update_state(value)
        return None

    def predictions(self, model: keras.Model, values: Any) -> dict[str, tf.Tensor]:
        if self.output_specs is None:
            return super().predictions(model, values)
        out = self._values(model, values, training=False)
        return {
            name: tf.sigmoid(out[name]) if loss == BINARY else out[name]
            for name, (loss, _) in self.output_specs.items()
        }

    def outputs_info(self) -> dict[str, str]:
        """The export's outputs, as signature_info shows them."""
        return {name: "float32[B]" for name in self.output_specs}

    def example_batch(self, batch_size: int, seed: int = 0) -> dict[str, tf.Tensor]:
        batch = dict(super().example_batch(batch_size, seed))
        if self.output_specs is None:
            return batch
        batch.pop("label", None)
        rng = np.random.default_rng(seed + 1)
        for name, (loss, _) in self.output_specs.items():
            if loss == BINARY:
                values = rng.integers(0, 2, batch_size)
            else:
                values = rng.normal(size=batch_size)
            batch[name] = tf.constant(values.astype(np.float32))
        return batch
