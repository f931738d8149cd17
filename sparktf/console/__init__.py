"""The ``sparktf`` command: every job of ``jobs/`` as a subcommand, and ``sparktf submit``.

    sparktf [--conf-dir DIR] [--version] COMMAND [ARGS]

    sparktf convert cifar10|mnist|ptb ...   # the flags of jobs/convert_<dataset>.py
    sparktf train ... | train-resnet | train-mnist | train-ptb | train-dcgan
    sparktf evaluate ...
    sparktf predict ...
    sparktf submit [--profile P] [--ship-env] [SPARK-SUBMIT-OPTIONS] JOB [ARGS]
    sparktf connect start|stop|status [--dir DIR] [--master M] ...   # a local Connect server

A job subcommand runs the job in this process, on a Spark session it builds from its
``--profile`` (as ``python jobs/X.py`` does); ``sparktf submit`` runs it through spark-submit
(as ``scripts/submit.sh`` does). ``--conf-dir`` (``$SPARKTF_CONF_DIR``) is a directory of
configuration files that override the shipped ones file by file (``sparktf.paths``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence

from sparktf import cli, paths
from sparktf.jobs.catalog import CONVERT_DATASETS, JOBS, run_job

__all__ = ["JOBS", "main", "run", "run_job", "version"]


def version() -> str:
    """The installed distribution's version (pyproject.toml is its one source)."""
    return paths.installed_version() or "unknown (not installed)"


def _usage() -> str:
    lines = [
        "usage: sparktf [--conf-dir DIR] [--version] COMMAND [ARGS]",
        "",
        "Convert, train, evaluate and predict with TensorFlow on Spark. Each command takes the",
        "flags of its job (sparktf COMMAND --help).",
        "",
        "commands:",
        "  convert {cifar10,mnist,ptb}  " + "convert a raw dataset to TFRecord and Parquet",
    ]
    for name, job in JOBS.items():
        if job.module != "convert":
            summary = job.description.split(" (")[0].split(": ")[-1].rstrip(".")
            lines.append(f"  {name.replace('_', '-'):<27}  {summary}")
    lines += [
        "  submit                       run a job through spark-submit with sparktf's "
        "configuration",
        "  connect {start,stop,status}  a local Spark Connect server (sparktf connect --help)",
        "",
        "options:",
        "  --conf-dir DIR   configuration files that override the shipped ones ($SPARKTF_CONF_DIR)",
        "  --version        print sparktf's version",
        "",
        f"configuration: {' then '.join(str(d) for d in paths.conf_dirs())}",
        f"run state ($SPARKTF_HOME): {paths.home()}",
    ]
    return "\n".join(lines)


def _command(argv: list[str]) -> tuple[Callable[[list[str]], int | None], list[str]]:
    """The function that runs the subcommand in ``argv`` and its arguments."""
    name, rest = argv[0], argv[1:]
    if name == "submit":
        from sparktf.console import submit

        return submit.main, rest
    if name == "connect":
        from sparktf.console import connect

        return connect.main, rest
    if name == "convert":
        if not rest or rest[0] not in CONVERT_DATASETS:
            got = repr(rest[0]) if rest else "nothing"
            raise cli.UsageError(
                f"sparktf convert needs a dataset, one of {', '.join(CONVERT_DATASETS)}; got {got}"
            )
        return JOBS[f"convert_{rest[0]}"].main, rest[1:]
    job = JOBS.get(name.replace("-", "_"))
    if job is None or job.module == "convert":
        raise cli.UsageError(f"unknown command {name!r}; see sparktf --help")
    return job.main, rest


def main(argv: Sequence[str] | None = None) -> int:
    """``sparktf ARGS``; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    while argv and argv[0].startswith("--conf-dir"):
        option = argv.pop(0)
        if "=" in option:
            value = option.split("=", 1)[1]
        elif argv:
            value = argv.pop(0)
        else:
            raise cli.UsageError("--conf-dir needs a directory")
        if not os.path.isdir(value):
            raise cli.UsageError(f"--conf-dir {value}: no such directory")
        os.environ[paths.CONF_DIR_ENV] = os.path.abspath(value)  # also for spark-submit's driver
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0 if argv else 2
    if argv[0] == "--version":
        print(f"sparktf {version()}")
        return 0
    command, rest = _command(argv)
    return command(rest) or 0


def run() -> None:
    """The console script: ``main`` with sparktf's exit codes and one-line errors."""
    cli.run(main)
