"""Tests of distributed training (sparktf.train) on the local-cluster session (2 executors).

Layouts on two executors: all-reduce = chief + one worker; ps = chief (coordinator) + one
worker on executors, the parameter server on the driver (``ps_on_driver``).

Each TensorFlowOnSpark run costs tens of seconds here, so the runs are few and each checks
several things: seven runs in all (both strategies x both input modes, a resume, ResNet-20,
a corrupt shard). The fast tests at the top need no Spark.
"""

from __future__ import annotations

import os
import shutil
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from sparktf import storage
from sparktf.datasets.synthetic import write_cifar10
from sparktf.train.process import milestones
from tests import helpers
from tests.conftest import descendants
from tests.helpers import assert_nothing_left

pytestmark = pytest.mark.unit  # tests of another tier carry their own mark

ROOT = Path(__file__).resolve().parents[1]
TINY_MLP = {"hidden_units": 8}


# ----------------------------------------------------------------------------- fast tests


def test_configs_validate_and_count_executors():
    from sparktf.train import ConfigError, FailureConfig, RunConfig, ScalingConfig, TrainConfig

    assert ScalingConfig(strategy="allreduce", num_workers=3).num_executors == 3
    assert ScalingConfig(strategy="ps", num_workers=2, num_ps=2).num_executors == 5
    assert (
        ScalingConfig(strategy="ps", num_workers=1, num_ps=1, ps_on_driver=True).num_executors == 2
    )
    with pytest.raises(ConfigError, match="strategy"):
        ScalingConfig(strategy="mirrored")
    with pytest.raises(ConfigError, match="input_mode"):
        TrainConfig(model="resnet20", data="/d", input_mode="queue")
    with pytest.raises(ConfigError, match="model_dir"):
        RunConfig(model_dir="")
    failure = RunConfig(model_dir="/m", failure=FailureConfig(failure_timeout_s=120)).failure
    assert failure.heartbeat_timeout_s == 60


def test_feed_decodes_columns_and_rebatches_exactly():
    import pyarrow as pa

    from sparktf.datasets.formats import Field, encode_ndarray_column
    from sparktf.train.feed.chunks import Rebatcher, decode_table

    images = np.random.default_rng(0).integers(0, 256, (10, 28, 28, 1), dtype=np.uint8)
    table = pa.table(
        {"image": encode_ndarray_column(images), "label": pa.array(np.arange(10), pa.int64())}
    )
    fields = [Field("image", "uint8", (28, 28, 1)), Field("label", "int64")]
    decoded = decode_table(table.slice(3, 5), fields)  # a slice: offsets do not start at 0
    np.testing.assert_array_equal(decoded["image"], images[3:8])
    np.testing.assert_array_equal(decoded["label"], np.arange(3, 8))
    rebatcher = Rebatcher(4)
    out = [
        b
        for chunk in (
            decode_table(table.slice(0, 3), fields),
            decoded,
            decode_table(table.slice(8, 2), fields),
        )
        for b in rebatcher.add(chunk)
    ]
    assert [len(b["label"]) for b in out] == [4, 4]
    np.testing.assert_array_equal(
        np.concatenate([b["label"] for b in out]), [0, 1, 2, 3, 4, 5, 6, 7]
    )
    assert rebatcher.leftover == 2


def test_feed_reads_number_columns_of_any_chunking_and_names_bad_ones():
    """Scalar columns come from their Arrow buffers (sliced, several chunks, any number
    type); nulls or text fail naming the column and what was expected."""
    import pyarrow as pa

    from sparktf.datasets.formats import Field
    from sparktf.train.feed.chunks import FeedError, decode_table

    label = Field("label", "int64")
    chunked = pa.chunked_array(
        [pa.array(np.arange(6), pa.int32()).slice(2), pa.array([9, 8], pa.int32())]
    )
    decoded = decode_table(pa.table({"label": chunked}), [label])
    assert decoded["label"].dtype == np.int64
    np.testing.assert_array_equal(decoded["label"], [2, 3, 4, 5, 9, 8])
    floats = decode_table(
        pa.table({"y": pa.array([0.5, 1.5], pa.float32())}), [Field("y", "float32")]
    )
    np.testing.assert_array_equal(floats["y"], np.array([0.5, 1.5], np.float32))
    with pytest.raises(FeedError, match=r"column 'label' holds 1 nulls \(expected int64"):
        decode_table(pa.table({"label": pa.array([1, None, 3])}), [label])
    with pytest.raises(FeedError, match=r"column 'label' has Arrow type string, expected int64"):
        decode_table(pa.table({"label": pa.array(["a", "b"])}), [label])


