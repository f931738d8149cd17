"""What every job in ``jobs/`` shares: logging, config files plus flag overrides, exit codes.

A job is a thin entry point::

    def main(argv=None) -> int:
        parser = cli.parser("Convert CIFAR-10 ...", config_section="convert_cifar10")
        parser.add_argument("--input", required=True, help="...")
        args = cli.parse(parser, argv)
        ...                       # call the library
        return 0

    if __name__ == "__main__":
        cli.run(main)

``cli.run`` turns exceptions into a one-line error on stderr (the traceback at debug level)
and a non-zero exit code, so that spark-submit and shell scripts see the failure.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from sparktf import errors, paths, remote
from sparktf.errors import SparktfError

__all__ = [
    "LOG_FORMAT",
    "Renamed",
    "UsageError",
    "add_export_flag",
    "load_config",
    "parse",
    "parser",
    "run",
    "setup_logging",
]

log = logging.getLogger("sparktf")

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class UsageError(SparktfError, Exception):
    """A problem with the command line or the input that the user must fix (exit code 2)."""


def setup_logging(level: str | int | None = None) -> None:
    level = level or os.environ.get("SPARKTF_LOG_LEVEL", "INFO")
    logging.basicConfig(level=level, format=LOG_FORMAT, stream=sys.stderr, force=True)
    for noisy in ("py4j", "hdfs", "urllib3", "tensorflow", "absl"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))


class Renamed(argparse.Action):
    """A flag's former name: stores into the new flag's destination and warns once."""

    def __init__(self, option_strings, dest, *, new: str, **kwargs):
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        log.warning("%s is now %s (the old name works for one release)", option_string, self.new)
        setattr(namespace, self.dest, values)


def add_export_flag(p: argparse.ArgumentParser) -> None:
    """``--export``: the SavedModel a job reads (``--model``, its former name, still works
    with a warning; ``--model`` is what a training job trains)."""
    p.add_argument(
        "--export",
        help="the SavedModel: an export directory, MODEL_DIR/export or MODEL_DIR (its "
        "highest version; local, file:// or hdfs://); required",
    )
    p.add_argument("--model", dest="export", action=Renamed, new="--export", help=argparse.SUPPRESS)


def load_config(section: str, path: str | os.PathLike | None = None) -> dict:
    """Defaults of one job: a JSON object of flag values (``jobs/SECTION.json`` of the conf
    directories, ``sparktf.paths``), or of the file ``path`` (looked up there too when it is
    not a file as given)."""
    default = paths.conf_file(f"jobs/{section}.json")
    path = paths.resolve_config(path) if path else default
    if not path.is_file():
        if path != default:
            raise UsageError(f"config file {path} does not exist")
        return {}
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise UsageError(f"config file {path} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise UsageError(f"config file {path} must hold a JSON object of flag values")
    return data


def parser(description: str, *, config_section: str | None = None) -> argparse.ArgumentParser:
    """An ArgumentParser with the flags every job has (--config, --profile, --remote,
    --log-level)."""
    p = argparse.ArgumentParser(
        description=description, formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    p.set_defaults(_config_section=config_section)
    default_file = f"conf/jobs/{config_section}.json" if config_section else "none"
    p.add_argument(
        "--config",
        default=None,
        help=f"JSON file with defaults for this job's flags; flags given on the "
        f"command line override it. Default: {default_file}",
    )
    p.add_argument(
        "--profile",
        default=os.environ.get("SPARKTF_PROFILE", "local"),
        help="Spark profile (spark/PROFILE.conf of the conf directories: "
        f"{', '.join(paths.conf_names('spark', '.conf'))}) or a spark-defaults file, used "
        "when not run through spark-submit",
    )
    p.add_argument(
        "--remote",
        default=None,
        metavar="URL",
        help="Spark Connect URL, e.g. sc://localhost:15002/;token=...: run on that Connect "
        "server instead of a Spark session of this process (the profile is not used then). "
        "Not given: $SPARK_REMOTE when set and not run by spark-submit (prefer it for a URL "
        "with a token: a command line is visible to every user); --remote '' forces a "
        "classic session",
    )
    p.add_argument(
        "--log-level",
        default=os.environ.get("SPARKTF_LOG_LEVEL", "INFO"),
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        help="logging level",
    )
    return p


def parse(
    p: argparse.ArgumentParser, argv: Sequence[str] | None = None, *, own_logging: bool = True
) -> argparse.Namespace:
    """Parses flags with config-file defaults underneath them; sets up logging unless
    ``own_logging`` is false (a job run inside another program, which keeps its own)."""
    pre, _ = p.parse_known_args(argv)
    section = p.get_default("_config_section")
    if section or pre.config:  # a job's defaults file, or one named on the command line
        defaults = load_config(section or "", pre.config)
        known = {a.dest for a in p._actions}
        unknown = sorted(set(defaults) - known)
        if unknown:
            name = section or pre.config
            raise UsageError(f"unknown keys in the {name} config: {', '.join(unknown)}")
        p.set_defaults(**defaults)
    args = p.parse_args(argv)
    if own_logging:
        setup_logging(args.log_level)
    return args


def run(
    main: Callable[[], int | None], for_command_line: Callable[[str], str] | None = None
) -> None:
    """Runs a job's main and exits with its status; errors give a readable message.

    ``for_command_line`` rewrites an error message for a command-line user (the API
    parameters it names become the job's flags)."""
    words = for_command_line or str
    try:
        code = main()
    except UsageError as exc:
        log.error("%s", words(str(exc)))
        sys.exit(2)
    except KeyboardInterrupt:
        log.error("interrupted")
        sys.exit(130)
    except Exception as exc:  # the job failed: say why in one line, keep the details at debug
        log.debug("traceback", exc_info=True)
        exc = errors.background_failure() or exc  # what made it fail, where a watch found it
        log.error("%s: %s", type(exc).__name__, words(str(exc)))
        sys.exit(1)
    sys.exit(code or 0)


def run_example(
    p: argparse.ArgumentParser,
    example: Callable[[argparse.Namespace, Any], dict],
    session: Callable[[argparse.Namespace], Any],
    argv: Sequence[str] | None = None,
) -> int:
    """The main of a Spark ML example: parse, ``session(args)``, run, print the summary as
    JSON (saying so when the data was synthetic)."""
    args = parse(p, argv)
    spark = session(args)
    try:
        summary = example(args, spark)["summary"]
    finally:
        # A Spark Connect client's clean-up at exit (its ML cache, its session) sends RPCs
        # from atexit and finalizers, which pyspark says can hang the exit; stopped here, they
        # are skipped. (A classic session is stopped at exit by sparktf.spark.get_session.)
        if remote.is_connect(spark):
            spark.stop()
    print(json.dumps(summary, indent=2))
    if summary.get("synthetic_data"):
        print("(the demo data is synthetic: pass your own --csv to train on real data)")
    return 0
