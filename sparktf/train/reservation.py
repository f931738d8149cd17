"""Authenticated start-up: TensorFlowOnSpark's reservation exchange without pickle.

TensorFlowOnSpark brings the cluster up through a reservation server on the driver: every
executor task registers its node (host, TF port, its manager's address and *authkey*), polls
until all have registered and fetches the list. Its own server binds every interface and
``pickle.loads`` whatever arrives, so anyone who can reach the port runs code on the driver,
and anyone who asks gets every manager's authkey (code execution on the executors).

This module replaces that message layer for sparktf's runs; TensorFlowOnSpark still does the
bring-up. :class:`AuthServer` and :class:`AuthClient` subclass its ``Server`` and ``Client``
and speak frames of this shape::

    length (4 bytes, big-endian)  tag (32)  nonce (16)  ciphertext

* ``length`` is checked against :data:`MAX_FRAME_BYTES` before a byte of the body is read;
* ``tag`` is HMAC-SHA256 (keyed from the run's secret) over the direction, the nonce and
  the ciphertext, checked with :func:`hmac.compare_digest` before anything is decrypted or
  decoded -- no data from the network is ever parsed unauthenticated;
* the server refuses a nonce it has seen (a replayed message), and every answer names the
  nonce of the request it answers (a replayed answer is refused by the client);
* the ciphertext is the JSON body XOR a keystream of HMAC-SHA256 blocks (counter mode with
  the nonce), so the managers' authkeys are not readable on the wire either;
* the body is JSON with a small tagged encoding for what reservations hold besides JSON
  types: ``{"$bytes": base64}`` (authkeys) and ``{"$tuple": [...]}`` (``(host, port)``
  addresses: ``multiprocessing`` needs real tuples).

A rejected message (bad MAC, too large, replayed, not JSON) is logged at WARNING with the
peer's address and the reason, its connection is closed, and nothing else happens.

The per-run secret (:func:`secrets.token_bytes`) reaches the executors only inside the Spark
task closure (:func:`run_with_auth_client`), so it is as private as Spark's own channel
(``spark.authenticate`` and ``spark.network.crypto.enabled`` protect it on a shared network).

:func:`authenticated_startup` wraps one ``TFCluster.run``: the server binds only the
driver's address (:func:`driver_address`: ``spark.driver.bindAddress``/``spark.driver.host``,
loopback on the local profile), and is stopped on every exit path -- at once when the
start fails, and as soon as every node has fetched the complete cluster when it succeeds
(sparktf's control server takes over from there).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import hmac
import json
import logging
import os
import secrets
import selectors
import socket
import struct
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from tensorflowonspark import reservation as tfos_reservation

from sparktf.errors import SparktfError
from sparktf.train.control import RejectLog

log = logging.getLogger(__name__)

MAX_FRAME_BYTES = 1 << 20  # a reservation list of hundreds of nodes is a few hundred KiB
TAG_BYTES = 32
NONCE_BYTES = 16
POLL_S = 0.5  # the listening loop wakes this often: stop() takes effect promptly
IDLE_S = 60.0  # connections silent this long are closed (clients poll every second)
MAX_CONNECTIONS = 256
CLIENT_TIMEOUT_S = 60.0
SERVED_TIMEOUT_S = 30.0  # after a start: how long the server waits for the last fetches
AWAIT_POLL_S = 0.1  # how often the driver and the nodes check that every node registered

_ASK, _ANSWER = b"Q", b"A"  # directions: a request cannot be reflected as an answer


class Rejected(SparktfError, Exception):
    """A frame that failed a check; the message says which."""


class ReservationError(SparktfError, RuntimeError):
    """The client side: the reservation server's answer could not be used."""


# ----------------------------------------------------------------------------- encoding


def encode(obj: Any) -> Any:
    """JSON-ready copy of a reservation message (bytes and tuples tagged)."""
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
                raise TypeError(f"reservation messages need str keys without '$': {key!r}")
            out[key] = encode(value)
        return out
    raise TypeError(f"cannot send a {type(obj).__name__} in a reservation message")


