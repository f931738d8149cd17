"""What a user's training function sees of its run: :func:`get_context` and :func:`report`.

Inside ``train_fn`` (run by :func:`sparktf.train.run` in every TensorFlow process)::

    from sparktf.train import get_context, report

    def train_fn(config):
        ctx = get_context()
        with ctx.strategy.scope():
            model = build(config)
            model.compile(optimizer="adam", loss="mse")
        if ctx.checkpoint:                      # a restart: what the last report saved
            model.load_weights(f"{ctx.checkpoint}/weights.weights.h5")
        data = ctx.dataset("train", batch_size=64)   # this process's shard, repeated
        for epoch in range(config["epochs"]):
            history = model.fit(data, epochs=1, steps_per_epoch=20, verbose=0)
            path = f"{ctx.local_dir}/epoch-{epoch}"
            os.makedirs(path, exist_ok=True)
            model.save_weights(f"{path}/weights.weights.h5")
            report({"epoch": epoch, "loss": history.history["loss"][-1]}, checkpoint=path)
        return {"final_loss": history.history["loss"][-1]}  # the chief's comes back

A :class:`TrainContext` holds the process's place (``rank``, ``world_size``, ``role``,
``is_chief``), the strategy (made before ``train_fn`` starts: ``MultiWorkerMirroredStrategy``
under all-reduce, ``ParameterServerStrategy`` with its ``coordinator`` on the chief under
ps), the run's ``model_dir`` and a private ``local_dir`` to write to (TensorFlow cannot write
``hdfs://``), the checkpoint to resume from, and :meth:`TrainContext.dataset`.

:func:`report` sends metrics to the driver, which logs them, keeps them in the result's
``history`` and, with MLflow, records them; the chief also writes them to TensorBoard (the
model directory's ``events``). A ``checkpoint`` (a local file or directory the chief wrote) is
published under ``model_dir/checkpoints/report-<n>``; a restarted run
(``FailureConfig.max_restarts``) starts with a local copy of the last one published as
:attr:`TrainContext.checkpoint`. Other processes' checkpoints are ignored, as their metrics
are only logged at DEBUG: the chief speaks for the run.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from sparktf.errors import SparktfRuntimeError, SparktfValueError
from sparktf.train.artifacts import CHECKPOINTS

__all__ = ["TrainContext", "get_context", "install", "metric_values", "report"]

log = logging.getLogger(__name__)

_CURRENT: list[TrainContext] = []


@dataclass
class TrainContext:
    """A TensorFlow process's view of its run (see the module)."""

    rank: int  # 0 for the chief; all-reduce workers 1..N-1 (ps: the coordinator only runs)
    world_size: int  # processes that run train_fn
    role: str  # chief | worker
    is_chief: bool
    strategy: Any
    model_dir: str  # the run's directory (local path or hdfs:// URI)
    local_dir: str  # a private local directory of this process, removed when it exits
    checkpoint: str | None  # a local copy of the last reported checkpoint (a restart), or None
    export_dir: str  # where an export belongs: model_dir/export
    config: Any = None
    coordinator: Any = None  # ps: the chief's ClusterCoordinator
    attempt: int = 0  # 0, then 1.. after each restart
    data: str | None = None  # the dataset directory given to run(data=...)
    # run(data=df): opens this process's feed of the DataFrame's rows (batch_size -> the
    # batches, the columns)
    feed: Any = field(default=None, repr=False)
    # how reports leave: the control channel to the driver, the chief's TensorBoard writer
    channel: Any = field(default=None, repr=False)
    events: Any = field(default=None, repr=False)
    reports_sent: int = 0

    def dataset(
        self,
        split: str = "train",
        *,
        batch_size: int,
        columns: list[str] | tuple[str, ...] | None = None,
        shuffle: bool = True,
        seed: int = 0,
        repeat: bool = True,
        label: str | None = None,
    ):
        """This process's part of a split of the run's dataset (``run(..., data=DIR)``, a
        directory :mod:`sparktf.datasets.conversion` wrote) as a ``tf.data.Dataset`` of dicts
        (one tensor per column) in batches of ``batch_size`` rows (the last partial batch
        dropped). Under all-reduce each worker reads its own shard (by file when the number of
        files is a multiple of the workers, else by record) and the strategy does not shard it
        again; ``batch_size`` is then the *global* batch, as Keras's ``fit`` and
        ``strategy.experimental_distribute_dataset`` take it: each step gives every one of the
        ``world_size`` processes ``batch_size / world_size`` rows of its shard (so it must be
        divisible; a custom loop averages its loss over ``batch_size``). Under ps the
        coordinator reads it all. ``label``: batches are ``(features, batch[label])``
        pairs instead, as Keras's ``fit`` takes them (``features`` a dict of the other
        columns, or the one tensor when one column is left). ``repeat``: the passes never end
        (give ``fit`` its ``steps_per_epoch``).

        With ``run(..., data=df)`` (a DataFrame) the rows come from Spark instead: this
        process's part of the DataFrame's rows, in batches of ``batch_size``, the passes
        endless (``split``, ``shuffle`` and ``seed`` do not apply; ``repeat=False`` is
        refused); a process opens its feed once."""
        from sparktf.datasets import readers

        if self.feed is not None:
            if not repeat:
                raise SparktfValueError(
                    "dataset(repeat=False): a DataFrame's rows are fed pass after pass until "
                    "the run ends; count steps instead"
                )
            return self._select(self._fed(batch_size), columns, label)
        if not self.data:
            raise SparktfValueError(
                "this run has no dataset: pass run(..., data=DATASET_DIR) (a converted "
                "dataset), or make your own tf.data.Dataset in train_fn"
            )
        info = readers.dataset_info(self.data)
        shards, index = (1, 0) if self.coordinator is not None else (self.world_size, self.rank)
        if batch_size % shards:
            raise SparktfValueError(
                f"dataset(batch_size={batch_size}): the global batch must be divisible by the "
                f"{shards} processes that each take their part of it"
            )
        options = dict(
            batch_size=batch_size,
            split=split,
            num_shards=shards,
            shard_index=index,
            shuffle=shuffle,
            seed=seed + 1000 * index,
            repeat=repeat,
            drop_remainder=True,
        )
        if "tfrecord" in info.get("formats", ()):
            dataset = readers.tfrecord_dataset(self.data, verify_checksums=True, **options)
        else:
            dataset = readers.parquet_dataset(self.data, **options)
        return self._select(dataset, columns, label)

    def _fed(self, batch_size: int):
        """The DataFrame's rows fed to this process, as a ``tf.data.Dataset`` of dicts."""
        import tensorflow as tf

        source, fields = self.feed(batch_size)
        signature = {
            f.name: tf.TensorSpec(
                [batch_size, *(f.shape or ())],
                tf.string if f.dtype == "string" else tf.as_dtype(f.dtype),
            )
            for f in fields
        }
        batches = iter(source.batches)  # one iterator: every pass of the dataset continues it
        return tf.data.Dataset.from_generator(lambda: batches, output_signature=signature)

    @staticmethod
    def _select(dataset, columns, label):
        """``dataset`` of ``columns`` only, as ``(features, label)`` pairs with ``label``;
        marked as already this process's shard (a strategy must not shard it again)."""
        import tensorflow as tf

        if columns is not None or label is not None:
            keep = list(columns) if columns is not None else None

            def select(batch):
                picked = {k: v for k, v in batch.items() if keep is None or k in keep}
                if label is None:
                    return picked
                y = batch[label]
                picked.pop(label, None)
                x = next(iter(picked.values())) if len(picked) == 1 else picked
                return x, y

            dataset = dataset.map(select)
        options = tf.data.Options()
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
        return dataset.with_options(options)

    def report(self, metrics: dict[str, Any], checkpoint: str | None = None) -> None:
        """See :func:`report`."""
        values = metric_values(metrics)
        self.reports_sent += 1
        step = int(values.get("step", self.reports_sent))
        entry: dict[str, Any] = {"n": self.reports_sent, "step": step, "metrics": values}
        if checkpoint is not None and self.is_chief:
            entry["checkpoint"] = self._publish(checkpoint)
        if self.events is not None:
            self.events.scalars(step, values)
        if self.channel is not None:
            self.channel.send("report", entry)
            self.channel.set_progress({"step": step, **values})

    def _publish(self, local: str) -> str:
        """Copies the chief's checkpoint ``local`` (a file or directory) to
        ``model_dir/checkpoints/report-<n>``, published whole; returns that path."""
        from sparktf import storage

        if not os.path.exists(local):
            raise SparktfValueError(f"report(checkpoint={local!r}): no such file or directory")
        parent = storage.join(self.model_dir, CHECKPOINTS)  # beside fit()'s checkpoints
        storage.makedirs(parent)
        target = storage.join(parent, f"report-{self.reports_sent:06d}")
        with storage.publish(target, overwrite=True) as tmp:
            storage.copy_tree(os.path.abspath(local), tmp)
        log.info("checkpoint of report %d: %s", self.reports_sent, target)
        return target


