"""What a run returns (:class:`TrainResult`) and what one training process reports to the
driver when it has finished (:class:`ProcessResult`).

The chief's :class:`~sparktf.train.process.trainer.Trainer` makes a :class:`ProcessResult`,
sends it as the ``done`` event of the control channel (:mod:`sparktf.train.wire.control`, a
JSON object: :meth:`ProcessResult.to_dict`), and the driver reads it back
(:meth:`ProcessResult.from_dict`) to build the run's :class:`TrainResult`. No TensorFlow here:
the driver imports this module.

The driver acts on the paths a result names (MLflow uploads the exports), so a result whose
paths do not lie under the run's model directory is refused (:class:`ResultRejected`,
:func:`within`).
"""

from __future__ import annotations

import dataclasses
import os
import posixpath
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlparse

from sparktf import storage
from sparktf.errors import SparktfError
from sparktf.train.errors import TrainingError

__all__ = ["PATH_FIELDS", "PAUSED", "ProcessResult", "ResultRejected", "TrainResult", "within"]

# The end reason of an elastic run's planned stop (a resize): the chief checkpointed at the
# step all training processes agreed on, and neither evaluated nor exported.
PAUSED = "paused"

PATH_FIELDS = ("last_checkpoint", "export_dir", "best_export")  # the result's paths


class ResultRejected(TrainingError):
    """The chief's result names a path outside the run's model directory."""


def within(path: str, model_dir: str, *, resolve: bool = False) -> bool:
    """Whether ``path`` lies under ``model_dir`` (or is it): same scheme and NameNode, no
    ``..`` segment, no control character, its normalised path inside the directory's.
    ``resolve``: local paths are compared after following symbolic links (for a reader of
    the files, not only of the name)."""
    if not isinstance(path, str) or not path or any(ord(c) < 32 for c in path):
        return False
    if ".." in urlparse(path).path.split("/"):
        return False
    try:
        loc, root = storage.parse(path), storage.parse(model_dir)
    except (SparktfError, ValueError):
        return False
    if (loc.scheme, loc.netloc.lower()) != (root.scheme, root.netloc.lower()):
        return False
    inner, outer = posixpath.normpath(loc.path), posixpath.normpath(root.path)
    if resolve and loc.scheme == "file":
        inner, outer = os.path.realpath(inner), os.path.realpath(outer)
    return inner == outer or inner.startswith(outer.rstrip("/") + "/")


def _float_map(values: Any) -> dict[str, float]:
    return {str(k): float(v) for k, v in (values or {}).items()}


def _evaluation(values: dict[str, Any]) -> dict[str, Any]:
    """One evaluation: its integer ``step`` and its metrics as floats."""
    return {
        "step": int(values["step"]),
        **_float_map({k: v for k, v in values.items() if k != "step"}),
    }


def _optional(kind: type, value: Any) -> Any:
    return None if value is None else kind(value)


