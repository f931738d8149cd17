"""File objects: a seekable read-only base, and the streams that read and write an HDFS file
through WebHDFS without holding it whole (:class:`HdfsScan` fills the caller's buffers straight
from the DataNode's response)."""

from __future__ import annotations

import contextlib
import io
import queue
import threading
from collections.abc import Iterator

from sparktf.storage import hdfs
from sparktf.storage.errors import StorageError
from sparktf.storage.hdfs import WebHdfs

__all__ = ["HdfsReader", "HdfsScan", "HdfsWriter", "SeekableReader"]


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


class HdfsReader(SeekableReader):
    """A seekable, read-only HDFS file read through WebHDFS.

    Sequential reads share one streaming request (one HTTP response read as it arrives); a
    seek elsewhere closes it and the next read opens a new one at the new position, so
    random access (Parquet footers) costs one request per jump and a scan costs one in all.
    """

    def __init__(self, fs: WebHdfs, path: str, size: int):
        self._fs, self._path, self._size, self._pos = fs, path, size, 0
        self._stream = None  # (context manager, raw response) of the open request
        self._stream_pos = -1  # file offset the open request will deliver next

    def readall(self) -> bytes:
        # RawIOBase.readall would read 8 KiB at a time: take READ_BLOCK instead.
        chunks = []
        while block := self.read(hdfs.READ_BLOCK):
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


def _raw_into(response):
    """The ``readinto`` of the HTTP response under a urllib3 response (``http.client``'s: it
    receives into the caller's buffer) when its body is not content-encoded, else the
    urllib3 response's own (which reads into a new buffer and copies)."""
    fp = getattr(response, "_fp", None)
    encoded = (getattr(response, "headers", None) or {}).get("content-encoding")
    if fp is not None and hasattr(fp, "readinto") and not encoded:
        return fp.readinto
    return response.readinto


class HdfsScan(io.RawIOBase):
    """A forward-only read of an HDFS file from byte ``offset`` (``length`` bytes, else to its
    end) through WebHDFS: one streaming request, no status request first (a missing path
    fails on the request itself); ``readinto`` receives straight into the caller's buffer. A
    dropped transfer (an error, or the connection closed before the response's declared
    length) is resumed from the byte reached, once for each stretch that made progress."""

    def __init__(self, fs: WebHdfs, path: str, offset: int = 0, length: int | None = None):
        self._fs, self._path = fs, path
        self._pos, self._end = offset, None if length is None else offset + length
        self._context = self._into = None
        self._owed: int | None = None  # where the open response's declared length ends
        self._resumed = False

    def readable(self) -> bool:
        return True

    def _open(self) -> None:
        length = None if self._end is None else self._end - self._pos
        context = self._fs.data_client.read(self._path, offset=self._pos, length=length)
        response = context.__enter__()
        self._into = _raw_into(response)
        self._context = context
        headers = getattr(response, "headers", None) or {}
        declared = headers.get("content-length")
        encoded = headers.get("content-encoding")
        self._owed = self._pos + int(declared) if declared and not encoded else None

    def _receive(self, buffer) -> int:
        # http.client ends a response cut short by a closed connection as if it were
        # complete: a read of nothing before the declared length is a dropped transfer.
        n = self._into(buffer)
        if n == 0 and self._owed is not None and self._pos < self._owed:
            raise StorageError(
                f"HDFS read of hdfs://{self._fs.loc.netloc}{self._path} ended at byte "
                f"{self._pos}, before byte {self._owed}: the connection closed early"
            )
        return n

    def start(self) -> None:
        """Sends the request now (else the first read does): a path that is not there
        fails here."""
        if self._context is None:
            with self._fs.errors("open", self._path):
                self._open()

    def _close_stream(self) -> None:
        context, self._context, self._into = self._context, None, None
        if context is not None:
            with contextlib.suppress(Exception):
                context.__exit__(None, None, None)

    def readinto(self, buffer) -> int:
        if self._end is not None:
            buffer = memoryview(buffer)[: max(0, self._end - self._pos)]
        if not len(buffer):
            return 0
        with self._fs.errors("read", self._path):
            try:
                if self._context is None:
                    self._open()
                n = self._receive(buffer)
            except Exception:
                if self._resumed or self._context is None:
                    raise
                self._resumed = True  # a dropped or timed-out stream: one fresh request
                self._close_stream()
                self._open()
                n = self._receive(buffer)
        if n:
            self._resumed = False  # progress since the last resume: the next drop may resume
        self._pos += n
        return n

    def close(self) -> None:
        self._close_stream()
        super().close()


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
