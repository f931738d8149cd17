"""The one server core of the driver's servers: a listening socket, one thread that reads
every connection, and limits that unauthenticated clients cannot get round.

Both protocols run on it: the reservation's sealed frames
(:class:`~sparktf.train.wire.frames.FramedServer`) and the control channel's HTTP
(:class:`~sparktf.train.wire.bounded_http.BoundedHTTPServer`). :class:`SelectorServer` owns
the listener, the selector and a :class:`~sparktf.train.wire.limits.ConnectionTable`
(connections in all and per peer, a deadline to complete a message), and keeps the bytes of
incomplete messages, all connections together, under ``max_buffered_bytes``; each wake-up it
first reads what arrived (a client whose message is waiting completes it before a flood's burst can
displace it), then accepts a burst of new connections, then closes those past a deadline.
A protocol says what to do with the bytes of a connection in :meth:`SelectorServer.on_data`:
answer on this thread, or :meth:`SelectorServer.hand_over` the connection to a worker.
"""

from __future__ import annotations

import logging
import selectors
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field

from sparktf.train.wire.limits import ConnectionLimits, ConnectionTable, RejectLog

__all__ = ["ACCEPT_BURST", "POLL_S", "Connection", "SelectorServer", "describe_ports"]

POLL_S = 0.25  # the loop wakes this often: a stop takes effect promptly
ACCEPT_BURST = 64  # connections accepted per wake-up (a flood cannot starve the reads)


@dataclass
class Connection:
    """An open connection: its peer (``host:port``) and the bytes not yet used."""

    peer: str
    buffer: bytearray = field(default_factory=bytearray)


def describe_ports(ports: Sequence[int]) -> str:
    """``ports`` as an error message names them."""
    if list(ports) == [0]:
        return "any"
    return f"{ports[0]}-{ports[-1]}" if len(ports) > 1 else str(ports[0])


