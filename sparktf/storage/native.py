"""Bulk HDFS reads through ``hdfs-native`` (PyPI ``hdfs-native``), a native client of HDFS's
own RPC and DataNode protocols; docs/hdfs-client.md compares it with WebHDFS.

Set ``SPARKTF_HDFS_CLIENT=native`` to have whole-file scans and range reads (the dataset
readers' bulk reads) go through it. It reads from the NameNode's RPC address (the
``hdfs://host:port`` of the URI); when the package is missing, the port does not accept a
connection within ``SPARKTF_HDFS_TIMEOUT`` or ``SPARKTF_HDFS_USER`` names another user than
the native client would use, WebHDFS serves the reads (with a warning, once).

On a Kerberized HDFS hdfs-native authenticates with the run's delegation token (written to a
private Hadoop credentials file, ``HADOOP_TOKEN_FILE_LOCATION``) or the user's ticket cache;
a keytab login reads through WebHDFS.
"""

from __future__ import annotations

import contextlib
import getpass
import io
import logging
import os
import socket
from collections.abc import Iterator
from functools import lru_cache

from sparktf import scratch
from sparktf.security import kerberos
from sparktf.storage import hdfs
from sparktf.storage.delegation import token_file
from sparktf.storage.errors import PathNotFoundError, StorageError, StoragePermissionError
from sparktf.storage.hdfs import hdfs_user
from sparktf.storage.uri import Location

__all__ = [
    "HDFS_CLIENTS",
    "NativeScan",
    "hdfs_client_kind",
    "native_blocks",
    "native_client",
    "native_client_for",
    "native_errors",
    "native_range",
]

log = logging.getLogger(__name__)

HDFS_CLIENTS = ("webhdfs", "native")


def hdfs_client_kind() -> str:
    """The client of bulk HDFS reads: ``SPARKTF_HDFS_CLIENT``, "webhdfs" (default) or
    "native" (hdfs-native); raises StorageError for another value."""
    kind = os.environ.get("SPARKTF_HDFS_CLIENT", "webhdfs").strip().lower() or "webhdfs"
    if kind not in HDFS_CLIENTS:
        raise StorageError(
            f"SPARKTF_HDFS_CLIENT must be one of {', '.join(HDFS_CLIENTS)}, got {kind!r}"
        )
    return kind


@lru_cache(maxsize=16)
def native_client(netloc: str, user: str, token: str | None = None):
    """An hdfs-native client (cached) of the NameNode at ``netloc`` reading as ``user`` (on a
    Kerberized HDFS: with the delegation token ``token``, else the ticket cache), or None
    when WebHDFS must serve the reads (the reason is logged)."""
    try:
        import hdfs_native
    except ImportError:
        log.warning("SPARKTF_HDFS_CLIENT=native but hdfs-native is not installed: using WebHDFS")
        return None
    if not _native_credentials(user, token, netloc):
        return None
    host, _, port = netloc.rpartition(":") if ":" in netloc else (netloc, "", "8020")
    try:  # hdfs-native retries a refused connection for minutes: fail over at once instead
        socket.create_connection((host, int(port)), timeout=hdfs.HDFS_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        log.warning(
            "HDFS NameNode RPC at %s does not accept connections (%s): using WebHDFS", netloc, exc
        )
        return None
    return hdfs_native.Client(f"hdfs://{netloc}")


def _native_credentials(user: str, token: str | None, netloc: str) -> bool:
    """Whether hdfs-native can act as sparktf does, after pointing it at the run's token."""
    if not kerberos.enabled():
        native_user = os.environ.get("HADOOP_USER_NAME") or getpass.getuser()
        if user != native_user:
            log.warning(
                "SPARKTF_HDFS_USER=%s but hdfs-native would read as %s (HADOOP_USER_NAME or "
                "the login name): using WebHDFS",
                user,
                native_user,
            )
            return False
        return True
    if token:  # hdfs-native reads Hadoop's credentials file
        os.environ["HADOOP_TOKEN_FILE_LOCATION"] = token_file(token, netloc, _token_dir())
        return True
    if kerberos.login().keytab:
        log.warning(
            "SPARKTF_HDFS_CLIENT=native: hdfs-native logs in from a ticket cache or a delegation "
            "token, not from a keytab: using WebHDFS"
        )
        return False
    return True


@lru_cache(maxsize=1)
def _token_dir() -> str:
    """A private scratch directory (mode 700) of this process for its token file: held with
    its owner lock while the process lives (never swept meanwhile), removed on every way out
    (:mod:`sparktf.scratch`), swept by a later run when the process is killed."""
    return scratch.make_dir("sparktf-token-")


def native_client_for(loc: Location):
    """The hdfs-native client of the HDFS location ``loc`` when ``SPARKTF_HDFS_CLIENT`` asks
    for one and it can serve, else None (WebHDFS)."""
    if hdfs_client_kind() != "native":
        return None
    return native_client(loc.netloc, hdfs_user(), os.environ.get(kerberos.TOKEN_ENV) or None)


@contextlib.contextmanager
def native_errors(what: str, loc: Location) -> Iterator[None]:
    """Raises hdfs-native's errors in the block as IsADirectoryError, PathNotFoundError,
    StoragePermissionError or StorageError, naming ``what`` was done to ``loc``."""
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


def native_blocks(client, loc: Location, block: int, first: int | None) -> Iterator[bytes]:
    """The bytes of the file at ``loc`` read by ``client``, in blocks of ``block`` bytes (the
    first one ``first`` bytes when given), as :func:`sparktf.storage.iter_blocks`."""
    with native_errors("open", loc):
        f = client.read(loc.path)
        size = f.size
        chunks = f.read_range_stream(0, size)
    parts: list[bytes] = []  # the packets (64 KiB) of the stream, joined into blocks
    held, want, total = 0, first or block, 0
    while True:
        with native_errors("read", loc):
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


def native_range(client, loc: Location, offset: int, length: int) -> bytes:
    """``length`` bytes of the file at ``loc`` from byte ``offset`` (fewer at its end), read
    by ``client``."""
    with native_errors("read", loc):
        f = client.read(loc.path)
        return f.read_range(offset, max(0, min(length, f.size - offset)))


class NativeScan(io.RawIOBase):
    """A forward-only stream over an iterator of byte blocks (hdfs-native's reads):
    ``readinto`` copies from the block at hand."""

    def __init__(self, blocks: Iterator[bytes]):
        self._blocks = blocks
        self._block = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not len(self._block):
            block = next(self._blocks, None)
            if block is None:
                return 0
            self._block = memoryview(block)
        n = min(len(buffer), len(self._block))
        buffer[:n] = self._block[:n]
        self._block = self._block[n:]
        return n

    def close(self) -> None:
        close = getattr(self._blocks, "close", None)
        if close is not None:
            close()
        super().close()
