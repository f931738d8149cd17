"""Evaluation during training: the chief's current weights on the evaluation split.

* :class:`Evaluator` -- one pass of some weights over the evaluation split.
* :class:`EvaluationTracker` -- the chief's evaluations of one run, in step order: each
  logged, written to TensorBoard (``events/eval``), sent to the driver, and exported to
  ``export_best/<step>`` when its metric beat the best so far (:class:`BestMetric`,
  ``EvalConfig.export_best``); under ps each runs beside training
  (:class:`AsideEvaluation`).

The chief copies the weights into a model built outside the strategy (as for the export)
and makes one pass over the evaluation split (``files`` readers, whatever the input mode):

* classifiers: ``loss`` (cross-entropy), ``accuracy`` and ``top5_accuracy`` (top-k with
  k = min(5, classes)), averaged over every row of the split;
* the language model: ``loss`` (mean cross-entropy per predicted token) and ``perplexity``
  = exp(loss), token-weighted over the whole split, read in the book's stream layout (the
  LSTM state is carried from batch to batch, reset at the start) -- the book's 11.2
  valid/test perplexity;
* DCGAN: the discriminator and generator losses of ``eval_step`` on the real images;
* a user's model of another kind (:class:`sparktf.models.CustomTask`): ``loss`` and its
  ``metrics`` (Keras metrics, e.g. ``rmse``, ``auc``) accumulated over every row.

Other processes do not evaluate: under all-reduce they wait for the chief at their next
step (the evaluation counts towards ``FailureConfig.stall_timeout_s``); under ps they go on
training while the chief evaluates in a thread beside its scheduling (one evaluation at a
time).
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from sparktf.train.plan import DataInfo
from sparktf.train.process.inputs import stream_layout

__all__ = ["EVAL_BATCH", "AsideEvaluation", "BestMetric", "EvaluationTracker", "Evaluator"]

log = logging.getLogger(__name__)

Weights = list[np.ndarray]  # a model's weights, in ``model.get_weights()`` order

EVAL_BATCH = 256  # rows per evaluation batch (images); the LM uses its own batch size


class Evaluator:
    """Evaluates weights (``model.get_weights()`` order) on ``data``'s split."""

    def __init__(self, task, data: DataInfo, file_format: str):
        import tensorflow as tf

        self.tf = tf
        self.task, self.data = task, data
        self.file_format = file_format if file_format in data.files else next(iter(data.files))
        self.model = task.build_model()  # outside any strategy: plain variables
        self._classify = None
        if task.kind == "classifier":
            k = min(5, int(task.num_classes))

            @tf.function
            def classify(images, labels):
                logits = tf.cast(self.model(images, training=False), tf.float32)
                labels = tf.reshape(tf.cast(labels, tf.int64), [-1])
                loss = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
                correct = tf.cast(tf.equal(tf.argmax(logits, axis=-1), labels), tf.float32)
                top = tf.cast(tf.math.in_top_k(labels, logits, k), tf.float32)
                return {
                    "loss": tf.reduce_sum(loss),
                    "accuracy": tf.reduce_sum(correct),
                    "top5_accuracy": tf.reduce_sum(top),
                }

            self._classify = classify

    def __call__(self, weights: list[np.ndarray]) -> dict[str, float]:
        started = time.monotonic()
        self.model.set_weights(weights)
        sums: dict[str, float] = {}
        rows = 0
        # A user's model of another kind than classifier: Keras metrics over every row.
        stateful = getattr(self.task, "evaluation_metrics", lambda: None)()
        for batch, n in self._batches():
            if stateful is not None:
                self.task.update_evaluation(stateful, self.model, batch)
            else:
                for name, value in self._batch_sums(batch, n).items():
                    sums[name] = sums.get(name, 0.0) + value
            rows += n
        if rows == 0:
            split = self.data.split
            raise ValueError(f"the evaluation split {split!r} of {self.data.data} is empty")
        metrics = {name: value / rows for name, value in sums.items()}
        if stateful is not None:
            metrics = {name: float(m.result()) for name, m in stateful.items()}
        if self.task.kind == "language_model":
            metrics["perplexity"] = math.exp(metrics["loss"])
        log.info(
            "evaluated %d rows of the %s split in %.1f s",
            rows,
            self.data.split,
            time.monotonic() - started,
        )
        return metrics

    def _batch_sums(self, batch: dict[str, Any], n: int) -> dict[str, float]:
        """Metric sums over one batch (means times rows where the task returns means)."""
        if self._classify is not None:
            out = self._classify(batch[self.task.features[0]], batch["label"])
            return {k: float(v) for k, v in out.items()}
        out = self.task.eval_step(self.model, batch, n)
        return {k: float(np.asarray(v)) * n for k, v in out.items()}

    def _batches(self) -> Iterator[tuple[dict[str, Any], int]]:
        from sparktf.datasets import readers

        read = (
            readers.tfrecord_dataset if self.file_format == "tfrecord" else readers.parquet_dataset
        )
        if self.task.kind == "language_model":
            yield from self._token_streams(read)
            return
        dataset = read(
            self.data.data,
            split=self.data.split,
            batch_size=EVAL_BATCH,
            shuffle=False,
            repeat=False,
            drop_remainder=False,
        )
        for batch in dataset:
            rows = {name: batch[name] for name in self.data.names}
            yield rows, int(next(iter(rows.values())).shape[0])

    def _token_streams(self, read) -> Iterator[tuple[dict[str, Any], int]]:
        """One pass in the book's stream layout, the state reset on the first step."""
        chunks = list(read(self.data.data, split=self.data.split, batch_size=4096))
        tokens = np.concatenate([c["tokens"].numpy() for c in chunks])
        ids = np.concatenate([c["id"].numpy() for c in chunks])
        streams = max(1, min(int(self.task.batch_size), len(tokens)))
        if self.model.state_batch_size != streams:
            self.model.create_state(streams)
        rows, _ = stream_layout(tokens, ids, streams)
        for t in range(rows.shape[1]):
            reset = np.full(streams, 1 if t == 0 else 0, np.int64)
            yield {"tokens": rows[:, t], "reset": reset}, streams


