"""The command line of ``jobs/convert_<dataset>.py``: flags -> ``sparktf.datasets.conversion``.

Every conversion job is ``main(dataset, argv)`` of this module with its own config section
``convert_<dataset>`` (``conf/jobs/convert_<dataset>.json`` supplies defaults; flags override
them).

Exit codes: 0 done; 2 bad input or flags (the message names the file and the byte offset or
record); 1 other failures. Nothing is published unless the whole conversion succeeds.
"""

from __future__ import annotations

from collections.abc import Sequence

from sparktf import cli, storage
from sparktf.datasets import formats
from sparktf.datasets.conversion import OptionError, convert, for_command_line
from sparktf.datasets.conversion_plan import SHARD_MULTIPLE, SHARD_TARGET_BYTES
from sparktf.datasets.formats import FORMATS
from sparktf.datasets.sources import SourceError

__all__ = ["JOB_HELP", "add_job_flags", "for_command_line", "main", "refuse_remote", "run"]

JOB_HELP = {
    "cifar10": "CIFAR-10 binary version: a directory holding data_batch_1.bin ... "
    "data_batch_5.bin and test_batch.bin (searched recursively), or "
    "cifar-10-binary.tar.gz (the file, or a directory holding it)",
    "mnist": "a directory holding train-images-idx3-ubyte, train-labels-idx1-ubyte, "
    "t10k-images-idx3-ubyte and t10k-labels-idx1-ubyte, each gzipped (.gz) or not",
    "ptb": "the data/ directory of simple-examples, holding ptb.train.txt, ptb.valid.txt "
    "and ptb.test.txt",
}


def add_job_flags(parser, dataset: str) -> None:
    """The flags of jobs/convert_<dataset>.py."""
    parser.add_argument(
        "--input",
        required=True,
        help=f"input, a local path or hdfs://host:port/path: {JOB_HELP[dataset]}",
    )
    parser.add_argument(
        "--output",
        required=True,
        help="dataset directory to create (local path or hdfs://host:port/path); "
        "written to a temporary sibling and renamed into place at the end",
    )
    parser.add_argument(
        "--format",
        default=",".join(FORMATS),
        help="comma-separated output formats: tfrecord (OUT/<split>/tfrecord/"
        "part-*.tfrecord, tf.train.Example) and/or parquet (OUT/<split>/"
        "parquet/part-*.parquet with sparktf's schema; petastorm reads it too)",
    )
    parser.add_argument(
        "--shards",
        type=int,
        default=None,
        help="TFRecord part files (and Parquet files) per split; default: one per "
        f"{SHARD_TARGET_BYTES >> 20} MiB of input, rounded up to a multiple "
        f"of {SHARD_MULTIPLE}; never more than the split's records",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace an existing OUTPUT (only once the new dataset is complete); "
        "without it an existing OUTPUT is left alone and the job fails",
    )
    if dataset == "ptb":
        parser.add_argument(
            "--seq-len",
            type=int,
            default=formats.DEFAULT_SEQ_LEN,
            help="token ids per record: consecutive, non-overlapping chunks of "
            "the token stream; the model unrolls seq-len - 1 steps (inputs "
            "tokens[:-1], targets tokens[1:]); the final partial chunk is "
            "dropped",
        )
        parser.add_argument(
            "--unk",
            default=None,
            metavar="WORD",
            help="map words of ptb.valid.txt / ptb.test.txt that are not in the "
            "vocabulary (built from ptb.train.txt) to WORD (e.g. '<unk>'); "
            "without it such a word is an error",
        )


def run(dataset: str, args, spark=None) -> int:
    """Runs one conversion from parsed job flags (on ``spark`` when given, else on a session
    of its own, started only once the input has been checked); input and flag problems are
    UsageErrors."""
    if spark is None:
        refuse_remote(args.remote)
    kinds = [f.strip() for f in args.format.split(",") if f.strip()]
    sessions = []

    def session():
        from sparktf.spark import get_session

        sessions.append(
            get_session(f"sparktf-convert-{dataset}", profile=args.profile, remote=args.remote)
        )
        return sessions[-1]

    try:
        convert(
            dataset,
            args.input,
            args.output,
            output_formats=kinds,
            shards=args.shards,
            overwrite=args.overwrite,
            seq_len=getattr(args, "seq_len", formats.DEFAULT_SEQ_LEN),
            unk=getattr(args, "unk", None),
            spark=session if spark is None else spark,
        )
    except (SourceError, OptionError, storage.PathExistsError, storage.UnknownSchemeError) as exc:
        raise cli.UsageError(for_command_line(str(exc))) from exc
    finally:
        if sessions:  # a clean stop: executors are not relaunched at exit
            from sparktf.spark import stop_session

            for spark in sessions:
                stop_session(spark)
    return 0


def refuse_remote(remote: str | None) -> None:
    """A UsageError when the job is to run on Spark Connect (``--remote``, or
    ``$SPARK_REMOTE`` outside spark-submit): a conversion runs its tasks through RDDs, which
    a Connect session has not."""
    from sparktf.remote import remote_url
    from sparktf.security.redact import redact_url
    from sparktf.spark import launched_by_spark_submit

    url = remote_url(remote, spark_submit=launched_by_spark_submit())
    if url is not None:
        given = "--remote" if remote else "SPARK_REMOTE"
        raise cli.UsageError(
            f"the convert jobs need a classic Spark session (they run their tasks as RDDs) and "
            f"cannot run on Spark Connect ({given} {redact_url(url)}): run the conversion "
            "without --remote and with SPARK_REMOTE unset (or --remote ''), on a local Spark "
            "(--profile local) or through sparktf submit / spark-submit against the cluster; "
            "the converted dataset can then be used from a Connect client"
        )


def main(
    dataset: str, argv: Sequence[str] | None = None, *, description: str = "", spark=None
) -> int:
    """jobs/convert_<dataset>.py: parses ``argv`` (flags over the config file) and converts
    (on the session ``spark`` when given)."""
    parser = cli.parser(
        description or f"Convert {dataset} to TFRecord and Parquet",
        config_section=f"convert_{dataset}",
    )
    add_job_flags(parser, dataset)
    return run(dataset, cli.parse(parser, argv, own_logging=spark is None), spark)
