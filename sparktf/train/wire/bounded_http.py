"""An HTTP server for the driver's control channel that unauthenticated clients cannot
exhaust: :class:`BoundedHTTPServer`.

``http.server.ThreadingHTTPServer`` starts a thread per connection and lets it wait 30 s per
read: a client that opens connections and sends nothing holds a thread each, without limit.
Here one thread reads every connection (a selector) under a
:class:`~sparktf.train.wire.limits.ConnectionTable` -- connections in all and per peer, and a
deadline to send the whole request -- and only a complete request (its header and its
``Content-Length`` body, at most ``max_body`` bytes) goes to a fixed pool of ``threads``
workers, which run ``http.server``'s handler over the bytes received and answer. Every
connection carries one request (HTTP/1.0 answers: the server closes it after the answer).
"""

from __future__ import annotations

import io
import logging
import re
import selectors
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler

from sparktf.train.wire.limits import ConnectionLimits, ConnectionTable, RejectLog

__all__ = ["MAX_HEADER_BYTES", "BoundedHTTPServer", "request_complete"]

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 64 << 10  # http.server's own limit of one line; a request head is < 1 KiB
POLL_S = 0.25
ACCEPT_BURST = 64  # connections accepted per wake-up of the selector
_REQUEST_LINE = re.compile(rb"^[A-Z]{1,16} [^\s]{1,8192} HTTP/\d\.\d\r?$")
_CONTENT_LENGTH = re.compile(rb"^content-length[ \t]*:[ \t]*(\S*)[ \t]*\r?$", re.I | re.M)


def request_complete(data: bytes, max_body: int) -> bool:
    """Whether ``data`` holds a whole request for the handler to answer: its header and its
    body, or enough to see that it will be refused (a first line that is not an HTTP request
    line, a header over :data:`MAX_HEADER_BYTES`, a ``Content-Length`` missing, malformed or
    over ``max_body``: the handler answers those without a body)."""
    first_end = data.find(b"\n")
    if first_end < 0:
        return len(data) > MAX_HEADER_BYTES
    if not _REQUEST_LINE.match(data[:first_end]):
        return True
    end = data.find(b"\r\n\r\n")
    if end < 0:
        return len(data) > MAX_HEADER_BYTES
    head = data[:end]
    lengths = _CONTENT_LENGTH.findall(head)
    try:
        length = int(lengths[0]) if len(lengths) == 1 else -1
    except ValueError:
        length = -1
    if not 0 <= length <= max_body:
        return True
    return len(data) >= end + 4 + length


@dataclass
class _Pending:
    peer: tuple[str, int]
    buffer: bytearray = field(default_factory=bytearray)


