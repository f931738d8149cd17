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
import os
import re
import sys
from collections.abc import Sequence

from sparktf import cli
from sparktf.spark import get_session, profile_conf
from sparktf.train import (
    ConfigError,
    RunConfig,
    ScalingConfig,
    TrainConfig,
    demo,
    fit,
    gpu_spark_conf,
)

log = logging.getLogger("sparktf.jobs.train")


def parser(description: str, section: str, default_model: str | None):
    p = cli.parser(description, config_section=section)
    g = p.add_argument_group("what to train")
    g.add_argument(
        "--model",
        default=default_model,
        help="model name from the registry (sparktf.models.list_models())",
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
        help="also write the result (final step, metrics, paths) to this local file",
    )
    return p


def configs(args):
    if not args.model:
        raise cli.UsageError("--model is required")
    if not args.data:
        raise cli.UsageError("--data is required (a converted dataset, or 'demo')")
    if not args.model_dir:
        raise cli.UsageError("--model-dir is required")
    train = TrainConfig(
        model=args.model,
        data=args.data,
        model_config=args.model_config or {},
        split=args.split,
        input_mode=args.input_mode,
        file_format=args.file_format,
        epochs=args.epochs,
        steps=args.steps,
        batch_size=args.batch_size,
        shuffle=args.shuffle,
        seed=args.seed,
    )
    scaling = ScalingConfig(
        strategy=args.strategy,
        num_workers=args.num_workers,
        num_ps=args.num_ps,
        ps_on_driver=args.ps_on_driver,
        gpus_per_worker=args.gpus_per_worker,
        threads_per_worker=args.threads_per_worker,
    )
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
        export=args.export,
    )
    return train, scaling, run


def session_overrides(conf: dict[str, str], scaling) -> dict[str, str]:
    """Spark settings the run needs: GPUs, and a local-cluster master sized to the run."""
    overrides = dict(gpu_spark_conf(scaling))
    master = conf.get("spark.master", "")
    match = re.fullmatch(r"local-cluster\[(\d+),\s*(\d+),\s*(\d+)\]", master)
    if match and int(match.group(1)) != scaling.num_executors:
        overrides["spark.master"] = (
            f"local-cluster[{scaling.num_executors},{match.group(2)},{match.group(3)}]"
        )
    return overrides


def main(
    argv: Sequence[str] | None = None,
    *,
    section: str = "train",
    default_model: str | None = None,
    description: str = "",
) -> int:
    args = cli.parse(
        parser(description or "Train a model on Spark executors", section, default_model), argv
    )
    try:
        train, scaling, run = configs(args)
    except ConfigError as exc:
        raise cli.UsageError(str(exc)) from None
    if "PYSPARK_GATEWAY_PORT" in os.environ:  # spark-submit: its own configuration counts
        from pyspark import SparkConf

        conf = dict(SparkConf().getAll())
    else:
        conf = profile_conf(args.profile)
    spark = get_session(
        f"sparktf-train-{train.model}",
        profile=args.profile,
        overrides=session_overrides(conf, scaling),
    )
    try:
        if train.data == "demo":
            train = dataclasses.replace(train, data=demo.ensure_dataset(train.model, spark))
        try:
            result = fit(train, scaling, run, spark=spark)
        except ConfigError as exc:
            raise cli.UsageError(str(exc)) from None
    finally:
        spark.stop()
    text = json.dumps(result.to_dict(), indent=2, default=str)
    print(text)
    if args.result_json:
        with open(args.result_json, "w") as f:
            f.write(text + "\n")
    return 0


def run_job(**kwargs) -> None:
    cli.run(lambda: main(sys.argv[1:], **kwargs))
