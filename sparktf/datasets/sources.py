"""The raw datasets: finding their files, unpacking archives, parsing and validating records.

Formats (all sizes big-endian where they are multi-byte):

- CIFAR-10 binary: ``data_batch_1.bin`` ... ``data_batch_5.bin`` (train), ``test_batch.bin``
  (test), or ``cifar-10-binary.tar.gz`` holding them. Records of 3073 bytes: a label byte
  (0..9), then 3072 image bytes channel-major (R plane, G plane, B plane, each 32x32
  row-major). Parsed images are returned height x width x channels.
- MNIST IDX: ``{train,t10k}-{images-idx3,labels-idx1}-ubyte``, optionally ``.gz``. Images:
  magic 2051, count, rows, cols (uint32 each), then count*rows*cols bytes; labels: magic 2049,
  count, then count bytes (0..9).
- PTB (simple-examples data): ``ptb.{train,valid,test}.txt``, words separated by spaces; each
  line end is the word ``<eos>`` (as in the book's 11.2 reader).

Every problem is a ``SourceError`` that names the file and the byte offset or record index.
Functions that read take sparktf paths (local or ``hdfs://``) and go through sparktf.storage.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import posixpath
import re
import struct
import tarfile
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import IO

import numpy as np

from sparktf import storage
from sparktf.datasets.formats import EOS
from sparktf.errors import SparktfError, SparktfValueError

__all__ = [
    "ARCHIVE_SUFFIXES",
    "CIFAR_CLASSES",
    "CIFAR_IMAGE_BYTES",
    "CIFAR_IMAGE_SHAPE",
    "CIFAR_LABEL_BYTES",
    "CIFAR_RECORD_BYTES",
    "CIFAR_TEST",
    "CIFAR_TRAIN",
    "COPY_CHUNK",
    "Container",
    "IdxHeader",
    "MNIST_CLASSES",
    "MNIST_FILES",
    "MNIST_IMAGES_HEADER",
    "MNIST_IMAGES_MAGIC",
    "MNIST_LABELS_HEADER",
    "MNIST_LABELS_MAGIC",
    "PTB_FILES",
    "SourceError",
    "build_vocab",
    "canonical_split",
    "cifar_records",
    "discover",
    "extract_members",
    "file_digest",
    "gunzip",
    "iter_lines",
    "line_start",
    "line_words",
    "parse_idx_header",
    "read_cifar",
    "read_idx_header",
    "read_mnist",
    "word_offset",
]

COPY_CHUNK = 4 << 20

CIFAR_LABEL_BYTES = 1
CIFAR_IMAGE_SHAPE = (32, 32, 3)
CIFAR_IMAGE_BYTES = 32 * 32 * 3
CIFAR_RECORD_BYTES = CIFAR_LABEL_BYTES + CIFAR_IMAGE_BYTES  # 3073
CIFAR_CLASSES = 10
CIFAR_TRAIN = re.compile(r"^data_batch_(\d+)\.bin$")
CIFAR_TEST = "test_batch.bin"
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz")

MNIST_IMAGES_MAGIC = 2051
MNIST_LABELS_MAGIC = 2049
MNIST_IMAGES_HEADER = 16
MNIST_LABELS_HEADER = 8
MNIST_CLASSES = 10
MNIST_FILES = {  # canonical name -> (split, role)
    "train-images-idx3-ubyte": ("train", "images"),
    "train-labels-idx1-ubyte": ("train", "labels"),
    "t10k-images-idx3-ubyte": ("test", "images"),
    "t10k-labels-idx1-ubyte": ("test", "labels"),
}

PTB_FILES = {"ptb.train.txt": "train", "ptb.valid.txt": "valid", "ptb.test.txt": "test"}


class SourceError(SparktfError, ValueError):
    """A raw input that cannot be converted; the message names the file and the place."""

    def __init__(
        self,
        path: str,
        problem: str,
        *,
        offset: int | None = None,
        record: int | None = None,
        offset_label: str = "byte offset",
    ):
        where = []
        if record is not None:
            where.append(f"record {record}")
        if offset is not None:
            where.append(f"{offset_label} {offset}")
        suffix = f" (at {', '.join(where)})" if where else ""
        super().__init__(f"{path}: {problem}{suffix}")
        self.path, self.problem, self.offset, self.record = path, problem, offset, record
        self.offset_label = offset_label

    def to_dict(self) -> dict:
        """Plain fields, to send from a Spark task to the driver (``SourceError(**d)``)."""
        return {
            "path": self.path,
            "problem": self.problem,
            "offset": self.offset,
            "record": self.record,
            "offset_label": self.offset_label,
        }

    def __reduce__(self):
        return _rebuild_source_error, (self.to_dict(),)


def _rebuild_source_error(fields: dict) -> SourceError:
    return SourceError(**fields)


# ----------------------------------------------------------------------------- discovery


@dataclass(frozen=True)
class Container:
    """An input file as found: read as is ("plain"), gunzipped ("gzip"), or an archive."""

    path: str
    kind: str  # "plain", "gzip" or "archive"
    name: str  # canonical raw file name ("" for an archive)
    split: str = ""
    role: str = ""


def _files_below(path: str) -> list[str]:
    if not storage.exists(path):
        raise SourceError(path, "input does not exist")
    if not storage.isdir(path):
        return [path]
    return storage.walk_files(path)


def _basename(path: str) -> str:
    return posixpath.basename(storage.parse(path).path)


def _unique(found: dict[str, list[str]], input_path: str) -> dict[str, str]:
    for name, paths in found.items():
        if len(paths) > 1:
            raise SourceError(input_path, f"{name} found more than once: {', '.join(paths)}")
    return {name: paths[0] for name, paths in found.items()}


def discover(dataset: str, input_path: str) -> list[Container]:
    """The input files of ``dataset`` below ``input_path`` (a directory, or an archive)."""
    finder = {"cifar10": _discover_cifar10, "mnist": _discover_mnist, "ptb": _discover_ptb}
    if dataset not in finder:
        raise SparktfValueError(f"unknown dataset {dataset!r}: expected one of {', '.join(finder)}")
    containers = finder[dataset](input_path)
    for c in containers:
        if storage.size(c.path) == 0:
            raise SourceError(c.path, "empty input file (0 bytes)", offset=0)
    return containers


def _is_archive(path: str) -> bool:
    return path.endswith(ARCHIVE_SUFFIXES)


def _discover_cifar10(input_path: str) -> list[Container]:
    files = _files_below(input_path)
    found: dict[str, list[str]] = {}
    for path in files:
        name = _basename(path)
        if CIFAR_TRAIN.match(name) or name == CIFAR_TEST:
            found.setdefault(name, []).append(path)
    if found:
        chosen = _unique(found, input_path)
        if CIFAR_TEST not in chosen or len(chosen) < 2:
            raise SourceError(
                input_path,
                "expected data_batch_*.bin (train) and test_batch.bin "
                f"(test); found only {', '.join(sorted(chosen))}",
            )
        return [
            Container(path, "plain", name, "test" if name == CIFAR_TEST else "train", "records")
            for name, path in sorted(chosen.items())
        ]
    archives = [p for p in files if _is_archive(p)]
    if len(archives) == 1:
        return [Container(archives[0], "archive", "")]
    if len(archives) > 1:
        raise SourceError(
            input_path,
            "more than one archive and no data_batch_*.bin files: "
            f"{', '.join(archives)}; give one of them as --input",
        )
    raise SourceError(
        input_path,
        "no CIFAR-10 binary files: expected data_batch_1.bin ... "
        "data_batch_5.bin and test_batch.bin, or cifar-10-binary.tar.gz",
    )


def _discover_mnist(input_path: str) -> list[Container]:
    found: dict[str, list[str]] = {}
    for path in _files_below(input_path):
        name = _basename(path)
        canonical = name[:-3] if name.endswith(".gz") else name
        if canonical in MNIST_FILES:
            found.setdefault(canonical, []).append(path)
    missing = sorted(set(MNIST_FILES) - set(found))
    if missing:
        raise SourceError(
            input_path, "missing MNIST files: " + ", ".join(f"{m}[.gz]" for m in missing)
        )
    out = []
    for name, paths in sorted(found.items()):
        plain = [p for p in paths if not p.endswith(".gz")]
        paths = plain or paths  # both forms present: read the plain one
        if len(paths) > 1:
            raise SourceError(input_path, f"{name} found more than once: {', '.join(paths)}")
        split, role = MNIST_FILES[name]
        kind = "gzip" if paths[0].endswith(".gz") else "plain"
        out.append(Container(paths[0], kind, name, split, role))
    return out


def _discover_ptb(input_path: str) -> list[Container]:
    found: dict[str, list[str]] = {}
    for path in _files_below(input_path):
        name = _basename(path)
        if name in PTB_FILES:
            found.setdefault(name, []).append(path)
    missing = sorted(set(PTB_FILES) - set(found))
    if missing:
        raise SourceError(
            input_path,
            f"missing PTB files: {', '.join(missing)} (expected the "
            "data/ directory of simple-examples)",
        )
    return [
        Container(path, "plain", name, PTB_FILES[name], "text")
        for name, path in sorted(_unique(found, input_path).items())
    ]


def canonical_split(dataset: str, name: str) -> tuple[str, str]:
    """``(split, role)`` of a raw file name of ``dataset``."""
    if dataset == "cifar10":
        return ("test" if name == CIFAR_TEST else "train"), "records"
    if dataset == "mnist":
        return MNIST_FILES[name]
    return PTB_FILES[name], "text"


# ----------------------------------------------------------------------------- unpacking


class _Counting(io.RawIOBase):
    """A read-only stream that counts the bytes read from it and hashes them."""

    def __init__(self, stream: IO[bytes]):
        self._stream, self.count, self.sha256 = stream, 0, hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._stream.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        self.count += n
        self.sha256.update(data)
        return n


def file_digest(path: str) -> dict:
    """``{"size", "sha256"}`` of a file, streamed."""
    digest, n = hashlib.sha256(), 0
    with storage.open_file(path, "rb") as f:
        while block := f.read(COPY_CHUNK):
            digest.update(block)
            n += len(block)
    return {"size": n, "sha256": digest.hexdigest()}


def _copy_hashing(src: IO[bytes], dst_path: str) -> dict:
    digest, n = hashlib.sha256(), 0
    with storage.open_file(dst_path, "wb") as out:
        while block := src.read(COPY_CHUNK):
            digest.update(block)
            out.write(block)
            n += len(block)
    return {"size": n, "sha256": digest.hexdigest()}


_CORRUPT = (OSError, EOFError, zlib.error, tarfile.TarError, gzip.BadGzipFile)


def gunzip(path: str, dst_path: str) -> dict:
    """Decompresses a .gz file into ``dst_path``; returns raw and compressed size/sha256."""
    with storage.open_file(path, "rb") as raw:
        counting = _Counting(raw)
        try:
            with gzip.GzipFile(fileobj=counting, mode="rb") as gz:
                out = _copy_hashing(gz, dst_path)
            while counting.readinto(bytearray(COPY_CHUNK)):  # hash what gzip did not read
                pass
        except storage.StorageError:
            raise
        except _CORRUPT as exc:
            raise SourceError(
                path,
                f"corrupt gzip file: {exc or type(exc).__name__}",
                offset=counting.count,
                offset_label="detected by compressed byte offset",
            ) from exc
    return {**out, "container": {"size": counting.count, "sha256": counting.sha256.hexdigest()}}


def extract_members(path: str, wanted, dst_dir: str) -> tuple[list[dict], dict]:
    """Streams a .tar.gz and writes the members whose base name ``wanted(name)`` accepts.

    Returns one ``{"name", "member", "path", "size", "sha256"}`` per member written, and the
    archive's own ``{"size", "sha256"}``. A corrupt archive is a SourceError naming the
    compressed byte offset reached.
    """
    members: list[dict] = []
    member_name = None
    with storage.open_file(path, "rb") as raw:
        counting = _Counting(raw)
        try:
            with tarfile.open(fileobj=counting, mode="r|gz") as tar:
                for info in tar:
                    member_name = info.name
                    name = posixpath.basename(info.name)
                    if not info.isfile() or not wanted(name):
                        continue
                    if any(m["name"] == name for m in members):
                        raise SourceError(path, f"archive holds {name} twice")
                    target = storage.join(dst_dir, name)
                    stats = _copy_hashing(tar.extractfile(info), target)
                    if stats["size"] != info.size:
                        raise SourceError(
                            path, f"member {info.name} is truncated", offset=counting.count
                        )
                    members.append({"name": name, "member": info.name, "path": target, **stats})
            while counting.readinto(bytearray(COPY_CHUNK)):
                pass
        except (SourceError, storage.StorageError):
            raise
        except _CORRUPT as exc:
            where = f" while reading member {member_name}" if member_name else ""
            raise SourceError(
                path,
                f"corrupt archive{where}: {exc or type(exc).__name__}",
                offset=counting.count,
                offset_label="detected by compressed byte offset",
            ) from exc
    return members, {"size": counting.count, "sha256": counting.sha256.hexdigest()}


# ----------------------------------------------------------------------------- CIFAR-10


def cifar_records(path: str, size: int) -> int:
    """Number of records of a CIFAR-10 file of ``size`` bytes; SourceError if it is not whole."""
    if size == 0:
        raise SourceError(path, "empty input file (0 bytes)", offset=0)
    whole, rest = divmod(size, CIFAR_RECORD_BYTES)
    if rest:
        raise SourceError(
            path,
            f"truncated file or wrong record length: {size} bytes is not a multiple of "
            f"the {CIFAR_RECORD_BYTES}-byte record; the last record has only {rest} bytes",
            record=whole,
            offset=whole * CIFAR_RECORD_BYTES,
        )
    return whole


def _read_exact(stream: IO[bytes], n: int, path: str, offset: int, record: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise SourceError(
            path,
            f"truncated file: expected {n} bytes, got {len(data)}",
            offset=offset + len(data),
            record=record,
        )
    return data


def read_cifar(
    path: str, start: int, stop: int, *, block: int = 1024, label: str | None = None
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Yields ``(first_record, labels int64 [n], images uint8 [n, 32, 32, 3])`` blocks of
    records ``start`` .. ``stop - 1`` of a CIFAR-10 file (errors name ``label`` or ``path``)."""
    name = label or path
    with storage.open_file(path, "rb") as f:
        f.seek(start * CIFAR_RECORD_BYTES)
        for first in range(start, stop, block):
            n = min(block, stop - first)
            data = _read_exact(f, n * CIFAR_RECORD_BYTES, name, first * CIFAR_RECORD_BYTES, first)
            records = np.frombuffer(data, dtype=np.uint8).reshape(n, CIFAR_RECORD_BYTES)
            labels = records[:, 0].astype(np.int64)
            _check_labels(labels, CIFAR_CLASSES, name, first, lambda i: i * CIFAR_RECORD_BYTES)
            images = records[:, 1:].reshape(n, 3, 32, 32).transpose(0, 2, 3, 1)
            yield first, labels, np.ascontiguousarray(images)


