"""Copies between any two file systems: one file, a directory tree, or a local copy of a
remote path for code that only reads local files."""

from __future__ import annotations

import contextlib
import os
import posixpath
import tempfile
from collections.abc import Iterator

from sparktf.storage.errors import PathNotFoundError
from sparktf.storage.files import open_file
from sparktf.storage.namespace import exists, isdir, listdir, makedirs
from sparktf.storage.uri import join, parse

__all__ = ["copy_file", "copy_tree", "local_copy"]


def copy_file(src: str, dst: str, *, chunk: int = 4 << 20) -> None:
    """Streams one file from ``src`` to ``dst`` (any file system to any other), ``chunk``
    bytes at a time; raises as :func:`sparktf.storage.open_file`."""
    with open_file(src, "rb") as fin, open_file(dst, "wb") as fout:
        while block := fin.read(chunk):
            fout.write(block)


def copy_tree(src: str, dst: str) -> None:
    """Copies a file or a directory tree (e.g. a SavedModel) between any two file systems."""
    if not isdir(src):
        copy_file(src, dst)
        return
    makedirs(dst)
    for entry in listdir(src):
        copy_tree(entry, join(dst, posixpath.basename(parse(entry).path)))


@contextlib.contextmanager
def local_copy(path: str) -> Iterator[str]:
    """Yields a local path holding ``path``: itself if local, else a temporary download
    (deleted when the block ends). PathNotFoundError if ``path`` does not exist."""
    loc = parse(path)
    if loc.scheme == "file":
        if not os.path.exists(loc.path):
            raise PathNotFoundError(f"no such path {loc.path}")
        yield loc.path
        return
    if not exists(path):
        raise PathNotFoundError(f"no such path {loc.uri}")
    with tempfile.TemporaryDirectory(prefix="sparktf-") as tmp:
        target = os.path.join(tmp, posixpath.basename(loc.path) or "root")
        copy_tree(path, target)
        yield target
