"""Paths and file systems: the one module through which sparktf reads and writes files.

A path is a local path, a ``file://`` URI or an ``hdfs://host:port/path`` URI. HDFS is
reached from Python through WebHDFS (the ``hdfs`` package); Spark reaches ``hdfs://``
natively through its own Hadoop client.

WebHDFS address of a NameNode, first match wins:

1. ``SPARKTF_WEBHDFS_URL`` (``http://host:port``), for every ``hdfs://`` URI;
2. ``dfs.namenode.http-address`` in ``$HADOOP_CONF_DIR/hdfs-site.xml`` (or ``hadoop/`` of
   the conf directories, ``sparktf.paths``: a checkout's ``conf/hadoop`` is what
   ``scripts/hdfs.sh start`` writes), for the NameNode named by
   ``fs.defaultFS`` in the ``core-site.xml`` beside it;
3. ``http://HOST:9870`` (Hadoop 3's default port) for ``hdfs://HOST:PORT``.

The HDFS user is ``SPARKTF_HDFS_USER``, else ``HADOOP_USER_NAME``, else the login name.

Whole-file scans and range reads (``iter_blocks``, ``read_range``: the dataset readers' bulk
reads) can go through ``hdfs-native`` instead (a native client of HDFS's own RPC and
DataNode protocols, PyPI ``hdfs-native``; measured faster and lighter here, see
docs/hdfs-client.md): set ``SPARKTF_HDFS_CLIENT=native``. It reads from the NameNode's RPC
address (the ``hdfs://host:port`` of the URI); when the package is missing, the port does not
accept a connection within ``SPARKTF_HDFS_TIMEOUT`` or ``SPARKTF_HDFS_USER`` names another
user than the native client would use, WebHDFS serves the reads (with a warning, once).

Reads and writes stream: files are read in ranges and written through a chunked upload,
never buffered whole. ``publish`` gives an atomic publish: write under a temporary
sibling name, rename into place when the block succeeds, delete the temporary otherwise;
one publish at a time per target (a lock file beside it), the previous version put back under
its name if a replacement fails, and leftovers of crashed publishes cleaned up.
"""

from __future__ import annotations

import contextlib
import getpass
import io
import json
import logging
import os
import posixpath
import re
import shutil
import socket
import threading
import time
import uuid
import xml.etree.ElementTree as ET
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import IO
from urllib.parse import urlparse

from sparktf import paths
from sparktf.errors import SparktfError

log = logging.getLogger(__name__)

# Seconds to wait for the NameNode to accept a connection and to answer a metadata request.
HDFS_TIMEOUT_S = float(os.environ.get("SPARKTF_HDFS_TIMEOUT", "5"))
# Seconds to wait for data to flow on reads and writes (DataNode transfers).
HDFS_DATA_TIMEOUT_S = float(os.environ.get("SPARKTF_HDFS_DATA_TIMEOUT", "120"))
READ_BLOCK = 4 << 20  # bytes fetched per WebHDFS read request


class StorageError(SparktfError, OSError):
    """Base class of the errors raised by this module."""


class UnknownSchemeError(StorageError, ValueError):
    """A URI whose scheme sparktf cannot read or write."""


class NameNodeUnreachableError(StorageError, ConnectionError):
    """The NameNode's WebHDFS endpoint did not answer."""


class PathNotFoundError(StorageError, FileNotFoundError):
    """The path does not exist."""


class PathExistsError(StorageError, FileExistsError):
    """The destination already exists."""


class StoragePermissionError(StorageError, PermissionError):
    """The file system refused the operation."""


class PublishConflictError(StorageError):
    """Another publish to the same target is in progress (its lock file is held)."""


SUPPORTED_SCHEMES = ("", "file", "hdfs")


@dataclass(frozen=True)
class Location:
    """A parsed path: ``scheme`` is "file" or "hdfs"; ``path`` is absolute."""

    scheme: str
    netloc: str
    path: str

    @property
    def uri(self) -> str:
        if self.scheme == "file":
            return self.path
        return f"hdfs://{self.netloc}{self.path}"

    def join(self, *parts: str) -> Location:
        return Location(self.scheme, self.netloc, posixpath.join(self.path, *parts))


def parse(path: str | os.PathLike) -> Location:
    """Parses a local path, ``file://`` or ``hdfs://`` URI; raises UnknownSchemeError else."""
    text = os.fspath(path)
    if not isinstance(text, str) or not text:
        raise ValueError(f"empty or invalid path: {path!r}")
    parsed = urlparse(text)
    # A Windows-like "C:/x" is not a concern here; a single letter scheme would be odd anyway.
    scheme = parsed.scheme.lower()
    if scheme not in SUPPORTED_SCHEMES:
        raise UnknownSchemeError(
            f"unsupported URI scheme {parsed.scheme!r} in {text!r}: "
            "use a local path, file:///abs/path or hdfs://host:port/path"
        )
    if scheme in ("", "file"):
        local = parsed.path if scheme == "file" else text
        return Location("file", "", os.path.abspath(local))
    if not parsed.netloc:
        raise UnknownSchemeError(
            f"hdfs URI without a NameNode address: {text!r} (expected hdfs://host:port/path)"
        )
    return Location("hdfs", parsed.netloc, posixpath.normpath(parsed.path or "/"))


def join(base: str, *parts: str) -> str:
    """Joins path parts onto a path or URI, keeping its scheme."""
    return parse(base).join(*parts).uri if "://" in str(base) else os.path.join(base, *parts)


def is_hdfs(path: str) -> bool:
    return parse(path).scheme == "hdfs"