def test_feed_reads_a_dataframes_lists_and_strings_and_names_bad_rows():
    """A DataFrame fed as it is: Vectors and arrays arrive as Arrow lists (one size per row),
    strings as strings."""
    import pyarrow as pa

    from sparktf.datasets.formats import Field
    from sparktf.train.feed.chunks import FeedError, decode_table

    num = Field("num", "float32", (2,))
    table = pa.table(
        {
            "num": pa.array([[0.0, 1.0], [2.0, 3.0], [4.0, 5.0]], pa.list_(pa.float32())),
            "city": pa.array(["rome", "oslo", "paris"]),
        }
    )
    decoded = decode_table(table.slice(1), [num, Field("city", "string")])
    np.testing.assert_array_equal(decoded["num"], np.array([[2, 3], [4, 5]], np.float32))
    assert decoded["num"].dtype == np.float32
    assert list(decoded["city"]) == ["oslo", "paris"]
    ragged = pa.table({"num": pa.array([[0.0, 1.0], [2.0]], pa.list_(pa.float64()))})
    with pytest.raises(FeedError, match=r"column 'num': row 1 of a chunk has 1 values; expected"):
        decode_table(ragged, [num])
    pixels = pa.table({"px": pa.array([[0.0, 255.0], [1.5, 2.0]], pa.list_(pa.float32()))})
    with pytest.raises(FeedError, match="not integers in \\[0, 255\\]"):
        decode_table(pixels, [Field("px", "uint8", (2,))])
    with pytest.raises(FeedError, match="column 'city' has Arrow type int64, expected strings"):
        decode_table(pa.table({"city": pa.array([1, 2])}), [Field("city", "string")])


def test_control_channel_plans_progress_and_abort():
    from sparktf.train.wire.control import ControlClient, ControlServer

    server = ControlServer("127.0.0.1")
    try:
        client = ControlClient(server.url, server.issue_token("executor-0"), "executor-0")
        server.publish_plans({"executor-0": {"name": "chief:0", "role": "chief"}})
        assert client.hello(5)["name"] == "chief:0"
        client.post("beat", {"progress": {"step": 3}})
        assert server.snapshot()["executor-0"].progress == {"step": 3}
        server.request_abort("boom")
        client.post("beat")
        assert client.abort == "boom" and client.stop
        assert ControlClient(server.url, "wrong", "x").send("beat", attempts=1) is None
    finally:
        server.close()


def test_training_rate_counts_from_the_end_of_the_first_step():
    from sparktf.train.process.reporting import Meter

    meter = Meter(global_batch=8)
    assert meter.step()  # the first step, scheduled (a ps coordinator returns at once)
    time.sleep(0.3)  # ... and running: it traces the step function
    ended = time.monotonic()
    meter.first_step_done()
    assert not meter.step() and not meter.step()
    rate = meter.overall_rate()
    # two steps of 8 since the first one ended, not since it was scheduled (16 / 0.3 s)
    assert rate >= 16 / (time.monotonic() - ended)


def test_a_ps_evaluation_runs_beside_training_and_reports_its_error():
    import threading

    from sparktf.train.process.evaluation import AsideEvaluation

    started, release = threading.Event(), threading.Event()

    def evaluator(weights):  # stands for one pass over the evaluation split
        started.set()
        assert release.wait(10)
        return {"loss": float(weights[0].sum())}

    weights = [np.ones(3, np.float32)]
    aside = AsideEvaluation(evaluator, 6, weights)
    assert started.wait(10)  # it runs while this (the training) thread goes on
    assert not aside.done()
    release.set()
    assert aside.result() == {"loss": 3.0} and aside.done()
    assert aside.step == 6 and aside.weights is weights

    def failing(weights):
        raise ValueError("the evaluation split 'test' of /data is empty")

    broken = AsideEvaluation(failing, 8, weights)
    with pytest.raises(ValueError, match="split 'test'"):
        broken.result()


def test_summaries_and_checkpoint_state(tmp_path):
    from sparktf.train import artifacts
    from sparktf.train.process import summaries

    buckets = summaries.histogram_buckets(np.arange(100.0), 10)
    assert buckets.shape == (10, 3) and buckets[:, 2].sum() == 100
    assert artifacts.latest_checkpoint_step(str(tmp_path)) == 0
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "checkpoint").write_text(
        'model_checkpoint_path: "ckpt-40"\nall_model_checkpoint_paths: "ckpt-40"\n'
    )
    assert artifacts.latest_checkpoint_step(str(tmp_path)) == 40


