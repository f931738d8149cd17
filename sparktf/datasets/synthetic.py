"""Synthetic raw datasets in exactly the distribution formats: for tests, benchmarks, the demo.

    from sparktf.datasets.synthetic import write_cifar10, write_mnist, write_ptb
    data = write_cifar10(tmp_path / "cifar", n_train=50, n_test=20)
    data["train"]["images"]      # uint8 [50, 32, 32, 3] (HWC), as the converted dataset holds it
    data["train"]["labels"], data["train"]["ids"]

Each writer returns the arrays it wrote, in the order of the records in the files, with the
ids the conversion gives them (``sparktf.datasets.formats.make_id``). Files are written to a
local directory; copy them with ``sparktf.storage.copy_tree`` for HDFS.

By default the content is random (uniform pixels and labels, Zipf-distributed words): what a
test of the conversion needs. With ``learnable=True`` there is something to learn, so accuracy
rises within an epoch: what the demo datasets of the training jobs need (``write_raw``).
Learnable images are their class's pattern (:func:`class_patterns`: sinusoidal stripes whose
orientation and period name the class, tinted with a class colour) plus Gaussian noise; the
patterns survive the random crops and flips of ResNet's augmentation, so a model trained with
them still recognises the images as they are. Learnable words follow a Markov chain.
"""

from __future__ import annotations

import gzip as gzip_module
import io
import struct
import tarfile
from collections import Counter
from pathlib import Path

import numpy as np

from sparktf.datasets.formats import make_id
from sparktf.errors import SparktfValueError

__all__ = [
    "MARKOV_LINE_WORDS",
    "PATTERN_SEED",
    "cifar_bytes",
    "class_patterns",
    "idx_images",
    "idx_labels",
    "ptb_reference",
    "write_cifar10",
    "write_mnist",
    "write_ptb",
    "write_raw",
]

PATTERN_SEED = 1234  # the class colours of learnable images: the same in every file
MARKOV_LINE_WORDS = 20  # words per line of learnable PTB text
NUM_CLASSES = 10
# Learnable images: the stripes' period in pixels for classes (0, 1), (2, 3), ... (even
# classes have horizontal stripes, odd ones vertical), and the pixel scale of each part.
STRIPE_PERIODS = (3, 4, 6, 9, 14)
STRIPE_AMPLITUDE = 80.0
TINT_AMPLITUDE = 40.0
NOISE_STDDEV = 40.0


