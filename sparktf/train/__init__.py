"""Distributed training on Spark executors through TensorFlowOnSpark.

>>> from sparktf.train import fit, TrainConfig, ScalingConfig, RunConfig
>>> result = fit(TrainConfig(model="resnet20", data="hdfs://nn:8020/data/cifar10",
...                          input_mode="files", epochs=1),
...              ScalingConfig(strategy="allreduce", num_workers=4),
...              RunConfig(model_dir="hdfs://nn:8020/models/resnet20"))
>>> result.final_step, result.metrics["accuracy"], result.export_path

The pieces: :mod:`~sparktf.train.config` (the three configs and the result),
:mod:`~sparktf.train.cluster` (the driver: TensorFlowOnSpark bring-up, feeding, failure
detection, shutdown), :mod:`~sparktf.train.node` (one TensorFlow process),
:mod:`~sparktf.train.loop` (the one training loop), :mod:`~sparktf.train.feed` (the ``spark``
input mode), :mod:`~sparktf.train.inputs` (the ``files`` input mode),
:mod:`~sparktf.train.artifacts` (checkpoints, events and exports in the model directory),
:mod:`~sparktf.train.control` (the driver's channel to the processes).

Importing this package does not import TensorFlow (the driver needs none).
"""

from __future__ import annotations

import dataclasses

import logging
import math
import time
from pathlib import Path
from typing import Any

from sparktf.train.config import (
    ConfigError,
    RunConfig,
    ScalingConfig,
    TrainConfig,
    TrainResult,
    steps_for,
)

__all__ = ["ConfigError", "RunConfig", "ScalingConfig", "TrainConfig", "TrainResult",
           "TrainingError", "fit", "gpu_spark_conf", "plan_run"]

log = logging.getLogger(__name__)
REPO_ROOT = Path(__file__).resolve().parents[2]
GPU_DISCOVERY_SCRIPT = REPO_ROOT / "scripts" / "gpu_discovery.sh"


def __getattr__(name: str):
    if name == "TrainingError":
        from sparktf.train.cluster import TrainingError

        return TrainingError
    raise AttributeError(name)


def gpu_spark_conf(scaling: ScalingConfig) -> dict[str, str]:
    """Spark settings that give each executor (and each TensorFlow task) its GPUs.

    Spark's resource scheduling assigns GPU addresses found by ``scripts/gpu_discovery.sh``;
    TensorFlowOnSpark reads them from the task's resources and sets
    ``CUDA_VISIBLE_DEVICES``, so every TensorFlow process sees only its own GPUs. Empty
    when ``gpus_per_worker`` is 0. These must be set when the Spark application starts.
    """
    if not scaling.gpus_per_worker:
        return {}
    n = str(scaling.gpus_per_worker)
    script = str(GPU_DISCOVERY_SCRIPT)
    return {
        "spark.executor.resource.gpu.amount": n,
        "spark.executor.resource.gpu.discoveryScript": script,
        "spark.task.resource.gpu.amount": n,
        # local-cluster / standalone workers announce their GPUs too
        "spark.worker.resource.gpu.amount": n,
        "spark.worker.resource.gpu.discoveryScript": script,
    }


