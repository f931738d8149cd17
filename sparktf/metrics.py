"""Evaluation metrics from aggregated counts: pure numpy, plus the confusion-matrix PNG.

The evaluation job (``jobs/evaluate.py``, :mod:`sparktf.jobs.evaluate`) aggregates the
predictions on the Spark executors and hands this module only the small aggregates: the
confusion matrix (``num_classes`` x ``num_classes`` counts) and the top-k hit count of a
classifier, the summed negative log-likelihood and token count of a language model. The
functions here turn those into the reported numbers, so that they can be checked (and
reused) without Spark or TensorFlow:

* :func:`confusion_matrix` — counts from (label, prediction[, count]) pairs; rows are the
  true labels, columns the predictions;
* :func:`classification_metrics` — accuracy, top-k accuracy, per-class precision, recall,
  F1 and support, and their macro averages;
* :func:`corpus_perplexity` — ``exp(total NLL / total predicted tokens)``: token-weighted,
  as the book's 11.2 reports it (not the mean of per-sequence perplexities);
* :func:`confusion_matrix_png` — the confusion matrix drawn with matplotlib (Agg, no
  display needed), as PNG bytes.

Conventions (those of scikit-learn's defaults): a class never predicted has precision 0, a
class that never occurs as a label has recall 0, F1 is 0 when precision and recall are both
0; the macro averages are the unweighted means over the classes that occur as a label or
as a prediction (a class absent from both says nothing about the model and is left out).
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable, Sequence

import numpy as np

from sparktf.errors import SparktfValueError

__all__ = [
    "ANNOTATE_MAX_CLASSES",
    "PNG_MAGIC",
    "classification_metrics",
    "confusion_matrix",
    "confusion_matrix_png",
    "corpus_perplexity",
    "per_class_scores",
]

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Up to this many classes every cell of the PNG shows its count; above, only the colours.
ANNOTATE_MAX_CLASSES = 30


def confusion_matrix(
    labels: Iterable[int] | np.ndarray,
    predictions: Iterable[int] | np.ndarray,
    num_classes: int,
    counts: Iterable[int] | np.ndarray | None = None,
) -> np.ndarray:
    """The int64 ``[num_classes, num_classes]`` matrix whose cell (t, p) counts the examples
    of true label t predicted as p. ``counts``: how many examples each (label, prediction)
    pair stands for (default one each), e.g. the rows of a Spark ``groupBy().count()``.

    Raises ValueError naming the first label or prediction outside [0, num_classes).
    """
    labels = np.asarray(list(labels) if not isinstance(labels, np.ndarray) else labels)
    predictions = np.asarray(
        list(predictions) if not isinstance(predictions, np.ndarray) else predictions
    )
    if labels.shape != predictions.shape or labels.ndim != 1:
        raise SparktfValueError(
            f"labels and predictions must be 1-D and of one length, got shapes "
            f"{labels.shape} and {predictions.shape}"
        )
    if counts is None:
        weights = np.ones(len(labels), np.int64)
    else:
        weights = np.asarray(list(counts) if not isinstance(counts, np.ndarray) else counts)
        if weights.shape != labels.shape:
            raise SparktfValueError(f"counts has shape {weights.shape}, labels {labels.shape}")
    if num_classes < 1:
        raise SparktfValueError(f"num_classes must be >= 1, got {num_classes}")
    for name, values in (("label", labels), ("prediction", predictions)):
        if len(values) and values.dtype.kind not in "iu":
            raise SparktfValueError(f"{name}s must be integers, got dtype {values.dtype}")
        bad = (values < 0) | (values >= num_classes)
        if bad.any():
            raise SparktfValueError(
                f"{name} {int(values[np.flatnonzero(bad)[0]])} is outside [0, {num_classes})"
            )
    matrix = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(matrix, (labels.astype(np.int64), predictions.astype(np.int64)), weights)
    return matrix


def per_class_scores(confusion: np.ndarray) -> dict[str, np.ndarray]:
    """Per class (index = class): ``precision``, ``recall``, ``f1`` (float64), ``support``
    (examples with that label) and ``predicted`` (examples predicted as it), int64."""
    confusion = _square(confusion)
    hits = np.diag(confusion).astype(np.float64)
    support = confusion.sum(axis=1)
    predicted = confusion.sum(axis=0)
    precision = np.divide(hits, predicted, out=np.zeros_like(hits), where=predicted > 0)
    recall = np.divide(hits, support, out=np.zeros_like(hits), where=support > 0)
    total = precision + recall
    f1 = np.divide(2 * precision * recall, total, out=np.zeros_like(hits), where=total > 0)
    return {
        "precision": precision,
        "recall": recall,
        "f1": f1,
        "support": support,
        "predicted": predicted,
    }


def classification_metrics(
    confusion: np.ndarray,
    *,
    top_k_correct: int | None = None,
    top_k: int = 5,
    class_names: Sequence[str] | None = None,
) -> dict:
    """The metrics of a classifier from its confusion matrix (rows = true labels), as a
    JSON-ready dict:

    ``examples``, ``accuracy``, ``top_<k>_accuracy`` (when ``top_k_correct``, the number of
    examples whose label is among their ``top_k`` most likely classes, is given),
    ``macro_precision``, ``macro_recall``, ``macro_f1`` (over the classes that occur, see
    the module docstring), ``per_class`` (one entry per class: ``class``, ``name`` when
    ``class_names`` is given, ``precision``, ``recall``, ``f1``, ``support``,
    ``predicted``) and ``confusion_matrix`` (a list of rows).

    Raises ValueError for an empty matrix (no examples: nothing to measure).
    """
    confusion = _square(confusion)
    examples = int(confusion.sum())
    if examples == 0:
        raise SparktfValueError("the confusion matrix holds no examples: nothing to evaluate")
    scores = per_class_scores(confusion)
    present = (scores["support"] > 0) | (scores["predicted"] > 0)
    if class_names is not None and len(class_names) != len(confusion):
        raise SparktfValueError(f"{len(class_names)} class names for {len(confusion)} classes")
    out: dict = {
        "examples": examples,
        "accuracy": float(np.trace(confusion) / examples),
    }
    if top_k_correct is not None:
        if not 0 <= top_k_correct <= examples:
            raise SparktfValueError(f"top_k_correct {top_k_correct} is outside [0, {examples}]")
        out[f"top_{top_k}_accuracy"] = float(top_k_correct / examples)
    for name in ("precision", "recall", "f1"):
        out[f"macro_{name}"] = float(scores[name][present].mean())
    out["per_class"] = [
        {
            "class": c,
            **({"name": class_names[c]} if class_names is not None else {}),
            "precision": float(scores["precision"][c]),
            "recall": float(scores["recall"][c]),
            "f1": float(scores["f1"][c]),
            "support": int(scores["support"][c]),
            "predicted": int(scores["predicted"][c]),
        }
        for c in range(len(confusion))
    ]
    out["confusion_matrix"] = confusion.astype(np.int64).tolist()
    return out


def corpus_perplexity(total_nll: float, total_tokens: int) -> float:
    """``exp(total_nll / total_tokens)``: the perplexity of a corpus whose predicted tokens
    have summed negative log-likelihood ``total_nll`` (nats). Every token weighs the same,
    so this is not the mean of per-sequence perplexities (which weighs sequences and is
    pulled up by the worst ones); ``inf`` when the mean NLL overflows ``exp``."""
    if total_tokens <= 0:
        raise SparktfValueError(
            f"no predicted tokens (total_tokens={total_tokens}): nothing to evaluate"
        )
    mean = float(total_nll) / int(total_tokens)
    if math.isnan(mean):
        raise SparktfValueError("the total negative log-likelihood is NaN")
    try:
        return math.exp(mean)
    except OverflowError:
        return math.inf


def confusion_matrix_png(
    confusion: np.ndarray,
    *,
    class_names: Sequence[str] | None = None,
    title: str | None = None,
) -> bytes:
    """The confusion matrix as PNG bytes: rows are the true labels, columns the predicted
    classes; a cell's colour is its share of its row (the recall of the class on the
    diagonal), so that rare classes read as clearly as frequent ones; up to
    ``ANNOTATE_MAX_CLASSES`` classes each cell also shows its count. Drawn with
    matplotlib's Agg canvas (no display, no global pyplot state)."""
    confusion = _square(confusion)
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    n = len(confusion)
    names = list(class_names) if class_names is not None else [str(c) for c in range(n)]
    rows = confusion.sum(axis=1, keepdims=True)
    share = np.divide(
        confusion, rows, out=np.zeros(confusion.shape, np.float64), where=rows > 0
    ).astype(np.float64)
    side = min(4.0 + 0.45 * n, 40.0)
    fig = Figure(figsize=(side + 1.5, side), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(share, cmap="Blues", vmin=0.0, vmax=1.0, interpolation="nearest")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="share of the true class")
    if n <= ANNOTATE_MAX_CLASSES:
        ticks = np.arange(n)
        ax.set_xticks(ticks, labels=names, rotation=90 if n > 10 else 0)
        ax.set_yticks(ticks, labels=names)
        size = max(5.0, 10.0 - n / 5)
        for t in range(n):
            for p in range(n):
                ax.text(
                    p,
                    t,
                    str(int(confusion[t, p])),
                    ha="center",
                    va="center",
                    fontsize=size,
                    color="white" if share[t, p] > 0.5 else "black",
                )
    ax.set_xlabel("predicted class")
    ax.set_ylabel("true label")
    total = int(confusion.sum())
    accuracy = np.trace(confusion) / total if total else 0.0
    ax.set_title(title or f"Confusion matrix ({total} examples, accuracy {accuracy:.4f})")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png")
    return buffer.getvalue()


def _square(confusion: np.ndarray) -> np.ndarray:
    matrix = np.asarray(confusion)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1] or matrix.shape[0] == 0:
        raise SparktfValueError(
            f"a confusion matrix is square and non-empty, got shape {matrix.shape}"
        )
    if matrix.dtype.kind not in "iu" or (matrix < 0).any():
        raise SparktfValueError("a confusion matrix holds non-negative integer counts")
    return matrix
