"""``sparktf.train.run(train_fn)``: your own training function in every TensorFlow process of
a run on the session's two executors (a real local-cluster, real TensorFlow).

- all-reduce: Keras 3 ``model.fit`` inside ``strategy.scope()`` on the context's dataset, a
  callback reporting each epoch, and the same model trained by a plain custom loop on the same
  batches: the two loss curves agree (``fit`` fails there without sparktf's mend);
- ps: the chief's function drives the coordinator while the worker and the driver's parameter
  server serve;
- a function that raises fails the run naming the exception, its message and its line; with
  ``max_restarts=1`` a function that fails once after reporting a checkpoint finishes from it.
"""

from __future__ import annotations

import json
import logging
import math
import os
from pathlib import Path

import pytest

from sparktf import storage
from sparktf.train import (
    FailureConfig,
    RunConfig,
    ScalingConfig,
    TrainingError,
    get_context,
    report,
    run,
)
from tests import helpers

pytestmark = pytest.mark.unit  # the runs on Spark carry their own mark

ROOT = Path(__file__).resolve().parent.parent

TWO_WORKERS = ScalingConfig(strategy="allreduce", num_workers=2, threads_per_worker=1)
PS = ScalingConfig(strategy="ps", num_workers=1, num_ps=1, ps_on_driver=True, threads_per_worker=1)


def _run_config(model_dir, max_restarts: int = 0) -> RunConfig:
    return RunConfig(
        model_dir=str(model_dir),
        failure=FailureConfig(max_restarts=max_restarts, failure_timeout_s=60.0),
    )


def keras_fit_and_custom_loop(config):
    """Trains one small model with ``model.fit`` and a copy of it with a custom loop, from
    the same initial weights on the same batches; returns both loss curves (per epoch)."""
    import keras
    import tensorflow as tf

    ctx = get_context()
    steps, epochs, batch = config["steps"], config["epochs"], config["batch"]

    def build():
        keras.utils.set_random_seed(7)
        return keras.Sequential(
            [
                keras.Input((28, 28, 1)),
                keras.layers.Rescaling(1 / 255),
                keras.layers.Flatten(),
                keras.layers.Dense(10),
            ]
        )

    def data():
        columns = ["image", "label"]
        return ctx.dataset("train", batch_size=batch, columns=columns, label="label", shuffle=False)

    class Report(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            report({"step": (epoch + 1) * steps, "epoch": epoch, "loss": logs["loss"]})

    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    with ctx.strategy.scope():
        model = build()
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss=loss)
        twin = build()
        optimizer = keras.optimizers.SGD(0.05)
    twin.set_weights(model.get_weights())
    history = model.fit(
        data(), epochs=epochs, steps_per_epoch=steps, callbacks=[Report()], verbose=0
    )

    per_example = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")
    global_batch = batch  # dataset()'s batch is the global one; each process gets its part

    @tf.function
    def step(iterator):
        def replica_step(x, y):
            with tf.GradientTape() as tape:
                value = tf.nn.compute_average_loss(
                    per_example(y, twin(x, training=True)), global_batch_size=global_batch
                )
            grads = tape.gradient(value, twin.trainable_variables)
            optimizer.apply_gradients(zip(grads, twin.trainable_variables))
            return value

        x, y = next(iterator)
        return ctx.strategy.reduce("SUM", ctx.strategy.run(replica_step, args=(x, y)), None)

    iterator = iter(ctx.strategy.experimental_distribute_dataset(data()))
    custom = []
    for _ in range(epochs):
        custom.append(float(sum(step(iterator) for _ in range(steps)) / steps))
    return {"fit": history.history["loss"], "custom": custom, "rank": ctx.rank}


