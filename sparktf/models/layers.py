"""Keras building blocks shared by the model families.

* :data:`SERIALIZABLE_PACKAGE` -- the package every custom Keras object of
  :mod:`sparktf.models` registers under (``"sparktf>ScaleImage"``, ...), so a saved model
  names its classes the same way whichever module defines them.
* :class:`ScaleImage` -- uint8 -> float scaling done *inside* the model, so an exported
  model accepts exactly what the datasets store; :func:`images_to_uint8` inverts it.
* :func:`l2_regularizer` -- TF1-style weight decay; :func:`count_params` -- model sizes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import keras
import tensorflow as tf

from sparktf.errors import SparktfValueError

__all__ = [
    "SERIALIZABLE_PACKAGE",
    "ScaleImage",
    "count_params",
    "images_to_uint8",
    "l2_regularizer",
]

SERIALIZABLE_PACKAGE = "sparktf"


def l2_regularizer(weight_decay: float) -> keras.regularizers.Regularizer | None:
    """L2 weight decay as TF1's ``weight_decay * tf.nn.l2_loss(w)`` (= wd/2 * sum(w**2))."""
    if not weight_decay:
        return None
    return keras.regularizers.L2(weight_decay / 2.0)


def count_params(weights: Sequence[Any]) -> int:
    """Number of scalars in ``weights``."""
    return int(sum(math.prod(int(d) for d in w.shape) for w in weights))


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
            raise SparktfValueError(f"ScaleImage mode must be one of {self.MODES}, got {mode!r}")
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
        raise SparktfValueError(f"cannot invert image scaling mode {mode!r}")
    return tf.cast(tf.clip_by_value(tf.round(pixels), 0.0, 255.0), tf.uint8)
