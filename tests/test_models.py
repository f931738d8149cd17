"""Tests for the model registry (sparktf.models).

Kept small for a shared 2-core machine: big presets are only built and counted, the
steps run on tiny batches with tiny overrides, a few optimisation steps each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import pytest
import tensorflow as tf

from sparktf import models
from sparktf.models import count_params

pytestmark = [pytest.mark.unit, pytest.mark.tensorflow_only]  # see pyproject.toml

REPO = Path(__file__).resolve().parents[1]

# Small configs that keep every family's structure (used where full size is not the point).
TINY: dict[str, dict] = {
    "resnet20": {"num_residual_units": [1, 1, 1]},
    "resnet164": {"num_residual_units": [1, 1, 1]},
    "alexnet_v2": {"image_shape": [32, 32, 3], "num_classes": 10, "fc_units": 32},
    "mnist_softmax": {},
    "mnist_mlp": {"hidden_units": 16},
    "ptb_small": {"vocab_size": 40, "hidden_size": 12, "num_steps": 5, "batch_size": 4},
    "dcgan": {"gf_dim": 4, "df_dim": 4, "gfc_dim": 16, "dfc_dim": 16},
    "dcgan_64": {"gf_dim": 4, "df_dim": 4, "image_shape": [32, 32, 3]},
    "linear_regression": {},
}


@pytest.fixture(autouse=True)
def _seed() -> None:
    keras.utils.set_random_seed(1234)


def _trainable(model: keras.Model) -> int:
    return count_params(model.trainable_weights)


def _perturb(model: keras.Model) -> None:
    """Moves every weight (moving statistics too) away from its initial value."""
    rng = np.random.default_rng(7)
    model.set_weights(
        [w + rng.uniform(0.05, 0.1, size=w.shape).astype(w.dtype) for w in model.get_weights()]
    )


def _steps(task: models.ModelTask, model: keras.Model, batch: dict, n: int) -> list:
    optimizer = task.make_optimizer(steps_per_epoch=100, model=model)
    size = int(next(iter(batch.values())).shape[0])
    step = tf.function(lambda b: task.train_step(model, optimizer, b, size))
    return [{k: float(v) for k, v in step(batch).items()} for _ in range(n)]


# --------------------------------------------------------------------------- registry


def test_list_models_has_every_family_and_preset() -> None:
    names = models.list_models()
    assert names == sorted(names)
    for name in [
        "resnet", "resnet20", "resnet32", "resnet56", "resnet110", "resnet164",
        "alexnet_v2", "mnist_softmax", "mnist_mlp", "ptb_lstm", "ptb_small",
        "ptb_medium", "ptb_large", "dcgan", "linear_regression",
    ]:  # fmt: skip
        assert name in names


def test_unknown_names_and_keys_are_errors() -> None:
    with pytest.raises(ValueError, match="unknown model"):
        models.get_task("resnet33")
    with pytest.raises(ValueError, match="unknown config key"):
        models.get_task("resnet32", num_filters=3)
    with pytest.raises(ValueError, match="filters"):
        models.get_task("resnet", filters=[16, 32])


# The features each kind of model reads from a dataset, and the outputs it serves.
FEATURES = {
    "classifier": ("image", "label"),
    "language_model": ("tokens",),
    "regression": ("x", "y"),
}
GAN_FEATURES = {"dcgan": ("image", "label"), "dcgan_64": ("image",)}  # dcgan_64: unconditioned
SERVING_OUTPUTS = {
    "classifier": {"classes", "scores"},
    "language_model": {"log_probs"},
    "gan": {"images"},
    "regression": {"y"},
}


@pytest.mark.parametrize("name", models.list_models())
def test_task_config_is_json_and_rebuilds_the_same_task(name: str) -> None:
    task = models.get_task(name)
    assert task.kind in models.KINDS
    assert task.features == (GAN_FEATURES[name] if task.kind == "gan" else FEATURES[task.kind])
    assert set(task.features) <= set(task.example_batch(2))
    again = models.get_task(task.name, **json.loads(json.dumps(task.config)))
    assert again == task
    outputs = task.signature_info()["serving_default"]["outputs"]
    assert set(outputs) == SERVING_OUTPUTS[task.kind]


def test_presets_carry_the_book_hyperparameters() -> None:
    small, medium, large = (
        models.get_task(f"ptb_{size}").config for size in ("small", "medium", "large")
    )
    assert (small["hidden_size"], small["num_steps"], small["keep_prob"]) == (200, 20, 1.0)
    assert (medium["hidden_size"], medium["num_steps"], medium["keep_prob"]) == (650, 35, 0.5)
    assert (large["hidden_size"], large["max_grad_norm"], large["init_scale"]) == (1500, 10.0, 0.04)
    assert models.get_task("ptb_lstm").config == small
    assert models.get_task("resnet164").config["use_bottleneck"] is True
    assert models.get_task("resnet").config["filters"] == [16, 16, 32, 64]
    assert models.get_task("mnist_mlp").config["hidden_units"] == 100
    assert models.get_task("dcgan").config["z_dim"] == 100


# --------------------------------------------------------------------------- sizes

# Published sizes (trainable parameters): He et al. 2016 (ResNet-32 0.46 M, ResNet-110
# 1.7 M), He et al. 2016b (pre-activation bottleneck ResNet-164 1.7 M), Zaremba et al.
# small PTB model with a 10 000-word vocabulary: 10000*200 embedding + 2 LSTM layers of
# 4*(200+200+1)*200 + 200*10000+10000 softmax = 4 651 600.
PUBLISHED = {"resnet32": 0.46e6, "resnet110": 1.7e6, "resnet164": 1.7e6}
EXACT = {"ptb_small": 2_000_000 + 2 * 320_800 + 2_010_000}


@pytest.mark.parametrize("name", models.list_models())
def test_output_shape_and_size_of_every_preset(name: str) -> None:
    """Builds every preset once: output shapes, and sizes against the published ones."""
    overrides = {"batch_size": 2} if models.get_task(name).kind == "language_model" else {}
    task = models.get_task(name, **overrides)
    model = task.build_model()
    if name in PUBLISHED:
        assert _trainable(model) == pytest.approx(PUBLISHED[name], rel=0.03)
    if name in EXACT:
        assert _trainable(model) == EXACT[name]
    batch = task.example_batch(2)
    if task.kind == "classifier":
        assert model.input_shape == (None, *task.image_shape)
        assert tuple(model(batch["image"]).shape) == (2, task.num_classes)
    elif task.kind == "language_model":
        logits = model(batch["tokens"][:, :3])
        assert tuple(logits.shape) == (2, 3, task.vocab_size)
        assert model.state_batch_size == 2
    elif task.kind == "gan":
        images = model.generate(task.sample_z(2), batch["label"])
        assert tuple(images.shape) == (2, *task.image_shape)
        logits = model.discriminate(model.scale_real(batch["image"]), batch["label"])
        assert tuple(logits.shape) == (2, 1)
    else:
        assert tuple(model(batch["x"]).shape) == (2,)


# --------------------------------------------------------------------------- training


@pytest.mark.parametrize(
    "name, overrides",
    [
        ("resnet20", {"bn_momentum": 0.0}),  # eval-mode BN = the batch's statistics
        ("resnet164", {**TINY["resnet164"], "bn_momentum": 0.0}),
        ("alexnet_v2", TINY["alexnet_v2"]),
        ("mnist_softmax", {"learning_rate": 0.05}),  # 0.5 overshoots on dense noise images
        ("mnist_mlp", {}),
        ("ptb_small", TINY["ptb_small"]),
        ("linear_regression", {}),
    ],
)
def test_a_few_steps_reduce_the_loss(name: str, overrides: dict) -> None:
    task = models.get_task(name, **overrides)
    model = task.build_model()
    batch = task.example_batch(4)
    size = int(next(iter(batch.values())).shape[0])
    before = float(task.eval_step(model, batch, size)["loss"])
    if task.kind == "language_model":
        model.reset_states()
    metrics = _steps(task, model, batch, 3)
    if task.kind == "language_model":
        model.reset_states()
    final = task.eval_step(model, batch, size)
    after = float(final["loss"])
    assert np.isfinite([m["loss"] for m in metrics]).all()
    assert after < before
    assert metrics[0]["learning_rate"] == pytest.approx(task.config["learning_rate"])
    if task.kind == "classifier":
        # The share of the batch the trained model's own predictions get right.
        predicted = np.argmax(model(batch["image"], training=False).numpy(), axis=-1)
        expected = np.mean(predicted == batch["label"].numpy())
        assert float(final["accuracy"]) == pytest.approx(expected)
    if task.kind == "language_model":
        assert metrics[-1]["perplexity"] == pytest.approx(np.exp(metrics[-1]["loss"]), rel=1e-5)


def _labels_matching(predicted: np.ndarray, matches: int, num_classes: int) -> tf.Tensor:
    """Labels equal to ``predicted`` on the first ``matches`` rows and wrong on the others."""
    labels = (predicted + 1) % num_classes
    labels[:matches] = predicted[:matches]
    return tf.constant(labels, tf.int64)


@pytest.mark.parametrize("name", ["mnist_mlp", "resnet20"])  # no dropout: steps deterministic
def test_classifier_steps_report_the_batch_accuracy(name: str) -> None:
    """Labels built so that exactly 3 of 8 match the model's own predictions: 3/8 reported."""
    task = models.get_task(name, **TINY[name])
    model = task.build_model()
    images = task.example_batch(8)["image"]
    predicted = np.argmax(model(images, training=False).numpy(), axis=-1)
    batch = {"image": images, "label": _labels_matching(predicted, 3, task.num_classes)}
    assert float(task.eval_step(model, batch, 8)["accuracy"]) == 3 / 8
    # The train step scores its training-mode forward pass, before it updates the weights.
    predicted = np.argmax(model(images, training=True).numpy(), axis=-1)
    batch = {"image": images, "label": _labels_matching(predicted, 5, task.num_classes)}
    optimizer = task.make_optimizer(steps_per_epoch=100, model=model)
    assert float(task.train_step(model, optimizer, batch, 8)["accuracy"]) == 5 / 8


