"""The run plan: everything a TensorFlow process needs to know, typed, built once on the driver.

:func:`plan_run` checks the three configs against the model and the dataset and derives what
every process must agree on (the global batch, steps per epoch, the target step, the
columns the model reads). The result, a frozen :class:`RunPlan`, travels pickled to every
TensorFlow process inside a :class:`ProcessSpec`, which adds how the process reaches the
driver and, on the executor, which TensorFlowOnSpark node it is. The driver's answer to a
process's hello is a :class:`Role`. All three are read by attribute: a misspelt setting
fails on the driver, before anything starts.

No TensorFlow here: the driver imports this module.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from typing import Any

from sparktf import storage
from sparktf.datasets import formats
from sparktf.datasets.formats import Field
from sparktf.train.config import RunConfig, ScalingConfig, TrainConfig
from sparktf.train.errors import ConfigError

__all__ = [
    "EVAL_METRICS",
    "eval_metrics",
    "ROLES",
    "DataInfo",
    "ProcessSpec",
    "Role",
    "RunPlan",
    "check_layout",
    "describe_data",
    "plan_frame",
    "plan_run",
    "steps_for",
]

ROLES = ("chief", "worker", "ps")


@dataclass(frozen=True)
class DataInfo:
    """What a run needs to know about its dataset split (read from the manifest once)."""

    dataset: str
    kind: str
    data: str  # the dataset directory (URI)
    split: str
    rows: int
    fields: tuple[Field, ...]  # the columns the model reads, in order
    files: dict[str, list[str]] = field(default_factory=dict)  # format -> files of the split
    parquet: str | None = None  # the split's Parquet directory, if converted
    text: dict | None = None  # the manifest's text section (PTB)
    frame: bool = False  # fed straight from a DataFrame (no dataset, no splits)

    @property
    def names(self) -> list[str]:
        """The names of the columns the model reads, in order."""
        return [f.name for f in self.fields]

    @property
    def seq_len(self) -> int:
        """Tokens per record of a language-model dataset (its first column's length)."""
        return int(self.fields[0].shape[0])


def describe_data(
    data: str, split: str, features: tuple[str, ...], manifest: dict | None = None
) -> DataInfo:
    """Reads the dataset's manifest: rows of ``split``, the ``features`` columns, its files."""
    manifest = manifest or formats.load_manifest(data)
    if split not in manifest["splits"]:
        raise ConfigError(
            f"dataset {data} has no split {split!r} (it has {', '.join(manifest['splits'])})"
        )
    fields = formats.manifest_fields(manifest)
    names = {f.name for f in fields}
    missing = [name for name in features if name not in names]
    if missing:
        raise ConfigError(
            f"dataset {data} ({manifest['dataset']}) has no column(s) "
            f"{missing} that the model needs (it has {sorted(names)})"
        )
    return DataInfo(
        dataset=manifest["dataset"],
        kind=manifest["kind"],
        data=data,
        split=split,
        rows=int(manifest["splits"][split]["records"]),
        fields=tuple(
            Field(f.name, f.dtype, tuple(f.shape) if f.shape else None)
            for f in fields
            if f.name in features
        ),
        files={fmt: formats.split_files(manifest, data, split, fmt) for fmt in manifest["formats"]},
        parquet=(
            storage.join(data, split, "parquet") if formats.PARQUET in manifest["formats"] else None
        ),
        text=manifest.get("text"),
    )


@dataclass(frozen=True)
class RunPlan:
    """The three configs plus what the driver derived from them and the dataset."""

    train: TrainConfig
    scaling: ScalingConfig
    run: RunConfig
    model_config: dict[str, Any]  # the registry overrides, completed (batch size, vocab)
    data: DataInfo
    global_batch: int
    steps_per_epoch: int
    target_steps: int
    feed_passes: int | None  # spark input mode: passes over the split (None: endless)
    log_level: str = "INFO"
    eval_data: DataInfo | None = None  # the evaluation split (None: no evaluation)
    # a model entered by sparktf.models.register in the driver: its registration, pickled
    # by value (sparktf.models.custom.plan_payload); each TensorFlow process installs it
    custom_model: bytes | None = None
    # sparktf.train.run: the user's (train_fn, config), pickled by value; each training
    # process runs it instead of the built-in loop (the other fields then describe the run
    # only: no model of the registry)
    function: bytes | None = None
    resume_checkpoint: str | None = None  # run(): the last checkpoint reported, if any
    reports_before: int = 0  # run(): the reports of earlier attempts (the numbering goes on)
    # spark input mode: where the attempt's feed starts (sparktf.train.feed.order.Position:
    # {"epoch", "cursor"}; None: the first epoch's start) and the global step it is at
    feed_start: dict[str, int] | None = None
    feed_start_step: int = 0
    attempt: int = 0  # 0, then one more after each event (sparktf.train.driver.attempts)
    # an attempt of an elastic run (its scaling has the attempt's workers, maybe min_workers
    # too), and the event that started this attempt (a restart, shrink or grow), if any
    elastic: bool = False
    event: dict[str, Any] | None = None

    def with_workers(self, n: int) -> RunPlan:
        """The plan of an elastic run's attempt with ``n`` workers: the same global batch,
        or with ``ScalingConfig.scale_batch`` the same batch per worker, the global batch and
        the learning rate scaled by ``n / num_workers`` (the step target stays)."""
        plan = dataclasses.replace(self, scaling=self.scaling.with_workers(n), elastic=True)
        if not self.scaling.scale_batch or n == self.scaling.num_workers:
            return plan
        global_batch = self.global_batch // self.scaling.num_workers * n
        config = {**self.model_config, "batch_size": global_batch}
        if config.get("learning_rate") is not None:
            config["learning_rate"] = float(config["learning_rate"]) * n / self.scaling.num_workers
        return dataclasses.replace(
            plan,
            global_batch=global_batch,
            model_config=config,
            steps_per_epoch=max(1, self.data.rows // global_batch),
        )

    @property
    def eval_every_steps(self) -> int:
        """Steps between evaluations: ``EvalConfig.every_steps``, else one epoch."""
        return self.run.evaluation.every_steps or self.steps_per_epoch

    @property
    def per_process_batch(self) -> int:
        """Rows one training process takes per step (ps: the chief reads whole batches)."""
        if self.scaling.strategy == "ps":
            return self.global_batch
        return self.global_batch // self.scaling.num_workers


def plan_run(train: TrainConfig, scaling: ScalingConfig, run: RunConfig) -> RunPlan:
    """Checks the configs against the model and the dataset; returns the run's plan.

    Raises :class:`~sparktf.train.errors.ConfigError` naming the setting (``Class.field``)
    that does not fit the model or the dataset; the dataset's manifest is read here
    (:func:`sparktf.datasets.formats.load_manifest` raises what storage raises)."""
    return _plan(train, scaling, run, None)[0]


def plan_frame(
    train: TrainConfig,
    scaling: ScalingConfig,
    run: RunConfig,
    df: Any,
    columns: dict[str, str] | None = None,
) -> tuple[RunPlan, Any]:
    """The plan of a run fed straight from the DataFrame ``df`` (``spark`` input mode, no
    dataset written), and the DataFrame of the columns its processes read.

    ``columns`` maps the model's inputs (``features``, ``label``, ``id``) to ``df``'s
    columns when they are named otherwise. The columns are checked first, in one Spark job
    over ``df`` (:func:`sparktf.datasets.tables.check_table`): a missing column, a type the
    model cannot read, a null, a label outside the classes or a row of another size raises
    :class:`~sparktf.datasets.tables.TableInputError` naming the column and the row."""
    plan, table = _plan(train, scaling, run, (df, dict(columns or {})))
    return plan, table.rows.select(*plan.data.names)


def _plan(train: TrainConfig, scaling: ScalingConfig, run: RunConfig, frame):
    """The plan, and the checked rows of ``frame`` (``(df, columns)``; None: the dataset of
    ``train.data``)."""
    from sparktf import models

    if storage.is_remote(run.model_dir):
        # A refusal of the model directory's store (a wrong key, no bucket, an endpoint that
        # does not answer) raises here, naming the store, before Spark reads anything.
        storage.exists(run.model_dir)

    overrides = dict(train.model_config)
    if train.batch_size:
        overrides["batch_size"] = int(train.batch_size)
    try:
        task = models.get_task(train.model, **overrides)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    if isinstance(task, models.LinearRegressionTask):
        raise ConfigError(
            f"{train.model} trains on its built-in data, not on a converted "
            "dataset: it has no distributed training job"
        )
    table = None
    if frame is None:
        manifest = formats.load_manifest(train.data)  # read once: train and eval splits
        fields = formats.manifest_fields(manifest)
    else:
        table = _frame_table(task, overrides, *frame)
        fields = list(table.fields)
        manifest = {
            "dataset": "the DataFrame",
            "schema": {"label": {"num_classes": table.num_classes}},
        }
    from_data = getattr(task, "data_overrides", None)  # a user's model: shapes from the data
    if from_data is not None:
        try:
            filled = from_data(fields, manifest)
            if filled:
                overrides.update(filled)
                task = models.get_task(train.model, **overrides)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
    if table is None:
        data = describe_data(train.data, train.split, task.features, manifest)
    else:
        data = DataInfo(
            dataset="dataframe",
            kind="table",
            data=train.data,
            split=train.split,
            rows=table.count,
            fields=table.fields,
            frame=True,
        )
    if task.kind == "language_model":
        vocab = (data.text or {}).get("vocab_size")
        if "vocab_size" not in overrides and vocab:
            overrides["vocab_size"] = int(vocab)
            task = models.get_task(train.model, **overrides)
        if task.seq_len != data.seq_len:
            raise ConfigError(
                f"{train.model} unrolls {task.num_steps} steps (sequences of "
                f"{task.seq_len} tokens) but {train.data} holds sequences of "
                f"{data.seq_len}: set num_steps={data.seq_len - 1} in "
                "TrainConfig.model_config or convert with a matching seq_len"
            )
    global_batch = int(task.batch_size)
    check_layout(train, scaling, data, global_batch)
    steps_per_epoch = max(1, data.rows // global_batch)
    target = _target_steps(train, task, data.rows, global_batch, steps_per_epoch)
    if task.config.get("lr_schedule") == "polynomial" and not task.config.get(
        "lr_decay_total_epochs"
    ):  # decay over this run's length
        overrides["lr_decay_total_epochs"] = target / steps_per_epoch
    plan = RunPlan(
        train=train,
        scaling=scaling,
        run=run,
        model_config=overrides,
        data=data,
        global_batch=global_batch,
        steps_per_epoch=steps_per_epoch,
        target_steps=target,
        feed_passes=math.ceil(train.epochs) if train.epochs and not train.steps else None,
        log_level=logging.getLevelName(logging.getLogger().level or logging.INFO),
        eval_data=_eval_data(train, run, task, manifest) if table is None else _no_eval(run),
        custom_model=models.custom.plan_payload(train.model),
    )
    return plan, table


def _frame_table(task, overrides: dict[str, Any], df, columns: dict[str, str]):
    """``df``'s columns for ``task``, checked (:mod:`sparktf.datasets.tables`)."""
    from sparktf.datasets.tables import check_inputs, check_table

    custom = hasattr(task, "data_overrides")  # a user's model (sparktf.models.custom)
    if not custom and task.kind != "classifier":
        raise ConfigError(
            f"{task.name} is a {task.kind}: a DataFrame feeds classifiers and a user's models "
            "(sparktf.models.register); convert the data for this model"
        )
    names = getattr(task, "input_names", None)
    unknown = sorted(set(columns) - {*task.features, "features", "id"})
    if unknown:
        raise ConfigError(
            f"columns: {unknown} are not inputs of {task.name} (it reads "
            f"{list(task.features)} and an optional id)"
        )
    classes = task.kind in ("classifier", "binary")
    num_classes = None
    if classes:
        try:  # the model's, else the largest label + 1 (a user's classifier)
            num_classes = int(task.num_classes)
        except (ValueError, KeyError):
            num_classes = None
    common = {
        "label_col": columns.get("label", "label"),
        "id_col": columns.get("id", "id"),
        "num_classes": num_classes,
        "labels": "classes" if classes else "values",
    }
    feature = task.features[0]
    outputs = getattr(task, "output_specs", None)
    if outputs:  # several outputs: a label column each, by its name
        wanted = names or (feature,)
        cols = {n: columns.get(n, columns.get("features", n) if not names else n) for n in wanted}
        cols.update({name: columns.get(name, name) for name in outputs})
        common.update(label_col=None, labels=None)
        return check_inputs(df, cols, **common)
    if names is not None:
        return check_inputs(df, {name: columns.get(name, name) for name in names}, **common)
    return check_table(
        df,
        input_col=columns.get("features", columns.get(feature, feature)),
        feature=feature,
        shape=_input_shape(task, overrides, custom),
        dtype=overrides.get("input_dtype") if custom else "uint8",
        **common,
    )


def _input_shape(task, overrides: dict[str, Any], custom: bool) -> tuple[int, ...] | None:
    """The per-row input shape the model fixes (None: a user's model takes the data's)."""
    shape = overrides.get("input_shape") if custom else getattr(task, "input_shape", None)
    return None if shape is None else tuple(int(d) for d in shape)


def _no_eval(run: RunConfig) -> None:
    """A DataFrame has no evaluation split: only ``EvalConfig.split`` auto or none fit."""
    if run.evaluation.split not in ("auto", "none") or run.evaluation.export_best:
        raise ConfigError(
            "EvalConfig.split and EvalConfig.export_best: a run fed from a DataFrame has no "
            "evaluation split; evaluate the export with sparktf.evaluate instead"
        )
    return None


# The evaluation metrics of each kind of model, and whether higher is better.
EVAL_METRICS = {
    "classifier": {"loss": False, "accuracy": True, "top5_accuracy": True},
    "language_model": {"loss": False, "perplexity": False},
    "gan": {"d_loss": False, "g_loss": False},
}
# Metric names of a user's model for which higher is better (any other: lower).
_HIGHER_IS_BETTER = ("accuracy", "binary_accuracy", "auc", "precision", "recall", "r2_score")


def eval_metrics(task) -> dict[str, bool]:
    """The metrics evaluation reports for ``task``, and whether higher is better."""
    if task.kind in EVAL_METRICS:
        return EVAL_METRICS[task.kind]
    return {"loss": False, **{m: m in _HIGHER_IS_BETTER for m in task.metric_names}}


def _eval_data(train: TrainConfig, run: RunConfig, task, manifest: dict) -> DataInfo | None:
    """The evaluation split's description: ``EvalConfig.split``, or for ``auto`` the
    dataset's ``valid`` split, else its ``test`` split (never the training split)."""
    splits = manifest["splits"]
    evaluation = run.evaluation
    if evaluation.split == "none":
        split = None
    elif evaluation.split == "auto":
        split = next((s for s in ("valid", "test") if s in splits and s != train.split), None)
    elif evaluation.split not in splits:
        raise ConfigError(
            f"EvalConfig.split {evaluation.split!r}: {train.data} has no such split "
            f"(it has {', '.join(splits)}; 'none' turns evaluation off)"
        )
    else:
        split = evaluation.split
    if evaluation.export_best:
        metrics = eval_metrics(task)
        if split is None:
            raise ConfigError("EvalConfig.export_best needs an evaluation split (EvalConfig.split)")
        if evaluation.export_best not in metrics:
            raise ConfigError(
                f"EvalConfig.export_best {evaluation.export_best!r}: {train.model} is evaluated "
                f"on {', '.join(metrics)}"
            )
    return describe_data(train.data, split, task.features, manifest) if split else None


def check_layout(
    train: TrainConfig, scaling: ScalingConfig, data: DataInfo, global_batch: int
) -> None:
    """Raises :class:`ConfigError` for a layout the data cannot run: a global batch that
    some number of all-reduce replicas (every size of an elastic run's range) cannot divide,
    an input mode without its files, a split smaller than a batch."""
    counts = [scaling.num_workers] if scaling.scale_batch else scaling.worker_counts
    for workers in counts if scaling.strategy == "allreduce" else ():
        replicas = workers * max(1, scaling.gpus_per_worker)
        if global_batch % replicas:
            elastic = f", with {workers} workers of the elastic run" if scaling.elastic else ""
            raise ConfigError(
                f"the global batch size {global_batch} (TrainConfig.batch_size, else the "
                f"model's) must be divisible by the {replicas} all-reduce replicas{elastic} "
                "(ScalingConfig.num_workers x ScalingConfig.gpus_per_worker)"
            )
    if train.input_mode == "spark" and not data.parquet and not data.frame:
        raise ConfigError(
            f"TrainConfig.input_mode 'spark' reads Parquet, but {train.data} has none: convert "
            "the dataset with parquet among its formats (the output_formats of "
            "sparktf.datasets.conversion.convert, the --format of the convert jobs)"
        )
    if train.input_mode == "files" and train.file_format not in data.files:
        raise ConfigError(
            f"TrainConfig.file_format {train.file_format!r}: {train.data} has no such files "
            f"(it has {', '.join(data.files)})"
        )
    if data.rows < global_batch:
        raise ConfigError(
            f"the {train.split} split has {data.rows} rows, fewer than one batch ({global_batch})"
        )


def steps_for(epochs: float, rows: int, global_batch: int) -> int:
    """Global steps in ``epochs`` passes over ``rows`` rows at ``global_batch`` per step."""
    return max(1, math.floor(epochs * (rows // global_batch)))


def _target_steps(
    train: TrainConfig, task, rows: int, global_batch: int, steps_per_epoch: int
) -> int:
    if train.steps and train.epochs:
        return min(int(train.steps), steps_for(train.epochs, rows, global_batch))
    if train.steps:
        return int(train.steps)
    if train.epochs:
        return steps_for(train.epochs, rows, global_batch)
    if task.max_steps:
        return int(task.max_steps)
    return int(task.epochs) * steps_per_epoch


@dataclass(frozen=True)
class ProcessSpec:
    """What one TensorFlow process is started with: the plan, the driver's control channel,
    and (filled in on the executor) which TensorFlowOnSpark node it belongs to."""

    plan: RunPlan
    control_url: str
    token: str
    driver_lost_s: float
    startup_timeout_s: float
    key: str = ""  # "executor-<id>" or "driver-ps-<i>"
    executor_id: int | None = None
    mgr_address: Any = None  # the executor's TFManager (spark input mode)
    mgr_authkey: bytes | None = None
    consume_only: bool = False  # bench/feed.py: read the feed, train nothing
    control_token: str = ""  # this process's own control token (``token`` is the run's)

    def for_node(self, key: str, **node: Any) -> ProcessSpec:
        """This spec for the node ``key``, with its executor's details ``node``."""
        return dataclasses.replace(self, key=key, **node)


@dataclass(frozen=True)
class Role:
    """The driver's answer to a process's hello: its place in the TensorFlow cluster."""

    key: str
    role: str  # chief | worker | ps
    index: int
    strategy: str
    num_workers: int  # training processes (all-reduce) or ps workers
    cluster: dict[str, list[str]]  # TF cluster spec: job -> addresses

    @property
    def name(self) -> str:
        """``role:index``, as logs and errors name the process."""
        return f"{self.role}:{self.index}"

    @property
    def rank(self) -> int:
        """Position among the all-reduce workers (the chief is 0)."""
        return 0 if self.role == "chief" else self.index + 1

    @property
    def is_chief(self) -> bool:
        return self.role == "chief"

    @property
    def trains(self) -> bool:
        """Runs the training loop (the chief; every worker under all-reduce)."""
        return self.is_chief or (self.strategy == "allreduce" and self.role == "worker")

    def to_dict(self) -> dict[str, Any]:
        """The role as plain data (the control channel's JSON)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Role:
        """The role that :meth:`to_dict` gave."""
        return cls(**{f.name: data[f.name] for f in dataclasses.fields(cls)})
