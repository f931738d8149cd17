"""Keras 3 ``model.fit`` under ``MultiWorkerMirroredStrategy``, in a TensorFlow process of a run.

Keras 3's TensorFlow trainer fails on every worker of a multi-worker all-reduce run
(keras-team/keras#20585; Keras 3.15.1 with TensorFlow 2.21 here), in two places of
``keras/src/backend/tensorflow/trainer.py``:

1. ``TensorFlowTrainer._maybe_symbolic_build`` builds the model from the first batch of the
   distributed dataset. It only needs that batch's shapes, but gets them by
   ``strategy.reduce("MEAN", batch, axis=None)``, which under ``MultiWorkerMirroredStrategy``
   converts the ``PerReplica`` batch to one tensor: ``ValueError: Attempt to convert a value
   (PerReplica:{...}) with an unsupported type``.
2. Past that, ``reduce_per_replica(outputs, strategy, "auto")`` reduces the step's metrics with
   ``strategy.reduce("MEAN", v, axis=0)``: the metrics are scalars, so ``Invalid reduction
   dimension 0``. They need no reduction: Keras keeps them in mirrored variables whose updates
   are all-reduced, so every worker already holds the global values.

:func:`apply` mends both for ``MultiWorkerMirroredStrategy`` in multi-worker mode only: the
model is built from this worker's first replica's batch (the same shapes the reduction would
give), and "auto"/"mean" reductions of the metrics take this worker's value. Every other
strategy, and every other reduction, goes through Keras's own code unchanged. It is applied
by :mod:`sparktf.train.process.function` before a user's training function runs, in that
TensorFlow process only; nothing is changed in the driver or in a process that does not run a
user's function. A Keras whose trainer lacks these functions is left alone (logged).
"""

from __future__ import annotations

import logging

__all__ = ["apply"]

log = logging.getLogger(__name__)

_APPLIED: list[str] = []


def apply() -> bool:
    """Mends Keras 3's trainer for multi-worker all-reduce (see the module); True when
    applied (also when it was already), False when this Keras has no such trainer."""
    if _APPLIED:
        return True
    try:
        import keras
        from keras.src.backend.tensorflow import trainer
    except ImportError:
        return False
    cls = getattr(trainer, "TensorFlowTrainer", None)
    needed = ("reduce_per_replica", "_collective_all_reduce_multi_worker")
    if (
        cls is None
        or not hasattr(cls, "_maybe_symbolic_build")
        or not all(hasattr(trainer, name) for name in needed)
    ):
        log.warning(
            "Keras %s: no TensorFlowTrainer._maybe_symbolic_build; model.fit under "
            "MultiWorkerMirroredStrategy is left as Keras has it",
            keras.__version__,
        )
        return False

    import tensorflow as tf
    from keras.src import tree

    multi_worker = trainer._collective_all_reduce_multi_worker
    keras_build = cls._maybe_symbolic_build
    keras_reduce = trainer.reduce_per_replica

    def first_replica(strategy, values):
        def local(v):
            if isinstance(v, tf.distribute.DistributedValues):
                return strategy.experimental_local_results(v)[0]
            return v

        return tree.map_structure(local, values)

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy
        if strategy is None or not multi_worker(strategy) or iterator is None:
            return keras_build(self, iterator=iterator, data_batch=data_batch)
        for _, _, it in iterator:  # as Keras: the first batch, for its shapes
            data_batch = first_replica(strategy, next(it))
            break
        with strategy.scope():
            self._symbolic_build(data_batch=data_batch)

    def reduce_per_replica(values, strategy, reduction):
        if reduction in ("auto", "mean") and multi_worker(strategy):
            return first_replica(strategy, values)
        return keras_reduce(values, strategy, reduction)

    cls._maybe_symbolic_build = _maybe_symbolic_build
    trainer.reduce_per_replica = reduce_per_replica
    _APPLIED.append(keras.__version__)
    log.debug("Keras %s: model.fit mended for MultiWorkerMirroredStrategy", keras.__version__)
    return True