def spark_uri(path: str | os.PathLike) -> str:
    """``path`` as Spark (and petastorm) must see it: local paths as ``file://`` URIs, so
    that a ``fs.defaultFS`` of HDFS in the Hadoop configuration does not redirect them."""
    loc = parse(path)
    return f"file://{loc.path}" if loc.scheme == "file" else loc.uri


# ----------------------------------------------------------------------------- HDFS config


def _conf_dir() -> Path | None:
    """$HADOOP_CONF_DIR, else ``hadoop/`` of the conf directories (``sparktf.paths``; in a
    checkout, what scripts/hdfs.sh start writes)."""
    local = [d / "hadoop" for d in paths.conf_dirs()]
    for candidate in (os.environ.get("HADOOP_CONF_DIR"), *local):
        if candidate and (Path(candidate) / "hdfs-site.xml").is_file():
            return Path(candidate)
    return None


def _xml_props(path: Path) -> dict[str, str]:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        log.warning("cannot read Hadoop configuration %s: %s", path, exc)
        return {}
    props = {}
    for prop in root.iter("property"):
        name, value = prop.findtext("name"), prop.findtext("value")
        if name and value is not None:
            props[name.strip()] = value.strip()
    return props


def default_fs() -> str | None:
    """``fs.defaultFS`` of the Hadoop client configuration when it is an ``hdfs://`` URI (the
    cluster's file system), else None."""
    conf = _conf_dir()
    if conf is None or not (conf / "core-site.xml").is_file():
        return None
    value = _xml_props(conf / "core-site.xml").get("fs.defaultFS", "")
    return value.rstrip("/") if value.startswith("hdfs://") else None


def webhdfs_url(netloc: str) -> str:
    """The WebHDFS base URL (``http://host:port``) of the NameNode at ``netloc``."""
    explicit = os.environ.get("SPARKTF_WEBHDFS_URL")
    if explicit:
        return explicit.rstrip("/")
    conf = _conf_dir()
    if conf is not None:
        core = _xml_props(conf / "core-site.xml") if (conf / "core-site.xml").is_file() else {}
        default_fs = urlparse(core.get("fs.defaultFS", "")).netloc
        http = _xml_props(conf / "hdfs-site.xml").get("dfs.namenode.http-address")
        if http and (not default_fs or default_fs == netloc):
            return "http://" + http
    host = netloc.split(":")[0]
    return f"http://{host}:9870"


def hdfs_user() -> str:
    return (
        os.environ.get("SPARKTF_HDFS_USER")
        or os.environ.get("HADOOP_USER_NAME")
        or getpass.getuser()
    )


@lru_cache(maxsize=16)
def _client(url: str, user: str, data: bool = False):
    """A WebHDFS client; ``data`` clients wait longer for bytes to flow than metadata ones."""
    import hdfs  # deferred: keeps `import sparktf.storage` light

    read_timeout = HDFS_DATA_TIMEOUT_S if data else HDFS_TIMEOUT_S
    return hdfs.InsecureClient(url, user=user, timeout=(HDFS_TIMEOUT_S, read_timeout))


class _Hdfs:
    """Thin adapter over the `hdfs` package that maps its errors onto this module's."""

    def __init__(self, loc: Location):
        self.loc = loc
        self.url = webhdfs_url(loc.netloc)
        self.client = _client(self.url, hdfs_user())
        self.data_client = _client(self.url, hdfs_user(), data=True)

    @contextlib.contextmanager
    def errors(self, what: str, path: str) -> Iterator[None]:
        import hdfs
        import requests

        try:
            yield
        except (TimeoutError, requests.ConnectionError, requests.Timeout) as exc:
            raise NameNodeUnreachableError(
                f"HDFS NameNode at {self.url} (WebHDFS for hdfs://{self.loc.netloc}) did not "
                f"answer while trying to {what} {path}: {type(exc).__name__}"
            ) from exc
        except hdfs.HdfsError as exc:
            message = str(exc)
            exception = getattr(exc, "exception", "") or ""
            uri = f"hdfs://{self.loc.netloc}{path}"
            if exception == "FileNotFoundException" or "does not exist" in message:
                raise PathNotFoundError(f"{what}: no such path {uri}") from exc
            if (
                exception in ("AccessControlException", "SecurityException")
                or "Permission denied" in message
            ):
                raise StoragePermissionError(
                    f"{what}: permission denied on {uri} for user {hdfs_user()!r}: "
                    f"{message.splitlines()[0]}"
                ) from exc
            if exception == "FileAlreadyExistsException" or "already exists" in message:
                raise PathExistsError(f"{what}: {uri} already exists") from exc
            raise StorageError(
                f"HDFS {what} {uri} failed (WebHDFS at {self.url}): {message.splitlines()[0]}"
            ) from exc

    def status(self, path: str) -> dict | None:
        with self.errors("stat", path):
            return self.client.status(path, strict=False)


def _hdfs(loc: Location) -> _Hdfs:
    return _Hdfs(loc)


# ----------------------------------------------------------------------------- streams


class SeekableReader(io.RawIOBase):
    """A read-only file of ``self._size`` bytes whose position is ``self._pos``: the
    ``readable``/``seekable``/``tell``/``seek`` its subclasses share (they implement
    ``read``)."""

    _size = 0
    _pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._pos, io.SEEK_END: self._size}[whence]
        self._pos = max(0, base + offset)
        return self._pos


