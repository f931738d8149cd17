"""An HTTP server for the driver's control channel that unauthenticated clients cannot
exhaust: :class:`BoundedHTTPServer`.

``http.server.ThreadingHTTPServer`` starts a thread per connection and lets it wait 30 s per
read: a client that opens connections and sends nothing holds a thread each, without limit.
Here one thread reads every connection (the loop of
:class:`~sparktf.train.wire.server.SelectorServer`, which the reservation's framed server runs
too) under a :class:`~sparktf.train.wire.limits.ConnectionTable` -- connections in all and per
peer, and a deadline to send the whole request -- and only a complete request (its header and its
``Content-Length`` body, at most ``max_body`` bytes) goes to a fixed pool of ``threads``
workers, which run ``http.server``'s handler over the bytes received and answer. Every
connection carries one request (HTTP/1.0 answers: the server closes it after the answer).
"""

from __future__ import annotations

import io
import logging
import re
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler

from sparktf.train.wire.limits import ConnectionLimits, RejectLog
from sparktf.train.wire.server import Connection, SelectorServer

__all__ = ["MAX_HEADER_BYTES", "BoundedHTTPServer", "request_complete"]

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 64 << 10  # http.server's own limit of one line; a request head is < 1 KiB
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


class BoundedHTTPServer(SelectorServer):
    """Serves ``handler_class`` (a ``BaseHTTPRequestHandler``) on ``(host, port)``, on the
    loop of :class:`~sparktf.train.wire.server.SelectorServer`.

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

        super().__init__(what="control server", limits=limits, rejects=rejects, logger=log)
        self.handler_class = OneRequest
        self.max_body = max_body
        self.bind(address[0], (address[1],))
        self.server_address = self.listener.getsockname()
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="sparktf-control")
        self._busy: set[socket.socket] = set()  # handed to the pool, not yet closed
        self._busy_lock = threading.Lock()

    def on_data(self, sock: socket.socket, conn: Connection) -> bool:
        """Hands a complete request to the pool; waits for the rest of one that is not."""
        if not request_complete(bytes(conn.buffer), self.max_body):
            self.table.progress(sock, pending=True)
            return True
        self.table.completed(sock, busy=True)
        self.hand_over(sock)
        with self._busy_lock:
            self._busy.add(sock)
        try:
            self._pool.submit(self._answer, sock, bytes(conn.buffer), conn.peer)
        except RuntimeError:  # the pool is shut down: the server is stopping
            self._finish(sock)
        return True

    # -- the pool ------------------------------------------------------------------------

    def _answer(self, sock: socket.socket, data: bytes, peer: str) -> None:
        try:
            sock.setblocking(True)
            sock.settimeout(self.limits.message_deadline_s)  # bounds a slow reader
            host, _, port = peer.rpartition(":")
            self.handler_class((sock, data), (host, int(port)), self)
        except Exception as exc:  # a broken connection must not end the worker
            log.debug("control server: answering %s failed: %s", peer, exc)
        finally:
            self._finish(sock)

    def _finish(self, sock: socket.socket) -> None:
        with self._busy_lock:
            self._busy.discard(sock)
        self.close_connection(sock)  # handed over: no longer in the loop's connections

    # -- shutting down -------------------------------------------------------------------

    def server_close(self) -> None:
        """Closes the listening socket, waits for the answers under way and closes the
        connections whose answers were cancelled."""
        self.close()
        self._pool.shutdown(wait=True, cancel_futures=True)
        with self._busy_lock:
            left = list(self._busy)
        for sock in left:
            self._finish(sock)
