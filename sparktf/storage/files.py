"""Reading and writing files, local, on HDFS or on S3, as streams: nothing is held whole in
memory unless the caller asks for the whole content."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from typing import IO

from sparktf.errors import SparktfValueError
from sparktf.storage import hdfs
from sparktf.storage.errors import (
    PathExistsError,
    PathNotFoundError,
    StorageError,
    StoragePermissionError,
)
from sparktf.storage.hdfs import READ_BLOCK, WebHdfs
from sparktf.storage.native import NativeScan, native_blocks, native_client_for, native_range
from sparktf.storage.s3 import AbortingText, AbortingWriter, S3Object, S3Reader, S3Scan, S3Writer
from sparktf.storage.streams import HdfsReader, HdfsScan, HdfsWriter
from sparktf.storage.uri import Location, parse

__all__ = [
    "iter_blocks",
    "open_file",
    "fill",
    "open_scan",
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
    chunks as they are written. An S3 object is read likewise and written as a multipart
    upload, which appears whole at ``close()``; a ``with`` block that raises aborts it (no
    object, no stored parts). Raises PathNotFoundError, PathExistsError (``overwrite=False``),
    StoragePermissionError, NameNodeUnreachableError or ObjectStoreUnreachableError.
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
    if loc.scheme == "s3":
        return _open_s3(loc, mode, overwrite, encoding)
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


def _open_s3(loc: Location, mode: str, overwrite: bool, encoding: str) -> IO:
    obj = S3Object(loc)
    text = "b" not in mode
    if "r" in mode:
        head = obj.head()
        if head is None:
            if obj.has_children():
                raise IsADirectoryError(f"open: {loc.uri} is a directory")
            raise PathNotFoundError(f"open: no such object {loc.uri}")
        reader = io.BufferedReader(S3Reader(obj, int(head["ContentLength"])), READ_BLOCK)
        return io.TextIOWrapper(reader, encoding=encoding) if text else reader
    if not overwrite and obj.head() is not None:
        raise PathExistsError(f"open: {loc.uri} already exists")
    writer = AbortingWriter(S3Writer(obj, overwrite=overwrite), buffer_size=1 << 20)
    return AbortingText(writer, encoding=encoding) if text else writer


def read_bytes(path: str) -> bytes:
    """The whole content of the file ``path`` (raises as :func:`open_file`)."""
    with open_file(path, "rb") as f:
        return f.read()


def open_scan(path: str, offset: int = 0, length: int | None = None) -> IO[bytes]:
    """An unbuffered, forward-only stream of the file ``path`` from byte ``offset``
    (``length`` bytes, else to the end) whose ``readinto`` fills the caller's buffer straight
    from the transport: on HDFS one streaming request (no status request first; a dropped
    transfer is resumed once), locally the file itself. The cheapest way to scan a file.
    Raises PathNotFoundError, IsADirectoryError, StoragePermissionError or
    NameNodeUnreachableError."""
    loc = parse(path)
    if loc.scheme == "file":
        try:
            f = open(loc.path, "rb", buffering=0)
        except FileNotFoundError as exc:
            raise PathNotFoundError(f"open: no such file {loc.path}") from exc
        except PermissionError as exc:
            raise StoragePermissionError(f"open: permission denied on {loc.path}") from exc
        f.seek(offset)
        return f
    if loc.scheme == "s3":
        obj = S3Object(loc)
        scan = S3Scan(obj, offset, length)
        try:
            scan.start()
        except PathNotFoundError:
            scan.close()
            if obj.has_children():
                raise IsADirectoryError(f"open: {loc.uri} is a directory") from None
            raise
        except BaseException:
            scan.close()
            raise
        return scan
    client = native_client_for(loc)
    if client is not None:
        if offset or length is not None:
            return NativeScan(
                iter([native_range(client, loc, offset, length if length is not None else 1 << 62)])
            )
        return NativeScan(native_blocks(client, loc, READ_BLOCK, None))
    fs = WebHdfs(loc)
    scan = HdfsScan(fs, loc.path, offset, length)
    try:
        scan.start()
    except PathNotFoundError:
        scan.close()
        _raise_for(fs, loc)
        raise
    except BaseException:
        scan.close()
        raise
    return scan


def _raise_for(fs: WebHdfs, loc: Location) -> None:
    """Raises PathNotFoundError or IsADirectoryError when ``loc`` is no file (after a read
    that failed as if it were missing: WebHDFS says the same of a directory)."""
    st = fs.status(loc.path)
    if st is None:
        raise PathNotFoundError(f"open: no such file {loc.uri}")
    if st["type"] != "FILE":
        raise IsADirectoryError(f"open: {loc.uri} is a directory")


def fill(stream, view: memoryview) -> int:
    """Reads into ``view`` until it is full or the stream ends; the bytes read."""
    got = 0
    while got < len(view):
        n = stream.readinto(view[got:])
        if not n:
            break
        got += n
    return got


def iter_blocks(path: str, block: int = READ_BLOCK, *, first: int | None = None) -> Iterator[bytes]:
    """The bytes of the file ``path``, in order, in blocks of ``block`` bytes (the last one
    shorter; the first one ``first`` bytes, when given: a small first block lets a consumer
    start early). On HDFS one streaming request serves the whole file (:func:`open_scan`),
    received straight into each block; locally, plain reads. Blocks are bytes-like
    (``bytearray`` on HDFS). Raises ValueError for a block size below 1, PathNotFoundError,
    IsADirectoryError, StoragePermissionError or NameNodeUnreachableError."""
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
    client = native_client_for(loc) if loc.scheme == "hdfs" else None
    if client is not None:
        yield from native_blocks(client, loc, block, first)
        return
    with open_scan(path) as scan:
        want = first or block
        while True:
            data = bytearray(want)
            got = fill(scan, memoryview(data))
            if got < want:
                del data[got:]
            if data:
                yield data
            if got < want:
                return
            want = block


def read_range(path: str, offset: int, length: int) -> bytes:
    """``length`` bytes of the file ``path`` from byte ``offset`` (fewer at its end), with one
    request on HDFS (e.g. the column chunks of a Parquet row group), received straight into
    the result (a ``bytearray`` on HDFS). Raises ValueError for a negative offset or length,
    else as :func:`open_file`."""
    if offset < 0 or length < 0:
        raise SparktfValueError(f"need offset >= 0 and length >= 0, got {offset}, {length}")
    loc = parse(path)
    if loc.scheme == "file":
        with open_file(path, "rb") as f:
            f.seek(offset)
            return f.read(length)
    if loc.scheme == "s3":
        return _s3_range(loc, offset, length)
    client = native_client_for(loc)
    if client is not None:
        return native_range(client, loc, offset, length)
    if length == 0:
        _raise_for(WebHdfs(loc), loc)
        return b""
    data = bytearray(length)
    try:
        with open_scan(path, offset, length) as scan:
            got = fill(scan, memoryview(data))
    except (PathNotFoundError, IsADirectoryError, StoragePermissionError):
        raise
    except StorageError:  # WebHDFS refuses an offset past the end: there are no bytes there
        st = WebHdfs(loc).status(loc.path)
        if st is None or offset < int(st["length"]):
            raise
        return b""
    del data[got:]
    return data


def _s3_range(loc: Location, offset: int, length: int) -> bytes:
    obj = S3Object(loc)
    head = obj.head() if length == 0 else None
    if length == 0:
        if head is None:
            raise PathNotFoundError(f"open: no such object {loc.uri}")
        return b""
    data = bytearray(length)
    from botocore.exceptions import ClientError

    try:
        with open_scan(loc.uri, offset, length) as scan:
            got = fill(scan, memoryview(data))
    except StorageError as exc:  # S3 refuses a range that starts past the end: no bytes there
        cause = exc.__cause__
        if not isinstance(cause, ClientError) or "InvalidRange" not in str(cause):
            raise
        return b""
    del data[got:]
    return data


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