@pytest.mark.e2e
def test_job_help_and_usage_errors():
    help_text = helpers.run_command(
        [sys.executable, ROOT / "jobs/train_resnet.py", "--help"], timeout=60
    )
    assert help_text.returncode == 0
    for flag in ("--strategy", "--input-mode", "--gpus-per-worker", "--model-dir", "--epochs"):
        assert flag in help_text.stdout
    bad = helpers.run_command(
        [
            sys.executable,
            ROOT / "jobs/train.py",
            "--model",
            "resnet20",
            "--data",
            "/nonexistent",
            "--model-dir",
            "/tmp/x",
            "--strategy",
            "mirrored",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 2 and "invalid choice" in bad.stderr


# ----------------------------------------------------------------------------- data


def _fit(
    spark,
    data,
    model_dir,
    *,
    strategy,
    input_mode,
    steps=None,
    epochs=None,
    batch_size=8,
    model="mnist_mlp",
    model_config=None,
    train_options=None,
    **groups,
):
    """A run on the session's two executors; ``groups`` are RunConfig groups as dicts
    (``checkpoint={"every_steps": 5}``) over the defaults below, ``train_options`` more
    TrainConfig fields."""
    from sparktf.train import RunConfig, ScalingConfig, TrainConfig, fit

    scaling = ScalingConfig(
        strategy=strategy,
        num_workers=2 if strategy == "allreduce" else 1,
        num_ps=1,
        ps_on_driver=True,
        threads_per_worker=1,
    )
    run = {
        "checkpoint": {"every_steps": 4},
        "tracking": {"summary_every_steps": 2, "progress_every_s": 2.0},
        # (the feed keeps its default 300 s: a TensorFlow process took over 60 s to open its
        # feed in a busy .ci/run here, and the run failed before its first step)
        "failure": {"failure_timeout_s": 60.0},
    }
    for name, values in groups.items():
        run[name] = {**run.get(name, {}), **values}
    return fit(
        TrainConfig(
            model=model,
            data=str(data),
            input_mode=input_mode,
            steps=steps,
            epochs=epochs,
            batch_size=batch_size,
            model_config=TINY_MLP if model_config is None else model_config,
            **(train_options or {}),
        ),
        scaling,
        RunConfig(model_dir=str(model_dir), **run),
        spark=spark,
    )


def _events(model_dir: str, run: str = "") -> dict[str, int]:
    """Summary tags in the model directory's event files (of one run: train, eval), with
    their counts."""
    import tensorflow as tf

    tags: dict[str, int] = {}
    with storage.local_copy(storage.join(model_dir, "events", run)) as local:
        for root, _, files in os.walk(local):
            for name in files:
                for event in tf.compat.v1.train.summary_iterator(os.path.join(root, name)):
                    for value in event.summary.value:
                        tags[value.tag] = tags.get(value.tag, 0) + 1
    return tags


# ----------------------------------------------------------------------------- runs


@pytest.fixture(scope="module")
def allreduce_files(spark, hdfs, mnist_hdfs):
    """The all-reduce run from files on HDFS (6 steps), trained once: its own test asserts on
    it, and it is the source the fine-tuning test starts from. (model dir, FitResult)"""
    model_dir = hdfs.fresh("allreduce-files")
    return model_dir, _fit(
        spark, mnist_hdfs, model_dir, strategy="allreduce", input_mode="files", steps=6
    )


@pytest.mark.integration
def test_allreduce_files_on_hdfs_checkpoints_events_and_export(spark, mnist_hdfs, allreduce_files):
    import tensorflow as tf

    from sparktf.datasets.tfrecord import image_examples

    model_dir, result = allreduce_files
    assert (result.start_step, result.final_step) == (0, 6)
    assert result.last_checkpoint == storage.join(model_dir, "checkpoints", "ckpt-6")
    assert storage.exists(result.last_checkpoint + ".index")
    assert result.export_dir == storage.join(model_dir, "export", "6")
    assert {"loss", "accuracy", "learning_rate"} <= set(result.metrics)
    assert result.time_to_first_step_s and result.time_to_first_step_s < result.elapsed_s
    # where the time to the first step went: the chief's milestones, in order
    startup = result.startup_s
    assert list(startup) == list(milestones.ORDER), startup
    assert 0 < startup["launched"] and list(startup.values()) == sorted(startup.values())
    assert startup["first_step"] == pytest.approx(result.time_to_first_step_s, abs=0.01)
    tags = _events(model_dir)
    assert {"loss", "accuracy", "learning_rate", "examples_per_sec"} <= set(tags)
    assert any(t.startswith("weights/") for t in tags)
    # The events went out in segments (a new file per sync: at each checkpoint and at the
    # end), read back in name order as one stream: steps in order, no event twice.
    train_events = storage.join(model_dir, "events", "train")
    names = sorted(os.path.basename(storage.parse(p).path) for p in storage.listdir(train_events))
    assert len(names) >= 2 and all("tfevents" in n for n in names), names
    with storage.local_copy(train_events) as local:
        events = [
            e for n in names for e in tf.compat.v1.train.summary_iterator(os.path.join(local, n))
        ]
    assert len({e.SerializeToString() for e in events}) == len(events)
    loss_steps = [e.step for e in events for v in e.summary.value if v.tag == "loss"]
    assert loss_steps and loss_steps == sorted(loss_steps), loss_steps
    with storage.local_copy(result.export_dir) as local:
        loaded = tf.saved_model.load(local)
        images = np.random.default_rng(1).integers(0, 256, (3, 28, 28, 1), dtype=np.uint8)
        examples = image_examples(images, np.zeros(3, np.int64), np.arange(3))
        out = loaded.signatures["serving_default"](inputs=tf.constant(examples))
        assert out["classes"].shape == (3,) and out["classes"].dtype == tf.int64
        assert out["scores"].shape == (3, 10)
        np.testing.assert_allclose(out["scores"].numpy().sum(axis=1), 1.0, rtol=1e-5)
        direct = loaded.signatures["predict_images"](images=tf.constant(images))
        np.testing.assert_allclose(direct["scores"], out["scores"], rtol=1e-5)
    assert_nothing_left()

    # Convert -> train -> predict: the run's export serves sparktf.predict over the test split.
    import io

    import sparktf

    table = spark.read.parquet(storage.join(mnist_hdfs, "test", "parquet"))
    rows = sparktf.predict(table, model_dir, input_col="image", batch_size=5).collect()
    assert len(rows) == table.count() > 0
    stored = np.stack([np.load(io.BytesIO(r["image"])) for r in rows])
    with storage.local_copy(result.export_dir) as local:
        expected = tf.saved_model.load(local).signatures["predict_images"](
            images=tf.constant(stored)
        )
    np.testing.assert_array_equal([r["prediction"] for r in rows], expected["classes"].numpy())
    np.testing.assert_allclose(
        [r["probability"] for r in rows], expected["scores"].numpy(), rtol=1e-5, atol=1e-6
    )

    # The evaluation at the end of training (the test split: the dataset has no valid split)
    # is what the export gives on that split, computed here from its scores.
    scores = expected["scores"].numpy()
    labels = np.array([r["label"] for r in rows])
    top5 = np.argsort(-scores, axis=1)[:, :5]
    assert result.eval_metrics["accuracy"] == pytest.approx(
        np.mean(scores.argmax(axis=1) == labels), abs=1e-6
    )
    assert result.eval_metrics["top5_accuracy"] == pytest.approx(
        np.mean([label in row for label, row in zip(labels, top5)]), abs=1e-6
    )
    assert result.eval_metrics["loss"] == pytest.approx(
        -np.mean(np.log(scores[np.arange(len(labels)), labels])), rel=1e-4
    )
    assert result.eval_history == [{"step": 6, **result.eval_metrics}]
    assert {"accuracy", "top5_accuracy", "loss"} <= set(_events(model_dir, "eval"))


@pytest.mark.integration
def test_allreduce_spark_feed_uneven_partitions_ends_cleanly(spark, mnist_data, tmp_path):
    """3 Parquet parts of different sizes over 2 workers and a batch that does not divide
    the rows: each worker gets the same share of whole global batches, the 4 rows short of
    a last batch are reported, and the epoch's steps all run."""
    data = tmp_path / "data"
    shutil.copytree(mnist_data / "data", data)
    shutil.rmtree(data / "train" / "parquet")
    shutil.copytree(mnist_data / "uneven", data / "train" / "parquet")
    result = _fit(
        spark,
        data,
        tmp_path / "model",
        strategy="allreduce",
        input_mode="spark",
        epochs=1,
        batch_size=6,
        checkpoint={"every_steps": 100},
    )
    # One pass: 96 of the 100 rows, once each, 48 to each process; 4 left over.
    assert result.fed_rows == {"executor-0": 48, "executor-1": 48}
    (epoch,) = result.feed_epochs
    assert epoch["left_over"] == 4 and epoch["from_cursor"] == 0
    assert result.final_step == 100 // 6
    assert result.export_dir == storage.join(
        str(tmp_path / "model"), "export", str(result.final_step)
    )
    assert storage.exists(result.export_dir)
    assert_nothing_left()


@pytest.mark.integration
def test_ps_files_resumes_from_hdfs_step_optimizer_and_schedule(spark, hdfs, mnist_data, tmp_path):
    import tensorflow as tf

    model_dir = hdfs.fresh("ps-resume")
    first = _fit(spark, mnist_data / "data", model_dir, strategy="ps", input_mode="files", steps=4)
    assert (first.start_step, first.final_step) == (0, 4)
    second = _fit(
        spark,
        mnist_data / "data",
        model_dir,
        strategy="ps",
        input_mode="files",
        steps=8,
        evaluation={"every_steps": 2, "export_best": "loss"},
    )
    assert (second.start_step, second.final_step) == (4, 8)
    # Evaluated at steps 6 and 8; export_best/ holds the export of the lower test loss only.
    assert [e["step"] for e in second.eval_history] == [6, 8]
    best = min(second.eval_history, key=lambda e: e["loss"])["step"]
    assert second.best_export_dir == storage.join(model_dir, "export_best", str(best))
    assert [
        storage.parse(p).path.rsplit("/", 1)[-1]
        for p in storage.listdir(storage.join(model_dir, "export_best"))
    ] == [str(best)]
    assert second.last_checkpoint == storage.join(model_dir, "checkpoints", "ckpt-8")
    with storage.local_copy(storage.join(model_dir, "checkpoints")) as local:
        reader = tf.train.load_checkpoint(os.path.join(local, "ckpt-8"))
        names = reader.get_variable_to_shape_map()
        assert reader.get_tensor("global_step/.ATTRIBUTES/VARIABLE_VALUE") == 8
        iterations = [n for n in names if n.startswith("optimizer/") and "iteration" in n]
        assert iterations and reader.get_tensor(iterations[0]) == 8  # Adam's bias correction
    exports = [
        storage.parse(p).path.rsplit("/", 1)[-1]
        for p in storage.listdir(storage.join(model_dir, "export"))
    ]
    assert sorted(exports) == ["4", "8"]
    assert_nothing_left()


@pytest.mark.integration
def test_ps_spark_feed(spark, mnist_data, tmp_path):
    import tensorflow as tf

    result = _fit(
        spark, mnist_data / "data", tmp_path / "model", strategy="ps", input_mode="spark", steps=6
    )
    assert result.final_step == 6 and result.strategy == "ps" and result.input_mode == "spark"
    # The chief (the only reader under ps) took at least the 6 batches the workers trained on.
    assert len(result.fed_rows) == 1
    assert sum(result.fed_rows.values()) >= 6 * 8
    # Every scheduled step was applied exactly once by some worker: the optimizer's own
    # iteration count in the final checkpoint equals the global step.
    reader = tf.train.load_checkpoint(result.last_checkpoint)
    names = reader.get_variable_to_shape_map()
    assert reader.get_tensor("global_step/.ATTRIBUTES/VARIABLE_VALUE") == 6
    iterations = [n for n in names if n.startswith("optimizer/") and "iteration" in n]
    assert iterations and reader.get_tensor(iterations[0]) == 6
    assert_nothing_left()


@pytest.mark.integration
def test_resnet20_steps_and_image_signature(spark, tmp_path):
    import tensorflow as tf

    from sparktf.datasets.conversion import convert

    write_cifar10(tmp_path / "raw", n_train=40, n_test=8, train_files=2)
    convert(
        "cifar10",
        str(tmp_path / "raw"),
        str(tmp_path / "cifar"),
        shards=2,
        output_formats=("tfrecord",),
        spark=spark,
    )
    result = _fit(
        spark,
        tmp_path / "cifar",
        tmp_path / "model",
        strategy="allreduce",
        input_mode="files",
        steps=3,
        batch_size=8,
        model="resnet20",
        model_config={},
    )
    assert result.final_step == 3 and np.isfinite(result.metrics["loss"])
    # The export serves the trained weights: the final checkpoint restored into a fresh
    # ResNet-20 gives the export's scores, and training moved batch-norm statistics.
    from sparktf import models

    model = models.get_model("resnet20")
    tf.train.Checkpoint(model=model).restore(result.last_checkpoint).expect_partial()
    images = np.random.default_rng(3).integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    loaded = tf.saved_model.load(result.export_dir)
    scores = loaded.signatures["predict_images"](images=tf.constant(images))["scores"].numpy()
    assert scores.shape == (4, 10)
    np.testing.assert_allclose(
        scores, tf.nn.softmax(model(images, training=False)).numpy(), rtol=1e-4, atol=1e-5
    )
    moving_means = [w for w in model.weights if "moving_mean" in w.path]
    assert moving_means and any(np.abs(w.numpy()).max() > 0 for w in moving_means)
    assert_nothing_left()


def _run_in_thread(fn):
    """Runs ``fn()`` in a thread; returns a function that joins it and returns or raises."""
    import threading

    box: dict = {}

    def target():
        try:
            box["result"] = fn()
        except BaseException as exc:  # handed to the test's thread
            box["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()

    def join(timeout: float = 600):
        thread.join(timeout)
        assert not thread.is_alive(), "the run did not end"
        if "error" in box:
            raise box["error"]
        return box["result"]

    return join


def _wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _node_pids() -> list[int]:
    """This test session's TensorFlow processes (another run on the machine has its own)."""
    return sorted(descendants("sparktf.train.process.main"))


def _signal_a_worker_mid_run(spark, mnist_data, model_dir, sig, **fit_options):
    """Starts a run in a thread; once it has a checkpoint, sends ``sig`` to a non-chief
    worker (``/proc/PID/comm`` carries the role: tf-worker:0). Returns the run's join
    function, the worker's pid and the step of the latest checkpoint at that moment."""
    from sparktf.train import artifacts

    join = _run_in_thread(lambda: _fit(spark, mnist_data / "data", model_dir, **fit_options))
    first = fit_options["checkpoint"]["every_steps"]
    _wait_for(
        lambda: artifacts.latest_checkpoint_step(str(model_dir)) >= first, 240, "a checkpoint"
    )
    at_signal = artifacts.latest_checkpoint_step(str(model_dir))
    victim = next(p for p in _node_pids() if "worker" in Path(f"/proc/{p}/comm").read_text())
    os.kill(victim, sig)
    return join, victim, at_signal


@pytest.mark.e2e
def test_sigstop_of_a_process_fails_within_the_failure_timeout_naming_it(
    spark, mnist_data, tmp_path
):
    """A TensorFlow process that stops (no crash, no exit): its heartbeats stop, the driver
    names it, and the whole run ends within --failure-timeout of the stop."""
    import signal

    from sparktf.train import TrainingError

    join, victim, _ = _signal_a_worker_mid_run(
        spark,
        mnist_data,
        tmp_path / "model",
        signal.SIGSTOP,
        strategy="allreduce",
        input_mode="files",
        steps=100000,
        checkpoint={"every_steps": 5},
        failure={"failure_timeout_s": 30.0},
    )
    stopped = time.monotonic()
    try:
        with pytest.raises(TrainingError) as failure:
            join()
        elapsed = time.monotonic() - stopped
    finally:
        try:
            os.kill(victim, signal.SIGKILL)
        except ProcessLookupError:
            pass
    message = str(failure.value)
    print(f"failed {elapsed:.1f} s after SIGSTOP: {message}")
    # Named by the driver (heartbeats stopped) or by TensorFlow's own coordination service
    # through the chief (/job:worker/task:0 unhealthy), which the driver translates.
    assert f"pid {victim}" in message and "worker:0" in message
    assert elapsed <= 30.0
    assert_nothing_left()
    assert spark.sparkContext.parallelize(range(4), 2).sum() == 6


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("strategy", "input_mode", "steps"), [("allreduce", "files", 400), ("ps", "spark", 120)]
)
def test_kill_9_of_a_worker_restarts_from_the_checkpoint_and_reaches_the_target(
    spark, mnist_data, tmp_path, strategy, input_mode, steps
):
    """Both strategies and input modes: the worker dies; a new TF cluster (and, under ps, a
    new coordinator, parameter server and feed) resumes from the latest checkpoint."""
    import signal

    model_dir = tmp_path / "model"
    join, victim, at_kill = _signal_a_worker_mid_run(
        spark,
        mnist_data,
        model_dir,
        signal.SIGKILL,
        strategy=strategy,
        input_mode=input_mode,
        steps=steps,
        checkpoint={"every_steps": 10},
        failure={"max_restarts": 1},
    )
    killed = time.monotonic()
    result = join()
    print(
        f"{strategy}/{input_mode}: recovered and finished {time.monotonic() - killed:.1f} s "
        f"after kill -9; checkpoint at the kill: step {at_kill}; restarts: {result.restarts}"
    )
    assert result.final_step == steps and result.strategy == strategy
    assert result.export_dir == storage.join(str(model_dir), "export", str(steps))
    assert len(result.restarts) == 1
    restart = result.restarts[0]
    # The cause names the killed process: reported by its Spark task (killed by SIGKILL) or
    # by its peer's failed collective (/job:worker/task:0, which the driver translates).
    assert f"pid {victim}" in restart["cause"] and "worker:0" in restart["cause"]
    # Work lost: at most one checkpoint interval after the checkpoint seen at the kill.
    assert restart["resumed_from_step"] >= at_kill
    assert_nothing_left()


@pytest.mark.integration
def test_ptb_valid_perplexity_is_the_token_weighted_stream_perplexity(spark, tmp_path):
    """The language model is evaluated on the valid split (auto: the dataset has one) the
    book's way: streams with the LSTM state carried; checked against the trained weights run
    here through the Keras model directly."""
    import tensorflow as tf

    from sparktf import models
    from sparktf.datasets.conversion import convert
    from sparktf.datasets.synthetic import write_ptb
    from sparktf.train.process.inputs import stream_layout

    write_ptb(tmp_path / "raw", lines=(120, 40, 40), vocab_size=30, learnable=True)
    convert("ptb", str(tmp_path / "raw"), str(tmp_path / "ptb"), shards=2, spark=spark)
    config = {"hidden_size": 16, "num_layers": 1, "keep_prob": 1.0, "batch_size": 4}
    result = _fit(
        spark,
        tmp_path / "ptb",
        tmp_path / "model",
        strategy="allreduce",
        input_mode="files",
        steps=6,
        batch_size=4,
        model="ptb_small",
        model_config=config,
    )
    metrics = result.eval_metrics
    assert metrics["perplexity"] == pytest.approx(np.exp(metrics["loss"]), rel=1e-6)

    # Independently: the final checkpoint in a fresh model, the valid split's chunks in
    # stream layout (4 streams), the state carried from chunk to chunk, mean token NLL.
    vocab = len((tmp_path / "ptb" / "vocab.txt").read_text().splitlines())
    model = models.get_model("ptb_small", **config, vocab_size=vocab)
    tf.train.Checkpoint(model=model).restore(result.last_checkpoint).expect_partial()
    pq = pytest.importorskip("pyarrow.parquet")
    table = pq.read_table(tmp_path / "ptb" / "valid" / "parquet")
    tokens = np.stack([np.load(__import__("io").BytesIO(b)) for b in table["tokens"].to_pylist()])
    rows, _ = stream_layout(tokens, np.asarray(table["id"]), 4)
    state, nll, count = None, 0.0, 0
    for t in range(rows.shape[1]):
        x = tf.constant(rows[:, t])
        logits, state = model(x[:, :-1], initial_state=state, return_state=True)
        ce = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=x[:, 1:], logits=logits)
        nll += float(tf.reduce_sum(ce))
        count += int(tf.size(ce))
    assert metrics["loss"] == pytest.approx(nll / count, rel=1e-4)
    assert metrics["perplexity"] == pytest.approx(np.exp(nll / count), rel=1e-4)
    assert_nothing_left()


@pytest.mark.integration
def test_job_with_the_books_options_ema_bf16_evaluation_and_export_best(
    spark, mnist_data, tmp_path, caplog
):
    """jobs/train.py's flags and logic, on the session, with the 9.2 options:
    the export and the evaluation use the moving averages, in float32, and the evaluation
    is what that export gives on the test split."""
    import json

    import tensorflow as tf

    from sparktf import models
    from sparktf.jobs import train as job

    caplog.set_level("INFO", logger="sparktf")
    model_dir = tmp_path / "model"
    result_file = tmp_path / "result.json"
    mlp = {"hidden_units": 8}
    argv = [
        "--model",
        "mnist_mlp",
        "--model-config",
        json.dumps(mlp),
        "--data",
        str(mnist_data / "data"),
        "--model-dir",
        str(model_dir),
        "--strategy",
        "allreduce",
        "--num-workers",
        "2",
        "--threads-per-worker",
        "1",
        "--steps",
        "4",
        "--batch-size",
        "8",
        "--optimizer",
        "momentum",
        "--momentum",
        "0.8",
        "--learning-rate",
        "0.05",
        "--learning-rate-decay-type",
        "polynomial",
        "--end-learning-rate",
        "0.001",
        "--label-smoothing",
        "0.1",
        "--moving-average-decay",
        "0.5",
        "--precision",
        "bf16",
        "--eval-every",
        "2",
        "--export-best",
        "accuracy",
        "--result-json",
        str(result_file),
    ]
    assert job.main(argv, spark=spark) == 0
    result = json.loads(result_file.read_text())
    assert result["final_step"] == 4
    assert [e["step"] for e in result["eval_history"]] == [2, 4]
    assert "evaluation at step 2" in caplog.text and "evaluation on the test split" in caplog.text
    assert result["best_export_dir"].startswith(str(model_dir / "export_best"))

    # The export holds the moving averages of the final checkpoint, as float32 variables.
    config = json.loads((model_dir / "sparktf_train.json").read_text())["model_config"]
    task = models.get_task("mnist_mlp", **config)
    model = task.build_model()
    optimizer = task.make_optimizer(12, model)
    tf.train.Checkpoint(model=model, optimizer=optimizer).restore(
        result["last_checkpoint"]
    ).expect_partial()
    averaged = models.weights_for_export(task, model, optimizer)
    assert any(not np.array_equal(a, w) for a, w in zip(averaged, model.get_weights())), (
        "the moving averages equal the raw weights: EMA not applied"
    )
    model.set_weights(averaged)
    loaded = tf.saved_model.load(result["export_dir"])
    assert all(v.dtype == tf.float32 for v in loaded.signatures["predict_images"].variables)
    import pyarrow.parquet as pq

    table = pq.read_table(mnist_data / "data" / "test" / "parquet")
    images = np.stack([np.load(__import__("io").BytesIO(b)) for b in table["image"].to_pylist()])
    scores = loaded.signatures["predict_images"](images=tf.constant(images))["scores"].numpy()
    np.testing.assert_allclose(scores, tf.nn.softmax(model(images)).numpy(), rtol=1e-4, atol=1e-5)
    labels = np.asarray(table["label"])
    assert result["eval_metrics"]["accuracy"] == pytest.approx(
        np.mean(scores.argmax(axis=1) == labels), abs=1e-6
    )
    assert_nothing_left()


@pytest.mark.integration
def test_fine_tune_from_another_runs_export_training_only_the_head(
    spark, mnist_data, allreduce_files, tmp_path
):
    """--warm-start-from (the HDFS export of another run), --warm-start-exclude-scopes logits,
    --trainable-scopes logits: the hidden layer is the source's bit for bit at the end, the
    head was re-initialised and trained."""
    import tensorflow as tf

    from sparktf import models

    _, source = allreduce_files
    tuned = _fit(
        spark,
        mnist_data / "data",
        tmp_path / "tuned",
        strategy="allreduce",
        input_mode="files",
        steps=3,
        train_options={
            "warm_start_from": source.export_dir,
            "warm_start_exclude_scopes": ("logits",),
            "trainable_scopes": ("logits",),
        },
    )
    assert tuned.final_step == 3

    def weights(checkpoint):
        model = models.get_model("mnist_mlp", **TINY_MLP)
        directory, name = checkpoint.rsplit("/", 1)
        with storage.local_copy(directory) as local:  # the source's is on HDFS
            tf.train.Checkpoint(model=model).restore(os.path.join(local, name)).expect_partial()
        return {w.path: w.numpy() for w in model.weights}

    before, after = weights(source.last_checkpoint), weights(tuned.last_checkpoint)
    np.testing.assert_array_equal(after["hidden/kernel"], before["hidden/kernel"])
    np.testing.assert_array_equal(after["hidden/bias"], before["hidden/bias"])
    assert not np.array_equal(after["logits/kernel"], before["logits/kernel"])
    assert_nothing_left()


@pytest.mark.integration
def test_corrupt_shard_fails_fast_naming_the_file(spark, mnist_data, tmp_path):
    from sparktf.train import TrainingError

    data = tmp_path / "data"
    shutil.copytree(mnist_data / "data", data)
    shard = sorted((data / "train" / "tfrecord").glob("*.tfrecord"))[1]
    raw = bytearray(shard.read_bytes())
    raw[len(raw) // 2 : len(raw) // 2 + 64] = b"\xff" * 64
    shard.write_bytes(bytes(raw))
    started = time.monotonic()
    with pytest.raises(TrainingError) as failure:
        _fit(
            spark,
            data,
            tmp_path / "model",
            strategy="allreduce",
            input_mode="files",
            steps=50,
            failure={"failure_timeout_s": 60.0},
        )
    elapsed = time.monotonic() - started
    message = str(failure.value)
    print(f"error after {elapsed:.1f} s: {message}")
    assert shard.name in message and "corrupt" in message
    assert "worker:0" in message or "chief:0" in message
    assert elapsed < 120
    assert_nothing_left()
    # The session is still usable after the failure.
    assert spark.sparkContext.parallelize(range(4), 2).sum() == 6


@pytest.mark.e2e
@pytest.mark.gpu
def test_gpu_each_process_sees_its_gpu(request, tmp_path):
    """Where a GPU is present: a job with --gpus-per-worker 1 gets its GPU through Spark's
    resource scheduling (its own local-cluster application) and the chief's TensorFlow sees it."""
    import json

    tf = pytest.importorskip("tensorflow")
    if not tf.config.list_physical_devices("GPU"):
        pytest.skip("no GPU on this machine")
    out = helpers.run_command([ROOT / "conf/spark/gpu_discovery.sh"])
    assert '"name": "gpu"' in out.stdout and '"0"' in out.stdout
    mnist_data = request.getfixturevalue("mnist_data")
    result_file = tmp_path / "result.json"
    job = helpers.run_job(
        "train.py",
        "--model",
        "mnist_mlp",
        "--model-config",
        '{"hidden_units": 8}',
        "--data",
        str(mnist_data / "data"),
        "--model-dir",
        str(tmp_path / "model"),
        "--strategy",
        "allreduce",
        "--num-workers",
        "1",
        "--gpus-per-worker",
        "1",
        "--steps",
        "3",
        "--batch-size",
        "8",
        "--result-json",
        str(result_file),
        timeout=600,
    )
    assert job.returncode == 0, job.stderr[-3000:]
    result = json.loads(result_file.read_text())
    assert result["final_step"] == 3 and len(result["gpus"]) == 1
    assert_nothing_left()


def test_progress_watch_start_up_and_stall_deadlines():
    from sparktf.train.config import RunConfig
    from sparktf.train.driver.monitor import ProgressWatch
    from sparktf.train.wire.control import NodeState

    run = RunConfig(model_dir="/m", failure={"startup_timeout_s": 10, "stall_timeout_s": 5})
    watch = ProgressWatch(run, ["a", "b"])
    t0 = watch.started
    nodes = {"a": NodeState("a", role="chief:0"), "b": NodeState("b", role="worker:0")}
    assert watch.update(nodes, "a", t0 + 9) is None  # still starting
    message = watch.update(nodes, "a", t0 + 11)
    assert "did not start within 10 s" in message and "chief:0 (a)" in message
    nodes["a"].progress = {"step": 1, "target": 100}
    nodes["b"].progress = {"step": 1}
    assert watch.update(nodes, "a", t0 + 12) is None
    nodes["a"].progress = {"step": 7, "target": 100}
    assert watch.update(nodes, "a", t0 + 14) is None  # b lags, the run still moves
    assert watch.update(nodes, "a", t0 + 18) is None
    stalled = watch.update(nodes, "a", t0 + 20)  # a: 6 s without a new step
    assert "global step is stuck at 7" in stalled
    assert "worker:0 (b, at step 1)" in stalled and "chief:0 (a, at step 7)" in stalled
    nodes["a"].progress = {"step": 100, "target": 100}  # finishing: export may take long
    assert watch.update(nodes, "a", t0 + 21) is None
    assert watch.update(nodes, "a", t0 + 60) is None


def test_ptb_stream_layout_continues_each_row_across_steps():
    import numpy as np

    from sparktf.train.process.inputs import stream_layout

    n, length = 26, 5
    tokens = np.arange(n * length).reshape(n, length)  # chunk k holds tokens 5k .. 5k+4
    ids = np.arange(n)
    shuffled = np.random.default_rng(0).permutation(n)  # reader order must not matter
    parts = [
        stream_layout(tokens[shuffled], ids[shuffled], batch_size=2, num_shards=2, shard=s)
        for s in range(2)
    ]
    rows = np.concatenate([p[0] for p in parts])  # the global batch's 4 streams
    assert rows.shape == (4, 6, length)  # 26 chunks -> 4 streams of 6 steps, 2 dropped
    for stream in rows:  # each row reads on where it stopped the step before
        assert (np.diff(stream.reshape(-1)) == 1).all()
    starts = [int(r[0, 0]) for r in rows]
    assert starts == [0, 30, 60, 90]  # contiguous streams, in text order
    assert set(np.concatenate([p[1].reshape(-1) for p in parts])) == set(range(24))
    with pytest.raises(Exception, match="fewer than the global batch"):
        stream_layout(tokens[:3], ids[:3], batch_size=2, num_shards=2, shard=0)
