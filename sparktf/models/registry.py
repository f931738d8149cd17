"""The model registry: every family and preset by name, and the task or model it builds.

Each family's task class enters its names into the table of :mod:`sparktf.models.task`
when it is defined; this module imports every family (so the table is complete) and is
the only module that does.  Nothing below it imports it back: a model rebuilds itself
from its config through that table (``RegistryConfigMixin.from_config``).
"""

from __future__ import annotations

from typing import Any

import keras

from sparktf.errors import SparktfRuntimeError
from sparktf.models.alexnet import AlexNetV2Task
from sparktf.models.dcgan import DCGANTask
from sparktf.models.linear import LinearRegressionTask
from sparktf.models.mnist import MnistMLPTask, MnistSoftmaxTask
from sparktf.models.ptb import PTBTask
from sparktf.models.resnet import ResNetTask
from sparktf.models.task import ModelTask, task_class, task_names

__all__ = ["TASK_CLASSES", "describe", "get_model", "get_task", "list_models"]

# The registered families, in the order the book introduces them.
TASK_CLASSES: tuple[type[ModelTask], ...] = (
    ResNetTask,
    AlexNetV2Task,
    MnistSoftmaxTask,
    MnistMLPTask,
    PTBTask,
    DCGANTask,
    LinearRegressionTask,
)


def _check_table() -> None:
    """The name table holds exactly the families above (each under all of its names)."""
    registered = {task_class(name) for name in task_names()}
    if registered != set(TASK_CLASSES):
        listed = {cls.__name__ for cls in TASK_CLASSES}
        found = {cls.__name__ for cls in registered}
        raise SparktfRuntimeError(
            f"model families registered {sorted(found)} differ from those listed {sorted(listed)}"
        )


_check_table()


def list_models() -> list[str]:
    """Every registered name (families and presets), sorted."""
    return task_names()


def get_task(name: str, **overrides: Any) -> ModelTask:
    """The :class:`ModelTask` for ``name`` with ``overrides`` applied to its config."""
    return task_class(name).make(name, overrides)


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
