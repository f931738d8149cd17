"""Benchmark of batch inference: ``sparktf.predict`` against two baselines, same run.

    .venv/bin/python bench/predict.py [--resnet-rows 4096] [--mlp-rows 262144]
        [--keras-rows 524288] [--micro-batches 2] [--rounds 3] [--budget SECONDS]

For ResNet-20 (CIFAR, 32x32x3) and the MNIST MLP, both exported with random weights, over
the same rows (a Parquet table of ``id``, ``label`` and the images as ``np.save`` bytes, as
converted datasets store them). Every variant computes the same result, ``id``, the class
and the class probabilities of every row, and is timed over the same window, the whole
job (bench/common.py):

* **single process**: one plain TensorFlow process using all cores (TensorFlow's default
  threads). Timed: reading the table with pyarrow, decoding the image column vectorised
  (one numpy view over the Arrow buffer), calling the SavedModel's ``predict_images``
  ``--batch-size`` rows at a time and collecting classes and probabilities as numpy.
  Start-up (not timed, reported): importing TensorFlow, loading the model, its first call.
* **sparktf.predict**: ``sparktf.predict(df, export, keep_columns=["id"],
  raw_prediction_col="")`` over the table (no ``rawPrediction``: the same result).
  Timed: the whole Spark job from submitting it (``write.format("noop")``) to its end:
  reading the Parquet files, the Arrow round trip through the Python workers, decoding,
  the model calls. Start-up (reported): the Spark session, and one warm-up job (TensorFlow
  import and model load in every Python worker, kept for later jobs as in any reused
  worker).
* **predict_batch_udf**: ``df.select("id", predict_batch_udf(...)("image"))`` with the same
  model, signature, batch size and TensorFlow threads, decoding the same column
  vectorised (the ``np.save`` bytes joined and viewed as one array, the header sliced off);
  timed and warmed up as sparktf.predict.
* **spark_read_only** (a reference, no goal): Spark's own pass over the same table, no
  Python at all: what a Spark job costs here before any inference.

A third model, **keras_export**, is one that sparktf did not write: a Keras MLP of one input
(``numbers``, 64 floats) and two outputs (``price``, one float; ``kind``, 10 probabilities),
exported by Keras' own ``model.export`` (its ``serving_default`` signature), over a table of
``id`` and ``numbers`` (``array<float>``) in ``2 * --micro-batches`` files. Its variants,
each with the result ``id``, ``price``, ``kind``:

* **sparktf.predict** over the table, as above (any signature: a column per output);
* **predict_batch_udf** with the same signature, batch size and threads
  (``input_tensor_shapes=[[64]]``, a struct of both outputs);
* **sparktf.predict, streaming**: the same table read by ``readStream`` two files per
  trigger (``--micro-batches`` micro-batches), ``sparktf.predict``, ``writeStream`` to the
  ``noop`` sink with ``trigger(availableNow=True)`` and a fresh checkpoint per round; timed
  from ``start()`` to the query's end;
* **spark_read_only** and **spark_read_only_streaming** (references, no goal): Spark's own
  batch and streaming pass over the same table, no Python: ``streaming_extra_s`` in the
  result is what streaming adds to a query's time with sparktf and with Spark alone.

Spark runs the ``local`` profile (``local-cluster[2,1,1024]``: two executors of one core,
one TensorFlow thread per worker) in one session for both Spark variants; the models one
after the other. Each round runs single process, sparktf.predict, predict_batch_udf and the
Spark reference in turn (``--rounds`` rounds, medians count). The MLP's table is 256k rows:
on a much smaller table the single process is done in a fraction of a second, and a Spark
job's fixed cost (task launch, Arrow set-up) rather than inference decides the ratio
(bench/README.md has the figures). Goals:
MNIST MLP >= 0.5x and ResNet-20 >= 0.9x the single process; >= 1.2x ``predict_batch_udf``
for both; the Keras export >= 1.0x ``predict_batch_udf``, and streaming >= 0.8x batch per
row. Peak memory: the single process's over one pass; the executors' (JVM + Python
workers, PSS so pages shared between forked workers count once) over the warm-up jobs of
both Spark variants together (not during the timed rounds: sampling costs CPU). Prints
JSON and writes it to bench/results/.
"""

from __future__ import annotations

import argparse
import functools
import io
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
sys.path.insert(0, str(REPO / "bench"))

