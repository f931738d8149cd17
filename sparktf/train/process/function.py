"""A user's training function in a TensorFlow process: :func:`run_function`.

The plan carries ``train_fn`` and its ``config`` pickled by value
(:func:`sparktf.train.driver.train_fn.run`). Here, in every process that trains (the chief and
the all-reduce workers; under ps the chief is the coordinator and the other processes serve),
the strategy is made first, Keras's ``fit`` is mended for multi-worker all-reduce
(:mod:`sparktf.train.process.keras_fit`), the context is installed
(:mod:`sparktf.train.process.context`), and ``train_fn(config)`` (or ``train_fn()`` when it
takes no argument) runs. Its return value, on the chief, goes back to the driver as JSON.
"""

from __future__ import annotations

import inspect
import json
import logging
import os
from typing import Any

from sparktf import scratch, storage
from sparktf.errors import SparktfTypeError, SparktfValueError
from sparktf.train.feed.order import Position
from sparktf.train.plan import ProcessSpec, Role
from sparktf.train.process import context, keras_fit
from sparktf.train.result import PAUSED

__all__ = ["DYNAMIC", "jsonable", "name_code", "run_function", "takes_argument"]

log = logging.getLogger(__name__)


def jsonable(value: Any, what: str = "train_fn's return value") -> Any:
    """``value`` as JSON data (numpy arrays and scalars become lists and numbers);
    TypeError naming the part that is not."""

    def default(obj):
        if hasattr(obj, "numpy"):  # a TensorFlow tensor
            obj = obj.numpy()
        if hasattr(obj, "tolist"):  # numpy arrays and scalars
            return obj.tolist()
        raise SparktfTypeError(
            f"{what} must be JSON data (dicts, lists, strings, numbers, None; numpy arrays "
            f"and tensors are converted), not {type(obj).__name__}"
        )

    return json.loads(json.dumps(value, default=default))


def run_function(spec: ProcessSpec, role: Role, control) -> dict:
    """Runs the plan's training function as ``role``; returns what this process sends with
    ``done`` (the chief) or ``finished``: ``{"value": ..., "reports": n, "end_reason":
    "returned" | "paused", "input_timing": {...}}`` (``paused``: an elastic run's function
    returned when :func:`~sparktf.train.report` told it to; ``input_timing``: the waits for
    the batches of ``dataset()``, :meth:`~sparktf.train.process.inputs.InputClock.stats`)."""
    import cloudpickle
    import tensorflow as tf

    from sparktf.train.artifacts import ModelDir
    from sparktf.train.process.build import make_strategy
    from sparktf.train.process.steps import anywhere
    from sparktf.train.process.summaries import EventWriter, record_attempt

    plan = spec.plan
    train_fn, config, source = cloudpickle.loads(plan.function)
    if source:
        name_code(train_fn, source)
    strategy, coordinator = make_strategy(tf, plan, role)
    keras_fit.apply()
    local_dir = scratch.make_dir("sparktf-modeldir-")
    restored_dir = None
    if plan.resume_checkpoint:
        restored_dir = os.path.join(local_dir, "resume")
        storage.copy_tree(plan.resume_checkpoint, restored_dir)
        log.info("%s: resuming from %s", role.name, plan.resume_checkpoint)
    events = None
    model_dir = None
    if role.is_chief:
        model_dir = ModelDir(
            plan.run.model_dir, writer=True, sync_every_s=plan.run.tracking.sync_every_s
        )
        events = EventWriter(model_dir, enabled=True)
        record_attempt(events, plan, int((plan.event or {}).get("resumed_from_step", 0)))
    allreduce = role.strategy == "allreduce"  # under ps only the chief runs train_fn
    ctx = context.TrainContext(
        rank=role.rank if allreduce else 0,
        world_size=role.num_workers if allreduce else 1,
        role=role.role,
        is_chief=role.is_chief,
        strategy=strategy,
        coordinator=coordinator,
        model_dir=plan.run.model_dir,
        local_dir=local_dir,
        restored_dir=restored_dir,
        export_dir=storage.join(plan.run.model_dir, "export"),
        config=config,
        attempt=plan.attempt,
        data=None if plan.data.frame else plan.data.data or None,
        feed=_Feed(spec, role, control) if plan.data.frame else None,
        feed_start=None if plan.data.frame else plan.feed_start,
        feed_start_step=plan.feed_start_step,
        channel=control,
        events=events,
        reports_sent=plan.reports_before,
        elastic=plan.elastic,
        agree=anywhere(tf, strategy) if plan.elastic and allreduce else None,
    )
    context.install(ctx)
    log.info(
        "%s: running %s (rank %d of %d)",
        role.name,
        getattr(train_fn, "__qualname__", repr(train_fn)),
        ctx.rank,
        ctx.world_size,
    )
    state = "failed"
    try:
        value = train_fn(config) if takes_argument(train_fn) else train_fn()
        state = "done"
    finally:
        ctx.clock.stop()
        if ctx.feed is not None:
            ctx.feed.close(state)
        if events is not None:
            events.close()
        if model_dir is not None:
            model_dir.sync_events(force=True)
            model_dir.close()
    # an elastic run's grow: the function returned because report() told it to
    end_reason = PAUSED if ctx.stopping else "returned"
    return {
        "value": jsonable(value) if role.is_chief else None,
        "reports": ctx.reports_sent - plan.reports_before,
        "end_reason": end_reason,
        "input_timing": ctx.clock.stats(),
    }


