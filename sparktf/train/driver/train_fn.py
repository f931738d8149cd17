"""Your own training function on the cluster: :func:`run`.

``run(train_fn, scaling, run)`` starts the same gang-scheduled TensorFlow cluster as
:func:`~sparktf.train.driver.fit.fit` (TensorFlowOnSpark's barrier stage, the authenticated
control channel, ``TF_CONFIG``, the restarts of ``FailureConfig.max_restarts``, nothing left
running) and runs ``train_fn(config)`` in every process that trains: every worker under
all-reduce, the chief (the coordinator) under ps, while the other ps processes serve. The
function finds its place, strategy and data with :func:`sparktf.train.get_context` and
reports with :func:`sparktf.train.report` (:mod:`sparktf.train.process.context`).

``train_fn`` and ``config`` travel pickled by value (cloudpickle) inside the run's plan, as a
registered model does: what they use from their own module goes with them, while the modules
they import (keras, numpy, your installed packages) must be importable on the executors.

Importing this module does not import TensorFlow.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from collections.abc import Callable
from typing import Any

from sparktf import paths, scratch, storage
from sparktf.datasets import formats
from sparktf.train.config import RunConfig, ScalingConfig, TrainConfig
from sparktf.train.driver import attempts, doctor, tracking
from sparktf.train.driver.fit import FRAME, session_for
from sparktf.train.errors import ConfigError
from sparktf.train.plan import DataInfo, RunPlan, describe_data
from sparktf.train.result import TrainResult

__all__ = ["run"]

log = logging.getLogger("sparktf.train")


def run(
    train_fn: Callable[..., Any],
    scaling: ScalingConfig | None = None,
    run: RunConfig | None = None,
    *,
    config: Any = None,
    data: Any = None,
    seed: int = 0,
    shuffle: bool = True,
    spark=None,
) -> TrainResult:
    """Runs ``train_fn(config)`` (``train_fn()`` when it takes no argument) in every
    training process of a TensorFlow cluster on Spark's executors; returns when the chief's
    call has returned.

    Parameters:
        train_fn: the training function (see :mod:`sparktf.train.process.context` for what
            it sees); Keras 3 ``model.fit`` works in it under all-reduce
            (:mod:`sparktf.train.process.keras_fit`).
        scaling: the strategy and its processes (default ``ScalingConfig()``: all-reduce
            over two); under ps the chief runs ``train_fn`` with the strategy's coordinator.
            A worker range (``num_workers=(MIN, MAX)``) makes the run elastic: a lost worker
            starts the function again with the workers that fit, from its last reported
            checkpoint; when slots come back, :func:`~sparktf.train.report` returns True (and
            ``get_context().should_stop()`` says so) and the function returns after saving,
            to go on with more workers (:mod:`sparktf.train.driver.attempts`).
        run: the model directory (``get_context().model_dir``: where reported checkpoints
            and the TensorBoard events go) and the failure settings: with
            ``failure.max_restarts`` a failed attempt is run again, its ``train_fn`` given the
            last checkpoint it reported (``get_context().restored_dir``). Default: a new
            directory under the scratch space.
        config: anything picklable, handed to ``train_fn``.
        data: a dataset directory written by :mod:`sparktf.datasets.conversion` (local or
            ``hdfs://``) that ``get_context().dataset(split, batch_size=...)`` reads; or a
            DataFrame, whose rows Spark feeds to the training processes as they are (the
            ``spark`` input mode, no copy written), every column a tensor of the dataset:
            numbers, strings, Vectors or arrays of one size, ``numpy.save`` bytes of one
            shape. Its columns are checked first, in one Spark job (a null or a row of
            another size fails naming the column and the row); the passes never end, and
            each runs the DataFrame's plan again (cache a costly one).
        seed, shuffle: a DataFrame's feed: every epoch in an order shuffled with ``seed``
            (the same seed, data and workers give every process the same rows in the same
            order); ``shuffle=False`` keeps the stored order (:mod:`sparktf.train.feed.order`).
        spark: the SparkSession (default ``sparktf.spark.get_session``); its executors must
            hold ``scaling.num_executors`` task slots.

    Returns:
        A :class:`~sparktf.train.result.TrainResult` whose ``value`` is what the chief's
        ``train_fn`` returned (JSON data), ``history`` its reports, ``metrics`` the last
        report's, ``last_checkpoint`` the last checkpoint reported, ``restarts`` and
        ``resizes`` the events between attempts.

    Raises:
        ConfigError: settings that cannot work, before anything starts (a ``train_fn`` or
            ``config`` that cannot be pickled); ``data`` without a manifest raises what
            :func:`sparktf.datasets.formats.load_manifest` raises, a DataFrame that cannot
            be fed :class:`~sparktf.datasets.tables.TableInputError`.
        TrainingError: ``train_fn`` raised (the message names the exception, its message and
            the file and line it came from) or a process failed, after the restarts.
    """
    started = time.monotonic()
    scaling = scaling or ScalingConfig()
    if run is None:  # a directory of its own, kept: the reports' checkpoints are there
        name = getattr(train_fn, "__name__", "train_fn").strip("<>") or "train_fn"
        stamp = time.strftime("%Y%m%d-%H%M%S")
        run = RunConfig(model_dir=str(paths.state_dir("runs") / f"{name}-{stamp}-{os.getpid()}"))
    run = dataclasses.replace(run, model_dir=storage.parse(run.model_dir).uri)
    frame = None
    if data is not None and not isinstance(data, str):  # a DataFrame, fed by Spark
        frame, data = data, None
    plan = plan_function(train_fn, scaling, run, config=config, data=data)
    plan = dataclasses.replace(
        plan, train=dataclasses.replace(plan.train, seed=seed, shuffle=shuffle)
    )
    if frame is not None:
        plan, frame = _frame_plan(plan, frame)
    with tracking.track(plan) as tracker:
        out = _run(plan, spark, tracker, started, frame)
        tracker.finish(out)
    return out


def plan_function(
    train_fn: Callable[..., Any],
    scaling: ScalingConfig,
    run: RunConfig,
    *,
    config: Any = None,
    data: str | None = None,
) -> RunPlan:
    """The plan of a function run: ``train_fn`` and ``config`` pickled by value, the dataset
    described when given (see :func:`run` for what it raises)."""
    from sparktf.models import custom

    if not callable(train_fn):
        raise ConfigError(f"run() needs a function to run, not {type(train_fn).__name__}")
    if scaling.scale_batch:
        raise ConfigError(
            "ScalingConfig.scale_batch: run(train_fn) has no batch of its own to scale; the "
            "function reads get_context().world_size and sizes its batch itself"
        )
    name = getattr(train_fn, "__qualname__", type(train_fn).__name__)
    try:
        payload = custom.dumps_by_value((train_fn, config, source_file(train_fn)), [train_fn])
    except Exception as exc:  # cloudpickle raises whatever the object's reducer raises
        raise ConfigError(
            f"run(): {name} or its config cannot be pickled to ship to the executors: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    info = DataInfo(dataset="", kind="function", data="", split="", rows=0, fields=())
    if data is not None:
        data = storage.parse(data).uri
        manifest = formats.load_manifest(data)
        split = next(iter(manifest["splits"]))
        info = describe_data(data, split, (), manifest)
    # what the run's logs and MLflow show; the processes read plan.data, not this
    train = TrainConfig(model=f"function:{name}", data=data or "(no dataset)", input_mode="files")
    return RunPlan(
        train=train,
        scaling=scaling,
        run=run,
        model_config={},
        data=info,
        global_batch=1,
        steps_per_epoch=1,
        target_steps=0,
        feed_passes=None,
        log_level=logging.getLevelName(logging.getLogger().level or logging.INFO),
        function=payload,
    )


def _frame_plan(plan: RunPlan, df) -> tuple[RunPlan, Any]:
    """``plan`` fed from the DataFrame ``df`` (every column), and the frame to feed."""
    from sparktf.datasets.tables import check_inputs

    table = check_inputs(df, {c: c for c in df.columns}, label_col=None, id_col="id", labels=None)
    info = DataInfo(
        dataset="dataframe",
        kind="table",
        data=FRAME,
        split="train",
        rows=table.count,
        fields=table.fields,
        frame=True,
    )
    train = dataclasses.replace(plan.train, data=FRAME, input_mode="spark")
    plan = dataclasses.replace(plan, train=train, data=info)
    return plan, table.rows.select(*info.names)


def source_file(fn) -> str | None:
    """The file that defines ``fn`` (cloudpickle ships code by value under the name
    ``<dynamic-code>``; the process puts this name back, so that a traceback names it)."""
    code = getattr(fn, "__code__", None)  # a function (not another callable)
    return os.path.abspath(code.co_filename) if code is not None else None


def _run(plan: RunPlan, spark, tracker, started: float, frame=None) -> TrainResult:
    """The run of ``plan``; ``started``: ``time.monotonic()`` when run() was called;
    ``frame``: the DataFrame to feed (None: none)."""
    scratch.sweep()
    spark = session_for(plan, spark)
    storage.makedirs(plan.run.model_dir)
    log.info(
        "running %s on %d executors (%s), model directory %s",
        plan.train.model.split(":", 1)[1],
        plan.scaling.num_executors,
        plan.scaling.describe(),
        plan.run.model_dir,
    )
    resume = attempts.ReportResume(plan.run.model_dir)
    outcome = attempts.run_attempts(spark, plan, tracker, resume, frame)
    done, cluster, history = outcome.result, outcome.cluster, resume.history
    last = history[-1] if history else {}
    input_wait, diagnosis = doctor.examine(plan, cluster)
    out = TrainResult(
        model_dir=plan.run.model_dir,
        start_step=0,
        final_step=int(last.get("step", 0)),
        metrics=dict(last.get("metrics", {})),
        last_checkpoint=resume.last_checkpoint(),
        export_dir=None,
        elapsed_s=time.monotonic() - started,
        examples=0,
        examples_per_sec=0.0,
        time_to_first_step_s=None,
        strategy=plan.scaling.strategy,
        input_mode="function",
        restarts=outcome.restarts,
        resizes=outcome.resizes,
        mlflow_run_id=tracker.run_id,
        value=done.get("value"),
        history=history,
        processes=dict(cluster.placement),
        feed_epochs=outcome.feed_epochs,
        input_wait=input_wait,
        input_diagnosis=diagnosis,
    )
    attempts.record_outcome(out)
    if resume.dropped:
        log.info(
            "the result's history holds the last %d of the %d reports", len(history), resume.reports
        )
    log.info(
        "done: %s returned after %.1f s and %d report(s)%s",
        plan.train.model.split(":", 1)[1],
        out.elapsed_s,
        resume.reports,
        f"; last: {', '.join(f'{k} {v:.4g}' for k, v in out.metrics.items())}"
        if out.metrics
        else "",
    )
    return out
