"""The command line of ``jobs/evaluate.py``: an exported model measured on a dataset split.

``--export`` is a SavedModel version directory, ``MODEL_DIR/export`` or ``MODEL_DIR`` (the
highest version is used); ``--data`` a converted dataset (``manifest.json`` +
``<split>/parquet/``, see docs/datasets.md), local or ``hdfs://``. The split's Parquet goes
through :func:`sparktf.inference.predict` on the executors, and the predictions are
aggregated there too (Spark aggregations: only the aggregates reach the driver):

* an **image classifier** (a ``predict_images`` signature, ``classes`` and ``scores``): one
  ``groupBy(label, prediction)`` gives the confusion matrix (rows = true labels) and, per
  cell, how many labels were among the 5 most likely classes (``top_k`` of predict).
  :mod:`sparktf.metrics` turns them into accuracy, top-5 accuracy, per-class precision,
  recall, F1 and their macro averages; the confusion matrix is also drawn as a PNG beside
  the JSON (``<output stem>.confusion.png``).
* the **language model** (``log_probs``): per record, predict's ``perplexity`` over its
  ``seq_len - 1`` predicted tokens (each record read from a zero LSTM state, so the first
  token of a record is context only); the total negative log-likelihood is
  ``sum((seq_len - 1) * log(perplexity))`` and the corpus perplexity
  ``exp(total NLL / total predicted tokens)``: token-weighted, not the mean of the
  per-record perplexities.
* a **generator** (DCGAN) has no labels to be measured against: refused (exit 2).

The metrics are written as JSON (local or ``hdfs://``) through ``storage.publish``: a
temporary sibling renamed into place, so ``--output`` holds a complete file or nothing; the
PNG is published first, so a JSON that exists has its PNG. An existing output is refused
without ``--overwrite``. A summary is printed on stdout.

Exit codes: 0 written; 2 the command line, the model or the data cannot work (a missing
model, dataset or split, a model kind that cannot be evaluated, a model that does not fit
the data: image shape, classes, vocabulary; a bad record); 1 other failures.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import posixpath
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from sparktf import cli, metrics, storage
from sparktf.datasets import formats
from sparktf.errors import SparktfRuntimeError

__all__ = [
    "CLASSIFIER",
    "DESCRIPTION",
    "LANGUAGE_MODEL",
    "Plan",
    "TOP_K",
    "confusion_png_path",
    "evaluate",
    "jvm_error",
    "main",
    "model_kind",
    "outputs",
    "parser",
    "prepare",
    "summary",
    "write_report",
]

if TYPE_CHECKING:  # pragma: no cover - typing only
    from pyspark.sql import SparkSession

    from sparktf.inference import ExportInfo

log = logging.getLogger(__name__)

DESCRIPTION = (
    "Evaluate an exported model on a dataset split: accuracy, top-5, per-class precision/"
    "recall/F1 and the confusion matrix for classifiers, corpus perplexity for the language "
    "model; written as JSON."
)
TOP_K = 5
CLASSIFIER = "classifier"
LANGUAGE_MODEL = "language_model"


@dataclasses.dataclass(frozen=True)
class Plan:
    """What an evaluation needs, found and checked without Spark (see :func:`prepare`)."""

    kind: str  # CLASSIFIER or LANGUAGE_MODEL
    model: ExportInfo
    signature: str
    data: str
    manifest: dict
    split: str
    table: str  # the split's Parquet directory
    num_classes: int | None = None  # classifier: the model's
    seq_len: int | None = None  # language model: tokens per record

    @property
    def records(self) -> int | None:
        return self.manifest["splits"][self.split].get("records")


def model_kind(info: ExportInfo) -> tuple[str, str]:
    """``(kind, signature)`` of an exported model, from its signatures; UsageError for a
    generator or anything else that cannot be evaluated against labels or text."""
    sigs = info.signatures
    image = sigs.get("predict_images")
    if image is not None and {"classes", "scores"} <= set(image.outputs):
        return CLASSIFIER, image.name
    for sig in sigs.values():
        if "log_probs" in sig.outputs and "tokens" in sig.inputs:
            return LANGUAGE_MODEL, sig.name
    if any("images" in s.outputs and "z" in s.inputs for s in sigs.values()):
        raise cli.UsageError(
            f"model {info.uri} is a generator (DCGAN: z -> images): evaluation needs a "
            "classifier (predict_images -> classes, scores) or a language model "
            "(tokens -> log_probs); a generator's samples have no labels to be measured against"
        )
    described = "; ".join(s.describe() for s in sigs.values()) or "none"
    raise cli.UsageError(
        f"model {info.uri} can be evaluated neither as an image classifier (predict_images "
        f"-> classes, scores) nor as a language model (tokens -> log_probs): its signatures "
        f"are {described}"
    )


def prepare(model: str, data: str, split: str) -> Plan:
    """Resolves the model and the dataset and checks that they fit each other, reading only
    ``saved_model.pb`` and ``manifest.json`` (no Spark, no model weights): a mismatch fails
    here, before any executor starts. Raises :class:`sparktf.cli.UsageError`."""
    from sparktf import inference

    try:
        info = inference.inspect_export(model)
    except inference.ModelNotFoundError as exc:
        raise cli.UsageError(str(exc)) from None
    kind, signature = model_kind(info)
    try:
        manifest = formats.load_manifest(data)
    except formats.ManifestError as exc:
        raise cli.UsageError(f"--data: {exc}") from None
    splits = manifest["splits"]
    if split not in splits:
        raise cli.UsageError(
            f"dataset {data} has no split {split!r}; it has {', '.join(splits)} (--split)"
        )
    if formats.PARQUET not in manifest["formats"]:
        raise cli.UsageError(
            f"dataset {data} was written without Parquet (it has "
            f"{', '.join(manifest['formats'])}): convert it again with --format parquet"
        )
    rel = splits[split].get(formats.PARQUET, {}).get("dir", f"{split}/{formats.PARQUET}")
    table = storage.join(data, rel)
    if not storage.isdir(table):
        raise cli.UsageError(f"dataset {data}: the Parquet of split {split!r} ({table}) is missing")
    schema = manifest["schema"]
    sig = info.signatures[signature]
    name = f"dataset {data} ({manifest['dataset']})"
    if kind == CLASSIFIER:
        if "image" not in schema or "label" not in schema:
            raise cli.UsageError(
                f"model {info.uri} is an image classifier but {name} holds no labelled images "
                f"(its columns are {', '.join(schema)})"
            )
        want = tuple(sig.inputs["images"].shape[1:])
        have = tuple(schema["image"].get("shape", ()))
        if want != have:
            raise cli.UsageError(
                f"model {info.uri} takes images of shape {want} but {name} holds images of "
                f"shape {have}: evaluate a model trained on this dataset"
            )
        num_classes = sig.outputs["scores"].shape[-1]
        data_classes = schema["label"].get("num_classes")
        if num_classes is not None and data_classes is not None and data_classes > num_classes:
            raise cli.UsageError(
                f"model {info.uri} predicts {num_classes} classes but {name} has "
                f"{data_classes} classes"
            )
        return Plan(
            CLASSIFIER, info, signature, data, manifest, split, table, num_classes=num_classes
        )
    if "tokens" not in schema or manifest.get("kind") != "text":
        raise cli.UsageError(
            f"model {info.uri} is a language model but {name} holds no token sequences "
            f"(its columns are {', '.join(schema)})"
        )
    vocab = sig.outputs["log_probs"].shape[-1] if sig.outputs["log_probs"].shape else None
    data_vocab = manifest.get("text", {}).get("vocab_size")
    if vocab is not None and data_vocab is not None and data_vocab > vocab:
        raise cli.UsageError(
            f"model {info.uri} has a vocabulary of {vocab} words but {name} has "
            f"{data_vocab}: evaluate a model trained on this dataset's vocabulary"
        )
    shape = schema["tokens"].get("shape") or [manifest.get("text", {}).get("seq_len")]
    seq_len = shape[0]
    if not isinstance(seq_len, int) or seq_len < 2:
        raise cli.UsageError(
            f"{name}: records of {seq_len} tokens; perplexity needs at least 2 per record"
        )
    return Plan(LANGUAGE_MODEL, info, signature, data, manifest, split, table, seq_len=seq_len)


def evaluate(
    spark: SparkSession,
    model: str,
    data: str,
    *,
    split: str = "test",
    batch_size: int = 128,
    plan: Plan | None = None,
) -> dict:
    """Evaluates ``model`` on split ``split`` of the dataset ``data`` with ``spark``; returns
    the metrics as a JSON-ready dict (see the module docstring). ``plan``: the result of
    :func:`prepare` when the caller has it already. Raises :class:`sparktf.cli.UsageError`
    when the model and the data do not fit (also for a bad record found on an executor)."""
    if batch_size < 1:
        raise cli.UsageError(f"--batch-size must be >= 1, got {batch_size}")
    plan = plan or prepare(model, data, split)
    from sparktf.spark import stage_progress

    log.info(
        "evaluating %s %s (version %s) on split %r of %s: %s records from %s",
        plan.kind.replace("_", " "),
        plan.model.uri,
        plan.model.version,
        plan.split,
        plan.data,
        plan.records if plan.records is not None else "?",
        plan.table,
    )
    started = time.monotonic()
    df = spark.read.parquet(storage.spark_uri(plan.table))
    with stage_progress(spark):
        if plan.kind == CLASSIFIER:
            result = _classifier(df, plan, batch_size)
        else:
            result = _language_model(df, plan, batch_size)
    elapsed = time.monotonic() - started
    examples = result.get("examples", result.get("sequences"))
    if plan.records is not None and examples != plan.records:
        log.warning(
            "evaluated %d records but the manifest of %s counts %d in split %r",
            examples,
            plan.data,
            plan.records,
            plan.split,
        )
    log.info("evaluated %d records in %.1f s", examples, elapsed)
    return {
        "kind": plan.kind,
        "model": plan.model.uri,
        "model_version": plan.model.version,
        "data": plan.data,
        "dataset": plan.manifest["dataset"],
        "split": plan.split,
        **result,
        "batch_size": batch_size,
        "elapsed_s": round(elapsed, 3),
    }


def _predicted(df, plan: Plan, batch_size: int, columns: Sequence[str], **kwargs) -> Any:
    from sparktf import inference

    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise cli.UsageError(
            f"{plan.table}: columns {missing} are missing (it has {df.columns}); "
            "not a split of a converted dataset?"
        )
    keep = [c for c in ("id", *columns) if c in df.columns]
    try:
        return inference.predict(
            df.select(*dict.fromkeys(keep)),
            plan.model.uri,
            batch_size=batch_size,
            signature=plan.signature,
            **kwargs,
        )
    except inference.PredictInputError as exc:
        raise cli.UsageError(f"{plan.table}: {exc}") from None


def _collect(frame, plan: Plan) -> list:
    """``frame.collect()``; a bad record found on an executor becomes a UsageError, any
    other failed Spark job a RuntimeError naming the task's error in one line (the whole
    Spark text stays at debug level)."""
    from sparktf.jobs.predict import input_error
    from sparktf.spark import is_spark_error, spark_failure

    try:
        return frame.collect()
    except Exception as exc:
        reason = input_error(exc)
        if reason:
            raise cli.UsageError(f"{plan.table}: {reason}") from None
        if is_spark_error(exc):
            log.debug("the failed Spark job", exc_info=True)
            what = f"evaluating {plan.model.uri} on {plan.table}"
            reason = jvm_error(str(exc))
            if reason:
                raise SparktfRuntimeError(f"{what} failed: {reason}") from None
            raise spark_failure(what, exc) from None
        raise


def jvm_error(text: str) -> str | None:
    """The JVM's own error in a Py4J error text, in one line, when the job failed in the
    JVM (e.g. a Parquet file that cannot be read) rather than in Python: the exception Py4J
    reports and its root cause (the last ``Caused by:``). ``None`` when the text holds a
    Python error (``sparktf.spark.task_error`` names that one)."""
    if "PythonException" in text:
        return None
    lines = [line.strip() for line in text.splitlines()]
    top = next((line[1:].strip() for line in lines if line.startswith(": ")), None)
    if not top:
        return None
    causes = [line[len("Caused by:") :].strip() for line in lines if line.startswith("Caused by:")]
    reason = _short_java_error(top)
    if causes:
        reason += f" (caused by {_short_java_error(causes[-1])})"
    return reason


def _short_java_error(line: str) -> str:
    """``org.apache.x.SomeException: message`` -> ``SomeException: message``."""
    name, sep, message = line.partition(": ")
    return name.rsplit(".", 1)[-1] + sep + message


def _classifier(df, plan: Plan, batch_size: int) -> dict:
    from pyspark.sql import functions as F

    num_classes = plan.num_classes
    k = min(TOP_K, num_classes) if num_classes else TOP_K
    predicted = _predicted(df, plan, batch_size, ("image", "label"), top_k=k)
    cells = predicted.groupBy("label", "prediction").agg(
        F.count(F.lit(1)).alias("count"),
        F.sum(F.array_contains("top_classes", F.col("label")).cast("long")).alias("top_k"),
    )
    rows = _collect(cells, plan)
    if num_classes is None:  # a model with an unknown class count: as many as it predicted
        num_classes = 1 + max([r["prediction"] for r in rows] + [0])
    nulls = sum(r["count"] for r in rows if r["label"] is None)
    if nulls:
        raise cli.UsageError(f"{plan.table}: {nulls} records have a null label")
    bad = sorted({r["label"] for r in rows if not 0 <= r["label"] < num_classes})
    if bad:
        raise cli.UsageError(
            f"{plan.table}: labels {bad[:10]} are outside the model's {num_classes} classes "
            f"[0, {num_classes}): the model does not fit this dataset"
        )
    if not rows:
        raise cli.UsageError(f"{plan.table}: split {plan.split!r} holds no records")
    confusion = metrics.confusion_matrix(
        [r["label"] for r in rows],
        [r["prediction"] for r in rows],
        num_classes,
        counts=[r["count"] for r in rows],
    )
    top_k_correct = sum(int(r["top_k"] or 0) for r in rows)
    # top_k = min(5, classes): with fewer than 5 classes every label is among the top 5.
    return metrics.classification_metrics(confusion, top_k_correct=top_k_correct, top_k=TOP_K)


def _language_model(df, plan: Plan, batch_size: int) -> dict:
    from pyspark.sql import functions as F

    predicted = _predicted(df, plan, batch_size, ("tokens",), lm_output="perplexity")
    per_record = plan.seq_len - 1  # tokens[1:] predicted from tokens[:-1]
    totals = predicted.agg(
        F.count(F.lit(1)).alias("sequences"),
        F.sum(F.log("prediction") * F.lit(float(per_record))).alias("nll"),
    )
    (row,) = _collect(totals, plan)
    sequences = int(row["sequences"])
    if not sequences:
        raise cli.UsageError(f"{plan.table}: split {plan.split!r} holds no records")
    tokens = sequences * per_record
    nll = float(row["nll"])
    return {
        "sequences": sequences,
        "tokens": tokens,
        "tokens_per_sequence": per_record,
        "total_nll": nll,
        "cross_entropy": nll / tokens,
        "perplexity": metrics.corpus_perplexity(nll, tokens),
    }


def confusion_png_path(output: str) -> str:
    """Where the confusion-matrix PNG of ``output`` goes: ``<output stem>.confusion.png``
    beside it (``out/metrics.json`` -> ``out/metrics.confusion.png``)."""
    root, ext = posixpath.splitext(output)
    return (root if ext.lower() == ".json" else output) + ".confusion.png"


def outputs(result_kind: str, output: str) -> list[str]:
    """The files an evaluation of ``result_kind`` writes for ``output``."""
    return [confusion_png_path(output), output] if result_kind == CLASSIFIER else [output]


def write_report(result: dict, output: str, *, overwrite: bool = False) -> list[str]:
    """Publishes the metrics JSON (and a classifier's confusion-matrix PNG, first) at
    ``output``, local or ``hdfs://``; returns the paths written."""
    loc = storage.parse(output)
    parent = storage.Location(loc.scheme, loc.netloc, posixpath.dirname(loc.path)).uri
    storage.makedirs(parent)
    written = []
    report = dict(result)
    if result["kind"] == CLASSIFIER:
        png = confusion_png_path(output)
        import numpy as np

        image = metrics.confusion_matrix_png(
            np.asarray(result["confusion_matrix"], dtype=np.int64),
            title=(
                f"{result['dataset']} {result['split']}: {result['examples']} examples, "
                f"accuracy {result['accuracy']:.4f}"
            ),
        )
        with storage.publish(png, overwrite=overwrite) as tmp:
            storage.write_bytes(tmp, image)
        written.append(png)
        report["confusion_png"] = png
    with storage.publish(output, overwrite=overwrite) as tmp:
        storage.write_text(tmp, json.dumps(report, indent=2) + "\n")
    written.append(output)
    return written


def summary(result: dict) -> str:
    """A few lines for a person: the headline numbers of ``result``."""
    head = (
        f"{result['model']} (version {result['model_version']}) on {result['dataset']} "
        f"{result['split']}:"
    )
    if result["kind"] == LANGUAGE_MODEL:
        return (
            f"{head} perplexity {result['perplexity']:.3f} over {result['tokens']} tokens "
            f"({result['sequences']} sequences; cross-entropy {result['cross_entropy']:.4f} "
            "nats/token)"
        )
    lines = [
        f"{head} accuracy {result['accuracy']:.4f}, top-{TOP_K} "
        f"{result[f'top_{TOP_K}_accuracy']:.4f} over {result['examples']} examples; macro "
        f"precision {result['macro_precision']:.4f}, recall {result['macro_recall']:.4f}, "
        f"F1 {result['macro_f1']:.4f}",
        "class  precision  recall     f1  support",
    ]
    lines += [
        f"{c['class']:>5}  {c['precision']:9.4f}  {c['recall']:6.4f}  {c['f1']:5.4f}  "
        f"{c['support']:7d}"
        for c in result["per_class"]
    ]
    return "\n".join(lines)


def parser(description: str = DESCRIPTION):
    p = cli.parser(description, config_section="evaluate")
    cli.add_export_flag(p)
    p.add_argument(
        "--data", help="converted dataset directory (manifest.json; local or hdfs://); required"
    )
    p.add_argument("--split", default="test", help="split of the dataset to evaluate on")
    p.add_argument(
        "--output",
        default="metrics.json",
        help="metrics JSON to write (local or hdfs://); a classifier's confusion matrix "
        "goes beside it as <stem>.confusion.png",
    )
    p.add_argument("--batch-size", type=int, default=128, help="rows per model call")
    p.add_argument("--overwrite", action="store_true", help="replace an existing --output")
    return p


def main(argv: Sequence[str] | None = None, *, description: str = DESCRIPTION, spark=None) -> int:
    """jobs/evaluate.py on ``argv``; on the session ``spark`` when given (else its own)."""
    args = cli.parse(parser(description), argv, own_logging=spark is None)
    missing = [flag for flag in ("export", "data", "output") if not getattr(args, flag)]
    if missing:
        raise cli.UsageError("missing " + ", ".join(f"--{m}" for m in missing))
    if args.batch_size < 1:
        raise cli.UsageError(f"--batch-size must be >= 1, got {args.batch_size}")
    # Everything that can be checked without Spark is checked before it starts.
    plan = prepare(args.export, args.data, args.split)
    if not args.overwrite:
        for path in outputs(plan.kind, args.output):
            if storage.exists(path):
                raise cli.UsageError(
                    f"output {path} already exists; pass --overwrite to replace it"
                )

    from sparktf.spark import job_session

    with job_session("sparktf-evaluate", args.profile, spark=spark, remote=args.remote) as session:
        result = evaluate(
            session, args.export, args.data, split=args.split, batch_size=args.batch_size, plan=plan
        )
    written = write_report(result, args.output, overwrite=args.overwrite)
    log.info("wrote %s", " and ".join(written))
    print(summary(result), flush=True)
    return 0