class AsideEvaluation:
    """One evaluation of the weights of ``step`` in a thread beside training (ps chief)."""

    def __init__(
        self, evaluator: Callable[[Weights], dict[str, float]], step: int, weights: Weights
    ):
        self.step, self.weights = step, weights
        self._metrics: dict[str, float] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(evaluator,), name=f"sparktf-eval-{step}", daemon=True
        )
        self._thread.start()

    def _run(self, evaluator: Callable[[Weights], dict[str, float]]) -> None:
        try:
            self._metrics = evaluator(self.weights)
        except BaseException as exc:  # raised in the training thread by result()
            self._error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> dict[str, float]:
        """The metrics (waits for the evaluation to end); re-raises its error."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._metrics


@dataclass
class BestMetric:
    """The best value so far of the evaluation metric ``name`` and the step it was reached."""

    name: str
    higher_is_better: bool
    value: float | None = None
    step: int | None = None

    def improves(self, metrics: dict[str, float], step: int) -> bool:
        """Whether ``metrics`` beat the best so far (the first always does); when they do,
        they become the best."""
        value = metrics[self.name]
        if self.value is not None:
            better = value > self.value if self.higher_is_better else value < self.value
            if not better:
                return False
        self.value, self.step = value, step
        return True


class EvaluationTracker:
    """The chief's evaluations of one run, recorded in step order.

    ``evaluate``: weights -> metrics (an :class:`Evaluator`); ``split``: the evaluation
    split's name (for the log); ``events``: where the metrics go in TensorBoard;
    ``control``: the channel to the driver (each evaluation is sent as an ``eval`` event);
    ``best`` and ``export_best`` (weights, step -> the export's path): export the weights of
    each evaluation that beats the best so far; without them nothing is exported.
    """

    def __init__(
        self,
        evaluate: Callable[[Weights], dict[str, float]],
        *,
        split: str,
        events,
        control,
        best: BestMetric | None = None,
        export_best: Callable[[Weights, int], str] | None = None,
    ):
        self._evaluate, self.split, self.events, self.control = evaluate, split, events, control
        self.best = best if export_best is not None else None
        self._export_best = export_best
        self.history: list[dict[str, float]] = []  # every evaluation, with its step
        self.best_export: str | None = None
        self._aside: AsideEvaluation | None = None  # the evaluation running beside training

    @property
    def latest(self) -> dict[str, float] | None:
        """The last evaluation recorded (with its ``step``), or None."""
        return self.history[-1] if self.history else None

    @property
    def metrics(self) -> dict[str, float]:
        """The metrics of the last evaluation recorded ({} before the first)."""
        return {k: v for k, v in (self.latest or {}).items() if k != "step"}

    def evaluate(self, step: int, weights: Weights, *, aside: bool = False) -> None:
        """Evaluates the weights of ``step``: now, or (``aside``) in a thread beside training
        once the previous one has been recorded."""
        if not aside:
            self.record(step, weights, self._evaluate(weights))
            return
        self.collect(wait=True)  # one at a time, in step order
        self._aside = AsideEvaluation(self._evaluate, step, weights)

    def collect(self, *, wait: bool) -> None:
        """Records the evaluation running beside training once it has ended (``wait``: waits
        for it); re-raises its error."""
        aside = self._aside
        if aside is None or not (wait or aside.done()):
            return
        self._aside = None
        self.record(aside.step, aside.weights, aside.result())

    def record(self, step: int, weights: Weights, metrics: dict[str, float]) -> None:
        """An evaluation at ``step``: logged, written, sent to the driver; exported as the
        best when it is."""
        self.history.append({"step": step, **metrics})
        self.events.scalars(step, metrics)
        self.control.send("eval", self.history[-1])  # the driver logs every one
        log.info(
            "evaluation at step %d on the %s split: %s",
            step,
            self.split,
            ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()),
        )
        if self.best is not None and self.best.improves(metrics, step):
            self.best_export = self._export_best(weights, step)
            log.info(
                "best %s so far (%.4g): exported %s",
                self.best.name,
                self.best.value,
                self.best_export,
            )

    def close(self) -> None:
        self.events.close()