def test_dcgan_steps_reduce_each_networks_loss() -> None:
    tiny = TINY["dcgan"]
    # Discriminator updates only: its loss falls.
    task = models.get_task("dcgan", **tiny, generator_steps=0, learning_rate=1e-3)
    model = task.build_model()
    batch = task.example_batch(4)
    d_only = _steps(task, model, batch, 4)
    assert d_only[-1]["d_loss"] < d_only[0]["d_loss"]
    # Generator updates only: its loss falls.
    task = models.get_task("dcgan", **tiny, discriminator_steps=0, learning_rate=1e-3)
    model = task.build_model()
    g_only = _steps(task, model, batch, 4)
    assert g_only[-1]["g_loss"] < g_only[0]["g_loss"]


def test_dcgan_book_step_moves_both_networks() -> None:
    task = models.get_task("dcgan_64", **TINY["dcgan_64"])  # unconditional
    model = task.build_model()
    g0 = [w.numpy() for w in model.generator.trainable_weights]
    d0 = [w.numpy() for w in model.discriminator.trainable_weights]
    metrics = _steps(task, model, task.example_batch(4), 1)[0]
    assert {"loss", "d_loss", "g_loss", "learning_rate"} <= set(metrics)
    assert np.isfinite(list(metrics.values())).all()
    for before, weights in ((g0, model.generator), (d0, model.discriminator)):
        assert any(not np.allclose(a, b.numpy()) for a, b in zip(before, weights.trainable_weights))


def test_linear_regression_reaches_the_least_squares_fit() -> None:
    task = models.get_task("linear_regression")
    model = task.build_model()
    optimizer = task.make_optimizer(steps_per_epoch=1, model=model)
    batch = next(iter(models.book_dataset()))
    assert int(batch["x"].shape[0]) == 17

    @tf.function
    def train(n: tf.Tensor) -> dict:
        metrics = {"loss": tf.constant(0.0), "learning_rate": tf.constant(0.0)}
        for _ in tf.range(n):
            metrics = task.train_step(model, optimizer, batch, 17)
        return metrics

    train(tf.constant(15000))  # the book's SGD at lr 0.01, run to convergence
    w, b = task.weights_and_bias(model)
    w_star, b_star = models.least_squares_fit()
    assert w == pytest.approx(w_star, abs=2e-3)
    assert b == pytest.approx(b_star, abs=1e-2)
    residual = models.BOOK_Y - (w_star * models.BOOK_X + b_star)
    assert float(task.eval_step(model, batch, 17)["loss"]) == pytest.approx(
        0.5 * np.mean(residual**2), rel=1e-3
    )


def test_ptb_state_is_carried_across_batches() -> None:
    task = models.get_task("ptb_small", **TINY["ptb_small"])
    model = task.build_model()
    first, second = task.example_batch(4, seed=1), task.example_batch(4, seed=2)
    x1 = first["tokens"][:, :-1]
    _, expected = model(x1, initial_state=None, return_state=True)
    task.eval_step(model, first, 4)
    for got, want in zip(model.read_state(), expected):
        np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)
    carried = float(task.eval_step(model, second, 4)["loss"])
    model.reset_states()
    assert all(not np.any(v.numpy()) for layer in model.read_state() for v in layer)
    fresh = float(task.eval_step(model, second, 4)["loss"])
    assert carried != pytest.approx(fresh, abs=1e-7)
    # A per-row "reset" feature restarts those streams from zero.
    task.eval_step(model, first, 4)
    reset_all = {**second, "reset": tf.ones([4], tf.int64)}
    assert float(task.eval_step(model, reset_all, 4)["loss"]) == pytest.approx(fresh, rel=1e-6)
    with pytest.raises(ValueError, match="rows per replica"):
        task.eval_step(model, task.example_batch(3), 3)


