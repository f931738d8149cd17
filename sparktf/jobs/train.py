"""What the training jobs in ``jobs/`` share: flags -> configs -> :func:`sparktf.train.fit`.

Every ``jobs/train*.py`` is ``main(argv)`` of this module with its own config section
(``conf/jobs/<section>.json`` supplies defaults; flags override them). ``--data demo``
prepares a small synthetic dataset under ``.local/demo`` first (see
:mod:`sparktf.datasets.demo`), so a job runs with no arguments at all.

The flags of the config fields are generated from the configs' metadata
(:mod:`sparktf.jobs.flags`); this module adds the optimizer options (entries of the model's
config), ``--no-augment`` and ``--result-json``. A :class:`~sparktf.train.ConfigError`
names a config field (``EvalConfig.split``); the job prints it with the flag
(``--eval-split``), and so for a :class:`~sparktf.train.TrainingError` that names one.

Exit codes: 0 trained and exported; 1 the run failed (the first error is logged); 2 the
command line or the input cannot work.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import re
from collections.abc import Sequence
from typing import Any

from sparktf import cli
from sparktf.datasets import demo
from sparktf.jobs import flags
from sparktf.placement import PlacementError
from sparktf.remote import remote_url
from sparktf.spark import (
    executor_sizing,
    executor_slots,
    is_connect,
    job_session,
    launched_by_spark_submit,
    session_conf,
)
from sparktf.train import (
    ConfigError,
    RunConfig,
    ScalingConfig,
    TrainConfig,
    TrainingError,
    fit,
    gpu_spark_conf,
)
from sparktf.train.driver import tracking

__all__ = [
    "CONFIGS",
    "configs",
    "executors_needed",
    "finetune_and_augment_options",
    "main",
    "optimizer_overrides",
    "parser",
    "scaling_config",
    "session_overrides",
    "for_command_line",
    "usage_error",
]

log = logging.getLogger("sparktf.jobs.train")

# The configs a training job builds from its flags.
CONFIGS = flags.CONFIGS


# The optimizer, learning-rate, regularisation and precision options: flag -> (type,
# choices, help). They are not config fields: they become entries of the model's config
# (TrainConfig.model_config), see optimizer_overrides.
_OPTIMIZER_OPTIONS: dict[str, tuple[Any, tuple[str, ...] | None, str]] = {
    "--optimizer": (
        str,
        ("adadelta", "adagrad", "adam", "ftrl", "momentum", "rmsprop", "sgd"),
        "optimizer (momentum: SGD with momentum); another than the model's starts from "
        "Keras's defaults for it plus the options below",
    ),
    "--learning-rate": (float, None, "initial learning rate"),
    "--opt-epsilon": (float, None, "epsilon of adadelta, adagrad, adam, rmsprop"),
    "--momentum": (float, None, "momentum of the momentum optimizer (0.9 when unset) or of sgd"),
    "--nesterov": (bool, None, "Nesterov momentum (momentum, sgd)"),
    "--rmsprop-momentum": (float, None, "momentum of rmsprop"),
    "--rmsprop-decay": (float, None, "decay (rho) of rmsprop"),
    "--adam-beta1": (float, None, "beta_1 of adam"),
    "--adam-beta2": (float, None, "beta_2 of adam"),
    "--adadelta-rho": (float, None, "rho of adadelta"),
    "--adagrad-initial-accumulator-value": (float, None, "initial accumulator value of adagrad"),
    "--ftrl-learning-rate-power": (float, None, "learning rate power of ftrl"),
    "--ftrl-initial-accumulator-value": (float, None, "initial accumulator value of ftrl"),
    "--ftrl-l1": (float, None, "L1 regularisation of ftrl"),
    "--ftrl-l2": (float, None, "L2 regularisation of ftrl"),
    "--learning-rate-decay-type": (
        str,
        ("fixed", "exponential", "polynomial", "piecewise"),
        "fixed: constant; exponential: x decay factor every --num-epochs-per-decay "
        "epochs (staircase); polynomial: linear down to --end-learning-rate over "
        "--num-epochs-per-decay epochs (default: the run's --epochs, else the model's); "
        "piecewise: x decay factor at each of --lr-boundaries-epochs",
    ),
    "--num-epochs-per-decay": (
        float,
        None,
        "epochs per exponential decay step, or the polynomial decay's length",
    ),
    "--learning-rate-decay-factor": (
        float,
        None,
        "factor of each exponential or piecewise decay step",
    ),
    "--end-learning-rate": (float, None, "learning rate the polynomial decay ends at"),
    "--lr-boundaries-epochs": (
        str,
        None,
        "epochs after which the piecewise schedule multiplies the rate by the factor",
    ),
    "--label-smoothing": (
        float,
        None,
        "classifiers: train against (1 - s) * one_hot + s / num_classes",
    ),
    "--weight-decay": (
        float,
        None,
        "classifiers: L2 weight decay on every kernel (weight_decay * l2_loss(w))",
    ),
    "--moving-average-decay": (
        float,
        None,
        "keep an exponential moving average of the weights with this decay (in the "
        "checkpoints; used for evaluation and the export); 0: none",
    ),
    "--precision": (
        str,
        ("fp32", "bf16", "fp16"),
        "compute precision (Keras mixed precision; fp16 with loss scaling); variables "
        "and the export stay float32",
    ),
}


def parser(description: str, section: str, default_model: str | None) -> argparse.ArgumentParser:
    """The training jobs' parser: the general flags (:func:`sparktf.cli.parser`), one flag
    per config field (:func:`sparktf.jobs.flags.add_flags`), the optimizer options, and the
    job's own (``--no-augment``, ``--result-json``); ``--help`` is grouped by
    :data:`sparktf.jobs.flags.GROUPS`. ``default_model`` is ``--model``'s default."""
    p = cli.parser(description, config_section=section)
    p.add_argument(
        "--result-json",
        default=None,
        help="write the result (final step, metrics, paths) as JSON to this local file "
        "instead of printing it",
    )
    groups = flags.add_flags(p, *CONFIGS)
    p.set_defaults(model=default_model)
    groups["model"].add_argument(
        "--no-augment",
        dest="augment",
        action="store_false",
        help="train image models that augment by default (resnet*: 4-pixel padding, random "
        "crop, random flip) on the images as they are",
    )
    for flag, (kind, choices, text) in _OPTIMIZER_OPTIONS.items():
        if kind is bool:
            groups["optimizer"].add_argument(flag, action="store_true", default=None, help=text)
            continue
        metavar = "E1,E2,..." if flag == "--lr-boundaries-epochs" else None
        groups["optimizer"].add_argument(
            flag, type=kind, choices=choices, default=None, metavar=metavar, help=text
        )
    return p


