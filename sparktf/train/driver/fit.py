"""The driver's entry point: :func:`fit` plans a run, brings its cluster up, returns the result.

Importing this module does not import TensorFlow (the driver needs none).
"""

from __future__ import annotations

import dataclasses
import logging
import time

from sparktf import paths, scratch, storage
from sparktf.train import artifacts
from sparktf.train.config import (
    ConfigError,
    RunConfig,
    ScalingConfig,
    TrainConfig,
    TrainingError,
    TrainResult,
)
from sparktf.train.driver import elastic, gang, tracking
from sparktf.train.driver.cluster import ClusterRun
from sparktf.train.plan import RunPlan, plan_frame, plan_run
from sparktf.train.result import PAUSED, ProcessResult, ResultRejected

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
            GPU settings of ``scaling``: :func:`gpu_spark_conf`). It must have exactly
            ``scaling.num_executors`` executors.
        columns: with a DataFrame, its column for each of the model's inputs named
            otherwise: ``{"features": ..., "label": ..., "id": ...}`` (the ``id`` column, an
            integer, names rows in errors).

    Returns:
        A :class:`~sparktf.train.config.TrainResult`: the steps trained, the last training
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
    result, restarts, resizes, cluster = _attempts(spark, plan, tracker, frame)
    out = TrainResult(
        model_dir=run.model_dir,
        start_step=resumed if restarts or resizes else result.start_step,
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
        restarts=restarts,
        resizes=resizes,
        eval_metrics=dict(result.eval_metrics),
        eval_history=list(result.eval_history),
        best_export_dir=result.best_export,
        fed_rows=dict(cluster.fed_rows_by) if train.input_mode == "spark" else None,
        mlflow_run_id=tracker.run_id,
        processes=dict(cluster.placement),
    )
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


def _attempts(
    spark, plan: RunPlan, tracker: tracking.Tracker | tracking.NullTracker, frame=None
) -> tuple[ProcessResult, list[dict], list[dict], ClusterRun]:
    """Runs the TensorFlow cluster until the chief is done, starting it again from the
    latest checkpoint after a failure (at most ``run.failure.max_restarts`` times); an elastic
    run also starts again with another number of workers (:mod:`sparktf.train.driver.elastic`,
    at most ``run.failure.max_resizes`` times). The chief's result, the restarts, the resizes
    and the cluster of the last attempt."""
    run, scaling = plan.run, plan.scaling
    restarts: list[dict] = []
    resizes: list[dict] = []
    workers = elastic.initial_size(spark, scaling, run.failure) if scaling.elastic else 0
    while True:
        attempt = plan.with_workers(workers) if scaling.elastic else plan
        if resizes:
            attempt = dataclasses.replace(attempt, resize=resizes[-1])
        cluster = None
        try:
            with ClusterRun(spark, attempt, frame=frame) as cluster:
                cluster.start()
                grow = elastic.GrowWatch(spark, cluster, attempt.scaling, scaling.num_workers)
                with tracker.follow(cluster), grow:
                    result = ProcessResult.from_dict(cluster.wait(), model_dir=run.model_dir)
            if resizes:
                resizes[-1]["training_again_at"] = result.first_step_wall
            if result.end_reason != PAUSED:
                return result, restarts, resizes, cluster
            new = _size(spark, plan, 0, "the pause", resizes, restarts)
            step, resumed, reason = result.final_step, result.final_step, grow.requested or ""
        except ResultRejected:
            raise
        except (TrainingError, gang.SlotsError) as exc:  # slots gone since they were counted
            if not scaling.elastic:
                if isinstance(exc, gang.SlotsError):
                    raise
                _restart(restarts, run, tracker, exc)
                continue
            new = _size(spark, plan, workers, exc, resizes, restarts)
            if new >= workers:  # the same cluster fits again: a restart, not a resize
                _restart(restarts, run, tracker, exc)
                continue
            resumed, reason = artifacts.latest_checkpoint_step(run.model_dir), _first_line(exc)
            step = max(_last_step(cluster), resumed)
        if new == workers:
            log.info("elastic run: still %d workers can be placed; going on with them", new)
            continue
        if len(resizes) >= run.failure.max_resizes:
            raise TrainingError(
                f"the elastic run changed size {len(resizes)} times "
                f"(FailureConfig.max_resizes) and would again: {reason}"
                + _history(resizes, restarts)
            )
        kind = "grow" if new > workers else "shrink"
        event = elastic.Resize(kind, workers, new, step, resumed, reason, time.time())
        resizes.append(event.to_dict())
        tracker.resized(resizes[-1])
        log.warning("elastic run: %s", event.describe())
        workers = new


def _size(spark, plan: RunPlan, prefer: int, after, resizes: list, restarts: list) -> int:
    """The workers of an elastic run's next attempt (:func:`elastic.size_now`); below the
    minimum for too long the error names ``after`` (what ended the last attempt) and the
    history of the run."""
    try:
        return elastic.size_now(
            spark, plan.scaling, wait_s=plan.run.failure.below_min_timeout_s, prefer=prefer
        )
    except elastic.BelowMinimum as below:
        raise elastic.BelowMinimum(f"{below} after: {after}{_history(resizes, restarts)}") from None


def _restart(restarts: list[dict], run: RunConfig, tracker, exc: TrainingError) -> None:
    """Records a restart after ``exc``, or raises it when none is left."""
    if len(restarts) >= run.failure.max_restarts:
        raise exc
    step = artifacts.latest_checkpoint_step(run.model_dir)
    restarts.append({"cause": str(exc), "resumed_from_step": step})
    tracker.restarted(step, str(exc))
    log.warning(
        "restart %d of %d: the TensorFlow cluster is started again from the checkpoint "
        "of step %d after: %s",
        len(restarts),
        run.failure.max_restarts,
        step,
        exc,
    )


def _last_step(cluster: ClusterRun | None) -> int:
    """The highest step the processes of an ended attempt reported (0: none)."""
    if cluster is None or cluster.control is None:
        return 0
    steps = [n.progress.get("step", 0) for n in cluster.control.snapshot().values() if n.progress]
    return int(max(steps, default=0))


def _first_line(exc: BaseException) -> str:
    """An error's first line (a resize's reason; the log has the whole error)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _history(resizes: list[dict], restarts: list[dict]) -> str:
    """What happened to an elastic run so far, for its error."""
    lines = [f"\n  {r['kind']} {r['from']} -> {r['to']} workers at step {r['step']}: "
             f"{r['reason']}" for r in resizes]  # fmt: skip
    lines += [f"\n  restart from step {r['resumed_from_step']}: {r['cause']}" for r in restarts]
    return "; history:" + "".join(lines) if lines else "; no resize before"


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
