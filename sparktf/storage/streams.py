"""File objects: a seekable read-only base, the two readers every remote store's files share
(:class:`RangedReader`, seekable, and :class:`ForwardScan`, which fills the caller's buffers
straight from the response), and the streams that read and write an HDFS file through WebHDFS
without holding it whole."""

from __future__ import annotations

import contextlib
import io
import queue
import threading
from collections.abc import Iterator

from sparktf.storage.errors import StorageError
from sparktf.storage.hdfs import READ_BLOCK, WebHdfs

__all__ = [
    "ForwardScan",
    "HdfsReader",
    "HdfsScan",
    "HdfsWriter",
    "RangedReader",
    "SeekableReader",
    "raw_into",
]


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


class RangedReader(SeekableReader):
    """A seekable, read-only file read through streaming requests that start at a byte
    (WebHDFS's offset, S3's range). Sequential reads share one stream; a seek elsewhere
    closes it and the next read opens one at the new position, so random access (Parquet
    footers) costs one request per jump and a scan costs one in all. A stream that drops or
    times out is opened again once, at the position reached.

    A subclass gives ``_open_at(pos)`` (a stream from byte ``pos``: ``read(n)``,
    ``close()``), ``_errors(what)`` (a context that names the store's errors) and ``_name``
    (the file, for messages)."""

    _name = ""
    _block = READ_BLOCK  # what readall asks a stream for at once

    def __init__(self, size: int):
        self._size, self._pos = size, 0
        self._stream = None
        self._stream_pos = -1  # file offset the open stream will deliver next

    def _open_at(self, pos: int):
        raise NotImplementedError

    def _errors(self, what: str):
        raise NotImplementedError

    def _close_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()

    def _read_stream(self, want: int) -> bytes:
        if self._stream is None or self._stream_pos != self._pos:
            self._close_stream()
            self._stream, self._stream_pos = self._open_at(self._pos), self._pos
        data = self._stream.read(want)
        self._stream_pos += len(data)
        return data

    def _next(self, want: int) -> bytes:
        """Up to ``want`` bytes from the current position (b"" at the end of the file)."""
        want = min(want, self._size - self._pos)
        if want <= 0:
            return b""
        with self._errors("read"):
            try:
                data = self._read_stream(want)
            except Exception:  # a dropped or timed-out stream: one fresh request from here
                self._close_stream()
                data = self._read_stream(want)
        if not data:
            raise StorageError(
                f"read {self._name}: unexpected end of data at byte {self._pos} of {self._size}"
            )
        self._pos += len(data)
        return data

    def readall(self) -> bytes:
        # RawIOBase.readall would read 8 KiB at a time: take a block instead.
        chunks = []
        while block := self._next(self._block):
            chunks.append(block)
        return b"".join(chunks)

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


