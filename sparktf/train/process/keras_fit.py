"""Keras 3 ``model.fit`` under ``MultiWorkerMirroredStrategy``, in a TensorFlow process of a run.

Keras 3's TensorFlow trainer fails on every worker of a multi-worker all-reduce run
(keras-team/keras#20585; Keras 3.15.1 with TensorFlow 2.21 here), in two places of
``keras/src/backend/tensorflow/trainer.py``:

1. ``TensorFlowTrainer._maybe_symbolic_build`` builds the model from the first batch of the
   distributed dataset (the mend builds it from the iterator's element spec instead: the
   batch Keras takes is never trained when ``steps_per_epoch`` keeps the iterator from epoch
   to epoch, and a feed that gives every row once per epoch must not lose it). It only
   needs that batch's shapes, but gets them by
   ``strategy.reduce("MEAN", batch, axis=None)``, which under ``MultiWorkerMirroredStrategy``
   converts the ``PerReplica`` batch to one tensor: ``ValueError: Attempt to convert a value
   (PerReplica:{...}) with an unsupported type``.
2. Past that, ``reduce_per_replica(outputs, strategy, "auto")`` reduces the step's metrics with
   ``strategy.reduce("MEAN", v, axis=0)``: the metrics are scalars, so ``Invalid reduction
   dimension 0``. They need no reduction: every worker already holds the global values (the
   canary below checks it: each worker reports the loss of both workers' batches).

:func:`apply` mends both for ``MultiWorkerMirroredStrategy`` in multi-worker mode only: the
model is built from this worker's first replica's batch (the same shapes the reduction would
give), and "auto"/"mean" reductions of the metrics take this worker's value. Every other
strategy, and every other reduction, goes through Keras's own code unchanged. It is applied
by :mod:`sparktf.train.process.function` before a user's training function runs, in that
TensorFlow process only; nothing is changed in the driver or in a process that does not run a
user's function.

The mend replaces private parts of Keras, so it is kept to the Keras versions seen failing:
:data:`KNOWN_BROKEN`. On any other version :func:`apply` logs a warning and leaves Keras as it
is, and a Keras whose trainer lacks these functions is left alone too. The canary,
``tests/test_keras_canary.py`` (unit tier, so CI runs it on both stacks), runs the same
``model.fit`` in two plain processes on loopback: without the mend it must still fail the way
keras#20585 says (first the ``PerReplica`` conversion, then, with the build mended, the
reduction), and with it it must train, reporting on each worker the loss of both workers'
batches. When a Keras release is found failing, the canary names its version, to be added to
:data:`KNOWN_BROKEN`; when a release no longer fails, the canary says so: then the mend is
retired (this module, its call in :mod:`sparktf.train.process.function`, its entry in
``tests/test_house.py``'s allow-list of patches, and the canary).
"""

from __future__ import annotations

import logging

__all__ = ["KNOWN_BROKEN", "apply"]

log = logging.getLogger(__name__)

# The Keras versions the canary (tests/test_keras_canary.py) has seen fail keras#20585: those
# of both stacks' lock files (requirements.lock, requirements-petastorm.lock).
KNOWN_BROKEN = ("3.15.1",)

_APPLIED: list[str] = []


def apply() -> bool:
    """Mends Keras 3's trainer for multi-worker all-reduce (see the module); True when
    applied (also when it was already), False when this Keras is not one of
    :data:`KNOWN_BROKEN` or has no such trainer."""
    if _APPLIED:
        return True
    try:
        import keras
    except ImportError:
        return False
    if keras.__version__ not in KNOWN_BROKEN:
        log.warning(
            "Keras %s is not among the versions known to fail model.fit under "
            "MultiWorkerMirroredStrategy (keras-team/keras#20585: %s), so sparktf leaves its "
            "trainer as it is. If such a fit fails with 'Attempt to convert a value "
            "(PerReplica...)' or 'Invalid reduction dimension 0', run sparktf's "
            "tests/test_keras_canary.py with this Keras and add the version to KNOWN_BROKEN "
            "in sparktf/train/process/keras_fit.py",
            keras.__version__,
            ", ".join(KNOWN_BROKEN),
        )
        return False
    try:
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

    def first_spec(spec):
        """A per-replica spec's first replica's (a spec as it is otherwise)."""
        components = getattr(spec, "_component_specs", None)
        return components[0] if isinstance(components, (list, tuple)) and components else spec

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        strategy = self._distribute_strategy
        if strategy is None or not multi_worker(strategy) or iterator is None:
            return keras_build(self, iterator=iterator, data_batch=data_batch)
        for _, _, it in iterator:
            # The model is built from the shapes of the iterator's elements: Keras takes
            # the first batch for them, and with steps_per_epoch (its iterator kept from
            # epoch to epoch) that batch is never trained, which would take rows from the
            # feed's epochs (sparktf.train.feed.order).
            spec = getattr(it, "element_spec", None)
            if spec is not None:
                data_batch = tree.map_structure(first_spec, spec)
            else:  # as Keras
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
