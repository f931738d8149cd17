"""Evaluation during training: the chief's current weights on the evaluation split.

The chief copies the weights into a model built outside the strategy (as for the export)
and makes one pass over the evaluation split (``files`` readers, whatever the input mode):

* classifiers: ``loss`` (cross-entropy), ``accuracy`` and ``top5_accuracy`` (top-k with
  k = min(5, classes)), averaged over every row of the split;
* the language model: ``loss`` (mean cross-entropy per predicted token) and ``perplexity``
  = exp(loss), token-weighted over the whole split, read in the book's stream layout (the
  LSTM state is carried from batch to batch, reset at the start) -- the book's 11.2
  valid/test perplexity;
* DCGAN: the discriminator and generator losses of ``eval_step`` on the real images.

Other processes do not evaluate: under all-reduce they wait for the chief at their next
step (the evaluation counts towards ``stall_timeout_s``); under ps they go on training while
the chief evaluates in a thread beside its scheduling (``trainer.AsideEvaluation``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from sparktf.train.inputs import stream_layout
from sparktf.train.plan import DataInfo

log = logging.getLogger(__name__)

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
        for batch, n in self._batches():
            for name, value in self._batch_sums(batch, n).items():
                sums[name] = sums.get(name, 0.0) + value
            rows += n
        if rows == 0:
            split = self.data.split
            raise ValueError(f"the evaluation split {split!r} of {self.data.data} is empty")
        metrics = {name: value / rows for name, value in sums.items()}
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
