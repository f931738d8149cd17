"""Training-time augmentation (sparktf.models.augment) and fine-tuning
(sparktf.train.process.warmstart).

The source runs are real: a task's ``train_step`` for a few steps, its checkpoint and its
export written by the training loop's own :class:`~sparktf.train.artifacts.ModelDir`, read
back from local disk and from a real HDFS. No Spark: the training loop's calls of these
functions are exercised by tests/test_train.py.
"""

from __future__ import annotations

import logging
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pytest
import tensorflow as tf

from sparktf import cli, models, storage
from sparktf.jobs import train as train_job
from sparktf.train.artifacts import ModelDir
from sparktf.train.process.warmstart import (
    WarmStartError,
    apply_trainable_scopes,
    resolve_source,
    warm_start,
)

pytestmark = pytest.mark.unit  # tests of another tier carry their own mark

TINY_RESNET = {"num_residual_units": [1, 1, 1], "filters": [4, 4, 8, 8], "batch_size": 8}
TINY_PTB = {"vocab_size": 40, "hidden_size": 12, "num_steps": 5, "batch_size": 4}


def values(model) -> dict[str, np.ndarray]:
    """Every variable of ``model`` by Keras path (copies)."""
    return {w.path: np.array(w.numpy()) for w in model.variables}


# ------------------------------------------------------------------------------ augmentation


def random_images(n: int, h: int = 32, w: int = 32, seed: int = 0) -> np.ndarray:
    """Pixels in 1..255: a window that reaches into the zero padding is recognisable, and
    every 32x32 window (and its mirror) of the padded image is distinct."""
    return np.random.default_rng(seed).integers(1, 256, size=(n, h, w, 3), dtype=np.uint8)


def locate(out: np.ndarray, image: np.ndarray, pad: int = 4) -> list[tuple[int, int, bool]]:
    """Every (dy, dx, flipped) for which ``out`` is that window of the zero-padded image."""
    h, w = image.shape[:2]
    padded = np.pad(image, [(pad, pad), (pad, pad), (0, 0)])
    hits = []
    for dy in range(2 * pad + 1):
        for dx in range(2 * pad + 1):
            window = padded[dy : dy + h, dx : dx + w]
            for flipped in (False, True):
                if np.array_equal(window[:, ::-1] if flipped else window, out):
                    hits.append((dy, dx, flipped))
    return hits


def test_augment_is_deterministic_under_its_seed_and_differs_under_another():
    images = random_images(16)
    a = models.augment_images(images, tf.constant([3, 7]))
    b = models.augment_images(tf.constant(images), [3, 7])
    c = models.augment_images(images, tf.constant([3, 8]))
    assert a.dtype == tf.uint8 and a.shape == (16, 32, 32, 3)
    np.testing.assert_array_equal(a.numpy(), b.numpy())
    assert not np.array_equal(a.numpy(), c.numpy())
    # Inside a tf.function with an unknown batch size: the same draws as eagerly.
    traced = tf.function(
        models.augment_images,
        input_signature=[
            tf.TensorSpec([None, 32, 32, 3], tf.uint8),
            tf.TensorSpec([2], tf.int64),
        ],
    )
    np.testing.assert_array_equal(traced(images, tf.constant([3, 7], tf.int64)).numpy(), a)
    # Float images keep their dtype and values (a float window is the same window).
    floats = models.augment_images(images.astype(np.float32) / 255.0, [3, 7])
    assert floats.dtype == tf.float32
    np.testing.assert_array_equal(floats.numpy(), a.numpy().astype(np.float32) / 255.0)


