"""The command line of ``jobs/predict.py``: batch prediction with ``sparktf.inference``.

``--input`` is a split of a converted dataset (its ``parquet/`` directory, or the split
directory holding it) or any Parquet table. ``--export`` is a SavedModel version directory,
``MODEL_DIR/export`` or ``MODEL_DIR`` (the highest version is used). The output is Parquet
with ``id`` and ``label`` (when the input has them), the prediction columns of
``sparktf.predict`` (``prediction``, ``probability``, ...) and ``model_version``; it is
written to a temporary sibling and renamed into place, so ``--output`` holds either the
whole result or nothing.

Exit codes: 0 written; 2 the command line, the model or the input cannot work; 1 other
failures.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from sparktf import cli, storage

__all__ = ["DESCRIPTION", "KEEP_COLUMNS", "input_error", "input_table", "main", "parser"]

log = logging.getLogger(__name__)

DESCRIPTION = "Batch prediction: apply an exported model to a Parquet table, write the predictions."
KEEP_COLUMNS = ("id", "label")


def input_table(path: str) -> str:
    """The Parquet table at ``path``, or the ``parquet/`` directory of a dataset split."""
    if not storage.exists(path):
        raise cli.UsageError(f"input {path} does not exist")
    nested = storage.join(path, "parquet")
    return nested if storage.isdir(nested) else path


def parser(description: str = DESCRIPTION):
    p = cli.parser(description, config_section="predict")
    cli.add_export_flag(p)
    p.add_argument("--input", help="Parquet table or dataset split (local or hdfs://); required")
    p.add_argument(
        "--output", help="where to write the predictions as Parquet (local or hdfs://); required"
    )
    p.add_argument("--batch-size", type=int, default=128, help="rows per model call")
    p.add_argument(
        "--input-col",
        default=None,
        help="column fed to the model (default: image, tokens or z by model kind)",
    )
    p.add_argument(
        "--signature",
        default=None,
        help="signature to call (default: predict_images, else serving_default)",
    )
    p.add_argument(
        "--top-k",
        type=int,
        default=None,
        help="also write the k most likely classes and their probabilities",
    )
    p.add_argument(
        "--lm-output",
        default="perplexity",
        choices=["perplexity", "next_word"],
        help="language models: per-sequence perplexity or next-word log-probs",
    )
    p.add_argument(
        "--partitions",
        type=int,
        default=None,
        help="repartition the input into this many partitions (default: as read)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    return p


def main(argv: Sequence[str] | None = None, *, description: str = DESCRIPTION, spark=None) -> int:
    """jobs/predict.py on ``argv``; on the session ``spark`` when given (else its own)."""
    args = cli.parse(parser(description), argv, own_logging=spark is None)
    missing = [flag for flag in ("export", "input", "output") if not getattr(args, flag)]
    if missing:
        raise cli.UsageError("missing " + ", ".join(f"--{m}" for m in missing))
    if args.batch_size < 1:
        raise cli.UsageError(f"--batch-size must be >= 1, got {args.batch_size}")

    from sparktf import inference

    # Everything that can be checked without Spark is checked before it starts.
    if storage.exists(args.output) and not args.overwrite:
        raise cli.UsageError(f"output {args.output} already exists; pass --overwrite to replace it")
    try:
        info = inference.inspect_export(args.export)
    except inference.ModelNotFoundError as exc:
        raise cli.UsageError(str(exc)) from None
    table = input_table(args.input)
    log.info(
        "model %s (version %s); input %s; output %s", info.uri, info.version, table, args.output
    )

    from pyspark.sql import functions as F

    from sparktf.spark import job_session, stage_progress

    with job_session("sparktf-predict", args.profile, spark=spark, remote=args.remote) as spark:
        start = time.monotonic()
        df = spark.read.parquet(storage.spark_uri(table))
        if args.partitions:
            df = df.repartition(args.partitions)
        # Only the kept columns (and what the model reads) travel through the Python workers.
        keep = [c for c in KEEP_COLUMNS if c in df.columns]
        try:
            result = inference.predict(
                df,
                info.uri,
                input_col=args.input_col,
                batch_size=args.batch_size,
                signature=args.signature,
                top_k=args.top_k,
                lm_output=args.lm_output,
                keep_columns=keep,
            )
        except inference.PredictInputError as exc:
            raise cli.UsageError(f"input {table}: {exc}") from None
        added = [c for c in result.columns if c not in keep]
        out = result.select(*keep, *added, F.lit(info.version).cast("long").alias("model_version"))
        with (
            storage.publish(args.output, overwrite=args.overwrite) as tmp,
            stage_progress(spark),
        ):
            try:
                out.write.parquet(storage.spark_uri(tmp))
            except Exception as exc:
                reason = input_error(exc)
                if reason:
                    raise cli.UsageError(f"input {table}: {reason}") from None
                raise
        rows = spark.read.parquet(storage.spark_uri(args.output)).count()  # from the footers
        elapsed = time.monotonic() - start
        log.info(
            "wrote %d predictions to %s in %.1f s (%.0f rows/s)",
            rows,
            args.output,
            elapsed,
            rows / max(elapsed, 1e-9),
        )
    return 0


def input_error(exc: BaseException) -> str | None:
    """The PredictInputError message inside a failed Spark action's exception, if any."""
    marker = "PredictInputError: "
    for line in str(exc).splitlines():
        if marker in line:
            return line.split(marker, 1)[1].strip()
    return None