class _Feed:
    """This process's feed of a DataFrame's rows (``run(data=df)``), opened once: called
    with the batch size, it returns the batches (dicts of numpy arrays) and the columns."""

    def __init__(self, spec: ProcessSpec, role: Role, control):
        self.spec, self.role, self.control = spec, role, control
        self.source = None
        self.batch_size = 0

    def __call__(self, batch_size: int):
        """``batch_size``: the global batch. The feed gives this process batches of that
        many rows of its share; ``model.fit`` and ``experimental_distribute_dataset`` take
        ``batch_size / world_size`` of them each step (ps: the chief takes them whole)."""
        from sparktf.train.process import inputs

        if self.spec.mgr_address is None:  # a process that does not train (ps) is not fed
            raise SparktfValueError(f"{self.role.name} is not fed: only training processes are")
        shares = self.role.num_workers if self.role.strategy == "allreduce" else 1
        if batch_size <= 0 or batch_size % shares:
            raise SparktfValueError(
                f"dataset(batch_size={batch_size}): the global batch must be divisible by the "
                f"{shares} processes that each take their part of it"
            )
        if self.source is None:
            # the driver's feed waits for the global batch of every training process
            self.control.send("feed", {"batch": batch_size})
            self.source = inputs.open_batches(self.spec, self.role, self.control, batch_size)
            self.batch_size = batch_size
        elif self.batch_size != batch_size:
            raise SparktfValueError(
                f"dataset(batch_size={batch_size}): this run's DataFrame feed was opened with "
                f"batch_size={self.batch_size}; a process has one feed"
            )
        return self.source, self.spec.plan.data.fields

    def position(self, step: int) -> dict[str, int] | None:
        """Where the feed stands after global step ``step`` (a report's), counted from the
        attempt's start (``RunPlan.feed_start``); None before the feed is opened."""
        if self.source is None:
            return None
        plan = self.spec.plan
        start = Position.from_dict(plan.feed_start)
        steps = max(0, step - plan.feed_start_step)
        return start.advance(steps, self.batch_size, plan.data.rows).to_dict()

    def close(self, state: str) -> None:
        """Tells the feeding tasks this process reads no more (``done`` or ``failed``)."""
        if self.source is not None:
            self.source.close(state)


DYNAMIC = "<dynamic-code>"  # cloudpickle's file name for code it ships by value


def name_code(fn, source: str) -> None:
    """Gives the code cloudpickle shipped by value (``fn``, the functions of the module it
    came with, their nested functions) its file name ``source`` back: a traceback then names
    the user's file and line, as it would on the driver."""
    import types

    def renamed(code: types.CodeType) -> types.CodeType:
        consts = tuple(renamed(c) if isinstance(c, types.CodeType) else c for c in code.co_consts)
        name = source if code.co_filename == DYNAMIC else code.co_filename
        return code.replace(co_filename=name, co_consts=consts)

    functions = [fn, *getattr(fn, "__globals__", {}).values()]
    for f in functions:
        code = getattr(f, "__code__", None)
        if isinstance(f, types.FunctionType) and code is not None and code.co_filename == DYNAMIC:
            f.__code__ = renamed(code)


def takes_argument(fn) -> bool:
    """Whether ``fn`` can be called with one positional argument (the config)."""
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return True
    positional = [
        p
        for p in parameters
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)
    ]
    return bool(positional)
