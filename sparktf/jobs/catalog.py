"""The jobs of ``jobs/`` by name: what ``sparktf COMMAND``, ``sparktf submit NAME`` and the
files ``jobs/NAME.py`` run (``run_job``)."""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from sparktf import cli

__all__ = ["CONVERT_DATASETS", "JOBS", "Job", "run_job", "run_with_hdfs_credentials"]


@dataclass(frozen=True)
class Job:
    """A job of ``jobs/``: its module in ``sparktf.jobs`` and the keyword arguments of its
    ``main`` (the convert dataset, the training section and default model)."""

    module: str
    description: str
    options: tuple[tuple[str, str], ...] = ()

    def main(self, argv: Sequence[str]) -> int | None:
        from importlib import import_module

        module = import_module(f"sparktf.jobs.{self.module}")
        options = dict(self.options)
        if self.module == "convert":
            return module.main(options.pop("dataset"), argv, description=self.description)
        return module.main(argv, description=self.description, **options)

    def for_command_line(self, text: str) -> str:
        """An error message of this job as its command-line user reads it: the API parameters
        it names become the job's flags (its module's ``for_command_line``, if any)."""
        from importlib import import_module

        module = import_module(f"sparktf.jobs.{self.module}")
        translate = getattr(module, "for_command_line", None)
        return translate(text) if translate else text


JOBS = {
    "convert_cifar10": Job(
        "convert",
        "Convert CIFAR-10 (binary version, plain files or cifar-10-binary.tar.gz) to TFRecord "
        "and Parquet.",
        (("dataset", "cifar10"),),
    ),
    "convert_mnist": Job(
        "convert",
        "Convert MNIST (IDX files, gzipped or not) to TFRecord and Parquet.",
        (("dataset", "mnist"),),
    ),
    "convert_ptb": Job(
        "convert",
        "Convert PTB (simple-examples ptb.{train,valid,test}.txt) to TFRecord and Parquet.",
        (("dataset", "ptb"),),
    ),
    "train": Job(
        "train",
        "Train any model of the registry on Spark executors (TensorFlowOnSpark).",
        (("section", "train"),),
    ),
    "train_resnet": Job(
        "train",
        "Train ResNet on CIFAR-10: all-reduce on two local executors by default.",
        (("section", "train_resnet"), ("default_model", "resnet20")),
    ),
    "train_mnist": Job(
        "train",
        "Train an MNIST network (softmax regression or the MLP), ps/worker (asynchronous) by "
        "default.",
        (("section", "train_mnist"), ("default_model", "mnist_mlp")),
    ),
    "train_ptb": Job(
        "train",
        "Train the word-level LSTM language model on Penn Treebank text.",
        (("section", "train_ptb"), ("default_model", "ptb_small")),
    ),
    "train_dcgan": Job(
        "train",
        "Train the label-conditioned DCGAN on MNIST digits.",
        (("section", "train_dcgan"), ("default_model", "dcgan")),
    ),
    "evaluate": Job(
        "evaluate",
        "Evaluate an exported model on a dataset split and write the metrics as JSON.",
    ),
    "predict": Job(
        "predict",
        "Batch prediction: apply an exported model to a Parquet table, write the predictions.",
    ),
}
CONVERT_DATASETS = ("cifar10", "mnist", "ptb")


def run_job(name: str) -> None:
    """The entry point of ``jobs/NAME.py`` and of ``sparktf submit NAME``: the job on
    ``sys.argv[1:]`` with exit codes (``sparktf.cli.run``)."""
    job = JOBS[name]
    argv = sys.argv[1:]
    cli.run(lambda: run_with_hdfs_credentials(job, argv), job.for_command_line)


def run_with_hdfs_credentials(job: Job, argv: Sequence[str]) -> int | None:
    """Runs ``job`` on ``argv`` with what a Kerberized HDFS needs: the check, before Spark
    starts, that there is a ticket or a keytab, and the run's delegation token for its
    executors (:func:`sparktf.storage.delegation.job_credentials`). Raises NoCredentialsError
    before the job starts when Kerberos is on and there is neither."""
    from sparktf.security import kerberos

    if not kerberos.enabled() or {"-h", "--help"} & set(argv):
        return job.main(argv)
    from sparktf.storage.delegation import job_credentials

    with job_credentials(_profile_conf(argv)):
        return job.main(argv)


def _profile_conf(argv: Sequence[str]) -> dict[str, str]:
    """The Spark settings of the job's ``--profile`` (for ``spark.kerberos.*``); empty under
    spark-submit, which holds them itself, or when the profile cannot be read (the job says
    why)."""
    from sparktf import spark

    if spark.launched_by_spark_submit():
        return {}
    profile = os.environ.get("SPARKTF_PROFILE", "local")
    for i, arg in enumerate(argv):
        if arg == "--profile" and i + 1 < len(argv):
            profile = argv[i + 1]
        elif arg.startswith("--profile="):
            profile = arg.split("=", 1)[1]
    try:
        return spark.profile_conf(profile)
    except Exception:  # the job reports a bad profile itself, with its own message
        return {}
