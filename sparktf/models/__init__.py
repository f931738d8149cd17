"""Model registry: config-driven builders of the book's models, registered by name.

>>> from sparktf import models
>>> models.list_models()                      # families and presets, sorted
>>> task = models.get_task("resnet32")        # a ModelTask: config + steps + export
>>> model = task.build_model()                # == models.get_model("resnet32")
>>> same = models.get_task(task.name, **task.config)   # rebuilt from its config

Every name is either a family (``resnet``, ``alexnet_v2``, ``mnist_softmax``,
``mnist_mlp``, ``ptb_lstm``, ``dcgan``, ``linear_regression``) with its defaults, or a
preset of one (``resnet20`` ... ``resnet164``, ``ptb_small`` / ``ptb_medium`` /
``ptb_large``, ``dcgan_64``).  Keyword overrides replace config entries; unknown keys
are an error.

A user's own Keras model: ``models.register("my_mlp", build_fn, input_shape=(4,),
num_classes=3)`` or the name ``"my_pkg.module:build"`` (see :mod:`~sparktf.models.custom`).

Modules: :mod:`~sparktf.models.registry` (the names above),
:mod:`~sparktf.models.task` (the :class:`ModelTask` contract, step and metric conventions),
:mod:`~sparktf.models.classifier` (the image-classifier task), :mod:`~sparktf.models.layers`,
:mod:`~sparktf.models.augment` (training-time image augmentation),
:mod:`~sparktf.models.optim` (schedules, optimizers, clipping), :mod:`~sparktf.models.export`
(SavedModel signatures), and one module per family.
"""

from __future__ import annotations

from sparktf.models.alexnet import AlexNetV2Task
from sparktf.models.augment import AugmentMixin, augment_images, augment_seed
from sparktf.models.classifier import ClassifierTask
from sparktf.models.custom import CustomModel, CustomTask, custom_model, register
from sparktf.models.dcgan import DCGAN, DCGANTask
from sparktf.models.layers import ScaleImage, count_params
from sparktf.models.linear import (
    BOOK_X,
    BOOK_Y,
    LinearRegressionTask,
    book_dataset,
    least_squares_fit,
)
from sparktf.models.mnist import MnistMLPTask, MnistSoftmaxTask
from sparktf.models.optim import (
    OPTIMIZERS,
    PRECISIONS,
    precision_policy,
    reduce_metrics,
    weights_for_export,
)
from sparktf.models.ptb import PTBLanguageModel, PTBTask
from sparktf.models.registry import describe, get_model, get_task, list_models
from sparktf.models.resnet import ResNetTask
from sparktf.models.task import KINDS, ModelTask

__all__ = [
    "BOOK_X",
    "BOOK_Y",
    "DCGAN",
    "KINDS",
    "OPTIMIZERS",
    "PRECISIONS",
    "AlexNetV2Task",
    "AugmentMixin",
    "ClassifierTask",
    "CustomTask",
    "CustomModel",
    "DCGANTask",
    "LinearRegressionTask",
    "MnistMLPTask",
    "MnistSoftmaxTask",
    "ModelTask",
    "PTBLanguageModel",
    "PTBTask",
    "ResNetTask",
    "ScaleImage",
    "augment_images",
    "augment_seed",
    "book_dataset",
    "count_params",
    "custom_model",
    "describe",
    "get_model",
    "get_task",
    "least_squares_fit",
    "list_models",
    "precision_policy",
    "reduce_metrics",
    "register",
    "weights_for_export",
]