import common  # noqa: E402
import numpy as np  # noqa: E402

log = logging.getLogger("bench.predict")

MODELS = {  # name -> (registry name, overrides, image shape)
    "resnet20": ("resnet20", {}, (32, 32, 3)),
    "mnist_mlp": ("mnist_mlp", {}, (28, 28, 1)),
}
KERAS = "keras_export"  # a model sparktf did not write (Keras' model.export)
KERAS_FEATURES = 64


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


def export_keras(export_dir: Path) -> str:
    """A Keras MLP of one input (``numbers``) and two outputs (``price``, ``kind``), exported
    by Keras' ``model.export`` (not sparktf's exporter)."""
    import keras

    keras.utils.set_random_seed(0)
    numbers = keras.Input((KERAS_FEATURES,), name="numbers")
    hidden = keras.layers.Dense(256, activation="relu")(numbers)
    hidden = keras.layers.Dense(256, activation="relu")(hidden)
    price = keras.layers.Dense(1, name="price")(hidden)
    kind = keras.layers.Dense(10, activation="softmax", name="kind")(hidden)
    keras.Model(numbers, {"price": price, "kind": kind}).export(str(export_dir), verbose=False)
    return str(export_dir)


def write_numbers_table(rows: int, directory: Path, files: int, rng) -> str:
    """A Parquet table of ``id`` and ``numbers`` (``array<float>`` of 64) in ``files`` files."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True)
    values = rng.normal(size=(rows, KERAS_FEATURES)).astype(np.float32)
    for part, index in enumerate(np.array_split(np.arange(rows), files)):
        flat = pa.array(values[index].reshape(-1))
        offsets = pa.array(np.arange(0, len(flat) + 1, KERAS_FEATURES, dtype=np.int32))
        numbers = pa.ListArray.from_arrays(offsets, flat)
        table = pa.table({"id": pa.array(index, pa.int64()), "numbers": numbers})
        pq.write_table(table, directory / f"part-{part:05d}.parquet")
    return "file://" + str(directory)


# ----------------------------------------------------------------------------- variants


def decode_npy(values, shape: tuple[int, ...]) -> np.ndarray:
    """np.save bytes of uint8 arrays of one ``shape`` -> one array, vectorised."""
    body = int(np.prod(shape))
    joined = np.frombuffer(b"".join(values), np.uint8).reshape(len(values), -1)
    return joined[:, -body:].reshape(-1, *shape)


def decode_arrow(column, shape: tuple[int, ...]) -> np.ndarray:
    """An Arrow binary column of np.save bytes (one ``shape``) -> one array, no copy per row."""
    body = int(np.prod(shape))
    parts = []
    for chunk in column.chunks:
        _, offsets, data = chunk.buffers()
        offsets = np.frombuffer(offsets, np.int32)[chunk.offset : chunk.offset + len(chunk) + 1]
        values = np.frombuffer(data, np.uint8)[offsets[0] : offsets[-1]]
        parts.append(values.reshape(len(chunk), -1)[:, -body:].reshape(-1, *shape))
    return np.concatenate(parts)


def single_process(model_dir: str, table: str, shape, batch_size: int):
    """(start-up s, pass function): one plain TensorFlow process, whole job per pass."""
    import pyarrow.parquet as pq
    import tensorflow as tf

    started = time.perf_counter()
    root = tf.saved_model.load(model_dir)
    fn = root.signatures["predict_images"]
    fn(images=tf.zeros((batch_size, *shape), tf.uint8))  # warm-up: the first trace
    startup = time.perf_counter() - started

    def one_pass() -> int:
        data = pq.read_table(table.removeprefix("file://"))
        ids = data["id"].to_numpy()
        images = decode_arrow(data["image"], shape)
        classes, scores = [], []
        for i in range(0, len(images), batch_size):
            out = fn(images=tf.constant(images[i : i + batch_size]))
            classes.append(out["classes"].numpy())
            scores.append(out["scores"].numpy())
        _ = root  # keep the variables alive with the function
        # The same result as the Spark variants: id, prediction, probability per row.
        result = (ids, np.concatenate(classes), np.concatenate(scores))
        return len(result[1])

    return startup, one_pass


def load_in_task(model_dir: str, signature: str):
    """(root, signature function) of the SavedModel, loaded in a Spark task with the
    TensorFlow threads sparktf.predict uses there (the task's CPUs)."""
    import tensorflow as tf
    from pyspark import TaskContext

    context = TaskContext.get()
    threads = context.cpus() if context is not None else 0
    try:
        tf.config.threading.set_intra_op_parallelism_threads(threads)
        tf.config.threading.set_inter_op_parallelism_threads(threads)
    except RuntimeError:
        pass
    root = tf.saved_model.load(model_dir)
    return root, root.signatures[signature]


def make_batch_udf(model_dir: str, batch_size: int, shape: tuple[int, ...]):
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql import types as T

    def make_predict_fn():
        import tensorflow as tf

        root, fn = load_in_task(model_dir, "predict_images")

        def predict(images: np.ndarray) -> dict:
            batch = decode_npy(images.reshape(-1), shape)
            out = fn(images=tf.constant(batch))
            _ = root  # keep the variables alive with the function
            return {"prediction": out["classes"].numpy(), "probability": out["scores"].numpy()}

        return predict

    return_type = T.StructType(
        [
            T.StructField("prediction", T.LongType()),
            T.StructField("probability", T.ArrayType(T.FloatType())),
        ]
    )
    return predict_batch_udf(make_predict_fn, return_type=return_type, batch_size=batch_size)


def make_keras_udf(model_dir: str, batch_size: int):
    """``predict_batch_udf`` of the Keras export's ``serving_default``: id -> price, kind."""
    from pyspark.ml.functions import predict_batch_udf
    from pyspark.sql import types as T

    def make_predict_fn():
        import tensorflow as tf

        root, fn = load_in_task(model_dir, "serving_default")

        def predict(numbers: np.ndarray) -> dict:
            out = fn(numbers=tf.constant(numbers, tf.float32))
            _ = root  # keep the variables alive with the function
            return {"price": out["price"].numpy()[:, 0], "kind": out["kind"].numpy()}

        return predict

    return_type = T.StructType(
        [
            T.StructField("kind", T.ArrayType(T.FloatType())),
            T.StructField("price", T.DoubleType()),
        ]
    )
    return predict_batch_udf(
        make_predict_fn,
        return_type=return_type,
        batch_size=batch_size,
        input_tensor_shapes=[[KERAS_FEATURES]],
    )


def streaming_pass(spark, table: str, model_dir: str | None, batch_size: int, scratch: str) -> list:
    """One streaming query over the whole table, two files per micro-batch, to the ``noop``
    sink (a fresh checkpoint each time), through ``sparktf.predict`` (no model: Spark's own
    streaming read, a reference); returns the ``durationMs`` of each micro-batch that read
    rows (its phases: ``addBatch`` is the Spark job, the rest the trigger's own offset and
    commit logs)."""
    import sparktf

    stream = (
        spark.readStream.schema("id long, numbers array<float>")
        .option("maxFilesPerTrigger", 2)
        .parquet(table)
    )
    if model_dir is not None:
        stream = sparktf.predict(stream, model_dir, batch_size=batch_size, keep_columns=["id"])
    checkpoint = tempfile.mkdtemp(prefix="checkpoint-", dir=scratch)
    query = (
        stream.writeStream.format("noop")
        .option("checkpointLocation", "file://" + checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    try:
        query.awaitTermination()
    finally:
        query.stop()
    return [p["durationMs"] for p in query.recentProgress if p["numInputRows"]]


def spark_pass(build) -> None:
    """One whole Spark job: the DataFrame ``build()`` returns, written to the ``noop`` sink."""
    build().write.format("noop").mode("overwrite").save()


# ----------------------------------------------------------------------------- main


GOALS = {  # model -> (vs single process, vs predict_batch_udf)
    "resnet20": (0.9, 1.2),
    "mnist_mlp": (0.5, 1.2),
}
KERAS_GOALS = {"predict_batch_udf": 1.0, "streaming_vs_batch": 0.8}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--resnet-rows", type=int, default=4096)
    p.add_argument(
        "--mlp-rows",
        type=int,
        default=262144,
        help="MNIST MLP rows (default 262144: on far fewer rows the ratio measures Spark's "
        "fixed cost per job, not inference)",
    )
    p.add_argument(
        "--keras-rows",
        type=int,
        default=524288,
        help="rows of the Keras export's table (default 524288: a micro-batch has a fixed "
        "cost of its own, about 0.3 s here, that small micro-batches would measure instead)",
    )
    p.add_argument(
        "--micro-batches",
        type=common.positive_int,
        default=2,
        help="micro-batches of the streaming query (two files each; default 2)",
    )
    p.add_argument("--batch-size", type=int, default=128)
    common.add_rounds(p)
    p.add_argument(
        "--partitions",
        type=int,
        default=4,
        help="Parquet files, hence Spark partitions (2 per executor by default)",
    )
    p.add_argument("--models", nargs="*", default=[*MODELS, KERAS], choices=[*MODELS, KERAS])
    p.add_argument(
        "--gpus",
        type=int,
        default=0,
        help="GPU executors (one GPU each; the single process uses the GPU too); 0 "
        "(default): CPU only (bench/gpu.sh)",
    )
    common.add_tag(p, "predict", "gpu")
    args = p.parse_args(argv)
    if args.gpus:  # the single process (here) and the executors share the GPU memory
        os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
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
            **common.machine(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "config": {
            "batch_size": args.batch_size,
            "rounds_max": args.rounds,
            "partitions": args.partitions,
            "spark_profile": "local",
            "tf_threads_per_worker": "spark.task.cpus (1)",
            "single_process_threads": "TensorFlow's default (all cores)",
        },
        "window": "whole job: read the table to the last prediction (id, class, "
        "probabilities); session, model load and one warm-up job are start-up",
        "models": {},
    }
    goals: dict = {}
    with tempfile.TemporaryDirectory(prefix="sparktf-bench-") as tmp:
        prepared, startups, single_memory = {}, {}, {}
        for name in args.models:
            if name == KERAS:
                model_dir = export_keras(Path(tmp) / name / "export" / "1")
                files = 2 * args.micro_batches
                table = write_numbers_table(args.keras_rows, Path(tmp) / name / "table", files, rng)
                prepared[name] = (args.keras_rows, model_dir, table, None)
                continue
            shape = MODELS[name][2]
            rows = args.resnet_rows if name == "resnet20" else args.mlp_rows
            images = rng.integers(0, 256, (rows, *shape), dtype=np.uint8)
            model_dir = export_model(name, Path(tmp) / name / "export" / "1")
            table = write_table(images, Path(tmp) / name / "table", args.partitions)
            log.info("%s: %d rows; single-process baseline start-up", name, rows)
            startup, one_pass = single_process(model_dir, table, shape, args.batch_size)
            with common.PeakMemory() as memory:
                one_pass()  # its memory peak, measured apart from the Spark session's
            startups[name], single_memory[name] = startup, memory.report()
            prepared[name] = (rows, model_dir, table, one_pass)

        # One Spark session for both Spark variants, so that their rounds can alternate with
        # the single process's: round r runs single process, sparktf.predict,
        # predict_batch_udf and Spark's own pass in turn (load drifts hit all alike).
        spark = get_session(
            "sparktf-bench-predict", profile="local", overrides=common.gpu_overrides(args.gpus)
        )
        try:
            for name, (rows, model_dir, table, one_pass) in prepared.items():
                df = spark.read.parquet(table)
                if name == KERAS:
                    keras_udf = make_keras_udf(model_dir, args.batch_size)
                    micro_batches: list[list] = []

                    def streaming(model_dir=model_dir, table=table, micro_batches=micro_batches):
                        micro_batches.append(
                            streaming_pass(spark, table, model_dir, args.batch_size, tmp)
                        )

                    variants = {
                        "sparktf_predict": functools.partial(
                            spark_pass,
                            lambda df=df, model_dir=model_dir: sparktf.predict(
                                df, model_dir, batch_size=args.batch_size, keep_columns=["id"]
                            ),
                        ),
                        "predict_batch_udf": functools.partial(
                            spark_pass,
                            lambda df=df, udf=keras_udf: df.select("id", udf("numbers")),
                        ),
                        "sparktf_predict_streaming": streaming,
                        # References, no goal: Spark's own read of the rows, batch and stream.
                        "spark_read_only": functools.partial(spark_pass, lambda df=df: df),
                        "spark_read_only_streaming": lambda table=table: streaming_pass(
                            spark, table, None, args.batch_size, tmp
                        ),
                    }
                else:
                    variants = image_variants(df, model_dir, one_pass, args.batch_size, name)
                startup: dict = {"single_process_tf": startups[name]} if one_pass else {}
                passes = common.Rounds()
                # Memory is sampled over the warm-up jobs (model loads included) only: reading
                # the executors' smaps takes CPU that the timed rounds should not lose.
                with ExecutorMemory() as memory:
                    for variant, run in variants.items():
                        if variant != "single_process_tf":
                            log.info("%s: %s warm-up", name, variant)
                            startup[variant], _ = common.timed(run)
                # The models' rounds share what is left of --budget: this one its part.
                rounds = common.RoundBudget.from_args(
                    args, share=1 / (len(prepared) - list(prepared).index(name))
                )
                for round_ in rounds:
                    for variant, run in variants.items():
                        seconds, done = common.timed(run)
                        if variant == "single_process_tf":
                            assert done == rows, (name, done, rows)
                        passes.add(variant, rows / seconds)
                    log.info("%s: round %d done (at most %d)", name, round_ + 1, args.rounds)
                rounds.record(results, name)
                med = passes.medians()
                vs_udf = med["sparktf_predict"] / med["predict_batch_udf"]
                entry = {
                    "rows": rows,
                    "rows_per_s": passes.report(0),
                    "ratio_sparktf_vs_predict_batch_udf": round(vs_udf, 3),
                    "startup_s": {k: round(v, 2) for k, v in startup.items()},
                    "peak_memory": {"spark_executors_warm_up": memory.report()},
                }
                if name == KERAS:
                    streaming_ratio = med["sparktf_predict_streaming"] / med["sparktf_predict"]
                    entry["ratio_streaming_vs_batch"] = round(streaming_ratio, 3)
                    # What streaming adds to a query's time, with sparktf and with Spark alone.
                    entry["streaming_extra_s"] = {
                        "sparktf_predict": round(
                            rows / med["sparktf_predict_streaming"] - rows / med["sparktf_predict"],
                            2,
                        ),
                        "spark_read_only": round(
                            rows / med["spark_read_only_streaming"] - rows / med["spark_read_only"],
                            2,
                        ),
                    }
                    entry["micro_batches_per_query"] = sorted({len(q) for q in micro_batches})
                    # What a micro-batch costs besides its Spark job (offset and commit logs).
                    trigger_ms = [
                        d["triggerExecution"] - d.get("addBatch", 0)
                        for q in micro_batches
                        for d in q
                    ]
                    entry["micro_batch_overhead_ms_median"] = float(np.median(trigger_ms))
                    results["models"][name] = entry
                    goals[f"{name} / predict_batch_udf"] = common.goal(
                        vs_udf, KERAS_GOALS["predict_batch_udf"]
                    )
                    goals[f"{name} / streaming vs batch"] = common.goal(
                        streaming_ratio, KERAS_GOALS["streaming_vs_batch"]
                    )
                    continue
                vs_single = med["sparktf_predict"] / med["single_process_tf"]
                entry["ratio_sparktf_vs_single_process"] = round(vs_single, 3)
                entry["ratio_spark_read_only_vs_single_process"] = round(
                    med["spark_read_only"] / med["single_process_tf"], 3
                )
                entry["peak_memory"]["single_process_tf"] = single_memory[name]
                results["models"][name] = entry
                goal_single, goal_udf = GOALS[name]
                goals[f"{name} / one TF process"] = common.goal(vs_single, goal_single)
                goals[f"{name} / predict_batch_udf"] = common.goal(vs_udf, goal_udf)
        finally:
            spark.stop()
    results["goals"] = goals
    common.write_results(common.result_name("predict", args.tag), results)
    return 0


def image_variants(df, model_dir: str, one_pass, batch_size: int, name: str) -> dict:
    """The image models' variants: one TF process, sparktf.predict, predict_batch_udf and
    Spark's own read (a reference)."""
    import sparktf

    udf = make_batch_udf(model_dir, batch_size, MODELS[name][2])
    return {
        "single_process_tf": one_pass,
        "sparktf_predict": functools.partial(
            spark_pass,
            # the classes and probabilities, as the other variants (no rawPrediction)
            lambda df=df, model_dir=model_dir: sparktf.predict(
                df, model_dir, batch_size=batch_size, keep_columns=["id"], raw_prediction_col=""
            ),
        ),
        "predict_batch_udf": functools.partial(
            spark_pass, lambda df=df, udf=udf: df.select("id", udf("image"))
        ),
        # Reference, no goal: Spark reading the same rows, no Python at all.
        "spark_read_only": functools.partial(spark_pass, lambda df=df: df),
    }


if __name__ == "__main__":
    sys.exit(main())
