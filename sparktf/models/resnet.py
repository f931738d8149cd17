"""ResNet for CIFAR (and ImageNet-style stems), as in the book's ResNet reference.

Pre-activation residual units (BN -> ReLU -> conv), stages configured by
``num_residual_units`` / ``filters`` / ``strides``, basic (two 3x3 convs) or bottleneck
(1x1 -> 3x3 -> 1x1, the filters after the first multiplied by 4) units, a final
BN -> ReLU -> global average pooling -> logits.  L2 weight decay on every conv / dense
kernel; momentum SGD with a step schedule.

Depth = 6n + 2 for basic units (n units per stage) and 9n + 2 for bottleneck units, so
ResNet-20/32/56/110 use n = 3/5/9/18 and ResNet-164 is the bottleneck net with n = 18.

Training augments the images as the reference does on CIFAR (4-pixel zero padding, random
32x32 crop, random horizontal flip; :mod:`sparktf.models.augment`) unless the config says
``"augment": false`` (the jobs' ``--no-augment``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import keras
import tensorflow as tf

from sparktf.errors import SparktfValueError
from sparktf.models.augment import AugmentMixin
from sparktf.models.classifier import ClassifierTask
from sparktf.models.layers import SERIALIZABLE_PACKAGE, l2_regularizer

__all__ = ["PadShortcut", "ResNetTask"]


@keras.saving.register_keras_serializable(package=SERIALIZABLE_PACKAGE)
class PadShortcut(keras.layers.Layer):
    """Parameter-free shortcut: average-pool by ``stride`` and zero-pad the channels
    (He et al.'s option A, the reference's non-projection shortcut)."""

    def __init__(self, out_filters: int, stride: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.out_filters = int(out_filters)
        self.stride = int(stride)

    def call(self, x: tf.Tensor) -> tf.Tensor:
        if self.stride > 1:
            x = tf.nn.avg_pool2d(x, self.stride, self.stride, "VALID")
        extra = self.out_filters - x.shape[-1]
        if extra:
            x = tf.pad(x, [[0, 0], [0, 0], [0, 0], [extra // 2, extra - extra // 2]])
        return x

    def compute_output_shape(self, input_shape: tuple) -> tuple:
        b, h, w, _ = input_shape
        if self.stride > 1:
            h = None if h is None else h // self.stride
            w = None if w is None else w // self.stride
        return (b, h, w, self.out_filters)

    def get_config(self) -> dict:
        return {**super().get_config(), "out_filters": self.out_filters, "stride": self.stride}


class ResNetTask(AugmentMixin, ClassifierTask):
    family: ClassVar[str] = "resnet"
    description: ClassVar[str] = "pre-activation ResNet (CIFAR layout; basic or bottleneck units)"
    defaults: ClassVar[Mapping[str, Any]] = {
        # data
        "image_shape": [32, 32, 3],
        "num_classes": 10,
        "scaling": "standardize",
        # training-time padding + random crop + random flip (the CIFAR recipe; see
        # sparktf.models.augment); never applied at evaluation or in the export
        "augment": True,
        # architecture (defaults: ResNet-32)
        "num_residual_units": [5, 5, 5],
        "filters": [16, 16, 32, 64],
        "strides": [1, 2, 2],
        "activate_before_residual": [True, False, False],
        "use_bottleneck": False,
        "init_filter": 3,
        "init_stride": 1,
        "init_max_pool": False,
        "shortcut": "projection",  # or "pad" (parameter-free, He et al. option A)
        "bn_momentum": 0.9,
        "bn_epsilon": 1e-5,
        "weight_decay": 2e-4,
        # training as the reference trains it: batch 100, lr 0.1 / 0.01 / 0.001
        "batch_size": 100,
        "epochs": 160,
        "max_steps": None,
        "optimizer": {"name": "sgd", "momentum": 0.9},
        "learning_rate": 0.1,
        "lr_schedule": "piecewise",
        "lr_boundaries_epochs": [80, 120],
        "lr_decay_factor": 0.1,
        "clip_norm": None,
    }
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "resnet20": {"num_residual_units": [3, 3, 3]},
        "resnet32": {"num_residual_units": [5, 5, 5]},
        "resnet56": {"num_residual_units": [9, 9, 9]},
        "resnet110": {"num_residual_units": [18, 18, 18]},
        "resnet164": {
            "num_residual_units": [18, 18, 18],
            "use_bottleneck": True,
            "weight_decay": 1e-4,
        },
    }

    def validate(self) -> None:
        super().validate()
        c = self.config
        stages = len(c["num_residual_units"])
        if len(c["filters"]) != stages + 1:
            raise SparktfValueError(
                f"filters needs num_stages + 1 = {stages + 1} entries (the first is the "
                f"initial convolution), got {c['filters']}"
            )
        for key in ("strides", "activate_before_residual"):
            if len(c[key]) != stages:
                raise SparktfValueError(f"{key} needs one entry per stage ({stages}), got {c[key]}")
        if c["shortcut"] not in ("projection", "pad"):
            raise SparktfValueError(
                f"shortcut must be 'projection' or 'pad', got {c['shortcut']!r}"
            )

    @property
    def depth(self) -> int:
        per_unit = 3 if self.config["use_bottleneck"] else 2
        return per_unit * sum(self.config["num_residual_units"]) + 2

    # -- layers ------------------------------------------------------------------------

    def _conv(self, filters: int, kernel: int, stride: int, name: str) -> keras.layers.Layer:
        return keras.layers.Conv2D(
            filters,
            kernel,
            strides=stride,
            padding="same",
            use_bias=False,
            kernel_initializer=keras.initializers.VarianceScaling(
                2.0, mode="fan_out", distribution="untruncated_normal"
            ),
            kernel_regularizer=l2_regularizer(self.config["weight_decay"]),
            name=name,
        )

    def _bn_relu(self, x: keras.KerasTensor, name: str) -> keras.KerasTensor:
        x = keras.layers.BatchNormalization(
            momentum=self.config["bn_momentum"],
            epsilon=self.config["bn_epsilon"],
            name=f"{name}_bn",
        )(x)
        return keras.layers.ReLU(name=f"{name}_relu")(x)

    def _unit(
        self,
        x: keras.KerasTensor,
        in_filters: int,
        out_filters: int,
        stride: int,
        *,
        preactivate: bool,
        activate_before_residual: bool,
        name: str,
    ) -> keras.KerasTensor:
        """One pre-activation residual unit.

        ``preactivate`` is off for the very first unit (the stem already ends in
        BN -> ReLU).  With ``activate_before_residual`` the shortcut starts from the
        activated input, otherwise from the raw input.
        """
        activated = self._bn_relu(x, f"{name}_pre") if preactivate else x
        shortcut = activated if activate_before_residual else x
        if self.config["use_bottleneck"]:
            neck = out_filters // 4
            h = self._conv(neck, 1, stride, f"{name}_conv1")(activated)
            h = self._bn_relu(h, f"{name}_mid1")
            h = self._conv(neck, 3, 1, f"{name}_conv2")(h)
            h = self._bn_relu(h, f"{name}_mid2")
            h = self._conv(out_filters, 1, 1, f"{name}_conv3")(h)
        else:
            h = self._conv(out_filters, 3, stride, f"{name}_conv1")(activated)
            h = self._bn_relu(h, f"{name}_mid")
            h = self._conv(out_filters, 3, 1, f"{name}_conv2")(h)
        if in_filters != out_filters or stride != 1:
            if self.config["shortcut"] == "projection":
                shortcut = self._conv(out_filters, 1, stride, f"{name}_project")(shortcut)
            else:
                shortcut = PadShortcut(out_filters, stride, name=f"{name}_pad")(shortcut)
        return keras.layers.Add(name=f"{name}_add")([h, shortcut])

    def build_logits(self, images: keras.KerasTensor) -> keras.KerasTensor:
        c = self.config
        filters = list(c["filters"])
        if c["use_bottleneck"]:
            # For CIFAR [16, 16, 32, 64] -> [16, 64, 128, 256].
            filters = [filters[0]] + [f * 4 for f in filters[1:]]
        h = self._conv(filters[0], c["init_filter"], c["init_stride"], "init_conv")(images)
        h = self._bn_relu(h, "init")
        if c["init_max_pool"]:
            h = keras.layers.MaxPooling2D(3, 2, padding="same", name="init_pool")(h)
        for stage, units in enumerate(c["num_residual_units"]):
            for unit in range(units):
                first = unit == 0
                h = self._unit(
                    h,
                    filters[stage] if first else filters[stage + 1],
                    filters[stage + 1],
                    c["strides"][stage] if first else 1,
                    preactivate=not (stage == 0 and first),
                    activate_before_residual=bool(c["activate_before_residual"][stage]) and first,
                    name=f"unit_{stage + 1}_{unit}",
                )
        h = self._bn_relu(h, "final")
        h = keras.layers.GlobalAveragePooling2D(name="global_avg_pool")(h)
        return keras.layers.Dense(
            self.num_classes,
            kernel_initializer=keras.initializers.VarianceScaling(1.0, "fan_in", "uniform"),
            kernel_regularizer=l2_regularizer(c["weight_decay"]),
            dtype="float32",  # logits in float32 under a mixed precision policy
            name="logits",
        )(h)
