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
    with pytest.raises(ValueError, match="loss must be a Keras loss name"):
        models.register("byo_bad_loss", user_module.build, loss="no_such_loss")
    with pytest.raises(ValueError, match="a classifier trains on"):
        models.register("byo_bad_loss", user_module.build, kind="classifier", loss="mse")
    with pytest.raises(ValueError, match="kind 'ranking' is not supported"):
        models.register("byo_bad_kind", user_module.build, kind="ranking")
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


def _dense(input_shape, num_outputs, hidden_units=8):
    import keras

    inputs = keras.Input(input_shape)
    x = keras.layers.Dense(hidden_units, activation="relu")(inputs)
    return keras.Model(inputs, keras.layers.Dense(num_outputs)(x))


@pytest.mark.tensorflow_only  # Keras alone: the second stack leaves it to the first
@pytest.mark.parametrize(
    ("options", "kind", "outputs"),
    [
        ({"loss": "mse"}, "regression", {"predictions": (16,)}),
        ({"loss": "huber", "metrics": ["mae"]}, "regression", {"predictions": (16,)}),
        ({"kind": "binary"}, "binary", {"classes": (16,), "scores": (16, 2)}),
        ({"kind": "multilabel", "num_classes": 2}, "multilabel", {"predictions": (16, 2)}),
        ({"loss": "log_cosh", "kind": "custom", "label_shape": [2]}, "custom", None),
    ],
    ids=["mse", "huber", "binary", "multilabel", "custom"],
)
def test_each_kind_trains_evaluates_and_exports(options, kind, outputs, tmp_path):
    """Labels of the kind's shape and dtype: a few steps lower the loss, evaluation reports
    the kind's metrics over every row, and the export gives the kind's outputs."""
    import tensorflow as tf

    name = models.register(f"kind_{kind}", _dense, input_shape=(3,), learning_rate=0.05, **options)
    task = models.get_task(name)
    assert task.kind == kind
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3)).astype(np.float32)
    target = x @ np.array([1.0, -2.0, 0.5], np.float32)
    y = {
        "regression": target,
        "binary": (target > 0).astype(np.int64),  # integer 0/1 labels, as a dataset holds them
        "multilabel": np.stack([x[:, 0] > 0, x[:, 1] > 0], 1).astype(np.float32),
        "custom": np.stack([target, -target], 1),
    }[kind]
    model = task.build_model()
    optimizer = task.make_optimizer(10, model)
    batch = {"features": tf.constant(x), "label": tf.constant(y)}
    first = task.train_step(model, optimizer, batch, 64)
    for _ in range(40):
        last = task.train_step(model, optimizer, batch, 64)
    assert float(last["loss"]) < 0.5 * float(first["loss"]), (first, last)
    metrics = task.evaluation_metrics()
    task.update_evaluation(metrics, model, batch)
    results = {k: float(m.result()) for k, m in metrics.items()}
    expected = {"loss", *task.metric_names}
    assert set(results) == expected
    assert results["loss"] == pytest.approx(float(task.eval_step(model, batch, 64)["loss"]))
    if kind in ("binary", "multilabel"):
        assert results["auc"] > 0.95 and results["accuracy"] > 0.9, results
    if kind == "regression" and "rmse" in results:
        assert results["rmse"] == pytest.approx(float(np.sqrt(results["loss"])), rel=1e-4)

    export = task.export(model, str(tmp_path / "export"))
    served = helpers.call(export, "predict_features", features=x[:16])
    if outputs is None:  # custom: the outputs in the label's shape
        outputs = {"predictions": (16, 2)}
    assert {k: v.shape for k, v in served.items()} == outputs
    direct = model(x[:16]).numpy()
    if kind == "regression":
        np.testing.assert_allclose(served["predictions"], direct[:, 0], rtol=1e-5, atol=1e-5)
    if kind == "binary":
        p = 1.0 / (1.0 + np.exp(-direct[:, 0]))
        np.testing.assert_allclose(served["scores"][:, 1], p, rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(served["classes"], (p > 0.5).astype(np.int64))


def test_label_shapes_and_counts_come_from_the_dataset():
    fields = [Field("features", "float32", (3,)), Field("label", "float32", (2,))]
    manifest = {"dataset": "dataframe"}
    models.register("kind_vector_regression", _dense, loss="mse")
    task = models.get_task("kind_vector_regression")
    assert task.data_overrides(fields, manifest) == {
        "feature": "features",
        "input_dtype": "float32",
        "input_shape": [3],
        "label_shape": [2],
    }
    models.register("kind_tags", _dense, kind="multilabel")
    assert models.get_task("kind_tags").data_overrides(fields, manifest)["num_classes"] == 2
    with pytest.raises(ValueError, match=r"expects label_shape \(3,\).*shape \(2,\)"):
        models.get_task("kind_vector_regression", label_shape=[3]).data_overrides(fields, manifest)
    # A build function whose outputs do not match the label fails naming both.
    models.register("kind_three_outputs", lambda shape, n: _dense(shape, 3), loss="mse")
    with pytest.raises(ValueError, match=r"\(None, 3\); expected outputs \[B, 2\]"):
        models.get_task("kind_three_outputs", input_shape=[3], label_shape=[2]).build_model()


def _wide_and_deep(inputs, num_outputs, embed_dim=2):
    import keras

    city = keras.layers.StringLookup(vocabulary=["rome", "oslo"])(inputs["city"])
    embedded = keras.layers.Flatten()(keras.layers.Embedding(3, embed_dim)(city))
    count = keras.layers.Reshape((1,))(keras.ops.cast(inputs["count"], "float32"))
    x = keras.layers.Concatenate()([inputs["num"], embedded, count])
    return keras.Model(inputs, keras.layers.Dense(num_outputs)(x))


@pytest.mark.tensorflow_only  # Keras alone: the second stack leaves it to the first
def test_named_inputs_take_their_specs_from_the_data_train_and_export_by_name(tmp_path):
    """A model of several named inputs (a vector, a string, an integer): their dtypes and
    shapes come from the dataset's columns, a batch is a dict by name, and the export's
    ``serving_default`` takes each input by its name (a StringLookup's table included)."""
    import tensorflow as tf

    from sparktf.inference.prediction_plan import signature_kind
    from sparktf.inference.saved_model import inspect_export

    models.register(
        "named_regression",
        _wide_and_deep,
        inputs=["num", "city", "count"],
        loss="mse",
        learning_rate=0.05,
    )
    task = models.get_task("named_regression")
    assert task.kind == "regression" and task.features == ("num", "city", "count", "label")
    fields = [
        Field("num", "float32", (2,)),
        Field("city", "string"),
        Field("count", "int64"),
        Field("label", "float32"),
    ]
    filled = task.data_overrides(fields, {"dataset": "the DataFrame"})
    assert filled["inputs"] == {
        "num": {"dtype": "float32", "shape": [2]},
        "city": {"dtype": "string", "shape": []},
        "count": {"dtype": "int64", "shape": []},
    }
    task = models.get_task("named_regression", **filled)
    rng = np.random.default_rng(0)
    num = rng.normal(size=(64, 2)).astype(np.float32)
    city = rng.choice(np.array(["rome", "oslo", "paris"], dtype=object), 64)
    count = rng.integers(0, 3, 64)
    y = num[:, 0] - num[:, 1] + np.where(city == "rome", 1.0, -1.0) + count
    batch = {
        "num": tf.constant(num),
        "city": tf.constant(city),
        "count": tf.constant(count),
        "label": tf.constant(y.astype(np.float32)),
    }
    model = task.build_model()
    optimizer = task.make_optimizer(10, model)
    first = task.train_step(model, optimizer, batch, 64)
    for _ in range(60):
        last = task.train_step(model, optimizer, batch, 64)
    assert float(last["loss"]) < 0.5 * float(first["loss"]), (first, last)

    export = task.export(model, str(tmp_path / "export"))
    assert set(task.signature_info()) == {"serving_default"}
    served = helpers.call(export, "serving_default", num=num[:8], city=city[:8], count=count[:8])
    direct = model({k: v[:8] for k, v in batch.items() if k != "label"})
    np.testing.assert_allclose(served["predictions"], direct.numpy()[:, 0], rtol=1e-5, atol=1e-5)
    assert signature_kind(inspect_export(export).signatures["serving_default"]) == "named"

    with pytest.raises(ValueError, match="named inputs read"):
        task.data_overrides([Field("num", "uint8", (2,)), *fields[1:]], {"dataset": "d"})
    with pytest.raises(ValueError, match="inputs names a column twice"):
        models.get_task("named_regression", inputs=["num", "num"])
    with pytest.raises(ValueError, match="are not known"):
        models.get_task("named_regression").build_model()


def _two_outputs(input_shape, outputs):
    import keras

    assert outputs == {"price": 1, "churned": 1}
    inputs = keras.Input(input_shape)
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    price = keras.layers.Dense(1, name="price")(hidden)
    return keras.Model(inputs, {"price": price, "churned": keras.layers.Dense(1)(hidden)})


@pytest.mark.tensorflow_only  # Keras alone: the second stack leaves it to the first
def test_several_outputs_train_with_a_loss_each_and_export_by_name(tmp_path):
    """Two outputs, a regression one (mse) and a binary one (a logit): each reads the label
    column of its name, the step and the evaluation report each output's loss, and the export
    returns both by name (the binary one as a probability)."""
    import tensorflow as tf

    from sparktf.inference.prediction_plan import signature_kind
    from sparktf.inference.saved_model import inspect_export

    name = models.register(
        "two_outputs",
        _two_outputs,
        input_shape=(3,),
        outputs={"price": "mse", "churned": {"loss": "binary_crossentropy", "weight": 2.0}},
        learning_rate=0.05,
    )
    task = models.get_task(name)
    assert task.kind == "custom" and task.features == ("features", "price", "churned")
    assert task.metric_names == ("price_loss", "churned_loss")
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 3)).astype(np.float32)
    batch = {
        "features": tf.constant(x),
        "price": tf.constant(x @ np.array([1.0, 2.0, 0.0], np.float32)),
        "churned": tf.constant((x[:, 2] > 0).astype(np.int64)),
    }
    model = task.build_model()
    optimizer = task.make_optimizer(10, model)
    first = task.train_step(model, optimizer, batch, 64)
    for _ in range(60):
        last = task.train_step(model, optimizer, batch, 64)
    assert {"loss", "price_loss", "churned_loss"} <= set(last)
    for key in ("price_loss", "churned_loss"):
        assert float(last[key]) < 0.5 * float(first[key]), (key, first, last)
    weighted = float(last["price_loss"]) + 2.0 * float(last["churned_loss"])
    assert float(last["loss"]) == pytest.approx(weighted, rel=1e-4)
    metrics = task.evaluation_metrics()
    task.update_evaluation(metrics, model, batch)
    assert set(metrics) == {"loss", "price_loss", "churned_loss"}

    export = task.export(model, str(tmp_path / "export"))
    served = helpers.call(export, "predict_features", features=x[:8])
    assert {k: v.shape for k, v in served.items()} == {"price": (8,), "churned": (8,)}
    direct = model(x[:8])
    np.testing.assert_allclose(served["price"], direct["price"].numpy()[:, 0], rtol=1e-5)
    p = 1.0 / (1.0 + np.exp(-direct["churned"].numpy()[:, 0]))
    np.testing.assert_allclose(served["churned"], p, rtol=1e-5, atol=1e-6)
    assert signature_kind(inspect_export(export).signatures["predict_features"]) == "named"

    with pytest.raises(ValueError, match="outputs must name two outputs or more"):
        models.get_task(name, outputs={"price": {"loss": "mse", "weight": 1.0}})
    with pytest.raises(ValueError, match="'nope' is not a Keras loss name"):
        models.get_task(name, outputs={"a": {"loss": "nope"}, "b": {"loss": "mse"}})
