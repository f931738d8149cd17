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
are an error.  See :mod:`sparktf.models.base` for the step and metric conventions.
"""

from __future__ import annotations

from typing import Any

import keras

from sparktf.models.alexnet import AlexNetV2Task
from sparktf.models.base import (
    KINDS,
    ClassifierTask,
    ModelTask,
    ScaleImage,
    count_params,
    reduce_metrics,
)
from sparktf.models.dcgan import DCGAN, DCGANTask
from sparktf.models.linear import (
    BOOK_X,
    BOOK_Y,
    LinearRegressionTask,
    book_dataset,
    least_squares_fit,
)
from sparktf.models.mnist import MnistMLPTask, MnistSoftmaxTask
from sparktf.models.ptb import PTBLanguageModel, PTBTask
from sparktf.models.resnet import ResNetTask

__all__ = [
    "BOOK_X",
    "BOOK_Y",
    "DCGAN",
    "KINDS",
    "ClassifierTask",
    "ModelTask",
    "PTBLanguageModel",
    "ScaleImage",
    "book_dataset",
    "count_params",
    "describe",
    "get_model",
    "get_task",
    "least_squares_fit",
    "list_models",
    "reduce_metrics",
]

_TASK_CLASSES: tuple[type[ModelTask], ...] = (
    ResNetTask,
    AlexNetV2Task,
    MnistSoftmaxTask,
    MnistMLPTask,
    PTBTask,
    DCGANTask,
    LinearRegressionTask,
)


def _build_registry() -> dict[str, type[ModelTask]]:
    registry: dict[str, type[ModelTask]] = {}
    for cls in _TASK_CLASSES:
        for preset, overrides in cls.presets.items():
            unknown = sorted(set(overrides) - set(cls.defaults))
            if unknown:
                raise RuntimeError(f"preset {preset!r} sets unknown config keys {unknown}")
        for name in (cls.family, *cls.presets):
            if name in registry:
                raise RuntimeError(f"model name {name!r} registered twice")
            registry[name] = cls
    return registry


_REGISTRY = _build_registry()


def list_models() -> list[str]:
    """Every registered name (families and presets), sorted."""
    return sorted(_REGISTRY)


def get_task(name: str, **overrides: Any) -> ModelTask:
    """The :class:`ModelTask` for ``name`` with ``overrides`` applied to its config."""
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown model {name!r}; known models: {list_models()}") from None
    return cls.make(name, overrides)


def get_model(name: str, **overrides: Any) -> keras.Model:
    """A built Keras model (weights created) for ``name`` with ``overrides``."""
    return get_task(name, **overrides).build_model()


def describe(name: str) -> dict[str, Any]:
    """Family, kind, description and full default config of ``name``."""
    task = get_task(name)
    return {
        "name": name,
        "family": task.family,
        "kind": task.kind,
        "description": task.description,
        "features": list(task.features),
        "config": task.config,
    }
