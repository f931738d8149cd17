"""Helpers the inference and evaluation tests share: SavedModel exports made here, calling
their signatures directly (the independent reference), running a job or a script of the
repository as its own process (what e2e tests do: tests/tiers.py), and dropping the
executors' cached copy of a model."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def columns_by_id(rows: list[dict]) -> dict[str, np.ndarray]:
    """Rows (dicts of one record each) as stacked columns, in ``id`` order."""
    rows = sorted(rows, key=lambda r: r["id"])
    return {k: np.stack([r[k] for r in rows]) for k in rows[0]}


def assert_images(got: dict, expected: dict) -> None:
    """Image records read back (``id``, ``label``, ``image`` columns in id order) are those
    ``sparktf.datasets.synthetic`` wrote (``ids``, ``labels``, ``images``)."""
    assert got["id"].tolist() == expected["ids"].tolist()
    assert got["label"].tolist() == expected["labels"].tolist()
    assert got["image"].dtype == np.uint8 and got["image"].shape == expected["images"].shape
    assert got["image"].tobytes() == expected["images"].tobytes()


def export(name: str, export_dir: Path, seed: int, train=None, **overrides) -> str:
    """Exports a fresh ``name`` model; ``train=(images, labels)`` fits it for 3 epochs."""
    import keras

    from sparktf import models

    keras.utils.set_random_seed(seed)
    task = models.get_task(name, **overrides)
    model = task.build_model()
    if train is not None:
        model.compile(
            optimizer=keras.optimizers.Adam(0.01),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
        model.fit(*train, epochs=3, batch_size=20, verbose=0)
    task.export(model, str(export_dir))
    return str(export_dir)


def call(model_dir: str, signature: str, **inputs) -> dict[str, np.ndarray]:
    """A SavedModel signature called directly on numpy inputs."""
    import tensorflow as tf

    loaded = tf.saved_model.load(model_dir)
    out = loaded.signatures[signature](**{k: tf.constant(v) for k, v in inputs.items()})
    return {k: v.numpy() for k, v in out.items()}


def run_job(script: str, *args: str, hdfs=None, timeout: float = 300):
    """``jobs/SCRIPT`` as a user runs it (its own Spark application)."""
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARKTF_LOG_LEVEL": "INFO"}
    if hdfs is not None:
        env["SPARKTF_WEBHDFS_URL"] = hdfs.webhdfs_url
    return subprocess.run(
        [sys.executable, str(REPO / "jobs" / script), *args],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        timeout=timeout,
    )


def run_command(command, **kwargs) -> subprocess.CompletedProcess:
    """A command of the repository (a script of ``scripts/`` or ``bench/``, a job, an
    example) as its own process, output captured as text (for e2e tests)."""
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    try:
        return subprocess.run([str(part) for part in command], **kwargs)
    except subprocess.TimeoutExpired as timed_out:  # say what it was doing when it was killed
        tails = []
        for name in ("stdout", "stderr"):
            text = getattr(timed_out, name) or ""
            if isinstance(text, bytes):
                text = text.decode(errors="replace")
            tails.append(f"--- its {name}, the end:\n{text[-3000:]}")
        raise AssertionError(f"{timed_out}\n" + "\n".join(tails)) from None


def drop_py4j_connection() -> bool:
    """Closes this thread's connection to the session's JVM, if there is one; the next call
    opens a new one. A test cut short in a Py4J call (pytest-timeout's alarm, an assertion
    from a signal handler) leaves that call's answer unread on the connection, and every
    later call on it would read the answer of the call before: the session-scoped Spark of
    every test after it would be broken. Returns whether a connection was closed."""
    context = sys.modules.get("pyspark") and sys.modules["pyspark"].SparkContext
    gateway = getattr(context, "_gateway", None)
    client = getattr(gateway, "_gateway_client", None)
    thread_connection = getattr(client, "get_thread_connection", None)  # Py4J's ClientServer
    connection = thread_connection() if thread_connection else None
    if connection is None or connection.socket is None:
        return False
    try:
        client.deque.remove(connection)
    except ValueError:  # in use: taken out of the pool by the call that was cut short
        pass
    connection.close(reset=True)
    return True


def remove_local_copy(fingerprint: str) -> None:
    """Deletes the executors' local copy of an HDFS model (and its lock file)."""
    from sparktf import inference

    copy = os.path.join(inference.model_cache_dir(), fingerprint[:32])
    shutil.rmtree(copy, ignore_errors=True)
    if os.path.exists(copy + ".lock"):
        os.remove(copy + ".lock")