@pytest.mark.integration
def test_keras_fit_under_allreduce_matches_a_custom_loop(spark, mnist_data, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="sparktf")
    config = {"steps": 4, "epochs": 3, "batch": 20}
    result = run(
        keras_fit_and_custom_loop,
        TWO_WORKERS,
        _run_config(tmp_path / "model"),
        config=config,
        data=str(mnist_data / "data"),
        spark=spark,
    )
    value = result.value
    assert value["rank"] == 0  # the chief's return value
    assert len(value["fit"]) == len(value["custom"]) == 3
    assert value["fit"] == pytest.approx(value["custom"], rel=0.02)
    assert all(math.isfinite(x) for x in value["fit"])
    # every epoch reported: the driver logged it and the result keeps it in order
    assert [entry["step"] for entry in result.history] == [4, 8, 12]
    assert [entry["metrics"]["loss"] for entry in result.history] == pytest.approx(value["fit"])
    assert result.metrics["loss"] == pytest.approx(value["fit"][-1])
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("report ")]
    assert len(logged) == 3 and "loss" in logged[0]
    assert result.strategy == "allreduce" and result.restarts == []


def ps_coordinator(config):
    """The chief drives the parameter servers through the coordinator."""
    import tensorflow as tf

    ctx = get_context()
    assert ctx.coordinator is not None and ctx.is_chief
    with ctx.strategy.scope():
        total = tf.Variable(0.0)

    @tf.function
    def add():
        total.assign_add(config["by"])
        return total.read_value()

    for _ in range(config["times"]):
        ctx.coordinator.schedule(add)
    ctx.coordinator.join()
    report({"total": total.numpy()})
    return {"total": float(total.numpy()), "role": ctx.role}


@pytest.mark.integration
def test_ps_chief_runs_the_function_with_the_coordinator(spark, tmp_path):
    result = run(
        ps_coordinator,
        PS,
        _run_config(tmp_path / "model"),
        config={"by": 2.0, "times": 5},
        spark=spark,
    )
    assert result.value == {"total": 10.0, "role": "chief"}
    assert result.history[0]["metrics"] == {"total": 10.0}
    helpers.assert_nothing_left()  # the worker and the driver's parameter server are gone


def fails_once(config):
    """Attempt 0: the chief reports a checkpoint, then raises (the worker returns); attempt
    1 resumes from it."""
    ctx = get_context()
    if ctx.restored_dir is None and not ctx.is_chief:
        return None
    if ctx.restored_dir is None:
        path = os.path.join(ctx.local_dir, "state")
        os.makedirs(path)
        with open(os.path.join(path, "state.json"), "w") as f:
            json.dump({"epoch": 1}, f)
        report({"epoch": 1}, checkpoint=path)
        raise ValueError(config["message"])
    with open(os.path.join(ctx.restored_dir, "state.json")) as f:
        state = json.load(f)
    report({"epoch": state["epoch"] + 1})
    return {"resumed_at": state["epoch"], "attempt": ctx.attempt}


@pytest.mark.integration
def test_a_function_that_fails_once_resumes_from_its_checkpoint(spark, tmp_path):
    model_dir = tmp_path / "model"
    result = run(
        fails_once,
        TWO_WORKERS,
        _run_config(model_dir, max_restarts=1),
        config={"message": "bad"},
        spark=spark,
    )
    assert result.value == {"resumed_at": 1, "attempt": 1}
    (restart,) = result.restarts
    assert restart["resumed_from_checkpoint"] == result.history[0]["checkpoint"]
    assert f"{model_dir}/checkpoints/report-000001" in restart["resumed_from_checkpoint"]
    # the cause names the exception, its message and the line of this file that raised it
    assert "ValueError: bad" in restart["cause"]
    assert f"{__file__}:" in restart["cause"] and "in fails_once" in restart["cause"]
    assert [e["metrics"]["epoch"] for e in result.history] == [1.0, 2.0]


