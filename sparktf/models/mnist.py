"""The book's MNIST models (chapter 5).

* ``mnist_softmax`` (5.1): softmax regression ``y = xW + b`` with zero-initialised
  weights, plain SGD at learning rate 0.5, 1000 steps of batch 100.
* ``mnist_mlp`` (5.2): one ReLU hidden layer (``hidden_units``, 100 by default; weights
  truncated normal with stddev 1/28, softmax weights 1/sqrt(hidden_units)), Adam at
  learning rate 0.01, 200 steps of batch 100.

Both take raw uint8 28x28x1 images and scale them to [0, 1] inside the model.  The book
trains them without weight decay; ``weight_decay`` (the jobs' ``--weight-decay``) adds L2
on their kernels as on every classifier.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import keras

from sparktf.models.classifier import ClassifierTask
from sparktf.models.layers import l2_regularizer

__all__ = ["MnistMLPTask", "MnistSoftmaxTask"]

_MNIST: Mapping[str, Any] = {
    "image_shape": [28, 28, 1],
    "num_classes": 10,
    "scaling": "unit",
    "weight_decay": 0.0,
    "batch_size": 100,
    "epochs": None,
    "lr_schedule": "constant",
    "clip_norm": None,
}


class MnistSoftmaxTask(ClassifierTask):
    family: ClassVar[str] = "mnist_softmax"
    description: ClassVar[str] = "softmax regression on MNIST pixels (5.1)"
    defaults: ClassVar[Mapping[str, Any]] = {
        **_MNIST,
        "max_steps": 1000,
        "optimizer": {"name": "sgd"},
        "learning_rate": 0.5,
    }

    def build_logits(self, images: keras.KerasTensor) -> keras.KerasTensor:
        x = keras.layers.Flatten(name="flatten")(images)
        return keras.layers.Dense(
            self.num_classes,
            kernel_initializer="zeros",
            bias_initializer="zeros",
            kernel_regularizer=l2_regularizer(self.config["weight_decay"]),
            dtype="float32",  # logits in float32 under a mixed precision policy
            name="logits",
        )(x)


class MnistMLPTask(ClassifierTask):
    family: ClassVar[str] = "mnist_mlp"
    description: ClassVar[str] = "one-hidden-layer ReLU network on MNIST (5.2)"
    defaults: ClassVar[Mapping[str, Any]] = {
        **_MNIST,
        "hidden_units": 100,
        "max_steps": 200,
        "optimizer": {"name": "adam"},
        "learning_rate": 0.01,
    }

    def build_logits(self, images: keras.KerasTensor) -> keras.KerasTensor:
        hidden = int(self.config["hidden_units"])
        pixels = math.prod(self.image_shape)
        x = keras.layers.Flatten(name="flatten")(images)
        x = keras.layers.Dense(
            hidden,
            activation="relu",
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=1.0 / math.sqrt(pixels)),
            kernel_regularizer=l2_regularizer(self.config["weight_decay"]),
            name="hidden",
        )(x)
        return keras.layers.Dense(
            self.num_classes,
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=1.0 / math.sqrt(hidden)),
            kernel_regularizer=l2_regularizer(self.config["weight_decay"]),
            dtype="float32",  # logits in float32 under a mixed precision policy
            name="logits",
        )(x)