class _HdfsReader(SeekableReader):
    """A seekable, read-only HDFS file read through WebHDFS.

    Sequential reads share one streaming request (one HTTP response read as it arrives); a
    seek elsewhere closes it and the next read opens a new one at the new position, so
    random access (Parquet footers) costs one request per jump and a scan costs one in all.
    """

    def __init__(self, fs: _Hdfs, path: str, size: int):
        self._fs, self._path, self._size, self._pos = fs, path, size, 0
        self._stream = None  # (context manager, raw response) of the open request
        self._stream_pos = -1  # file offset the open request will deliver next

    def readall(self) -> bytes:
        # RawIOBase.readall would read 8 KiB at a time: take READ_BLOCK instead.
        chunks = []
        while block := self.read(READ_BLOCK):
            chunks.append(block)
        return b"".join(chunks)

    def _close_stream(self) -> None:
        if self._stream is not None:
            context, _ = self._stream
            self._stream = None
            with contextlib.suppress(Exception):
                context.__exit__(None, None, None)

    def _read_stream(self, want: int) -> bytes:
        if self._stream is None or self._stream_pos != self._pos:
            self._close_stream()
            context = self._fs.data_client.read(self._path, offset=self._pos)
            self._stream = (context, context.__enter__())
            self._stream_pos = self._pos
        data = self._stream[1].read(want)
        self._stream_pos += len(data)
        return data

    def _next(self, want: int) -> bytes:
        """Up to ``want`` bytes from the current position (b"" at the end of the file)."""
        want = min(want, self._size - self._pos)
        if want <= 0:
            return b""
        with self._fs.errors("read", self._path):
            try:
                data = self._read_stream(want)
            except Exception:  # a dropped or timed-out stream: one fresh request from here
                self._close_stream()
                data = self._read_stream(want)
        if not data:
            raise StorageError(
                f"read hdfs://{self._fs.loc.netloc}{self._path}: unexpected "
                f"end of data at byte {self._pos} of {self._size}"
            )
        self._pos += len(data)
        return data

    def read(self, size: int = -1) -> bytes:
        # RawIOBase.read would copy twice (into a bytearray, then into bytes): hand the
        # response's bytes over as they are.
        if size is None or size < 0:
            return self.readall()
        return self._next(size)

    def readinto(self, buffer) -> int:
        data = self._next(len(buffer))
        n = len(data)
        buffer[:n] = data
        return n

    def close(self) -> None:
        self._close_stream()
        super().close()


class _HdfsWriter(io.RawIOBase):
    """A write-only HDFS file: bytes are streamed to WebHDFS through a bounded pipe."""

    def __init__(self, fs: _Hdfs, path: str, overwrite: bool):
        import queue

        self._fs, self._path = fs, path
        self._queue: queue.Queue[bytes | None] = queue.Queue(maxsize=8)
        self._error: BaseException | None = None
        self._ended = False  # the end marker (None) has been taken off the queue
        self._thread = threading.Thread(
            target=self._upload, args=(overwrite,), daemon=True, name=f"hdfs-write {path}"
        )
        self._thread.start()

    def _chunks(self) -> Iterator[bytes]:
        while (chunk := self._queue.get()) is not None:
            yield chunk
        self._ended = True

    def _upload(self, overwrite: bool) -> None:
        try:
            with self._fs.errors("write", self._path):
                self._fs.data_client.write(self._path, data=self._chunks(), overwrite=overwrite)
        except BaseException as exc:  # re-raised in the writing thread
            self._error = exc
            while not self._ended:  # drain so that the writing thread never blocks
                self._ended = self._queue.get() is None

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        if self._error is not None:
            raise self._error
        chunk = bytes(data)
        if chunk:
            self._queue.put(chunk)
        return len(chunk)

    def close(self) -> None:
        if self.closed:
            return
        self._queue.put(None)
        self._thread.join()
        super().close()
        if self._error is not None:
            raise self._error


def open_file(
    path: str, mode: str = "rb", *, overwrite: bool = True, encoding: str = "utf-8"
) -> IO:
    """Opens ``path`` for streaming in mode "rb", "r", "wb" or "w".

    Reading an HDFS file gives a seekable stream that fetches 4 MiB ranges; writing streams
    chunks as they are written. Raises PathNotFoundError, PathExistsError (``overwrite=False``),
    StoragePermissionError or NameNodeUnreachableError.
    """
    if mode not in ("rb", "r", "wb", "w"):
        raise ValueError(f"unsupported mode {mode!r}: use rb, r, wb or w")
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
    fs = _hdfs(loc)
    if "r" in mode:
        st = fs.status(loc.path)
        if st is None:
            raise PathNotFoundError(f"open: no such file {loc.uri}")
        if st["type"] != "FILE":
            raise IsADirectoryError(f"open: {loc.uri} is a directory")
        stream: IO = io.BufferedReader(
            _HdfsReader(fs, loc.path, st["length"]), buffer_size=READ_BLOCK
        )
    else:
        if not overwrite and fs.status(loc.path) is not None:
            raise PathExistsError(f"open: {loc.uri} already exists")
        stream = io.BufferedWriter(_HdfsWriter(fs, loc.path, overwrite), buffer_size=1 << 20)
    return io.TextIOWrapper(stream, encoding=encoding) if text else stream


def read_bytes(path: str) -> bytes:
    with open_file(path, "rb") as f:
        return f.read()


# ----------------------------------------------------------------------------- hdfs-native

HDFS_CLIENTS = ("webhdfs", "native")


