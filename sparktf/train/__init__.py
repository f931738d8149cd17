"""Distributed training on Spark executors through TensorFlowOnSpark.

>>> from sparktf.train import fit, EvalConfig, TrainConfig, ScalingConfig, RunConfig
>>> result = fit(TrainConfig(model="resnet20", data="hdfs://nn:8020/data/cifar10",
...                          input_mode="files", epochs=1),
...              ScalingConfig(strategy="allreduce", num_workers=4),
...              RunConfig(model_dir="hdfs://nn:8020/models/resnet20",
...                        evaluation=EvalConfig(split="test", export_best="accuracy")))
>>> result.final_step, result.metrics["accuracy"], result.export_path

The pieces, driver side:

- :mod:`~sparktf.train.config` (the configs, the result, the errors) and
  :mod:`~sparktf.train.flags` (the jobs' flags, generated from the configs' fields);
- :mod:`~sparktf.train.plan` (the typed run plan every process receives);
- :mod:`~sparktf.train.driver` (:func:`fit`: attempts, restarts, the result);
- :mod:`~sparktf.train.cluster` (one attempt, orchestrating :mod:`~sparktf.train.roles`
  (which process is which, without Spark), :mod:`~sparktf.train.tfos_cluster`
  (TensorFlowOnSpark bring-up and shutdown), :mod:`~sparktf.train.driver_ps` (parameter
  servers on the driver), :mod:`~sparktf.train.feed_job` (the Spark feed) and
  :mod:`~sparktf.train.monitor` (failure and stall detection));
- :mod:`~sparktf.train.control` (the driver's channel to the processes),
  :mod:`~sparktf.train.reservation` over :mod:`~sparktf.train.frames` (the authenticated
  start-up); :mod:`~sparktf.train.tracking` (MLflow).

Process side: :mod:`~sparktf.train.node` (one TensorFlow process), :mod:`~sparktf.train.build`
(strategy, model, optimizer, restore or warm start), :mod:`~sparktf.train.trainer` (the loop)
with :mod:`~sparktf.train.steps` (the step functions), :mod:`~sparktf.train.reporting`
(progress and summaries) and :mod:`~sparktf.train.evaluation` (evaluation and the best
export), :mod:`~sparktf.train.result` (the typed result it sends the driver),
:mod:`~sparktf.train.inputs` (its batches), :mod:`~sparktf.train.feed` (the ``spark`` input
mode), :mod:`~sparktf.train.artifacts` (checkpoints, events and exports in the model
directory), :mod:`~sparktf.train.summaries` (TensorBoard events).

Importing this package does not import TensorFlow (the driver needs none), nor the driver's
modules until ``fit`` (or another of them) is first used.
"""

from __future__ import annotations

from sparktf.train.config import (
    CheckpointConfig,
    ConfigError,
    EvalConfig,
    FailureConfig,
    RunConfig,
    ScalingConfig,
    TrackingConfig,
    TrainConfig,
    TrainingError,
    TrainResult,
)

# The driver's entry points load on first use: the TensorFlow processes and the feeding
# tasks import this package too (sparktf.train.node, .feed) and need neither.
_LAZY = {"fit": "driver", "gpu_spark_conf": "driver", "RunPlan": "plan", "plan_run": "plan"}


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
    "TrackingConfig",
    "TrainConfig",
    "TrainResult",
    "TrainingError",
    "fit",
    "gpu_spark_conf",
    "plan_run",
]