class SelectorServer:
    """The loop: :meth:`bind` a listener, run :meth:`serve_forever` on a thread,
    :meth:`shutdown` it and :meth:`close` the listener.

    ``io_timeout_s`` is the timeout of an accepted socket (0: non-blocking); ``what`` names
    the server in its log lines and errors.
    """

    def __init__(
        self,
        *,
        what: str,
        limits: ConnectionLimits,
        rejects: RejectLog,
        logger: logging.Logger,
        io_timeout_s: float = 0.0,
    ):
        self.what = what
        self.limits = limits
        self.rejects = rejects
        self.table = ConnectionTable(limits, rejects)
        self._log = logger
        self._io_timeout_s = io_timeout_s
        self.listener: socket.socket | None = None
        self._selector: selectors.BaseSelector | None = None
        self._connections: dict[socket.socket, Connection] = {}
        self._stop = threading.Event()
        self._stopped = threading.Event()

    def bind(self, host: str, ports: Sequence[int] = (0,)) -> int:
        """Listens on ``host`` at the first free port of ``ports`` (0: any); returns it.

        Raises:
            OSError: when none of ``ports`` can be bound.
        """
        errors = []
        for port in ports:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((host, port))
                sock.listen(128)
                sock.setblocking(False)
                break
            except OSError as exc:
                sock.close()
                errors.append(f"{port}: {exc}")
        else:
            raise OSError(
                f"the {self.what} cannot bind {host} on port(s) "
                f"{describe_ports(ports)}: {'; '.join(errors)}"
            )
        self.listener = sock
        return sock.getsockname()[1]

    # -- what a protocol does --------------------------------------------------------------

    def on_data(self, sock: socket.socket, conn: Connection) -> bool:
        """Uses what has arrived in ``conn.buffer``; False closes the connection."""
        raise NotImplementedError

    def hand_over(self, sock: socket.socket) -> None:
        """Takes ``sock`` out of the loop, open and still in the table: a worker answers
        it, then removes it from the table and closes it."""
        if self._connections.pop(sock, None) is not None:
            self._selector.unregister(sock)

    # -- the loop --------------------------------------------------------------------------

    def serve_forever(self) -> None:
        """Runs the loop until :meth:`shutdown` (on the caller's thread)."""
        selector = self._selector = selectors.DefaultSelector()
        selector.register(self.listener, selectors.EVENT_READ)
        try:
            while not self._stop.is_set():
                ready = [key.fileobj for key, _ in selector.select(POLL_S)]
                for sock in ready:
                    conn = self._connections.get(sock)
                    if conn is not None and not self._read(sock, conn):
                        self.close_connection(sock)
                if self.listener in ready:
                    self._accept_waiting()
                for sock, why in self.table.expired():
                    conn = self._connections.get(sock)
                    if why and conn is not None:
                        self.rejects.reject(conn.peer, why, kind="deadline")
                    self.close_connection(sock)
                self.rejects.flush()
        except Exception:
            self._log.exception("%s failed", self.what)
        finally:
            self._stop.set()
            for sock in list(self._connections):
                self.close_connection(sock)
            selector.close()
            self._stopped.set()
            self._log.debug("%s stopped", self.what)

    def _read(self, sock: socket.socket, conn: Connection) -> bool:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return True
        except OSError:
            return False
        if not data:
            return False
        conn.buffer += data
        if not self._within_buffer_limit(sock):
            return False
        return self.on_data(sock, conn)

    def buffered_bytes(self) -> int:
        """The bytes held of messages not yet complete, all connections together."""
        return sum(len(conn.buffer) for conn in list(self._connections.values()))

    def _within_buffer_limit(self, sock: socket.socket) -> bool:
        """Keeps :meth:`buffered_bytes` within ``limits.max_buffered_bytes``: over it, closes
        the connections holding the most that have not completed a message (largest first),
        then, if still over, ``sock``'s own. False: ``sock`` is to be closed."""
        limit = self.limits.max_buffered_bytes
        held = self.buffered_bytes()
        if held <= limit:
            return True
        holders = [
            (len(conn.buffer), held_by)
            for held_by, conn in self._connections.items()
            if conn.buffer and self.table.unfinished(held_by)
        ]
        holders.sort(key=lambda holder: holder[0], reverse=True)
        for size, held_by in holders:
            if held <= limit:
                break
            held -= size
            self.rejects.reject(
                self._connections[held_by].peer,
                f"more than {limit} bytes of incomplete messages held across connections: "
                f"closed the connection that held the most ({size} bytes)",
                kind="buffer limit",
            )
            if held_by is sock:
                return False
            self.close_connection(held_by)
        if held > limit:  # all the others completed messages: this one is the excess
            self.rejects.reject(
                self._connections[sock].peer,
                f"more than {limit} bytes of incomplete messages held across connections",
                kind="buffer limit",
            )
            return False
        return True

    def _accept_waiting(self) -> None:
        """Accepts the connections waiting (a burst at most, so that a flood cannot fill the
        backlog while this thread reads), under the limits."""
        for _ in range(ACCEPT_BURST):
            try:
                sock, peer = self.listener.accept()
            except OSError:  # none waiting (the listener does not block)
                return
            address = f"{peer[0]}:{peer[1]}"
            admitted, evicted = self.table.admit(sock, peer[0], address)
            for old in evicted:
                self.close_connection(old)
            if not admitted:
                sock.close()
                continue
            sock.settimeout(self._io_timeout_s)
            self._connections[sock] = Connection(address)
            self._selector.register(sock, selectors.EVENT_READ)

    def close_connection(self, sock: socket.socket) -> None:
        """Closes ``sock`` and forgets it (safe for one already closed)."""
        if self._connections.pop(sock, None) is not None:
            self._selector.unregister(sock)
        self.table.remove(sock)
        try:
            sock.close()
        except OSError:
            pass

    # -- stopping --------------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    def request_shutdown(self) -> None:
        """Stops the loop within ``POLL_S``, without waiting (safe from ``on_data``)."""
        self._stop.set()

    def shutdown(self, timeout_s: float = 5.0) -> None:
        """Stops the loop; returns once it has closed its connections (or after
        ``timeout_s`` when it never ran)."""
        self._stop.set()
        if self._selector is not None:
            self._stopped.wait(timeout_s)

    def close(self) -> None:
        """Closes the listening socket."""
        if self.listener is not None:
            self.listener.close()
