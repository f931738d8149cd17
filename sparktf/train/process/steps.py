"""The training step of both strategies: one global step of ``task.train_step`` under
``strategy.run``, inside a ``tf.function`` (Keras 3 ``fit`` does not work under
``MultiWorkerMirroredStrategy``).

* :class:`AllReduceStep` -- every process feeds its own batch (split between its local
  devices); the step's metrics are averaged over all replicas. When the input can end (the
  ``spark`` input mode), every step starts with a one-number all-reduce that says whether any
  process has run out of rows (:meth:`AllReduceStep.finished_anywhere`), so all stop together.
* :class:`ParameterServerStep` -- the chief hands each batch to ``coordinator.schedule`` and
  whichever worker is free runs it (asynchronous updates).

Both apply the task's training-time augmentation first (:func:`augment`) and count the
``global_step`` variable.
"""

from __future__ import annotations

import numpy as np

__all__ = [
    "AllReduceStep",
    "ParameterServerStep",
    "anywhere",
    "augment",
    "replica_all_reduce",
    "to_floats",
]


def replica_all_reduce(tf, devices: list):
    """``all_reduce(op, tree)`` in a replica context of a multi-worker all-reduce strategy
    over ``devices`` (the worker's): the values are placed on the replica's device first,
    which ``all_reduce`` needs under ``MultiWorkerMirroredStrategy``."""

    def all_reduce(op, tree):
        ctx = tf.distribute.get_replica_context()
        index = (tf.get_static_value(ctx.replica_id_in_sync_group) or 0) % len(devices)
        with tf.device(devices[index]):
            tree = tf.nest.map_structure(tf.identity, tree)
        return ctx.all_reduce(op, tree)

    return all_reduce


def anywhere(tf, strategy):
    """``anywhere(local: bool) -> bool``: whether the flag is true in any process of the
    all-reduce ``strategy`` (one small all-reduce; every process must call it at the same
    point, as every collective)."""
    all_reduce = replica_all_reduce(tf, list(strategy.extended.worker_devices))

    @tf.function
    def any_set(flag):
        out = strategy.run(lambda f: all_reduce(tf.distribute.ReduceOp.SUM, f), args=(flag,))
        return strategy.experimental_local_results(out)[0]

    def check(local: bool) -> bool:
        flag = strategy.experimental_distribute_values_from_function(
            lambda _: tf.constant(1.0 if local else 0.0)
        )
        return float(any_set(flag)) > 0

    return check


def augment(tf, task, batch, seed: int, global_step):
    """The task's training-time augmentation (ResNet's pad + crop + flip), if it has one:
    per image, deterministic given the run's seed, the step and the replica."""
    if not hasattr(task, "augment"):
        return batch
    replica = tf.distribute.get_replica_context().replica_id_in_sync_group
    return task.augment(batch, (seed, global_step, replica))


class AllReduceStep:
    """One synchronous step over the all-reduce workers; each process feeds its own rows."""

    evaluates_aside = False  # the other processes wait at their next collective anyway

    def __init__(
        self,
        tf,
        strategy,
        task,
        model,
        optimizer,
        global_step,
        *,
        global_batch: int,
        num_workers: int,
        seed: int,
    ):
        self.tf, self.strategy = tf, strategy
        self.devices = list(strategy.extended.worker_devices)
        self.per_process_batch = global_batch // num_workers
        self.per_replica_batch = self.per_process_batch // len(self.devices)
        self.num_workers = num_workers

        all_reduce = replica_all_reduce(tf, self.devices)

        def replica_step(local_batch):
            local_batch = augment(tf, task, local_batch, seed, global_step)
            metrics = task.train_step(model, optimizer, local_batch, global_batch)
            return all_reduce(tf.distribute.ReduceOp.MEAN, metrics)

        @tf.function
        def step_fn(batch):
            out = strategy.run(replica_step, args=(batch,))
            global_step.assign_add(1)
            return strategy.experimental_local_results(out)[0]

        self._step_fn = step_fn
        self.finished_anywhere = anywhere(tf, strategy)

    def must_agree(self, finite_input: bool) -> bool:
        """Whether the processes must agree every step that none has run out of rows."""
        return finite_input and self.num_workers > 1

    def __call__(self, batch: dict[str, np.ndarray]):
        tf = self.tf
        tensors = {k: tf.convert_to_tensor(v) for k, v in batch.items()}
        if len(self.devices) == 1:
            values = self.strategy.experimental_distribute_values_from_function(lambda _: tensors)
        else:
            size = self.per_replica_batch

            def part(ctx):
                i = ctx.replica_id_in_sync_group % len(self.devices)
                return {k: v[i * size : (i + 1) * size] for k, v in tensors.items()}

            values = self.strategy.experimental_distribute_values_from_function(part)
        return self._step_fn(values)

    def join(self) -> None:
        """Steps run synchronously: nothing is pending."""


class ParameterServerStep:
    """One asynchronous step scheduled by the chief on whichever ps worker is free."""

    evaluates_aside = True  # the workers need only the chief's scheduling, not its evaluation

    def __init__(
        self,
        tf,
        strategy,
        coordinator,
        task,
        model,
        optimizer,
        global_step,
        *,
        global_batch: int,
        seed: int,
    ):
        from sparktf import models

        self.tf, self.coordinator = tf, coordinator
        self.per_process_batch = global_batch  # the chief reads whole batches

        def replica_step(batch):
            batch = augment(tf, task, batch, seed, global_step)
            return task.train_step(model, optimizer, batch, global_batch)

        @tf.function
        def step_fn(batch):
            per_replica = strategy.run(replica_step, args=(batch,))
            global_step.assign_add(1)
            return models.reduce_metrics(strategy, per_replica)

        self._step_fn = step_fn

    def must_agree(self, finite_input: bool) -> bool:
        return False

    def finished_anywhere(self, local_finished: bool) -> bool:
        return local_finished

    def __call__(self, batch: dict[str, np.ndarray]):
        tensors = {k: self.tf.convert_to_tensor(v) for k, v in batch.items()}
        return self.coordinator.schedule(self._step_fn, args=(tensors,))

    def join(self) -> None:
        self.coordinator.join()


def to_floats(metrics) -> dict[str, float]:
    """A step's metrics (tensors, or a coordinator's remote values) as floats."""
    if hasattr(metrics, "fetch"):
        metrics = metrics.fetch()
    return {k: float(np.asarray(v)) for k, v in metrics.items()}
