"""Small synthetic datasets for a training job run with no arguments (``--data demo``).

The raw files have the real distribution formats (CIFAR-10 binary batches, MNIST IDX, PTB
text; written by :func:`sparktf.datasets.synthetic.write_raw`) and go through the real
conversion (:func:`sparktf.datasets.convert.convert`), so the demo exercises the whole path.
The data is learnable: each class has its own image pattern plus noise, and the words follow
a Markov chain, so accuracy rises within an epoch.

The converted dataset is cached under ``demo/<dataset>`` of sparktf's home
(:func:`sparktf.paths.home`: ``.local/`` of a checkout, ``$SPARKTF_HOME``).
"""

from __future__ import annotations

import logging
from pathlib import Path

from sparktf import paths, storage

log = logging.getLogger(__name__)

# Records (images) or tokens (PTB) of train and of test (and of valid) per demo dataset.
SIZES = {"cifar10": (2048, 256), "mnist": (2048, 256), "ptb": (20000, 2000)}


def demo_dir() -> Path:
    """Where the demo datasets are kept: ``demo`` under sparktf's home."""
    return paths.home() / "demo"


def dataset_for(model: str) -> str:
    """The dataset a registry model trains on."""
    from sparktf import models

    task = models.get_task(model)
    if task.kind == "language_model":
        return "ptb"
    shape = tuple(task.image_shape)
    if shape == (28, 28, 1):
        return "mnist"
    if shape == (32, 32, 3):
        return "cifar10"
    raise ValueError(f"no demo dataset for {model} (images {shape}); pass --data")


def ensure_dataset(model: str, spark=None) -> str:
    """The converted demo dataset for ``model`` (converted on first use)."""
    from sparktf.datasets.convert import convert
    from sparktf.datasets.synthetic import write_raw

    dataset = dataset_for(model)
    target = demo_dir() / dataset
    if (target / "manifest.json").is_file():
        return str(target)
    raw = demo_dir() / f"raw-{dataset}"
    n_train, n_test = SIZES[dataset]
    write_raw(dataset, raw, n_train=n_train, n_test=n_test, learnable=True)
    log.info("preparing the demo %s dataset in %s", dataset, target)
    convert(dataset, str(raw), str(target), shards=4, overwrite=True, spark=spark)
    storage.delete(str(raw))
    return str(target)
