"""TensorBoard summaries written with TensorFlow's core ops only.

TensorFlow does not install the ``tensorboard`` package, and without it
``tf.summary.scalar`` / ``histogram`` / ``image`` raise ``TBNotInstalledError``. The event
format does not need the package: a summary is ``tf.summary.write`` of a tensor plus a
``SummaryMetadata`` naming the TensorBoard plugin that displays it. This module writes
exactly what TensorBoard's own v2 summary functions write:

* scalars: a float32 scalar, plugin ``scalars`` (data class SCALAR);
* histograms: a float64 [k, 3] tensor of (left edge, right edge, count), plugin
  ``histograms`` (data class TENSOR);
* images: a string vector ``[width, height, png, png, ...]``, plugin ``images`` (data class
  BLOB_SEQUENCE);
* text: a string scalar, plugin ``text`` (data class TENSOR).

Viewing them needs TensorBoard (``pip install tensorboard``), writing them does not.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "EventWriter",
    "histogram",
    "histogram_buckets",
    "image",
    "record_attempt",
    "scalar",
    "text",
]

# SCALAR, TENSOR, BLOB_SEQUENCE
_DATA_CLASS = {"scalars": 1, "histograms": 2, "images": 3, "text": 2}


def _metadata(plugin: str, description: str = ""):
    from tensorflow.core.framework import summary_pb2

    meta = summary_pb2.SummaryMetadata()
    meta.plugin_data.plugin_name = plugin
    meta.plugin_data.content = b""
    meta.summary_description = description
    meta.data_class = _DATA_CLASS[plugin]
    return meta


def scalar(name: str, value, step: int) -> None:
    """Writes ``value`` as a float32 scalar summary to the default writer."""
    import tensorflow as tf

    tf.summary.write(name, tf.cast(value, tf.float32), step=step, metadata=_metadata("scalars"))


def text(name: str, value: str, step: int) -> None:
    """Writes ``value`` as a text summary to the default writer."""
    import tensorflow as tf

    tf.summary.write(name, tf.constant(value, tf.string), step=step, metadata=_metadata("text"))


def histogram_buckets(values: np.ndarray, bucket_count: int = 30) -> np.ndarray:
    """(left, right, count) rows, as TensorBoard's histogram summary computes them."""
    values = np.asarray(values, dtype=np.float64).reshape(-1)
    values = values[np.isfinite(values)]
    if values.size == 0:
        return np.zeros((0, 3), dtype=np.float64)
    low, high = float(values.min()), float(values.max())
    if low == high:  # one bucket around the single value
        return np.array([[low - 0.5, high + 0.5, float(values.size)]], dtype=np.float64)
    counts, edges = np.histogram(values, bins=bucket_count, range=(low, high))
    return np.stack([edges[:-1], edges[1:], counts.astype(np.float64)], axis=1)


def histogram(name: str, values, step: int, bucket_count: int = 30) -> None:
    """Writes the histogram of ``values`` (:func:`histogram_buckets`) to the default writer."""
    import tensorflow as tf

    buckets = histogram_buckets(np.asarray(values), bucket_count)
    tf.summary.write(
        name, tf.constant(buckets, tf.float64), step=step, metadata=_metadata("histograms")
    )


def image(name: str, images, step: int, max_outputs: int = 16) -> None:
    """Writes up to ``max_outputs`` of ``images`` (uint8 [N, H, W, C] with C in (1, 3, 4);
    other dtypes are converted) as PNGs to the default writer."""
    import tensorflow as tf

    images = tf.convert_to_tensor(images)[:max_outputs]
    if images.dtype != tf.uint8:
        images = tf.image.convert_image_dtype(images, tf.uint8, saturate=True)
    pngs = tf.map_fn(tf.image.encode_png, images, fn_output_signature=tf.string)
    shape = tf.shape(images)
    dims = tf.strings.as_string([shape[2], shape[1]])  # width, height
    tf.summary.write(name, tf.concat([dims, pngs], axis=0), step=step, metadata=_metadata("images"))


class EventWriter:
    """The chief's TensorBoard output for one run, in ``directory`` (default
    ``model_dir.events_dir``; no-ops when disabled: processes other than the chief write no
    events)."""

    def __init__(self, model_dir, *, enabled: bool, directory: str | None = None):
        import tensorflow as tf

        self.model_dir = model_dir
        directory = directory or model_dir.events_dir
        self.writer = tf.summary.create_file_writer(directory) if enabled else None
        if self.writer is not None:  # each sync publishes what was written up to it
            model_dir.add_flusher(self.writer.flush)

    @property
    def enabled(self) -> bool:
        return self.writer is not None

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if self.writer is None:
            return
        with self.writer.as_default(step=step):
            for name, value in values.items():
                scalar(name, value, step)
        self.model_dir.sync_events()

    def histograms(self, step: int, names: list[str], weights: list[np.ndarray]) -> None:
        if self.writer is None:
            return
        with self.writer.as_default(step=step):
            for name, value in zip(names, weights):
                histogram(f"weights/{name}", value, step)

    def images(self, step: int, name: str, images) -> None:
        if self.writer is None:
            return
        with self.writer.as_default(step=step):
            image(name, images, step)

    def note(self, step: int, name: str, value: str) -> None:
        """A text summary (the event that started an attempt)."""
        if self.writer is None:
            return
        with self.writer.as_default(step=step):
            text(name, value, step)
        self.model_dir.sync_events()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()


def record_attempt(events: EventWriter, plan, step: int) -> None:
    """An attempt of a run in TensorBoard, at the step it starts from: an elastic run's
    workers (the scalar ``elastic/workers``) and the event that started it, a restart, shrink
    or grow (the text ``run/event``: :mod:`sparktf.train.driver.attempts`). Nothing for the
    first attempt of a run of a fixed size."""
    if plan.elastic:
        events.scalars(step, {"elastic/workers": plan.scaling.num_workers})
    event = plan.event
    if event:
        workers = (
            f"with {event['to']} workers"
            if event["kind"] == "restart"
            else f"from {event['from']} to {event['to']} workers"
        )
        events.note(
            step,
            "run/event",
            f"{event['kind']} {workers} at step {event['step']} (attempt {plan.attempt}, "
            f"resuming from step {event['resumed_from_step']}): {event['cause']}",
        )