def metric_values(metrics: dict[str, Any]) -> dict[str, float]:
    """``metrics`` as plain floats (numpy and TensorFlow scalars included); ValueError naming
    a value that is not one number."""
    if not isinstance(metrics, dict):
        raise SparktfValueError(f"report() takes a dict of metrics, not {type(metrics).__name__}")
    out = {}
    for name, value in metrics.items():
        try:
            if hasattr(value, "numpy"):
                value = value.numpy()
            number = float(value)
        except (TypeError, ValueError):
            raise SparktfValueError(
                f"report(): metric {name!r} is {type(value).__name__}, not a number"
            ) from None
        out[str(name)] = number
    return out


def get_context() -> TrainContext:
    """The context of the training function running in this process; RuntimeError outside
    one (``sparktf.train.run`` sets it)."""
    if not _CURRENT:
        raise SparktfRuntimeError(
            "get_context() is for the function that sparktf.train.run runs on the executors"
        )
    return _CURRENT[-1]


def report(metrics: dict[str, Any], checkpoint: str | None = None) -> None:
    """Reports ``metrics`` (numbers by name; ``step`` among them numbers the report, else
    the count of reports) to the driver: its progress log, the result's ``history``, MLflow,
    and from the chief TensorBoard. ``checkpoint``: a local file or directory the chief
    wrote, published under the model directory; a restarted run resumes from the last one
    (:attr:`TrainContext.checkpoint`)."""
    get_context().report(metrics, checkpoint)


def install(context: TrainContext) -> None:
    """Makes ``context`` this process's (:mod:`sparktf.train.process.function`)."""
    _CURRENT.append(context)
