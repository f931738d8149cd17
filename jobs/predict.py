"""Batch prediction: apply an exported model to a Parquet table, write the predictions.

    jobs/predict.py --model hdfs://nn:8020/models/resnet20/export \\
        --input hdfs://nn:8020/data/cifar10/test/parquet \\
        --output hdfs://nn:8020/predictions/cifar10-test [--batch-size 256]

``--input`` is a split of a converted dataset (its ``parquet/`` directory, or the split
directory holding it) or any Parquet table. ``--model`` is a SavedModel version directory,
``MODEL_DIR/export`` or ``MODEL_DIR`` (the highest version is used). The output is Parquet
with ``id`` and ``label`` (when the input has them), the prediction columns of
``sparktf.predict`` (``prediction``, ``probabilities``, ...) and ``model_version``; it is
written to a temporary sibling and renamed into place, so ``--output`` holds either the
whole result or nothing.
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Iterator, Sequence

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from sparktf import cli, storage  # noqa: E402

log = logging.getLogger("sparktf.jobs.predict")
KEEP_COLUMNS = ("id", "label")


def spark_path(path: str) -> str:
    """``path`` as Spark must see it: local paths as ``file://`` URIs, so that a
    ``fs.defaultFS`` of HDFS in the Hadoop configuration does not redirect them."""
    loc = storage.parse(path)
    return "file://" + loc.path if loc.scheme == "file" else loc.uri


def input_table(path: str) -> str:
    """The Parquet table at ``path``, or the ``parquet/`` directory of a dataset split."""
    if not storage.exists(path):
        raise cli.UsageError(f"input {path} does not exist")
    nested = storage.join(path, "parquet")
    return nested if storage.isdir(nested) else path


@contextlib.contextmanager
def progress(spark, every_s: float = 15.0) -> Iterator[None]:
    """Logs the running stages' task counts every ``every_s`` seconds."""
    tracker = spark.sparkContext.statusTracker()
    done = threading.Event()

    def report() -> None:
        while not done.wait(every_s):
            for stage_id in tracker.getActiveStageIds():
                info = tracker.getStageInfo(stage_id)
                if info is not None:
                    log.info("stage %d: %d of %d tasks done", stage_id, info.numCompletedTasks,
                             info.numTasks)

    thread = threading.Thread(target=report, name="progress", daemon=True)
    thread.start()
    try:
        yield
    finally:
        done.set()
        thread.join()


def parser():
    p = cli.parser(__doc__.split("\n")[0], config_section="predict")
    p.add_argument("--model", help="SavedModel directory, MODEL_DIR/export or MODEL_DIR "
                                   "(local, file:// or hdfs://); required")
    p.add_argument("--input", help="Parquet table or dataset split (local or hdfs://); required")
    p.add_argument("--output", help="where to write the predictions as Parquet (local or "
                                    "hdfs://); required")
    p.add_argument("--batch-size", type=int, default=128, help="rows per model call")
    p.add_argument("--input-col", default=None,
                   help="column fed to the model (default: image, tokens or z by model kind)")
    p.add_argument("--signature", default=None,
                   help="signature to call (default: predict_images, else serving_default)")
    p.add_argument("--top-k", type=int, default=None,
                   help="also write the k most likely classes and their probabilities")
    p.add_argument("--lm-output", default="perplexity", choices=["perplexity", "next_word"],
                   help="language models: per-sequence perplexity or next-word log-probs")
    p.add_argument("--partitions", type=int, default=None,
                   help="repartition the input into this many partitions (default: as read)")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = cli.parse(parser(), argv)
    missing = [flag for flag in ("model", "input", "output") if not getattr(args, flag)]
    if missing:
        raise cli.UsageError("missing " + ", ".join(f"--{m}" for m in missing))
    if args.batch_size < 1:
        raise cli.UsageError(f"--batch-size must be >= 1, got {args.batch_size}")

    from sparktf import inference

    # Everything that can be checked without Spark is checked before it starts.
    if storage.exists(args.output) and not args.overwrite:
        raise cli.UsageError(f"output {args.output} already exists; pass --overwrite to "
                             "replace it")
    try:
        info = inference.inspect_model(args.model)
    except inference.ModelNotFoundError as exc:
        raise cli.UsageError(str(exc)) from None
    table = input_table(args.input)
    log.info("model %s (version %s); input %s; output %s", info.uri, info.version, table,
             args.output)

    from pyspark.sql import functions as F

    from sparktf.spark import get_session

    spark = get_session("sparktf-predict", profile=args.profile)
    start = time.monotonic()
    try:
        df = spark.read.parquet(spark_path(table))
        if args.partitions:
            df = df.repartition(args.partitions)
        try:
            result = inference.predict(
                df, info.uri, input_col=args.input_col, batch_size=args.batch_size,
                signature=args.signature, top_k=args.top_k, lm_output=args.lm_output)
        except inference.PredictInputError as exc:
            raise cli.UsageError(f"input {table}: {exc}") from None
        added = [c for c in result.columns if c not in df.columns]
        keep = [c for c in KEEP_COLUMNS if c in df.columns]
        out = result.select(*keep, *added,
                            F.lit(info.version).cast("long").alias("model_version"))
        with storage.publish(args.output, overwrite=args.overwrite) as tmp, progress(spark):
            try:
                out.write.parquet(spark_path(tmp))
            except Exception as exc:
                reason = input_error(exc)
                if reason:
                    raise cli.UsageError(f"input {table}: {reason}") from None
                raise
        rows = spark.read.parquet(spark_path(args.output)).count()  # from the footers
        elapsed = time.monotonic() - start
        log.info("wrote %d predictions to %s in %.1f s (%.0f rows/s)", rows, args.output,
                 elapsed, rows / max(elapsed, 1e-9))
    finally:
        spark.stop()
    return 0


def input_error(exc: BaseException) -> str | None:
    """The PredictInputError message inside a failed Spark action's exception, if any."""
    marker = "PredictInputError: "
    for line in str(exc).splitlines():
        if marker in line:
            return line.split(marker, 1)[1].strip()
    return None


if __name__ == "__main__":
    cli.run(main)