def test_every_augmented_image_is_a_window_of_the_padded_input_possibly_flipped():
    for h, w, n in ((32, 32, 64), (20, 24, 16)):  # CIFAR, and any H x W
        images = random_images(n, h, w, seed=h)
        out = models.augment_images(images, [11, h]).numpy()
        assert out.shape == images.shape and out.dtype == np.uint8
        found = []
        for i in range(n):
            hits = locate(out[i], images[i])
            assert len(hits) == 1, f"image {i}: {len(hits)} windows match"
            found.append(hits[0])
        flips = [f for _, _, f in found]
        offsets = {(dy, dx) for dy, dx, _ in found}
        if n == 64:  # per image, not per batch: flips and crops vary across the batch
            assert 16 <= sum(flips) <= 48, sum(flips)
            assert len(offsets) >= 20, offsets
            assert any(dy in (0, 8) or dx in (0, 8) for dy, dx in offsets)  # reaches the pad
        else:
            assert 0 < sum(flips) < n and len(offsets) > 1


def test_resnet_task_augments_in_training_only_and_the_switch_turns_it_off():
    task = models.get_task("resnet20", **TINY_RESNET)
    assert task.config["augment"] is True
    for name in ("resnet20", "resnet32", "resnet56", "resnet110", "resnet164"):
        assert models.get_task(name).config["augment"] is True
    assert not hasattr(models.get_task("mnist_mlp"), "augment")
    assert "augment" not in models.get_task("alexnet_v2").config

    batch = task.example_batch(8, seed=1)
    step = tf.Variable(5, dtype=tf.int64)

    @tf.function
    def hook(batch, replica):  # how the training loop calls it, seed (run seed, step, replica)
        return task.augment(batch, (0, step, replica))

    out = hook(batch, tf.constant(0))
    assert set(out) == set(batch)
    np.testing.assert_array_equal(out["label"].numpy(), batch["label"].numpy())
    np.testing.assert_array_equal(out["id"].numpy(), batch["id"].numpy())
    images = batch["image"].numpy()
    for i in range(8):
        assert len(locate(out["image"].numpy()[i], images[i])) == 1
    assert not np.array_equal(out["image"].numpy(), images)
    again = hook(batch, tf.constant(0))["image"].numpy()
    np.testing.assert_array_equal(again, out["image"].numpy())
    other_replica = hook(batch, tf.constant(1))["image"].numpy()
    step.assign_add(1)
    next_step = hook(batch, tf.constant(0))["image"].numpy()
    assert not np.array_equal(other_replica, again) and not np.array_equal(next_step, again)

    off = models.get_task("resnet20", augment=False, **TINY_RESNET)
    assert off.augment(batch, (0, 5, 0)) is batch


def test_evaluation_and_the_export_do_not_augment(tmp_path):
    task = models.get_task("resnet20", **TINY_RESNET)
    model = task.build_model()
    optimizer = task.make_optimizer(10, model)
    batch = task.example_batch(8, seed=2)
    task.train_step(model, optimizer, task.augment(batch, [1, 2]), 8)

    # eval_step: the loss and accuracy of the images as they are, whatever the seeds.
    logits = model(batch["image"], training=False)
    expected_loss = tf.reduce_mean(
        tf.nn.sparse_softmax_cross_entropy_with_logits(labels=batch["label"], logits=logits)
    )
    for seed in (1, 2):
        tf.random.set_seed(seed)
        metrics = task.eval_step(model, batch, 8)
        np.testing.assert_allclose(metrics["loss"].numpy(), expected_loss.numpy(), rtol=1e-5)

    # The export: its outputs on an image are a function of the image only.
    export = task.export(model, str(tmp_path / "export"))
    loaded = tf.saved_model.load(export)
    predict = loaded.signatures["predict_images"]
    assert set(predict.structured_input_signature[1]) == {"images"}
    tf.random.set_seed(1)
    first = predict(images=batch["image"])["scores"].numpy()
    tf.random.set_seed(99)
    second = predict(images=batch["image"])["scores"].numpy()
    np.testing.assert_array_equal(first, second)
    np.testing.assert_allclose(first, tf.nn.softmax(logits).numpy(), rtol=1e-5, atol=1e-6)


