"""The recipes in conf/jobs/recipes/: each loads through the training job's command line,
builds its model with the recipe's settings and trains two steps (in this process, on a tiny
batch: no Spark, no dataset)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = [pytest.mark.unit, pytest.mark.tensorflow_only]  # see pyproject.toml

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted((ROOT / "conf" / "jobs" / "recipes").glob("*.json"))


def test_every_model_family_has_a_recipe():
    names = {p.stem for p in RECIPES}
    for expected in (
        "resnet20_cifar10",
        "resnet32_cifar10",
        "resnet56_cifar10",
        "resnet110_cifar10",
        "ptb_small",
        "ptb_medium",
        "ptb_large",
        "mnist_softmax",
        "mnist_mlp",
        "dcgan_mnist",
    ):
        assert expected in names


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_recipe_loads_builds_and_trains_two_steps(recipe):
    from sparktf import cli, models
    from sparktf.jobs import train as job

    args = cli.parse(
        job.parser("recipe", "train", None),
        ["--config", str(recipe), "--data", "/unused", "--model-dir", "/unused"],
    )
    train, scaling, run = job.configs(args)
    task = models.get_task(train.model, **train.model_config)
    # What the recipe says, as the run will see it.
    if train.model.startswith("resnet"):
        assert task.config["optimizer"] == {"name": "momentum", "momentum": 0.9}
        assert (task.config["learning_rate"], train.batch_size, train.steps) == (0.1, 128, 64000)
        assert task.config["lr_schedule"] == "piecewise"
        assert run.evaluation.export_best == "accuracy" and task.config["augment"] is True
    if train.model.startswith("ptb"):
        assert train.shuffle is False and run.evaluation.split == "valid"
    # Two steps on a tiny batch (the recipe's own batch would not fit a unit test).
    small = dict(train.model_config, batch_size=2)
    if task.kind == "language_model":
        small["vocab_size"] = 50
    task = models.get_task(train.model, **small)
    model = task.build_model()
    optimizer = task.make_optimizer(10, model)
    before = [w.copy() for w in model.get_weights()]
    batch = task.example_batch(2)
    for _ in range(2):
        metrics = task.train_step(model, optimizer, batch, 2)
    assert all(np.isfinite(float(v)) for v in metrics.values())
    changed = [not np.array_equal(a, b) for a, b in zip(before, model.get_weights())]
    assert any(changed), f"{recipe.stem}: two steps changed no weight"
    assert isinstance(optimizer, dict) or int(optimizer.iterations) == 2
