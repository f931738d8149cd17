"""The driver's entry point: :func:`fit` plans a run, brings its cluster up, returns the result.

Importing this module does not import TensorFlow (the driver needs none).
"""

from __future__ import annotations

import dataclasses
import logging
import time

from sparktf import paths, storage
from sparktf.train import artifacts, tracking
from sparktf.train.cluster import ClusterRun
from sparktf.train.config import (
    ConfigError,
    RunConfig,
    ScalingConfig,
    TrainConfig,
    TrainingError,
    TrainResult,
)
from sparktf.train.plan import RunPlan, plan_run

log = logging.getLogger("sparktf.train")


def gpu_spark_conf(scaling: ScalingConfig) -> dict[str, str]:
    """Spark settings that give each executor (and each TensorFlow task) its GPUs.

    Spark's resource scheduling assigns GPU addresses found by ``spark/gpu_discovery.sh`` of
    the conf directories (``sparktf.paths``); TensorFlowOnSpark reads them from the task's
    resources and sets ``CUDA_VISIBLE_DEVICES``, so every TensorFlow process sees only its own
    GPUs. Empty when ``gpus_per_worker`` is 0. These must be set when the Spark application starts.
    """
    if not scaling.gpus_per_worker:
        return {}
    n = str(scaling.gpus_per_worker)
    script = str(paths.conf_file("spark/gpu_discovery.sh"))
    return {
        "spark.executor.resource.gpu.amount": n,
        "spark.executor.resource.gpu.discoveryScript": script,
        "spark.task.resource.gpu.amount": n,
        # local-cluster / standalone workers announce their GPUs too
        "spark.worker.resource.gpu.amount": n,
        "spark.worker.resource.gpu.discoveryScript": script,
    }


def fit(
    train: TrainConfig,
    scaling: ScalingConfig | None = None,
    run: RunConfig | None = None,
    *,
    spark=None,
) -> TrainResult:
    """Trains ``train.model`` on Spark executors; returns when the chief has exported.

    ``spark``: the SparkSession to run on (default ``sparktf.spark.get_session``, with the GPU
    settings of ``scaling``). It must have exactly ``scaling.num_executors`` executors.
    Raises :class:`ConfigError` for settings that cannot work (before anything starts) and
    :class:`~sparktf.train.config.TrainingError` when a TensorFlow process or a Spark job of
    the run fails (after ``run.max_restarts`` restarts from the latest checkpoint); in both
    cases nothing of the run is left running.

    With ``run.mlflow_tracking_uri`` the run is recorded in MLflow from the driver
    (:mod:`sparktf.train.tracking`; ``TrainResult.mlflow_run_id``); MLflow missing or a
    tracking store that refuses is a :class:`ConfigError` before Spark starts.
    """
    scaling = scaling or ScalingConfig()
    if run is None:
        raise ConfigError("a RunConfig with model_dir is required")
    if run.mlflow_tracking_uri:
        tracking.require_mlflow()  # before anything is read or started
    # Local paths are resolved here, on the driver: executors run in their own work dirs.
    run = dataclasses.replace(run, model_dir=storage.parse(run.model_dir).uri)
    train = dataclasses.replace(train, data=storage.parse(train.data).uri)
    plan = plan_run(train, scaling, run)
    with tracking.track(plan) as tracker:
        out = _run(plan, spark, tracker)
        tracker.finish(out)
    return out


def _run(plan: RunPlan, spark, tracker: tracking.Tracker | tracking.NullTracker) -> TrainResult:
    train, scaling, run = plan.train, plan.scaling, plan.run
    if spark is None:
        from sparktf.spark import get_session

        spark = get_session(f"sparktf-train-{train.model}", overrides=gpu_spark_conf(scaling))
    conf = spark.sparkContext.getConf()
    if train.input_mode == "spark" and conf.get("spark.python.worker.reuse", "true") != "true":
        raise ConfigError("the spark input mode needs spark.python.worker.reuse=true")
    if conf.get("spark.task.maxFailures", "4") != "1":
        log.warning(
            "spark.task.maxFailures is not 1: a failed TensorFlow task would be "
            "retried into a cluster that has moved on; set it to 1"
        )
    storage.makedirs(run.model_dir)
    resumed = artifacts.latest_checkpoint_step(run.model_dir)
    log.info(
        "training %s on %s (%s split, %d rows, input mode %s): global batch %d, "
        "%d steps per epoch, steps %d -> %d%s",
        train.model,
        train.data,
        train.split,
        plan.data.rows,
        train.input_mode,
        plan.global_batch,
        plan.steps_per_epoch,
        resumed,
        plan.target_steps,
        f" (resuming from {run.model_dir})" if resumed else "",
    )
    started_wall = time.time()
    started = time.monotonic()
    restarts: list[dict] = []
    while True:
        try:
            with ClusterRun(spark, plan) as cluster:
                cluster.start()
                with tracker.follow(cluster):
                    result = cluster.wait()
            break
        except TrainingError as exc:
            if len(restarts) >= run.max_restarts:
                raise
            step = artifacts.latest_checkpoint_step(run.model_dir)
            restarts.append({"cause": str(exc), "resumed_from_step": step})
            tracker.restarted(step, str(exc))
            log.warning(
                "restart %d of %d: the TensorFlow cluster is started again from the checkpoint "
                "of step %d after: %s",
                len(restarts),
                run.max_restarts,
                step,
                exc,
            )
    first = result.get("first_step_wall")
    out = TrainResult(
        model_dir=run.model_dir,
        start_step=resumed if restarts else int(result["start_step"]),
        final_step=int(result["final_step"]),
        metrics=dict(result.get("metrics") or {}),
        checkpoint=result.get("checkpoint"),
        export_path=result.get("export_path"),
        elapsed_s=time.monotonic() - started,
        examples=int(result.get("examples") or 0),
        examples_per_sec=float(result.get("examples_per_sec") or 0.0),
        time_to_first_step_s=(first - started_wall) if first else None,
        strategy=scaling.strategy,
        input_mode=train.input_mode,
        gpus=list(result.get("gpus") or []),
        restarts=restarts,
        eval_metrics=dict(result.get("eval_metrics") or {}),
        eval_history=list(result.get("eval_history") or []),
        best_export_path=result.get("best_export"),
        fed_rows=dict(cluster.fed_rows_by) if train.input_mode == "spark" else None,
        mlflow_run_id=tracker.run_id,
    )
    if out.eval_metrics:
        log.info(
            "evaluation on the %s split: %s",
            plan.eval_data.split,
            ", ".join(f"{k} {v:.4g}" for k, v in out.eval_metrics.items()),
        )
    trained = out.final_step > out.start_step
    log.info(
        "done: step %d%s, %.1f s%s",
        out.final_step,
        "".join(f", {k} {v:.4g}" for k, v in out.metrics.items())
        + (f", {out.examples_per_sec:.0f} examples/s" if trained else " (nothing left to train)"),
        out.elapsed_s,
        f", exported {out.export_path}" if out.export_path else "",
    )
    return out