def hdfs_client_kind() -> str:
    """The client of bulk HDFS reads: ``SPARKTF_HDFS_CLIENT``, "webhdfs" (default) or
    "native" (hdfs-native)."""
    kind = os.environ.get("SPARKTF_HDFS_CLIENT", "webhdfs").strip().lower() or "webhdfs"
    if kind not in HDFS_CLIENTS:
        raise StorageError(
            f"SPARKTF_HDFS_CLIENT must be one of {', '.join(HDFS_CLIENTS)}, got {kind!r}"
        )
    return kind


@lru_cache(maxsize=16)
def _native_client(netloc: str, user: str):
    """An hdfs-native client of the NameNode at ``netloc``, or None (WebHDFS then)."""
    try:
        import hdfs_native
    except ImportError:
        log.warning("SPARKTF_HDFS_CLIENT=native but hdfs-native is not installed: using WebHDFS")
        return None
    native_user = os.environ.get("HADOOP_USER_NAME") or getpass.getuser()
    if user != native_user:
        log.warning(
            "SPARKTF_HDFS_USER=%s but hdfs-native would read as %s (HADOOP_USER_NAME or the "
            "login name): using WebHDFS",
            user,
            native_user,
        )
        return None
    host, _, port = netloc.rpartition(":") if ":" in netloc else (netloc, "", "8020")
    try:  # hdfs-native retries a refused connection for minutes: fail over at once instead
        socket.create_connection((host, int(port)), timeout=HDFS_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        log.warning(
            "HDFS NameNode RPC at %s does not accept connections (%s): using WebHDFS", netloc, exc
        )
        return None
    return hdfs_native.Client(f"hdfs://{netloc}")


def _native(loc: Location):
    return _native_client(loc.netloc, hdfs_user()) if hdfs_client_kind() == "native" else None


@contextlib.contextmanager
def _native_errors(what: str, loc: Location) -> Iterator[None]:
    try:
        yield
    except FileNotFoundError as exc:
        if "not a file" in str(exc):
            raise IsADirectoryError(f"{what}: {loc.uri} is a directory") from exc
        raise PathNotFoundError(f"{what}: no such file {loc.uri}") from exc
    except PermissionError as exc:
        raise StoragePermissionError(
            f"{what}: permission denied on {loc.uri} for user {hdfs_user()!r}"
        ) from exc
    except OSError as exc:
        if isinstance(exc, StorageError):
            raise
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise StorageError(f"HDFS {what} {loc.uri} failed (hdfs-native): {first}") from exc


def _native_blocks(client, loc: Location, block: int, first: int | None) -> Iterator[bytes]:
    with _native_errors("open", loc):
        f = client.read(loc.path)
        size = f.size
        chunks = f.read_range_stream(0, size)
    parts: list[bytes] = []  # the packets (64 KiB) of the stream, joined into blocks
    held, want, total = 0, first or block, 0
    while True:
        with _native_errors("read", loc):
            chunk = next(chunks, None)
        if chunk is None:
            break
        while held + len(chunk) >= want:  # a block is complete: cut the packet at its end
            need = want - held
            parts.append(chunk[:need])
            yield parts[0] if len(parts) == 1 else b"".join(parts)
            total += want
            parts, held, want, chunk = [], 0, block, chunk[need:]
        if chunk:
            parts.append(chunk)
            held += len(chunk)
    if parts:
        yield parts[0] if len(parts) == 1 else b"".join(parts)
        total += held
    if total != size:
        raise StorageError(f"read {loc.uri} (hdfs-native): got {total} of {size} bytes")


def iter_blocks(path: str, block: int = READ_BLOCK, *, first: int | None = None) -> Iterator[bytes]:
    """The bytes of the file ``path``, in order, in blocks of up to ``block`` bytes (the
    first one ``first`` bytes, when given: a small first block lets a consumer start early):
    the fastest way to scan a whole file. On HDFS one streaming WebHDFS request serves the
    whole file (a dropped transfer is resumed once from the byte reached) and each block is
    the response's own bytes, not a copy; locally, plain reads."""
    if block < 1 or (first is not None and first < 1):
        raise ValueError(f"block sizes must be positive, got {block} and {first}")
    loc = parse(path)
    if loc.scheme == "file":
        with open_file(path, "rb") as f:
            data = f.read(first or block)
            while data:
                yield data
                data = f.read(block)
        return
    client = _native(loc)
    if client is not None:
        yield from _native_blocks(client, loc, block, first)
        return
    fs = _hdfs(loc)
    st = fs.status(loc.path)
    if st is None:
        raise PathNotFoundError(f"open: no such file {loc.uri}")
    if st["type"] != "FILE":
        raise IsADirectoryError(f"open: {loc.uri} is a directory")
    reader = _HdfsReader(fs, loc.path, int(st["length"]))
    try:
        data = reader.read(first or block)
        while data:
            yield data
            data = reader.read(block)
    finally:
        reader.close()


def read_range(path: str, offset: int, length: int) -> bytes:
    """``length`` bytes of the file ``path`` from byte ``offset`` (fewer at its end), with one
    request on HDFS (e.g. the column chunks of a Parquet row group)."""
    if offset < 0 or length < 0:
        raise ValueError(f"need offset >= 0 and length >= 0, got {offset}, {length}")
    loc = parse(path)
    if loc.scheme == "file":
        with open_file(path, "rb") as f:
            f.seek(offset)
            return f.read(length)
    client = _native(loc)
    if client is not None:
        with _native_errors("read", loc):
            f = client.read(loc.path)
            return f.read_range(offset, max(0, min(length, f.size - offset)))
    fs = _hdfs(loc)
    st = fs.status(loc.path)
    if st is None:
        raise PathNotFoundError(f"open: no such file {loc.uri}")
    reader = _HdfsReader(fs, loc.path, int(st["length"]))
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
    with open_file(path, "wb", overwrite=overwrite) as f:
        f.write(data)


def read_text(path: str) -> str:
    with open_file(path, "r") as f:
        return f.read()


def write_text(path: str, text: str, *, overwrite: bool = True) -> None:
    with open_file(path, "w", overwrite=overwrite) as f:
        f.write(text)


# ----------------------------------------------------------------------------- namespace


def exists(path: str) -> bool:
    loc = parse(path)
    if loc.scheme == "file":
        return os.path.exists(loc.path)
    return _hdfs(loc).status(loc.path) is not None


def isdir(path: str) -> bool:
    loc = parse(path)
    if loc.scheme == "file":
        return os.path.isdir(loc.path)
    st = _hdfs(loc).status(loc.path)
    return st is not None and st["type"] == "DIRECTORY"


def size(path: str) -> int:
    """Size in bytes of a file."""
    loc = parse(path)
    if loc.scheme == "file":
        try:
            return os.path.getsize(loc.path)
        except FileNotFoundError as exc:
            raise PathNotFoundError(f"size: no such file {loc.path}") from exc
    st = _hdfs(loc).status(loc.path)
    if st is None:
        raise PathNotFoundError(f"size: no such file {loc.uri}")
    return int(st["length"])


def listdir(path: str) -> list[str]:
    """Full paths (same scheme as ``path``) of the entries of a directory, sorted."""
    loc = parse(path)
    if loc.scheme == "file":
        try:
            names = os.listdir(loc.path)
        except FileNotFoundError as exc:
            raise PathNotFoundError(f"list: no such directory {loc.path}") from exc
        except NotADirectoryError as exc:
            raise NotADirectoryError(f"list: {loc.path} is not a directory") from exc
    else:
        fs = _hdfs(loc)
        with fs.errors("list", loc.path):
            names = fs.client.list(loc.path)
    return sorted(loc.join(name).uri for name in names)


def walk_files(path: str) -> list[str]:
    """All files below ``path`` (recursively), sorted."""
    files = []
    for entry in listdir(path):
        (files.extend(walk_files(entry)) if isdir(entry) else files.append(entry))
    return sorted(files)


def makedirs(path: str) -> None:
    loc = parse(path)
    if loc.scheme == "file":
        try:
            os.makedirs(loc.path, exist_ok=True)
        except PermissionError as exc:
            raise StoragePermissionError(f"mkdir: permission denied on {loc.path}") from exc
        return
    fs = _hdfs(loc)
    with fs.errors("mkdir", loc.path):
        fs.client.makedirs(loc.path)


def delete(path: str, *, recursive: bool = True, missing_ok: bool = True) -> None:
    loc = parse(path)
    if loc.scheme == "file":
        if os.path.isdir(loc.path) and not os.path.islink(loc.path):
            if not recursive and os.listdir(loc.path):
                raise StorageError(f"delete: {loc.path} is a non-empty directory")
            shutil.rmtree(loc.path)
        elif os.path.lexists(loc.path):
            os.remove(loc.path)
        elif not missing_ok:
            raise PathNotFoundError(f"delete: no such path {loc.path}")
        return
    fs = _hdfs(loc)
    with fs.errors("delete", loc.path):
        deleted = fs.client.delete(loc.path, recursive=recursive)
    if not deleted and not missing_ok:
        raise PathNotFoundError(f"delete: no such path {loc.uri}")


def rename(src: str, dst: str) -> None:
    """Renames ``src`` to ``dst`` on the same file system; ``dst`` must not exist."""
    s, d = parse(src), parse(dst)
    if (s.scheme, s.netloc) != (d.scheme, d.netloc):
        raise StorageError(f"rename across file systems: {s.uri} -> {d.uri}")
    if exists(dst):
        raise PathExistsError(f"rename: destination {d.uri} already exists")
    if s.scheme == "file":
        try:
            os.makedirs(os.path.dirname(d.path), exist_ok=True)
            os.rename(s.path, d.path)
        except FileNotFoundError as exc:
            raise PathNotFoundError(f"rename: no such path {s.path}") from exc
        return
    fs = _hdfs(s)
    if fs.status(s.path) is None:
        raise PathNotFoundError(f"rename: no such path {s.uri}")
    with fs.errors("rename", s.path):
        fs.client.makedirs(posixpath.dirname(d.path))
        fs.client.rename(s.path, d.path)


def temp_sibling(path: str, tag: str = "tmp") -> str:
    """A fresh hidden name beside ``path`` (same directory, so a rename is atomic)."""
    loc = parse(path)
    name = f".{posixpath.basename(loc.path)}.{tag}-{uuid.uuid4().hex[:12]}"
    return Location(loc.scheme, loc.netloc, posixpath.join(posixpath.dirname(loc.path), name)).uri


# ----------------------------------------------------------------------------- publish

# Leftovers of a publish that died (temporary copies, set-aside old versions, lock files) are
# removed by the next publish to the same target, and by any publish in the same directory
# once they are older than this (seconds) and their own target is not being published.
LEFTOVER_AGE_S = float(os.environ.get("SPARKTF_PUBLISH_LEFTOVER_AGE", str(24 * 3600)))
# A publish refreshes the modification time of its lock file every LOCK_HEARTBEAT_S; a lock
# not refreshed for LOCK_STALE_S (or whose process is gone, on this host) is stale and broken.
LOCK_HEARTBEAT_S = 30.0
LOCK_STALE_S = float(os.environ.get("SPARKTF_PUBLISH_LOCK_STALE", "600"))
LOCK_TAG = "publish-lock"
_LEFTOVER_RE = re.compile(r"^\.(?P<target>.+)\.(?P<tag>tmp|old)-[0-9a-f]{12}$")
_LOCK_RE = re.compile(r"^\.(?P<target>.+)\." + re.escape(LOCK_TAG) + "$")
_HELD_LOCKS: set[str] = set()  # tokens of the locks this process holds
# For tests only: called as ``hook(path, tmp, old)`` between the two renames of an overwrite
# (the old version set aside, the new one not yet in place).
_swap_hook: Callable[[str, str, str], None] | None = None


def lock_path(path: str) -> str:
    """The lock file of publishes to ``path``: ``.<name>.publish-lock`` beside it."""
    loc = parse(path)
    name = f".{posixpath.basename(loc.path)}.{LOCK_TAG}"
    return Location(loc.scheme, loc.netloc, posixpath.join(posixpath.dirname(loc.path), name)).uri


def _entries(directory: str) -> dict[str, tuple[bool, float]]:
    """``{name: (is a directory, modification time in s)}`` of a directory ({} if missing)."""
    loc = parse(directory)
    if loc.scheme == "file":
        found = {}
        try:
            with os.scandir(loc.path) as it:
                for entry in it:
                    with contextlib.suppress(FileNotFoundError):
                        st = entry.stat(follow_symlinks=False)
                        found[entry.name] = (entry.is_dir(follow_symlinks=False), st.st_mtime)
        except (FileNotFoundError, NotADirectoryError):
            return {}
        return found
    fs = _hdfs(loc)
    try:
        with fs.errors("list", loc.path):
            listing = fs.client.list(loc.path, status=True)
    except PathNotFoundError:
        return {}
    return {
        name: (st["type"] == "DIRECTORY", st["modificationTime"] / 1000.0) for name, st in listing
    }


def _create_exclusive(path: str, data: bytes) -> None:
    """Creates the file ``path`` holding ``data``; PathExistsError if it exists (atomic: an
    ``O_EXCL`` open locally, a create without overwrite at the HDFS NameNode)."""
    loc = parse(path)
    if loc.scheme == "file":
        makedirs(posixpath.dirname(loc.path))
        try:
            fd = os.open(loc.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError as exc:
            raise PathExistsError(f"create: {loc.path} already exists") from exc
        except PermissionError as exc:
            raise StoragePermissionError(f"create: permission denied on {loc.path}") from exc
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return
    fs = _hdfs(loc)
    with fs.errors("create", loc.path):
        fs.client.write(loc.path, data=data, overwrite=False)


def _mtime(path: str) -> float | None:
    """Modification time (s) of ``path``, None if it does not exist."""
    loc = parse(path)
    if loc.scheme == "file":
        try:
            return os.stat(loc.path, follow_symlinks=False).st_mtime
        except FileNotFoundError:
            return None
    st = _hdfs(loc).status(loc.path)
    return None if st is None else st["modificationTime"] / 1000.0


def _touch(path: str) -> None:
    loc = parse(path)
    if loc.scheme == "file":
        os.utime(loc.path)
        return
    fs = _hdfs(loc)
    with fs.errors("touch", loc.path):
        fs.client.set_times(loc.path, modification_time=int(time.time() * 1000))


@lru_cache(maxsize=1)
def _host_id() -> str:
    """This host (and PID namespace): where a lock's PID can be checked."""
    parts = [socket.gethostname()]
    with contextlib.suppress(OSError):
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    with contextlib.suppress(OSError):
        parts.append(os.readlink("/proc/self/ns/pid"))
    return "/".join(parts)


def _pid_alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return True  # cannot tell: only the heartbeat age decides
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class _PublishLock:
    """The lock of publishes to one target: a file created exclusively beside it, holding
    the owner's host, PID and a token, its modification time refreshed by a heartbeat."""

    def __init__(self, target: str):
        self.target = target
        self.path = lock_path(target)
        self.token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> tuple[dict | None, float] | None:
        """(owner record or None if unreadable, modification time), None when absent."""
        mtime = _mtime(self.path)
        if mtime is None:
            return None
        try:
            owner = json.loads(read_text(self.path))
        except PathNotFoundError:
            return None
        except (ValueError, StorageError):
            owner = None
        return (owner if isinstance(owner, dict) else None), mtime

    def _stale(self, owner: dict | None, mtime: float) -> str | None:
        """Why a lock is stale, or None when its publish may still be running."""
        age = time.time() - mtime
        if age > LOCK_STALE_S:
            return f"not refreshed for {age:.0f} s"
        if owner and owner.get("host_id") == _host_id():
            pid = owner.get("pid")
            if pid == os.getpid() and owner.get("token") not in _HELD_LOCKS:
                return f"left behind by this process ({pid})"
            if pid != os.getpid() and not _pid_alive(pid):
                return f"its process {pid} on {owner.get('host')} is gone"
        return None

    def acquire(self) -> _PublishLock:
        """Takes the lock, breaking a stale one; PublishConflictError if it is held."""
        record = {
            "token": self.token,
            "host": socket.gethostname(),
            "host_id": _host_id(),
            "pid": os.getpid(),
            "started": time.time(),
        }
        data = json.dumps(record).encode()
        for attempt in range(3):
            try:
                _create_exclusive(self.path, data)
                break
            except PathExistsError:
                seen = self._read()
                if seen is None:
                    continue  # released meanwhile: try again
                owner, mtime = seen
                reason = self._stale(owner, mtime)
                if reason is None or attempt == 2:
                    who = (
                        f"process {owner.get('pid')} on {owner.get('host')}, started "
                        + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner["started"]))
                        if owner and "started" in owner
                        else "an unknown process"
                    )
                    raise PublishConflictError(
                        f"publish {self.target}: another publish to this path is in progress "
                        f"({who}; lock {self.path}); retry once it has finished "
                        f"(a lock not refreshed for {LOCK_STALE_S:.0f} s is broken)"
                    ) from None
                again = self._read()  # break it only if it is still the stale one
                if again is not None and (again[0] or {}).get("token") == (owner or {}).get(
                    "token"
                ):
                    log.warning("breaking the stale publish lock %s (%s)", self.path, reason)
                    delete(self.path)
        else:
            raise PublishConflictError(f"publish {self.target}: could not take {self.path}")
        _HELD_LOCKS.add(self.token)
        self._thread = threading.Thread(
            target=self._heartbeat, daemon=True, name=f"publish-lock {self.target}"
        )
        self._thread.start()
        return self

    def _heartbeat(self) -> None:
        while not self._stop.wait(LOCK_HEARTBEAT_S):
            try:
                _touch(self.path)
            except Exception as exc:  # a missed beat only ages the lock
                log.warning("could not refresh the publish lock %s: %s", self.path, exc)

    def verify(self) -> None:
        """Raises PublishConflictError when the lock is no longer this publish's (it was
        broken as stale and taken by another publish)."""
        seen = self._read()
        if seen is None or (seen[0] or {}).get("token") != self.token:
            raise PublishConflictError(
                f"publish {self.target}: lost the lock {self.path} (broken as stale by another "
                "publish?); not replacing the target"
            )

    def release(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            seen = self._read()
            if seen is not None and (seen[0] or {}).get("token") == self.token:
                delete(self.path)
        except Exception as exc:  # a lock left behind is broken as stale later
            log.warning("could not remove the publish lock %s: %s", self.path, exc)
        finally:
            _HELD_LOCKS.discard(self.token)


def _recover(path: str, entries: dict[str, tuple[bool, float]] | None = None) -> None:
    """Cleans the leftovers of crashed publishes to ``path`` (its lock held): a previous
    version set aside by a publish that died mid-swap is renamed back when ``path`` is
    missing; other temporaries and set-aside versions are deleted. ``entries``: the
    directory's listing (``_entries``) if already at hand."""
    loc = parse(path)
    name = posixpath.basename(loc.path)
    if entries is None:
        entries = _entries(_parent(loc))
    own = {
        n: e
        for n, e in entries.items()
        if (m := _LEFTOVER_RE.match(n)) is not None and m["target"] == name
    }
    olds = [n for n in own if _LEFTOVER_RE.match(n)["tag"] == "old"]
    if olds and name not in entries:
        newest = max(olds, key=lambda n: own[n][1])
        log.warning(
            "%s is missing after a publish died while replacing it: restoring its previous "
            "version from %s",
            loc.uri,
            newest,
        )
        rename(_sibling(loc, newest), loc.uri)
        del own[newest]
    for n in sorted(own):
        leftover = _sibling(loc, n)
        try:
            delete(leftover)
            log.info("removed %s, left by a publish of %s that did not finish", leftover, loc.uri)
        except StorageError as exc:
            log.warning("could not remove the leftover %s: %s", leftover, exc)


def _sibling(loc: Location, name: str) -> str:
    """The entry ``name`` beside ``loc``."""
    return Location(loc.scheme, loc.netloc, posixpath.join(posixpath.dirname(loc.path), name)).uri


def _parent(loc: Location) -> str:
    return Location(loc.scheme, loc.netloc, posixpath.dirname(loc.path)).uri


def _clean_aged(path: str, entries: dict[str, tuple[bool, float]]) -> None:
    """Cleans the leftovers older than LEFTOVER_AGE_S of other targets in ``path``'s
    directory (listed in ``entries``), each under its target's lock (a publish in progress
    is left alone)."""
    loc = parse(path)
    name = posixpath.basename(loc.path)
    now = time.time()
    targets = set()
    for n, (_, mtime) in entries.items():
        m = _LEFTOVER_RE.match(n) or _LOCK_RE.match(n)
        if m is not None and m["target"] != name and now - mtime > LEFTOVER_AGE_S:
            targets.add(m["target"])
    for target in sorted(targets):
        other = _sibling(loc, target)
        try:
            lock = _PublishLock(other).acquire()
        except PublishConflictError:
            log.info("leftovers of %s kept: a publish of it is in progress", other)
            continue
        except StorageError as exc:
            log.warning("could not clean the leftovers of %s: %s", other, exc)
            continue
        try:
            _recover(other)
        except StorageError as exc:
            log.warning("could not clean the leftovers of %s: %s", other, exc)
        finally:
            lock.release()


def _swap(path: str, tmp: str) -> None:
    """Replaces ``path`` by ``tmp``: the old version is set aside, the new one renamed in,
    then the old one deleted. If the new one cannot be renamed in, the old one is renamed
    back under its name before the error propagates. A local file is replaced in one step
    (``os.replace``): readers never find it missing."""
    target, new = parse(path), parse(tmp)
    if target.scheme == "file" and os.path.isfile(new.path) and not os.path.isdir(target.path):
        try:
            os.replace(new.path, target.path)
        except PermissionError as exc:
            raise StoragePermissionError(f"replace: permission denied on {target.path}") from exc
        return
    old = temp_sibling(path, "old")
    rename(path, old)
    try:
        if _swap_hook is not None:
            _swap_hook(path, tmp, old)
        rename(tmp, path)
    except BaseException as exc:
        try:
            rename(old, path)
        except BaseException as again:
            log.error(
                "publish %s failed and its previous version could not be put back: it is at "
                "%s (the next publish to %s restores it): %s",
                path,
                old,
                path,
                again,
            )
            exc.add_note(
                f"the previous version of {path} is at {old} (restored by the next "
                f"publish to {path})"
            )
        else:
            log.error(
                "publish %s failed while renaming the new version in (%s): the previous "
                "version is back under its name",
                path,
                exc,
            )
        raise
    try:
        delete(old)
    except StorageError as exc:
        log.warning("published %s but could not delete its previous version %s: %s", path, old, exc)


@contextlib.contextmanager
def publish(path: str, *, overwrite: bool = False) -> Iterator[str]:
    """Atomic publish: yields a temporary sibling path to write (a file or a directory).

    When the block succeeds the temporary is renamed to ``path``; when it raises, the
    temporary is deleted and ``path`` is untouched. An existing ``path`` is refused up front
    unless ``overwrite``: then it is replaced only after the new content is complete, and if
    the new version cannot be renamed in, the old one is renamed back under its name.

    One publish at a time per target: a lock file ``.<name>.publish-lock`` beside ``path``
    (created exclusively, refreshed while the publish runs) makes a concurrent publish fail
    with PublishConflictError. Leftovers of publishes that died (``.<name>.tmp-*``,
    ``.<name>.old-*``, stale locks) are cleaned by the next publish to ``path``, and those
    of other targets in the same directory once older than LEFTOVER_AGE_S.
    """
    if not overwrite and exists(path):
        raise PathExistsError(f"{path} already exists (pass overwrite to replace it)")
    lock = _PublishLock(path).acquire()
    try:
        entries = _entries(_parent(parse(path)))
        _recover(path, entries)
        _clean_aged(path, entries)
        if not overwrite and exists(path):
            raise PathExistsError(f"{path} already exists (pass overwrite to replace it)")
        tmp = temp_sibling(path)
        try:
            yield tmp
            if not exists(tmp):
                raise StorageError(f"publish {path}: nothing was written to {tmp}")
            lock.verify()
            if exists(path):
                if not overwrite:
                    raise PathExistsError(f"publish {path}: it was created meanwhile")
                _swap(path, tmp)
            else:
                rename(tmp, path)
            log.info("published %s", path)
        except BaseException:
            with contextlib.suppress(Exception):
                delete(tmp)
            raise
    finally:
        lock.release()


# ----------------------------------------------------------------------------- copies


def copy_file(src: str, dst: str, *, chunk: int = 4 << 20) -> None:
    """Streams one file from ``src`` to ``dst`` (any file system to any other)."""
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
    """Yields a local path holding ``path``: itself if local, else a temporary download."""
    loc = parse(path)
    if loc.scheme == "file":
        if not os.path.exists(loc.path):
            raise PathNotFoundError(f"no such path {loc.path}")
        yield loc.path
        return
    if not exists(path):
        raise PathNotFoundError(f"no such path {loc.uri}")
    import tempfile

    with tempfile.TemporaryDirectory(prefix="sparktf-") as tmp:
        target = os.path.join(tmp, posixpath.basename(loc.path) or "root")
        copy_tree(path, target)
        yield target


def fsspec_filesystem(path: str):
    """An fsspec file system for ``path``'s file system (for pyarrow and petastorm).

    For HDFS, fsspec's WebHDFS file system whose files fetch each range with one streamed
    read of the response (fsspec's own reads it 10 KiB at a time) and read ahead
    ``READ_BLOCK`` bytes.
    """
    import fsspec

    loc = parse(path)
    if loc.scheme == "file":
        return fsspec.filesystem("file")
    url = urlparse(webhdfs_url(loc.netloc))
    return _webhdfs_class()(
        host=url.hostname,
        port=url.port or 9870,
        user=hdfs_user(),
        use_listings_cache=False,
    )


@lru_cache(maxsize=1)
def _webhdfs_class():
    from fsspec.implementations.webhdfs import WebHDFile, WebHDFS

    class _WebHDFile(WebHDFile):
        def _fetch_range(self, start, end):
            start, end = max(start, 0), min(self.size, end)
            if start >= end:
                return b""
            out = self.fs._call(
                "OPEN", path=self.path, offset=start, length=end - start, redirect=False
            )
            if "Location" not in out.headers:
                return out.content
            location = self.fs._apply_proxy(out.headers["Location"])
            with self.fs.session.get(
                location, stream=True, timeout=(HDFS_TIMEOUT_S, HDFS_DATA_TIMEOUT_S)
            ) as response:
                response.raise_for_status()
                parts, want = [], end - start
                while want > 0 and (data := response.raw.read(want)):
                    parts.append(data)
                    want -= len(data)
            if want > 0:
                raise StorageError(
                    f"read {self.path} (WebHDFS): the DataNode sent {end - start - want} "
                    f"of {end - start} bytes from byte {start}"
                )
            return parts[0] if len(parts) == 1 else b"".join(parts)

    class _WebHDFS(WebHDFS):
        """fsspec's WebHDFS with streamed range reads (see ``fsspec_filesystem``)."""

        def _open(self, path, mode="rb", block_size=None, autocommit=True, **kwargs):
            if "r" not in mode:
                return super()._open(path, mode, block_size, autocommit, **kwargs)
            return _WebHDFile(
                self,
                path,
                mode=mode,
                block_size=block_size or READ_BLOCK,
                tempdir=self.tempdir,
                autocommit=autocommit,
                **kwargs,
            )

    return _WebHDFS