def decode(obj: Any) -> Any:
    """Inverse of :func:`encode`; raises ValueError on a malformed tag."""
    if isinstance(obj, list):
        return [decode(v) for v in obj]
    if isinstance(obj, dict):
        if len(obj) == 1 and "$bytes" in obj:
            value = obj["$bytes"]
            if not isinstance(value, str):
                raise ValueError("$bytes must hold a base64 string")
            return base64.b64decode(value, validate=True)
        if len(obj) == 1 and "$tuple" in obj:
            value = obj["$tuple"]
            if not isinstance(value, list):
                raise ValueError("$tuple must hold a list")
            return tuple(decode(v) for v in value)
        if any(k.startswith("$") for k in obj):
            raise ValueError(f"unknown tag in {sorted(obj)}")
        return {k: decode(v) for k, v in obj.items()}
    return obj


class Codec:
    """Seals and opens frames with keys derived from one run's secret."""

    def __init__(self, secret: bytes):
        if len(secret) < 16:
            raise ValueError("the reservation secret must have at least 16 bytes")
        self._mac_key = hmac.new(secret, b"sparktf-reservation/mac", hashlib.sha256).digest()
        self._enc_key = hmac.new(secret, b"sparktf-reservation/enc", hashlib.sha256).digest()

    def _keystream(self, nonce: bytes, size: int) -> bytes:
        blocks = (size + 31) // 32
        return b"".join(
            hmac.new(self._enc_key, nonce + i.to_bytes(4, "big"), hashlib.sha256).digest()
            for i in range(blocks)
        )[:size]

    def _xor(self, nonce: bytes, data: bytes) -> bytes:
        stream = self._keystream(nonce, len(data))
        return (int.from_bytes(data, "big") ^ int.from_bytes(stream, "big")).to_bytes(
            len(data), "big"
        )

    def _tag(self, direction: bytes, nonce: bytes, ciphertext: bytes) -> bytes:
        return hmac.new(self._mac_key, direction + nonce + ciphertext, hashlib.sha256).digest()

    def seal(self, direction: bytes, payload: dict) -> tuple[bytes, bytes]:
        """Returns (the length-prefixed frame, its nonce)."""
        nonce = secrets.token_bytes(NONCE_BYTES)
        body = json.dumps(encode(payload), separators=(",", ":")).encode()
        ciphertext = self._xor(nonce, body)
        frame = self._tag(direction, nonce, ciphertext) + nonce + ciphertext
        if len(frame) > MAX_FRAME_BYTES:
            raise ReservationError(f"reservation message of {len(frame)} bytes is too large")
        return struct.pack(">I", len(frame)) + frame, nonce

    def verify(self, direction: bytes, frame: bytes) -> tuple[bytes, bytes]:
        """Checks the tag of a frame (without its length prefix) before anything else;
        returns (nonce, ciphertext)."""
        if len(frame) < TAG_BYTES + NONCE_BYTES:
            raise Rejected(f"frame of {len(frame)} bytes is too short")
        tag, nonce = frame[:TAG_BYTES], frame[TAG_BYTES : TAG_BYTES + NONCE_BYTES]
        ciphertext = frame[TAG_BYTES + NONCE_BYTES :]
        if not hmac.compare_digest(tag, self._tag(direction, nonce, ciphertext)):
            raise Rejected("bad MAC (not signed with this run's secret)")
        return nonce, ciphertext

    def open(self, nonce: bytes, ciphertext: bytes) -> dict:
        """Decrypts and decodes a verified frame."""
        try:
            payload = decode(json.loads(self._xor(nonce, ciphertext)))
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            raise Rejected(f"not JSON ({type(exc).__name__})") from None
        if not isinstance(payload, dict):
            raise Rejected("not a JSON object")
        return payload


# ----------------------------------------------------------------------------- server


@dataclass
class _Connection:
    peer: str
    last: float
    buffer: bytearray = field(default_factory=bytearray)