def job_args(*argv: str):
    return train_job.parser("t", "train", None).parse_args(list(argv))


def test_flags_become_model_config_and_train_fields(tmp_path):
    opts = train_job.finetune_and_augment_options(job_args("--model", "resnet20"))
    assert opts == {
        "model_config": {},
        "train": {
            "warm_start_from": None,
            "warm_start_exclude_scopes": (),
            "trainable_scopes": (),
        },
    }
    opts = train_job.finetune_and_augment_options(
        job_args("--model", "resnet20", "--no-augment", "--trainable-scopes", "logits, unit_3")
    )
    assert opts["model_config"] == {"augment": False}
    assert opts["train"]["trainable_scopes"] == ("logits", "unit_3")
    assert models.get_task("resnet20", **opts["model_config"]).config["augment"] is False
    # A model without the switch never augments: nothing to override (and no unknown key).
    opts = train_job.finetune_and_augment_options(job_args("--model", "mnist_mlp", "--no-augment"))
    assert opts["model_config"] == {}
    with pytest.raises(cli.UsageError, match="needs --warm-start-from"):
        train_job.finetune_and_augment_options(
            job_args("--model", "mnist_mlp", "--warm-start-exclude-scopes", "logits")
        )
    started = time.monotonic()
    with pytest.raises(cli.UsageError, match="^--warm-start-from .*: no such checkpoint"):
        train_job.finetune_and_augment_options(
            job_args("--model", "mnist_mlp", "--warm-start-from", str(tmp_path / "nothing"))
        )
    assert time.monotonic() - started < 5


# ------------------------------------------------------------------------------ fine-tuning


def run_source(task, model_dir: str, steps: int = 3):
    """Trains ``task`` for ``steps`` steps, then checkpoints and exports it the way the
    training loop does (ModelDir, a clean model for the export); returns the model."""
    model = task.build_model()
    optimizer = task.make_optimizer(10, model)
    global_step = tf.Variable(0, dtype=tf.int64, trainable=False, name="global_step")
    directory = ModelDir(model_dir, writer=True)
    try:
        directory.attach(
            tf.train.Checkpoint(model=model, global_step=global_step, optimizer=optimizer),
            keep=2,
        )
        for i in range(steps):
            batch = task.example_batch(task.batch_size, seed=i)
            task.train_step(model, optimizer, batch, task.batch_size)
            global_step.assign_add(1)
        directory.save(steps)

        def write(local_dir: str) -> None:
            clean = task.build_model()
            clean.set_weights(model.get_weights())
            task.export(clean, local_dir)

        directory.export(write, steps)
    finally:
        directory.close()
    return model


@pytest.fixture(scope="module")
def mlp_run(tmp_path_factory):
    """A mnist_mlp (10 classes) trained 3 steps: (model dir, its weights by path)."""
    model_dir = str(tmp_path_factory.mktemp("mlp") / "run")
    task = models.get_task("mnist_mlp", hidden_units=16, batch_size=8)
    model = run_source(task, model_dir)
    return model_dir, values(model)


SOURCES = {
    "model dir": lambda d: d,
    "checkpoints dir": lambda d: f"{d}/checkpoints",
    "checkpoint prefix": lambda d: f"{d}/checkpoints/ckpt-3",
    "export dir": lambda d: f"{d}/export",
    "export": lambda d: f"{d}/export/3",
}


