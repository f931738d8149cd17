"""AlexNet v2 in TF-Slim's layout (book 9.2, "One weird trick", no LRN).

conv1 11x11/4 VALID (64) -> pool 3/2 -> conv2 5x5 (192) -> pool -> conv3/4 3x3 (384)
-> conv5 3x3 (256) -> pool -> fc6 as a 5x5 VALID conv (4096) -> dropout -> fc7 as a
1x1 conv (4096) -> dropout -> fc8 1x1 conv (num_classes, zero bias, no activation) ->
squeeze.  Biases start at 0.1, fc6/fc7/fc8 weights at truncated normal(0.005); L2 weight
decay on every kernel.  The network sees ``image_size`` x ``image_size`` images (224);
stored images of another size are resized inside the model.  Trained as slim's
``train_image_classifier`` does: RMSProp (decay 0.9, momentum 0.9, epsilon 1.0), lr 0.01
decayed x0.94 every 2 epochs (staircase).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import keras

from sparktf.errors import SparktfValueError
from sparktf.models.classifier import ClassifierTask
from sparktf.models.layers import l2_regularizer

__all__ = ["AlexNetV2Task"]


class AlexNetV2Task(ClassifierTask):
    family: ClassVar[str] = "alexnet_v2"
    description: ClassVar[str] = "TF-Slim AlexNet v2 with dropout and a convolutional head"
    defaults: ClassVar[Mapping[str, Any]] = {
        "image_shape": [224, 224, 3],
        "num_classes": 1000,
        "scaling": "symmetric",
        "image_size": 224,
        "dropout_keep_prob": 0.5,
        "global_pool": False,
        "fc_units": 4096,
        "weight_decay": 5e-4,
        "batch_size": 32,
        "epochs": None,
        "max_steps": None,
        "optimizer": {"name": "rmsprop", "rho": 0.9, "momentum": 0.9, "epsilon": 1.0},
        "learning_rate": 0.01,
        "lr_schedule": "exponential",
        "lr_decay_epochs": 2.0,
        "lr_decay_factor": 0.94,
        "clip_norm": None,
    }

    def validate(self) -> None:
        super().validate()
        if not self.config["global_pool"] and self.config["image_size"] != 224:
            raise SparktfValueError("alexnet_v2 needs image_size 224 unless global_pool is set")

    def build_logits(self, images: keras.KerasTensor) -> keras.KerasTensor:
        c = self.config
        reg = l2_regularizer(c["weight_decay"])
        bias = keras.initializers.Constant(0.1)

        def conv(filters: int, kernel: int, name: str, **kwargs: Any) -> keras.layers.Layer:
            kwargs.setdefault("padding", "same")
            kwargs.setdefault("activation", "relu")
            kwargs.setdefault("bias_initializer", bias)
            kwargs.setdefault("kernel_initializer", "glorot_uniform")
            return keras.layers.Conv2D(filters, kernel, kernel_regularizer=reg, name=name, **kwargs)

        def pool(name: str) -> keras.layers.Layer:
            return keras.layers.MaxPooling2D(3, 2, padding="valid", name=name)

        size = c["image_size"]
        x = images
        if tuple(self.image_shape[:2]) != (size, size):
            x = keras.layers.Resizing(size, size, name="resize")(x)
        x = conv(64, 11, "conv1", strides=4, padding="valid")(x)
        x = pool("pool1")(x)
        x = conv(192, 5, "conv2")(x)
        x = pool("pool2")(x)
        x = conv(384, 3, "conv3")(x)
        x = conv(384, 3, "conv4")(x)
        x = conv(256, 3, "conv5")(x)
        x = pool("pool5")(x)
        fc_init = keras.initializers.TruncatedNormal(0.0, 0.005)
        x = conv(c["fc_units"], 5, "fc6", padding="valid", kernel_initializer=fc_init)(x)
        x = keras.layers.Dropout(1.0 - c["dropout_keep_prob"], name="dropout6")(x)
        x = conv(c["fc_units"], 1, "fc7", kernel_initializer=fc_init)(x)
        if c["global_pool"]:
            x = keras.layers.GlobalAveragePooling2D(keepdims=True, name="global_pool")(x)
        x = keras.layers.Dropout(1.0 - c["dropout_keep_prob"], name="dropout7")(x)
        x = conv(
            self.num_classes,
            1,
            "fc8",
            activation=None,
            bias_initializer="zeros",
            kernel_initializer=fc_init,
            dtype="float32",  # logits in float32 under a mixed precision policy
        )(x)
        return keras.layers.Flatten(dtype="float32", name="fc8_squeezed")(x)