def fit_from_a_dataframe(config):
    """Keras 3 ``fit`` on the DataFrame's rows (``x`` a Vector, ``city`` a string, ``y``),
    a StringLookup inside the model."""
    import keras

    ctx = get_context()
    data = ctx.dataset(batch_size=config["batch"], columns=["x", "city", "y"], label="y")
    with ctx.strategy.scope():
        inputs = {"x": keras.Input((2,), name="x"), "city": keras.Input((), dtype="string")}
        city = keras.layers.StringLookup(vocabulary=["rome", "oslo"], output_mode="one_hot")
        merged = keras.layers.Concatenate()([inputs["x"], city(inputs["city"])])
        model = keras.Model(inputs, keras.layers.Dense(1)(merged))
        model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    history = model.fit(data, epochs=config["epochs"], steps_per_epoch=config["steps"], verbose=0)
    report({"loss": history.history["loss"][-1]})
    return {"loss": history.history["loss"], "weights": model.layers[-1].get_weights()[0].ravel()}


@pytest.mark.integration
def test_keras_fit_trains_straight_from_a_dataframe(spark, tmp_path):
    """``run(train_fn, data=df)``: a DataFrame's columns (a Vector, a string, a number) reach
    ``fit`` as tensors by name, through the Spark feed: no dataset is written."""
    import numpy as np
    from pyspark.ml.linalg import Vectors

    rng = np.random.default_rng(0)
    x = rng.normal(size=(1024, 2))
    cities = rng.choice(["rome", "oslo"], size=1024)
    y = x @ [2.0, -1.0] + np.where(cities == "rome", 1.0, -1.0)
    rows = [(i, Vectors.dense(x[i].tolist()), str(cities[i]), float(y[i])) for i in range(1024)]
    df = spark.createDataFrame(rows, ["id", "x", "city", "y"]).repartition(2)
    model_dir = tmp_path / "model"
    config = {"batch": 32, "epochs": 6, "steps": 16}
    result = run(
        fit_from_a_dataframe,
        TWO_WORKERS,
        _run_config(model_dir),
        config=config,
        data=df,
        spark=spark,
    )
    losses = result.value["loss"]
    assert losses[-1] < 0.05 * losses[0], losses  # y is exactly linear in the inputs
    weights = result.value["weights"]
    assert weights[:2] == pytest.approx([2.0, -1.0], abs=0.15), weights
    written = [p.name for p in model_dir.rglob("*") if p.is_file()]
    assert not [n for n in written if n.endswith(".parquet") or n == "manifest.json"], written
    helpers.assert_nothing_left()


def raises(config):
    raise ValueError("bad")


@pytest.mark.integration
def test_a_function_that_raises_fails_the_run_naming_its_line(spark, tmp_path):
    with pytest.raises(TrainingError) as failed:
        run(raises, TWO_WORKERS, _run_config(tmp_path / "model"), spark=spark)
    message = str(failed.value)
    assert "ValueError: bad" in message
    assert f"{__file__}:" in message and "in raises" in message
    helpers.assert_nothing_left()


@pytest.mark.e2e
def test_the_custom_loop_example_trains_through_submit(tmp_path):
    """``examples/custom_loop.py`` as a user runs it: ``scripts/submit.sh``, its own Spark
    application; each epoch reported with the weights as a checkpoint."""
    model_dir = tmp_path / "model"
    # its defaults: 4 epochs of 15 steps on the demo MNIST-format set
    command = ["./scripts/submit.sh", "examples/custom_loop.py", "--model-dir", str(model_dir)]
    done = helpers.run_command(command, cwd=ROOT, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    start = done.stdout.index('{\n  "value"')
    printed, _ = json.JSONDecoder().raw_decode(done.stdout[start:])
    losses = [entry["metrics"]["loss"] for entry in printed["history"]]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0] / 2  # it learned
    assert printed["value"] == {
        "loss": pytest.approx(losses[-1]),
        "epochs": 4,
        "workers": 2,
        "first_epoch": 0,  # a fresh model directory: nothing to resume
    }
    last = printed["last_checkpoint"]
    assert last.endswith("/checkpoints/report-000004")
    assert storage.exists(storage.join(last, "model.weights.h5"))
    assert any(Path(model_dir, "events").rglob("*tfevents*"))  # the reports, in TensorBoard
    assert " INFO sparktf.train.driver.monitor: report 4: step 60, epoch 3, loss " in (
        done.stdout + done.stderr
    )


