"""DCGAN (book 10.3, after carpedm20/DCGAN-tensorflow).

Unconditional (e.g. 64x64x3): the generator projects ``z`` to a ``gf_dim*8`` feature
map of 1/16 the image size and doubles it four times with 5x5 stride-2 transposed
convolutions (BN + ReLU, tanh output in [-1, 1]); the discriminator mirrors it with
5x5 stride-2 convolutions (BN + leaky ReLU 0.2; no BN on the first) and one logit.

Conditional on the label (MNIST 28x28x1, the book's default for MNIST): the one-hot
label is appended to the generator's input, to its hidden vectors and to every pixel of
its feature maps; generator = dense(``gfc_dim``) -> dense(``gf_dim*2`` x 7 x 7) ->
transposed conv to 14 x 14 -> transposed conv to 28 x 28, sigmoid output in [0, 1];
discriminator = conv(c + y) -> conv(``df_dim`` + y) + BN -> dense(``dfc_dim``) + BN -> 1.

Real uint8 images are scaled into the generator's output range inside the model.
Training: Adam (lr 0.0002, beta1 0.5) for both nets; per step ``discriminator_steps`` (1)
discriminator updates then ``generator_steps`` (2, "so that d_loss does not go to zero")
generator updates on the same ``z`` ~ U(-1, 1).  Reported ``d_*`` / ``g_loss`` are the
losses of the last update of each net (0 steps: that net is only evaluated).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import keras
import numpy as np
import tensorflow as tf

from sparktf.errors import SparktfValueError
from sparktf.models.export import Endpoint
from sparktf.models.layers import SERIALIZABLE_PACKAGE, ScaleImage, images_to_uint8
from sparktf.models.optim import apply_gradients, current_learning_rate, optimizer_from_config
from sparktf.models.task import Batch, Metrics, ModelTask, RegistryConfigMixin

__all__ = ["ConcatCondition", "DCGAN", "DCGANTask"]


@keras.saving.register_keras_serializable(package=SERIALIZABLE_PACKAGE)
class ConcatCondition(keras.layers.Layer):
    """Appends a condition vector [B, K] to a vector [B, N] or to every pixel of a
    feature map [B, H, W, N] (the reference's ``conv_cond_concat``)."""

    def call(self, x: tf.Tensor, condition: tf.Tensor) -> tf.Tensor:
        condition = tf.cast(condition, x.dtype)
        if x.shape.rank == 4:
            shape = tf.shape(x)
            condition = tf.tile(condition[:, None, None, :], [1, shape[1], shape[2], 1])
        return tf.concat([x, condition], axis=-1)

    def compute_output_shape(self, x_shape: tuple, condition_shape: tuple) -> tuple:
        return (*x_shape[:-1], x_shape[-1] + condition_shape[-1])


def _halve(size: int) -> int:
    return int(math.ceil(size / 2))


class _Builder:
    """Builds the generator and discriminator functional models from a config."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.c = config
        self.height, self.width, self.channels = (int(d) for d in config["image_shape"])
        self.conditional = bool(config["conditional"])
        self.num_classes = int(config["num_classes"])

    def _normal(self) -> keras.initializers.Initializer:
        return keras.initializers.RandomNormal(stddev=self.c["init_stddev"])

    def _bn(self, name: str) -> keras.layers.Layer:
        return keras.layers.BatchNormalization(
            momentum=self.c["bn_momentum"], epsilon=self.c["bn_epsilon"], name=name
        )

    def _lrelu(self, name: str) -> keras.layers.Layer:
        return keras.layers.LeakyReLU(self.c["leak"], name=name)

    def _dense(self, units: int, name: str, **kwargs: Any) -> keras.layers.Layer:
        return keras.layers.Dense(units, kernel_initializer=self._normal(), name=name, **kwargs)

    def _conv(self, filters: int, name: str) -> keras.layers.Layer:
        return keras.layers.Conv2D(
            filters,
            5,
            strides=2,
            padding="same",
            kernel_initializer=keras.initializers.TruncatedNormal(stddev=self.c["init_stddev"]),
            name=name,
        )

    def _deconv(
        self, filters: int, size_in: tuple[int, int], size_out: tuple[int, int], name: str
    ) -> keras.layers.Layer:
        # 'same' 5x5 stride 2 gives 2*n - 1 + output_padding: pick the padding that hits
        # exactly the reference's ceil-halved sizes (e.g. 7 -> 14, 4 -> 7).
        padding = tuple(o - (2 * i - 1) for i, o in zip(size_in, size_out))
        return keras.layers.Conv2DTranspose(
            filters,
            5,
            strides=2,
            padding="same",
            output_padding=padding,
            kernel_initializer=self._normal(),
            name=name,
        )

    def _inputs(self, first: keras.KerasTensor) -> tuple[list, keras.KerasTensor | None]:
        if not self.conditional:
            return [first], None
        label = keras.Input((), dtype="int64", name="label")
        onehot = keras.ops.one_hot(label, self.num_classes)
        return [first, label], onehot

    def generator(self) -> keras.Model:
        c = self.c
        gf = int(c["gf_dim"])
        z = keras.Input((int(c["z_dim"]),), name="z")
        inputs, y = self._inputs(z)
        s = [(self.height, self.width)]
        for _ in range(4):
            s.append((_halve(s[-1][0]), _halve(s[-1][1])))
        if y is None:
            h16, w16 = s[4]
            x = self._dense(gf * 8 * h16 * w16, "g_h0_lin")(z)
            x = keras.layers.Reshape((h16, w16, gf * 8), name="g_h0_reshape")(x)
            x = keras.layers.ReLU(name="g_h0_relu")(self._bn("g_bn0")(x))
            for i, (filters, level) in enumerate(((gf * 4, 3), (gf * 2, 2), (gf, 1)), start=1):
                x = self._deconv(filters, s[level + 1], s[level], f"g_h{i}")(x)
                x = keras.layers.ReLU(name=f"g_h{i}_relu")(self._bn(f"g_bn{i}")(x))
            x = self._deconv(self.channels, s[1], s[0], "g_h4")(x)
            images = keras.layers.Activation("tanh", dtype="float32", name="g_out")(x)
        else:
            h4, w4 = self.height // 4, self.width // 4
            h2, w2 = self.height // 2, self.width // 2
            x = ConcatCondition(name="g_cond0")(z, y)
            x = self._dense(int(c["gfc_dim"]), "g_h0_lin")(x)
            x = keras.layers.ReLU(name="g_h0_relu")(self._bn("g_bn0")(x))
            x = ConcatCondition(name="g_cond1")(x, y)
            x = self._dense(gf * 2 * h4 * w4, "g_h1_lin")(x)
            x = keras.layers.ReLU(name="g_h1_relu")(self._bn("g_bn1")(x))
            x = keras.layers.Reshape((h4, w4, gf * 2), name="g_h1_reshape")(x)
            x = ConcatCondition(name="g_cond2")(x, y)
            x = self._deconv(gf * 2, (h4, w4), (h2, w2), "g_h2")(x)
            x = keras.layers.ReLU(name="g_h2_relu")(self._bn("g_bn2")(x))
            x = ConcatCondition(name="g_cond3")(x, y)
            x = self._deconv(self.channels, (h2, w2), (self.height, self.width), "g_h3")(x)
            images = keras.layers.Activation("sigmoid", dtype="float32", name="g_out")(x)
        return keras.Model(inputs, images, name="generator")

    def discriminator(self) -> keras.Model:
        c = self.c
        df = int(c["df_dim"])
        image = keras.Input((self.height, self.width, self.channels), name="image")
        inputs, y = self._inputs(image)
        if y is None:
            x = self._lrelu("d_h0_lrelu")(self._conv(df, "d_h0_conv")(image))
            for i, filters in enumerate((df * 2, df * 4, df * 8), start=1):
                x = self._conv(filters, f"d_h{i}_conv")(x)
                x = self._lrelu(f"d_h{i}_lrelu")(self._bn(f"d_bn{i}")(x))
            x = keras.layers.Flatten(name="d_flatten")(x)
            logits = self._dense(1, "d_h4_lin", dtype="float32")(x)
        else:
            x = ConcatCondition(name="d_cond0")(image, y)
            x = self._conv(self.channels + self.num_classes, "d_h0_conv")(x)
            x = self._lrelu("d_h0_lrelu")(x)
            x = ConcatCondition(name="d_cond1")(x, y)
            x = self._conv(df + self.num_classes, "d_h1_conv")(x)
            x = self._lrelu("d_h1_lrelu")(self._bn("d_bn1")(x))
            x = keras.layers.Flatten(name="d_flatten")(x)
            x = ConcatCondition(name="d_cond2")(x, y)
            x = self._dense(int(c["dfc_dim"]), "d_h2_lin")(x)
            x = self._lrelu("d_h2_lrelu")(self._bn("d_bn2")(x))
            x = ConcatCondition(name="d_cond3")(x, y)
            logits = self._dense(1, "d_h3_lin", dtype="float32")(x)
        return keras.Model(inputs, logits, name="discriminator")


@keras.saving.register_keras_serializable(package=SERIALIZABLE_PACKAGE)
class DCGAN(RegistryConfigMixin, keras.Model):
    """Holds ``generator`` and ``discriminator``; calling it generates float images.

    ``generate(z, labels)`` / ``discriminate(images, labels)`` hide whether the nets are
    conditioned (``labels`` is ignored when they are not); ``scale_real`` maps stored
    uint8 images into the generator's output range, ``to_uint8`` maps back.
    """

    def __init__(self, task_name: str, task_config: Mapping[str, Any], **kwargs: Any) -> None:
        kwargs.setdefault("name", task_name)
        super().__init__(**kwargs)
        self._set_task(task_name, task_config)
        builder = _Builder(task_config)
        self.conditional = builder.conditional
        self.generator = builder.generator()
        self.discriminator = builder.discriminator()
        self.image_scaling = "unit" if self.conditional else "symmetric"
        self.scaler = ScaleImage(self.image_scaling, name="scale_real")
        self.scaler.build((None, builder.height, builder.width, builder.channels))

    def _args(self, first: tf.Tensor, labels: tf.Tensor | None) -> Any:
        if not self.conditional:
            return first
        if labels is None:
            raise SparktfValueError("this DCGAN is conditioned on the label: pass labels")
        return [first, tf.reshape(tf.cast(labels, tf.int64), [-1])]

    def generate(
        self, z: tf.Tensor, labels: tf.Tensor | None = None, training: bool = False
    ) -> tf.Tensor:
        return self.generator(self._args(z, labels), training=training)

    def discriminate(
        self, images: tf.Tensor, labels: tf.Tensor | None = None, training: bool = False
    ) -> tf.Tensor:
        return self.discriminator(self._args(images, labels), training=training)

    def call(
        self, z: tf.Tensor, labels: tf.Tensor | None = None, training: bool | None = None
    ) -> tf.Tensor:
        return self.generate(z, labels, training=bool(training))

    def scale_real(self, images: tf.Tensor) -> tf.Tensor:
        return self.scaler(images)

    def to_uint8(self, images: tf.Tensor) -> tf.Tensor:
        return images_to_uint8(tf.cast(images, tf.float32), self.image_scaling)


def _bce(logits: tf.Tensor, target: float) -> tf.Tensor:
    """Per-example sigmoid cross-entropy against a constant target."""
    logits = tf.reshape(tf.cast(logits, tf.float32), [-1])
    targets = tf.fill(tf.shape(logits), target)
    return tf.nn.sigmoid_cross_entropy_with_logits(labels=targets, logits=logits)


def _gan_metrics(d_real: tf.Tensor, d_fake: tf.Tensor, g: tf.Tensor) -> Metrics:
    """Replica-local means of the per-example GAN losses; ``loss`` = d_loss + g_loss."""
    d_mean, g_mean = tf.reduce_mean(d_real + d_fake), tf.reduce_mean(g)
    return {
        "loss": d_mean + g_mean,
        "d_loss": d_mean,
        "d_loss_real": tf.reduce_mean(d_real),
        "d_loss_fake": tf.reduce_mean(d_fake),
        "g_loss": g_mean,
    }


class DCGANTask(ModelTask):
    family: ClassVar[str] = "dcgan"
    kind: ClassVar[str] = "gan"
    description: ClassVar[str] = "DCGAN; label-conditioned for 28x28x1 MNIST by default (10.3)"
    defaults: ClassVar[Mapping[str, Any]] = {
        "image_shape": [28, 28, 1],
        "conditional": True,
        "num_classes": 10,
        "z_dim": 100,
        "gf_dim": 64,
        "df_dim": 64,
        "gfc_dim": 1024,
        "dfc_dim": 1024,
        "init_stddev": 0.02,
        "bn_momentum": 0.9,
        "bn_epsilon": 1e-5,
        "leak": 0.2,
        "discriminator_steps": 1,
        "generator_steps": 2,
        "batch_size": 64,
        "epochs": 25,
        "max_steps": None,
        "optimizer": {"name": "adam", "beta_1": 0.5},
        "learning_rate": 2e-4,
        "lr_schedule": "constant",
    }
    presets: ClassVar[Mapping[str, Mapping[str, Any]]] = {
        "dcgan_64": {"image_shape": [64, 64, 3], "conditional": False},
    }

    @property
    def features(self) -> tuple[str, ...]:
        return ("image", "label") if self.conditional else ("image",)

    @property
    def conditional(self) -> bool:
        return bool(self.config["conditional"])

    @property
    def image_shape(self) -> tuple[int, int, int]:
        return tuple(int(d) for d in self.config["image_shape"])  # type: ignore[return-value]

    @property
    def input_shape(self) -> tuple[int]:
        return (int(self.config["z_dim"]),)

    @property
    def z_dim(self) -> int:
        return int(self.config["z_dim"])

    def validate(self) -> None:
        h, w, _ = self.config["image_shape"]
        if self.config["conditional"] and (h % 4 or w % 4):
            raise SparktfValueError(
                f"a conditional DCGAN needs H and W divisible by 4, got {h}x{w}"
            )

    def build_model(self) -> keras.Model:
        model = DCGAN(self.name, self.config)
        labels = tf.zeros([1], tf.int64) if self.conditional else None
        model(tf.zeros([1, self.z_dim]), labels)
        return model

    def summary_images(self) -> Callable[[list[np.ndarray]], dict[str, tf.Tensor]]:
        """``samples``: 16 images the weights generate from a fixed ``z`` (labels 0, 1, 2,
        ... for a conditional model), drawn by a copy of the model built on the first call."""
        sampler: DCGAN | None = None

        def draw(weights: list[np.ndarray]) -> dict[str, tf.Tensor]:
            nonlocal sampler
            if sampler is None:
                sampler = self.build_model()
            sampler.set_weights(weights)
            z = tf.random.stateless_uniform([16, self.z_dim], seed=[7, 7], minval=-1.0, maxval=1.0)
            labels = tf.range(16, dtype=tf.int64) % int(self.config["num_classes"])
            return {"samples": sampler.to_uint8(sampler.generate(z, labels, training=False))}

        return draw

    def make_optimizer(
        self, steps_per_epoch: int, model: keras.Model | None = None
    ) -> dict[str, keras.optimizers.Optimizer]:
        """``{"generator": Adam, "discriminator": Adam}`` (each with its own moving
        averages and loss scale when the config asks for them)."""
        return {
            part: optimizer_from_config(
                self.config,
                steps_per_epoch,
                None if model is None else getattr(model, part).trainable_variables,
            )
            for part in ("generator", "discriminator")
        }

    def sample_z(self, batch_size: tf.Tensor | int) -> tf.Tensor:
        return tf.random.uniform([batch_size, self.z_dim], -1.0, 1.0)

    def _labels(self, batch: Batch) -> tf.Tensor | None:
        return batch["label"] if self.conditional else None

    def _d_losses(
        self,
        model: DCGAN,
        real: tf.Tensor,
        fake: tf.Tensor,
        labels: tf.Tensor | None,
        training: bool,
    ) -> tuple[tf.Tensor, tf.Tensor]:
        d_real = _bce(model.discriminate(real, labels, training=training), 1.0)
        d_fake = _bce(model.discriminate(fake, labels, training=training), 0.0)
        return d_real, d_fake

    def train_step(
        self, model: keras.Model, optimizer: Mapping[str, Any], batch: Batch, global_batch_size: int
    ) -> Metrics:
        """``discriminator_steps`` discriminator updates, then ``generator_steps``
        generator updates, all on the same real batch and the same ``z``."""
        real = model.scale_real(batch["image"])
        labels = self._labels(batch)
        z = self.sample_z(tf.shape(real)[0])
        d_steps = int(self.config["discriminator_steps"])
        g_steps = int(self.config["generator_steps"])
        for _ in range(max(d_steps, 1)):
            with tf.GradientTape() as tape:
                fake = model.generate(z, labels, training=True)
                d_real, d_fake = self._d_losses(model, real, fake, labels, training=True)
                d_loss = tf.nn.compute_average_loss(
                    d_real + d_fake, global_batch_size=global_batch_size
                )
            if d_steps:
                apply_gradients(
                    optimizer["discriminator"],
                    d_loss,
                    tape,
                    model.discriminator.trainable_variables,
                )
        for _ in range(max(g_steps, 1)):
            with tf.GradientTape() as tape:
                fake = model.generate(z, labels, training=True)
                g_per_example = _bce(model.discriminate(fake, labels, training=True), 1.0)
                g_loss = tf.nn.compute_average_loss(
                    g_per_example, global_batch_size=global_batch_size
                )
            if g_steps:
                apply_gradients(
                    optimizer["generator"], g_loss, tape, model.generator.trainable_variables
                )
        metrics = _gan_metrics(d_real, d_fake, g_per_example)
        metrics["learning_rate"] = current_learning_rate(optimizer["generator"])
        return metrics

    def eval_step(self, model: keras.Model, batch: Batch, global_batch_size: int) -> Metrics:
        real = model.scale_real(batch["image"])
        labels = self._labels(batch)
        fake = model.generate(self.sample_z(tf.shape(real)[0]), labels, training=False)
        d_real, d_fake = self._d_losses(model, real, fake, labels, training=False)
        g = _bce(model.discriminate(fake, labels, training=False), 1.0)
        return _gan_metrics(d_real, d_fake, g)

    def serving_endpoints(self, model: keras.Model) -> dict[str, Endpoint]:
        z_spec = tf.TensorSpec([None, self.z_dim], tf.float32, name="z")
        if self.conditional:

            def generate(z: tf.Tensor, label: tf.Tensor) -> dict[str, tf.Tensor]:
                return {"images": model.to_uint8(model.generate(z, label, training=False))}

            specs = [z_spec, tf.TensorSpec([None], tf.int64, name="label")]
        else:

            def generate(z: tf.Tensor) -> dict[str, tf.Tensor]:  # type: ignore[misc]
                return {"images": model.to_uint8(model.generate(z, training=False))}

            specs = [z_spec]
        return {"serving_default": (generate, specs)}

    def signature_info(self) -> dict[str, dict[str, dict[str, str]]]:
        h, w, c = self.image_shape
        inputs = {"z": f"float32[B,{self.z_dim}] (uniform in [-1, 1])"}
        if self.conditional:
            inputs["label"] = "int64[B]"
        outputs = {"images": f"uint8[B,{h},{w},{c}]"}
        return {"serving_default": {"inputs": inputs, "outputs": outputs}}

    def example_batch(self, batch_size: int, seed: int = 0) -> dict[str, tf.Tensor]:
        rng = np.random.default_rng(seed)
        images = rng.integers(0, 256, size=(batch_size, *self.image_shape), dtype=np.uint8)
        ids = np.arange(batch_size, dtype=np.int64)
        batch = {"image": tf.constant(images), "id": tf.constant(ids)}
        batch["label"] = tf.constant(
            rng.integers(0, int(self.config["num_classes"]), size=(batch_size,), dtype=np.int64)
        )
        return batch