@pytest.mark.parametrize("form", list(SOURCES))
def test_warm_start_to_another_number_of_classes_keeps_the_excluded_head(mlp_run, form, caplog):
    model_dir, source = mlp_run
    path = SOURCES[form](model_dir)
    kind = "saved_model" if "export" in form else "checkpoint"
    assert resolve_source(path).kind == kind
    target = models.get_task("mnist_mlp", hidden_units=16, num_classes=5).build_model()
    fresh = values(target)
    with caplog.at_level(logging.INFO, logger="sparktf.train.process.warmstart"):
        counts = warm_start(target, path, exclude_scopes=["logits"])
    assert counts["restored"] == 2 and counts["excluded"] == 2 and counts["missing"] == 0
    assert counts["kind"] == kind
    after = values(target)
    for name in ("hidden/kernel", "hidden/bias"):
        assert after[name].tobytes() == source[name].tobytes(), name  # bit for bit
        assert not np.array_equal(after[name], fresh[name])
    for name in ("logits/kernel", "logits/bias"):
        assert after[name].tobytes() == fresh[name].tobytes(), name  # its initialisation
    assert after["logits/kernel"].shape == (16, 5)
    assert "restored 2 variables" in caplog.text and "excluded 2" in caplog.text


def test_warm_start_same_model_restores_everything_and_predicts_the_same(mlp_run):
    model_dir, source = mlp_run
    task = models.get_task("mnist_mlp", hidden_units=16)
    for path in (model_dir, f"{model_dir}/export/3"):
        target = task.build_model()
        counts = warm_start(target, path)
        assert (counts["restored"], counts["excluded"], counts["missing"]) == (4, 0, 0)
        assert {k: v.tobytes() for k, v in values(target).items()} == {
            k: v.tobytes() for k, v in source.items()
        }


def test_a_shape_mismatch_without_exclusion_is_a_clear_error_and_assigns_nothing(mlp_run):
    model_dir, _ = mlp_run
    target = models.get_task("mnist_mlp", hidden_units=16, num_classes=5).build_model()
    fresh = values(target)
    for path in (model_dir, f"{model_dir}/export"):
        with pytest.raises(WarmStartError) as err:
            warm_start(target, path)
        message = str(err.value)
        assert "logits/kernel: [16, 5] in the model, [16, 10] in the source" in message
        assert "TrainConfig.warm_start_exclude_scopes" in message
        assert all(v.tobytes() == fresh[k].tobytes() for k, v in values(target).items())
    with pytest.raises(WarmStartError, match="none of its variables"):
        warm_start(models.get_task("ptb_small", **TINY_PTB).build_model(), model_dir)
    with pytest.raises(WarmStartError, match="no checkpoint"):
        warm_start(target, os.path.dirname(model_dir))  # a directory without either


def test_apply_trainable_scopes_trains_exactly_the_scoped_variables(mlp_run):
    task = models.get_task("mnist_mlp", hidden_units=16)
    model = task.build_model()
    assert apply_trainable_scopes(model, ()) == model.trainable_variables
    assert len(model.trainable_variables) == 4
    trained = apply_trainable_scopes(model, "logits")
    assert [v.path for v in trained] == ["logits/kernel", "logits/bias"]
    assert [v.path for v in model.trainable_variables] == ["logits/kernel", "logits/bias"]
    partial = task.build_model()
    assert [v.path for v in apply_trainable_scopes(partial, ["hidden/kernel", "logits/b"])] == [
        "hidden/kernel",
        "logits/bias",
    ]
    with pytest.raises(WarmStartError, match="match no trainable variable"):
        apply_trainable_scopes(task.build_model(), "logits,nope")

    before = values(model)
    optimizer = task.make_optimizer(10, model)
    for i in range(3):
        task.train_step(model, optimizer, task.example_batch(8, seed=i), 8)
    after = values(model)
    for name in ("hidden/kernel", "hidden/bias"):
        assert after[name].tobytes() == before[name].tobytes(), name
    assert not np.array_equal(after["logits/kernel"], before["logits/kernel"])


