"""Benchmark of batch inference: ``sparktf.predict`` against two baselines, same run.

    .venv/bin/python bench/predict.py [--resnet-rows 4096] [--mlp-rows 32768] [--batch-size 128]

For ResNet-20 (CIFAR, 32x32x3) and the MNIST MLP, both exported with random weights:

* **single process**: the SavedModel's ``predict_images`` called in this one plain
  TensorFlow process over a numpy array already in memory, ``batch-size`` rows per call;
* **sparktf.predict**: over a Parquet table of the same images (``np.save`` bytes, as the
  converted datasets store them), written with Spark's ``noop`` sink;
* **predict_batch_udf**: ``pyspark.ml.functions.predict_batch_udf`` with the same model,
  signature, batch size and TensorFlow threads, decoding the same column with ``np.load``.

Spark runs the ``local`` profile (``local-cluster[2,1,1024]``: two executors of one core),
one fresh session per Spark variant, the models one after the other. Each (variant, model)
runs once to warm up (TensorFlow import, model load in every worker), then ``--repeats``
timed passes. Peak executor memory is sampled with psutil (PSS, so pages shared between
forked Python workers count once) over each executor JVM and its Python processes; a later
model's peak includes what the earlier one left in the workers. Prints JSON and writes it
to ``bench/results/predict-<time>.json``.
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import platform
import sys
import tempfile
import threading
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

log = logging.getLogger("bench.predict")

MODELS = {  # name -> (registry name, overrides, image shape)
    "resnet20": ("resnet20", {}, (32, 32, 3)),
    "mnist_mlp": ("mnist_mlp", {}, (28, 28, 1)),
}


# ----------------------------------------------------------------------------- memory


class ExecutorMemory:
    """Samples the memory of the executors (JVM + Python workers) in a background thread."""

    def __init__(self, interval_s: float = 0.5):
        import psutil

        self._psutil = psutil
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.peak_total = 0
        self.peak_python = 0
        self.peak_per_executor: dict[int, int] = {}

    def _memory(self, proc) -> int:
        try:
            info = proc.memory_full_info()
            return getattr(info, "pss", info.rss)
        except (self._psutil.NoSuchProcess, self._psutil.AccessDenied):
            return 0

    def executors(self) -> list:
        found = []
        for proc in self._psutil.Process().children(recursive=True):
            try:
                if "CoarseGrainedExecutorBackend" in " ".join(proc.cmdline()):
                    found.append(proc)
            except (self._psutil.NoSuchProcess, self._psutil.AccessDenied):
                continue
        return found

    def sample(self) -> None:
        total = python = 0
        for executor in self.executors():
            try:
                children = executor.children(recursive=True)
            except self._psutil.NoSuchProcess:
                continue
            py = sum(self._memory(p) for p in children)
            own = self._memory(executor) + py
            self.peak_per_executor[executor.pid] = max(
                self.peak_per_executor.get(executor.pid, 0), own
            )
            total += own
            python += py
        self.peak_total = max(self.peak_total, total)
        self.peak_python = max(self.peak_python, python)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self) -> ExecutorMemory:
        self.sample()
        self._thread = threading.Thread(target=self._run, daemon=True, name="memory")
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()
        self.sample()

    def report(self) -> dict:
        mb = 1 << 20
        return {
            "peak_total_mb": round(self.peak_total / mb),
            "peak_python_workers_mb": round(self.peak_python / mb),
            "peak_per_executor_mb": sorted(round(v / mb) for v in self.peak_per_executor.values()),
        }


# ----------------------------------------------------------------------------- data, models


def npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def export_model(name: str, export_dir: Path) -> str:
    import keras

    from sparktf import models

    registry_name, overrides, _ = MODELS[name]
    keras.utils.set_random_seed(0)
    task = models.get_task(registry_name, **overrides)
    task.export(task.build_model(), str(export_dir))
    return str(export_dir)


def write_table(images: np.ndarray, directory: Path, files: int) -> str:
    """A Parquet table like a converted split (id, label, image as np.save bytes)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True)
    for part, index in enumerate(np.array_split(np.arange(len(images)), files)):
        table = pa.table(
            {
                "id": pa.array(index, pa.int64()),
                "label": pa.array(index % 10, pa.int64()),
                "image": pa.array([npy(images[i]) for i in index], pa.binary()),
            }
        )
        pq.write_table(table, directory / f"part-{part:05d}.parquet")
    return "file://" + str(directory)


# ----------------------------------------------------------------------------- variants


def single_process(model_dir: str, images: np.ndarray, batch_size: int, repeats: int) -> float:
    import tensorflow as tf

    fn = tf.saved_model.load(model_dir).signatures["predict_images"]
    fn(images=tf.constant(images[:batch_size]))  # warm-up
    best = []
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(0, len(images), batch_size):
            fn(images=tf.constant(images[i : i + batch_size]))["scores"].numpy()
        best.append(len(images) / (time.perf_counter() - start))
    return float(np.mean(best))


