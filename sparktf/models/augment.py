"""Training-time image augmentation: the CIFAR recipe of the ResNet reference.

* :func:`augment_images` -- per image, zero padding by ``padding`` pixels on each side, a
  random crop back to H x W and a random horizontal flip (He et al. 2016, section 4.2; the
  TF research ResNet's CIFAR input). Stateless random ops: the result depends only on the
  images and the ``seed``, so a run is reproducible under ``--seed`` and every replica of
  every step draws its own crops and flips.
* :func:`augment_seed` -- folds a ``(run seed, global step, replica)`` tuple into the shape
  [2] seed stateless ops take.
* :class:`AugmentMixin` -- the task hook ``task.augment(batch, seed) -> batch`` that the
  training loop calls on each replica's batch before ``train_step``: identity unless the
  task's config says ``"augment": true``. ``eval_step`` and the SavedModel export never call
  it, so evaluation and serving see the images as they are.

The augmentation runs on the raw pixels (uint8 0..255, padded with 0) before the model's
own scaling, as the reference pads and crops before ``per_image_standardization``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import tensorflow as tf

from sparktf.errors import SparktfValueError

__all__ = ["AugmentMixin", "PADDING", "augment_images", "augment_seed"]

PADDING = 4  # pixels of zero padding on each side before the random crop


# No tensor-dependent Python control flow below: AutoGraph has nothing to convert.
@tf.autograph.experimental.do_not_convert
def augment_seed(seed: Any) -> tf.Tensor:
    """A stateless-op seed (int64 [2]) from ``seed``.

    A shape [2] seed is used as it is; any other sequence of integers (Python ints or
    scalar tensors, e.g. ``(run seed, global step, replica id)``) is folded into one with
    :func:`tf.random.experimental.stateless_fold_in`, so each element changes the draw.
    """
    if isinstance(seed, (tf.Tensor, tf.Variable)) or hasattr(seed, "dtype"):
        seed = tf.convert_to_tensor(seed)
        if seed.shape.rank == 1 and seed.shape[0] == 2:
            return tf.cast(seed, tf.int64)
        if seed.shape.rank != 1 or seed.shape[0] is None:
            raise SparktfValueError(
                f"augmentation seed must be a 1-D vector, got shape {seed.shape}"
            )
        parts = tf.unstack(seed)
    else:
        parts = list(seed)
        if len(parts) == 2:
            return tf.stack([tf.cast(p, tf.int64) for p in parts])
    if not parts:
        raise SparktfValueError("augmentation seed is empty")
    key = tf.stack([tf.constant(0, tf.int64), tf.cast(parts[0], tf.int64)])
    for part in parts[1:]:
        key = tf.random.experimental.stateless_fold_in(key, tf.cast(part, tf.int64))
    return key


@tf.autograph.experimental.do_not_convert
def augment_images(images: tf.Tensor, seed: Any, *, padding: int = PADDING) -> tf.Tensor:
    """Random crop of the zero-padded image plus random horizontal flip, per image.

    ``images``: [B, H, W, C] of any dtype (uint8 from the datasets, or float); ``seed``: an
    int [2] tensor (or anything :func:`augment_seed` takes). Each output image is the
    H x W window at offset (dy, dx), 0 <= dy, dx <= 2 * ``padding`` (uniform), of the input
    padded with ``padding`` zeros on every side, mirrored left-right with probability 1/2.
    Same shape and dtype as ``images``; a function of ``images`` and ``seed`` only.
    """
    images = tf.convert_to_tensor(images)
    if images.shape.rank != 4:
        raise SparktfValueError(
            f"augment_images takes [B, H, W, C] images, got shape {images.shape}"
        )
    if padding < 0:
        raise SparktfValueError(f"padding must be >= 0, got {padding}")
    seed = augment_seed(seed)
    dtype = images.dtype
    # Pad / gather / select in float32: exact for 8- and 16-bit pixels, and every device
    # has float kernels for them (GPU gather has none for uint8).
    x = tf.cast(images, tf.float32) if dtype.is_integer or dtype == tf.bool else images
    shape = tf.shape(x)
    batch, height, width = shape[0], shape[1], shape[2]
    x = tf.pad(x, [[0, 0], [padding, padding], [padding, padding], [0, 0]])
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    offsets = tf.random.stateless_uniform(
        [batch, 2], crop_seed, minval=0, maxval=2 * padding + 1, dtype=tf.int32
    )
    flip = tf.random.stateless_uniform([batch], flip_seed) < 0.5
    rows = offsets[:, :1] + tf.range(height)[tf.newaxis, :]  # [B, H] rows of the padded image
    cols = offsets[:, 1:] + tf.range(width)[tf.newaxis, :]  # [B, W] columns, left to right
    cols = tf.where(flip[:, tf.newaxis], tf.reverse(cols, axis=[1]), cols)
    x = tf.gather(x, rows, axis=1, batch_dims=1)  # [B, H, W + 2p, C]
    x = tf.gather(x, cols, axis=2, batch_dims=1)  # [B, H, W, C]
    out = tf.cast(x, dtype) if x.dtype != dtype else x
    return tf.ensure_shape(out, images.shape)


class AugmentMixin:
    """``augment(batch, seed)`` for image tasks whose config has an ``augment`` switch.

    Put it before the task base class (``class ResNetTask(AugmentMixin, ClassifierTask)``);
    the config entry ``augment`` (read with ``config.get("augment", False)``) turns it on.
    """

    augment_padding: ClassVar[int] = PADDING
    config: dict  # provided by ModelTask

    @property
    def augments(self) -> bool:
        """Whether :meth:`augment` changes the images (the ``augment`` config entry)."""
        return bool(self.config.get("augment", False))

    def augment(self, batch: Mapping[str, tf.Tensor], seed: Any) -> Mapping[str, tf.Tensor]:
        """The training batch with its ``image`` augmented (:func:`augment_images`), or the
        batch itself when augmentation is off. Other features pass through unchanged.

        Call it on each replica's batch inside the replica step, with a seed that differs
        per step and per replica, e.g. ``(run seed, global step, replica id)``.
        """
        if not self.augments:
            return batch
        out = dict(batch)
        out["image"] = augment_images(batch["image"], seed, padding=self.augment_padding)
        return out
