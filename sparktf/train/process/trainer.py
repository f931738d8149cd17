"""The training loop, run in every TensorFlow process that trains (the chief; every worker
under all-reduce), for every model of the registry and both strategies.

:meth:`Trainer.run` builds the process (:mod:`sparktf.train.process.build`: strategy, model,
optimizer, the latest checkpoint restored, the step of :mod:`sparktf.train.process.steps`), opens
its batches (:mod:`sparktf.train.process.inputs`) and steps until the target step or the end of the
data:

* every batch's wait timed against the steps (:class:`~sparktf.train.process.inputs.InputClock`:
  the result's ``input_timing``, the progress's ``input_wait``);
* every ``CheckpointConfig.every_steps`` and at the end a checkpoint (named by global step);
  weight histograms and what the task draws every ``TrackingConfig.histogram_every_steps``
  (default: with the checkpoints); scalars and progress (:mod:`sparktf.train.process.reporting`);
* every ``EvalConfig.every_steps`` the chief evaluates the weights of that step on the evaluation
  split (:class:`~sparktf.train.process.evaluation.EvaluationTracker`): under all-reduce the other
  processes wait for it at their next step, under ps the workers go on training while the
  chief evaluates in a thread beside its scheduling; the best is exported
  (``EvalConfig.export_best``);
* at the end the chief evaluates and exports a SavedModel with the registry's signatures to
  ``export/<global step>``, from a copy of the weights in a model built outside the strategy
  (so the SavedModel holds plain variables).

The run's outcome is a :class:`~sparktf.train.result.ProcessResult`, which the chief sends
to the driver.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from sparktf.train.artifacts import ModelDir, latest_checkpoint
from sparktf.train.errors import TrainingError
from sparktf.train.feed.order import Position
from sparktf.train.plan import ProcessSpec, Role, eval_metrics
from sparktf.train.process import inputs, milestones
from sparktf.train.process.build import Built, build_training
from sparktf.train.process.evaluation import BestMetric, EvaluationTracker, Evaluator
from sparktf.train.process.reporting import Reporter
from sparktf.train.process.summaries import EventWriter, record_attempt
from sparktf.train.result import PAUSED, ProcessResult

__all__ = ["Trainer", "export_writer"]

log = logging.getLogger(__name__)


def export_writer(task, weights: list[np.ndarray]):
    """A function that writes a SavedModel of ``weights`` to a local directory, from a model
    built outside any strategy (plain variables)."""

    def write(local_dir: str) -> None:
        clean = task.build_model()
        clean.set_weights(weights)
        task.export(clean, local_dir)

    return write


class Trainer:
    """Trains as the chief or an all-reduce worker; :meth:`run` returns the result."""

    def __init__(self, spec: ProcessSpec, role: Role, control):
        from sparktf import models

        self.spec, self.plan, self.role, self.control = spec, spec.plan, role, control
        self.task = models.get_task(self.plan.train.model, **self.plan.model_config)
        self.model_dir = ModelDir(
            self.plan.run.model_dir,
            writer=role.is_chief,
            sync_every_s=self.plan.run.tracking.sync_every_s,
        )
        self.built: Built | None = None
        self.reporter: Reporter | None = None
        self.evaluation: EvaluationTracker | None = None  # the chief's, with an eval split
        self.pending = None  # the last step's (possibly remote) metrics
        self.saved_step = -1
        self.last_checkpoint: str | None = None  # the prefix of the last checkpoint saved
        self.sources: list[inputs.Source] = []  # the input opened by run()
        self.clock = inputs.InputClock()  # the wait for each batch against the steps
        self.timing: dict = {}  # the clock's figures when the training ended

    def run(self) -> ProcessResult:
        """Builds the process, trains it, finishes (final checkpoint, evaluation, export) and
        returns its result; whatever fails on the way is raised, its input closed as failed."""
        started = time.time()
        # The inputs stay referenced by the trainer: an input pipeline torn down while the
        # process still has its result to send can hold it up; the process exits without it.
        opened = self.sources

        def open_input() -> None:  # the input fills while the model is built
            source = inputs.open_batches(
                self.spec, self.role, self.control, self.plan.per_process_batch
            )
            opened.append(source)
            source.batches = inputs.Primed(source.batches)

        try:
            try:
                result = self._build_and_train(started, open_input, opened)
            except BaseException:
                for source in opened:
                    source.close("failed")
                raise
            opened[0].close("done")
            return result
        finally:
            self.model_dir.close()

    def _build_and_train(self, started: float, open_input, opened: list) -> ProcessResult:
        self.built = built = build_training(
            self.plan, self.role, self.task, self.model_dir, with_strategy=open_input
        )
        if built.restored_from is not None:
            # the model directory's name of it: what was restored may be a local copy
            self.saved_step = built.start_step
            self.last_checkpoint = latest_checkpoint(self.model_dir.uri) or built.restored_from
        self.clock.source = opened[0].reader
        self.reporter = Reporter(
            self.plan,
            self.role,
            self.control,
            EventWriter(self.model_dir, enabled=self.role.is_chief),
            self.task,
            started=started,
            latest_evaluation=lambda: self.evaluation.latest if self.evaluation else None,
            clock=self.clock,
        )
        self.evaluation = self._evaluation_tracker()
        record_attempt(self.reporter.events, self.plan, built.start_step)
        if built.stepper.per_process_batch != self.plan.per_process_batch:
            raise TrainingError(
                f"the step takes {built.stepper.per_process_batch} rows per process, "
                f"the input gives {self.plan.per_process_batch}"
            )
        source = opened[0]
        return self.finish(source, self.train(source))

    def _evaluation_tracker(self) -> EvaluationTracker | None:
        """The chief's, when the plan has an evaluation split."""
        plan, run = self.plan, self.plan.run
        if not (self.role.is_chief and plan.eval_data is not None):
            return None
        best = None
        if run.evaluation.export_best and run.checkpoint.export:
            best = BestMetric(
                run.evaluation.export_best, eval_metrics(self.task)[run.evaluation.export_best]
            )
        return EvaluationTracker(
            Evaluator(self.task, plan.eval_data, plan.train.file_format),
            split=plan.eval_data.split,
            events=EventWriter(
                self.model_dir, enabled=True, directory=self.model_dir.eval_events_dir
            ),
            control=self.control,
            best=best,
            export_best=lambda weights, step: self.model_dir.export_best(
                export_writer(self.task, weights), step
            ),
        )

    def train(self, source: inputs.Source) -> str:
        """Steps until the target step or the end of the data; returns why it stopped."""
        run, target, stepper = self.plan.run, self.plan.target_steps, self.built.stepper
        hist_every = run.tracking.histogram_every_steps or run.checkpoint.every_steps
        agree = stepper.must_agree(source.finite)
        # an elastic run's processes agree at each checkpoint whether to pause (a resize)
        elastic = self.plan.elastic
        step = self.built.start_step
        batches = iter(source.batches)
        while step < target:
            batch = self.clock.next(batches, None)
            if agree and stepper.finished_anywhere(batch is None):
                return "end of the fed data"
            if batch is None:
                return "end of the data"
            self.pending = stepper(batch)
            step += 1
            self.reporter.step(step, self.pending)
            if self.evaluation:
                self.evaluation.collect(wait=False)
            at_checkpoint = step % run.checkpoint.every_steps == 0
            if at_checkpoint or step % hist_every == 0:
                stepper.join()
                if step % hist_every == 0:
                    self.reporter.snapshot(step, self.built.model)
                if at_checkpoint:
                    self.save(step)
                    if elastic and stepper.finished_anywhere(bool(self.control.pause)):
                        return PAUSED
            # the evaluation of the last step comes with the export
            if self.evaluation and step % self.plan.eval_every_steps == 0 and step < target:
                stepper.join()
                aside = stepper.evaluates_aside
                self.evaluation.evaluate(step, self.export_weights(), aside=aside)
        return "target steps reached"

    def save(self, step: int) -> str:
        self.last_checkpoint = self.model_dir.save(step, feed=self.feed_position(step))
        self.saved_step = step
        return self.last_checkpoint

    def feed_position(self, step: int) -> dict[str, int] | None:
        """Where the input stands after global step ``step``, kept with the checkpoint: the
        next attempt's input goes on from it. ``files``: each shard's place in its stream
        (:class:`~sparktf.train.process.inputs.FilesFeed`). ``spark``: the feed's position,
        counted from where this attempt's feed started (``RunPlan.feed_start``, at
        ``feed_start_step``; a checkpoint without one, from an older sparktf, is placed by
        its step)."""
        plan = self.plan
        if plan.train.input_mode == "files":  # the files input keeps its own place
            feed = self.sources[0].reader if self.sources else None
            return feed.at(step) if isinstance(feed, inputs.FilesFeed) else None
        if plan.train.input_mode != "spark":
            return None
        start_step = self.built.start_step
        if plan.feed_start is not None and plan.feed_start_step == start_step:
            start = Position.from_dict(plan.feed_start)
        else:
            start = Position().advance(start_step, plan.global_batch, plan.data.rows)
        return start.advance(step - start_step, plan.global_batch, plan.data.rows).to_dict()

    def export_weights(self) -> list[np.ndarray]:
        """The weights evaluated and exported: with ``moving_average_decay`` the trainable
        ones are their moving averages."""
        from sparktf import models

        return models.weights_for_export(self.task, self.built.model, self.built.optimizer)

    def export(self, weights: list[np.ndarray], step: int) -> str:
        """Publishes ``export/<step>`` from a model built outside the strategy."""
        path = self.model_dir.export(export_writer(self.task, weights), step)
        log.info("exported %s", path)
        return path

    def _write_run_record(
        self, final_step: int, export_dir: str | None, history: list, best_export: str | None
    ) -> None:
        """The model directory's record of the run (``sparktf_train.json``)."""
        self.model_dir.finish(
            {
                "model": self.task.name,
                "model_config": self.task.config,
                "strategy": self.role.strategy,
                "final_step": final_step,
                "export": export_dir,
                "last_checkpoint": self.last_checkpoint,
                "signatures": self.task.signature_info(),
                "eval": history,
                "best_export": best_export,
                "input": self.timing,
            }
        )

    def finish(self, source: inputs.Source, end_reason: str) -> ProcessResult:
        """Final checkpoint, snapshot, evaluation and export; the process's result."""
        import tensorflow as tf

        self.built.stepper.join()
        self.clock.stop()
        self.timing = self.clock.stats()
        rate = self.reporter.end_training(self.pending)
        final_step = int(self.built.global_step.numpy())
        log.info("%s: training ended at step %d (%s)", self.role.name, final_step, end_reason)
        if final_step != self.saved_step:
            self.save(final_step)
        paused = end_reason == PAUSED  # the run goes on in a cluster of another size
        evaluation = self.evaluation
        export_dir = None
        if not paused:
            self.reporter.snapshot(final_step, self.built.model)
            weights = self.export_weights()
            if evaluation is not None:
                evaluation.collect(wait=True)
                evaluation.evaluate(final_step, weights)
            if self.role.is_chief and self.plan.run.checkpoint.export:
                export_dir = self.export(weights, final_step)
        self.reporter.close(final_step, rate)
        history, best_export = [], None
        if evaluation is not None:
            evaluation.close()
            history, best_export = evaluation.history, evaluation.best_export
        if self.role.is_chief and not paused:
            self._write_run_record(final_step, export_dir, history, best_export)
        gpus = [d.name for d in tf.config.list_logical_devices("GPU")]
        return ProcessResult(
            start_step=self.built.start_step,
            final_step=final_step,
            end_reason=end_reason,
            metrics=self.reporter.metrics,
            last_checkpoint=self.last_checkpoint,
            export_dir=export_dir,
            examples=self.reporter.meter.examples,
            examples_per_sec=rate,
            first_step_wall=self.reporter.meter.first_step_wall,
            fed_rows=source.rows,
            dropped_rows=source.dropped_rows,
            gpus=gpus,
            progress=self.reporter.progress(final_step, rate),
            eval_metrics=evaluation.metrics if evaluation else {},
            eval_history=history,
            best_export=best_export,
            input_timing=self.timing,
            startup=milestones.reached(),
        )