def for_command_line(text: str) -> str:
    """A message as a command-line user reads it: the config fields it names
    (``EvalConfig.split``) become their flags (``--eval-split``)."""
    return flags.for_command_line(text, *CONFIGS)


def usage_error(exc: Exception) -> cli.UsageError:
    """``exc`` (a :class:`ConfigError`, ...) as a command-line error: the config fields its
    message names become their flags (:func:`sparktf.jobs.flags.for_command_line`)."""
    return cli.UsageError(for_command_line(str(exc)))


def scaling_config(args: argparse.Namespace) -> ScalingConfig:
    """The :class:`ScalingConfig` of the parsed flags. Raises :class:`ConfigError`."""
    return flags.build(ScalingConfig, args)


def configs(args: argparse.Namespace) -> tuple[TrainConfig, ScalingConfig, RunConfig]:
    """The three configs of the parsed flags: each field from its flag, the model's config
    from ``--model-config`` completed by the optimizer, fine-tuning and augmentation flags.
    Raises :class:`sparktf.cli.UsageError` (naming flags) for flags that cannot work."""
    try:
        train, scaling, run = (flags.build(cls, args) for cls in CONFIGS)
        if run.tracking.mlflow_tracking_uri:
            tracking.require_mlflow()  # the extra is missing: say so before anything else
    except ConfigError as exc:
        raise usage_error(exc) from None
    tuning = finetune_and_augment_options(args)
    # --model-config first; the specific flags (optimizer, schedule, augmentation) win.
    model_config = {
        **train.model_config,
        **optimizer_overrides(args),
        **tuning["model_config"],
    }
    train = dataclasses.replace(train, model_config=model_config, **tuning["train"])
    return train, scaling, run


