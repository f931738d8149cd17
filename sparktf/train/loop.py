"""The one training loop, run in every TensorFlow process that trains.

For every model of the registry and both strategies:

* the strategy comes from ``TF_CONFIG`` (set by :mod:`sparktf.train.node` from the driver's
  plan): ``MultiWorkerMirroredStrategy`` (all-reduce) or ``ParameterServerStrategy`` with a
  ``ClusterCoordinator`` on the chief (ps);
* model, optimizer (with the registry's learning-rate schedule on ``optimizer.iterations``)
  and a ``global_step`` variable are built under ``strategy.scope()``; a checkpoint in the
  model directory is restored (step, optimizer state and so the schedule continue);
* each step is ``strategy.run(task.train_step, ...)`` inside a ``tf.function`` (Keras 3
  ``fit`` does not work under ``MultiWorkerMirroredStrategy``). All-reduce: every process
  feeds its own batch; the step's metrics are averaged over all replicas. ps: the chief
  hands each batch to ``coordinator.schedule`` and whichever worker is free runs the step
  (asynchronous updates);
* all-reduce processes stop together: when the input can end (spark input mode), every step
  starts with a one-number all-reduce that says whether any process has run out of rows;
* every ``checkpoint_every_steps`` and at the end: a checkpoint (named by global step), weight
  histograms (and sample images for a GAN); scalars (loss, accuracy or perplexity, learning
  rate, examples/s) every ``summary_every_steps``; progress to the driver every second;
* at the end the chief exports a SavedModel with the registry's signatures to
  ``export/<global step>`` (from a copy of the weights in a model built outside the strategy,
  so the SavedModel holds plain variables).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import numpy as np

log = logging.getLogger(__name__)


def _configure_threads(tf, threads: int) -> None:
    # Only intra-op: distributed runtimes need several inter-op threads (a parameter-server
    # step with one inter-op thread deadlocks).
    if threads:
        tf.config.threading.set_intra_op_parallelism_threads(threads)


class _Summaries:
    """TensorBoard output of the chief (no-ops elsewhere)."""

    def __init__(self, tf, model_dir, enabled: bool):
        from sparktf.train import summaries

        self.tf = tf
        self.write = summaries
        self.model_dir = model_dir
        self.writer = tf.summary.create_file_writer(model_dir.events_dir) if enabled else None

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if self.writer is None:
            return
        with self.writer.as_default(step=step):
            for name, value in values.items():
                self.write.scalar(name, value, step)
        self.model_dir.sync_events()

    def histograms(self, step: int, names: list[str], weights: list[np.ndarray]) -> None:
        if self.writer is None:
            return
        with self.writer.as_default(step=step):
            for name, value in zip(names, weights):
                self.write.histogram(f"weights/{name}", value, step)

    def images(self, step: int, name: str, images: Any) -> None:
        if self.writer is None:
            return
        with self.writer.as_default(step=step):
            self.write.image(name, images, step)

    def close(self) -> None:
        if self.writer is not None:
            self.writer.flush()
            self.writer.close()


def run(spec: dict, plan: dict, control) -> dict:
    """Trains as the chief or an all-reduce worker; returns the result (chief: complete)."""
    import tensorflow as tf

    from sparktf import models
    from sparktf.train import inputs
    from sparktf.train.artifacts import ModelDir

    started = time.time()
    _configure_threads(tf, int(spec.get("threads_per_worker") or 0))
    is_chief = plan["role"] == "chief"
    ps = plan["strategy"] == "ps"
    if ps:
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        strategy = tf.distribute.ParameterServerStrategy(resolver)
        coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    else:
        strategy = tf.distribute.MultiWorkerMirroredStrategy()
        coordinator = None

    task = models.get_task(spec["model"], **spec["model_config"])
    global_batch = int(spec["global_batch"])
    model_dir = ModelDir(spec["model_dir"], writer=is_chief, sync_every_s=spec["sync_every_s"])
    with strategy.scope():
        model = task.build_model()
        optimizer = task.make_optimizer(int(spec["steps_per_epoch"]), model)
        global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    optimizers = optimizer if isinstance(optimizer, dict) else {"": optimizer}
    checkpoint = tf.train.Checkpoint(
        model=model, global_step=global_step,
        **{(f"{k}_optimizer" if k else "optimizer"): v for k, v in optimizers.items()})
    manager = tf.train.CheckpointManager(checkpoint, model_dir.checkpoint_dir,
                                         max_to_keep=int(spec["keep_checkpoints"]),
                                         checkpoint_name="ckpt")
    restored = model_dir.fetch_latest()
    if restored:
        checkpoint.restore(restored).expect_partial()
        log.info("restored %s", restored)
    start_step = int(global_step.numpy())
    target = int(spec["target_steps"])
    log.info("%s: %s, global batch %d, steps %d -> %d", plan["name"], task.name, global_batch,
             start_step, target)

    # -- the step --------------------------------------------------------------------------
    if ps:
        per_process_batch = global_batch

        @tf.function
        def train_fn(batch):
            per_replica = strategy.run(task.train_step,
                                       args=(model, optimizer, batch, global_batch))
            global_step.assign_add(1)
            return models.reduce_metrics(strategy, per_replica)
    else:
        num_workers = int(plan["num_workers"])
        devices = list(strategy.extended.worker_devices)
        per_process_batch = global_batch // num_workers
        per_replica_batch = per_process_batch // len(devices)

        def on_local_device(tree):
            ctx = tf.distribute.get_replica_context()
            index = (tf.get_static_value(ctx.replica_id_in_sync_group) or 0) % len(devices)
            with tf.device(devices[index]):  # all_reduce needs values placed on a device
                return tf.nest.map_structure(tf.identity, tree)

        @tf.function
        def train_fn(batch):
            def replica_step(local_batch):
                metrics = task.train_step(model, optimizer, local_batch, global_batch)
                ctx = tf.distribute.get_replica_context()
                return ctx.all_reduce(tf.distribute.ReduceOp.MEAN, on_local_device(metrics))

            out = strategy.run(replica_step, args=(batch,))
            global_step.assign_add(1)
            return strategy.experimental_local_results(out)[0]

        @tf.function
        def any_finished(flag):
            def replica_flag(f):
                ctx = tf.distribute.get_replica_context()
                return ctx.all_reduce(tf.distribute.ReduceOp.SUM, on_local_device(f))

            out = strategy.run(replica_flag, args=(flag,))
            return strategy.experimental_local_results(out)[0]

        def distribute(values):
            tensors = {k: tf.convert_to_tensor(v) for k, v in values.items()}
            if len(devices) == 1:
                return strategy.experimental_distribute_values_from_function(lambda _: tensors)

            def part(ctx):
                i = ctx.replica_id_in_sync_group % len(devices)
                lo, hi = i * per_replica_batch, (i + 1) * per_replica_batch
                return {k: v[lo:hi] for k, v in tensors.items()}

            return strategy.experimental_distribute_values_from_function(part)

        def finished_anywhere(local_finished: bool) -> bool:
            flag = strategy.experimental_distribute_values_from_function(
                lambda _: tf.constant(1.0 if local_finished else 0.0))
            return float(any_finished(flag)) > 0

    # -- input -----------------------------------------------------------------------------
    source = inputs.open_batches(spec, plan, control, per_process_batch)
    agree = (not ps) and source.finite and int(plan["num_workers"]) > 1

    summaries = _Summaries(tf, model_dir, enabled=is_chief)
    sampler = None
    weight_names = [w.path for w in model.weights]
    saved_step = start_step if restored else -1
    hist_every = int(spec["histogram_every_steps"]) or int(spec["checkpoint_every_steps"])
    last_saved_prefix = restored

    def save(step: int) -> str:
        nonlocal saved_step, last_saved_prefix
        prefix = manager.save(checkpoint_number=step)
        saved_step = step
        last_saved_prefix = prefix
        if is_chief:
            last_saved_prefix = model_dir.push_checkpoint(prefix, list(manager.checkpoints))
            log.info("checkpoint %s", last_saved_prefix)
        return last_saved_prefix

    def snapshot(step: int) -> list[np.ndarray]:
        """Weights (every all-reduce process reads them at the same steps), histograms and
        GAN samples (chief)."""
        nonlocal sampler
        weights = model.get_weights()
        summaries.histograms(step, weight_names, weights)
        if is_chief and task.kind == "gan":
            if sampler is None:
                sampler = task.build_model()
            sampler.set_weights(weights)
            z = tf.random.stateless_uniform([16, task.z_dim], seed=[7, 7], minval=-1.0,
                                            maxval=1.0)
            labels = tf.range(16, dtype=tf.int64) % int(task.config["num_classes"])
            images = sampler.to_uint8(sampler.generate(z, labels, training=False))
            summaries.images(step, "samples", images)
        return weights

    def to_floats(metrics) -> dict[str, float]:
        if hasattr(metrics, "fetch"):
            metrics = metrics.fetch()
        return {k: float(np.asarray(v)) for k, v in metrics.items()}

    # -- the loop --------------------------------------------------------------------------
    step = start_step
    examples = 0
    train_started = time.monotonic()
    window_start, window_examples = train_started, 0
    rate_start, rate_examples = train_started, 0
    last_progress = 0.0
    first_step_wall = None
    last_metrics: dict[str, float] = {}
    pending = None
    spe = max(1, int(spec["steps_per_epoch"]))
    progress_every = min(float(spec["progress_every_s"]), 2.0)
    end_reason = "target steps reached"
    batches = iter(source.batches)
    try:
        while step < target:
            batch = next(batches, None)
            if agree:
                if finished_anywhere(batch is None):
                    end_reason = "end of the fed data"
                    break
            elif batch is None:
                end_reason = "end of the data"
                break
            if ps:
                pending = coordinator.schedule(
                    train_fn, args=({k: tf.convert_to_tensor(v) for k, v in batch.items()},))
            else:
                pending = train_fn(distribute(batch))
            step += 1
            examples += global_batch
            window_examples += global_batch
            if first_step_wall is None:  # the first step also traces: rates start after it
                last_metrics = to_floats(pending)
                first_step_wall = time.time()
                rate_start, rate_examples = time.monotonic(), examples
                window_start, window_examples = rate_start, 0
                log.info("first step done %.1f s after the process started",
                         first_step_wall - started)
            now = time.monotonic()
            report = is_chief and (step % int(spec["summary_every_steps"]) == 0
                                   or now - last_progress >= progress_every or step == target)
            if report:
                last_metrics = to_floats(pending)
                rate = window_examples / max(now - window_start, 1e-9)
                window_start, window_examples = now, 0
                summaries.scalars(step, {**last_metrics, "examples_per_sec": rate})
                control.set_progress({"step": step, "target": target, "epoch": step / spe,
                                      "examples_per_sec": rate, "first_step_wall": first_step_wall,
                                      **last_metrics})
                last_progress = now
            if step % int(spec["checkpoint_every_steps"]) == 0 or step % hist_every == 0:
                if ps:
                    coordinator.join()
                if step % hist_every == 0:
                    snapshot(step)
                if step % int(spec["checkpoint_every_steps"]) == 0:
                    save(step)
        if ps:
            coordinator.join()
        train_s = time.monotonic() - train_started
        final_step = int(global_step.numpy())
        if pending is not None and is_chief:
            last_metrics = to_floats(pending)
        log.info("%s: training ended at step %d (%s)", plan["name"], final_step, end_reason)
        checkpoint_uri = last_saved_prefix
        if final_step != saved_step:
            checkpoint_uri = save(final_step)
        weights = snapshot(final_step)
        export_path = None
        if is_chief and spec["export"]:
            def write(local_dir: str) -> None:
                clean = task.build_model()  # outside the strategy: plain variables
                clean.set_weights(weights)
                task.export(clean, local_dir)

            export_path = model_dir.publish_export(write, final_step)
            log.info("exported %s", export_path)
        measured = time.monotonic() - rate_start
        rate = (examples - rate_examples) / measured if examples > rate_examples else 0.0
        if is_chief:
            summaries.scalars(final_step, {**last_metrics, "examples_per_sec": rate})
            summaries.close()
            model_dir.sync_events(force=True)
            model_dir.write_run_info({"model": task.name, "model_config": task.config,
                                      "strategy": plan["strategy"], "final_step": final_step,
                                      "export": export_path, "checkpoint": checkpoint_uri,
                                      "signatures": task.signature_info()})
        result = {"start_step": start_step, "final_step": final_step, "metrics": last_metrics,
                  "checkpoint": checkpoint_uri, "export_path": export_path,
                  "examples": examples, "train_seconds": train_s,
                  "examples_per_sec": rate, "first_step_wall": first_step_wall,
                  "end_reason": end_reason, "fed_rows": getattr(source, "rows", None),
                  "gpus": [d.name for d in tf.config.list_logical_devices("GPU")],
                  "dropped_rows": getattr(source, "dropped_rows", None),
                  "progress": {"step": final_step, "target": target, "epoch": final_step / spe,
                               "examples_per_sec": rate, **last_metrics}}
        source.close("done")
        return result
    except BaseException:
        source.close("failed")
        raise
    finally:
        model_dir.close()