# --------------------------------------------------------------------------- pure functions


def test_the_error_names_the_users_frame_not_a_librarys():
    from sparktf.train.driver.monitor import innermost_frame

    text = (
        "Traceback (most recent call last):\n"
        '  File "/opt/venv/lib/python3.11/site-packages/sparktf/train/process/function.py", '
        "line 90, in run_function\n"
        '  File "/home/me/train.py", line 12, in train_fn\n'
        '  File "/opt/venv/lib/python3.11/site-packages/keras/src/trainer.py", line 5, in fit\n'
        "ValueError: bad"
    )
    assert innermost_frame(text) == "/home/me/train.py:12 in train_fn"
    only_library = '  File "/usr/lib/python3.11/json/decoder.py", line 3, in decode\n'
    assert innermost_frame(only_library) is None
    assert innermost_frame("no frames") is None


def test_return_values_and_metrics_become_json_data():
    import numpy as np

    from sparktf.train.process.context import metric_values
    from sparktf.train.process.function import jsonable

    value = {"loss": np.float32(0.5), "curve": np.arange(3), "name": "x", "n": None}
    assert jsonable(value) == {"loss": 0.5, "curve": [0, 1, 2], "name": "x", "n": None}
    with pytest.raises(TypeError, match="must be JSON data .* not object"):
        jsonable({"model": object()})
    assert metric_values({"loss": np.float64(1.5), "step": 3}) == {"loss": 1.5, "step": 3.0}
    with pytest.raises(ValueError, match="metric 'name' is str, not a number"):
        metric_values({"name": "x"})


def test_context_and_report_only_inside_a_run():
    with pytest.raises(RuntimeError, match="for the function that sparktf.train.run runs"):
        get_context()
    with pytest.raises(RuntimeError):
        report({"loss": 1.0})


def test_a_run_that_cannot_ship_is_refused_before_anything_starts(tmp_path):
    import threading

    from sparktf.train import ConfigError
    from sparktf.train.driver.train_fn import plan_function

    run_config = _run_config(tmp_path / "model")
    with pytest.raises(ConfigError, match="raises or its config cannot be pickled"):
        plan_function(raises, TWO_WORKERS, run_config, config={"lock": threading.Lock()})
    with pytest.raises(ConfigError, match="needs a function to run, not str"):
        plan_function("train.py", TWO_WORKERS, run_config)
    plan = plan_function(raises, TWO_WORKERS, run_config, config={"n": 1})
    assert plan.function and plan.train.model == "function:raises" and not plan.data.data


def test_train_fn_is_called_with_its_config_only_when_it_takes_one():
    from sparktf.train.process.function import takes_argument

    assert takes_argument(lambda config: None)
    assert takes_argument(lambda *args: None)
    assert not takes_argument(lambda: None)
    assert not takes_argument(lambda *, key=1: None)


def test_the_keras_mend_leaves_fit_outside_multi_worker_as_it_was():
    import keras
    import numpy as np

    from sparktf.train.process import keras_fit

    mended = keras.__version__ in keras_fit.KNOWN_BROKEN  # tests/test_keras_canary.py
    assert keras_fit.apply() is mended and keras_fit.apply() is mended  # idempotent
    keras.utils.set_random_seed(1)
    x = np.random.rand(64, 3).astype("float32")
    y = x @ np.array([1.0, -2.0, 0.5], "float32")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    losses = model.fit(x, y, epochs=5, batch_size=16, verbose=0).history["loss"]
    assert losses[-1] < losses[0]
