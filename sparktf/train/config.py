"""What a training run is made of, as three typed configs (after Ray Train's split).

* :class:`TrainConfig` -- *what* to train: the model (a registry name plus config overrides),
  the data, how it reaches the TensorFlow processes, and for how long.
* :class:`ScalingConfig` -- *where and how many*: the distribution strategy, the number of
  workers and parameter servers, GPUs and threads per TensorFlow process.
* :class:`RunConfig` -- run-level policy: the model directory (checkpoints, TensorBoard
  events, exports; local or ``hdfs://``), how often to checkpoint and report, and the time
  limits that bound a failure or a stalled feed.

Everything is plain data (JSON-able with :func:`dataclasses.asdict`), validated on
construction; the driver's :class:`~sparktf.train.plan.RunPlan` carries the three unchanged
to every TensorFlow process.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from sparktf.errors import SparktfError

STRATEGIES = ("allreduce", "ps")
INPUT_MODES = ("spark", "files")
FILE_FORMATS = ("tfrecord", "parquet")


class ConfigError(SparktfError, ValueError):
    """A configuration that cannot run (the message says which setting and why)."""


class TrainingError(SparktfError, RuntimeError):
    """The run failed; the message names the process and its error."""


def _positive(
    name: str, value: float | int | None, *, allow_none: bool = False, allow_zero: bool = False
) -> None:
    if value is None and allow_none:
        return
    if value is None or value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(f"{name} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")


@dataclass(frozen=True)
class ScalingConfig:
    """How many TensorFlow processes, in which roles, with which devices.

    ``strategy``:

    * ``"allreduce"`` -- ``MultiWorkerMirroredStrategy``, synchronous data parallelism (the
      book's sync replicas). ``num_workers`` processes train, one of them the chief; each
      runs on its own Spark executor.
    * ``"ps"`` -- TF2 ``ParameterServerStrategy``, asynchronous updates (the book's 5.2
      ps/worker). A chief coordinates (it also reads the input and hands batches to the
      workers), ``num_workers`` workers compute, ``num_ps`` parameter servers hold the
      variables. The chief and the workers each take one Spark executor; the parameter
      servers take one executor each, or run on the driver with ``ps_on_driver``.

    ``num_executors`` is the number of Spark executors the run needs: exactly that many
    must be registered (TensorFlowOnSpark places one TensorFlow process per executor).
    """

    strategy: str = "allreduce"
    num_workers: int = 2
    num_ps: int = 1
    ps_on_driver: bool = False
    gpus_per_worker: int = 0
    threads_per_worker: int = 0  # TensorFlow intra-op threads per process; 0: TF's default

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"strategy must be one of {STRATEGIES}, got {self.strategy!r}")
        _positive("num_workers", self.num_workers)
        if self.strategy == "ps":
            _positive("num_ps", self.num_ps)
        _positive("gpus_per_worker", self.gpus_per_worker, allow_zero=True)
        _positive("threads_per_worker", self.threads_per_worker, allow_zero=True)

    @property
    def num_executors(self) -> int:
        """Spark executors the TensorFlow cluster occupies (one TF process each)."""
        if self.strategy == "allreduce":
            return self.num_workers
        return 1 + self.num_workers + (0 if self.ps_on_driver else self.num_ps)

    @property
    def num_ps_tasks(self) -> int:
        return self.num_ps if self.strategy == "ps" else 0

    def describe(self) -> str:
        if self.strategy == "allreduce":
            return f"allreduce: {self.num_workers} workers (worker 0 is the chief)"
        where = "on the driver" if self.ps_on_driver else "on executors"
        return f"ps: chief (coordinator) + {self.num_workers} workers + {self.num_ps} ps ({where})"


@dataclass(frozen=True)
class RunConfig:
    """Where results go and the policies of one run.

    ``model_dir`` (local path or ``hdfs://``) receives ``checkpoints/`` (every
    ``checkpoint_every_steps`` and at the end; a rerun resumes from the latest),
    ``events/train`` (TensorBoard), ``export/<global step>/`` (SavedModel) and
    ``sparktf_train.json`` (the run's configs).

    Time limits: ``failure_timeout_s`` bounds the time from a failure in any TensorFlow
    process (an exception, a crash, a lost executor, a process that stops responding) to the
    end of the run with an error; ``startup_timeout_s`` bounds bringing the cluster up, from
    the start of the run to the chief's first step; ``stall_timeout_s`` bounds the time
    without global-step progress after that (also the all-reduce collective timeout), so a
    process that still heart-beats but makes no progress fails the run; ``feed_timeout_s`` is
    how long the ``spark`` input mode waits for a TensorFlow process to take more rows
    (feeder side) or for rows to arrive (TensorFlow side) before it fails.

    ``max_restarts``: when a TensorFlow process, its executor or a Spark job of the run
    fails, the driver takes the TensorFlow cluster down and starts it again from the latest
    checkpoint, up to this many times (0: the first failure ends the run). At most one
    checkpoint interval of work is lost per restart.

    Experiment tracking (optional, the ``mlflow`` extra): with ``mlflow_tracking_uri`` the
    driver records the run in the MLflow experiment ``mlflow_experiment`` -- parameters,
    training metrics and evaluations with their steps, the export as an artifact (see
    :mod:`sparktf.train.tracking`).
    """

    model_dir: str
    checkpoint_every_steps: int = 500
    keep_checkpoints: int = 3
    summary_every_steps: int = 20
    histogram_every_steps: int = 0  # 0: with every checkpoint
    progress_every_s: float = 5.0
    sync_every_s: float = 60.0  # copy TensorBoard events to an hdfs:// model_dir
    feed_timeout_s: float = 300.0
    failure_timeout_s: float = 120.0
    startup_timeout_s: float = 300.0
    stall_timeout_s: float = 300.0
    max_restarts: int = 0
    eval_every_steps: int = 0  # 0: once per epoch (and always at the end)
    export_best: str | None = None  # a metric: also keep the export of its best evaluation
    export: bool = True
    mlflow_tracking_uri: str | None = None  # None: no tracking
    mlflow_experiment: str = "sparktf"

    def __post_init__(self) -> None:
        if not self.model_dir:
            raise ConfigError("model_dir is required (a local path or hdfs:// URI)")
        if self.mlflow_tracking_uri is not None and (
            not isinstance(self.mlflow_tracking_uri, str) or not self.mlflow_tracking_uri.strip()
        ):
            raise ConfigError(
                "mlflow_tracking_uri must be an MLflow tracking URI (http(s)://, file://, a "
                f"local path), got {self.mlflow_tracking_uri!r}"
            )
        if not isinstance(self.mlflow_experiment, str) or not self.mlflow_experiment.strip():
            raise ConfigError(
                f"mlflow_experiment must be an experiment name, got {self.mlflow_experiment!r}"
            )
        _positive("checkpoint_every_steps", self.checkpoint_every_steps)
        _positive("keep_checkpoints", self.keep_checkpoints)
        _positive("summary_every_steps", self.summary_every_steps)
        _positive("histogram_every_steps", self.histogram_every_steps, allow_zero=True)
        for name in (
            "progress_every_s",
            "sync_every_s",
            "feed_timeout_s",
            "failure_timeout_s",
            "startup_timeout_s",
            "stall_timeout_s",
        ):
            _positive(name, getattr(self, name))
        _positive("max_restarts", self.max_restarts, allow_zero=True)
        _positive("eval_every_steps", self.eval_every_steps, allow_zero=True)

    @property
    def heartbeat_timeout_s(self) -> float:
        """Silence after which the driver declares a TensorFlow process dead."""
        return max(5.0, min(60.0, self.failure_timeout_s / 2))

    @property
    def cleanup_timeout_s(self) -> float:
        """Time left to take the run down once a failure is known: detection (at most
        ``heartbeat_timeout_s``) plus clean-up stay within ``failure_timeout_s``."""
        return max(3.0, min(30.0, self.failure_timeout_s - self.heartbeat_timeout_s - 3.0))


@dataclass(frozen=True)
class TrainConfig:
    """What to train on which data, for how long.

    ``model`` is a registry name (``sparktf.models.list_models()``) and ``model_config``
    overrides entries of its config. ``data`` is a converted dataset directory (local or
    ``hdfs://``), ``split`` the split to train on.

    ``input_mode``: ``"spark"`` reads the split's Parquet as a DataFrame and feeds its rows
    to the TensorFlow processes (see :mod:`sparktf.train.feed`); ``"files"`` has each
    TensorFlow process read its own shard of the split's files (``file_format``).

    Fine-tuning: ``checkpoint_path`` (a checkpoint or SavedModel export of another run,
    local or ``hdfs://``) initialises the model when ``model_dir`` has no checkpoint of its
    own (a resume wins), except the variables whose path starts with one of
    ``checkpoint_exclude_scopes``; with ``trainable_scopes`` only those variables train.

    ``eval_split``: the split evaluated during training (every ``RunConfig.eval_every_steps``
    and at the end): ``"auto"`` takes ``valid`` when the dataset has it, else ``test``;
    ``"none"`` turns evaluation off.

    Length: ``steps`` (global steps, counted across resumes) and/or ``epochs`` (passes over
    the split); training stops at whichever comes first. Neither: the model's own
    ``max_steps`` / ``epochs``. ``batch_size`` is the global batch (default: the model's);
    every step takes exactly that many rows (a short remainder at the end of the data is
    dropped).
    """

    model: str
    data: str
    model_config: dict[str, Any] = field(default_factory=dict)
    split: str = "train"
    input_mode: str = "files"
    file_format: str = "tfrecord"
    epochs: float | None = None
    steps: int | None = None
    batch_size: int | None = None
    shuffle: bool = True
    seed: int = 0
    eval_split: str = "auto"  # "auto": valid if the dataset has it, else test; "none": off
    # fine-tuning: weights from another run's checkpoint or export (ignored on a resume),
    # except variables under exclude scopes; only variables under trainable scopes train
    checkpoint_path: str | None = None
    checkpoint_exclude_scopes: tuple[str, ...] = ()
    trainable_scopes: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("model is required")
        if not self.data:
            raise ConfigError("data is required (a converted dataset directory)")
        if self.input_mode not in INPUT_MODES:
            raise ConfigError(f"input_mode must be one of {INPUT_MODES}, got {self.input_mode!r}")
        if self.file_format not in FILE_FORMATS:
            raise ConfigError(
                f"file_format must be one of {FILE_FORMATS}, got {self.file_format!r}"
            )
        _positive("epochs", self.epochs, allow_none=True)
        _positive("steps", self.steps, allow_none=True)
        _positive("batch_size", self.batch_size, allow_none=True)


@dataclass(frozen=True)
class TrainResult:
    """What :func:`sparktf.train.fit` returns."""

    model_dir: str
    start_step: int
    final_step: int
    metrics: dict[str, float]
    checkpoint: str | None
    export_path: str | None
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
    best_export_path: str | None = None  # RunConfig.export_best
    # one entry per restart: {"cause": ..., "resumed_from_step": ...} (RunConfig.max_restarts)
    restarts: list[dict[str, Any]] = field(default_factory=list)
    # spark input mode: rows fed to each training process (by node key), one number per process
    fed_rows: dict[str, int] | None = None
    mlflow_run_id: str | None = None  # RunConfig.mlflow_tracking_uri: the MLflow run

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def steps_for(epochs: float, rows: int, global_batch: int) -> int:
    """Global steps in ``epochs`` passes over ``rows`` rows at ``global_batch`` per step."""
    return max(1, math.floor(epochs * (rows // global_batch)))