def make_batch_udf(model_dir: str, batch_size: int):
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql import types as T

    def make_predict_fn():
        import tensorflow as tf
        from pyspark import TaskContext

        context = TaskContext.get()
        threads = context.cpus() if context is not None else 0
        try:  # the same threads as sparktf.predict uses
            tf.config.threading.set_intra_op_parallelism_threads(threads)
            tf.config.threading.set_inter_op_parallelism_threads(threads)
        except RuntimeError:
            pass
        root = tf.saved_model.load(model_dir)
        fn = root.signatures["predict_images"]

        def predict(images: np.ndarray) -> dict:
            batch = np.stack([np.load(io.BytesIO(b)) for b in images.reshape(-1)])
            out = fn(images=tf.constant(batch))
            _ = root  # keep the variables alive with the function
            return {"prediction": out["classes"].numpy(), "probabilities": out["scores"].numpy()}

        return predict

    return_type = T.StructType(
        [
            T.StructField("prediction", T.LongType()),
            T.StructField("probabilities", T.ArrayType(T.FloatType())),
        ]
    )
    return predict_batch_udf(make_predict_fn, return_type=return_type, batch_size=batch_size)


def timed_spark(build, rows: int, repeats: int) -> tuple[float, float, dict]:
    """(warm-up seconds, mean rows/s of the timed passes, memory report)."""
    with ExecutorMemory() as memory:
        start = time.perf_counter()
        build().write.format("noop").mode("overwrite").save()
        warmup = time.perf_counter() - start
        rates = []
        for _ in range(repeats):
            start = time.perf_counter()
            build().write.format("noop").mode("overwrite").save()
            rates.append(rows / (time.perf_counter() - start))
    return warmup, float(np.mean(rates)), memory.report()


# ----------------------------------------------------------------------------- main


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--resnet-rows", type=int, default=4096)
    p.add_argument("--mlp-rows", type=int, default=32768)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument(
        "--partitions",
        type=int,
        default=4,
        help="Parquet files, hence Spark partitions (2 per executor by default)",
    )
    p.add_argument("--models", nargs="*", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--results", default=str(REPO / "bench" / "results"))
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    for noisy in ("py4j", "tensorflow", "absl"):
        logging.getLogger(noisy).setLevel(logging.WARNING)

    import sparktf
    from sparktf.spark import get_session

    rng = np.random.default_rng(0)
    results: dict = {
        "benchmark": "predict",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "config": {
            "batch_size": args.batch_size,
            "repeats": args.repeats,
            "partitions": args.partitions,
            "spark_profile": "local",
            "tf_threads_per_worker": "spark.task.cpus (1)",
        },
        "models": {},
    }
    with tempfile.TemporaryDirectory(prefix="sparktf-bench-") as tmp:
        prepared = {}
        for name in args.models:
            shape = MODELS[name][2]
            rows = args.resnet_rows if name == "resnet20" else args.mlp_rows
            images = rng.integers(0, 256, (rows, *shape), dtype=np.uint8)
            model_dir = export_model(name, Path(tmp) / name / "export" / "1")
            table = write_table(images, Path(tmp) / name / "table", args.partitions)
            log.info("%s: %d rows; single-process baseline", name, rows)
            baseline = single_process(model_dir, images, args.batch_size, args.repeats)
            prepared[name] = (rows, model_dir, table, baseline)

        measured: dict = {name: {} for name in prepared}
        for variant in ("sparktf_predict", "predict_batch_udf"):
            # One fresh session per variant: no Python worker, imported TensorFlow or cached
            # model carries over from the other variant.
            spark = get_session("sparktf-bench-predict", profile="local")
            try:
                for name, (rows, model_dir, table, _) in prepared.items():
                    log.info("%s: %s", name, variant)
                    df = spark.read.parquet(table)
                    if variant == "sparktf_predict":

                        def build(df=df, model_dir=model_dir):
                            return sparktf.predict(df, model_dir, batch_size=args.batch_size)
                    else:  # one UDF for all passes: its model cache is keyed by the UDF
                        udf = make_batch_udf(model_dir, args.batch_size)

                        def build(df=df, udf=udf):
                            return df.withColumn("preds", udf("image"))

                    measured[name][variant] = timed_spark(build, rows, args.repeats)
            finally:
                spark.stop()
        for name, (rows, _, _, baseline) in prepared.items():
            warmups = {k: v[0] for k, v in measured[name].items()}
            rates = {k: v[1] for k, v in measured[name].items()}
            results["models"][name] = {
                "rows": rows,
                "rows_per_s": {
                    "single_process_tf": round(baseline),
                    **{k: round(v) for k, v in rates.items()},
                },
                "ratio_sparktf_vs_single_process": round(rates["sparktf_predict"] / baseline, 3),
                "ratio_sparktf_vs_predict_batch_udf": round(
                    rates["sparktf_predict"] / rates["predict_batch_udf"], 3
                ),
                "warmup_pass_s": {k: round(v, 1) for k, v in warmups.items()},
                "executor_memory": {k: v[2] for k, v in measured[name].items()},
            }

    text = json.dumps(results, indent=2)
    print(text)
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"predict-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(text + "\n")
    log.info("wrote %s", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