def _fitted(master: str, conf: dict[str, str], n: int) -> dict[str, str]:
    """Executors sized to the cluster from plain Python (``sparktf.spark.executor_sizing``);
    under spark-submit its sizes stand (``sparktf submit`` fitted them; a run that cannot be
    placed fails within seconds at the executors' registration)."""
    if launched_by_spark_submit():
        return {}
    try:
        return executor_sizing(master, conf, n)
    except PlacementError as exc:
        raise cli.UsageError(f"the run cannot be placed: {exc}") from None


def session_overrides(conf: dict[str, str], scaling) -> dict[str, str]:
    """Spark settings the run needs: GPUs, and executors sized to the run (as many as give
    each TensorFlow process a task slot: one per process unless an executor has several
    slots, ``spark.executor.cores`` / ``spark.task.cpus``): a local-cluster master's count, a
    standalone master's ``spark.cores.max``, YARN's and Kubernetes'
    ``spark.executor.instances``; standalone and YARN executors that do not
    fit the cluster shrunk to fit (what ``sparktf submit`` does too)."""
    overrides = dict(gpu_spark_conf(scaling))
    master = conf.get("spark.master", "")
    n = scaling.num_executors
    match = re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*(\d+)\]", master)
    if match:  # as many executors as hold n processes, several each when they have the slots
        per = executor_slots({**conf, "spark.executor.cores": match.group(2)})
        if int(match.group(1)) != -(-n // per):
            count = -(-n // per)
            overrides["spark.master"] = f"local-cluster[{count},{match.group(2)},{match.group(3)}]"
    elif master.startswith("spark://"):
        overrides.update(_fitted(master, conf, n))
        cores = overrides.get("spark.executor.cores", conf.get("spark.executor.cores", "1"))
        per = executor_slots({**conf, **overrides, "spark.executor.cores": cores})
        overrides["spark.cores.max"] = str(-(-n // per) * int(cores))
    elif master == "yarn" or master.startswith("k8s://"):
        overrides.update(_fitted(master, conf, n))
        per = executor_slots({**conf, **overrides})
        overrides["spark.executor.instances"] = str(-(-n // per))
    elif master == "local" or master.startswith("local["):
        # local[N] runs tasks in the driver: no executors, no TensorFlow processes (plain
        # spark-submit's default master). The same machine with executors instead:
        overrides["spark.master"] = f"local-cluster[{n},1,1024]"
        overrides["spark.driver.host"] = overrides["spark.driver.bindAddress"] = "127.0.0.1"
        log.info("master %s has no executors: using local-cluster[%d,1,1024]", master, n)
    return overrides


def main(
    argv: Sequence[str] | None = None,
    *,
    section: str = "train",
    default_model: str | None = None,
    description: str = "",
    spark=None,
) -> int:
    """jobs/train*.py on ``argv``; on the session ``spark`` when given (it must have the
    executors the run needs; else the job builds its own, sized to the run)."""
    args = cli.parse(
        parser(description or "Train a model on Spark executors", section, default_model),
        argv,
        own_logging=spark is None,
    )
    train, scaling, run = configs(args)
    try:
        tracking.check(run)  # MLflow's store answers: before Spark starts
    except ConfigError as exc:
        raise usage_error(exc) from None
    name = f"sparktf-train-{train.model}"
    connect = spark is None and remote_url(args.remote, spark_submit=launched_by_spark_submit())
    if connect:
        # The Connect server's cluster runs the executors: this machine's profile does not
        # size them. The GPU settings are passed to be named if the session cannot take them.
        overrides = dict(gpu_spark_conf(scaling))
    elif launched_by_spark_submit():  # its own configuration counts
        from pyspark import SparkConf, SparkContext

        SparkContext._ensure_initialized()  # the JVM's settings, spark-submit's master among them
        overrides = session_overrides(dict(SparkConf().getAll()), scaling)
    else:
        overrides = session_overrides(session_conf(args.profile), scaling)
    with job_session(name, args.profile, overrides, spark=spark, remote=args.remote) as spark:
        if train.data == "demo":
            made = _demo_on_connect if is_connect(spark) else spark
            train = dataclasses.replace(train, data=demo.ensure_dataset(train.model, made))
        try:
            result = fit(train, scaling, run, spark=spark)
        except ConfigError as exc:
            raise usage_error(exc) from None
        except TrainingError as exc:  # e.g. a time limit: named by its flag
            raise TrainingError(for_command_line(str(exc))) from exc
    text = json.dumps(result.to_dict(), indent=2, default=str)
    if args.result_json:
        with open(args.result_json, "w") as f:
            f.write(text + "\n")
        log.info("result written to %s", args.result_json)
    else:
        print(text)
    return 0


def _demo_on_connect():
    """What ``--data demo`` converts with on Spark Connect: nothing (a conversion needs a
    classic session); the demo dataset made by an earlier run is used as it is."""
    raise cli.UsageError(
        "--data demo: the demo dataset is not made yet, and making it needs a classic Spark "
        "session (a conversion runs RDD tasks), which a Spark Connect client has not: run the "
        "job once without --remote (and with SPARK_REMOTE unset), or pass --data with a "
        "converted dataset"
    )


def executors_needed(section: str, argv: Sequence[str]) -> int | None:
    """Spark executors the run that ``argv`` describes needs (one per TensorFlow process),
    from the flags and ``conf/jobs/<section>.json``; None when they do not parse (the job
    itself then says why). ``scripts/submit.sh`` sizes a ``local-cluster`` master with it:
    under spark-submit the master is fixed before the job starts."""
    try:
        return scaling_config(cli.parse(parser("", section, None), argv)).num_executors
    except (cli.UsageError, ConfigError, SystemExit):
        return None


def finetune_and_augment_options(args) -> dict:
    """The fine-tuning and augmentation flags as ``{"model_config": overrides, "train":
    TrainConfig field values}``.

    ``--no-augment`` becomes ``{"augment": False}`` for models that have the switch (the
    ``resnet`` family) and nothing for the others (they never augment). ``--warm-start-from``
    is resolved now, so a path that holds no checkpoint or export fails before Spark starts,
    unless ``--model-dir`` already has a checkpoint (the run resumes from it and ignores the
    path). Raises :class:`sparktf.cli.UsageError` for flags that cannot work.
    """
    from sparktf import storage
    from sparktf.train import artifacts
    from sparktf.train.process import warmstart

    model_config: dict = {}
    if not args.augment:
        from sparktf import models  # deferred: imports TensorFlow

        try:
            has_switch = "augment" in models.describe(args.model)["config"]
        except ValueError as exc:
            raise cli.UsageError(str(exc)) from None
        if has_switch:
            model_config["augment"] = False
        else:
            log.info("--no-augment: %s does not augment its inputs anyway", args.model)
    exclude = warmstart.split_scopes(args.warm_start_exclude_scopes)
    trainable = warmstart.split_scopes(args.trainable_scopes)
    path = args.warm_start_from
    if exclude and not path:
        raise cli.UsageError("--warm-start-exclude-scopes needs --warm-start-from")
    if path:
        try:
            resuming = bool(args.model_dir) and artifacts.latest_checkpoint(args.model_dir)
            if not resuming:
                source = warmstart.resolve_source(path)
                log.info(
                    "--warm-start-from %s: will start from %s %s", path, source.kind, source.path
                )
        except (warmstart.WarmStartError, storage.StorageError) as exc:
            raise usage_error(exc) from None
    return {
        "model_config": model_config,
        "train": {
            "warm_start_from": path or None,
            "warm_start_exclude_scopes": exclude,
            "trainable_scopes": trainable,
        },
    }


# Book optimizer flag (its dest) -> {optimizer name: Keras keyword argument it sets}.
_OPTIMIZER_FLAGS: dict[str, dict[str, str]] = {
    "opt_epsilon": {n: "epsilon" for n in ("adadelta", "adagrad", "adam", "rmsprop")},
    "momentum": {"momentum": "momentum", "sgd": "momentum"},
    "nesterov": {"momentum": "nesterov", "sgd": "nesterov"},
    "rmsprop_momentum": {"rmsprop": "momentum"},
    "rmsprop_decay": {"rmsprop": "rho"},
    "adam_beta1": {"adam": "beta_1"},
    "adam_beta2": {"adam": "beta_2"},
    "adadelta_rho": {"adadelta": "rho"},
    "adagrad_initial_accumulator_value": {"adagrad": "initial_accumulator_value"},
    "ftrl_learning_rate_power": {"ftrl": "learning_rate_power"},
    "ftrl_initial_accumulator_value": {"ftrl": "initial_accumulator_value"},
    "ftrl_l1": {"ftrl": "l1_regularization_strength"},
    "ftrl_l2": {"ftrl": "l2_regularization_strength"},
}


def optimizer_overrides(args) -> dict:
    """Model-config overrides from the optimizer, learning-rate, regularisation and precision
    flags (only those given: the model keeps its own setting for the others).

    The optimizer flags complete the model's optimizer spec (``--model-config``'s if it sets
    one), or start a new one when ``--optimizer`` names another optimizer. A flag that the
    chosen optimizer does not have is an error. ``--learning-rate-decay-type fixed`` is
    the ``constant`` schedule; ``--num-epochs-per-decay`` is ``lr_decay_epochs``
    (exponential) or ``lr_decay_total_epochs`` (polynomial, which otherwise decays over the
    run's ``--epochs`` when given). Raises :class:`sparktf.cli.UsageError`.
    """
    base_config: dict | None = None

    def base() -> dict:
        """The model's config with --model-config applied (read only when needed)."""
        nonlocal base_config
        if base_config is None:
            from sparktf import models  # deferred: imports TensorFlow

            try:
                base_config = models.get_task(args.model, **(args.model_config or {})).config
            except ValueError as exc:
                raise cli.UsageError(str(exc)) from None
        return base_config

    def flag(dest: str) -> str:
        return "--" + dest.replace("_", "-")

    out: dict = {}
    given = {d: getattr(args, d) for d in _OPTIMIZER_FLAGS if getattr(args, d, None) is not None}
    if args.optimizer or given:
        current = dict(base()["optimizer"])
        name = args.optimizer or current["name"]
        spec = current if name == current["name"] else {"name": name}
        for dest, value in given.items():
            keyword = _OPTIMIZER_FLAGS[dest].get(name)
            if keyword is None:
                raise cli.UsageError(
                    f"{flag(dest)} applies to --optimizer {'/'.join(_OPTIMIZER_FLAGS[dest])}, "
                    f"not to {name}"
                )
            spec[keyword] = value
        out["optimizer"] = spec
    if args.learning_rate is not None:
        out["learning_rate"] = args.learning_rate
    kind = args.learning_rate_decay_type
    if kind:
        out["lr_schedule"] = "constant" if kind == "fixed" else kind
    if args.num_epochs_per_decay is not None or (kind == "polynomial" and args.epochs):
        schedule = out.get("lr_schedule") or base()["lr_schedule"]
        if schedule == "polynomial":
            out["lr_decay_total_epochs"] = args.num_epochs_per_decay or args.epochs
        elif schedule == "exponential":
            out["lr_decay_epochs"] = args.num_epochs_per_decay
        else:
            raise cli.UsageError(
                f"--num-epochs-per-decay applies to the exponential and polynomial "
                f"schedules, not to {schedule!r} (set --learning-rate-decay-type)"
            )
    if args.learning_rate_decay_factor is not None:
        out["lr_decay_factor"] = args.learning_rate_decay_factor
    if args.end_learning_rate is not None:
        out["end_learning_rate"] = args.end_learning_rate
    if args.lr_boundaries_epochs:
        try:
            out["lr_boundaries_epochs"] = [
                float(e) for e in args.lr_boundaries_epochs.split(",") if e.strip()
            ]
        except ValueError:
            raise cli.UsageError(
                f"--lr-boundaries-epochs takes comma-separated epochs, got "
                f"{args.lr_boundaries_epochs!r}"
            ) from None
    for dest in ("label_smoothing", "weight_decay", "precision"):
        if getattr(args, dest) is not None:
            out[dest] = getattr(args, dest)
    if args.moving_average_decay is not None:
        out["moving_average_decay"] = args.moving_average_decay or None  # 0: none
    if out:  # a combination that cannot work fails now, before Spark starts
        from sparktf import models

        try:
            models.get_task(args.model, **{**(args.model_config or {}), **out})
        except ValueError as exc:
            raise cli.UsageError(str(exc)) from None
    return out
