"""A TensorFlowOnSpark smoke run, submitted by tests/test_foundation.py through scripts/submit.sh.

Two TF nodes (chief + worker) on the two executors, MultiWorkerMirroredStrategy, data fed
from Spark (InputMode.SPARK), a few steps of a tiny Keras 3 model in a custom strategy.run
loop. Writes what each node saw to OUT/losses-* and the cluster's ports to OUT/ports.json.

    scripts/submit.sh tests/tfos_smoke.py OUT
"""

import json
import os
import sys

STEPS, BATCH = 4, 8


def main_fun(args, ctx):
    import keras
    import numpy as np
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.05)

    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(
                tf.square(model(x)[:, 0] - y), global_batch_size=BATCH * 2
            )
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    feed = ctx.get_data_feed(train_mode=True)
    losses = []
    for _ in range(STEPS):
        rows = np.array(feed.next_batch(BATCH), dtype=np.float32)
        per_replica = strategy.run(step, args=(rows[:, :4], rows[:, 4]))
        losses.append(float(strategy.reduce("SUM", per_replica, axis=None)))
    feed.terminate()
    with open(os.path.join(args["out"], f"losses-{ctx.job_name}-{ctx.task_index}"), "w") as f:
        f.write(" ".join(map(str, losses)))


def main(out: str) -> int:
    import numpy as np
    from pyspark.sql import SparkSession
    from tensorflowonspark import TFCluster

    sc = SparkSession.builder.appName("tfos-smoke").getOrCreate().sparkContext
    rng = np.random.default_rng(0)
    data = [[*map(float, x), float(x.sum())] for x in rng.normal(size=(STEPS * BATCH * 2, 4))]
    cluster = TFCluster.run(
        sc,
        main_fun,
        {"out": out},
        num_executors=2,
        num_ps=0,
        input_mode=TFCluster.InputMode.SPARK,
        master_node="chief",
        reservation_timeout=120,
    )
    cluster.train(sc.parallelize(data, 2), num_epochs=1, feed_timeout=120)
    cluster.shutdown(grace_secs=2, timeout=120)
    with open(os.path.join(out, "ports.json"), "w") as f:
        json.dump(sorted(node["port"] for node in cluster.cluster_info), f)
    sc.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