class AuthServer(tfos_reservation.Server):
    """TensorFlowOnSpark's reservation server with authenticated frames, bound to one
    address. ``start()`` returns ``(advertise_host, port)`` for ``cluster_meta``; the port
    comes from ``TFOS_SERVER_PORT`` when set (TensorFlowOnSpark's setting), else any."""

    def __init__(
        self, count: int, *, secret: bytes, bind_host: str, advertise_host: str | None = None
    ):
        super().__init__(count)
        self.done = False
        self.bind_host = bind_host
        self.advertise_host = advertise_host or bind_host
        self.address: tuple[str, int] | None = None
        self._codec = Codec(secret)
        self._seen: set[bytes] = set()
        self._served = 0  # answers to QINFO that held every reservation
        self._all_served = threading.Event()
        self._thread: threading.Thread | None = None
        self._rejects = RejectLog(log, "reservation server")

    # TensorFlowOnSpark's pickle framing must never run on this server.
    def receive(self, sock):
        raise NotImplementedError("AuthServer does not read pickle frames")

    def send(self, sock, msg):
        raise NotImplementedError("AuthServer does not write pickle frames")

    def start_listening_socket(self) -> socket.socket:
        ports = self.get_server_ports()
        errors = []
        for port in ports:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            try:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((self.bind_host, port))
                sock.listen(64)
                return sock
            except OSError as exc:
                sock.close()
                errors.append(f"{port}: {exc}")
        raise OSError(
            f"the reservation server cannot bind {self.bind_host} on port(s) "
            f"{os.environ.get(tfos_reservation.TFOS_SERVER_PORT, 'any')}: {'; '.join(errors)}"
        )

    def start(self) -> tuple[str, int]:
        listener = self.start_listening_socket()
        port = listener.getsockname()[1]
        self.address = (self.advertise_host, port)
        log.info("reservation server listening on %s:%d (authenticated)", self.bind_host, port)
        self._thread = threading.Thread(
            target=self._serve, args=(listener,), name="sparktf-reservations", daemon=True
        )
        self._thread.start()
        return self.address

    def stop(self) -> None:
        """Stops the server; returns once its socket is closed (within ``POLL_S``)."""
        self.done = True
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(5 * POLL_S)

    def stop_when_served(self, timeout_s: float = SERVED_TIMEOUT_S) -> None:
        """Stops the server (in the background) once every node has fetched the complete
        reservation list, or after ``timeout_s``."""

        def wait_and_stop() -> None:
            if not self._all_served.wait(timeout_s):
                log.debug("reservation server: not every node fetched the cluster; stopping")
            self.stop()

        threading.Thread(
            target=wait_and_stop, name="sparktf-reservations-stop", daemon=True
        ).start()

    @property
    def stopped(self) -> bool:
        return self.done and (self._thread is None or not self._thread.is_alive())

    def _serve(self, listener: socket.socket) -> None:
        selector = selectors.DefaultSelector()
        selector.register(listener, selectors.EVENT_READ)
        connections: dict[socket.socket, _Connection] = {}

        def close(sock: socket.socket) -> None:
            selector.unregister(sock)
            connections.pop(sock, None)
            sock.close()

        try:
            while not self.done:
                for key, _ in selector.select(POLL_S):
                    sock = key.fileobj
                    if sock is listener:
                        self._accept(listener, selector, connections)
                    elif not self._on_readable(sock, connections[sock]):
                        close(sock)
                now = time.monotonic()
                for sock, conn in list(connections.items()):
                    if now - conn.last > IDLE_S:
                        close(sock)
        except Exception:
            log.exception("reservation server failed")
        finally:
            self.done = True
            for sock in list(connections):
                close(sock)
            selector.close()
            listener.close()
            log.debug("reservation server stopped")

    def _accept(self, listener, selector, connections) -> None:
        try:
            sock, peer = listener.accept()
        except OSError:
            return
        address = f"{peer[0]}:{peer[1]}"
        if len(connections) >= MAX_CONNECTIONS:
            self._rejects.reject(address, f"more than {MAX_CONNECTIONS} open connections")
            sock.close()
            return
        sock.settimeout(5.0)  # recv only after select says readable; bounds sendall
        connections[sock] = _Connection(address, time.monotonic())
        selector.register(sock, selectors.EVENT_READ)

    def _on_readable(self, sock: socket.socket, conn: _Connection) -> bool:
        """Reads what arrived and answers every complete frame; False closes the connection."""
        try:
            data = sock.recv(65536)
        except OSError:
            return False
        if not data:
            return False
        conn.last = time.monotonic()
        conn.buffer += data
        while len(conn.buffer) >= 4:
            (size,) = struct.unpack(">I", conn.buffer[:4])
            if size > MAX_FRAME_BYTES:
                self._rejects.reject(
                    conn.peer, f"too large: {size} bytes announced, at most {MAX_FRAME_BYTES}"
                )
                return False
            if len(conn.buffer) < 4 + size:
                return True
            frame = bytes(conn.buffer[4 : 4 + size])
            del conn.buffer[: 4 + size]
            try:
                nonce, ciphertext = self._codec.verify(_ASK, frame)
                if nonce in self._seen:
                    raise Rejected("replayed message (nonce seen before)")
                self._seen.add(nonce)
                request = self._codec.open(nonce, ciphertext)
            except Rejected as exc:
                self._rejects.reject(conn.peer, str(exc))
                return False
            answer = self._answer(request.get("msg"))
            reply, _ = self._codec.seal(_ANSWER, {"re": nonce.hex(), "msg": answer})
            try:
                sock.sendall(reply)
            except OSError:
                return False
        return True

    def _answer(self, msg: Any) -> Any:
        """TensorFlowOnSpark's ``_handle_message``, on a verified message."""
        if not isinstance(msg, dict):
            return "ERR"
        kind = msg.get("type")
        if kind == "REG" and isinstance(msg.get("data"), dict):
            self.reservations.add(msg["data"])
            return "OK"
        if kind == "QUERY":
            return self.reservations.done()
        if kind == "QINFO":
            info = list(self.reservations.get())
            if len(info) >= self.reservations.required:
                self._served += 1
                if self._served >= self.reservations.required:
                    self._all_served.set()
            return info
        if kind == "STOP":
            self.done = True
            return "OK"
        return "ERR"

    def await_reservations(self, sc, status=None, timeout=600):
        """TensorFlowOnSpark's wait for every node's reservation, checking every
        ``AWAIT_POLL_S`` (its own sleeps a whole second between checks)."""
        status = {} if status is None else status
        deadline = time.monotonic() + timeout
        while not self.reservations.done():
            if "error" in status:  # a node failed: what TensorFlowOnSpark does then
                sc.cancelAllJobs()
                sc.stop()
                sys.exit(1)
            if time.monotonic() > deadline:
                raise Exception("timed out waiting for reservations to complete")
            time.sleep(AWAIT_POLL_S)
        return self.reservations.get()

    def _handle_message(self, sock, msg):  # TensorFlowOnSpark's pickle path: never used
        raise NotImplementedError("AuthServer answers in _on_readable")