def plan_run(train: TrainConfig, scaling: ScalingConfig, run: RunConfig) -> dict[str, Any]:
    """Checks the configs against the model and the dataset; returns the processes' spec."""
    from sparktf import models
    from sparktf.train.inputs import describe_data

    overrides = dict(train.model_config)
    if train.batch_size:
        overrides["batch_size"] = int(train.batch_size)
    try:
        task = models.get_task(train.model, **overrides)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if task.kind == "regression":
        raise ConfigError(f"{train.model} trains on its built-in data, not on a converted "
                          "dataset: it has no distributed training job")
    data_info = describe_data(train.data, train.split, train.file_format, task.features)
    if task.kind == "language_model":
        text = data_info.get("text") or {}
        if "vocab_size" not in overrides and text.get("vocab_size"):
            overrides["vocab_size"] = int(text["vocab_size"])
            task = models.get_task(train.model, **overrides)
        seq_len = int(data_info["fields"][0][2][0])
        if task.seq_len != seq_len:
            raise ConfigError(f"{train.model} unrolls {task.num_steps} steps (sequences of "
                              f"{task.seq_len} tokens) but {train.data} holds sequences of "
                              f"{seq_len}: set num_steps={seq_len - 1} in --model-config or "
                              "convert with a matching seq_len")
    global_batch = int(task.batch_size)
    if scaling.strategy == "allreduce":
        replicas = scaling.num_workers * max(1, scaling.gpus_per_worker)
        if global_batch % replicas:
            raise ConfigError(f"batch size {global_batch} must be divisible by the "
                              f"{replicas} all-reduce replicas")
    if train.input_mode == "spark" and not data_info["parquet"]:
        raise ConfigError(f"the spark input mode reads Parquet, but {train.data} has none "
                          "(convert with --formats parquet)")
    if train.input_mode == "files":
        if data_info.get("missing_format"):
            raise ConfigError(f"{train.data} has no {train.file_format} files "
                              f"(it has {', '.join(data_info['files'])})")
    rows = data_info["rows"]
    if rows < global_batch:
        raise ConfigError(f"the {train.split} split has {rows} rows, fewer than one batch "
                          f"({global_batch})")
    steps_per_epoch = max(1, rows // global_batch)
    if train.steps and train.epochs:
        target = min(int(train.steps), steps_for(train.epochs, rows, global_batch))
    elif train.steps:
        target = int(train.steps)
    elif train.epochs:
        target = steps_for(train.epochs, rows, global_batch)
    elif task.max_steps:
        target = int(task.max_steps)
    else:
        target = int(task.epochs) * steps_per_epoch
    return {
        "model": train.model, "model_config": overrides, "global_batch": global_batch,
        "steps_per_epoch": steps_per_epoch, "target_steps": target,
        "model_dir": run.model_dir, "checkpoint_every_steps": run.checkpoint_every_steps,
        "keep_checkpoints": run.keep_checkpoints,
        "summary_every_steps": run.summary_every_steps,
        "histogram_every_steps": run.histogram_every_steps,
        "progress_every_s": run.progress_every_s, "sync_every_s": run.sync_every_s,
        "export": run.export, "feed_timeout_s": run.feed_timeout_s,
        "input_mode": train.input_mode, "file_format": train.file_format,
        "data_info": data_info, "shuffle": train.shuffle, "seed": train.seed,
        "gpus_per_worker": scaling.gpus_per_worker,
        "threads_per_worker": scaling.threads_per_worker,
        "log_level": logging.getLevelName(logging.getLogger().level)
        if logging.getLogger().level else "INFO",
        "feed_passes": (math.ceil(train.epochs) if train.epochs and not train.steps else None),
    }


def fit(train: TrainConfig, scaling: ScalingConfig | None = None, run: RunConfig | None = None,
        *, spark=None) -> TrainResult:
    """Trains ``train.model`` on Spark executors; returns when the chief has exported.

    ``spark``: the SparkSession to run on (default ``sparktf.spark.get_session``, with the GPU
    settings of ``scaling``). It must have exactly ``scaling.num_executors`` executors.
    Raises :class:`ConfigError` for settings that cannot work (before anything starts) and
    :class:`~sparktf.train.cluster.TrainingError` when a TensorFlow process or a Spark job of
    the run fails; in both cases nothing of the run is left running.
    """
    from sparktf import storage
    from sparktf.train import artifacts
    from sparktf.train.cluster import ClusterRun

    scaling = scaling or ScalingConfig()
    if run is None:
        raise ConfigError("a RunConfig with model_dir is required")
    # Local paths are resolved here, on the driver: executors run in their own work dirs.
    if run.model_dir:
        run = dataclasses.replace(run, model_dir=storage.parse(run.model_dir).uri)
    if train.data:
        train = dataclasses.replace(train, data=storage.parse(train.data).uri)
    spec = plan_run(train, scaling, run)
    if spark is None:
        from sparktf.spark import get_session

        spark = get_session(f"sparktf-train-{train.model}", overrides=gpu_spark_conf(scaling))
    conf = spark.sparkContext.getConf()
    if train.input_mode == "spark" and conf.get("spark.python.worker.reuse", "true") != "true":
        raise ConfigError("the spark input mode needs spark.python.worker.reuse=true")
    if conf.get("spark.task.maxFailures", "4") != "1":
        log.warning("spark.task.maxFailures is not 1: a failed TensorFlow task would be "
                    "retried into a cluster that has moved on; set it to 1")
    storage.makedirs(run.model_dir)
    resumed = artifacts.latest_checkpoint_step(run.model_dir)
    log.info("training %s on %s (%s split, %d rows, input mode %s): global batch %d, "
             "%d steps per epoch, steps %d -> %d%s", train.model, train.data, train.split,
             spec["data_info"]["rows"], train.input_mode, spec["global_batch"],
             spec["steps_per_epoch"], resumed, spec["target_steps"],
             f" (resuming from {run.model_dir})" if resumed else "")
    started_wall = time.time()
    started = time.monotonic()
    with ClusterRun(spark, train, scaling, run, spec, feed_passes=spec["feed_passes"]) as cluster:
        cluster.start()
        result = cluster.wait()
    elapsed = time.monotonic() - started
    first = result.get("first_step_wall")
    out = TrainResult(
        model_dir=run.model_dir, start_step=int(result["start_step"]),
        final_step=int(result["final_step"]), metrics=dict(result.get("metrics") or {}),
        checkpoint=result.get("checkpoint"), export_path=result.get("export_path"),
        elapsed_s=elapsed, examples=int(result.get("examples") or 0),
        examples_per_sec=float(result.get("examples_per_sec") or 0.0),
        time_to_first_step_s=(first - started_wall) if first else None,
        strategy=scaling.strategy, input_mode=train.input_mode,
        gpus=list(result.get("gpus") or []))
    log.info("done: step %d, %s, %.0f examples/s, %.1f s%s", out.final_step,
             ", ".join(f"{k} {v:.4g}" for k, v in out.metrics.items()), out.examples_per_sec,
             out.elapsed_s, f", exported {out.export_path}" if out.export_path else "")
    return out
