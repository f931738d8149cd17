"""The driver's entry point: :func:`fit` plans a run, brings its cluster up, returns the result.

Importing this module does not import TensorFlow (the driver needs none).
"""

from __future__ import annotations

import dataclasses
import logging
import time

from sparktf import paths, scratch, storage
from sparktf.train import artifacts
from sparktf.train.config import RunConfig, ScalingConfig, TrainConfig
from sparktf.train.driver import attempts, doctor, gang, tracking
from sparktf.train.errors import ConfigError
from sparktf.train.plan import RunPlan, plan_frame, plan_run
from sparktf.train.result import TrainResult

__all__ = ["FRAME", "fit", "gpu_spark_conf", "session_for"]

log = logging.getLogger("sparktf.train")

FRAME = "(a DataFrame)"  # TrainConfig.data of a run fed from a DataFrame, as logs show it


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
    scaling: ScalingConfig,
    run: RunConfig,
    *,
    spark=None,
    columns: dict[str, str] | None = None,
) -> TrainResult:
    """Trains ``train.model`` on Spark executors; returns when the chief has exported.

    Parameters:
        train: what to train (the model, its dataset and split, the input mode, the length
            of the run). ``train.data`` may be a DataFrame instead of a dataset directory:
            its rows are fed to the TensorFlow processes as they are (``spark`` input mode,
            no dataset written, every epoch runs the DataFrame's plan again: cache it when
            that is costly), after one Spark job has checked its columns.
        scaling: the strategy and how many TensorFlow processes run it, with their GPUs
            and threads (``ScalingConfig()`` is all-reduce over two processes).
        run: where and how the run keeps its state: ``model_dir`` (local or ``hdfs://``;
            a run resumes from its latest checkpoint), ``checkpoint`` (cadence, how many
            kept, the export), ``failure`` (timeouts, restarts), ``evaluation`` (split,
            cadence, best export), ``tracking`` (summaries, progress, MLflow).
        spark: the SparkSession to run on (default ``sparktf.spark.get_session``, with the
            GPU settings of ``scaling``: :func:`gpu_spark_conf`). Its executors must hold
            ``scaling.num_executors`` task slots in all (any number of executors does).
        columns: with a DataFrame, its column for each of the model's inputs named
            otherwise: ``{"features": ..., "label": ..., "id": ...}`` (the ``id`` column, an
            integer, names rows in errors).

    Returns:
        A :class:`~sparktf.train.result.TrainResult`: the steps trained, the last training
        metrics and evaluations, the checkpoint and export paths, the throughput, the
        restarts; with ``run.tracking.mlflow_tracking_uri`` the MLflow run it was recorded in
        (``mlflow_run_id``, see :mod:`sparktf.train.driver.tracking`).

    Raises:
        ConfigError: settings that cannot work, found before anything starts (a dataset
            that does not fit the model, a layout the executors cannot hold, the ``spark``
            input mode without ``spark.python.worker.reuse``, MLflow missing or a tracking
            store that refuses).
        TableInputError: a DataFrame whose columns the model cannot read (a missing column,
            a type, a null, a label outside the classes, a row of another size), named with
            the row, before anything starts.
        TrainingError: a TensorFlow process or a Spark job of the run failed (after
            ``run.failure.max_restarts`` restarts from the latest checkpoint), or the chief's
            result named a path outside ``run.model_dir`` (refused at once, no restart).
            The attempts, restarts and resizes are :mod:`sparktf.train.driver.attempts`'s.

    In both cases nothing of the run is left running.
    """
    # The run's clock (``TrainResult.time_to_first_step_s``, ``elapsed_s``) starts here:
    # everything fit() does before the first step is what a caller waits for.
    started = (time.time(), time.monotonic())
    if run.tracking.mlflow_tracking_uri:
        tracking.require_mlflow()  # before anything is read or started
    # Local paths are resolved here, on the driver: executors run in their own work dirs.
    run = dataclasses.replace(run, model_dir=storage.parse(run.model_dir).uri)
    frame = None
    if isinstance(train.data, str):
        train = dataclasses.replace(train, data=storage.parse(train.data).uri)
        plan = plan_run(train, scaling, run)
    else:  # a DataFrame: fed by Spark tasks as it is
        df, train = train.data, dataclasses.replace(train, data=FRAME, input_mode="spark")
        plan, frame = plan_frame(train, scaling, run, df, columns)
    with tracking.track(plan) as tracker:
        out = _run(plan, spark, tracker, started, frame)
        tracker.finish(out)
    return out


