"""The image-classifier task shared by ResNet, AlexNet and the MNIST models.

:class:`ClassifierTask` holds the classifier's train / eval step (softmax cross-entropy,
optionally against label-smoothed targets, weight decay, optional clipping) and its
SavedModel export with the 7.4-style
``serving_default`` (serialized ``tf.train.Example``) and ``predict_images`` (uint8
images) signatures.  A family only adds :meth:`ClassifierTask.build_logits`.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, ClassVar

import keras
import numpy as np
import tensorflow as tf

from sparktf.errors import SparktfValueError
from sparktf.models.export import Endpoint
from sparktf.models.layers import ScaleImage, count_params
from sparktf.models.optim import (
    apply_gradients,
    current_learning_rate,
    decay_on_servers,
    regularization_loss,
)
from sparktf.models.task import Batch, Metrics, ModelTask, RegistryModel

__all__ = ["ClassifierTask", "check_regularisation"]

logger = logging.getLogger(__name__)


def check_regularisation(config: dict) -> None:
    """``weight_decay`` >= 0 and ``label_smoothing`` in [0, 1): numbers, not booleans."""
    for key, upper in (("weight_decay", None), ("label_smoothing", 1.0)):
        value = config[key]
        if (
            not isinstance(value, (int, float))
            or isinstance(value, bool)
            or value < 0
            or (upper is not None and value >= upper)
        ):
            bound = f"in [0, {upper})" if upper else ">= 0"
            raise SparktfValueError(f"{key} must be a number {bound}, got {value!r}")


class ClassifierTask(ModelTask):
    """Image classifiers: uint8 ``image`` [B,H,W,C] and int64 ``label`` [B].

    Subclasses implement :meth:`build_logits` on the scaled float images.  Config keys:
    ``image_shape``, ``num_classes``, ``scaling`` (a :class:`ScaleImage` mode),
    ``weight_decay`` (L2 on every kernel, TF1 style ``weight_decay * l2_loss(w)``; 0 for
    none), ``label_smoothing`` (the training loss's targets are ``(1 - s) * one_hot + s /
    num_classes``, as slim's ``--label_smoothing``; evaluation and accuracy use the true
    labels) and ``clip_norm`` (``None`` for no clipping).
    """

    kind: ClassVar[str] = "classifier"
    shared_defaults: ClassVar[Mapping[str, Any]] = {"weight_decay": 0.0, "label_smoothing": 0.0}
    # The model's losses are its kernels' weight decay alone (the book's families): under
    # ParameterServerStrategy the decay is then computed where the variables are
    # (optim.decay_on_servers). A user's model may add losses of its own: not for it.
    losses_are_decay: ClassVar[bool] = True

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
            raise SparktfValueError(
                f"image_shape must be [H, W, C], got {self.config['image_shape']}"
            )
        if self.num_classes < 2:
            raise SparktfValueError(f"num_classes must be >= 2, got {self.num_classes}")
        check_regularisation(self.config)

    def build_logits(self, images: keras.KerasTensor) -> keras.KerasTensor:
        """Logits [B, num_classes] from scaled float images (functional API)."""
        raise NotImplementedError

    def build_model(self) -> keras.Model:
        images = keras.Input(self.image_shape, dtype="uint8", name="image")
        # Scaled in float32 under any precision policy (per-image standardisation in 16
        # bits would be coarse); the first layer casts to its compute dtype.
        scaled = ScaleImage(self.config["scaling"], dtype="float32", name="scale_image")(images)
        logits = self.build_logits(scaled)
        model = RegistryModel(images, logits, self.name, self.config, name=self.name)
        logger.info(
            "built %s: %d trainable parameters", self.name, count_params(model.trainable_weights)
        )
        return model

    def model_inputs(self, batch: Batch) -> Any:
        """What the model is called on: the batch's input column."""
        return batch[self.features[0]]

    def per_example_loss(
        self, labels: tf.Tensor, logits: tf.Tensor, label_smoothing: float = 0.0
    ) -> tf.Tensor:
        """Softmax cross-entropy of ``logits [B, K]`` against ``labels [B]``, per example."""
        if label_smoothing:
            targets = tf.one_hot(labels, self.num_classes, dtype=tf.float32)
            targets = targets * (1.0 - label_smoothing) + label_smoothing / self.num_classes
            return tf.nn.softmax_cross_entropy_with_logits(labels=targets, logits=logits)
        return tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)

    def forward(
        self, model: keras.Model, batch: Batch, training: bool, label_smoothing: float = 0.0
    ) -> tuple[tf.Tensor, tf.Tensor, tf.Tensor]:
        """One batch through the model: the logits, the per-example losses, and what
        :meth:`step_metrics` reads beside them (here whether each row was right)."""
        labels = tf.reshape(tf.cast(batch["label"], tf.int64), [-1])
        logits = tf.cast(model(self.model_inputs(batch), training=training), tf.float32)
        per_example = self.per_example_loss(labels, logits, label_smoothing)
        correct = tf.cast(tf.equal(tf.argmax(logits, axis=-1), labels), tf.float32)
        return logits, per_example, correct

    def step_metrics(self, batch: Batch, logits: tf.Tensor, correct: tf.Tensor) -> Metrics:
        """What a training step reports besides loss, regularization and learning rate."""
        return {"accuracy": tf.reduce_mean(correct)}

    def train_step(
        self, model: keras.Model, optimizer: Any, batch: Batch, global_batch_size: int
    ) -> Metrics:
        decay = decay_on_servers(model, optimizer)  # the optimizer adds its gradient
        with tf.GradientTape() as tape:
            logits, per_example, correct = self.forward(
                model, batch, training=True, label_smoothing=float(self.config["label_smoothing"])
            )
            loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch_size)
            reg = regularization_loss(model, decay)
            total = loss if decay is not None else loss + reg
        apply_gradients(
            optimizer, total, tape, model.trainable_variables, self.config.get("clip_norm")
        )
        num_replicas = tf.distribute.get_strategy().num_replicas_in_sync
        return {
            "loss": tf.reduce_mean(per_example),
            **self.step_metrics(batch, logits, correct),
            "regularization_loss": reg * num_replicas,
            "learning_rate": current_learning_rate(optimizer),
        }

    def eval_step(self, model: keras.Model, batch: Batch, global_batch_size: int) -> Metrics:
        _, per_example, correct = self.forward(model, batch, training=False)
        return {"loss": tf.reduce_mean(per_example), "accuracy": tf.reduce_mean(correct)}

    def serving_endpoints(self, model: keras.Model) -> dict[str, Endpoint]:
        height, width, channels = self.image_shape

        def outputs(images: tf.Tensor) -> dict[str, tf.Tensor]:
            logits = tf.cast(model(images, training=False), tf.float32)
            scores = tf.nn.softmax(logits, axis=-1)
            return {"classes": tf.argmax(scores, axis=-1), "scores": scores}

        def classify(inputs: tf.Tensor) -> dict[str, tf.Tensor]:
            features = tf.io.parse_example(inputs, {"image": tf.io.FixedLenFeature([], tf.string)})
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