class ForwardScan(io.RawIOBase):
    """A forward-only read from byte ``offset`` (``length`` bytes, else to the end): one
    streaming request, sent by ``start`` or the first read, with no status request first (a
    missing file fails on the request itself); ``readinto`` receives straight into the
    caller's buffer. A dropped transfer (an error, or the connection closed before the
    response's declared length) is resumed from the byte reached, once for each stretch
    that made progress.

    A subclass gives ``_open()`` (the request from ``self._pos`` to ``self._end``: the
    stream to close, its ``readinto`` and the offset where its declared length ends, or
    None), ``_errors(what)`` and ``_name`` (as :class:`RangedReader`'s)."""

    _name = ""

    def __init__(self, offset: int = 0, length: int | None = None):
        self._pos, self._end = offset, None if length is None else offset + length
        self._stream = self._into = None
        self._owed: int | None = None  # where the open response's declared length ends
        self._resumed = False

    def _open(self) -> tuple:
        raise NotImplementedError

    def _errors(self, what: str):
        raise NotImplementedError

    def readable(self) -> bool:
        return True

    def _open_stream(self) -> None:
        self._stream, self._into, self._owed = self._open()

    def start(self) -> None:
        """Sends the request now (else the first read does): a missing file fails here."""
        if self._stream is None:
            with self._errors("open"):
                self._open_stream()

    def _receive(self, buffer) -> int:
        # http.client ends a response cut short by a closed connection as if it were
        # complete: a read of nothing before the declared length is a dropped transfer.
        n = self._into(buffer)
        if n == 0 and self._owed is not None and self._pos < self._owed:
            raise StorageError(
                f"read {self._name}: ended at byte {self._pos}, before byte {self._owed}: "
                "the connection closed early"
            )
        return n

    def _close_stream(self) -> None:
        stream, self._stream, self._into = self._stream, None, None
        if stream is not None:
            with contextlib.suppress(Exception):
                stream.close()

    def readinto(self, buffer) -> int:
        if self._end is not None:
            buffer = memoryview(buffer)[: max(0, self._end - self._pos)]
        if not len(buffer):
            return 0
        with self._errors("read"):
            try:
                if self._stream is None:
                    self._open_stream()
                n = self._receive(buffer)
            except Exception:
                if self._resumed or self._stream is None:
                    raise
                self._resumed = True  # a dropped or timed-out stream: one fresh request
                self._close_stream()
                self._open_stream()
                n = self._receive(buffer)
        if n:
            self._resumed = False  # progress since the last resume: the next drop may resume
        self._pos += n
        return n

    def close(self) -> None:
        self._close_stream()
        super().close()


class _Response:
    """A WebHDFS read request's response as a stream: ``read`` and ``close`` (which ends the
    request's context)."""

    def __init__(self, context):
        self._context = context
        self.response = context.__enter__()
        self.read = self.response.read

    def close(self) -> None:
        self._context.__exit__(None, None, None)


class HdfsReader(RangedReader):
    """A seekable, read-only HDFS file read through WebHDFS (:class:`RangedReader`)."""

    def __init__(self, fs: WebHdfs, path: str, size: int):
        super().__init__(size)
        self._fs, self._path = fs, path
        self._name = f"hdfs://{fs.loc.netloc}{path}"

    def _open_at(self, pos: int) -> _Response:
        return _Response(self._fs.data_client.read(self._path, offset=pos))

    def _errors(self, what: str):
        return self._fs.errors(what, self._path)


def raw_into(response):
    """The ``readinto`` of the HTTP response under a urllib3 response (``http.client``'s: it
    receives into the caller's buffer) when its body is not content-encoded, else the
    urllib3 response's own (which reads into a new buffer and copies)."""
    fp = getattr(response, "_fp", None)
    encoded = (getattr(response, "headers", None) or {}).get("content-encoding")
    if fp is not None and hasattr(fp, "readinto") and not encoded:
        return fp.readinto
    return response.readinto


class HdfsScan(ForwardScan):
    """A forward-only read of an HDFS file through WebHDFS (:class:`ForwardScan`)."""

    def __init__(self, fs: WebHdfs, path: str, offset: int = 0, length: int | None = None):
        super().__init__(offset, length)
        self._fs, self._path = fs, path
        self._name = f"hdfs://{fs.loc.netloc}{path}"

    def _open(self) -> tuple:
        length = None if self._end is None else self._end - self._pos
        stream = _Response(self._fs.data_client.read(self._path, offset=self._pos, length=length))
        headers = getattr(stream.response, "headers", None) or {}
        declared = headers.get("content-length")
        encoded = headers.get("content-encoding")
        owed = self._pos + int(declared) if declared and not encoded else None
        return stream, raw_into(stream.response), owed

    def _errors(self, what: str):
        return self._fs.errors(what, self._path)


class HdfsWriter(io.RawIOBase):
    """A write-only HDFS file: bytes are streamed to WebHDFS through a bounded pipe."""

    def __init__(self, fs: WebHdfs, path: str, overwrite: bool):
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