def _run(
    plan: RunPlan,
    spark,
    tracker: tracking.Tracker | tracking.NullTracker,
    started: tuple[float, float],
    frame=None,
) -> TrainResult:
    """The run of ``plan``; ``started``: ``time.time()`` and ``time.monotonic()`` when
    fit() was called (the result's times count from there); ``frame``: the DataFrame to feed
    (None: the dataset's split)."""
    train, run = plan.train, plan.run
    scratch.sweep()  # scratch of earlier runs' processes on this machine that are gone
    spark = session_for(plan, spark)
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
    started_wall, started_mono = started
    outcome = attempts.run_attempts(
        spark, plan, tracker, attempts.CheckpointResume(run.model_dir), frame
    )
    result, cluster = outcome.result, outcome.cluster
    input_wait, diagnosis = doctor.examine(plan, cluster)
    out = TrainResult(
        model_dir=run.model_dir,
        start_step=resumed if outcome.events else result.start_step,
        final_step=result.final_step,
        metrics=dict(result.metrics),
        last_checkpoint=result.last_checkpoint,
        export_dir=result.export_dir,
        elapsed_s=time.monotonic() - started_mono,
        examples=result.examples,
        examples_per_sec=result.examples_per_sec,
        time_to_first_step_s=(
            result.first_step_wall - started_wall if result.first_step_wall else None
        ),
        strategy=plan.scaling.strategy,
        input_mode=train.input_mode,
        gpus=list(result.gpus),
        restarts=outcome.restarts,
        resizes=outcome.resizes,
        eval_metrics=dict(result.eval_metrics),
        eval_history=list(result.eval_history),
        best_export_dir=result.best_export,
        fed_rows=dict(cluster.fed_rows_by) if train.input_mode == "spark" else None,
        mlflow_run_id=tracker.run_id,
        processes=dict(cluster.placement),
        feed_epochs=outcome.feed_epochs,
        input_wait=input_wait,
        input_diagnosis=diagnosis,
        startup_s={k: round(when - started_wall, 3) for k, when in result.startup.items()},
    )
    attempts.record_outcome(out)
    _log_done(plan, out)
    return out


def session_for(plan: RunPlan, spark):
    """``spark``, or a new session with the GPU settings of the plan; checks its settings."""
    train = plan.train
    if spark is None:
        from sparktf.spark import get_session

        spark = get_session(f"sparktf-train-{train.model}", overrides=gpu_spark_conf(plan.scaling))
    conf = gang.conf_values(spark, ("spark.python.worker.reuse", "spark.task.maxFailures"))
    if train.input_mode == "spark" and conf.get("spark.python.worker.reuse", "true") != "true":
        raise ConfigError("the spark input mode needs spark.python.worker.reuse=true")
    if conf.get("spark.task.maxFailures", "4") != "1":
        log.warning(
            "spark.task.maxFailures is not 1: a failed TensorFlow task would be "
            "retried into a cluster that has moved on; set it to 1"
        )
    return spark


def _log_done(plan: RunPlan, out: TrainResult) -> None:
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
        f", exported {out.export_dir}" if out.export_dir else "",
    )
    if out.startup_s:  # where the time to the first step went, the chief's milestones
        log.info(
            "start-up (s from the call): %s",
            ", ".join(f"{k} {v:.2f}" for k, v in out.startup_s.items()),
        )
