"""Bring your own model (sparktf.models.register / 'package.module:build'), without Spark:
the task it makes, its checks, its export signatures, and the registration that travels in
a run's plan to a process that cannot import the build function's module."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from sparktf import models
from sparktf.datasets.formats import Field
from sparktf.models import custom
from tests import helpers

pytestmark = pytest.mark.unit

MODULE = textwrap.dedent(
    """
    import keras

    def build(input_shape, num_classes, hidden_units=8):
        inputs = keras.Input(input_shape)
        x = keras.layers.Flatten()(inputs)
        x = keras.layers.Dense(hidden_units, activation="relu", name="hidden")(x)
        return keras.Model(inputs, keras.layers.Dense(num_classes, name="logits")(x))

    images = None  # set below

    def not_a_model(input_shape, num_classes):
        return "nope"
    """
)


@pytest.fixture()
def user_module(tmp_path, monkeypatch):
    """A user's module on sys.path (not importable by a fresh process without it)."""
    (tmp_path / "byo_models.py").write_text(
        MODULE
        + "\nfrom sparktf.models import custom_model\n"
        + "images = custom_model(build, input_dtype='uint8', scaling='symmetric')\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("byo_models", None)
    import byo_models

    yield byo_models
    sys.modules.pop("byo_models", None)


def test_register_builds_trains_and_exports_feature_signatures(user_module, tmp_path):
    import tensorflow as tf

    name = models.register(
        "byo_tabular", user_module.build, input_shape=(4,), num_classes=3, learning_rate=0.05
    )
    task = models.get_task(name, hidden_units=5)
    assert task.kind == "classifier" and task.features == ("features", "label")
    assert task.config["hidden_units"] == 5 and task.config["learning_rate"] == 0.05
    assert models.get_task(task.name, **task.config).config == task.config  # rebuilt from config
    model = task.build_model()
    optimizer = task.make_optimizer(10, model)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 4)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64) + (x[:, 1] > 1).astype(np.int64)
    batch = {"features": tf.constant(x), "label": tf.constant(y)}
    first = float(task.train_step(model, optimizer, batch, 64)["loss"])
    for _ in range(30):
        last = task.train_step(model, optimizer, batch, 64)
    assert float(last["loss"]) < first and "accuracy" in last

    export = task.export(model, str(tmp_path / "export"))
    assert set(task.signature_info()) == {"serving_default", "predict_features"}
    direct = helpers.call(export, "predict_features", features=x)
    expected = tf.nn.softmax(model(x)).numpy()
    np.testing.assert_allclose(direct["scores"], expected, rtol=1e-5, atol=1e-6)
    example = tf.train.Example(
        features=tf.train.Features(
            feature={"features": tf.train.Feature(float_list=tf.train.FloatList(value=x[0]))}
        )
    ).SerializeToString()
    served = helpers.call(export, "serving_default", inputs=np.array([example]))
    assert served["classes"][0] == direct["classes"][0]


def test_module_name_takes_shapes_from_the_dataset_and_serves_images(user_module):
    name = "byo_models:images"
    fields = [Field("image", "uint8", (28, 28, 1)), Field("label", "int64"), Field("id", "int64")]
    manifest = {"dataset": "mnist", "schema": {"label": {"num_classes": 10}}}
    filled = models.get_task(name).data_overrides(fields, manifest)
    assert filled == {  # input_dtype: set by custom_model(...)
        "feature": "image",
        "input_shape": [28, 28, 1],
        "num_classes": 10,
    }
    task = models.get_task(name, **filled)
    assert task.config["scaling"] == "symmetric" and task.serves_images
    model = task.build_model()
    assert set(task.serving_endpoints(model)) == {"serving_default", "predict_images"}
    # A model that fixes another shape than the data's is refused, naming both.
    with pytest.raises(ValueError, match=r"expects input_shape \(5,\).*\(28, 28, 1\)"):
        models.get_task("byo_models:build", input_shape=[5]).data_overrides(fields, manifest)


def test_clear_errors_for_names_and_builders(user_module):
    with pytest.raises(ValueError, match="cannot import module 'no_such_module'.*executor"):
        models.get_task("no_such_module:build")
    with pytest.raises(ValueError, match="has no 'missing'"):
        models.get_task("byo_models:missing")
    with pytest.raises(ValueError, match="registry's own models"):
        models.register("mnist_mlp", user_module.build)
    with pytest.raises(ValueError, match="unknown config key"):
        models.get_task("byo_models:build", hidden=3)
    with pytest.raises(ValueError, match="input_shape is not known"):
        models.get_task("byo_models:build", num_classes=3).build_model()
    with pytest.raises(TypeError, match="not a keras.Model"):
        models.get_task("byo_models:not_a_model", input_shape=[3], num_classes=2).build_model()
    with pytest.raises(ValueError, match="loss must be"):
        models.register("byo_bad_loss", user_module.build, loss="hinge")
    with pytest.raises(ValueError, match="metrics"):
        models.register("byo_bad_metric", user_module.build, metrics=["auc"])


def test_registration_travels_by_value_to_a_process_without_the_module(user_module, tmp_path):
    """What sparktf.train.process.main does with plan.custom_model, in a process whose sys.path
    lacks the user's module."""

    def squared_hinge(labels, logits):  # a local function: only by value can it travel
        import tensorflow as tf

        onehot = tf.one_hot(labels, tf.shape(logits)[-1]) * 2.0 - 1.0
        return tf.reduce_mean(tf.square(tf.nn.relu(1.0 - onehot * logits)), axis=-1)

    models.register(
        "byo_travels", user_module.build, input_shape=(3,), num_classes=2, loss=squared_hinge
    )
    payload = custom.plan_payload("byo_travels")
    assert custom.plan_payload("mnist_mlp") is None
    code = (
        "import sys, numpy as np, tensorflow as tf\n"
        "from sparktf.models import custom, get_task\n"
        "name = custom.install_payload(sys.stdin.buffer.read())\n"
        "task = get_task(name)\n"
        "model = task.build_model()\n"
        "b = {'features': tf.ones([4, 3]), 'label': tf.constant([0, 1, 0, 1])}\n"
        "out = task.train_step(model, task.make_optimizer(1, model), b, 4)\n"
        "print(name, task.config['loss'], model.count_params(), float(out['loss']) >= 0)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    done = subprocess.run(
        [sys.executable, "-c", code],
        input=payload,
        capture_output=True,
        cwd="/",
        env=env,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    # 3*8+8 hidden + 8*2+2 logits
    assert done.stdout.decode().split() == ["byo_travels", "callable", "50", "True"]