def _even_split(n: int, parts: int) -> list[int]:
    return [n * (i + 1) // parts - n * i // parts for i in range(parts)]


def class_patterns(shape: tuple[int, ...]) -> np.ndarray:
    """The 10 class patterns of learnable images, float ``[10, *shape]`` around 128.

    Class ``k`` is a sinusoid of period ``STRIPE_PERIODS[k // 2]`` pixels along the rows
    (``k`` even: horizontal stripes) or the columns (``k`` odd: vertical stripes), plus a
    colour of its own per channel (fixed by ``PATTERN_SEED``; on one channel it shifts the
    brightness). Orientation and period do not change under a shift or a horizontal flip, so
    the classes stay apart under ResNet's crop-and-flip augmentation.
    """
    height, width = shape[:2]
    channels = shape[2] if len(shape) > 2 else 1
    tints = np.random.default_rng(PATTERN_SEED).uniform(-1.0, 1.0, (NUM_CLASSES, channels))
    patterns = []
    for k in range(NUM_CLASSES):
        period = STRIPE_PERIODS[k // 2]
        along = np.arange(height)[:, None] if k % 2 == 0 else np.arange(width)[None, :]
        wave = np.broadcast_to(np.sin(2 * np.pi * along / period), (height, width))
        pattern = 128.0 + STRIPE_AMPLITUDE * wave[..., None] + TINT_AMPLITUDE * tints[k]
        patterns.append(pattern.reshape(shape))
    return np.stack(patterns)


def _images(
    rng: np.random.Generator, n: int, shape: tuple[int, ...], learnable: bool
) -> tuple[np.ndarray, np.ndarray]:
    """``(images uint8 [n, *shape], labels int64 [n])``: uniform noise and labels, or with
    ``learnable`` each label's pattern (:func:`class_patterns`) plus Gaussian noise."""
    if not learnable:
        images = rng.integers(0, 256, (n, *shape), dtype=np.uint8)
        return images, rng.integers(0, NUM_CLASSES, n).astype(np.int64)
    labels = rng.integers(0, NUM_CLASSES, n).astype(np.int64)
    noise = rng.normal(0.0, NOISE_STDDEV, (n, *shape))
    images = np.clip(class_patterns(shape)[labels] + noise, 0, 255)
    return images.astype(np.uint8), labels


def cifar_bytes(labels: np.ndarray, images_hwc: np.ndarray) -> bytes:
    """CIFAR-10 binary records: a label byte, then the image as 3 x 32 x 32 (CHW) bytes."""
    chw = images_hwc.transpose(0, 3, 1, 2).reshape(len(labels), -1)
    return np.concatenate([labels.astype(np.uint8)[:, None], chw], axis=1).tobytes()


def write_cifar10(
    directory,
    *,
    n_train: int = 50,
    n_test: int = 20,
    train_files: int = 5,
    seed: int = 0,
    archive: bool = False,
    learnable: bool = False,
) -> dict:
    """CIFAR-10 binary files: ``data_batch_1.bin`` ... and ``test_batch.bin``.

    With ``archive``, only ``cifar-10-binary.tar.gz`` (members under
    ``cifar-10-batches-bin/``, as distributed) is written. Returns ``{"train": {...},
    "test": {...}, "files": [paths]}`` with ``images`` (uint8 N x 32 x 32 x 3), ``labels``,
    ``ids`` per split.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    out: dict = {"files": []}
    members: dict[str, bytes] = {}
    splits = {"train": n_train, "test": n_test}
    file_index = 0
    for split, n in splits.items():
        images, labels = _images(rng, n, (32, 32, 3), learnable)
        counts = _even_split(n, train_files) if split == "train" else [n]
        ids, start = [], 0
        for k, count in enumerate(counts):
            name = f"data_batch_{k + 1}.bin" if split == "train" else "test_batch.bin"
            members[name] = cifar_bytes(
                labels[start : start + count], images[start : start + count]
            )
            ids.append(make_id(file_index, np.arange(count)))
            file_index += 1
            start += count
        out[split] = {"images": images, "labels": labels, "ids": np.concatenate(ids)}
    if archive:
        path = directory / "cifar-10-binary.tar.gz"
        with tarfile.open(path, "w:gz") as tar:
            extra = {
                "batches.meta.txt": b"airplane\nautomobile\nbird\ncat\ndeer\ndog\nfrog\n"
                b"horse\nship\ntruck\n",
                "readme.html": b"<html/>",
            }
            for name, data in {**members, **extra}.items():
                info = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
        out["files"].append(str(path))
    else:
        for name, data in members.items():
            (directory / name).write_bytes(data)
            out["files"].append(str(directory / name))
    return out


def idx_images(images: np.ndarray) -> bytes:
    """An IDX3 images file (magic 2051, count, rows, cols, then the pixels)."""
    n, rows, cols = images.shape[:3]
    return struct.pack(">IIII", 2051, n, rows, cols) + images.astype(np.uint8).tobytes()


def idx_labels(labels: np.ndarray) -> bytes:
    """An IDX1 labels file (magic 2049, count, then one byte per label)."""
    return struct.pack(">II", 2049, len(labels)) + labels.astype(np.uint8).tobytes()


def write_mnist(
    directory,
    *,
    n_train: int = 60,
    n_test: int = 20,
    rows: int = 28,
    cols: int = 28,
    gzip: bool = True,
    seed: int = 0,
    learnable: bool = False,
) -> dict:
    """MNIST IDX files (``train-images-idx3-ubyte[.gz]`` etc.).

    Returns ``{"train": {...}, "test": {...}, "files": [paths]}`` with ``images`` (uint8
    N x rows x cols x 1), ``labels``, ``ids``.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    out: dict = {"files": []}
    # file_index: t10k-images 0, t10k-labels 1, train-images 2, train-labels 3
    for split, prefix, n, file_index in (
        ("train", "train", n_train, 2),
        ("test", "t10k", n_test, 0),
    ):
        images, labels = _images(rng, n, (rows, cols), learnable)
        for name, data in (
            (f"{prefix}-images-idx3-ubyte", idx_images(images)),
            (f"{prefix}-labels-idx1-ubyte", idx_labels(labels)),
        ):
            path = directory / (name + (".gz" if gzip else ""))
            path.write_bytes(gzip_module.compress(data) if gzip else data)
            out["files"].append(str(path))
        out[split] = {
            "images": images[..., None],
            "labels": labels,
            "ids": make_id(file_index, np.arange(n)),
        }
    return out


def ptb_reference(texts: dict[str, str]) -> tuple[list[str], dict[str, list[int]]]:
    """What TensorFlow's PTB tutorial reader makes of ``texts``: the vocabulary of train
    (by count, descending, then by word) and each split's word ids (unknown words dropped)."""
    words = {split: text.replace("\n", "<eos>").split() for split, text in texts.items()}
    counter = Counter(words["train"])
    vocab = [w for w, _ in sorted(counter.items(), key=lambda x: (-x[1], x[0]))]
    word_to_id = {w: i for i, w in enumerate(vocab)}
    return vocab, {
        split: [word_to_id[w] for w in ws if w in word_to_id] for split, ws in words.items()
    }


def _zipf_lines(rng: np.random.Generator, words: list[str], n_lines: int) -> list[list[str]]:
    """Lines of 1 to 14 words drawn with Zipf-like frequencies (the first word most often)."""
    weights = 1.0 / np.arange(1, len(words) + 1)
    weights /= weights.sum()
    return [
        list(rng.choice(words, size=int(rng.integers(1, 15)), p=weights)) for _ in range(n_lines)
    ]


def _markov_lines(rng: np.random.Generator, words: list[str], n_lines: int) -> list[list[str]]:
    """Lines of ``MARKOV_LINE_WORDS`` words of one Markov chain over ``words`` (each word
    has 3 possible successors): a language model can learn it."""
    ids = [0]
    for _ in range(n_lines * MARKOV_LINE_WORDS - 1):
        ids.append((ids[-1] * 7 + int(rng.integers(0, 3))) % len(words))
    return [
        [words[i] for i in ids[k : k + MARKOV_LINE_WORDS]]
        for k in range(0, len(ids), MARKOV_LINE_WORDS)
    ]


def write_ptb(
    directory,
    *,
    lines: tuple[int, int, int] = (40, 12, 12),
    vocab_size: int = 30,
    seed: int = 0,
    oov_word: str | None = None,
    seq_len: int = 21,
    learnable: bool = False,
) -> dict:
    """PTB files ``ptb.train.txt``, ``ptb.valid.txt``, ``ptb.test.txt`` (lines like the real
    ones: `` w1 w2 ... \\n``) of ``lines`` lines each.

    The words are ``w0`` ... and ``<unk>`` (``vocab_size`` in all). ``oov_word``: put this
    word (absent from train) into valid. Returns ``{"texts", "vocab", "ids" (token ids per
    split, as :func:`ptb_reference` reads them), "chunks" and "chunk_ids" per split for
    ``seq_len``, "files"}``.
    """
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    words = [f"w{i}" for i in range(vocab_size - 1)] + ["<unk>"]
    make_lines = _markov_lines if learnable else _zipf_lines
    texts = {}
    for split, n_lines in zip(("train", "valid", "test"), lines):
        split_lines = make_lines(rng, words, n_lines)
        if split == "valid" and oov_word and split_lines:
            first = split_lines[0]
            first.insert(len(first) // 2, oov_word)
        texts[split] = "".join(" " + " ".join(line) + " \n" for line in split_lines)
    files = []
    for split, text in texts.items():
        path = directory / f"ptb.{split}.txt"
        path.write_text(text)
        files.append(str(path))
    vocab, ids = ptb_reference(texts)
    file_index = {"test": 0, "train": 1, "valid": 2}
    chunks, chunk_ids = {}, {}
    for split, seq in ids.items():
        n = len(seq) // seq_len
        chunks[split] = np.asarray(seq[: n * seq_len], dtype=np.int64).reshape(n, seq_len)
        chunk_ids[split] = make_id(file_index[split], np.arange(n))
    return {
        "texts": texts,
        "vocab": vocab,
        "ids": ids,
        "chunks": chunks,
        "chunk_ids": chunk_ids,
        "files": files,
    }


def write_raw(
    dataset: str, directory, *, n_train: int, n_test: int, seed: int = 0, learnable: bool = True
) -> dict:
    """The raw files of ``dataset`` ("cifar10", "mnist", "ptb") in ``directory``, learnable
    by default. ``n_train``/``n_test``: records (images) or tokens (about; PTB, whose valid
    and test splits get ``n_test`` each). Returns what the writer returns."""
    if dataset == "cifar10":
        return write_cifar10(
            directory, n_train=n_train, n_test=n_test, seed=seed, learnable=learnable
        )
    if dataset == "mnist":
        return write_mnist(
            directory, n_train=n_train, n_test=n_test, gzip=False, seed=seed, learnable=learnable
        )
    if dataset == "ptb":
        per_line = MARKOV_LINE_WORDS if learnable else 8
        lines = tuple(max(1, -(-n // per_line)) for n in (n_train, n_test, n_test))
        return write_ptb(directory, lines=lines, vocab_size=200, seed=seed, learnable=learnable)
    raise SparktfValueError(f"unknown dataset {dataset!r}: expected cifar10, mnist or ptb")