def _check_labels(labels: np.ndarray, classes: int, path: str, first: int, offset_of) -> None:
    bad = np.flatnonzero((labels < 0) | (labels >= classes))
    if bad.size:
        index = first + int(bad[0])
        raise SourceError(
            path,
            f"label {int(labels[bad[0]])} is out of range 0..{classes - 1}",
            record=index,
            offset=offset_of(index),
        )


# ----------------------------------------------------------------------------- MNIST


@dataclass(frozen=True)
class IdxHeader:
    magic: int
    count: int
    rows: int = 1
    cols: int = 1

    @property
    def header_bytes(self) -> int:
        return MNIST_IMAGES_HEADER if self.magic == MNIST_IMAGES_MAGIC else MNIST_LABELS_HEADER

    @property
    def record_bytes(self) -> int:
        return self.rows * self.cols


def read_idx_header(path: str, role: str, size: int, *, label: str | None = None) -> IdxHeader:
    """Reads and checks the header of an (uncompressed) IDX file against its size."""
    with storage.open_file(path, "rb") as f:
        head = f.read(MNIST_IMAGES_HEADER if role == "images" else MNIST_LABELS_HEADER)
    return parse_idx_header(label or path, role, size, head)


def parse_idx_header(path: str, role: str, size: int, head: bytes) -> IdxHeader:
    """Checks the header bytes ``head`` of an IDX file of ``size`` bytes (``path``: its name)."""
    images = role == "images"
    magic_expected = MNIST_IMAGES_MAGIC if images else MNIST_LABELS_MAGIC
    header_bytes = MNIST_IMAGES_HEADER if images else MNIST_LABELS_HEADER
    if size < header_bytes:
        raise SourceError(
            path,
            f"truncated IDX header: {size} bytes, expected at least {header_bytes}",
            offset=size,
        )
    values = struct.unpack(">" + "I" * (header_bytes // 4), head)
    if values[0] != magic_expected:
        raise SourceError(
            path,
            f"bad IDX magic {values[0]} (0x{values[0]:08x}); expected "
            f"{magic_expected} for an {role} file",
            offset=0,
        )
    header = IdxHeader(*values)
    if header.count == 0:
        raise SourceError(path, "empty input: the IDX header counts 0 records", offset=4)
    if images and not (0 < header.rows <= 4096 and 0 < header.cols <= 4096):
        raise SourceError(path, f"bad IDX dimensions {header.rows}x{header.cols}", offset=8)
    expected = header_bytes + header.count * header.record_bytes
    if size != expected:
        whole = (size - header_bytes) // header.record_bytes
        problem = "truncated file" if size < expected else "trailing bytes after the records"
        raise SourceError(
            path,
            f"{problem}: the header says {header.count} records of "
            f"{header.record_bytes} bytes ({expected} bytes), the file has "
            f"{size} bytes",
            record=min(whole, header.count),
            offset=header_bytes + min(whole, header.count) * header.record_bytes,
        )
    return header


def read_mnist(
    images_path: str,
    labels_path: str,
    rows: int,
    cols: int,
    start: int,
    stop: int,
    *,
    block: int = 4096,
    images_label: str | None = None,
    labels_label: str | None = None,
) -> Iterator[tuple[int, np.ndarray, np.ndarray]]:
    """Yields ``(first_record, labels int64 [n], images uint8 [n, rows, cols, 1])`` blocks of
    records ``start`` .. ``stop - 1`` (errors name the ``*_label`` or the paths)."""
    size = rows * cols
    images_name, labels_name = images_label or images_path, labels_label or labels_path
    with storage.open_file(images_path, "rb") as fi, storage.open_file(labels_path, "rb") as fl:
        fi.seek(MNIST_IMAGES_HEADER + start * size)
        fl.seek(MNIST_LABELS_HEADER + start)
        for first in range(start, stop, block):
            n = min(block, stop - first)
            pixels = _read_exact(
                fi, n * size, images_name, MNIST_IMAGES_HEADER + first * size, first
            )
            labels = np.frombuffer(
                _read_exact(fl, n, labels_name, MNIST_LABELS_HEADER + first, first), dtype=np.uint8
            ).astype(np.int64)
            _check_labels(
                labels, MNIST_CLASSES, labels_name, first, lambda i: MNIST_LABELS_HEADER + i
            )
            yield first, labels, np.frombuffer(pixels, dtype=np.uint8).reshape(n, rows, cols, 1)


# ----------------------------------------------------------------------------- PTB


def line_start(stream: IO[bytes], offset: int) -> int:
    """The offset of the first line that starts at or after ``offset``."""
    if offset <= 0:
        return 0
    stream.seek(offset - 1)
    return offset - 1 + len(stream.readline())


def iter_lines(
    stream: IO[bytes], start: int, stop: int | None = None
) -> Iterator[tuple[int, bytes]]:
    """``(offset, line)`` of the lines that start in [start, stop) (to the end if None)."""
    stream.seek(start)
    pos = start
    while stop is None or pos < stop:
        line = stream.readline()
        if not line:
            return
        yield pos, line
        pos += len(line)


def line_words(line: bytes, path: str, offset: int) -> list[str]:
    """The words of one line, ``<eos>`` appended when the line ends with a newline."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SourceError(path, f"not UTF-8 text: {exc.reason}", offset=offset + exc.start) from exc
    words = text.split()
    if line.endswith(b"\n"):
        words.append(EOS)
    return words


def word_offset(line: bytes, offset: int, index: int) -> int:
    """Byte offset of the ``index``-th word of a line that starts at ``offset``."""
    for i, match in enumerate(re.finditer(rb"\S+", line)):
        if i == index:
            return offset + match.start()
    return offset + len(line.rstrip(b"\n"))  # the <eos> of the line


def build_vocab(counts: dict[str, int]) -> list[str]:
    """Words by count descending, then by word (the book's 11.2 reader)."""
    return [w for w, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))]
