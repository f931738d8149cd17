"""Reading and writing files, local or on HDFS, as streams: nothing is held whole in memory
unless the caller asks for the whole content."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from typing import IO

from sparktf.errors import SparktfValueError
from sparktf.storage import hdfs
from sparktf.storage.errors import PathExistsError, PathNotFoundError, StoragePermissionError
from sparktf.storage.hdfs import READ_BLOCK, WebHdfs
from sparktf.storage.native import native_blocks, native_client_for, native_range
from sparktf.storage.streams import HdfsReader, HdfsWriter
from sparktf.storage.uri import parse

__all__ = [
    "iter_blocks",
    "open_file",
    "read_bytes",
    "read_range",
    "read_text",
    "write_bytes",
    "write_text",
]


def open_file(
    path: str, mode: str = "rb", *, overwrite: bool = True, encoding: str = "utf-8"
) -> IO:
    """Opens ``path`` for streaming in mode "rb", "r", "wb" or "w".

    Reading an HDFS file gives a seekable stream that fetches 4 MiB ranges; writing streams
    chunks as they are written. Raises PathNotFoundError, PathExistsError (``overwrite=False``),
    StoragePermissionError or NameNodeUnreachableError.
    """
    if mode not in ("rb", "r", "wb", "w"):
        raise SparktfValueError(f"unsupported mode {mode!r}: use rb, r, wb or w")
    loc = parse(path)
    text = "b" not in mode
    if loc.scheme == "file":
        try:
            if "w" in mode:
                os.makedirs(os.path.dirname(loc.path) or ".", exist_ok=True)
                if not overwrite and os.path.exists(loc.path):
                    raise PathExistsError(f"open: {loc.path} already exists")
            return open(loc.path, mode, encoding=encoding if text else None)
        except FileNotFoundError as exc:
            raise PathNotFoundError(f"open: no such file {loc.path}") from exc
        except PermissionError as exc:
            raise StoragePermissionError(f"open: permission denied on {loc.path}") from exc
    fs = WebHdfs(loc)
    if "r" in mode:
        st = fs.status(loc.path)
        if st is None:
            raise PathNotFoundError(f"open: no such file {loc.uri}")
        if st["type"] != "FILE":
            raise IsADirectoryError(f"open: {loc.uri} is a directory")
        stream: IO = io.BufferedReader(
            HdfsReader(fs, loc.path, st["length"]), buffer_size=hdfs.READ_BLOCK
        )
    else:
        if not overwrite and fs.status(loc.path) is not None:
            raise PathExistsError(f"open: {loc.uri} already exists")
        stream = io.BufferedWriter(HdfsWriter(fs, loc.path, overwrite), buffer_size=1 << 20)
    return io.TextIOWrapper(stream, encoding=encoding) if text else stream


def read_bytes(path: str) -> bytes:
    """The whole content of the file ``path`` (raises as :func:`open_file`)."""
    with open_file(path, "rb") as f:
        return f.read()


def iter_blocks(path: str, block: int = READ_BLOCK, *, first: int | None = None) -> Iterator[bytes]:
    """The bytes of the file ``path``, in order, in blocks of up to ``block`` bytes (the
    first one ``first`` bytes, when given: a small first block lets a consumer start early):
    the fastest way to scan a whole file. On HDFS one streaming WebHDFS request serves the
    whole file (a dropped transfer is resumed once from the byte reached) and each block is
    the response's own bytes, not a copy; locally, plain reads. Raises ValueError for a block
    size below 1, PathNotFoundError, IsADirectoryError, StoragePermissionError or
    NameNodeUnreachableError."""
    if block < 1 or (first is not None and first < 1):
        raise SparktfValueError(f"block sizes must be positive, got {block} and {first}")
    loc = parse(path)
    if loc.scheme == "file":
        with open_file(path, "rb") as f:
            data = f.read(first or block)
            while data:
                yield data
                data = f.read(block)
        return
    client = native_client_for(loc)
    if client is not None:
        yield from native_blocks(client, loc, block, first)
        return
    fs = WebHdfs(loc)
    st = fs.status(loc.path)
    if st is None:
        raise PathNotFoundError(f"open: no such file {loc.uri}")
    if st["type"] != "FILE":
        raise IsADirectoryError(f"open: {loc.uri} is a directory")
    reader = HdfsReader(fs, loc.path, int(st["length"]))
    try:
        data = reader.read(first or block)
        while data:
            yield data
            data = reader.read(block)
    finally:
        reader.close()


def read_range(path: str, offset: int, length: int) -> bytes:
    """``length`` bytes of the file ``path`` from byte ``offset`` (fewer at its end), with one
    request on HDFS (e.g. the column chunks of a Parquet row group). Raises ValueError for a
    negative offset or length, else as :func:`open_file`."""
    if offset < 0 or length < 0:
        raise SparktfValueError(f"need offset >= 0 and length >= 0, got {offset}, {length}")
    loc = parse(path)
    if loc.scheme == "file":
        with open_file(path, "rb") as f:
            f.seek(offset)
            return f.read(length)
    client = native_client_for(loc)
    if client is not None:
        return native_range(client, loc, offset, length)
    fs = WebHdfs(loc)
    st = fs.status(loc.path)
    if st is None:
        raise PathNotFoundError(f"open: no such file {loc.uri}")
    reader = HdfsReader(fs, loc.path, int(st["length"]))
    try:
        reader.seek(offset)
        parts = []
        while length > 0 and (data := reader.read(length)):
            parts.append(data)
            length -= len(data)
    finally:
        reader.close()
    return parts[0] if len(parts) == 1 else b"".join(parts)


def write_bytes(path: str, data: bytes, *, overwrite: bool = True) -> None:
    """Writes ``data`` as the file ``path`` (raises as :func:`open_file`)."""
    with open_file(path, "wb", overwrite=overwrite) as f:
        f.write(data)


def read_text(path: str) -> str:
    """The whole content of the file ``path`` as UTF-8 text (raises as :func:`open_file`)."""
    with open_file(path, "r") as f:
        return f.read()


def write_text(path: str, text: str, *, overwrite: bool = True) -> None:
    """Writes ``text`` as the UTF-8 file ``path`` (raises as :func:`open_file`)."""
    with open_file(path, "w", overwrite=overwrite) as f:
        f.write(text)
