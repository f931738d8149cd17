"""What one training process reports to the driver when it has finished: :class:`ProcessResult`.

The chief's :class:`~sparktf.train.process.trainer.Trainer` makes it, sends it as the ``done``
event of
the control channel (:mod:`sparktf.train.wire.control`, a JSON object:
:meth:`ProcessResult.to_dict`)
and the driver reads it back (:meth:`ProcessResult.from_dict`) to build the run's
:class:`~sparktf.train.config.TrainResult`. No TensorFlow here: the driver imports this module.

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
from sparktf.train.config import TrainingError

__all__ = ["PATH_FIELDS", "PAUSED", "ProcessResult", "ResultRejected", "within"]

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
    ``step``; ``best_export``: the best evaluation's export (``EvalConfig.export_best``).
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
        )
