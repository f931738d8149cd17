"""What a user's training function sees of its run: :func:`get_context` and :func:`report`.

Inside ``train_fn`` (run by :func:`sparktf.train.run` in every TensorFlow process)::

    from sparktf.train import get_context, report

    def train_fn(config):
        ctx = get_context()
        with ctx.strategy.scope():
            model = build(config)
            model.compile(optimizer="adam", loss="mse")
        first = 0
        if ctx.restored_dir:                    # a restart: what the last report saved
            model.load_weights(f"{ctx.restored_dir}/weights.weights.h5")
            first = json.load(open(f"{ctx.restored_dir}/epoch.json"))["epoch"] + 1
        data = ctx.dataset("train", batch_size=64)   # the global batch; this process's part
        for epoch in range(first, config["epochs"]):
            history = model.fit(data, epochs=1, steps_per_epoch=20, verbose=0)
            path = f"{ctx.local_dir}/epoch-{epoch}"
            os.makedirs(path, exist_ok=True)
            model.save_weights(f"{path}/weights.weights.h5")
            json.dump({"epoch": epoch}, open(f"{path}/epoch.json", "w"))
            if report({"epoch": epoch, "loss": history.history["loss"][-1]}, checkpoint=path):
                return None                     # an elastic run grows: saved, go on later
        return {"final_loss": history.history["loss"][-1]}  # the chief's comes back

A :class:`TrainContext` holds the process's place (``rank``, ``world_size``, ``role``,
``is_chief``), the strategy (made before ``train_fn`` starts: ``MultiWorkerMirroredStrategy``
under all-reduce, ``ParameterServerStrategy`` with its ``coordinator`` on the chief under
ps), the run's ``model_dir`` and a private ``local_dir`` to write to (TensorFlow cannot write
``hdfs://``), the reported checkpoint to resume from (``restored_dir``), and
:meth:`TrainContext.dataset`.

:func:`report` sends metrics to the driver, which logs them, keeps them in the result's
``history`` and, with MLflow, records them; the chief also writes them to TensorBoard (the
model directory's ``events``). A ``checkpoint`` (a local file or directory the chief wrote) is
published under ``model_dir/checkpoints/report-<n>``; the next attempt of a run (a restart
after ``FailureConfig.max_restarts``, an elastic run's shrink or grow) starts with a local copy
of the last one published as :attr:`TrainContext.restored_dir`. Other processes' checkpoints
are ignored, as their metrics are only logged at DEBUG: the chief speaks for the run.

**Elastic runs** (``ScalingConfig(num_workers=(MIN, MAX))``): a lost worker ends the attempt;
the function starts again, with the workers that fit now (``world_size`` changes), from the
last reported checkpoint. When task slots come back the driver asks the run to grow:
:func:`report` returns True (and :meth:`TrainContext.should_stop` says so from then on), and
the function returns once it has saved, its checkpoint reported; the next attempt starts
from that checkpoint with more workers. Under all-reduce the processes agree on it with one
small all-reduce in each ``report()`` of an elastic run: every process calls ``report()`` at
the same points (as it calls every collective), so all stop after the same report. Under ps
the chief (the only process that runs the function) decides alone. A function that ignores
the answer trains to its end at the size it has.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any

from sparktf.errors import SparktfRuntimeError, SparktfValueError
from sparktf.train.artifacts import CHECKPOINTS
from sparktf.train.process import inputs
from sparktf.train.process.inputs import InputClock

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
    # a local copy of the last reported checkpoint (a later attempt), or None
    restored_dir: str | None
    export_dir: str  # where an export belongs: model_dir/export
    config: Any = None
    coordinator: Any = None  # ps: the chief's ClusterCoordinator
    attempt: int = 0  # 0, then 1.. after each restart, shrink or grow
    data: str | None = None  # the dataset directory given to run(data=...)
    # run(data=df): opens this process's feed of the DataFrame's rows (batch_size -> the
    # batches, the columns)
    feed: Any = field(default=None, repr=False)
    # run(data=DIR): where this attempt's training stream starts (the checkpoint reported
    # last: its "feed" and step), and the files input opened from there (the first
    # dataset(repeat=True)): a report's checkpoint records its place
    feed_start: dict | None = None
    feed_start_step: int = 0
    files: Any = field(default=None, repr=False)
    # how reports leave: the control channel to the driver, the chief's TensorBoard writer
    channel: Any = field(default=None, repr=False)
    events: Any = field(default=None, repr=False)
    reports_sent: int = 0
    # an elastic run: whether any process saw the driver's request to pause (all-reduce:
    # agreed by all at each report), and the collective that agrees on it
    elastic: bool = False
    agree: Any = field(default=None, repr=False)
    stopping: bool = False
    # the wait for each batch of dataset() against the time between batches
    clock: InputClock = field(default_factory=InputClock, repr=False)

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

        With ``run(..., data=df)`` (a DataFrame) the rows come from Spark instead, epoch
        after epoch without end (``repeat=False`` is refused): this process's share, in
        batches of ``batch_size`` rows, the global batch here too (``model.fit`` and
        ``experimental_distribute_dataset`` take ``batch_size / world_size`` of each
        process's rows every step), every row once per epoch, in an order shuffled afresh
        every epoch with the run's seed (:mod:`sparktf.train.feed.order`; ``split``,
        ``shuffle`` and ``seed`` here do not apply). A process opens its feed once. The feed
        of a later attempt goes on where the last reported checkpoint left it: the ``step``
        a report gives (the global batches trained, as Keras's ``optimizer.iterations``)
        places it.

        Either way the process times each batch's wait against the time between batches
        (:class:`~sparktf.train.process.inputs.InputClock`), for the driver's input-bound
        check: where the batches leave this dataset, before the prefetching of
        ``experimental_distribute_dataset`` or Keras, so a function that waits for its
        input shows the whole time its input took."""
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
        fmt = "tfrecord" if "tfrecord" in info.get("formats", ()) else "parquet"
        start, drain = 0, None
        if repeat and self.files is None:  # the training stream: it goes on where it was
            where = (self.feed_start, self.feed_start_step)  # the attempt's, from its report
            self.files = inputs.FilesFeed.for_attempt(
                *where, self.data, split, fmt, shards, index, batch_size // shards
            )
            start = self.files.start
            drain = self.files.drain(seed if shuffle else None, f"dataset({split!r})")
            if start and drain is None:
                log.info(
                    "dataset(%r): shard %d of %d goes on from its record %d (%s)",
                    split,
                    index,
                    shards,
                    start,
                    self.files.position,
                )
        options = dict(
            batch_size=batch_size,
            split=split,
            num_shards=shards,
            shard_index=index,
            shuffle=shuffle,
            seed=inputs.shard_seed(seed, index),
            repeat=repeat,
            drop_remainder=True,
            start=start,
        )
        dataset = inputs.read_split(self.data, fmt, **options)
        if drain is not None:  # a resize's drain first: records, then the global batches
            dataset = drain.concatenate(dataset.unbatch()).batch(batch_size, drop_remainder=True)
        return self._select(self._timed(dataset), columns, label)

    def _timed(self, dataset):
        """``dataset`` with each ``next`` of its iterator timed by :attr:`clock` (a new
        iterator of it for each pass, its cardinality kept)."""
        import tensorflow as tf

        clock = self.clock
        timed = tf.data.Dataset.from_generator(
            lambda: clock.timed(iter(dataset)), output_signature=dataset.element_spec
        )
        cardinality = int(dataset.cardinality())
        if cardinality >= 0 or cardinality == tf.data.INFINITE_CARDINALITY:
            timed = timed.apply(tf.data.experimental.assert_cardinality(cardinality))
        return timed

    def _fed(self, batch_size: int):
        """The DataFrame's rows fed to this process, as a ``tf.data.Dataset`` of dicts."""
        import tensorflow as tf

        source, fields = self.feed(batch_size)
        clock = self.clock
        clock.source = source.reader
        signature = {
            f.name: tf.TensorSpec(
                [batch_size, *(f.shape or ())],
                tf.string if f.dtype == "string" else tf.as_dtype(f.dtype),
            )
            for f in fields
        }
        batches = iter(source.batches)  # one iterator: every pass of the dataset continues it
        return tf.data.Dataset.from_generator(
            lambda: clock.timed(batches), output_signature=signature
        )

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

    def should_stop(self) -> bool:
        """Whether the driver asked this elastic run to stop and go on at another size (a
        grow): the function returns once its checkpoint is reported. Settled by each
        :func:`report` (agreed by every all-reduce process there); False in a run of a fixed
        size."""
        return self.stopping

    def _settle_stop(self) -> bool:
        """At a report of an elastic run: whether to stop (any process saw the pause)."""
        if not self.elastic or self.stopping:
            return self.stopping
        local = bool(self.channel is not None and self.channel.pause)
        self.stopping = self.agree(local) if self.agree is not None else local
        if self.stopping:
            log.info("the driver asked the run to pause (%s): train_fn should return", local)
        return self.stopping

    def report(self, metrics: dict[str, Any], checkpoint: str | None = None) -> bool:
        """See :func:`report`."""
        values = metric_values(metrics)
        self.reports_sent += 1
        step = int(values.get("step", self.reports_sent))
        entry: dict[str, Any] = {"n": self.reports_sent, "step": step, "metrics": values}
        fraction = self.clock.fraction()
        wait = {} if fraction is None else {"input_wait": round(fraction, 4)}
        entry.update(wait)  # the driver's log line of the report shows it
        if checkpoint is not None and self.is_chief:
            entry["checkpoint"] = self._publish(checkpoint)
            if self.feed is not None:
                position = self.feed.position(step)
            else:
                position = self.files.at(step) if self.files is not None else None
            if position is not None:  # where the next attempt's feed goes on from
                entry["feed"] = position
        if self.events is not None:
            scalars = {"input/wait_fraction": fraction} if wait else {}
            self.events.scalars(step, {**values, **scalars})
        if self.channel is not None:
            self.channel.send("report", entry)
            self.channel.set_progress({"step": step, **values, **wait})
        return self._settle_stop()

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


def report(metrics: dict[str, Any], checkpoint: str | None = None) -> bool:
    """Reports ``metrics`` (numbers by name; ``step`` among them numbers the report, else
    the count of reports) to the driver: its progress log, the result's ``history``, MLflow,
    and from the chief TensorBoard. ``checkpoint``: a local file or directory the chief
    wrote, published under the model directory; the next attempt resumes from the last one
    (:attr:`TrainContext.restored_dir`).

    Returns whether the function should stop now (:meth:`TrainContext.should_stop`): True
    only in an elastic run that grows, after the driver asked; the function returns, and
    the run goes on from the last checkpoint reported with more workers."""
    return get_context().report(metrics, checkpoint)


def install(context: TrainContext) -> None:
    """Makes ``context`` this process's (:mod:`sparktf.train.process.function`)."""
    _CURRENT.append(context)