def _rates(optimizer: keras.optimizers.Optimizer, steps: list[int]) -> list[float]:
    """The optimizer's learning rate at each iteration count (schedule keyed on it)."""
    rates = []
    for step in steps:
        optimizer.iterations.assign(step)
        rates.append(float(optimizer.learning_rate))
    return rates


def test_learning_rate_schedules_follow_the_book() -> None:
    resnet = models.get_task("resnet32").make_optimizer(steps_per_epoch=10)
    assert _rates(resnet, [0, 799, 800, 1199, 1200]) == pytest.approx([0.1, 0.1, 0.01, 0.01, 0.001])
    assert float(resnet.momentum) == pytest.approx(0.9)
    ptb = models.get_task("ptb_small").make_optimizer(steps_per_epoch=5)
    # epochs 1-4 at 1.0, then x0.5 per epoch
    assert _rates(ptb, [e * 5 for e in range(7)]) == pytest.approx(
        [1.0, 1.0, 1.0, 1.0, 0.5, 0.25, 0.125]
    )
    alex = models.get_task("alexnet_v2").make_optimizer(steps_per_epoch=10)
    assert _rates(alex, [19, 20, 45]) == pytest.approx([0.01, 0.01 * 0.94, 0.01 * 0.94**2])
    gan = models.get_task("dcgan").make_optimizer(steps_per_epoch=10)
    assert set(gan) == {"generator", "discriminator"}
    assert float(gan["generator"].beta_1) == pytest.approx(0.5)
    assert _rates(gan["discriminator"], [0, 10_000]) == pytest.approx([2e-4, 2e-4])


# --------------------------------------------------------------------------- persistence


@pytest.mark.parametrize(
    "name", ["resnet20", "alexnet_v2", "mnist_softmax", "ptb_small", "dcgan", "linear_regression"]
)
def test_weights_save_and_restore(name: str, tmp_path: Path) -> None:
    task = models.get_task(name, **TINY[name])
    model = task.build_model()
    batch = task.example_batch(4)
    _perturb(model)
    path = str(tmp_path / "model.weights.h5")
    model.save_weights(path)

    def outputs(m: keras.Model) -> np.ndarray:
        if task.kind == "classifier":
            return m(batch["image"]).numpy()
        if task.kind == "language_model":
            return m(batch["tokens"]).numpy()
        if task.kind == "gan":
            z = tf.constant(np.linspace(-1, 1, 4 * task.z_dim, dtype=np.float32).reshape(4, -1))
            return m.generate(z, batch["label"]).numpy()
        return m(batch["x"]).numpy()

    # Rebuilt from the model's own config (registry path) and from the task's config.
    rebuilt = type(model).from_config(model.get_config())
    assert rebuilt.task_config == task.config
    rebuilt.load_weights(path)
    np.testing.assert_allclose(outputs(rebuilt), outputs(model), rtol=1e-5, atol=1e-6)
    fresh = models.get_model(task.name, **task.config)
    fresh.load_weights(path)
    np.testing.assert_allclose(outputs(fresh), outputs(model), rtol=1e-5, atol=1e-6)


def test_checkpoint_resumes_model_optimizer_and_schedule(tmp_path: Path) -> None:
    task = models.get_task("resnet20", **TINY["resnet20"], lr_boundaries_epochs=[0.02, 0.04])
    model = task.build_model()
    optimizer = task.make_optimizer(steps_per_epoch=100, model=model)
    batch = task.example_batch(4)
    step = tf.function(lambda b: task.train_step(model, optimizer, b, 4))
    for _ in range(3):
        step(batch)
    prefix = tf.train.Checkpoint(model=model, optimizer=optimizer).save(str(tmp_path / "ckpt"))

    model2 = task.build_model()
    optimizer2 = task.make_optimizer(steps_per_epoch=100, model=model2)
    tf.train.Checkpoint(model=model2, optimizer=optimizer2).restore(prefix).assert_consumed()
    assert int(optimizer2.iterations) == 3
    assert float(optimizer2.learning_rate) == pytest.approx(0.01)  # past the first boundary
    np.testing.assert_allclose(
        model2(batch["image"]).numpy(), model(batch["image"]).numpy(), rtol=1e-5, atol=1e-6
    )


