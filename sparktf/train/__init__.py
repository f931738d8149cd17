"""Distributed training on Spark executors through TensorFlowOnSpark.

>>> from sparktf.train import fit, EvalConfig, TrainConfig, ScalingConfig, RunConfig
>>> result = fit(TrainConfig(model="resnet20", data="hdfs://nn:8020/data/cifar10",
...                          input_mode="files", epochs=1),
...              ScalingConfig(strategy="allreduce", num_workers=4),
...              RunConfig(model_dir="hdfs://nn:8020/models/resnet20",
...                        evaluation=EvalConfig(split="test", export_best="accuracy")))
>>> result.final_step, result.metrics["accuracy"], result.export_dir

Or your own training function in every TensorFlow process (:func:`run`; inside it
:func:`get_context` and :func:`report`, :mod:`~sparktf.train.process.context`)::

    result = sparktf.train.run(train_fn, ScalingConfig(num_workers=2), RunConfig(model_dir=...),
                               config={"epochs": 3}, data="hdfs://nn:8020/data/mnist")
    result.value, result.history

The rooms, one per kind of process (the import contracts in ``pyproject.toml`` keep them so):

- this package: the public face: :mod:`~sparktf.train.config` (the configs),
  :mod:`~sparktf.train.settings` (their fields' machinery), :mod:`~sparktf.train.errors`
  (``ConfigError``, ``TrainingError``), :mod:`~sparktf.train.plan` (the typed run plan every
  process receives), :mod:`~sparktf.train.result` (what a run returns, ``TrainResult``, and
  what a process reports), :mod:`~sparktf.train.artifacts` (checkpoints, events and exports
  in the model directory);
- :mod:`sparktf.train.driver`: the Spark driver: :func:`fit` (:mod:`~.driver.fit`),
  :func:`run` (:mod:`~.driver.train_fn`), one
  attempt (:mod:`~.driver.cluster`), TensorFlowOnSpark's nodes in one barrier stage
  (:mod:`~.driver.bringup`, :mod:`~.driver.gang`), roles, parameter servers on the driver
  (:mod:`~.driver.ps`), the watch over the run (:mod:`~.driver.monitor`), MLflow
  (:mod:`~.driver.tracking`);
- :mod:`sparktf.train.process`: an executor: the Spark task that starts a TensorFlow process
  (:mod:`~.process.launcher`), that process (:mod:`~.process.main`), its loop
  (:mod:`~.process.trainer`) and the loop's parts, or a user's function
  (:mod:`~.process.function`, :mod:`~.process.context`, :mod:`~.process.keras_fit`);
- :mod:`sparktf.train.feed`: the ``spark`` input mode, the driver's feeding job
  (:mod:`~.feed.job`) and the chunks it hands the processes (:mod:`~.feed.chunks`);
- :mod:`sparktf.train.wire`: the messages between them: the control channel, the
  authenticated reservation, their framing, servers and limits.

Importing this package does not import TensorFlow (the driver needs none), nor the driver's
modules until ``fit`` (or another of them) is first used.
"""

from __future__ import annotations

from sparktf.train.config import (
    CheckpointConfig,
    EvalConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    TrackingConfig,
    TrainConfig,
)
from sparktf.train.errors import ConfigError, TrainingError
from sparktf.train.result import TrainResult

# The driver's entry points load on first use: the TensorFlow processes and the feeding
# tasks import this package too (sparktf.train.process, .feed) and need neither.
_LAZY = {
    "fit": "driver.fit",
    "gpu_spark_conf": "driver.fit",
    "RunPlan": "plan",
    "plan_run": "plan",
    "run": "driver.train_fn",
    # what a training function calls in its TensorFlow process (no TensorFlow imported)
    "TrainContext": "process.context",
    "get_context": "process.context",
    "report": "process.context",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


__all__ = [
    "CheckpointConfig",
    "ConfigError",
    "EvalConfig",
    "FailureConfig",
    "RunConfig",
    "RunPlan",
    "ScalingConfig",
    "TrainContext",
    "TrackingConfig",
    "TrainConfig",
    "TrainResult",
    "TrainingError",
    "fit",
    "get_context",
    "gpu_spark_conf",
    "plan_run",
    "report",
    "run",
]
