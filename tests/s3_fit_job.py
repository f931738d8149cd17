"""A user's program for tests/test_s3_spark.py: Spark writes and reads a Parquet table on S3
(Hadoop's S3A connector) and ``fit(data=df)`` trains from it with the model directory on S3.
It is given only what ``scripts/s3.sh start`` printed; it prints one JSON line.

    python tests/s3_fit_job.py S3_URI [--in-memory] [--kill-in-export]

``--in-memory`` trains from a DataFrame made in the driver instead (nothing read from S3):
what a run whose keys are refused does before it writes anything. ``--kill-in-export``: the
chief's TensorFlow process kills itself (SIGKILL) in the middle of publishing the export,
once its first object is in place (the model's builder, which runs there, sets the hook).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

KILL_IN_EXPORT = False  # set by main; travels with build (pickled by value from __main__)


def _die_in_export(path: str, copied: int) -> None:
    if "/export/" in path:
        os.kill(os.getpid(), signal.SIGKILL)


def build(inputs, num_classes, hidden_units=8):
    import keras

    if KILL_IN_EXPORT:
        from sparktf.storage import publishing

        publishing.commit_hook = _die_in_export
    x = keras.layers.Dense(hidden_units, activation="relu")(inputs["num"])
    return keras.Model(inputs, keras.layers.Dense(num_classes)(x))


def main(base: str, in_memory: bool = False) -> dict:
    import numpy as np
    from pyspark.ml.linalg import Vectors

    from sparktf import models, storage
    from sparktf.spark import get_session, stop_session
    from sparktf.train import RunConfig, ScalingConfig, TrainConfig, fit

    models.register("s3_mlp", build, inputs=["num"], num_classes=2, batch_size=32)
    spark = get_session("sparktf-s3-fit", overrides={"spark.master": "local-cluster[2,1,1024]"})
    try:
        rng = np.random.default_rng(0)
        x = rng.normal(size=(512, 2))
        rows = [(i, Vectors.dense(x[i].tolist()), int(x[i].sum() > 0)) for i in range(len(x))]
        frame = spark.createDataFrame(rows, ["id", "num", "y"])
        if not in_memory:
            table = storage.spark_uri(f"{base}/frame")
            frame.write.mode("overwrite").parquet(table)
            frame = spark.read.parquet(table)
        started = time.monotonic()
        try:
            result = fit(
                TrainConfig(model="s3_mlp", data=frame, epochs=2, seed=1),
                ScalingConfig(strategy="allreduce", num_workers=2, threads_per_worker=1),
                RunConfig(model_dir=f"{base}/model"),
                spark=spark,
                columns={"label": "y"},
            )
        except Exception as exc:
            return {"error": f"{type(exc).__name__}: {exc}", "took": time.monotonic() - started}
        return {
            "final_step": result.final_step,
            "export": result.export_dir,
            "files": storage.walk_files(f"{base}/model"),
            "rows": frame.count(),
        }
    finally:
        stop_session(spark)


if __name__ == "__main__":
    KILL_IN_EXPORT = "--kill-in-export" in sys.argv[2:]
    print(json.dumps(main(sys.argv[1], "--in-memory" in sys.argv[2:])), flush=True)
