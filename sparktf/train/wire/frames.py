"""Authenticated frames over TCP: the wire of the driver's reservation server.

A request and its answer are each one frame of this shape::

    length (4 bytes, big-endian)  nonce (12)  ciphertext and its tag (16)

* ``length`` is checked against :data:`MAX_FRAME_BYTES` before a byte of the body is read;
* the body is sealed with AES-256-GCM (``cryptography``'s AEAD) under a key derived from the
  run's secret with HKDF-SHA256; the associated data is the direction (request or answer),
  so a request cannot be reflected as an answer. Decryption checks the tag before it
  returns a byte: no data from the network is ever parsed unauthenticated, and secrets in
  the messages are not readable on the wire;
* the nonce is random per frame; the server refuses a nonce it has seen (a replayed
  message), and every answer names the nonce of the request it answers (a replayed answer
  is refused by the client);
* the body is JSON with a small tagged encoding for what the messages hold besides JSON
  types: ``{"$bytes": base64}`` and ``{"$tuple": [...]}`` (``multiprocessing`` addresses
  need real tuples). A request's body is ``{"msg": ...}``, an answer's
  ``{"re": <the request's nonce, hex>, "msg": ...}``.

:class:`FramedServer` answers requests on one address with a handler of the caller's (it
knows nothing of what the messages mean); :class:`FramedClient` sends them. A rejected
message (not authentic, too large, replayed, not JSON) is logged at WARNING with the peer's
address and the reason, its connection is closed, and nothing else happens.
"""

from __future__ import annotations

import base64
import json
import logging
import secrets
import socket
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from sparktf.errors import SparktfError, SparktfTypeError, SparktfValueError
from sparktf.train.wire.limits import ConnectionLimits, RejectLog
from sparktf.train.wire.server import POLL_S, Connection, SelectorServer

__all__ = [
    "ANSWER",
    "MAX_CONNECTIONS",
    "MAX_FRAME_BYTES",
    "NONCE_BYTES",
    "REQUEST",
    "TAG_BYTES",
    "Codec",
    "FrameError",
    "FramedClient",
    "FramedServer",
    "Rejected",
    "decode",
    "encode",
]

log = logging.getLogger(__name__)

MAX_FRAME_BYTES = 1 << 20  # a reservation list of hundreds of nodes is a few hundred KiB
TAG_BYTES = 16  # AES-GCM's tag
NONCE_BYTES = 12  # AES-GCM's nonce; random per frame (a run sends far fewer than 2**32)
IDLE_S = ConnectionLimits.idle_s  # connections silent this long are closed (clients poll)
MAX_CONNECTIONS = ConnectionLimits.max_connections  # the default of all open connections
RETRY_PAUSE_S = 0.05  # before a client's second try (doubled for each further one)
MAX_ERROR_CHARS = 2000  # of a handler's error sent back to the client
KEY_CONTEXT = b"sparktf-reservation"  # the keys' derivation label (part of the wire format)

REQUEST, ANSWER = b"Q", b"A"  # directions: a request cannot be reflected as an answer


class Rejected(SparktfError, Exception):
    """A frame that failed a check; the message says which."""


class FrameError(SparktfError, RuntimeError):
    """The client side: a message could not be sent, or the server's answer not be used."""


# ----------------------------------------------------------------------------- encoding


def encode(obj: Any) -> Any:
    """JSON-ready copy of a message (bytes and tuples tagged).

    Raises:
        TypeError: for a value JSON cannot carry, or a dict key that is not a string or
            starts with ``$``.
    """
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, bytes):
        return {"$bytes": base64.b64encode(obj).decode("ascii")}
    if isinstance(obj, tuple):
        return {"$tuple": [encode(v) for v in obj]}
    if isinstance(obj, list):
        return [encode(v) for v in obj]
    if isinstance(obj, dict):
        out = {}
        for key, value in obj.items():
            if not isinstance(key, str) or key.startswith("$"):
                raise SparktfTypeError(f"framed messages need str keys without '$': {key!r}")
            out[key] = encode(value)
        return out
    raise SparktfTypeError(f"cannot send a {type(obj).__name__} in a framed message")


def decode(obj: Any) -> Any:
    """Inverse of :func:`encode`; raises ValueError on a malformed tag."""
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if isinstance(obj, dict):
        if len(obj) == 1 and "$bytes" in obj:
            value = obj["$bytes"]
            if not isinstance(value, str):
                raise SparktfValueError("$bytes must hold a base64 string")
            return base64.b64decode(value, validate=True)
        if len(obj) == 1 and "$tuple" in obj:
            value = obj["$tuple"]
            if not isinstance(value, list):
                raise SparktfValueError("$tuple must hold a list")
            return tuple(decode(v) for v in value)
        if any(k.startswith("$") for k in obj):
            raise SparktfValueError(f"unknown tag in {sorted(obj)}")
        return {k: decode(v) for k, v in obj.items()}
    return obj


