"""Small synthetic datasets for a training job run with no arguments (``--data demo``).

The raw files have the real distribution formats (CIFAR-10 binary batches, MNIST IDX, PTB
text; written by :func:`sparktf.datasets.synthetic.write_raw`) and go through the real
conversion (:func:`sparktf.datasets.conversion.convert`), so the demo exercises the whole path.
The data is learnable: each image class has its own pattern (stripes of a class's
orientation and period, in a class colour; :func:`sparktf.datasets.synthetic.class_patterns`)
plus noise, and the words follow a Markov chain, so accuracy rises within an epoch, and
evaluation on the demo's test split shows it.

The converted dataset is cached under ``demo/<dataset>`` of sparktf's home
(:func:`sparktf.paths.home`: ``.local/`` of a checkout, ``$SPARKTF_HOME``), with a stamp
(``demo.json``) naming how it was made; a cached set with another stamp is made again.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from sparktf import paths, storage
from sparktf.errors import SparktfValueError

__all__ = ["SIZES", "STAMP", "dataset_for", "demo_dir", "ensure_dataset", "stamp_for"]

log = logging.getLogger(__name__)

# Records (images) or tokens (PTB) of train and of test (and of valid) per demo dataset.
SIZES = {"cifar10": (2048, 256), "mnist": (2048, 256), "ptb": (20000, 2000)}
# The file in a converted demo dataset that says how it was made (:func:`stamp_for`).
STAMP = "demo.json"


def demo_dir() -> Path:
    """Where the demo datasets are kept: ``demo`` under sparktf's home."""
    return paths.home() / "demo"


def dataset_for(model: str) -> str:
    """The demo dataset (``"cifar10"``, ``"mnist"`` or ``"ptb"``) a registry model trains on.

    Raises ``ValueError`` for a model the registry does not know, or one whose input no demo
    dataset has (its images are neither 28x28x1 nor 32x32x3).
    """
    from sparktf import models

    task = models.get_task(model)
    if task.kind == "language_model":
        return "ptb"
    shape = tuple(task.image_shape)
    if shape == (28, 28, 1):
        return "mnist"
    if shape == (32, 32, 3):
        return "cifar10"
    raise SparktfValueError(f"no demo dataset for {model} (images {shape}); pass --data")


def stamp_for(dataset: str) -> dict:
    """What the demo ``dataset`` is made of: its sizes and the synthetic data's parameters
    (the class patterns' periods and scales, the Markov chain's line length). A cached demo
    set whose stamp differs was made another way and is made again."""
    from sparktf.datasets import synthetic

    n_train, n_test = SIZES[dataset]
    return {
        "dataset": dataset,
        "n_train": n_train,
        "n_test": n_test,
        "stripe_periods": list(synthetic.STRIPE_PERIODS),
        "scales": [
            synthetic.STRIPE_AMPLITUDE,
            synthetic.TINT_AMPLITUDE,
            synthetic.NOISE_STDDEV,
        ],
        "pattern_seed": synthetic.PATTERN_SEED,
        "markov_line_words": synthetic.MARKOV_LINE_WORDS,
    }


def _cached(target: Path, stamp: dict) -> bool:
    """Whether ``target`` holds a converted demo set made as ``stamp`` says."""
    if not (target / "manifest.json").is_file():
        return False
    try:
        return json.loads((target / STAMP).read_text()) == stamp
    except (OSError, ValueError):
        return False


def ensure_dataset(model: str, spark=None) -> str:
    """The converted demo dataset for ``model``, made (written and converted with Spark) on
    first use or when the cached one was made another way.

    Parameters: ``model``, a registry model name; ``spark``, the session to convert with (a
    SparkSession, a function returning one, or None for :func:`sparktf.spark.get_session`).
    Returns the dataset's local directory. Raises what :func:`dataset_for` raises, and the
    conversion's errors.
    """
    from sparktf.datasets.conversion import convert
    from sparktf.datasets.synthetic import write_raw

    dataset = dataset_for(model)
    target = demo_dir() / dataset
    stamp = stamp_for(dataset)
    if _cached(target, stamp):
        return str(target)
    raw = demo_dir() / f"raw-{dataset}"
    n_train, n_test = SIZES[dataset]
    write_raw(dataset, raw, n_train=n_train, n_test=n_test, learnable=True)
    log.info("preparing the demo %s dataset in %s", dataset, target)
    convert(dataset, str(raw), str(target), shards=4, overwrite=True, spark=spark)
    storage.delete(str(raw))
    (target / STAMP).write_text(json.dumps(stamp, indent=1) + "\n")
    return str(target)