# ----------------------------------------------------------------------------- client


class AuthClient(tfos_reservation.Client):
    """TensorFlowOnSpark's reservation client speaking :class:`AuthServer`'s frames.
    TensorFlowOnSpark constructs it as ``reservation.Client(server_addr)``:
    :func:`run_with_auth_client` binds the secret."""

    def __init__(self, server_addr, *, secret: bytes, timeout_s: float = CLIENT_TIMEOUT_S):
        self.server_addr = tuple(server_addr)
        self._codec = Codec(secret)
        self._timeout_s = timeout_s
        self.sock = socket.create_connection(self.server_addr, timeout=timeout_s)
        log.debug("connected to the reservation server at %s", self.server_addr)

    def await_reservations(self):
        """Asks every ``AWAIT_POLL_S`` until every node has registered, then returns the
        cluster (TensorFlowOnSpark's client sleeps a whole second, even after the answer)."""
        while not self._request("QUERY"):
            time.sleep(AWAIT_POLL_S)
        return self.get_reservations()

    def receive(self, sock):
        raise NotImplementedError("AuthClient does not read pickle frames")

    def send(self, sock, msg):
        raise NotImplementedError("AuthClient does not write pickle frames")

    def _request(self, msg_type, msg_data=None):
        msg = {"type": msg_type}
        if msg_data:
            msg["data"] = msg_data
        for attempt in range(tfos_reservation.MAX_RETRIES):
            frame, nonce = self._codec.seal(_ASK, {"msg": msg})  # a new nonce on every try
            try:
                self.sock.sendall(frame)
                break
            except OSError:
                if attempt == tfos_reservation.MAX_RETRIES - 1:
                    raise
                self.sock.close()
                self.sock = socket.create_connection(self.server_addr, timeout=self._timeout_s)
        return self._answer(nonce)

    def _read(self, size: int) -> bytes:
        data = bytearray()
        while len(data) < size:
            chunk = self.sock.recv(min(65536, size - len(data)))
            if not chunk:
                raise ReservationError(
                    f"the reservation server at {self.server_addr} closed the connection"
                )
            data += chunk
        return bytes(data)

    def _answer(self, nonce: bytes) -> Any:
        (size,) = struct.unpack(">I", self._read(4))
        where = f"the reservation server at {self.server_addr}"
        if size > MAX_FRAME_BYTES:
            raise ReservationError(f"{where} announced an answer of {size} bytes")
        try:
            answer_nonce, ciphertext = self._codec.verify(_ANSWER, self._read(size))
            payload = self._codec.open(answer_nonce, ciphertext)
        except Rejected as exc:
            raise ReservationError(f"{where} sent an invalid answer: {exc}") from None
        if payload.get("re") != nonce.hex():
            raise ReservationError(f"{where} sent an answer to another request (replayed?)")
        return payload.get("msg")