def listening(pid: int | None = None) -> set:
    """The addresses (psutil ``laddr``: ``ip``, ``port``) on which process ``pid`` (this one by
    default) listens."""
    import psutil

    connections = psutil.Process(pid).net_connections("inet")
    return {c.laddr for c in connections if c.status == psutil.CONN_LISTEN}


def node_processes() -> list[str]:
    """TensorFlow processes of sparktf started by this test process (marked with its
    ``SPARKTF_TEST_PROCESS``: tests/conftest.py) and still running: there must be none after
    a run. Those of another test process running at the same time are not counted."""
    out = subprocess.run(
        ["pgrep", "-af", "sparktf.train.process.main"], capture_output=True, text=True
    )
    mark = os.environ.get("SPARKTF_TEST_PROCESS")
    found = []
    for line in out.stdout.splitlines():
        if "pgrep" in line:
            continue
        if mark:
            try:
                environ = Path(f"/proc/{line.split()[0]}/environ").read_bytes().split(b"\0")
            except OSError:  # gone meanwhile
                continue
            if f"SPARKTF_TEST_PROCESS={mark}".encode() not in environ:
                continue
        found.append(line)
    return found


def feed_dirs() -> list[str]:
    """The spark feed's chunk directories left where this test process's runs put them
    (``SPARKTF_FEED_DIR``, else ``/dev/shm``)."""
    base = os.environ.get("SPARKTF_FEED_DIR") or "/dev/shm"
    return [p for p in os.listdir(base) if p.startswith("sparktf-feed-")]


def assert_nothing_left(timeout_s: float = 20.0) -> None:
    """No TensorFlow process and no spark-feed chunk directory of this test process's runs
    is left."""
    deadline = time.monotonic() + timeout_s
    while node_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert node_processes() == []
    assert feed_dirs() == []


class ConfSession:
    """What sparktf reads of a classic session's settings (``spark.sparkContext.getConf()
    .getAll()``), for unit tests of functions that only read them."""

    class _Conf:
        def __init__(self, pairs):
            self.pairs = pairs

        def getAll(self):  # noqa: N802 (SparkConf API)
            return list(self.pairs.items())

    class _Context:
        def __init__(self, conf):
            self.conf = conf

        def getConf(self):  # noqa: N802 (SparkContext API)
            return self.conf

    def __init__(self, pairs: dict[str, str]):
        self.sparkContext = self._Context(self._Conf(pairs))


def worker_stats(spark, fingerprint: str, partitions: int = 12) -> dict[int, dict]:
    """ModelCache counts for ``fingerprint`` in the Python workers that run a tiny job.

    An executor hands its idle workers out in turn (a stage with two Python operators
    starts two), so enough small tasks visit every worker."""

    def stats(batches):
        import pyarrow as pa

        from sparktf.inference import ModelCache

        for _ in batches:
            counts = ModelCache.stats.get(fingerprint, {})
            yield pa.RecordBatch.from_pylist(
                [
                    {
                        "pid": os.getpid(),
                        **{k: counts.get(k, 0) for k in ("loads", "uses", "batches", "copies")},
                    }
                ]
            )

    schema = "pid long, loads long, uses long, batches long, copies long"
    rows = spark.range(partitions).repartition(partitions).mapInArrow(stats, schema).collect()
    return {r.pid: r.asDict() for r in rows}


def tiny_plan(scaling, **fields):
    """A ``RunPlan`` built by hand, with no data read: mnist_mlp from files of 240 rows,
    global batch 24 (10 steps an epoch, 100 in all), model directory ``/m``; ``fields``
    replace any of its fields. For the parts that take a plan but start nothing."""
    import dataclasses

    from sparktf.train import RunConfig, TrainConfig
    from sparktf.train.plan import DataInfo, RunPlan

    plan = RunPlan(
        train=TrainConfig(model="mnist_mlp", data="/d", input_mode="files"),
        scaling=scaling,
        run=RunConfig(model_dir="/m"),
        model_config={},
        data=DataInfo("mnist", "image", "/d", "train", 240, (), files={"tfrecord": ["/d/f"]}),
        global_batch=24,
        steps_per_epoch=10,
        target_steps=100,
        feed_passes=None,
    )
    return dataclasses.replace(plan, **fields)


@contextlib.contextmanager
def imported_example(path: Path, name: str) -> Iterator[ModuleType]:
    """An example script imported as the module ``name``, its directory on ``sys.path`` as
    when it runs as a script (it imports ``examples/_common.py``); both removed again after."""
    sys.path.insert(0, str(path.parent))
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop(spec.name, None)
        sys.path.remove(str(path.parent))
