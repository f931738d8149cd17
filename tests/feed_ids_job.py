"""A test's job (tests/test_elastic.py): ``run(train_fn)`` over a table of ids stored sorted,
each process recording the ids that reach its training step, attempt by attempt.

    scripts/submit.sh --profile standalone tests/feed_ids_job.py --out DIR --model-dir DIR \\
        --num-workers 1:3 [--rows 1003 --batch 12 --epochs 30 --every 10]

Each training process appends ``[step, ids]`` per step to ``OUT/ids-a<attempt>-r<rank>.jsonl``
and reports a checkpoint (its step) every ``--every`` steps; ``report()`` returning True
(an elastic run growing) ends the attempt after that checkpoint. Prints the result as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))


def record_ids(config):
    """A custom loop whose step returns the ids it trained on; each process appends them,
    step by step, to a file of its own (per attempt), and reports a checkpoint (its step)
    every ``every`` steps; ``report()`` returning True (an elastic run growing) ends the
    attempt there. ``feature``: the column trained on (``x``); ``die``: the attempt 0 worker
    1 kills itself at that step (tests/test_feed_epochs.py)."""
    import numpy as np
    import tensorflow as tf

    from sparktf.train import get_context, report

    ctx = get_context()
    strategy = ctx.strategy
    step = 0
    if ctx.restored_dir:
        with open(os.path.join(ctx.restored_dir, "step.json")) as f:
            step = json.load(f)["step"]
    feature = config.get("feature", "x")
    data = ctx.dataset(batch_size=config["batch"], columns=["id", feature])
    iterator = iter(strategy.experimental_distribute_dataset(data))
    with strategy.scope():
        w = tf.Variable(0.0)

    @tf.function
    def train_step(batch):
        def replica(b):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean((w * tf.cast(b[feature], tf.float32) - 1.0) ** 2)
            w.assign_sub(0.01 * tape.gradient(loss, w))
            return b["id"]

        return strategy.run(replica, args=(batch,))

    path = Path(config["out"]) / f"ids-a{ctx.attempt}-r{ctx.rank}.jsonl"
    with open(path, "a") as out:
        while step < config["steps"]:
            ids = strategy.experimental_local_results(train_step(next(iterator)))
            step += 1
            out.write(json.dumps([step, np.concatenate([i.numpy() for i in ids]).tolist()]))
            out.write("\n")
            out.flush()
            if config.get("die") == step and ctx.attempt == 0 and ctx.rank == 1:
                os.kill(os.getpid(), 9)
            if step % config["every"] == 0:
                saved = os.path.join(ctx.local_dir, f"step-{step}")
                os.makedirs(saved, exist_ok=True)
                with open(os.path.join(saved, "step.json"), "w") as f:
                    json.dump({"step": step}, f)
                if report({"step": step}, checkpoint=saved):
                    break
    return {"step": step, "workers": ctx.world_size}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--model-dir", required=True)
    p.add_argument("--num-workers", default="1:3")
    p.add_argument("--rows", type=int, default=1003)
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--epochs", type=int, default=30)
    p.add_argument("--every", type=int, default=10)
    p.add_argument("--grow-after", type=float, default=3.0)
    args = p.parse_args()
    from pyspark.sql import functions as F

    from sparktf.spark import get_session
    from sparktf.train import RunConfig, ScalingConfig, run
    from sparktf.train.settings import worker_range

    spark = get_session("sparktf-feed-ids")
    df = spark.range(args.rows, numPartitions=1).withColumn("x", F.col("id") / args.rows)
    df = df.withColumn("k", F.col("id") * 7 % 13).repartitionByRange(7, "k").drop("k")
    Path(args.out).mkdir(parents=True, exist_ok=True)
    steps = args.epochs * (args.rows // args.batch)
    result = run(
        record_ids,
        ScalingConfig(num_workers=worker_range(args.num_workers), grow_after_s=args.grow_after),
        RunConfig(model_dir=args.model_dir),
        config={"batch": args.batch, "steps": steps, "every": args.every, "out": args.out},
        data=df,
        spark=spark,
    )
    print(json.dumps({"value": result.value, "restarts": result.restarts,
                      "resizes": result.resizes, "feed_epochs": result.feed_epochs}))  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
