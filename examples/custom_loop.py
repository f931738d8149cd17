"""Your own training loop on Spark executors: ``sparktf.train.run`` with a GradientTape loop.

    ./scripts/submit.sh examples/custom_loop.py --model-dir /tmp/custom-loop
    .venv/bin/python examples/custom_loop.py --data hdfs://nn:8020/datasets/mnist \\
        --model-dir hdfs://nn:8020/models/custom-loop --epochs 5

What it does: every TensorFlow process of an all-reduce run (``--num-workers`` executors)
runs :func:`train_fn`: a softmax regression on MNIST-format images, trained by a plain
``tf.GradientTape`` loop under ``MultiWorkerMirroredStrategy`` on the process's shard of the
dataset (``get_context().dataset``). After each epoch the chief saves the weights to its
local directory and reports the epoch's loss with them as a checkpoint; a restarted run
(``--max-restarts``) resumes from the last one. Without ``--data`` it trains on the demo
MNIST-format set (synthetic, made once under ``.local/demo``). Prints the result as JSON: the
chief's return value, the reports, the restarts and resizes, the model directory.

Elastic (``--num-workers MIN:MAX``): the same function, unchanged, keeps the contract of an
elastic run. A lost worker starts it again with the workers that fit, from the last reported
checkpoint (``get_context().restored_dir``; ``world_size`` may differ, the global batch does
not: it must divide by every size). When slots come back, ``report()`` returns True after
the checkpoint it was given is published: the function returns, and the run goes on from
that checkpoint with more workers.

    ./scripts/submit.sh --profile standalone examples/custom_loop.py --num-workers 1:3 \
        --batch-size 24 --model-dir hdfs://nn:8020/models/elastic-loop
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run from a checkout without installing
    sys.path.insert(0, str(REPO))

from sparktf import cli  # noqa: E402
from sparktf.train.settings import worker_range  # noqa: E402

log = logging.getLogger("sparktf.examples.custom_loop")


def train_fn(config: dict) -> dict:
    """A softmax regression trained by hand; returns the last epoch's mean loss."""
    import keras
    import tensorflow as tf

    from sparktf.train import get_context, report

    ctx = get_context()
    strategy = ctx.strategy
    batch, steps = config["batch_size"], config["steps_per_epoch"]
    global_batch = batch  # dataset()'s batch is the global one: each process gets its part
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((28, 28, 1)), keras.layers.Rescaling(1 / 255), keras.layers.Flatten()]
            + [keras.layers.Dense(10)]
        )
        optimizer = keras.optimizers.SGD(config["learning_rate"])
    first_epoch = 0
    if ctx.restored_dir:  # a later attempt: the weights and epoch of the last report
        model.load_weights(os.path.join(ctx.restored_dir, "model.weights.h5"))
        with open(os.path.join(ctx.restored_dir, "epoch.json")) as f:
            first_epoch = json.load(f)["epoch"] + 1
    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

    @tf.function
    def step(iterator):
        def replica_step(images, labels):
            with tf.GradientTape() as tape:
                loss = tf.nn.compute_average_loss(
                    per_example(labels, model(images, training=True)),
                    global_batch_size=global_batch,
                )
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        images, labels = next(iterator)
        return strategy.reduce("SUM", strategy.run(replica_step, args=(images, labels)), None)

    data = ctx.dataset("train", batch_size=batch, columns=["image", "label"], label="label")
    iterator = iter(strategy.experimental_distribute_dataset(data))
    loss = float("nan")
    for epoch in range(first_epoch, config["epochs"]):
        loss = float(sum(float(step(iterator)) for _ in range(steps)) / steps)
        saved = os.path.join(ctx.local_dir, f"epoch-{epoch}")
        os.makedirs(saved, exist_ok=True)
        model.save_weights(os.path.join(saved, "model.weights.h5"))  # every worker: collective
        with open(os.path.join(saved, "epoch.json"), "w") as f:
            json.dump({"epoch": epoch}, f)
        if report({"step": (epoch + 1) * steps, "epoch": epoch, "loss": loss}, checkpoint=saved):
            break  # an elastic run grows: the run goes on from this checkpoint
    return {
        "loss": loss,
        "epochs": config["epochs"],
        "workers": ctx.world_size,
        "first_epoch": first_epoch,
    }


def parser():
    p = cli.parser("Train your own loop on Spark executors with sparktf.train.run.")
    p.add_argument("--data", help="a converted MNIST-format dataset; none: the demo set")
    p.add_argument("--model-dir", required=True, help="reports' checkpoints and TensorBoard events")
    p.add_argument(
        "--num-workers",
        type=worker_range,
        default=2,
        metavar="N|MIN:MAX",
        help="all-reduce processes (executors); MIN:MAX: elastic",
    )
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--steps-per-epoch", type=int, default=15)
    p.add_argument("--batch-size", type=int, default=32, help="global batch (all processes)")
    p.add_argument("--learning-rate", type=float, default=0.1)
    p.add_argument("--max-restarts", type=int, default=0, help="attempts after a failure")
    p.add_argument(
        "--grow-after", type=float, default=30.0, help="elastic: seconds slots stay free first"
    )
    return p


def main(argv: list[str] | None = None) -> int:
    args = cli.parse(parser(), argv)
    from sparktf.datasets import demo
    from sparktf.spark import get_session
    from sparktf.train import FailureConfig, RunConfig, ScalingConfig, run

    spark = get_session("sparktf-custom-loop", profile=args.profile)
    data = args.data or demo.ensure_dataset("mnist_softmax", spark=spark)
    result = run(
        train_fn,
        ScalingConfig(
            strategy="allreduce", num_workers=args.num_workers, grow_after_s=args.grow_after
        ),
        RunConfig(model_dir=args.model_dir, failure=FailureConfig(max_restarts=args.max_restarts)),
        config={
            "epochs": args.epochs,
            "steps_per_epoch": args.steps_per_epoch,
            "batch_size": args.batch_size,
            "learning_rate": args.learning_rate,
        },
        data=data,
        spark=spark,
    )
    print(
        json.dumps(
            {
                "value": result.value,
                "history": result.history,
                "model_dir": result.model_dir,
                "last_checkpoint": result.last_checkpoint,
                "restarts": result.restarts,
                "resizes": result.resizes,
                "processes": result.processes,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    cli.run(main)
