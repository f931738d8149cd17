"""What a training run is made of, as three typed configs (after Ray Train's split).

* :class:`TrainConfig` -- *what* to train: the model (a registry name plus config overrides),
  the data, how it reaches the TensorFlow processes, and for how long.
* :class:`ScalingConfig` -- *where and how many*: the distribution strategy, the number of
  workers and parameter servers, GPUs and threads per TensorFlow process.
* :class:`RunConfig` -- run-level policy: the model directory (checkpoints, TensorBoard
  events, exports; local or ``hdfs://``) and four groups: :class:`CheckpointConfig` (how
  often, how many kept, the export), :class:`FailureConfig` (the time limits that bound a
  failure or a stalled feed, restarts), :class:`EvalConfig` (evaluation during training)
  and :class:`TrackingConfig` (summaries, progress, MLflow).

Everything is plain data (JSON-able with :func:`dataclasses.asdict`), validated on
construction; the driver's :class:`~sparktf.train.plan.RunPlan` carries the three unchanged
to every TensorFlow process.

Each field carries its documentation in its metadata (``help``, appended to the class
docstring) with how the training jobs show it (``group``, ``flag``, ...): the jobs' flags
are generated from it (:mod:`sparktf.jobs.flags`; the machinery is
:mod:`sparktf.train.settings`). A :class:`~sparktf.train.errors.ConfigError` names the field
as ``Class.field`` (``EvalConfig.split``); the jobs print the flag in its place.

What a run returns is :class:`sparktf.train.result.TrainResult`; its errors are
:mod:`sparktf.train.errors`. All of them are exported by :mod:`sparktf.train`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sparktf.train.errors import ConfigError
from sparktf.train.settings import (
    check_choices,
    documented,
    positive,
    setting,
    worker_pair,
    worker_range,
)

__all__ = [
    "FILE_FORMATS",
    "INPUT_MODES",
    "STRATEGIES",
    "CheckpointConfig",
    "EvalConfig",
    "FailureConfig",
    "RunConfig",
    "ScalingConfig",
    "TrackingConfig",
    "TrainConfig",
]

STRATEGIES = ("allreduce", "ps")
INPUT_MODES = ("spark", "files")
FILE_FORMATS = ("tfrecord", "parquet")


@documented
@dataclass(frozen=True)
class ScalingConfig:
    """How many TensorFlow processes, in which roles, with which devices.

    ``num_workers`` means one thing under both strategies: the processes that compute
    training steps. Under all-reduce the chief is one of them; under ps the chief coordinates
    and computes no step, so it is not counted (as the parameter servers are not).

    ``strategy``:

    * ``"allreduce"`` -- ``MultiWorkerMirroredStrategy``, synchronous data parallelism
      (sync replicas). ``num_workers`` processes train, one of them the chief; each runs on
      its own Spark executor.
    * ``"ps"`` -- TF2 ``ParameterServerStrategy``, asynchronous updates (ps/worker). A chief
      coordinates (it also reads the input and hands batches to the workers),
      ``num_workers`` workers compute, ``num_ps`` parameter servers hold the variables. The
      chief and the workers each take one Spark executor; the parameter servers take one
      executor each, or run on the driver with ``ps_on_driver``.

    ``num_executors`` is the number of task slots the run's TensorFlow processes take (one
    barrier task each, on any executors with free slots).

    **Elastic runs.** ``num_workers=(min, max)`` (``--num-workers MIN:MAX``; or
    ``min_workers``) lets the number of workers change while the run goes on: it starts with
    as many as the free task slots allow, up to ``max`` (at least ``min``, else it waits,
    ``FailureConfig.below_min_timeout_s``); when a process or its executor is lost it starts
    again from the latest checkpoint with the workers that can be placed then; when slots
    stay free for ``grow_after_s`` it grows back towards ``max`` at its next checkpoint (a
    planned restart: checkpoint first, no step lost). The global batch stays the same (each
    worker's share changes), so it must divide by every worker count in ``min..max``; with
    ``scale_batch`` each worker keeps its share and the global batch and the learning rate
    scale with the workers.
    ``num_workers`` then reads ``max``. See docs/training.md "Elastic runs".

    Raises :class:`ConfigError` for a setting that cannot work.
    """

    strategy: str = setting(
        "allreduce",
        help="allreduce: synchronous MultiWorkerMirroredStrategy; ps: asynchronous "
        "ParameterServerStrategy (chief coordinates, ps hold the variables)",
        group="strategy",
        choices=STRATEGIES,
    )
    num_workers: int = setting(
        2,
        help="processes that compute training steps (allreduce: the chief is one of them; ps: "
        "the chief only coordinates and is not counted); MIN:MAX (a (min, max) pair in "
        "Python) for an elastic run",
        group="strategy",
        metavar="N|MIN:MAX",
        parse=worker_range,
    )
    num_ps: int = setting(1, help="parameter servers (ScalingConfig.strategy ps)", group="strategy")
    min_workers: int | None = setting(
        None,
        help="elastic runs: the fewest workers the run goes on with (ScalingConfig.num_workers "
        "is then the most); --num-workers MIN:MAX sets both; unset: exactly num_workers",
        group="strategy",
    )
    scale_batch: bool = setting(
        False,
        help="elastic runs: keep each worker's batch (TrainConfig.batch_size at "
        "ScalingConfig.num_workers, divided by it) and scale the global batch and the "
        "learning rate linearly with the workers, instead of keeping the global batch",
        group="strategy",
    )
    grow_after_s: float = setting(
        30.0,
        help="elastic runs: seconds task slots must stay free before the run grows back "
        "towards ScalingConfig.num_workers, at its next checkpoint",
        group="strategy",
        flag="--grow-after",
    )
    ps_on_driver: bool = setting(
        False,
        help="run the parameter servers on the driver instead of on executors",
        group="strategy",
    )
    gpus_per_worker: int = setting(
        0,
        help="GPUs per TensorFlow process, requested through Spark's resource "
        "scheduling (conf/spark/gpu_discovery.sh); 0: CPU",
        group="strategy",
    )
    threads_per_worker: int = setting(
        0,
        help="TensorFlow intra-op threads per process (0: TensorFlow's default)",
        group="strategy",
    )

    def __post_init__(self) -> None:
        check_choices(self)
        if isinstance(self.num_workers, (tuple, list)):
            low, high = worker_pair(self.num_workers)
            if self.min_workers is not None and self.min_workers != low:
                raise ConfigError(
                    f"ScalingConfig.min_workers {self.min_workers} and the range "
                    f"{low}:{high} of ScalingConfig.num_workers disagree; give one of them"
                )
            object.__setattr__(self, "num_workers", high)
            object.__setattr__(self, "min_workers", low)
        positive(self, "num_workers")
        positive(self, "min_workers", allow_none=True)
        if self.min_workers is not None and self.min_workers > self.num_workers:
            raise ConfigError(
                f"ScalingConfig.min_workers ({self.min_workers}) must not exceed "
                f"ScalingConfig.num_workers ({self.num_workers})"
            )
        positive(self, "grow_after_s", allow_zero=True)
        if self.strategy == "ps":
            positive(self, "num_ps")
        positive(self, "gpus_per_worker", allow_zero=True)
        positive(self, "threads_per_worker", allow_zero=True)

    @property
    def elastic(self) -> bool:
        """Whether the number of workers may change during the run."""
        return self.min_workers is not None and self.min_workers < self.num_workers

    @property
    def worker_counts(self) -> range:
        """Every number of workers the run may have (one number unless elastic)."""
        low = self.num_workers if self.min_workers is None else self.min_workers
        return range(low, self.num_workers + 1)

    @property
    def other_processes(self) -> int:
        """Task slots the run takes besides its workers (ps: the chief, and the parameter
        servers unless they run on the driver)."""
        return self.num_executors - self.num_workers

    def with_workers(self, n: int) -> ScalingConfig:
        """This layout with ``n`` workers (an elastic run's attempt), the range kept."""
        low = self.num_workers if self.min_workers is None else self.min_workers
        return dataclasses.replace(self, num_workers=n, min_workers=min(low, n))

    @property
    def num_executors(self) -> int:
        """Spark executors the TensorFlow cluster occupies (one TF process each)."""
        if self.strategy == "allreduce":
            return self.num_workers
        return 1 + self.num_workers + (0 if self.ps_on_driver else self.num_ps)

    @property
    def num_ps_tasks(self) -> int:
        """Parameter-server processes of the run (0 under all-reduce)."""
        return self.num_ps if self.strategy == "ps" else 0

    def describe(self) -> str:
        """The layout in words, for logs."""
        if self.strategy == "allreduce":
            return f"allreduce: {self.num_workers} workers (worker 0 is the chief)"
        where = "on the driver" if self.ps_on_driver else "on executors"
        return f"ps: chief (coordinator) + {self.num_workers} workers + {self.num_ps} ps ({where})"


@documented
@dataclass(frozen=True)
class CheckpointConfig:
    """Checkpoints and exports in the model directory (``RunConfig.checkpoint``).

    A checkpoint is written every ``every_steps`` and at the end, in
    ``MODEL_DIR/checkpoints/``; a rerun with the same model directory resumes from the
    latest. With ``export`` the final weights are also written as a SavedModel to
    ``MODEL_DIR/export/<global step>/``.

    Raises :class:`ConfigError` for a setting that cannot work.
    """

    every_steps: int = setting(
        500, help="steps between checkpoints", group="checkpoints", flag="--checkpoint-every"
    )
    keep: int = setting(
        3,
        help="newest checkpoints kept in the model directory (across resumes)",
        group="checkpoints",
        flag="--keep-checkpoints",
    )
    export: bool = setting(
        True,
        help="write the SavedModel export at the end",
        group="checkpoints",
        flag="--no-export",
        flag_help="skip the SavedModel export at the end",
    )

    def __post_init__(self) -> None:
        positive(self, "every_steps")
        positive(self, "keep")


@documented
@dataclass(frozen=True)
class FailureConfig:
    """How a run fails, and how it recovers (``RunConfig.failure``).

    ``failure_timeout_s`` bounds the time from a failure in any TensorFlow process (an
    exception, a crash, a lost executor, a process that stops responding) to the end of the
    run with an error; ``startup_timeout_s`` bounds bringing the cluster up, from the start
    of the run to the chief's first step; ``stall_timeout_s`` bounds the time without
    global-step progress after that (a stuck all-reduce collective included), so a process
    that still heart-beats but makes no progress fails the run; ``feed_timeout_s`` is how
    long the ``spark`` input mode waits for a TensorFlow process to take more rows (feeder
    side) or for rows to arrive (TensorFlow side) before it fails.

    ``max_restarts``: when a TensorFlow process, its executor or a Spark job of the run
    fails, the driver takes the TensorFlow cluster down and starts it again from the latest
    checkpoint, up to this many times (0: the first failure ends the run). At most one
    checkpoint interval of work is lost per restart. An elastic run
    (``ScalingConfig.min_workers``) that loses a process starts again with the workers that
    can be placed then (as many as before when the executor came straight back): every
    event of an elastic run, a restart included, counts against ``max_resizes``, not
    ``max_restarts``; below ``min_workers`` it waits ``below_min_timeout_s`` for slots
    (:mod:`sparktf.train.driver.attempts`).

    Raises :class:`ConfigError` for a setting that cannot work.
    """

    max_restarts: int = setting(
        0,
        help="times the TensorFlow cluster is started again from the latest checkpoint after a "
        "failure (a lost process or executor) before the run fails (a run of a fixed size; an "
        "elastic run counts its restarts in max_resizes)",
        group="failure",
    )
    max_resizes: int = setting(
        10,
        help="elastic runs: events (a restart, a shrink after a lost worker, a grow when slots "
        "are back) before the run fails",
        group="failure",
    )
    below_min_timeout_s: float = setting(
        120.0,
        help="elastic runs: seconds the run waits for task slots for ScalingConfig.min_workers "
        "(at the start, after a loss) before it fails, naming what happened",
        group="failure",
        flag="--below-min-timeout",
    )
    failure_timeout_s: float = setting(
        120.0,
        help="bound in seconds from a failure in any TensorFlow process to the end of the run",
        group="failure",
        flag="--failure-timeout",
    )
    startup_timeout_s: float = setting(
        300.0,
        help="seconds from the start of the run to the first training step before it fails",
        group="failure",
        flag="--startup-timeout",
    )
    stall_timeout_s: float = setting(
        300.0,
        help="seconds without global-step progress before the run fails, naming the processes "
        "that stopped advancing (a stuck all-reduce collective included)",
        group="failure",
        flag="--stall-timeout",
    )
    feed_timeout_s: float = setting(
        300.0,
        help="seconds the spark input mode waits for rows to move before failing",
        group="failure",
        flag="--feed-timeout",
    )

    def __post_init__(self) -> None:
        positive(self, "max_restarts", allow_zero=True)
        positive(self, "max_resizes", allow_zero=True)
        timeouts = ("failure_timeout_s", "startup_timeout_s", "stall_timeout_s", "feed_timeout_s")
        for name in ("below_min_timeout_s", *timeouts):
            positive(self, name)

    @property
    def heartbeat_timeout_s(self) -> float:
        """Silence after which the driver declares a TensorFlow process dead."""
        return max(5.0, min(60.0, self.failure_timeout_s / 2))

    @property
    def cleanup_timeout_s(self) -> float:
        """Time left to take the run down once a failure is known: detection (at most
        ``heartbeat_timeout_s``) plus clean-up stay within ``failure_timeout_s``."""
        return max(3.0, min(30.0, self.failure_timeout_s - self.heartbeat_timeout_s - 3.0))


@documented
@dataclass(frozen=True)
class EvalConfig:
    """Evaluation during training (``RunConfig.evaluation``).

    The chief evaluates the weights of every ``every_steps``-th step (0: once per epoch)
    and of the final step on the dataset's ``split``: ``"auto"`` takes ``valid`` when the
    dataset has it, else ``test``; ``"none"`` turns evaluation off. With ``export_best``
    (a metric the model is evaluated on) the export of the best evaluation so far is kept
    in ``MODEL_DIR/export_best/<step>/``.

    Raises :class:`ConfigError` for a setting that cannot work.
    """

    split: str = setting(
        "auto",
        help="split evaluated during training: 'auto' (valid if the dataset has it, else "
        "test), a split name, or 'none'",
        group="evaluation",
        flag="--eval-split",
    )
    every_steps: int = setting(
        0,
        help="steps between evaluations (0: once per epoch); always at the end",
        group="evaluation",
        flag="--eval-every",
    )
    export_best: str | None = setting(
        None,
        help="a metric: also keep the export of the best evaluation so far in "
        "MODEL_DIR/export_best/ (e.g. accuracy, top5_accuracy, perplexity, loss)",
        group="evaluation",
        metavar="METRIC",
    )

    def __post_init__(self) -> None:
        if not isinstance(self.split, str) or not self.split:
            raise ConfigError(f"EvalConfig.split must be a split name, got {self.split!r}")
        positive(self, "every_steps", allow_zero=True)


@documented
@dataclass(frozen=True)
class TrackingConfig:
    """What the run reports, and where (``RunConfig.tracking``).

    TensorBoard events in ``MODEL_DIR/events/train`` (scalars every ``summary_every_steps``,
    weight histograms every ``histogram_every_steps``), copied to an ``hdfs://`` model
    directory every ``sync_every_s``; a progress line on the driver every
    ``progress_every_s``. Experiment tracking (optional, the ``mlflow`` extra): with
    ``mlflow_tracking_uri`` the driver records the run in the MLflow experiment
    ``mlflow_experiment`` -- parameters, training metrics and evaluations with their steps,
    the export as an artifact (see :mod:`sparktf.train.driver.tracking`).

    Raises :class:`ConfigError` for a setting that cannot work.
    """

    summary_every_steps: int = setting(
        20, help="steps between scalar summaries", group="tracking", flag="--summary-every"
    )
    histogram_every_steps: int = setting(
        0,
        help="steps between weight histograms in the TensorBoard events (0: with every checkpoint)",
        group="tracking",
        flag="--histogram-every",
    )
    progress_every_s: float = setting(
        5.0,
        help="seconds between progress lines on the driver",
        group="tracking",
        flag="--progress-every",
    )
    sync_every_s: float = setting(
        60.0,
        help="seconds between copies of the TensorBoard events to an hdfs:// model directory "
        "(and at the end)",
        group="tracking",
        flag="--sync-every",
    )
    mlflow_tracking_uri: str | None = setting(
        None,
        help="MLflow tracking URI: a tracking server (http(s)://...; credentials through "
        "MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME/PASSWORD, not in the URI) or a "
        "local file store (a path or file:// URI; MLflow 3 wants MLFLOW_ALLOW_FILE_STORE=true "
        "for it); unset: no tracking",
        group="tracking",
        metavar="URI",
    )
    mlflow_experiment: str = setting(
        "sparktf",
        help="MLflow experiment of the run (created when missing)",
        group="tracking",
        metavar="NAME",
    )

    def __post_init__(self) -> None:
        if self.mlflow_tracking_uri is not None and (
            not isinstance(self.mlflow_tracking_uri, str) or not self.mlflow_tracking_uri.strip()
        ):
            raise ConfigError(
                "TrackingConfig.mlflow_tracking_uri must be an MLflow tracking URI (http(s)://, "
                f"file://, a local path), got {self.mlflow_tracking_uri!r}"
            )
        if not isinstance(self.mlflow_experiment, str) or not self.mlflow_experiment.strip():
            raise ConfigError(
                "TrackingConfig.mlflow_experiment must be an experiment name, got "
                f"{self.mlflow_experiment!r}"
            )
        for name in ("summary_every_steps", "progress_every_s", "sync_every_s"):
            positive(self, name)
        positive(self, "histogram_every_steps", allow_zero=True)


@documented
@dataclass(frozen=True)
class RunConfig:
    """Where results go and the policies of one run, grouped (after Ray Train's RunConfig).

    ``model_dir`` (local path or ``hdfs://``) receives ``checkpoints/``, ``events/train``
    (TensorBoard), ``export/<global step>/`` (SavedModel) and ``sparktf_train.json`` (the
    run's record: model, config, steps, exports, evaluations). The policies:
    ``checkpoint`` (:class:`CheckpointConfig`: how often, how many kept, the export),
    ``failure`` (:class:`FailureConfig`: time limits and restarts),
    ``evaluation`` (:class:`EvalConfig`: which split, how often, the best export) and
    ``tracking`` (:class:`TrackingConfig`: summaries, progress, MLflow)::

        RunConfig(
            model_dir="hdfs://nn:8020/models/resnet20",
            checkpoint=CheckpointConfig(every_steps=1000),
            failure=FailureConfig(max_restarts=2),
            evaluation=EvalConfig(split="test", export_best="accuracy"),
        )

    Each group may also be given as a dict of its fields
    (``failure={"max_restarts": 2}``); :meth:`from_dict` reads the whole config back from
    :func:`dataclasses.asdict`'s form.

    Raises :class:`ConfigError` for a setting that cannot work (naming it as
    ``Group.field``, e.g. ``FailureConfig.stall_timeout_s``).
    """

    model_dir: str = setting(
        help="checkpoints, TensorBoard events and exports (local or hdfs://); a "
        "rerun with the same directory resumes",
        group="checkpoints",
    )
    checkpoint: CheckpointConfig = setting(
        help="checkpoints and the export (CheckpointConfig)",
        group="checkpoints",
        factory=CheckpointConfig,
    )
    failure: FailureConfig = setting(
        help="time limits and restarts (FailureConfig)", group="failure", factory=FailureConfig
    )
    evaluation: EvalConfig = setting(
        help="evaluation during training (EvalConfig)", group="evaluation", factory=EvalConfig
    )
    tracking: TrackingConfig = setting(
        help="summaries, progress and MLflow tracking (TrackingConfig)",
        group="tracking",
        factory=TrackingConfig,
    )

    def __post_init__(self) -> None:
        if not self.model_dir:
            raise ConfigError("RunConfig.model_dir is required (a local path or hdfs:// URI)")
        for f in dataclasses.fields(self)[1:]:
            value, kind = getattr(self, f.name), f.default_factory
            if isinstance(value, Mapping):
                try:
                    value = kind(**value)
                except TypeError as exc:
                    raise ConfigError(f"RunConfig.{f.name}: {exc}") from None
                object.__setattr__(self, f.name, value)  # frozen: set once, while constructed
            elif not isinstance(value, kind):
                raise ConfigError(
                    f"RunConfig.{f.name} must be a {kind.__name__} (or a dict of its fields), "
                    f"got {value!r}"
                )

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> RunConfig:
        """The config that :func:`dataclasses.asdict` gave (its groups as dicts), or any dict
        of fields. Raises :class:`ConfigError` for unknown keys or values that cannot work."""
        try:
            return cls(**data)
        except TypeError as exc:
            raise ConfigError(f"RunConfig: {exc}") from None


@documented
@dataclass(frozen=True)
class TrainConfig:
    """What to train on which data, for how long.

    ``model`` is a registry name (``sparktf.models.list_models()``) and ``model_config``
    overrides entries of its config. ``data`` is a converted dataset directory (local or
    ``hdfs://``), ``split`` the split to train on; or, in Python, a DataFrame fed to the
    TensorFlow processes as it is (``spark`` input mode, no copy written; see
    :func:`sparktf.train.fit`).

    ``input_mode``: ``"spark"`` reads the split's Parquet as a DataFrame and feeds its rows
    to the TensorFlow processes (see :mod:`sparktf.train.feed.chunks`); ``"files"`` has each
    TensorFlow process read its own shard of the split's files (``file_format``).

    Fine-tuning: ``warm_start_from`` (a checkpoint or SavedModel export of another run,
    local or ``hdfs://``) initialises the model when ``model_dir`` has no checkpoint of its
    own (a resume wins), except the variables whose path starts with one of
    ``warm_start_exclude_scopes``; with ``trainable_scopes`` only those variables train.

    Length: ``steps`` (global steps, counted across resumes) and/or ``epochs`` (passes over
    the split); training stops at whichever comes first. Neither: the model's own
    ``max_steps`` / ``epochs``. ``batch_size`` is the global batch (default: the model's);
    every step takes exactly that many rows (a short remainder at the end of the data is
    dropped).

    Raises :class:`ConfigError` for a setting that cannot work.
    """

    model: str = setting(
        help="model name from the registry (sparktf.models.list_models()), or a user's Keras "
        "build function as package.module:build (importable on the executors; see "
        "sparktf.models.custom)",
        group="model",
    )
    data: str = setting(
        help="converted dataset directory (local or hdfs://)",
        group="data",
        flag_help="converted dataset directory (local or hdfs://), or 'demo' for a small "
        "synthetic one prepared under .local/demo",
    )
    model_config: dict[str, Any] = setting(
        help='overrides of the model\'s config, e.g. {"hidden_units": 64}',
        group="model",
        factory=dict,
        flag_help="JSON object of model config overrides, e.g. '{\"hidden_units\": 64}'",
    )
    split: str = setting("train", help="split to train on", group="data")
    input_mode: str = setting(
        "files",
        help="spark: Parquet rows fed by Spark tasks; files: each worker reads its "
        "own shard of the files",
        group="input",
        choices=INPUT_MODES,
    )
    file_format: str = setting(
        "tfrecord",
        help="files read with TrainConfig.input_mode files",
        group="input",
        choices=FILE_FORMATS,
    )
    epochs: float | None = setting(None, help="passes over the split", group="data")
    steps: int | None = setting(
        None,
        help="global steps (counted across resumes); with TrainConfig.epochs: whichever first",
        group="data",
    )
    batch_size: int | None = setting(
        None, help="global batch size (default: the model's)", group="data"
    )
    shuffle: bool = setting(
        True,
        help="shuffle the files and rows read",
        group="input",
        flag="--no-shuffle",
        flag_help="keep file order",
    )
    seed: int = setting(0, help="shuffle seed", group="input")
    warm_start_from: str | None = setting(
        None,
        help="start from the weights of another run (local or hdfs://): a checkpoint prefix "
        "(MODEL_DIR/checkpoints/ckpt-N), a checkpoints or model directory (its latest "
        "checkpoint), or a SavedModel export (MODEL_DIR/export/<step>, or MODEL_DIR/export "
        "for the latest); ignored when RunConfig.model_dir already has a checkpoint (resume "
        "wins)",
        group="model",
        former="--checkpoint-path",
    )
    warm_start_exclude_scopes: tuple[str, ...] = setting(
        (),
        help="layer-name prefixes not restored from TrainConfig.warm_start_from (they keep "
        "their initialisation), e.g. 'logits' to fine-tune to another number of classes",
        flag_help="comma-separated layer-name prefixes not restored from TrainConfig."
        "warm_start_from (they keep their initialisation), e.g. 'logits' to fine-tune to "
        "another number of classes",
        group="model",
        metavar="SCOPES",
        former="--checkpoint-exclude-scopes",
    )
    trainable_scopes: tuple[str, ...] = setting(
        (),
        help="layer-name prefixes: only these variables train, every other one stays "
        "bit-identical (default: all train)",
        flag_help="comma-separated layer-name prefixes: only these variables train, every "
        "other one stays bit-identical (default: all train)",
        group="model",
        metavar="SCOPES",
    )

    def __post_init__(self) -> None:
        if not self.model:
            raise ConfigError("TrainConfig.model is required")
        if self.data is None or (isinstance(self.data, str) and not self.data):
            raise ConfigError(
                "TrainConfig.data is required (a converted dataset directory or a DataFrame)"
            )
        check_choices(self)
        positive(self, "epochs", allow_none=True)
        positive(self, "steps", allow_none=True)
        positive(self, "batch_size", allow_none=True)