def test_trainable_scopes_freeze_batch_norm_statistics_and_the_export_still_works(tmp_path):
    task = models.get_task("resnet20", **TINY_RESNET)
    model = task.build_model()
    trained = apply_trainable_scopes(model, ["logits", "unit_3_0_conv2"])
    assert {v.path for v in trained} == {
        "logits/kernel",
        "logits/bias",
        "unit_3_0_conv2/kernel",
    }
    before = values(model)
    optimizer = task.make_optimizer(10, model)
    for i in range(2):
        task.train_step(model, optimizer, task.augment(task.example_batch(8, seed=i), [0, i]), 8)
    after = values(model)
    changed = sorted(k for k in after if after[k].tobytes() != before[k].tobytes())
    assert changed == sorted(v.path for v in trained)  # BN moving statistics included
    # The training loop exports from model.get_weights() into a fresh model.
    clean = task.build_model()
    clean.set_weights(model.get_weights())
    assert {k: v.tobytes() for k, v in values(clean).items()} == {
        k: v.tobytes() for k, v in after.items()
    }


def test_warm_start_of_a_model_with_repeated_variable_names(tmp_path):
    """ptb_*: the LSTM cells' variables share TensorFlow names; the order decides."""
    task = models.get_task("ptb_small", **TINY_PTB)
    model_dir = str(tmp_path / "ptb")
    source = values(run_source(task, model_dir, steps=2))
    assert source["ptb_small/lstm_0/lstm_cell/kernel"].shape == (
        source["ptb_small/lstm_1/lstm_cell/kernel"].shape
    )
    for path in (model_dir, f"{model_dir}/export"):
        target = task.build_model()
        counts = warm_start(target, path)
        assert counts["restored"] == 9 and counts["missing"] == 0, counts
        got = values(target)
        for name, value in source.items():
            if "seed_generator" not in name:
                assert got[name].tobytes() == value.tobytes(), (path, name)
    bigger = models.get_task("ptb_small", **{**TINY_PTB, "vocab_size": 50}).build_model()
    counts = warm_start(bigger, model_dir, exclude_scopes="embedding,softmax")
    assert (counts["restored"], counts["excluded"]) == (6, 3)
    got = values(bigger)
    assert got["ptb_small/lstm_1/lstm_cell/kernel"].tobytes() == (
        source["ptb_small/lstm_1/lstm_cell/kernel"].tobytes()
    )


def test_warm_start_from_and_into_a_distributed_model(tmp_path):
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    task = models.get_task("mnist_mlp", hidden_units=16)
    with strategy.scope():
        model = task.build_model()
        checkpoint = tf.train.Checkpoint(model=model)
    for w in model.variables:
        w.assign(np.full(w.shape, 0.25, dtype=np.float32))
    prefix = checkpoint.write(str(tmp_path / "ckpt-1"))
    plain = task.build_model()
    assert warm_start(plain, prefix)["restored"] == 4
    assert all(np.all(w.numpy() == 0.25) for w in plain.variables)
    with strategy.scope():
        mirrored = models.get_task("mnist_mlp", hidden_units=16, num_classes=3).build_model()
    assert warm_start(mirrored, prefix, exclude_scopes=["logits"])["restored"] == 2
    assert np.all(mirrored.variables[0].numpy() == 0.25)


@pytest.mark.integration
def test_warm_start_from_hdfs(mlp_run, hdfs):
    model_dir, source = mlp_run
    remote = hdfs.fresh("warmstart")
    storage.copy_tree(model_dir, remote)
    assert resolve_source(remote).path == f"{remote}/checkpoints/ckpt-3"
    assert resolve_source(f"{remote}/export").path == f"{remote}/export/3"
    for path in (remote, f"{remote}/checkpoints/ckpt-3", f"{remote}/export"):
        target = models.get_task("mnist_mlp", hidden_units=16, num_classes=5).build_model()
        counts = warm_start(target, path, exclude_scopes=["logits/"])
        assert (counts["restored"], counts["excluded"]) == (2, 2)
        assert target.variables[0].numpy().tobytes() == source["hidden/kernel"].tobytes()
    args = job_args("--model", "mnist_mlp", "--warm-start-from", remote)
    assert train_job.finetune_and_augment_options(args)["train"]["warm_start_from"] == remote
