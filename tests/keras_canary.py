"""One worker of Keras 3 ``model.fit`` under ``MultiWorkerMirroredStrategy``, two plain
processes on loopback: what tests/test_keras_canary.py starts, twice, to watch
keras-team/keras#20585 and sparktf's mend of it (:mod:`sparktf.train.process.keras_fit`).

    python tests/keras_canary.py INDEX PORT0,PORT1 OUT.json

Each worker fits the same linear model on data of its own (:func:`data`), three times in
one process, so TensorFlow starts once (and, between the first two, runs
``keras_fit.apply()`` as on a Keras it does not know, which must leave Keras alone):

- ``plain``: Keras as it is, no mend: the canary. keras#20585 says it fails;
- ``build_mended``: only the mend's first half (the model built from this worker's first
  batch), Keras's own ``reduce_per_replica``: the second failure of keras#20585;
- ``sparktf``: as sparktf's TensorFlow processes run it, after ``keras_fit.apply()`` (which
  mends the known-broken Keras versions only): one epoch with learning rate 0, whose loss
  must be the mean over both workers' batches, then a few epochs of SGD, whose losses and
  weights must be those of plain gradient descent on the global batches (:func:`expected`).

A phase's failure is recorded (type and message) and the next phase runs on a fresh model.
The worker writes what it saw to ``OUT.json`` and ends with ``os._exit``: a multi-worker
TensorFlow process can hang in its teardown, and the test only needs the file.

Importing this module imports numpy only, so the test can compute :func:`expected`.
"""

from __future__ import annotations

import json
import os
import sys
import traceback

import numpy as np

WORKERS = 2
BATCH = 8  # per worker and step
STEPS = 2  # per epoch
EPOCHS = 3  # of SGD in the sparktf phase
LEARNING_RATE = 0.1
KERNEL = np.array([[0.5], [0.5], [0.5]], "float32")
BIAS = np.array([0.0], "float32")
TRUE_KERNEL = np.array([[1.5], [-2.0], [1.0]], "float32")


def data(index: int) -> tuple[np.ndarray, np.ndarray]:
    """Worker ``index``'s examples, ``STEPS`` batches of ``BATCH``; the workers' targets are
    far apart, so a loss of one worker's batches alone is far from the global one."""
    rng = np.random.default_rng(100 + index)
    x = rng.normal(size=(STEPS * BATCH, 3)).astype("float32")
    y = (x @ TRUE_KERNEL + 3.0 * index).astype("float32")
    return x, y


def expected(epochs: int, learning_rate: float) -> dict:
    """Plain gradient descent with mean squared error on the global batches (step ``s``:
    batch ``s`` of every worker): the loss of each epoch as Keras reports it (the mean over
    the epoch's examples, each step's loss taken before its update), and the final weights."""
    parts = [data(i) for i in range(WORKERS)]
    kernel, bias = KERNEL.astype("float64"), BIAS.astype("float64")
    losses = []
    for _ in range(epochs):
        total = 0.0
        for step in range(STEPS):
            rows = slice(step * BATCH, (step + 1) * BATCH)
            x = np.concatenate([p[0][rows] for p in parts]).astype("float64")
            y = np.concatenate([p[1][rows] for p in parts]).astype("float64")
            error = x @ kernel + bias - y
            total += float(np.mean(error**2))
            kernel = kernel - learning_rate * 2 * x.T @ error / len(x)
            bias = bias - learning_rate * 2 * error.mean(axis=0)
        losses.append(total / STEPS)
    return {"losses": losses, "kernel": kernel.ravel().tolist(), "bias": bias.tolist()}


def expected_alone(index: int) -> float:
    """The initial model's loss on worker ``index``'s examples only: what a worker would
    report if the metrics were its own."""
    x, y = data(index)
    return float(np.mean((x.astype("float64") @ KERNEL + BIAS - y) ** 2))


def _error(exc: BaseException) -> dict:
    return {
        "type": type(exc).__name__,
        "message": str(exc)[:2000],
        "where": "".join(traceback.format_tb(exc.__traceback__)[-3:])[-1500:],
    }


def _apply_unknown(keras_fit, trainer) -> dict:
    """``keras_fit.apply()`` as it would run on a Keras outside ``KNOWN_BROKEN``: what it
    returned, whether it left Keras's trainer as it was, and what it logged."""
    import logging

    records: list[logging.LogRecord] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = records.append
    logger = logging.getLogger(keras_fit.__name__)
    known, keras_fit.KNOWN_BROKEN = keras_fit.KNOWN_BROKEN, ()
    cls = trainer.TensorFlowTrainer
    before = (cls._maybe_symbolic_build, trainer.reduce_per_replica)
    logger.addHandler(handler)
    try:
        applied = keras_fit.apply()
    finally:
        logger.removeHandler(handler)
        keras_fit.KNOWN_BROKEN = known
    return {
        "applied": applied,
        "untouched": (cls._maybe_symbolic_build, trainer.reduce_per_replica) == before,
        "warnings": [r.getMessage() for r in records],
    }


def _worker(index: int, ports: list[int]) -> dict:
    import keras
    import tensorflow as tf

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x, y = data(index)

    def dataset(repeat: bool):
        def make(_):
            ds = tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH)
            return ds.repeat() if repeat else ds

        return strategy.distribute_datasets_from_function(make)

    def model(learning_rate: float):
        with strategy.scope():
            m = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
            m.set_weights([KERNEL, BIAS])
            m.compile(optimizer=keras.optimizers.SGD(learning_rate), loss="mse")
        return m

    def fit(m, epochs: int) -> dict:
        try:
            history = m.fit(dataset(epochs > 1), epochs=epochs, steps_per_epoch=STEPS, verbose=0)
        except Exception as exc:  # what the canary looks for
            return {"error": _error(exc)}
        kernel, bias = m.get_weights()
        return {
            "losses": [float(v) for v in history.history["loss"]],
            "kernel": kernel.ravel().tolist(),
            "bias": bias.tolist(),
        }

    from keras.src.backend.tensorflow import trainer

    from sparktf.train.process import keras_fit

    out: dict = {"keras": keras.__version__, "tensorflow": tf.__version__}
    out["plain"] = fit(model(0.0), 1)
    keras_reduce = trainer.reduce_per_replica
    out["unknown_version"] = _apply_unknown(keras_fit, trainer)
    out["applied"] = keras_fit.apply()
    if out["applied"]:
        mended_reduce, trainer.reduce_per_replica = trainer.reduce_per_replica, keras_reduce
        try:
            out["build_mended"] = fit(model(0.0), 1)
        finally:
            trainer.reduce_per_replica = mended_reduce
    m = model(0.0)
    out["sparktf"] = {"rate_0": fit(m, 1)}
    if "error" not in out["sparktf"]["rate_0"]:
        m.optimizer.learning_rate.assign(LEARNING_RATE)
        out["sparktf"]["sgd"] = fit(m, EPOCHS)
    return out


def main(argv: list[str]) -> None:
    index, ports, path = int(argv[0]), [int(p) for p in argv[1].split(",")], argv[2]
    os.environ["TF_CONFIG"] = json.dumps(
        {
            "cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
            "task": {"type": "worker", "index": index},
        }
    )
    try:
        out = _worker(index, ports)
    except BaseException as exc:  # a failure outside the phases: the test shows it
        out = {"crash": _error(exc)}
    with open(path + ".tmp", "w") as f:
        json.dump(out, f)
    os.replace(path + ".tmp", path)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