def run_with_auth_client(f, secret: bytes, iterator):
    """Runs TensorFlowOnSpark's partition function ``f`` on an executor with its
    ``reservation.Client`` speaking :class:`AuthServer`'s frames; restores the original
    afterwards (PySpark reuses workers: a later plain TensorFlowOnSpark run must not see it).

    ``f`` arrives as the bytes :class:`AuthenticatedNodes` made of it on the driver, inside
    this Spark task's own payload (the same trust as the task itself), and is loaded only
    after :func:`defer_tensorflow_import`: the Spark worker that runs the reservation then
    does not import TensorFlow (sparktf's TensorFlow process is a fresh interpreter)."""
    from pyspark import cloudpickle
    from tensorflowonspark import TFManager as tfos_manager  # noqa: N813 (a module)
    from tensorflowonspark import util

    quiet_tensorflowonspark()
    defer_tensorflow_import()
    f = cloudpickle.loads(f)
    original = tfos_reservation.Client, tfos_manager.TFManager
    tfos_reservation.Client = functools.partial(AuthClient, secret=secret)
    tfos_manager.TFManager = bound_manager_class(tfos_manager.TFManager, util.get_ip_address())
    try:
        return f(iterator)
    finally:
        tfos_reservation.Client, tfos_manager.TFManager = original


def quiet_tensorflowonspark() -> None:
    """TensorFlowOnSpark logs every node's manager ``authkey`` at INFO (``TFSparkNode.reserve``
    and the cluster spec), and its import sets the root logger to INFO: in an executor's
    stderr, which Spark's UI serves and local-cluster keeps world-readable. Its loggers go to
    WARNING unless their level was set on purpose."""
    tfos_log = logging.getLogger("tensorflowonspark")
    if tfos_log.level == logging.NOTSET:
        tfos_log.setLevel(logging.WARNING)


def bound_manager_class(manager_class: type, host: str) -> type:
    """``manager_class`` (TensorFlowOnSpark's ``TFManager``) listening on ``host`` where
    TensorFlowOnSpark asks for every interface: its parameter servers' and evaluators'
    managers (``('', 0)``) are reached only at the address the node advertises, ``host``."""

    class BoundTFManager(manager_class):
        def __init__(self, address=None, *args, **kwargs):
            if isinstance(address, tuple) and address[0] == "":
                address = (host, address[1])
            super().__init__(address, *args, **kwargs)

    return BoundTFManager


COMPAT = "tensorflowonspark.compat"


def defer_tensorflow_import() -> None:
    """Makes ``tensorflowonspark.compat`` load on first use instead of at import.

    TensorFlowOnSpark's node module imports ``TFNode``, which imports ``compat``, which imports
    TensorFlow at module level: seconds of CPU and hundreds of MiB in every Spark worker that
    only runs the reservation and starts sparktf's own TensorFlow process. The module put in
    its place loads the real one (from its file) the first time an attribute is asked for, so
    code that does use ``compat`` behaves as before. No-op once the real one is imported."""
    import importlib.util
    import sys
    import types

    if COMPAT in sys.modules:
        return
    spec = importlib.util.find_spec(COMPAT)
    if spec is None or spec.origin is None:
        return
    lazy = types.ModuleType(COMPAT, "tensorflowonspark.compat, loaded on first use by sparktf")
    real: list = []

    def __getattr__(name: str):  # noqa: N807 (PEP 562 module attribute hook)
        if not real:
            loaded = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(loaded)
            real.append(loaded)
        return getattr(real[0], name)

    lazy.__getattr__ = __getattr__
    sys.modules[COMPAT] = lazy
    sys.modules["tensorflowonspark"].compat = lazy