@dataclass(frozen=True)
class ProcessResult:
    """The end of one training process: its steps, metrics, artifacts and counters.

    ``metrics``: the last step's training metrics (the chief's; empty on other processes);
    ``examples_per_sec``: from the end of the first step to the end of the last (the final
    checkpoint, evaluation and export are not counted); ``first_step_wall``: ``time.time()``
    when the first step ended; ``fed_rows``/``dropped_rows``: the ``spark`` input mode's rows
    received and left over (None for ``files``); ``progress``: the last progress report (the
    heartbeat's format, which the driver keeps as the process's latest state);
    ``eval_metrics``: the last evaluation, ``eval_history`` every evaluation with its
    ``step``; ``best_export``: the best evaluation's export (``EvalConfig.export_best``);
    ``input_timing``: how long the process waited for its batches against its steps
    (:meth:`sparktf.train.process.inputs.InputClock.stats`; empty when not measured).
    """

    start_step: int
    final_step: int
    end_reason: str
    metrics: dict[str, float] = field(default_factory=dict)
    last_checkpoint: str | None = None
    export_dir: str | None = None
    examples: int = 0
    examples_per_sec: float = 0.0
    first_step_wall: float | None = None
    fed_rows: int | None = None
    dropped_rows: int | None = None
    gpus: list[str] = field(default_factory=list)
    progress: dict[str, Any] = field(default_factory=dict)
    eval_metrics: dict[str, float] = field(default_factory=dict)
    eval_history: list[dict[str, Any]] = field(default_factory=list)
    best_export: str | None = None
    input_timing: dict[str, Any] = field(default_factory=dict)
    startup: dict[str, float] = field(default_factory=dict)  # process.milestones: time.time()

    def to_dict(self) -> dict[str, Any]:
        """A JSON object (only dicts, lists, strings, numbers and None)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], *, model_dir: str | None = None) -> ProcessResult:
        """The result :meth:`to_dict` wrote, after a trip through JSON.

        Parameters:
            data: the ``done`` event's data.
            model_dir: the run's model directory: every path of the result must lie under it
                (:func:`within`).

        Raises:
            TrainingError: naming the field when a required field (the steps, the end reason)
                is missing or a value has the wrong type; absent optional fields take their
                defaults.
            ResultRejected: (a TrainingError) a path of the result lies outside ``model_dir``.
        """
        try:
            result = cls._parse(data)
        except KeyError as exc:
            raise TrainingError(f"the chief's result lacks {exc}: {data!r}") from None
        except (TypeError, ValueError) as exc:
            raise TrainingError(f"the chief's result is malformed ({exc}): {data!r}") from None
        if model_dir is not None:
            result.check_paths(model_dir)
        return result

    def check_paths(self, model_dir: str) -> None:
        """Raises :class:`ResultRejected` when a path of this result (its checkpoint, export
        or best export) does not lie under ``model_dir``."""
        for name in PATH_FIELDS:
            path = getattr(self, name)
            if path is not None and not within(path, model_dir):
                raise ResultRejected(
                    f"the chief's result names {name} {path[:300]!r}, which is not under the "
                    f"run's model directory {model_dir}: result refused"
                )

    @classmethod
    def _parse(cls, data: dict[str, Any]) -> ProcessResult:
        return cls(
            start_step=int(data["start_step"]),
            final_step=int(data["final_step"]),
            end_reason=str(data["end_reason"]),
            metrics=_float_map(data.get("metrics")),
            last_checkpoint=_optional(str, data.get("last_checkpoint")),
            export_dir=_optional(str, data.get("export_dir")),
            examples=int(data.get("examples") or 0),
            examples_per_sec=float(data.get("examples_per_sec") or 0.0),
            first_step_wall=_optional(float, data.get("first_step_wall")),
            fed_rows=_optional(int, data.get("fed_rows")),
            dropped_rows=_optional(int, data.get("dropped_rows")),
            gpus=[str(g) for g in data.get("gpus") or []],
            progress=dict(data.get("progress") or {}),
            eval_metrics=_float_map(data.get("eval_metrics")),
            eval_history=[_evaluation(e) for e in data.get("eval_history") or []],
            best_export=_optional(str, data.get("best_export")),
            input_timing=_float_map(data.get("input_timing")),
            startup=_float_map(data.get("startup")),
        )


@dataclass(frozen=True)
class TrainResult:
    """What :func:`sparktf.train.fit` and :func:`sparktf.train.run` return. ``elapsed_s``
    and ``time_to_first_step_s`` (to the end of the chief's first step) count from the call."""

    model_dir: str
    start_step: int
    final_step: int
    metrics: dict[str, float]
    last_checkpoint: str | None  # the last checkpoint written
    export_dir: str | None
    elapsed_s: float
    examples: int
    examples_per_sec: float
    time_to_first_step_s: float | None
    strategy: str
    input_mode: str
    gpus: list[str] = field(default_factory=list)  # GPUs the chief's TensorFlow saw
    # the last evaluation ({} without one) and every evaluation with its step
    eval_metrics: dict[str, float] = field(default_factory=dict)
    eval_history: list[dict[str, float]] = field(default_factory=list)
    best_export_dir: str | None = None  # EvalConfig.export_best
    # the events between attempts (sparktf.train.driver.attempts), one record each: {"kind":
    # "restart" | "shrink" | "grow", "from", "to" (workers), "step" (the last step reached),
    # "resumed_from_step", "cause", "time", "training_again_at", and for run(train_fn)
    # "resumed_from_checkpoint"}; the restarts here, an elastic run's changes of size below
    restarts: list[dict[str, Any]] = field(default_factory=list)
    resizes: list[dict[str, Any]] = field(default_factory=list)
    # spark input mode: rows fed to each training process (by node key), one number per process
    fed_rows: dict[str, int] | None = None
    mlflow_run_id: str | None = None  # TrackingConfig.mlflow_tracking_uri: the MLflow run
    # sparktf.train.run: what the chief's train_fn returned (JSON data), and the chief's
    # reports in order ({"n", "step", "metrics", "checkpoint"?}) across restarts, the last 1000
    # (control.MAX_KEPT; "n" numbers every report)
    value: Any = None
    history: list[dict[str, Any]] = field(default_factory=list)
    # where the last attempt's processes ran, by role name ("chief:0"): {"host": the
    # address of its TensorFlow server, "executor": its Spark executor ("host:port"), or
    # "driver" for a parameter server of the driver}
    processes: dict[str, dict[str, str | None]] = field(default_factory=dict)
    # spark input mode: one entry per pass fed, in order, across attempts
    # (sparktf.train.feed.order): {"epoch", "attempt", "from_cursor" (the rows of the epoch's
    # order trained before: a resume point when not 0), "rows" (by process key, equal),
    # "left_over" (rows of the epoch short of a last global batch), "seconds" (Spark's time
    # for it)}; an epoch an attempt's end cut short is not listed
    feed_epochs: list[dict[str, Any]] = field(default_factory=list)
    # the share of its training time each process waited for its next batch, by role name
    # ("chief:0"), and when the run waited more than sparktf.train.driver.doctor.THRESHOLD
    # of its time the driver's finding: {"wait_fraction", "process" (the one that waited
    # most), "cause", "found" (the cause with its numbers), "advice", "evidence"}
    input_wait: dict[str, float] = field(default_factory=dict)
    input_diagnosis: dict[str, Any] | None = None
    # where the time to the first step went: the chief's start-up milestones
    # (sparktf.train.process.milestones) in seconds from the call, in order ({} for
    # run(train_fn)): "launched", "joined", "tensorflow_imported", "strategy_ready",
    # "model_built", "first_step"
    startup_s: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The result as plain data (JSON-able)."""
        return dataclasses.asdict(self)
