"""The training loop, run in every TensorFlow process that trains (the chief; every worker
under all-reduce), for every model of the registry and both strategies.

* :meth:`Trainer.build` -- the strategy from ``TF_CONFIG`` (set by :mod:`sparktf.train.node`
  from the driver's plan): ``MultiWorkerMirroredStrategy`` (all-reduce) or
  ``ParameterServerStrategy`` with a ``ClusterCoordinator`` on the chief (ps); model,
  optimizer (with the registry's learning-rate schedule) and a ``global_step`` variable
  under ``strategy.scope()``; the model directory's latest checkpoint restored (step,
  optimizer state and so the schedule continue).
* the step (:class:`AllReduceStep`, :class:`ParameterServerStep`) is ``strategy.run(
  task.train_step, ...)`` inside a ``tf.function`` (Keras 3 ``fit`` does not work under
  ``MultiWorkerMirroredStrategy``). All-reduce: every process feeds its own batch; the
  step's metrics are averaged over all replicas, and when the input can end (spark input
  mode) every step starts with a one-number all-reduce that says whether any process has
  run out of rows, so all stop together. ps: the chief hands each batch to
  ``coordinator.schedule`` and whichever worker is free runs it (asynchronous updates).
* :meth:`Trainer.train` -- every ``checkpoint_every_steps`` and at the end a checkpoint
  (named by global step) and weight histograms (and GAN samples); scalars (loss, accuracy
  or perplexity, learning rate, examples/s) every ``summary_every_steps``; progress to the
  driver every second or two. Evaluation (every ``eval_every_steps``): the chief evaluates
  the weights of that step on the evaluation split; under all-reduce the other processes wait
  for it at their next step, under ps the workers go on training while the chief evaluates
  in a thread beside its scheduling (one evaluation at a time; results are recorded, logged
  and exported as best by the main thread, in step order).
* :meth:`Trainer.export` -- the chief exports a SavedModel with the registry's signatures to
  ``export/<global step>``, from a copy of the weights in a model built outside the strategy
  (so the SavedModel holds plain variables).
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import numpy as np

from sparktf.train import inputs, warmstart
from sparktf.train.artifacts import ModelDir
from sparktf.train.evaluation import Evaluator
from sparktf.train.plan import ProcessSpec, Role
from sparktf.train.summaries import EventWriter

log = logging.getLogger(__name__)


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

        def all_reduce(op, tree):
            ctx = tf.distribute.get_replica_context()
            index = (tf.get_static_value(ctx.replica_id_in_sync_group) or 0) % len(self.devices)
            with tf.device(self.devices[index]):  # all_reduce needs values placed on a device
                tree = tf.nest.map_structure(tf.identity, tree)
            return ctx.all_reduce(op, tree)

        def replica_step(local_batch):
            local_batch = augment(tf, task, local_batch, seed, global_step)
            metrics = task.train_step(model, optimizer, local_batch, global_batch)
            return all_reduce(tf.distribute.ReduceOp.MEAN, metrics)

        @tf.function
        def step_fn(batch):
            out = strategy.run(replica_step, args=(batch,))
            global_step.assign_add(1)
            return strategy.experimental_local_results(out)[0]

        @tf.function
        def any_finished(flag):
            out = strategy.run(lambda f: all_reduce(tf.distribute.ReduceOp.SUM, f), args=(flag,))
            return strategy.experimental_local_results(out)[0]

        self._step_fn, self._any_finished = step_fn, any_finished

    def must_agree(self, finite_input: bool) -> bool:
        """Whether the processes must agree every step that none has run out of rows."""
        return finite_input and self.num_workers > 1

    def finished_anywhere(self, local_finished: bool) -> bool:
        tf = self.tf
        flag = self.strategy.experimental_distribute_values_from_function(
            lambda _: tf.constant(1.0 if local_finished else 0.0)
        )
        return float(self._any_finished(flag)) > 0

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


class AsideEvaluation:
    """One evaluation of the weights of ``step`` in a thread beside training (ps chief)."""

    def __init__(self, evaluator: Evaluator, step: int, weights: list[np.ndarray]):
        self.step, self.weights = step, weights
        self._metrics: dict[str, float] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, args=(evaluator,), name=f"sparktf-eval-{step}", daemon=True
        )
        self._thread.start()

    def _run(self, evaluator: Evaluator) -> None:
        try:
            self._metrics = evaluator(self.weights)
        except BaseException as exc:  # raised in the training thread by result()
            self._error = exc

    def done(self) -> bool:
        return not self._thread.is_alive()

    def result(self) -> dict[str, float]:
        """The metrics (waits for the evaluation to end); re-raises its error."""
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._metrics


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


def to_floats(metrics) -> dict[str, float]:
    """A step's metrics (tensors, or a coordinator's remote values) as floats."""
    if hasattr(metrics, "fetch"):
        metrics = metrics.fetch()
    return {k: float(np.asarray(v)) for k, v in metrics.items()}


class Trainer:
    """Trains as the chief or an all-reduce worker; :meth:`run` returns the result."""

    def __init__(self, spec: ProcessSpec, role: Role, control):
        from sparktf import models

        self.spec, self.plan, self.role, self.control = spec, spec.plan, role, control
        self.task = models.get_task(self.plan.train.model, **self.plan.model_config)
        self.model_dir = ModelDir(
            self.plan.run.model_dir, writer=role.is_chief, sync_every_s=self.plan.run.sync_every_s
        )
        self.events: EventWriter | None = None
        self.meter = Meter(self.plan.global_batch)
        self.metrics: dict[str, float] = {}
        self.pending = None  # the last step's (possibly remote) metrics
        self.saved_step = -1
        self.checkpoint: str | None = None
        self._sampler = None
        self._last_progress = 0.0
        self.evaluator: Evaluator | None = None  # the chief's, when the plan has an eval split
        self.eval_events: EventWriter | None = None
        self.eval_metrics: dict[str, float] = {}
        self.eval_history: list[dict[str, float]] = []
        self.best: tuple[float, int] | None = None  # (value of run.export_best, step)
        self.best_export: str | None = None
        self.aside: AsideEvaluation | None = None  # ps: the evaluation running beside training

    def run(self) -> dict[str, Any]:
        started = time.time()
        try:
            self.build()
            self.events = EventWriter(self.model_dir, enabled=self.role.is_chief)
            if self.role.is_chief and self.plan.eval_data is not None:
                self.evaluator = Evaluator(
                    self.task, self.plan.eval_data, self.plan.train.file_format
                )
                self.eval_events = EventWriter(
                    self.model_dir, enabled=True, directory=self.model_dir.eval_events_dir
                )
            source = inputs.open_batches(
                self.spec, self.role, self.control, self.stepper.per_process_batch
            )
            try:
                end_reason = self.train(source, started)
                result = self.finish(source, end_reason)
            except BaseException:
                source.close("failed")
                raise
            source.close("done")
            return result
        finally:
            self.model_dir.close()

    # -- build and restore -------------------------------------------------------------------

    def build(self) -> None:
        """Strategy, model, optimizer and step variable; the latest checkpoint restored (or
        the fine-tuning source loaded); the step function."""
        import tensorflow as tf

        from sparktf import models

        plan = self.plan
        if plan.scaling.threads_per_worker:
            # Only intra-op: distributed runtimes need several inter-op threads (a
            # parameter-server step with one inter-op thread deadlocks).
            tf.config.threading.set_intra_op_parallelism_threads(plan.scaling.threads_per_worker)
        strategy, coordinator = self._strategy(tf)
        with strategy.scope():
            with models.precision_policy(self.task.config["precision"]):
                self.model = self.task.build_model()  # export/eval models: float32
            # before the optimizer: it builds slots for the trainable variables only
            warmstart.apply_trainable_scopes(self.model, plan.train.trainable_scopes)
            self.optimizer = self.task.make_optimizer(plan.steps_per_epoch, self.model)
            self.global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
        self._restore(tf)
        common = dict(global_batch=plan.global_batch, seed=plan.train.seed)
        parts = (self.task, self.model, self.optimizer, self.global_step)
        if coordinator is not None:
            self.stepper = ParameterServerStep(tf, strategy, coordinator, *parts, **common)
        else:
            workers = self.role.num_workers
            self.stepper = AllReduceStep(tf, strategy, *parts, num_workers=workers, **common)
        log.info(
            "%s: %s, global batch %d, steps %d -> %d",
            self.role.name,
            self.task.name,
            plan.global_batch,
            self.start_step,
            plan.target_steps,
        )

    def _strategy(self, tf):
        """The strategy from TF_CONFIG, and the chief's coordinator under ps."""
        if self.role.strategy == "ps":
            resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
            strategy = tf.distribute.ParameterServerStrategy(resolver)
            return strategy, tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
        # A collective that waits longer than the stall timeout (a peer stuck or gone) fails
        # the step instead of hanging the process.
        options = tf.distribute.experimental.CommunicationOptions(
            timeout_seconds=self.plan.run.stall_timeout_s
        )
        return tf.distribute.MultiWorkerMirroredStrategy(communication_options=options), None

    def _restore(self, tf) -> None:
        """The model directory's latest checkpoint, else the fine-tuning source, if any."""
        train = self.plan.train
        optimizers = self.optimizer if isinstance(self.optimizer, dict) else {"": self.optimizer}
        checkpoint = tf.train.Checkpoint(
            model=self.model,
            global_step=self.global_step,
            **{(f"{k}_optimizer" if k else "optimizer"): v for k, v in optimizers.items()},
        )
        restored = self.model_dir.attach(checkpoint, keep=self.plan.run.keep_checkpoints)
        if train.checkpoint_path and restored:
            log.info(
                "resuming from %s: --checkpoint-path %s is ignored", restored, train.checkpoint_path
            )
        elif train.checkpoint_path:  # every all-reduce worker: variables are not re-synced
            warmstart.warm_start(
                self.model, train.checkpoint_path, exclude_scopes=train.checkpoint_exclude_scopes
            )
        self.start_step = int(self.global_step.numpy())
        if restored:
            self.saved_step, self.checkpoint = self.start_step, restored

    # -- the loop ----------------------------------------------------------------------------

    def train(self, source: inputs.Source, started: float) -> str:
        """Steps until the target step or the end of the data; returns why it stopped."""
        run = self.plan.run
        hist_every = run.histogram_every_steps or run.checkpoint_every_steps
        agree = self.stepper.must_agree(source.finite)
        step = self.start_step
        batches = iter(source.batches)
        while step < self.plan.target_steps:
            batch = next(batches, None)
            if agree and self.stepper.finished_anywhere(batch is None):
                return "end of the fed data"
            if batch is None:
                return "end of the data"
            self.pending = self.stepper(batch)
            step += 1
            if self.meter.step():
                self.metrics = to_floats(self.pending)  # waits for the first step to end
                self.meter.first_step_done()
                log.info(
                    "first step done %.1f s after the process started",
                    self.meter.first_step_wall - started,
                )
            self.report(step)
            self.collect_evaluation(wait=False)
            at_checkpoint = step % run.checkpoint_every_steps == 0
            if at_checkpoint or step % hist_every == 0:
                self.stepper.join()
                if step % hist_every == 0:
                    self.snapshot(step)
                if at_checkpoint:
                    self.save(step)
            if self.evaluator and step % self.plan.eval_every_steps == 0:
                if step < self.plan.target_steps:  # the last one comes with the export
                    self.stepper.join()
                    if self.stepper.evaluates_aside:
                        self.collect_evaluation(wait=True)  # one at a time, in step order
                        self.aside = AsideEvaluation(self.evaluator, step, self.export_weights())
                    else:
                        self.evaluate(step, self.export_weights())
        return "target steps reached"

    def report(self, step: int) -> None:
        """The chief's scalars and progress, every ``summary_every_steps`` or second or two."""
        if not self.role.is_chief:
            self.control.set_progress({"step": step})  # the driver's stall check reads it
            return
        now = time.monotonic()
        run = self.plan.run
        if not (
            step % run.summary_every_steps == 0
            or step == self.plan.target_steps
            or now - self._last_progress >= min(run.progress_every_s, 2.0)
        ):
            return
        self._last_progress = now
        self.metrics = to_floats(self.pending)
        rate = self.meter.window_rate()
        self.events.scalars(step, {**self.metrics, "examples_per_sec": rate})
        self.control.set_progress(
            {**self.progress(step, rate), "first_step_wall": self.meter.first_step_wall}
        )

    def progress(self, step: int, rate: float) -> dict[str, Any]:
        evaluated = {"eval": self.eval_history[-1]} if self.eval_history else {}
        return {
            **evaluated,
            "step": step,
            "target": self.plan.target_steps,
            "epoch": step / self.plan.steps_per_epoch,
            "examples_per_sec": rate,
            **self.metrics,
        }

    # -- checkpoints, summaries, export ------------------------------------------------------

    def save(self, step: int) -> str:
        self.checkpoint = self.model_dir.save(step)
        self.saved_step = step
        return self.checkpoint

    def snapshot(self, step: int) -> list[np.ndarray]:
        """The weights (every all-reduce process reads them at the same steps); the chief
        writes their histograms and, for a GAN, sample images."""
        weights = self.model.get_weights()
        if not self.events.enabled:
            return weights
        self.events.histograms(step, [w.path for w in self.model.weights], weights)
        if self.task.kind == "gan":
            import tensorflow as tf

            if self._sampler is None:
                self._sampler = self.task.build_model()
            self._sampler.set_weights(weights)
            z = tf.random.stateless_uniform(
                [16, self.task.z_dim], seed=[7, 7], minval=-1.0, maxval=1.0
            )
            labels = tf.range(16, dtype=tf.int64) % int(self.task.config["num_classes"])
            images = self._sampler.generate(z, labels, training=False)
            self.events.images(step, "samples", self._sampler.to_uint8(images))
        return weights

    def export_weights(self) -> list[np.ndarray]:
        """The weights evaluated and exported: with ``moving_average_decay`` the trainable
        ones are their moving averages."""
        from sparktf import models

        return models.weights_for_export(self.task, self.model, self.optimizer)

    def _writer(self, weights: list[np.ndarray]):
        def write(local_dir: str) -> None:
            clean = self.task.build_model()  # outside the strategy: plain variables
            clean.set_weights(weights)
            self.task.export(clean, local_dir)

        return write

    def export(self, weights: list[np.ndarray], step: int) -> str:
        """Publishes ``export/<step>`` from a model built outside the strategy."""
        path = self.model_dir.export(self._writer(weights), step)
        log.info("exported %s", path)
        return path

    def collect_evaluation(self, *, wait: bool) -> None:
        """Records the evaluation running beside training once it has ended (``wait``: waits
        for it)."""
        aside = self.aside
        if aside is None or not (wait or aside.done()):
            return
        self.aside = None
        self.record_evaluation(aside.step, aside.weights, aside.result())

    def evaluate(self, step: int, weights: list[np.ndarray]) -> dict[str, float]:
        """The chief's evaluation of the weights of ``step``, recorded."""
        return self.record_evaluation(step, weights, self.evaluator(weights))

    def record_evaluation(
        self, step: int, weights: list[np.ndarray], metrics: dict[str, float]
    ) -> dict[str, float]:
        """An evaluation at ``step``: logged, TensorBoard ``events/eval``, sent to the driver
        with the next progress; ``export_best/<step>`` when its metric improved."""
        self.eval_metrics = metrics
        self.eval_history.append({"step": step, **metrics})
        self.eval_events.scalars(step, metrics)
        self.control.send("eval", self.eval_history[-1])  # the driver logs every one
        log.info(
            "evaluation at step %d on the %s split: %s",
            step,
            self.plan.eval_data.split,
            ", ".join(f"{k} {v:.4g}" for k, v in metrics.items()),
        )
        name = self.plan.run.export_best
        if name and self.plan.run.export:
            from sparktf.train.plan import EVAL_METRICS

            higher = EVAL_METRICS[self.task.kind][name]
            value = metrics[name]
            if self.best is None or (value > self.best[0] if higher else value < self.best[0]):
                self.best = (value, step)
                self.best_export = self.model_dir.export_best(self._writer(weights), step)
                log.info("best %s so far (%.4g): exported %s", name, value, self.best_export)
        return metrics

    def finish(self, source: inputs.Source, end_reason: str) -> dict[str, Any]:
        """Final checkpoint, snapshot and export; the process's result."""
        import tensorflow as tf

        self.stepper.join()
        # Training throughput: up to the end of the last step, not the final checkpoint,
        # snapshot, evaluation and export below (a baseline's clock stops at its last step).
        rate = self.meter.overall_rate()
        final_step = int(self.global_step.numpy())
        if self.pending is not None and self.role.is_chief:
            self.metrics = to_floats(self.pending)
        log.info("%s: training ended at step %d (%s)", self.role.name, final_step, end_reason)
        if final_step != self.saved_step:
            self.save(final_step)
        self.snapshot(final_step)
        weights = self.export_weights()
        self.collect_evaluation(wait=True)
        if self.evaluator is not None:
            self.evaluate(final_step, weights)
        export_path = None
        if self.role.is_chief and self.plan.run.export:
            export_path = self.export(weights, final_step)
        if self.role.is_chief:
            self.events.scalars(final_step, {**self.metrics, "examples_per_sec": rate})
            self.events.close()
            if self.eval_events is not None:
                self.eval_events.close()
            self.model_dir.finish(
                {
                    "model": self.task.name,
                    "model_config": self.task.config,
                    "strategy": self.role.strategy,
                    "final_step": final_step,
                    "export": export_path,
                    "checkpoint": self.checkpoint,
                    "signatures": self.task.signature_info(),
                    "eval": self.eval_history,
                    "best_export": self.best_export,
                }
            )
        return {
            "start_step": self.start_step,
            "final_step": final_step,
            "metrics": self.metrics,
            "checkpoint": self.checkpoint,
            "export_path": export_path,
            "examples": self.meter.examples,
            "examples_per_sec": rate,
            "first_step_wall": self.meter.first_step_wall,
            "end_reason": end_reason,
            "fed_rows": source.rows,
            "dropped_rows": source.dropped_rows,
            "gpus": [d.name for d in tf.config.list_logical_devices("GPU")],
            "progress": self.progress(final_step, rate),
            "eval_metrics": self.eval_metrics,
            "eval_history": self.eval_history,
            "best_export": self.best_export,
        }
