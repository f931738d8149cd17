"""What a training process builds before its first step: :func:`build_training`.

The strategy comes from ``TF_CONFIG`` (set by :mod:`sparktf.train.process.main` from the driver's
plan): ``MultiWorkerMirroredStrategy`` (all-reduce) or ``ParameterServerStrategy`` with a
``ClusterCoordinator`` on the chief (ps). Under ``strategy.scope()``: the model (in the
task's precision policy), the variables left to train (``TrainConfig.trainable_scopes``),
the optimizer with the registry's learning-rate schedule, and a ``global_step`` variable.
Then the model directory's latest checkpoint is restored (step, optimizer state and so the
schedule continue), or, on a fresh run, the fine-tuning source is loaded
(``TrainConfig.warm_start_from``); last, the step function of the strategy
(:mod:`sparktf.train.process.steps`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sparktf.train.artifacts import ModelDir
from sparktf.train.plan import Role, RunPlan
from sparktf.train.process import milestones, warmstart
from sparktf.train.process.steps import AllReduceStep, ParameterServerStep

__all__ = ["Built", "build_training", "make_strategy"]

log = logging.getLogger(__name__)


@dataclass
class Built:
    """A process ready to train: ``optimizer`` is one optimizer or a dict of them (a GAN's
    two nets); ``start_step`` is the restored global step (0 on a fresh run) and
    ``restored_from`` the checkpoint it came from (None on a fresh run)."""

    model: Any
    optimizer: Any
    global_step: Any
    stepper: AllReduceStep | ParameterServerStep
    start_step: int
    restored_from: str | None


def build_training(
    plan: RunPlan,
    role: Role,
    task,
    model_dir: ModelDir,
    *,
    with_strategy: Callable[[], None] = lambda: None,
) -> Built:
    """Strategy, model, optimizer and step variable; the latest checkpoint restored (or the
    fine-tuning source loaded) and attached to ``model_dir`` for the next saves; the step.

    ``with_strategy`` is called once the strategy exists, before the model is built: the
    first TensorFlow work that may run beside the build (a strategy must configure the
    runtime before anything else uses it)."""
    import tensorflow as tf

    from sparktf import models

    milestones.mark("tensorflow_imported")  # unless imported before the role came (CPU)

    if plan.scaling.threads_per_worker:
        # Only intra-op: distributed runtimes need several inter-op threads (a
        # parameter-server step with one inter-op thread deadlocks).
        tf.config.threading.set_intra_op_parallelism_threads(plan.scaling.threads_per_worker)
    strategy, coordinator = make_strategy(tf, plan, role)
    milestones.mark("strategy_ready")
    with_strategy()
    with strategy.scope():
        with models.precision_policy(task.config["precision"]):
            model = task.build_model()  # export/eval models: float32
        # before the optimizer: it builds slots for the trainable variables only
        warmstart.apply_trainable_scopes(model, plan.train.trainable_scopes)
        optimizer = task.make_optimizer(plan.steps_per_epoch, model)
        global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    restored = _restore(tf, plan, role, model_dir, model, optimizer, global_step)
    if plan.elastic and plan.scaling.scale_batch:
        _set_learning_rate(task, optimizer)
    start_step = int(global_step.numpy())
    common = dict(global_batch=plan.global_batch, seed=plan.train.seed)
    parts = (task, model, optimizer, global_step)
    if coordinator is not None:
        stepper = ParameterServerStep(tf, strategy, coordinator, *parts, **common)
    else:
        stepper = AllReduceStep(tf, strategy, *parts, num_workers=role.num_workers, **common)
    log.info(
        "%s: %s, global batch %d, steps %d -> %d",
        role.name,
        task.name,
        plan.global_batch,
        start_step,
        plan.target_steps,
    )
    milestones.mark("model_built")
    return Built(model, optimizer, global_step, stepper, start_step, restored)


def _set_learning_rate(task, optimizer) -> None:
    """``ScalingConfig.scale_batch``: a constant learning rate is a variable the checkpoint
    restored at the size it was saved with; it is set to this attempt's (the plan scaled
    the config's). A schedule is built from the config and needs nothing."""
    rate = task.config.get("learning_rate")
    if rate is None:
        return
    for each in optimizer.values() if isinstance(optimizer, dict) else [optimizer]:
        variable = getattr(getattr(each, "inner_optimizer", each), "_learning_rate", None)
        if hasattr(variable, "assign"):
            variable.assign(float(rate))


def make_strategy(tf, plan: RunPlan, role: Role):
    """The strategy from TF_CONFIG, and the chief's coordinator under ps."""
    if role.strategy == "ps":
        resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
        strategy = tf.distribute.ParameterServerStrategy(resolver)
        return strategy, tf.distribute.experimental.coordinator.ClusterCoordinator(strategy)
    # No CommunicationOptions(timeout_seconds=...): TensorFlow (2.21) starts a thread per
    # collective that lives until the timeout, so a fast step (hundreds of collectives a
    # second) piles up thousands of threads and the process aborts ("Resource temporarily
    # unavailable") within a minute. A stuck collective is bounded by the driver instead:
    # its stall watch (FailureConfig.stall_timeout_s) aborts the run, and every process
    # leaves through its heartbeat thread (os._exit) even while a collective blocks.
    return tf.distribute.MultiWorkerMirroredStrategy(), None


def _restore(
    tf, plan: RunPlan, role: Role, model_dir: ModelDir, model, optimizer, global_step
) -> str | None:
    """The model directory's latest checkpoint (returned), else the fine-tuning source, if
    any."""
    train = plan.train
    optimizers = optimizer if isinstance(optimizer, dict) else {"": optimizer}
    tf_checkpoint = tf.train.Checkpoint(
        model=model,
        global_step=global_step,
        **{(f"{k}_optimizer" if k else "optimizer"): v for k, v in optimizers.items()},
    )
    # under ps the files are written here, not on the parameter servers' hosts
    io_device = f"/job:{role.role}/replica:0/task:{role.index}/device:CPU:0"
    restored = model_dir.attach(
        tf_checkpoint,
        keep=plan.run.checkpoint.keep,
        io_device=io_device if plan.scaling.strategy == "ps" else None,
    )
    if train.warm_start_from and restored:
        log.info(
            "resuming from %s: --warm-start-from %s is ignored", restored, train.warm_start_from
        )
    elif train.warm_start_from:  # every all-reduce worker: variables are not re-synced
        warmstart.warm_start(
            model, train.warm_start_from, exclude_scopes=train.warm_start_exclude_scopes
        )
    return restored