class Codec:
    """Seals and opens frames with keys derived from one run's secret.

    Raises:
        ValueError: when ``secret`` is shorter than 16 bytes.
    """

    def __init__(self, secret: bytes):
        if len(secret) < 16:
            raise SparktfValueError("the reservation secret must have at least 16 bytes")
        key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=KEY_CONTEXT)
        self._aead = AESGCM(key.derive(secret))

    def seal(self, direction: bytes, payload: dict) -> tuple[bytes, bytes]:
        """Returns (the length-prefixed frame, its nonce).

        Raises:
            FrameError: when the frame would exceed :data:`MAX_FRAME_BYTES`.
            TypeError: when ``payload`` holds what :func:`encode` cannot carry.
        """
        nonce = secrets.token_bytes(NONCE_BYTES)
        body = json.dumps(encode(payload), separators=(",", ":")).encode()
        frame = nonce + self._aead.encrypt(nonce, body, direction)
        if len(frame) > MAX_FRAME_BYTES:
            raise FrameError(f"a message of {len(frame)} bytes is too large")
        return struct.pack(">I", len(frame)) + frame, nonce

    def verify(self, direction: bytes, frame: bytes) -> tuple[bytes, bytes]:
        """Authenticates and decrypts a frame (without its length prefix); returns (nonce,
        body). Nothing of the body is returned unless its tag is right.

        Raises:
            Rejected: a frame too short to hold a nonce and a tag, or one not sealed with
                this run's secret for this direction.
        """
        if len(frame) < NONCE_BYTES + TAG_BYTES:
            raise Rejected(f"frame of {len(frame)} bytes is too short")
        nonce = frame[:NONCE_BYTES]
        try:
            return nonce, self._aead.decrypt(nonce, frame[NONCE_BYTES:], direction)
        except InvalidTag:
            raise Rejected("not authentic (not sealed with this run's secret)") from None

    def open(self, nonce: bytes, body: bytes) -> dict:
        """Decodes the body of a verified frame (``nonce``: its nonce, unused by the JSON).

        Raises:
            Rejected: when the body is not a JSON object of the tagged encoding.
        """
        try:
            payload = decode(json.loads(body))
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise Rejected(f"not JSON ({type(exc).__name__})") from None
        if not isinstance(payload, dict):
            raise Rejected("not a JSON object")
        return payload


# ----------------------------------------------------------------------------- server


class FramedServer(SelectorServer):
    """Answers authenticated request frames on one address, on a thread of its own (the
    loop of :class:`~sparktf.train.wire.server.SelectorServer`).

    ``handler`` is called (on that thread) with each verified request's message and returns
    the answer to send; ``what`` names the server in its log lines (``"<what>: rejected a
    request from <peer>: <reason>"``, at a bounded rate:
    :class:`~sparktf.train.wire.limits.RejectLog`). ``limits`` bound what unauthenticated
    clients can hold (default :meth:`~sparktf.train.wire.limits.ConnectionLimits.from_env`):
    connections in all and per peer, the time to complete a frame.
    """

    def __init__(
        self,
        codec: Codec,
        handler: Callable[[Any], Any],
        *,
        what: str,
        logger: logging.Logger = log,
        limits: ConnectionLimits | None = None,
    ):
        super().__init__(
            what=what,
            limits=limits or ConnectionLimits.from_env(),
            rejects=RejectLog(logger, what),
            logger=logger,
            io_timeout_s=5.0,  # recv only after select says readable; bounds sendall
        )
        self._codec = codec
        self._handler = handler
        self._seen: set[bytes] = set()
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    def listen(self, host: str, ports: Sequence[int] = (0,)) -> int:
        """Binds ``host`` on the first free port of ``ports`` (0: any), starts answering;
        returns the port.

        Raises:
            OSError: when none of ``ports`` can be bound.
        """
        port = self.port = self.bind(host, ports)
        self._log.info("%s listening on %s:%d (authenticated)", self.what, host, port)
        self._thread = threading.Thread(
            target=self._serve, name="sparktf-reservations", daemon=True
        )
        self._thread.start()
        return port

    def _serve(self) -> None:
        try:
            self.serve_forever()
        finally:
            self.close()

    @property
    def done(self) -> bool:
        """Whether the server was asked to stop (or has stopped)."""
        return self.stopping

    def request_stop(self) -> None:
        """Stops the server within ``POLL_S``, without waiting (safe from the handler)."""
        self.request_shutdown()

    def stop(self) -> None:
        """Stops the server; returns once its socket is closed (within ``POLL_S``)."""
        self.request_shutdown()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5 * POLL_S)

    @property
    def stopped(self) -> bool:
        return self.done and (self._thread is None or not self._thread.is_alive())

    def on_data(self, sock: socket.socket, conn: Connection) -> bool:
        """Answers every complete frame of the buffer; False closes the connection."""
        while len(conn.buffer) >= 4:
            (size,) = struct.unpack(">I", conn.buffer[:4])
            if size > MAX_FRAME_BYTES:
                self.rejects.reject(
                    conn.peer, f"too large: {size} bytes announced, at most {MAX_FRAME_BYTES}"
                )
                return False
            if len(conn.buffer) < 4 + size:
                break
            frame = bytes(conn.buffer[4 : 4 + size])
            del conn.buffer[: 4 + size]
            self.table.completed(sock)
            try:
                nonce, body = self._codec.verify(REQUEST, frame)
                if nonce in self._seen:
                    raise Rejected("replayed message (nonce seen before)")
                self._seen.add(nonce)
                request = self._codec.open(nonce, body)
            except Rejected as exc:
                self.rejects.reject(conn.peer, str(exc))
                return False
            try:
                answer = self._handler(request.get("msg"))
                reply, _ = self._codec.seal(ANSWER, {"re": nonce.hex(), "msg": answer})
            except Exception as exc:  # this request's failure, answered; the server goes on
                self._log.exception("%s: could not answer a request from %s", self.what, conn.peer)
                error = f"{type(exc).__name__}: {exc}"[:MAX_ERROR_CHARS]
                reply, _ = self._codec.seal(ANSWER, {"re": nonce.hex(), "error": error})
            try:
                sock.sendall(reply)
            except OSError:
                return False
        self.table.progress(sock, pending=bool(conn.buffer))
        return True


