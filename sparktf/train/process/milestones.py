"""Where a training process's start-up went: the wall-clock time (``time.time()``) at which it
reached each point of its start, in order (:data:`ORDER`):

* ``launched``: its Python had imported sparktf's process module
  (:mod:`sparktf.train.process.main` imports this one at its top);
* ``joined``: the driver gave it its role (every process of the run had said hello);
* ``tensorflow_imported``: TensorFlow was imported (an early process imports it while it
  waits for its spec);
* ``strategy_ready``: its ``tf.distribute`` strategy exists (its gRPC server started, the
  cluster's coordination service reached);
* ``model_built``: the model, optimizer and step function built, the checkpoint restored;
* ``first_step``: its first training step ended (the first trace and the first all-reduce).

The chief sends them in its result (``ProcessResult.startup``); the driver reports them as
seconds from the call (``TrainResult.startup_s``): time to first step, by where it went.
"""

from __future__ import annotations

import time

__all__ = ["ORDER", "mark", "reached"]

ORDER = (
    "launched",
    "joined",
    "tensorflow_imported",
    "strategy_ready",
    "model_built",
    "first_step",
)
_REACHED: dict[str, float] = {"launched": time.time()}


def mark(name: str) -> None:
    """Records that this process reached ``name`` (one of :data:`ORDER`) now; the first time
    counts."""
    if name not in ORDER:
        raise ValueError(f"unknown start-up milestone {name!r}; known: {', '.join(ORDER)}")
    _REACHED.setdefault(name, time.time())


def reached() -> dict[str, float]:
    """Every milestone reached so far, in :data:`ORDER`: ``{name: time.time()}``."""
    return {name: _REACHED[name] for name in ORDER if name in _REACHED}
