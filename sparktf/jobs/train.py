"""What the training jobs in ``jobs/`` share: flags -> configs -> :func:`sparktf.train.fit`.

Every ``jobs/train*.py`` is ``main(argv)`` of this module with its own config section
(``conf/jobs/<section>.json`` supplies defaults; flags override them). ``--data demo``
prepares a small synthetic dataset under ``.local/demo`` first (see
:mod:`sparktf.train.demo`), so a job runs with no arguments at all.

Exit codes: 0 trained and exported; 1 the run failed (the first error is logged); 2 the
command line or the input cannot work.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from collections.abc import Sequence

from sparktf import cli
from sparktf.placement import PlacementError
from sparktf.spark import (
    executor_sizing,
    job_session,
    launched_by_spark_submit,
    session_conf,
)
from sparktf.train import (
    ConfigError,
    RunConfig,
    ScalingConfig,
    TrainConfig,
    demo,
    fit,
    gpu_spark_conf,
    tracking,
)

log = logging.getLogger("sparktf.jobs.train")


def parser(description: str, section: str, default_model: str | None):
    p = cli.parser(description, config_section=section)
    g = p.add_argument_group("what to train")
    g.add_argument(
        "--model",
        default=default_model,
        help="model name from the registry (sparktf.models.list_models()), or a user's Keras "
        "build function as package.module:build (importable on the executors; see "
        "sparktf.models.custom)",
    )
    g.add_argument(
        "--model-config",
        default=None,
        type=json.loads,
        help="JSON object of model config overrides, e.g. '{\"hidden_units\": 64}'",
    )
    g.add_argument(
        "--data",
        default=None,
        help="converted dataset directory (local or hdfs://), or 'demo' for a small "
        "synthetic one prepared under .local/demo",
    )
    g.add_argument("--split", default="train", help="split to train on")
    g.add_argument(
        "--input-mode",
        choices=["spark", "files"],
        default="files",
        help="spark: Parquet rows fed by Spark tasks; files: each worker reads its "
        "own shard of the files",
    )
    g.add_argument(
        "--file-format",
        choices=["tfrecord", "parquet"],
        default="tfrecord",
        help="files read in --input-mode files",
    )
    g.add_argument("--epochs", type=float, default=None, help="passes over the split")
    g.add_argument(
        "--steps",
        type=int,
        default=None,
        help="global steps (counted across resumes); with --epochs: whichever first",
    )
    g.add_argument(
        "--batch-size", type=int, default=None, help="global batch size (default: the model's)"
    )
    g.add_argument("--seed", type=int, default=0, help="shuffle seed")
    g.add_argument("--no-shuffle", dest="shuffle", action="store_false", help="keep file order")
    o = p.add_argument_group(
        "optimizer, learning rate, regularisation, precision",
        "the book's train_image_classifier options (9.2); an option left out keeps the "
        "model's own setting (sparktf.models.describe(MODEL))",
    )
    o.add_argument(
        "--optimizer",
        choices=["adadelta", "adagrad", "adam", "ftrl", "momentum", "rmsprop", "sgd"],
        default=None,
        help="optimizer (momentum: SGD with momentum); another than the model's starts from "
        "Keras's defaults for it plus the options below",
    )
    o.add_argument("--learning-rate", type=float, default=None, help="initial learning rate")
    o.add_argument(
        "--opt-epsilon",
        type=float,
        default=None,
        help="epsilon of adadelta, adagrad, adam, rmsprop",
    )
    o.add_argument(
        "--momentum",
        type=float,
        default=None,
        help="momentum of the momentum optimizer (0.9 when unset) or of sgd",
    )
    o.add_argument(
        "--nesterov",
        action="store_true",
        default=None,
        help="Nesterov momentum (momentum, sgd)",
    )
    o.add_argument("--rmsprop-momentum", type=float, default=None, help="momentum of rmsprop")
    o.add_argument("--rmsprop-decay", type=float, default=None, help="decay (rho) of rmsprop")
    o.add_argument("--adam-beta1", type=float, default=None, help="beta_1 of adam")
    o.add_argument("--adam-beta2", type=float, default=None, help="beta_2 of adam")
    o.add_argument("--adadelta-rho", type=float, default=None, help="rho of adadelta")
    o.add_argument(
        "--adagrad-initial-accumulator-value",
        type=float,
        default=None,
        help="initial accumulator value of adagrad",
    )
    o.add_argument(
        "--ftrl-learning-rate-power", type=float, default=None, help="learning rate power of ftrl"
    )
    o.add_argument(
        "--ftrl-initial-accumulator-value",
        type=float,
        default=None,
        help="initial accumulator value of ftrl",
    )
    o.add_argument("--ftrl-l1", type=float, default=None, help="L1 regularisation of ftrl")
    o.add_argument("--ftrl-l2", type=float, default=None, help="L2 regularisation of ftrl")
    o.add_argument(
        "--learning-rate-decay-type",
        choices=["fixed", "exponential", "polynomial", "piecewise"],
        default=None,
        help="fixed: constant; exponential: x decay factor every --num-epochs-per-decay "
        "epochs (staircase); polynomial: linear down to --end-learning-rate over "
        "--num-epochs-per-decay epochs (default: the run's --epochs, else the model's); "
        "piecewise: x decay factor at each of --lr-boundaries-epochs",
    )
    o.add_argument(
        "--num-epochs-per-decay",
        type=float,
        default=None,
        help="epochs per exponential decay step, or the polynomial decay's length",
    )
    o.add_argument(
        "--learning-rate-decay-factor",
        type=float,
        default=None,
        help="factor of each exponential or piecewise decay step",
    )
    o.add_argument(
        "--end-learning-rate",
        type=float,
        default=None,
        help="learning rate the polynomial decay ends at",
    )
    o.add_argument(
        "--lr-boundaries-epochs",
        default=None,
        metavar="E1,E2,...",
        help="epochs after which the piecewise schedule multiplies the rate by the factor",
    )
    o.add_argument(
        "--label-smoothing",
        type=float,
        default=None,
        help="classifiers: train against (1 - s) * one_hot + s / num_classes",
    )
    o.add_argument(
        "--weight-decay",
        type=float,
        default=None,
        help="classifiers: L2 weight decay on every kernel (weight_decay * l2_loss(w))",
    )
    o.add_argument(
        "--moving-average-decay",
        type=float,
        default=None,
        help="keep an exponential moving average of the weights with this decay (in the "
        "checkpoints; used for evaluation and the export); 0: none",
    )
    o.add_argument(
        "--precision",
        choices=["fp32", "bf16", "fp16"],
        default=None,
        help="compute precision (Keras mixed precision; fp16 with loss scaling); variables "
        "and the export stay float32",
    )
    f = p.add_argument_group("fine-tuning and augmentation")
    f.add_argument(
        "--checkpoint-path",
        default=None,
        help="start from the weights of another run (local or hdfs://): a checkpoint prefix "
        "(MODEL_DIR/checkpoints/ckpt-N), a checkpoints or model directory (its latest "
        "checkpoint), or a SavedModel export (MODEL_DIR/export/<step>, or MODEL_DIR/export "
        "for the latest); ignored when --model-dir already has a checkpoint (resume wins)",
    )
    f.add_argument(
        "--checkpoint-exclude-scopes",
        default=None,
        metavar="SCOPES",
        help="comma-separated layer-name prefixes not restored from --checkpoint-path (they "
        "keep their initialisation), e.g. 'logits' to fine-tune to another number of classes",
    )
    f.add_argument(
        "--trainable-scopes",
        default=None,
        metavar="SCOPES",
        help="comma-separated layer-name prefixes: only these variables train, every other "
        "one stays bit-identical (default: all train)",
    )
    f.add_argument(
        "--no-augment",
        dest="augment",
        action="store_false",
        help="train image models that augment by default (resnet*: 4-pixel padding, random "
        "crop, random flip) on the images as they are",
    )
    e = p.add_argument_group("evaluation during training")
    e.add_argument(
        "--eval-split",
        default="auto",
        help="split evaluated during training: 'auto' (valid if the dataset has it, else "
        "test), a split name, or 'none'",
    )
    e.add_argument(
        "--eval-every",
        type=int,
        default=0,
        help="steps between evaluations (0: once per epoch); always at the end",
    )
    e.add_argument(
        "--export-best",
        default=None,
        metavar="METRIC",
        help="also keep the export of the best evaluation so far in MODEL_DIR/export_best/ "
        "(e.g. accuracy, top5_accuracy, perplexity, loss)",
    )
    s = p.add_argument_group("where and how many")
    s.add_argument(
        "--strategy",
        choices=["allreduce", "ps"],
        default="allreduce",
        help="allreduce: synchronous MultiWorkerMirroredStrategy; ps: asynchronous "
        "ParameterServerStrategy (chief coordinates, ps hold the variables)",
    )
    s.add_argument(
        "--num-workers",
        type=int,
        default=2,
        help="allreduce: training processes (the chief included); ps: workers besides the chief",
    )
    s.add_argument("--num-ps", type=int, default=1, help="parameter servers (--strategy ps)")
    s.add_argument(
        "--ps-on-driver",
        action="store_true",
        help="run the parameter servers on the driver instead of on executors",
    )
    s.add_argument(
        "--gpus-per-worker",
        type=int,
        default=0,
        help="GPUs per TensorFlow process, requested through Spark's resource "
        "scheduling (scripts/gpu_discovery.sh); 0: CPU",
    )
    s.add_argument(
        "--threads-per-worker",
        type=int,
        default=0,
        help="TensorFlow intra-op threads per process (0: TensorFlow's default)",
    )
    r = p.add_argument_group("run")
    r.add_argument(
        "--model-dir",
        default=None,
        help="checkpoints, TensorBoard events and exports (local or hdfs://); a "
        "rerun with the same directory resumes",
    )
    r.add_argument("--checkpoint-every", type=int, default=500, help="steps between checkpoints")
    r.add_argument(
        "--keep-checkpoints",
        type=int,
        default=3,
        help="newest checkpoints kept in the model directory (across resumes)",
    )
    r.add_argument("--summary-every", type=int, default=20, help="steps between scalar summaries")
    r.add_argument(
        "--progress-every",
        type=float,
        default=5.0,
        help="seconds between progress lines on the driver",
    )
    r.add_argument(
        "--feed-timeout",
        type=float,
        default=300.0,
        help="seconds the spark input mode waits for rows to move before failing",
    )
    r.add_argument(
        "--failure-timeout",
        type=float,
        default=120.0,
        help="bound in seconds from a failure in any TensorFlow process to the end of the job",
    )
    r.add_argument(
        "--startup-timeout",
        type=float,
        default=300.0,
        help="seconds from the start of the run to the first training step before it fails",
    )
    r.add_argument(
        "--stall-timeout",
        type=float,
        default=300.0,
        help="seconds without global-step progress before the run fails, naming the processes "
        "that stopped advancing (also the all-reduce collective timeout)",
    )
    r.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="times the TensorFlow cluster is started again from the latest checkpoint after a "
        "failure (a lost process or executor) before the job fails",
    )
    r.add_argument(
        "--no-export",
        dest="export",
        action="store_false",
        help="skip the SavedModel export at the end",
    )
    r.add_argument(
        "--result-json",
        default=None,
        help="write the result (final step, metrics, paths) as JSON to this local file "
        "instead of printing it",
    )
    t = p.add_argument_group(
        "experiment tracking",
        f"optional; needs the mlflow extra ({tracking.INSTALL_HINT}). The driver logs the "
        "run's parameters, its training metrics and evaluations with their steps, and the "
        "export as an artifact to MLflow",
    )
    t.add_argument(
        "--mlflow-tracking-uri",
        default=None,
        metavar="URI",
        help="MLflow tracking URI: a tracking server (http(s)://...; credentials through "
        "MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME/PASSWORD, not in the URI) or a "
        "local file store (a path or file:// URI; MLflow 3 wants MLFLOW_ALLOW_FILE_STORE=true "
        "for it); unset: no tracking",
    )
    t.add_argument(
        "--mlflow-experiment",
        default="sparktf",
        metavar="NAME",
        help="MLflow experiment of the run (created when missing)",
    )
    return p


def scaling_config(args) -> ScalingConfig:
    return ScalingConfig(
        strategy=args.strategy,
        num_workers=args.num_workers,
        num_ps=args.num_ps,
        ps_on_driver=args.ps_on_driver,
        gpus_per_worker=args.gpus_per_worker,
        threads_per_worker=args.threads_per_worker,
    )


def configs(args):
    if not args.model:
        raise cli.UsageError("--model is required")
    if not args.data:
        raise cli.UsageError("--data is required (a converted dataset, or 'demo')")
    if not args.model_dir:
        raise cli.UsageError("--model-dir is required")
    if args.mlflow_tracking_uri:
        try:
            tracking.require_mlflow()  # the extra is missing: say so before anything else
        except ConfigError as exc:
            raise cli.UsageError(str(exc)) from None
    tuning = finetune_and_augment_options(args)
    # --model-config first; the specific flags (optimizer, schedule, augmentation) win.
    model_config = {
        **(args.model_config or {}),
        **optimizer_overrides(args),
        **tuning["model_config"],
    }
    train = TrainConfig(
        model=args.model,
        data=args.data,
        model_config=model_config,
        split=args.split,
        input_mode=args.input_mode,
        file_format=args.file_format,
        epochs=args.epochs,
        steps=args.steps,
        batch_size=args.batch_size,
        shuffle=args.shuffle,
        seed=args.seed,
        eval_split=args.eval_split,
        **tuning["train"],
    )
    scaling = scaling_config(args)
    run = RunConfig(
        model_dir=args.model_dir,
        checkpoint_every_steps=args.checkpoint_every,
        keep_checkpoints=args.keep_checkpoints,
        summary_every_steps=args.summary_every,
        progress_every_s=args.progress_every,
        feed_timeout_s=args.feed_timeout,
        failure_timeout_s=args.failure_timeout,
        startup_timeout_s=args.startup_timeout,
        stall_timeout_s=args.stall_timeout,
        max_restarts=args.max_restarts,
        eval_every_steps=args.eval_every,
        export_best=args.export_best,
        export=args.export,
        mlflow_tracking_uri=args.mlflow_tracking_uri,
        mlflow_experiment=args.mlflow_experiment,
    )
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
    """Spark settings the run needs: GPUs, and executors sized to the run (one per TensorFlow
    process): a local-cluster master's count, a standalone master's ``spark.cores.max``, YARN's
    and Kubernetes' ``spark.executor.instances``; standalone and YARN executors that do not
    fit the cluster shrunk to fit (what ``sparktf submit`` does too)."""
    overrides = dict(gpu_spark_conf(scaling))
    master = conf.get("spark.master", "")
    n = scaling.num_executors
    match = re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*(\d+)\]", master)
    if match and int(match.group(1)) != n:
        overrides["spark.master"] = f"local-cluster[{n},{match.group(2)},{match.group(3)}]"
    elif master.startswith("spark://"):
        overrides.update(_fitted(master, conf, n))
        cores = overrides.get("spark.executor.cores", conf.get("spark.executor.cores", "1"))
        overrides["spark.cores.max"] = str(n * int(cores))
    elif master == "yarn" or master.startswith("k8s://"):
        overrides.update(_fitted(master, conf, n))
        overrides["spark.executor.instances"] = str(n)
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
    try:
        train, scaling, run = configs(args)
        tracking.check(run)  # MLflow's store answers: before Spark starts
    except ConfigError as exc:
        raise cli.UsageError(str(exc)) from None
    if launched_by_spark_submit():  # its own configuration counts
        from pyspark import SparkConf, SparkContext

        SparkContext._ensure_initialized()  # the JVM's settings, spark-submit's master among them
        conf = dict(SparkConf().getAll())
    else:
        conf = session_conf(args.profile)
    name, overrides = f"sparktf-train-{train.model}", session_overrides(conf, scaling)
    with job_session(name, args.profile, overrides, spark=spark) as spark:
        if train.data == "demo":
            train = dataclasses.replace(train, data=demo.ensure_dataset(train.model, spark))
        try:
            result = fit(train, scaling, run, spark=spark)
        except ConfigError as exc:
            raise cli.UsageError(str(exc)) from None
    text = json.dumps(result.to_dict(), indent=2, default=str)
    if args.result_json:
        with open(args.result_json, "w") as f:
            f.write(text + "\n")
        log.info("result written to %s", args.result_json)
    else:
        print(text)
    return 0


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
    ``resnet`` family) and nothing for the others (they never augment). ``--checkpoint-path``
    is resolved now, so a path that holds no checkpoint or export fails before Spark starts,
    unless ``--model-dir`` already has a checkpoint (the run resumes from it and ignores the
    path). Raises :class:`sparktf.cli.UsageError` for flags that cannot work.
    """
    from sparktf import storage
    from sparktf.train import artifacts, warmstart

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
    exclude = warmstart.split_scopes(args.checkpoint_exclude_scopes)
    trainable = warmstart.split_scopes(args.trainable_scopes)
    path = args.checkpoint_path
    if exclude and not path:
        raise cli.UsageError("--checkpoint-exclude-scopes needs --checkpoint-path")
    if path:
        try:
            resuming = bool(args.model_dir) and artifacts.latest_checkpoint(args.model_dir)
            if not resuming:
                source = warmstart.resolve_source(path)
                log.info(
                    "--checkpoint-path %s: will start from %s %s", path, source.kind, source.path
                )
        except (warmstart.WarmStartError, storage.StorageError) as exc:
            raise cli.UsageError(str(exc)) from None
    return {
        "model_config": model_config,
        "train": {
            "checkpoint_path": path or None,
            "checkpoint_exclude_scopes": exclude,
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
