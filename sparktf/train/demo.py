"""Small synthetic datasets for a training job run with no arguments (``--data demo``).

The raw files have the real distribution formats (CIFAR-10 binary batches, MNIST IDX, PTB
text) and go through the real conversion (:func:`sparktf.datasets.convert.convert`), so
the demo exercises the whole path. The images are learnable: each class has its own
pattern plus noise, so accuracy rises within an epoch.

The converted dataset is cached under ``.local/demo/<dataset>`` of the checkout.
"""

from __future__ import annotations

import logging
import struct
from pathlib import Path

import numpy as np

from sparktf import storage

log = logging.getLogger(__name__)

DEMO_DIR = Path(__file__).resolve().parents[2] / ".local" / "demo"
SIZES = {"cifar10": (2048, 256), "mnist": (2048, 256), "ptb": (20000, 2000)}  # train, test


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


def _images(n: int, shape: tuple[int, int, int], rng: np.random.Generator):
    labels = rng.integers(0, 10, n)
    patterns = np.random.default_rng(1234).integers(0, 256, (10, *shape)).astype(np.float32)
    noise = rng.normal(0, 40, (n, *shape))
    images = np.clip(patterns[labels] * 0.7 + noise + 30, 0, 255).astype(np.uint8)
    return images, labels.astype(np.uint8)


def write_raw(dataset: str, directory: Path, *, seed: int = 0) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    n_train, n_test = SIZES[dataset]
    if dataset == "cifar10":
        for name, n in [(f"data_batch_{i}.bin", n_train // 5) for i in range(1, 6)] + \
                       [("test_batch.bin", n_test)]:
            images, labels = _images(n, (32, 32, 3), rng)
            chw = images.transpose(0, 3, 1, 2).reshape(n, -1)
            (directory / name).write_bytes(np.concatenate([labels[:, None], chw], 1).tobytes())
    elif dataset == "mnist":
        for prefix, n in (("train", n_train), ("t10k", n_test)):
            images, labels = _images(n, (28, 28, 1), rng)
            (directory / f"{prefix}-images-idx3-ubyte").write_bytes(
                struct.pack(">IIII", 2051, n, 28, 28) + images.tobytes())
            (directory / f"{prefix}-labels-idx1-ubyte").write_bytes(
                struct.pack(">II", 2049, n) + labels.tobytes())
    elif dataset == "ptb":
        words = [f"w{i}" for i in range(200)]
        for split, n in (("train", n_train), ("valid", n_test), ("test", n_test)):
            # A Markov chain over the words: there is something to learn.
            ids = [0]
            for _ in range(n - 1):
                ids.append((ids[-1] * 7 + int(rng.integers(0, 3))) % len(words))
            lines = [" ".join(words[i] for i in ids[k:k + 20]) for k in range(0, n, 20)]
            (directory / f"ptb.{split}.txt").write_text("\n".join(lines) + "\n")
    else:
        raise ValueError(f"unknown demo dataset {dataset!r}")


def ensure_dataset(model: str, spark=None) -> str:
    """The converted demo dataset for ``model`` (converted on first use)."""
    from sparktf.datasets.convert import convert

    dataset = dataset_for(model)
    target = DEMO_DIR / dataset
    if (target / "manifest.json").is_file():
        return str(target)
    raw = DEMO_DIR / f"raw-{dataset}"
    write_raw(dataset, raw)
    log.info("preparing the demo %s dataset in %s", dataset, target)
    convert(dataset, str(raw), str(target), shards=4, overwrite=True, spark=spark)
    storage.delete(str(raw))
    return str(target)
