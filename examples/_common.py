"""What the Spark ML examples share, so that each shows only what it teaches: the data flags,
the demo CSV, the rows read and split, the predictions written, the session.

An example imports it as ``_common``: run as a script (``python examples/NAME.py``, also
through ``scripts/submit.sh``), Python puts the example's directory first on ``sys.path``.
Importing it puts the repository on ``sys.path`` too, so that a checkout runs the examples
without installing sparktf. It runs on the driver only: what the executors run (an
example's build function) is pickled by value from the example itself, which is why no
build function may use this module.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))

from sparktf import cli, storage  # noqa: E402

log = logging.getLogger("sparktf.examples")


def parser(
    description: str,
    *,
    label: str,
    label_help: str,
    features: bool = True,
    epochs: float,
    batch_size: int,
) -> argparse.ArgumentParser:
    """The flags every example has: the CSV and its columns, the model directory, the
    output, the split, the training's size and ``--demo-rows``; ``features``: whether the
    feature columns may be named (``--features``)."""
    p = cli.parser(description)
    p.add_argument("--csv", required=True, help="input CSV with a header row")
    p.add_argument("--label", default=label, help=label_help)
    if features:
        p.add_argument(
            "--features",
            default=None,
            help="comma-separated feature columns (default: every numeric column but the label "
            "and id)",
        )
    p.add_argument("--model-dir", required=True, help="training model directory (local or hdfs://)")
    p.add_argument("--output", required=True, help="predictions of the held-out rows (Parquet)")
    p.add_argument("--test-fraction", type=float, default=0.25, help="rows held out")
    p.add_argument("--num-workers", type=int, default=2, help="training processes")
    p.add_argument("--epochs", type=float, default=epochs, help="passes over the training rows")
    p.add_argument("--batch-size", type=int, default=batch_size, help="global batch size")
    p.add_argument("--seed", type=int, default=0, help="split and shuffle seed")
    p.add_argument(
        "--demo-rows",
        type=int,
        default=0,
        help="first write a synthetic CSV of this many rows to --csv (0: read --csv as it is)",
    )
    return p


def estimator_params(args: argparse.Namespace, label: str | None = None) -> dict[str, Any]:
    """The flags of :func:`parser` as ``TFEstimator``'s Params (one thread per TensorFlow
    process: the examples share a small machine with Spark); ``label``: the label column
    trained on, when it is not ``--label`` itself (an indexed one)."""
    return {
        "modelDir": args.model_dir,
        "numWorkers": args.num_workers,
        "threadsPerWorker": 1,
        "epochs": args.epochs,
        "batchSize": args.batch_size,
        "seed": args.seed,
        "labelCol": label or args.label,
    }


def write_csv(path: str | Path, columns: Mapping[str, Sequence[Any]]) -> str:
    """A CSV of ``columns`` (name -> values, all of one length) with a header row; floats
    with six decimals. Returns its path."""

    def text(value: Any) -> str:
        return f"{value:.6f}" if isinstance(value, float) else str(value)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        f.write(",".join(columns) + "\n")
        for row in zip(*columns.values()):
            f.write(",".join(text(value) for value in row) + "\n")
    return str(path)


def read_csv(spark: Any, args: argparse.Namespace, write_demo: Callable[..., str], **demo: Any):
    """The rows of ``--csv``, first written by ``write_demo(path, rows=, seed=, **demo)``
    with ``--demo-rows``."""
    if args.demo_rows:
        write_demo(args.csv, rows=args.demo_rows, seed=args.seed, **demo)
        log.info("wrote a synthetic demo CSV of %d rows to %s", args.demo_rows, args.csv)
    return spark.read.csv(storage.spark_uri(args.csv), header=True, inferSchema=True)


def check_label(
    df: Any, args: argparse.Namespace, kind: type | None = None, what: str = ""
) -> None:
    """A usage error unless ``df`` has the ``--label`` column (of the Spark type ``kind``)."""
    if args.label not in df.columns or (
        kind is not None and not isinstance(df.schema[args.label].dataType, kind)
    ):
        raise cli.UsageError(f"{args.csv} has no {what}label column {args.label!r} ({df.columns})")


def feature_columns(df: Any, args: argparse.Namespace) -> list[str]:
    """``--features``, or every numeric column but the label and ``id``; a usage error when
    one is missing or there is none."""
    from pyspark.sql import types as T

    if args.features:
        features = [c.strip() for c in args.features.split(",") if c.strip()]
        missing = [c for c in features if c not in df.columns]
        if missing:
            raise cli.UsageError(f"{args.csv} has no column(s) {missing} ({df.columns})")
    else:
        features = [
            f.name
            for f in df.schema.fields
            if isinstance(f.dataType, T.NumericType) and f.name not in (args.label, "id")
        ]
    if not features:
        raise cli.UsageError(f"{args.csv} has no numeric feature columns")
    return features


def split(df: Any, args: argparse.Namespace) -> tuple[Any, Any]:
    """The training rows and the ``--test-fraction`` held out, drawn with ``--seed``."""
    return tuple(df.randomSplit([1.0 - args.test_fraction, args.test_fraction], seed=args.seed))


def write_predictions(spark: Any, scored: Any, args: argparse.Namespace) -> Any:
    """``scored`` written to ``--output`` (Parquet), read back."""
    scored.write.mode("overwrite").parquet(storage.spark_uri(args.output))
    return spark.read.parquet(storage.spark_uri(args.output))


def main(
    p: argparse.ArgumentParser,
    run: Callable[[argparse.Namespace, Any], dict],
    app_name: str,
    argv: Sequence[str] | None = None,
) -> int:
    """Parses ``argv``, starts the session ``app_name`` (``--profile``), runs the example and
    prints its summary (:func:`sparktf.cli.run_example`)."""
    from sparktf.spark import get_session

    def session(args: argparse.Namespace) -> Any:
        return get_session(app_name, profile=args.profile)

    return cli.run_example(p, run, session, argv)