class BoundedHTTPServer:
    """Serves ``handler_class`` (a ``BaseHTTPRequestHandler``) on ``(host, port)``.

    ``rejects`` logs the refusals (connections over a limit, requests not complete in time);
    ``server_address`` is the bound address. :meth:`serve_forever` runs the selector (on a
    thread of the caller's), :meth:`shutdown` stops it and :meth:`server_close` closes
    every socket.

    Raises:
        OSError: when the address cannot be bound.
    """

    def __init__(
        self,
        address: tuple[str, int],
        handler_class: type[BaseHTTPRequestHandler],
        *,
        rejects: RejectLog,
        limits: ConnectionLimits,
        threads: int = 8,
        max_body: int,
    ):
        class OneRequest(handler_class):
            """The handler over one request's bytes (``request``: the socket and them)."""

            def setup(self):
                self.connection, data = self.request
                self.rfile = io.BytesIO(data)
                self.wfile = self.connection.makefile("wb", buffering=0)

        self.handler_class = OneRequest
        self.rejects = rejects
        self.limits = limits
        self.max_body = max_body
        self._table = ConnectionTable(limits, rejects)
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sparktf-control")
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind(address)
            self._listener.listen(128)
        except OSError:
            self._listener.close()
            raise
        self._listener.setblocking(False)
        self.server_address = self._listener.getsockname()
        self._pending: dict[socket.socket, _Pending] = {}
        self._busy: set[socket.socket] = set()  # handed to the pool, not yet closed
        self._busy_lock = threading.Lock()
        self._stop = threading.Event()
        self._stopped = threading.Event()

    # -- the selector thread -------------------------------------------------------------

    def serve_forever(self) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self._listener, selectors.EVENT_READ)
        try:
            while not self._stop.is_set():
                for key, _ in selector.select(POLL_S):
                    sock = key.fileobj
                    if sock is self._listener:
                        for _ in range(ACCEPT_BURST):  # drain the backlog, a burst at a time
                            if not self._accept(selector):
                                break
                    elif sock in self._pending:
                        self._read(selector, sock)
                for sock, why in self._table.expired():
                    pending = self._pending.get(sock)
                    if why and pending is not None:
                        self.rejects.reject(_describe(pending.peer), why, kind="deadline")
                    self._close(selector, sock)
                self.rejects.flush()
        except Exception:
            log.exception("control server failed")
        finally:
            for sock in list(self._pending):
                self._close(selector, sock)
            selector.close()
            self._stopped.set()

    def _accept(self, selector) -> bool:
        """Accepts one waiting connection under the limits; False when none was waiting."""
        try:
            sock, peer = self._listener.accept()
        except OSError:
            return False
        admitted, evicted = self._table.admit(sock, peer[0], _describe(peer))
        for old in evicted:
            self._close(selector, old, forget=False)
        if not admitted:
            sock.close()
            return True
        sock.setblocking(False)
        self._pending[sock] = _Pending(peer)
        selector.register(sock, selectors.EVENT_READ)
        return True

    def _read(self, selector, sock: socket.socket) -> None:
        pending = self._pending[sock]
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._close(selector, sock)
            return
        pending.buffer += data
        if not request_complete(bytes(pending.buffer), self.max_body):
            self._table.progress(sock, pending=True)
            return
        self._table.completed(sock, busy=True)
        selector.unregister(sock)
        del self._pending[sock]
        with self._busy_lock:
            self._busy.add(sock)
        try:
            self._pool.submit(self._answer, sock, bytes(pending.buffer), pending.peer)
        except RuntimeError:  # the pool is shut down: the server is stopping
            self._finish(sock)

    def _close(self, selector, sock: socket.socket, *, forget: bool = True) -> None:
        if self._pending.pop(sock, None) is not None:
            selector.unregister(sock)
        if forget:
            self._table.remove(sock)
        sock.close()

    # -- the pool ------------------------------------------------------------------------

    def _answer(self, sock: socket.socket, data: bytes, peer: tuple[str, int]) -> None:
        try:
            sock.setblocking(True)
            sock.settimeout(self.limits.message_deadline_s)  # bounds a slow reader
            self.handler_class((sock, data), peer, self)
        except Exception as exc:  # a broken connection must not end the worker
            log.debug("control server: answering %s failed: %s", _describe(peer), exc)
        finally:
            self._finish(sock)

    def _finish(self, sock: socket.socket) -> None:
        with self._busy_lock:
            self._busy.discard(sock)
        self._table.remove(sock)
        try:
            sock.close()
        except OSError:
            pass

    # -- shutting down -------------------------------------------------------------------

    def shutdown(self) -> None:
        """Stops the selector; returns once it has closed its connections."""
        self._stop.set()
        self._stopped.wait(5.0)

    def server_close(self) -> None:
        """Closes the listening socket, waits for the answers under way and closes the
        connections whose answers were cancelled."""
        self._listener.close()
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._busy_lock:
            left = list(self._busy)
        for sock in left:
            self._finish(sock)


def _describe(peer: tuple[str, int]) -> str:
    return f"{peer[0]}:{peer[1]}"