class AuthenticatedNodes:
    """TensorFlowOnSpark's node RDD as ``TFCluster.run`` sees it: its ``foreachPartition``
    runs the node function through :func:`run_with_auth_client`."""

    def __init__(self, rdd, secret: bytes):
        self._rdd = rdd
        self._secret = secret

    def foreachPartition(self, f):  # noqa: N802 (RDD API)
        from pyspark import cloudpickle

        # f as bytes: unpickling it imports TensorFlowOnSpark's node module, which must wait
        # until run_with_auth_client has deferred its TensorFlow import.
        payload = cloudpickle.dumps(f)
        return self._rdd.foreachPartition(
            functools.partial(run_with_auth_client, payload, self._secret)
        )

    def __getattr__(self, name):
        return getattr(self._rdd, name)


# ----------------------------------------------------------------------------- start-up


@dataclass(frozen=True)
class DriverAddress:
    bind: str  # the IPv4 address the driver's servers bind
    advertise: str  # the name or address executors connect to


def _ipv4(host: str) -> str:
    try:
        return socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except OSError as exc:
        raise OSError(f"cannot resolve the driver address {host!r}: {exc}") from None


def driver_address(sc) -> DriverAddress:
    """Where the driver's servers listen: Spark's own driver address.

    Advertised: ``spark.driver.host`` (what executors already use to reach the driver), else
    ``SPARK_LOCAL_IP``, else TensorFlowOnSpark's guess. Bound: ``spark.driver.bindAddress``
    when it names one address, else the advertised one -- never every interface. On the local
    profile both are 127.0.0.1.
    """
    from tensorflowonspark import util

    conf = sc.getConf()
    advertise = (
        conf.get("spark.driver.host", None)
        or os.environ.get("SPARK_LOCAL_IP")
        or util.get_ip_address()
    )
    bind = conf.get("spark.driver.bindAddress", None)
    if not bind or bind in ("0.0.0.0", "::", "*"):
        bind = advertise
    return DriverAddress(bind=_ipv4(bind), advertise=advertise)


@dataclass
class Startup:
    """One authenticated start-up: the secret and the servers created under it."""

    secret: bytes
    address: DriverAddress
    servers: list[AuthServer] = field(default_factory=list)

    def wrap(self, rdd) -> AuthenticatedNodes:
        return AuthenticatedNodes(rdd, self.secret)


_SWAP_LOCK = threading.Lock()


@contextmanager
def authenticated_startup(
    address: DriverAddress, *, served_timeout_s: float = SERVED_TIMEOUT_S
) -> Iterator[Startup]:
    """For the block (one ``TFCluster.run``), TensorFlowOnSpark creates :class:`AuthServer`
    instead of its own server; pass ``startup.wrap`` the node RDD (``_GuardedContext`` does)
    so the executors use :class:`AuthClient`.

    Leaving the block restores TensorFlowOnSpark's ``Server`` and stops the server: at once
    when the block raised (anything, ``SystemExit`` included), else once every node has
    fetched the cluster. Start-ups in one driver take turns (the swap is process-wide).
    """
    startup = Startup(secret=secrets.token_bytes(32), address=address)

    def server(count: int) -> AuthServer:
        s = AuthServer(
            count, secret=startup.secret, bind_host=address.bind, advertise_host=address.advertise
        )
        startup.servers.append(s)
        return s

    with _SWAP_LOCK:
        original = tfos_reservation.Server
        tfos_reservation.Server = server
        succeeded = False
        try:
            yield startup
            succeeded = True
        finally:
            tfos_reservation.Server = original
            for s in startup.servers:
                if succeeded:
                    s.stop_when_served(served_timeout_s)
                else:
                    s.stop()