# ----------------------------------------------------------------------------- client


class _Unanswered(SparktfError):
    """The server closed the connection before the first byte of an answer."""


class FramedClient:
    """Sends requests to a :class:`FramedServer` on one connection and checks the answers.

    ``what`` names the server in errors; they are raised as ``error`` (a subclass of
    :class:`FrameError` of the caller's choosing). ``source``: the local address to connect
    from (default: the one the route gives).

    Raises:
        OSError: when the server cannot be reached.
    """

    def __init__(
        self,
        address: tuple[str, int],
        codec: Codec,
        *,
        what: str,
        timeout_s: float,
        retries: int = 3,
        error: type[FrameError] = FrameError,
        source: str | None = None,
    ):
        self.address = tuple(address)
        self._source = (source, 0) if source else None  # the local address to connect from
        self._codec = codec
        self._where = f"the {what} at {self.address}"
        self._timeout_s = timeout_s
        self._retries = retries
        self._error = error
        self.sock = socket.create_connection(
            self.address, timeout=timeout_s, source_address=self._source
        )

    def request(self, msg: Any) -> Any:
        """Sends ``msg`` (reconnecting when the connection broke) and returns the answer.

        Raises:
            FrameError: (``error``) the server closed the connection or answered with a
                frame that is too large, not authentic, or the answer to another request.
            OSError: the message could not be sent in ``retries`` tries.
        """
        unanswered: _Unanswered | None = None
        for attempt in range(self._retries):
            if attempt:
                self._reconnect(attempt)
            try:
                frame, nonce = self._codec.seal(REQUEST, {"msg": msg})  # a new nonce each try
            except FrameError as exc:
                raise self._error(f"to {self._where}: {exc}") from None
            try:
                self.sock.sendall(frame)
            except OSError:
                if attempt == self._retries - 1:
                    raise
                continue
            try:
                return self._answer(nonce)
            except _Unanswered as exc:
                # The server closes a connection without answering only before it has read
                # the request (a flood displaced it, a deadline passed, or it was idle too
                # long), so the request is sent again, with a new nonce, on a new connection.
                log.debug("%s closed the connection unanswered (%s)", self._where, exc)
                unanswered = exc
        raise self._error(
            f"{self._where} closed the connection without answering "
            f"({self._retries} tries; last: {unanswered})"
        )

    def close(self) -> None:
        self.sock.close()

    def _reconnect(self, attempt: int) -> None:
        """A new connection for try ``attempt`` (1: the second), after a pause."""
        self.sock.close()
        time.sleep(RETRY_PAUSE_S * 2 ** (attempt - 1))
        self.sock = socket.create_connection(
            self.address, timeout=self._timeout_s, source_address=self._source
        )

    def _read(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = self.sock.recv(min(65536, size - len(data)))
            if not chunk:
                raise self._error(f"{self._where} closed the connection")
            data += chunk
        return bytes(data)

    def _answer(self, nonce: bytes) -> Any:
        try:
            first = self.sock.recv(4)
        except (ConnectionResetError, ConnectionAbortedError) as exc:
            raise _Unanswered(str(exc)) from None
        if not first:
            raise _Unanswered("end of stream")
        (size,) = struct.unpack(">I", first + self._read(4 - len(first)))
        if size > MAX_FRAME_BYTES:
            raise self._error(f"{self._where} announced an answer of {size} bytes")
        try:
            answer_nonce, body = self._codec.verify(ANSWER, self._read(size))
            payload = self._codec.open(answer_nonce, body)
        except Rejected as exc:
            raise self._error(f"{self._where} sent an invalid answer: {exc}") from None
        if payload.get("re") != nonce.hex():
            raise self._error(f"{self._where} sent an answer to another request (replayed?)")
        if "error" in payload:
            raise self._error(f"{self._where} could not answer the request: {payload['error']}")
        return payload.get("msg")