def _example(image: np.ndarray) -> bytes:
    feature = {
        "image": tf.train.Feature(bytes_list=tf.train.BytesList(value=[image.tobytes()])),
        "label": tf.train.Feature(int64_list=tf.train.Int64List(value=[3])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


@pytest.mark.parametrize("name", ["mnist_mlp", "resnet20"])
def test_classifier_export_signatures(name: str, tmp_path: Path) -> None:
    task = models.get_task(name, **TINY[name])
    model = task.build_model()
    batch = task.example_batch(3)
    _perturb(model)
    export_dir = task.export(model, str(tmp_path / "export"))
    loaded = tf.saved_model.load(export_dir)
    assert set(loaded.signatures) >= {"serving_default", "predict_images"}
    expected = tf.nn.softmax(model(batch["image"], training=False)).numpy()
    images = batch["image"].numpy()
    serialized = tf.constant([_example(img) for img in images])
    classify = loaded.signatures["serving_default"](inputs=serialized)
    predict = loaded.signatures["predict_images"](images=batch["image"])
    for out in (classify, predict):
        assert out["classes"].dtype == tf.int64 and out["scores"].dtype == tf.float32
        np.testing.assert_allclose(out["scores"].numpy(), expected, rtol=1e-4, atol=1e-6)
        np.testing.assert_array_equal(out["classes"].numpy(), expected.argmax(-1))


def test_ptb_export_gives_next_word_log_probs(tmp_path: Path) -> None:
    task = models.get_task("ptb_small", **TINY["ptb_small"])
    model = task.build_model()
    tokens = task.example_batch(2)["tokens"]
    export_dir = task.export(model, str(tmp_path / "export"))
    out = tf.saved_model.load(export_dir).signatures["serving_default"](tokens=tokens)
    expected = tf.nn.log_softmax(model(tokens)).numpy()
    assert out["log_probs"].shape == (2, task.seq_len, task.vocab_size)
    np.testing.assert_allclose(out["log_probs"].numpy(), expected, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["dcgan", "dcgan_64"])
def test_dcgan_export_generates_uint8_images(name: str, tmp_path: Path) -> None:
    task = models.get_task(name, **TINY[name])
    model = task.build_model()
    z = task.sample_z(3)
    labels = tf.constant([0, 1, 9], tf.int64)
    export_dir = task.export(model, str(tmp_path / "export"))
    serve = tf.saved_model.load(export_dir).signatures["serving_default"]
    out = serve(z=z, label=labels) if task.conditional else serve(z=z)
    expected = model.to_uint8(model.generate(z, labels)).numpy()
    assert out["images"].dtype == tf.uint8
    assert out["images"].shape == (3, *task.image_shape)
    assert np.abs(out["images"].numpy().astype(int) - expected.astype(int)).max() <= 1


def test_linear_regression_export(tmp_path: Path) -> None:
    task = models.get_task("linear_regression")
    model = task.build_model()
    export_dir = task.export(model, str(tmp_path / "export"))
    x = tf.constant(models.BOOK_X)
    out = tf.saved_model.load(export_dir).signatures["serving_default"](x=x)
    np.testing.assert_allclose(out["y"].numpy(), model(x).numpy(), rtol=1e-6)


# --------------------------------------------------------------------------- book 9.2 options
# The train_image_classifier options: optimizers, decay types, label smoothing, weight
# decay, moving averages, mixed precision.  Expected values are computed here by hand.


def _rate_at(task: models.ModelTask, steps: list[int], steps_per_epoch: int = 10) -> list[float]:
    return _rates(task.make_optimizer(steps_per_epoch=steps_per_epoch), steps)


@pytest.mark.parametrize("name", sorted(models.OPTIMIZERS))
def test_every_book_optimizer_builds_and_changes_the_weights(name: str) -> None:
    task = models.get_task("mnist_mlp", hidden_units=8, optimizer={"name": name})
    model = task.build_model()
    optimizer = task.make_optimizer(steps_per_epoch=10, model=model)
    assert isinstance(optimizer, models.OPTIMIZERS[name])
    if name == "momentum":  # SGD with the book's default momentum
        assert float(optimizer.momentum) == pytest.approx(0.9)
    before = [w.numpy() for w in model.trainable_weights]
    metrics = _steps(task, model, task.example_batch(4), 1)[0]
    assert np.isfinite(metrics["loss"])
    for old, new in zip(before, model.trainable_weights):
        assert not np.array_equal(old, new.numpy()), f"{name} left {new.path} unchanged"


def test_an_optimizer_decaying_in_its_update_steps_as_the_decay_in_the_loss(tmp_path) -> None:
    """What ps runs (optim.decay_on_servers, checked under the strategy in
    test_train_step_runs_under_distribution_strategies): the weight decay's gradient added in
    the optimizer's update rather than through the loss. Two momentum steps from the same
    weights land on the same weights, and the optimizer checkpoints the same variables."""
    from sparktf.models import optim

    task = models.get_task("mnist_mlp", hidden_units=8, weight_decay=0.05, learning_rate=0.1,
                           optimizer={"name": "momentum"})  # fmt: skip
    batch = task.example_batch(4)
    in_loss, in_update = task.build_model(), task.build_model()
    in_update.set_weights(in_loss.get_weights())
    start = in_loss.get_weights()
    plain = task.make_optimizer(steps_per_epoch=10, model=in_loss)
    pairs = [(w, w.regularizer) for w in in_update.trainable_weights if w.regularizer]
    assert len(pairs) == 2  # the two kernels
    decaying = optim.build_optimizer(
        task.config["optimizer"], 0.1, in_update.trainable_variables, decay=pairs
    )
    assert optim.decay_on_servers(in_update, decaying) == pairs
    assert optim.decay_on_servers(in_loss, plain) is None  # outside ps: in the loss

    def step(model, optimizer, decay_in_loss):
        with tf.GradientTape() as tape:
            _, per_example, _ = task.forward(model, batch, training=True)
            loss = tf.reduce_mean(per_example)
            if decay_in_loss:
                loss += optim.regularization_loss(model)
        optim.apply_gradients(optimizer, loss, tape, model.trainable_variables)

    for _ in range(2):
        step(in_loss, plain, True)
        step(in_update, decaying, False)
    for a, b in zip(in_loss.get_weights(), in_update.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7)
    assert not np.allclose(in_update.get_weights()[0], start[0])  # the steps moved it
    names = [
        sorted(name for name, _ in tf.train.list_variables(tf.train.Checkpoint(o=o).save(d)))
        for o, d in ((plain, str(tmp_path / "plain")), (decaying, str(tmp_path / "decaying")))
    ]
    assert names[0] == names[1]


def test_optimizer_and_schedule_configs_are_checked() -> None:
    cases = [
        ({"optimizer": {"name": "lamb"}}, "unknown optimizer 'lamb'"),
        ({"optimizer": {"name": "adam", "momentum": 0.9}}, r"takes no \['momentum'\]"),
        ({"optimizer": {"name": "sgd", "learning_rate": 1.0}}, "learning_rate"),
        ({"optimizer": {"name": "sgd", "use_ema": True}}, "moving_average_decay"),
        ({"lr_schedule": "cosine"}, "unknown lr_schedule 'cosine'"),
        ({"lr_schedule": "piecewise"}, "needs lr_boundaries_epochs"),
        ({"lr_schedule": "piecewise", "lr_boundaries_epochs": [2, 1]}, "increasing"),
        ({"lr_schedule": "exponential", "lr_decay_epochs": 0}, "lr_decay_epochs must be"),
        ({"lr_schedule": "polynomial", "max_steps": None}, "none of them is set"),
        ({"learning_rate": -1.0}, "learning_rate must be"),
        ({"moving_average_decay": 1.5}, "moving_average_decay must be"),
        ({"precision": "fp8"}, "precision must be one of"),
        ({"label_smoothing": 1.0}, "label_smoothing must be"),
        ({"weight_decay": -0.1}, "weight_decay must be"),
    ]
    for overrides, message in cases:
        with pytest.raises(ValueError, match=message):
            models.get_task("mnist_mlp", **overrides)
    with pytest.raises(ValueError, match="unknown precision"):
        with models.precision_policy("fp64"):
            pass


def test_each_decay_type_gives_the_expected_rate() -> None:
    """Rates at known steps (10 steps per epoch), from the schedules' formulas."""
    steps = [0, 9, 10, 14, 15, 24, 25, 29, 30, 40, 55, 100]
    base = {"learning_rate": 0.1}

    def expected(rate: object) -> list[float]:
        return [rate(s) for s in steps]  # type: ignore[operator]

    fixed = models.get_task("mnist_mlp", **base, lr_schedule="fixed")
    assert _rate_at(fixed, steps) == pytest.approx(expected(lambda s: 0.1))
    exponential = models.get_task(
        "mnist_mlp", **base, lr_schedule="exponential", lr_decay_epochs=1.5, lr_decay_factor=0.5
    )
    assert _rate_at(exponential, steps) == pytest.approx(expected(lambda s: 0.1 * 0.5 ** (s // 15)))
    polynomial = models.get_task(
        "mnist_mlp",
        **base,
        lr_schedule="polynomial",
        end_learning_rate=0.01,
        lr_decay_total_epochs=4,
    )
    assert _rate_at(polynomial, steps) == pytest.approx(
        expected(lambda s: (0.1 - 0.01) * (1 - min(s, 40) / 40) + 0.01)
    )
    piecewise = models.get_task(
        "mnist_mlp",
        **base,
        lr_schedule="piecewise",
        lr_boundaries_epochs=[1, 2.5],
        lr_decay_factor=0.1,
    )
    assert _rate_at(piecewise, steps) == pytest.approx(
        expected(lambda s: 0.1 if s < 10 else 0.01 if s < 25 else 0.001)
    )
    # Polynomial without its own length: the config's epochs, else its max_steps.
    by_epochs = models.get_task(
        "mnist_mlp", **base, lr_schedule="polynomial", end_learning_rate=0.0, epochs=2
    )
    assert _rate_at(by_epochs, [10, 20, 30]) == pytest.approx([0.05, 0.0, 0.0])
    by_steps = models.get_task(
        "mnist_mlp", **base, lr_schedule="polynomial", end_learning_rate=0.0, max_steps=200
    )
    assert _rate_at(by_steps, [50, 200]) == pytest.approx([0.075, 0.0])


def _job_args(*argv: str) -> object:
    from sparktf.jobs import train as job

    return job.parser("test", "train", None).parse_args(list(argv))


def test_book_flags_become_model_config_overrides() -> None:
    from sparktf import cli
    from sparktf.jobs.train import optimizer_overrides

    assert optimizer_overrides(_job_args("--model", "resnet20")) == {}
    # An optimizer option completes the model's own optimizer (ResNet: momentum SGD).
    assert optimizer_overrides(_job_args("--model", "resnet20", "--momentum", "0.8")) == {
        "optimizer": {"name": "sgd", "momentum": 0.8}
    }
    # Another optimizer starts from its own defaults plus the options given.
    args = _job_args(
        "--model", "resnet20", "--optimizer", "rmsprop", "--rmsprop-decay", "0.95",
        "--rmsprop-momentum", "0.5", "--opt-epsilon", "1.0", "--learning-rate", "0.01",
    )  # fmt: skip
    overrides = optimizer_overrides(args)
    assert overrides == {
        "optimizer": {"name": "rmsprop", "rho": 0.95, "momentum": 0.5, "epsilon": 1.0},
        "learning_rate": 0.01,
    }
    rmsprop = models.get_task("resnet20", **overrides).make_optimizer(steps_per_epoch=10)
    assert isinstance(rmsprop, keras.optimizers.RMSprop)
    assert (rmsprop.rho, rmsprop.momentum, rmsprop.epsilon) == (0.95, 0.5, 1.0)
    args = _job_args(
        "--model", "mnist_mlp", "--optimizer", "ftrl", "--ftrl-learning-rate-power", "-0.6",
        "--ftrl-initial-accumulator-value", "0.2", "--ftrl-l1", "0.01", "--ftrl-l2", "0.02",
    )  # fmt: skip
    assert optimizer_overrides(args)["optimizer"] == {
        "name": "ftrl",
        "learning_rate_power": -0.6,
        "initial_accumulator_value": 0.2,
        "l1_regularization_strength": 0.01,
        "l2_regularization_strength": 0.02,
    }
    args = _job_args("--model", "mnist_mlp", "--optimizer", "momentum", "--nesterov")
    momentum = models.get_task("mnist_mlp", **optimizer_overrides(args)).make_optimizer(10)
    assert (float(momentum.momentum), momentum.nesterov) == (pytest.approx(0.9), True)
    # Decay types: exponential, polynomial over the run's --epochs, fixed, piecewise.
    args = _job_args(
        "--model", "mnist_mlp", "--learning-rate", "0.1", "--learning-rate-decay-type",
        "exponential", "--num-epochs-per-decay", "2", "--learning-rate-decay-factor", "0.5",
    )  # fmt: skip
    task = models.get_task("mnist_mlp", **optimizer_overrides(args))
    assert _rate_at(task, [19, 20, 40]) == pytest.approx([0.1, 0.05, 0.025])
    args = _job_args(
        "--model", "mnist_mlp", "--learning-rate", "0.1", "--learning-rate-decay-type",
        "polynomial", "--end-learning-rate", "0.02", "--epochs", "4",
    )  # fmt: skip
    task = models.get_task("mnist_mlp", **optimizer_overrides(args))
    assert task.config["lr_decay_total_epochs"] == 4
    assert _rate_at(task, [0, 20, 40, 80]) == pytest.approx([0.1, 0.06, 0.02, 0.02])
    args = _job_args("--model", "resnet20", "--learning-rate-decay-type", "fixed")
    fixed = models.get_task("resnet20", **optimizer_overrides(args))
    assert _rate_at(fixed, [0, 5000]) == pytest.approx([0.1, 0.1])
    args = _job_args(
        "--model", "mnist_mlp", "--learning-rate-decay-type", "piecewise",
        "--lr-boundaries-epochs", "1,3", "--learning-rate-decay-factor", "0.5",
    )  # fmt: skip
    task = models.get_task("mnist_mlp", **optimizer_overrides(args))
    assert _rate_at(task, [9, 10, 29, 30]) == pytest.approx([0.01, 0.005, 0.005, 0.0025])
    # Regularisation, averages, precision.
    args = _job_args(
        "--model", "mnist_mlp", "--label-smoothing", "0.1", "--weight-decay", "4e-5",
        "--moving-average-decay", "0.999", "--precision", "bf16",
    )  # fmt: skip
    assert optimizer_overrides(args) == {
        "label_smoothing": 0.1,
        "weight_decay": 4e-5,
        "moving_average_decay": 0.999,
        "precision": "bf16",
    }
    # An option the chosen optimizer does not have, or a model without the key: usage errors.
    with pytest.raises(cli.UsageError, match="--momentum applies to --optimizer momentum/sgd"):
        optimizer_overrides(_job_args("--model", "mnist_mlp", "--momentum", "0.9"))
    with pytest.raises(cli.UsageError, match="label_smoothing"):
        optimizer_overrides(_job_args("--model", "ptb_small", "--label-smoothing", "0.1"))
    with pytest.raises(cli.UsageError, match="num-epochs-per-decay applies"):
        optimizer_overrides(_job_args("--model", "resnet20", "--num-epochs-per-decay", "2"))


def test_label_smoothing_gives_the_hand_computed_loss() -> None:
    task = models.get_task("mnist_softmax", label_smoothing=0.2, learning_rate=0.01)
    model = task.build_model()
    _perturb(model)
    batch = task.example_batch(3, seed=5)
    logits = model(batch["image"]).numpy().astype(np.float64)
    labels = batch["label"].numpy()
    log_probs = logits - logits.max(-1, keepdims=True)
    log_probs -= np.log(np.exp(log_probs).sum(-1, keepdims=True))
    targets = np.full((3, 10), 0.2 / 10)
    targets[np.arange(3), labels] += 0.8
    smoothed = float(np.mean(-(targets * log_probs).sum(-1)))
    plain = float(np.mean(-log_probs[np.arange(3), labels]))
    accuracy = float(np.mean(logits.argmax(-1) == labels))
    evaluated = task.eval_step(model, batch, 3)  # evaluation: the true labels
    assert float(evaluated["loss"]) == pytest.approx(plain, rel=1e-5)
    optimizer = task.make_optimizer(steps_per_epoch=10, model=model)
    trained = task.train_step(model, optimizer, batch, 3)
    assert float(trained["loss"]) == pytest.approx(smoothed, rel=1e-5)
    assert smoothed != pytest.approx(plain, rel=1e-3)
    assert float(trained["accuracy"]) == accuracy == float(evaluated["accuracy"])


@pytest.mark.parametrize("name", ["resnet20", "alexnet_v2", "mnist_softmax", "mnist_mlp"])
def test_weight_decay_adds_the_l2_term_of_every_kernel(name: str) -> None:
    task = models.get_task(name, **{**TINY.get(name, {}), "weight_decay": 0.01})
    model = task.build_model()
    _perturb(model)
    kernels = [w.numpy() for w in model.trainable_weights if w.path.endswith("kernel")]
    assert kernels
    expected = 0.01 / 2 * sum(float(np.sum(k.astype(np.float64) ** 2)) for k in kernels)
    optimizer = task.make_optimizer(steps_per_epoch=10, model=model)
    metrics = task.train_step(model, optimizer, task.example_batch(2), 2)
    assert float(metrics["regularization_loss"]) == pytest.approx(expected, rel=1e-4)
    assert not models.get_model(name, **{**TINY.get(name, {}), "weight_decay": 0.0}).losses


def test_weight_decay_is_in_the_optimised_loss() -> None:
    """One SGD step with decay moves each kernel by an extra -lr * wd * w."""
    batch = models.get_task("mnist_softmax").example_batch(4)
    moved = []
    for wd in (0.0, 0.1):
        keras.utils.set_random_seed(3)
        task = models.get_task("mnist_softmax", weight_decay=wd, learning_rate=0.05)
        model = task.build_model()
        _perturb(model)
        start = model.get_layer("logits").kernel.numpy()
        _steps(task, model, batch, 1)
        moved.append(model.get_layer("logits").kernel.numpy() - start)
    np.testing.assert_allclose(moved[1] - moved[0], -0.05 * 0.1 * start, rtol=1e-3, atol=1e-7)


def _hand_average(history: list[list[np.ndarray]], decay: float) -> list[np.ndarray]:
    """Keras's EMA: the first update copies the weights, then d * avg + (1 - d) * w."""
    average = [w.astype(np.float64) for w in history[0]]
    for weights in history[1:]:
        average = [decay * a + (1 - decay) * w for a, w in zip(average, weights)]
    return average


def test_moving_average_weights_are_hand_computed_checkpointed_and_exported(
    tmp_path: Path,
) -> None:
    task = models.get_task("resnet20", **TINY["resnet20"], moving_average_decay=0.7)
    model = task.build_model()
    optimizer = task.make_optimizer(steps_per_epoch=10, model=model)
    trainable = {id(w) for w in model.trainable_weights}
    step = tf.function(lambda b: task.train_step(model, optimizer, b, 4))
    history = []
    for seed in range(4):
        step(task.example_batch(4, seed=seed))
        history.append([w.numpy() for w in model.trainable_weights])
    averaged = dict(zip(map(id, model.trainable_weights), _hand_average(history, 0.7)))
    exported = models.weights_for_export(task, model, optimizer)
    assert len(exported) == len(model.weights)
    for variable, value in zip(model.weights, exported):
        if id(variable) in trainable:
            np.testing.assert_allclose(value, averaged[id(variable)], rtol=1e-5, atol=1e-6)
            assert not np.allclose(value, variable.numpy())
        else:  # batch-norm statistics: the model's own
            np.testing.assert_array_equal(value, variable.numpy())
    # The averages are optimizer variables: a checkpoint restores them.
    prefix = tf.train.Checkpoint(model=model, optimizer=optimizer).save(str(tmp_path / "ckpt"))
    model2 = task.build_model()
    optimizer2 = task.make_optimizer(steps_per_epoch=10, model=model2)
    tf.train.Checkpoint(model=model2, optimizer=optimizer2).restore(prefix).assert_consumed()
    for a, b in zip(models.weights_for_export(task, model2, optimizer2), exported):
        np.testing.assert_array_equal(a, b)
    # Without averaging the export is the model's weights.
    plain = models.get_task("resnet20", **TINY["resnet20"])
    plain_model = plain.build_model()
    plain_optimizer = plain.make_optimizer(steps_per_epoch=10, model=plain_model)
    for a, b in zip(
        models.weights_for_export(plain, plain_model, plain_optimizer), plain_model.get_weights()
    ):
        np.testing.assert_array_equal(a, b)


def test_moving_averages_of_both_gan_networks() -> None:
    # One update of each network per step, so each step is one averaging step.
    task = models.get_task("dcgan", **TINY["dcgan"], generator_steps=1, moving_average_decay=0.5)
    model = task.build_model()
    optimizers = task.make_optimizer(steps_per_epoch=10, model=model)
    batch = task.example_batch(4)
    step = tf.function(lambda b: task.train_step(model, optimizers, b, 4))
    history = []
    for _ in range(2):
        step(batch)
        history.append([w.numpy() for w in model.trainable_weights])
    averaged = dict(zip(map(id, model.trainable_weights), _hand_average(history, 0.5)))
    exported = models.weights_for_export(task, model, optimizers)
    for part in (model.generator, model.discriminator):
        assert {id(w) for w in part.trainable_weights} <= set(averaged)
    for variable, value in zip(model.weights, exported):
        want = averaged.get(id(variable), variable.numpy())
        np.testing.assert_allclose(value, want, rtol=1e-5, atol=1e-6)


def test_bf16_trains_and_exports_a_float32_model(tmp_path: Path) -> None:
    task = models.get_task("resnet20", **TINY["resnet20"], precision="bf16")
    with models.precision_policy(task.config["precision"]) as policy:
        assert policy.name == "mixed_bfloat16"
        model = task.build_model()
    assert keras.config.dtype_policy().name == "float32"  # restored
    assert model.get_layer("init_conv").compute_dtype == "bfloat16"
    assert model.get_layer("logits").compute_dtype == "float32"
    assert {v.dtype for v in model.weights} == {"float32"}
    optimizer = task.make_optimizer(steps_per_epoch=10, model=model)
    assert not isinstance(optimizer, keras.optimizers.LossScaleOptimizer)  # bf16 needs none
    batch = task.example_batch(4)
    before = [w.numpy() for w in model.trainable_weights]
    metrics = _steps(task, model, batch, 2)
    assert np.isfinite([m["loss"] for m in metrics]).all()
    assert {v.dtype for v in model.weights} == {"float32"}
    assert any(not np.array_equal(a, b.numpy()) for a, b in zip(before, model.trainable_weights))
    # The export: a model built outside the policy with the trained weights.
    clean = task.build_model()
    assert clean.get_layer("init_conv").compute_dtype == "float32"
    clean.set_weights(models.weights_for_export(task, model, optimizer))
    loaded = tf.saved_model.load(task.export(clean, str(tmp_path / "export")))
    served = loaded.signatures["predict_images"](images=batch["image"])
    assert served["scores"].dtype == tf.float32
    expected = tf.nn.softmax(clean(batch["image"], training=False)).numpy()
    np.testing.assert_allclose(served["scores"].numpy(), expected, rtol=1e-4, atol=1e-6)
    # ... and it serves what the bf16 model computes, up to 16-bit rounding.
    mixed = tf.nn.softmax(tf.cast(model(batch["image"], training=False), tf.float32)).numpy()
    np.testing.assert_allclose(served["scores"].numpy(), mixed, atol=0.05)


def test_fp16_scales_the_loss_and_clips_the_unscaled_gradient() -> None:
    """One SGD step with a tiny clip norm: fp16 with loss scaling moves the weights as
    fp32 does (clipping a still-scaled gradient would move them 2**15 times less)."""
    overrides = {"hidden_units": 8, "optimizer": {"name": "sgd"}, "learning_rate": 0.5}
    batch = models.get_task("mnist_mlp").example_batch(8)
    moves = {}
    for precision in ("fp32", "fp16"):
        keras.utils.set_random_seed(11)
        task = models.get_task("mnist_mlp", **overrides, clip_norm=0.01, precision=precision)
        with models.precision_policy(precision):
            model = task.build_model()
        optimizer = task.make_optimizer(steps_per_epoch=10, model=model)
        assert isinstance(optimizer, keras.optimizers.LossScaleOptimizer) == (precision == "fp16")
        start = [w.numpy() for w in model.trainable_weights]
        metrics = _steps(task, model, batch, 1)[0]
        assert np.isfinite(metrics["loss"])
        moves[precision] = np.concatenate(
            [(w.numpy() - s).ravel() for w, s in zip(model.trainable_weights, start)]
        )
    assert np.linalg.norm(moves["fp32"]) == pytest.approx(0.5 * 0.01, rel=1e-4)  # clipped
    assert np.linalg.norm(moves["fp16"]) == pytest.approx(0.5 * 0.01, rel=1e-2)
    cosine = (
        moves["fp16"]
        @ moves["fp32"]
        / np.linalg.norm(moves["fp16"])
        / np.linalg.norm(moves["fp32"])
    )
    assert cosine == pytest.approx(1.0, abs=0.02)


# --------------------------------------------------------------------------- distribution
# Strategies need their own process: logical devices / servers are fixed at TF start-up.

_CASES = """
cases = [
    ("mnist_mlp", {"hidden_units": 8}),
    ("ptb_small", {"vocab_size": 30, "hidden_size": 8, "num_steps": 4, "batch_size": 4}),
    ("dcgan", {"gf_dim": 4, "df_dim": 4, "gfc_dim": 8, "dfc_dim": 8}),
]

def check_averages(task, model, optimizer, history, decay):
    # weights_for_export == Keras's EMA of the weights seen after each step, by hand.
    average = [w.astype(np.float64) for w in history[0]]
    for weights in history[1:]:
        average = [decay * a + (1 - decay) * w for a, w in zip(average, weights)]
    exported = models.weights_for_export(task, model, optimizer)
    assert len(exported) == len(average) == len(model.trainable_weights) == len(model.weights)
    for got, want in zip(exported, average):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # the averages are not the last weights (any weight: a layer whose ReLUs are all dead
    # for the random batches keeps its kernel, and its average equals it)
    current = model.get_weights()
    assert not all(np.allclose(e, w) for e, w in zip(exported, current))
"""

_MIRRORED_HEAD = (
    textwrap.dedent(
        """
    import os, sys, tempfile
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import numpy as np, tensorflow as tf
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    from sparktf import models

    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    """
    )
    + _CASES
)

_MIRRORED_SCRIPT = _MIRRORED_HEAD + textwrap.dedent(
    """
    for name, overrides in cases:
        task = models.get_task(name, **overrides)
        with strategy.scope():
            model = task.build_model()
            optimizer = task.make_optimizer(steps_per_epoch=10, model=model)
        batch = task.example_batch(4)
        dataset = tf.data.Dataset.from_tensors(batch).repeat(2)
        dist = strategy.experimental_distribute_dataset(dataset)

        @tf.function
        def step(b):
            per_replica = strategy.run(task.train_step, args=(model, optimizer, b, 4))
            return models.reduce_metrics(strategy, per_replica)

        for b in dist:
            metrics = step(b)
        assert all(np.isfinite(float(v)) for v in metrics.values()), metrics
        if name == "ptb_small":
            assert model.state_batch_size == 2
            a, c = (v.numpy() for v in model._state.variables[0][0].values)
            assert not np.allclose(a, c), "replicas must keep their own LSTM state"
        if name == "mnist_mlp":
            export_dir = task.export(model, tempfile.mkdtemp())
            serve = tf.saved_model.load(export_dir).signatures["predict_images"]
            served = serve(images=batch["image"])
            expected = tf.nn.softmax(model(batch["image"])).numpy()
            np.testing.assert_allclose(served["scores"].numpy(), expected, rtol=1e-4, atol=1e-6)
        print(name, {k: round(float(v), 4) for k, v in metrics.items()})
    print("STRATEGY-OK")
    """
)

# The second half of Mirrored, a process of its own (the unit tier's longest test, split).
_MIRRORED_AVERAGES_SCRIPT = _MIRRORED_HEAD + textwrap.dedent(
    """
    # Moving averages inside strategy.run (replicas in sync), then fp16 loss scaling.
    def build(**extra):
        task = models.get_task("mnist_mlp", hidden_units=8, optimizer={"name": "sgd"},
                               learning_rate=0.1, moving_average_decay=0.5, **extra)
        with strategy.scope():
            with models.precision_policy(task.config["precision"]):
                model = task.build_model()
            optimizer = task.make_optimizer(steps_per_epoch=10, model=model)

        @tf.function
        def step(b):
            per_replica = strategy.run(task.train_step, args=(model, optimizer, b, 4))
            return models.reduce_metrics(strategy, per_replica)

        def run_step(seed):
            batch = task.example_batch(4, seed=seed)
            for b in strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensors(batch)):
                return step(b)

        return task, model, optimizer, run_step

    task, model, optimizer, run_step = build()
    history = []
    for seed in range(3):
        assert np.isfinite(float(run_step(seed)["loss"]))
        history.append([w.numpy() for w in model.trainable_weights])
    check_averages(task, model, optimizer, history, 0.5)
    replicas = model.trainable_weights[0].value.values
    np.testing.assert_array_equal(replicas[0].numpy(), replicas[1].numpy())
    task, model, optimizer, run_step = build(precision="fp16")
    for seed in range(3):  # an overflowing first step is skipped: the loss stays finite
        assert np.isfinite(float(run_step(seed)["loss"]))
    # An overflowing loss scale: the step is skipped on every replica and the scale halves.
    optimizer.dynamic_scale.assign(2.0**40)
    before = model.get_weights()
    run_step(3)
    assert optimizer.dynamic_scale.numpy() == 2.0**39
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    print("averages + fp16 ok")
    print("STRATEGY-OK")
    """
)

_PS_SCRIPT = (
    textwrap.dedent(
        """
    import os
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "2"
    import numpy as np, tensorflow as tf
    from sparktf import models
    from sparktf.ports import server_port  # outside the ephemeral range: no one takes it

    spec = tf.train.ClusterSpec({
        "worker": [f"localhost:{server_port()}" for _ in range(2)],
        "ps": [f"localhost:{server_port()}"],
    })
    config = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4)  # in-process workers
    servers = [tf.distribute.Server(spec, job_name="worker", task_index=i, config=config)
               for i in range(2)]
    servers.append(tf.distribute.Server(spec, job_name="ps", task_index=0))
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc")
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    """
    )
    + _CASES
    + textwrap.dedent(
        """
    def on_ps(task):  # the model and optimizer on the ps, a batch, the workers' iterator
        with strategy.scope():
            model = task.build_model()
            optimizer = task.make_optimizer(steps_per_epoch=10, model=model)
        batch = {k: v.numpy() for k, v in task.example_batch(4).items()}
        iterator = iter(coordinator.create_per_worker_dataset(
            lambda _=None: tf.data.Dataset.from_tensors(batch).repeat()))
        return model, optimizer, batch, iterator

    for name, overrides in cases[:2]:  # the GAN's two optimizers are covered by Mirrored
        task = models.get_task(name, **overrides)
        model, optimizer, batch, iterator = on_ps(task)

        @tf.function
        def step(it):
            per_replica = strategy.run(task.train_step, args=(model, optimizer, next(it), 4))
            return models.reduce_metrics(strategy, per_replica)

        results = [coordinator.schedule(step, args=(iterator,)) for _ in range(3)]
        coordinator.join()
        metrics = results[-1].fetch()
        assert all(np.isfinite(float(v)) for v in metrics.values()), metrics
        if name == "ptb_small":
            assert model.state_batch_size == 4
            states = model._state.variables[0][0].read_all()
            assert any(np.any(s) for s in states), "workers must hold their own LSTM state"
        print(name, {k: round(float(v), 4) for k, v in metrics.items()})

    # Weight decay under ps is computed on the parameter server (optim.decay_on_servers): two
    # steps (momentum carries the first's decay into the second) give the weights and the
    # regularization loss of the same two steps without a strategy.
    decayed = dict(hidden_units=8, weight_decay=0.05, learning_rate=0.1,
                   optimizer={"name": "momentum"})
    task = models.get_task("mnist_mlp", **decayed)
    model, optimizer, batch, iterator = on_ps(task)
    local_task = models.get_task("mnist_mlp", **decayed)
    local = local_task.build_model()
    local.set_weights([w.numpy() for w in model.weights])
    local_optimizer = local_task.make_optimizer(steps_per_epoch=10, model=local)

    @tf.function
    def decay_step(it):
        return strategy.run(task.train_step, args=(model, optimizer, next(it), 4))

    from sparktf.models.optim import decay_on_servers

    @tf.function
    def decay_there(it):
        def replica(_):
            pairs = decay_on_servers(model, optimizer)
            return tf.constant(len(pairs or ()))
        return strategy.run(replica, args=(next(it),))

    there = coordinator.schedule(decay_there, args=(iterator,))
    coordinator.join()
    assert int(there.fetch()) == 2  # the step takes the path: two kernels, on the ps
    assert all("/job:ps/" in w.value.device for w in model.trainable_weights)

    local_step = tf.function(lambda: local_task.train_step(local, local_optimizer, batch, 4))
    for _ in range(2):
        remote = coordinator.schedule(decay_step, args=(iterator,))
        coordinator.join()
        reference = local_step()
        got = float(remote.fetch()["regularization_loss"])
        assert got > 0 and np.isclose(got, float(reference["regularization_loss"]), rtol=1e-5)
    assert len(model.losses) == 2  # the two kernels' decay, and nothing of the model's own
    for remote_w, local_w in zip(model.weights, local.weights):
        np.testing.assert_allclose(remote_w.numpy(), local_w.numpy(), rtol=1e-5, atol=1e-7)
    print("weight decay on the parameter server ok")

    # Moving averages (kept on the parameter server) with a bf16 model, one step at a time.
    task = models.get_task("mnist_mlp", hidden_units=8, moving_average_decay=0.5,
                           precision="bf16")
    with strategy.scope():
        with models.precision_policy("bf16"):
            model = task.build_model()
        optimizer = task.make_optimizer(steps_per_epoch=10, model=model)
    batch = {k: v.numpy() for k, v in task.example_batch(4).items()}
    iterator = iter(coordinator.create_per_worker_dataset(
        lambda _=None: tf.data.Dataset.from_tensors(batch).repeat()))

    @tf.function
    def ema_step(it):
        per_replica = strategy.run(task.train_step, args=(model, optimizer, next(it), 4))
        return models.reduce_metrics(strategy, per_replica)

    history = []
    for _ in range(3):
        result = coordinator.schedule(ema_step, args=(iterator,))
        coordinator.join()
        assert np.isfinite(float(result.fetch()["loss"]))
        history.append([w.numpy() for w in model.trainable_weights])
    check_averages(task, model, optimizer, history, 0.5)
    print("averages + bf16 ok")
    print("STRATEGY-OK")
    """
    )
)


@pytest.mark.parametrize(
    "script",
    [_MIRRORED_SCRIPT, _MIRRORED_AVERAGES_SCRIPT, _PS_SCRIPT],
    ids=["mirrored", "mirrored_averages", "parameter_server"],
)
def test_train_step_runs_under_distribution_strategies(script: str) -> None:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=240
    )
    assert "STRATEGY-OK" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]
