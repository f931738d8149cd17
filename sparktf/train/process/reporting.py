"""What a training process tells the driver and TensorBoard while it trains.

* :class:`Meter` -- examples and examples/s of one process; the rates start when the first
  step has ended (that step traces the step function).
* :class:`Reporter` -- every process sends its step to the driver (its stall check reads it)
  and the share of its time it waited for batches.
  The chief, every ``TrackingConfig.summary_every_steps`` and at least every second or two,
  also sends its progress (step, epoch, the step's metrics, examples/s, the last evaluation,
  the share of its time it waited for batches: ``input_wait``) and writes the scalars to
  TensorBoard (that share as ``input/wait_fraction``); with every weight snapshot it writes
  the weights' histograms and what the task draws
  (:meth:`~sparktf.models.task.ModelTask.summary_images`: a GAN's samples).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

from sparktf.train.plan import Role, RunPlan
from sparktf.train.process import milestones
from sparktf.train.process.steps import to_floats

__all__ = ["Meter", "Reporter"]

log = logging.getLogger(__name__)


class Meter:
    """Examples and rates of one process; rates start after the first step (it traces)."""

    def __init__(self, global_batch: int):
        self.global_batch = global_batch
        self.examples = 0
        self.first_step_wall: float | None = None
        self._window_start = self._rate_start = time.monotonic()
        self._window_examples = self._rate_examples = 0

    def step(self) -> bool:
        """Counts one global step; True for this process's first: call
        :meth:`first_step_done` once its result is in (a coordinator only schedules it)."""
        self.examples += self.global_batch
        self._window_examples += self.global_batch
        return self.examples == self.global_batch

    def first_step_done(self) -> None:
        """Starts the rates' clock at the end of the first step (it traces the function)."""
        self.first_step_wall = time.time()
        milestones.mark("first_step")
        self._window_start = self._rate_start = time.monotonic()
        self._window_examples, self._rate_examples = 0, self.examples

    def window_rate(self) -> float:
        """Examples/s since the last call."""
        now = time.monotonic()
        rate = self._window_examples / max(now - self._window_start, 1e-9)
        self._window_start, self._window_examples = now, 0
        return rate

    def overall_rate(self) -> float:
        """Examples/s from the end of the first step."""
        counted = self.examples - self._rate_examples
        return counted / (time.monotonic() - self._rate_start) if counted > 0 else 0.0


class Reporter:
    """Progress and summaries of one training process.

    ``events``: the process's :class:`~sparktf.train.process.summaries.EventWriter` (disabled on
    every process but the chief); ``latest_evaluation``: returns the last evaluation (with
    its ``step``) or None; ``started``: ``time.time()`` when the process started;
    ``clock``: the process's :class:`~sparktf.train.process.inputs.InputClock` (every
    process sends its wait in its progress).
    """

    def __init__(
        self,
        plan: RunPlan,
        role: Role,
        control,
        events,
        task,
        *,
        started: float,
        latest_evaluation: Callable[[], dict[str, float] | None] = lambda: None,
        clock=None,
    ):
        self.plan, self.role, self.control, self.events = plan, role, control, events
        self.meter = Meter(plan.global_batch)
        self.metrics: dict[str, float] = {}  # the last step's metrics that were fetched
        self.started = started
        self._latest_evaluation = latest_evaluation
        self._draw = task.summary_images()
        self._last_progress = 0.0
        self.clock = clock

    def step(self, step: int, pending) -> None:
        """Counts the step ``step`` whose (possibly remote) metrics are ``pending``, and
        reports it when due."""
        if self.meter.step():
            self.metrics = to_floats(pending)  # waits for the first step to end
            self.meter.first_step_done()
            log.info(
                "first step done %.1f s after the process started",
                self.meter.first_step_wall - self.started,
            )
        self.report(step, pending)

    def report(self, step: int, pending) -> None:
        """The chief's scalars and progress, every ``summary_every_steps`` or second or two;
        the step alone on the other processes."""
        if not self.role.is_chief:
            self.control.set_progress({"step": step, **self.input_wait()})
            return
        now = time.monotonic()
        run = self.plan.run
        if not (
            step % run.tracking.summary_every_steps == 0
            or step == self.plan.target_steps
            or now - self._last_progress >= min(run.tracking.progress_every_s, 2.0)
        ):
            return
        self._last_progress = now
        self.metrics = to_floats(pending)
        rate = self.meter.window_rate()
        self.events.scalars(step, {**self.metrics, "examples_per_sec": rate, **self._wait_scalar()})
        self.control.set_progress(
            {**self.progress(step, rate), "first_step_wall": self.meter.first_step_wall}
        )

    def progress(self, step: int, rate: float) -> dict[str, Any]:
        """The progress report (the heartbeat's format) at ``step``."""
        latest = self._latest_evaluation()
        return {
            **({"eval": latest} if latest else {}),
            "step": step,
            "target": self.plan.target_steps,
            "epoch": step / self.plan.steps_per_epoch,
            "examples_per_sec": rate,
            **self.input_wait(),
            **self.metrics,
        }

    def input_wait(self) -> dict[str, float]:
        """``{"input_wait": share}``: the share of the time waited for batches so far, once
        measured (:class:`~sparktf.train.process.inputs.InputClock`); else empty."""
        fraction = self.clock.fraction() if self.clock is not None else None
        return {} if fraction is None else {"input_wait": round(fraction, 4)}

    def _wait_scalar(self) -> dict[str, float]:
        """The TensorBoard scalar of :meth:`input_wait`."""
        wait = self.input_wait()
        return {"input/wait_fraction": wait["input_wait"]} if wait else {}

    def snapshot(self, step: int, model) -> None:
        """Reads the weights (every all-reduce process reads them at the same steps); the
        chief writes their histograms and what the task draws from them."""
        weights = model.get_weights()
        if not self.events.enabled:
            return
        self.events.histograms(step, [w.path for w in model.weights], weights)
        for name, images in self._draw(weights).items():
            self.events.images(step, name, images)

    def end_training(self, pending) -> float:
        """Examples/s of the training: from the end of the first step to the end of the last
        (call before the final checkpoint, evaluation and export). The chief fetches the
        last step's metrics."""
        rate = self.meter.overall_rate()
        if pending is not None and self.role.is_chief:
            self.metrics = to_floats(pending)
        return rate

    def close(self, step: int, rate: float) -> None:
        """The final scalars at ``step``; closes the event files."""
        self.events.scalars(step, {**self.metrics, "examples_per_sec": rate, **self._wait_scalar()})
        self.events.close()
