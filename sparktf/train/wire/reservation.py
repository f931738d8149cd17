"""Authenticated start-up: TensorFlowOnSpark's reservation exchange without pickle.

TensorFlowOnSpark brings the cluster up through a reservation server on the driver: every
executor task registers its node (host, TF port, its manager's address and *authkey*), polls
until all have registered and fetches the list. Its own server binds every interface and
``pickle.loads`` whatever arrives, so anyone who can reach the port runs code on the driver,
and anyone who asks gets every manager's authkey (code execution on the executors).

This module is sparktf's own message layer for that exchange (sparktf's bring-up,
:mod:`sparktf.train.driver.bringup`, and its node tasks,
:func:`sparktf.train.process.launcher.run_node`). Three parts:

* the wire: :mod:`sparktf.train.wire.frames` (length-prefixed frames sealed with AES-256-GCM,
  authenticated before anything is decoded, no replay, encrypted JSON bodies), served by its
  :class:`~sparktf.train.wire.frames.FramedServer`;
* the reservation protocol: :class:`ReservationBook` answers TensorFlowOnSpark's four
  messages (``REG``, ``QUERY``, ``QINFO``, ``STOP``) over the list of registered nodes;
* the server and the client: :class:`AuthServer` and :class:`AuthClient` (with the interfaces
  of TensorFlowOnSpark's ``reservation.Server`` and ``Client``), composed of the two parts
  above.

The per-run secret (:func:`secrets.token_bytes`) reaches the executors only inside the Spark
task closure (:class:`~sparktf.train.process.launcher.NodeSetup`), so it is as private as
Spark's own channel
(``spark.authenticate`` and ``spark.network.crypto.enabled`` protect it on a shared network).

When the driver gives the server an ``issue_token`` callable, the answer to a node's ``REG``
carries the control token of that node's TensorFlow process (sealed like every answer); the
client keeps it for the node function (:func:`sparktf.train.wire.control.issued_token`). A node
registers once: a second ``REG`` for the same executor is refused.

The driver's side of one bring-up (its address, the secret, the server's life) is
:func:`sparktf.train.driver.bringup.authenticated_startup`; this module holds the messages,
their server and client, and the address a node routes by (:func:`route_to`), and reads
neither Spark's settings nor its sessions.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from tensorflowonspark import reservation as tfos_reservation

from sparktf.errors import SparktfValueError
from sparktf.train.wire import control
from sparktf.train.wire.frames import (
    MAX_FRAME_BYTES,
    NONCE_BYTES,
    TAG_BYTES,
    Codec,
    FramedClient,
    FramedServer,
    FrameError,
    Rejected,
    decode,
    encode,
)
from sparktf.train.wire.limits import ConnectionLimits

__all__ = [
    "AWAIT_POLL_S",
    "CLIENT_TIMEOUT_S",
    "MAX_FRAME_BYTES",
    "NONCE_BYTES",
    "SERVED_TIMEOUT_S",
    "TAG_BYTES",
    "AuthClient",
    "AuthServer",
    "Codec",
    "Rejected",
    "ReservationBook",
    "ReservationError",
    "decode",
    "encode",
    "ipv4",
    "route_to",
    "server_ports",
]

log = logging.getLogger(__name__)

CLIENT_TIMEOUT_S = 60.0
SERVED_TIMEOUT_S = 30.0  # after a start: how long the server waits for the last fetches
AWAIT_POLL_S = 0.1  # how often the driver and the nodes check that every node registered
WHAT = "reservation server"  # how logs and errors name the server


class ReservationError(FrameError):
    """The client side: the reservation server's answer could not be used."""


# ----------------------------------------------------------------------------- protocol


class ReservationBook:
    """The reservation protocol: the nodes registered so far, and the answers to
    TensorFlowOnSpark's messages about them. Thread-safe.

    ``on_stop`` is called when a node asks the server to stop (``STOP``); ``issue_token``,
    when given, is called with each registering node's metadata and returns the control
    token its ``REG`` answer carries (``{"ok": True, "token": ...}`` instead of ``"OK"``); it
    raises ValueError for a node that must not register (its executor already has).

    Raises:
        ValueError: when ``required`` is below 1.
    """

    def __init__(
        self,
        required: int,
        *,
        on_stop: Callable[[], None] = lambda: None,
        issue_token: Callable[[dict], str] | None = None,
    ):
        if required < 1:
            raise SparktfValueError(f"a cluster needs at least one node, not {required}")
        self.required = required
        self._issue_token = issue_token
        # every node fetched the complete list, or registered to learn it from the others
        self.all_served = threading.Event()
        self._on_stop = on_stop
        self._lock = threading.Lock()
        self._nodes: list[dict] = []
        self._served = 0  # answers to QINFO that held every reservation

    def add(self, meta: dict) -> None:
        with self._lock:
            self._nodes.append(meta)

    def get(self) -> list[dict]:
        """The registered nodes, in the order they registered (a copy)."""
        with self._lock:
            return list(self._nodes)

    def _register(self, meta: dict) -> Any:
        if self._issue_token is None:
            self.add(meta)
            return "OK"
        with self._lock:
            if len(self._nodes) >= self.required:
                log.warning("%s: refused a registration: every node has registered", WHAT)
                return "ERR"
            try:
                token = self._issue_token(meta)
            except (ValueError, KeyError, TypeError) as exc:
                log.warning("%s: refused a registration: %s", WHAT, exc)
                return "ERR"
            self._nodes.append(meta)
        return {"ok": True, "token": token}

    def _served_one(self) -> None:
        """One node needs nothing more of the server."""
        with self._lock:
            self._served += 1
            if self._served >= self.required:
                self.all_served.set()

    def done(self) -> bool:
        """Whether every required node has registered."""
        with self._lock:
            return len(self._nodes) >= self.required

    def answer(self, msg: Any) -> Any:
        """The answer to one verified message (``"ERR"`` to anything unknown)."""
        if not isinstance(msg, dict):
            return "ERR"
        kind = msg.get("type")
        if kind == "REG" and isinstance(msg.get("data"), dict):
            answer = self._register(msg["data"])
            if answer != "ERR" and msg.get("gathers") is True:
                self._served_one()  # it learns the cluster from the other nodes, not here
            return answer
        if kind == "QUERY":
            return self.done()
        if kind == "QINFO":
            info = self.get()
            if len(info) >= self.required:
                self._served_one()
            return info
        if kind == "STOP":
            self._on_stop()
            return "OK"
        return "ERR"


def server_ports() -> list[int]:
    """The ports the reservation server may bind: TensorFlowOnSpark's ``TFOS_SERVER_PORT``
    (one port, or a range ``first-last``), else ``[0]`` (any).

    Raises:
        ValueError: when the setting is neither.
    """
    text = os.environ.get(tfos_reservation.TFOS_SERVER_PORT, "0")
    first, sep, last = text.partition("-")
    try:
        return list(range(int(first), int(last) + 1)) if sep else [int(text)]
    except ValueError:
        raise SparktfValueError(
            f"{tfos_reservation.TFOS_SERVER_PORT}={text!r} is neither a port nor a range"
        ) from None


# ----------------------------------------------------------------------------- adaptors


class AuthServer:
    """TensorFlowOnSpark's reservation ``Server`` (``start``, ``stop``, ``done``), served over
    authenticated frames on one address; ``reservations`` holds the registered nodes.

    ``start()`` returns ``(advertise_host, port)`` for ``cluster_meta``; the port comes from
    ``TFOS_SERVER_PORT`` when set (TensorFlowOnSpark's setting), else any.

    ``issue_token``: see :class:`ReservationBook`; ``limits``: see
    :class:`~sparktf.train.wire.frames.FramedServer` (default: sized for ``count`` nodes,
    :meth:`~sparktf.train.wire.limits.ConnectionLimits.for_run`).

    Raises:
        ValueError: when ``count`` is below 1 or ``secret`` shorter than 16 bytes.
    """

    def __init__(
        self,
        count: int,
        *,
        secret: bytes,
        bind_host: str,
        advertise_host: str | None = None,
        issue_token: Callable[[dict], str] | None = None,
        limits: ConnectionLimits | None = None,
    ):
        self.bind_host = bind_host
        self.advertise_host = advertise_host or bind_host
        self.address: tuple[str, int] | None = None
        self._server = FramedServer(
            Codec(secret),
            self._answer,
            what=WHAT,
            logger=log,
            limits=limits or ConnectionLimits.for_run(count),
        )
        self.reservations = ReservationBook(
            count, on_stop=self._server.request_stop, issue_token=issue_token
        )

    def _answer(self, msg: Any) -> Any:
        return self.reservations.answer(msg)

    @property
    def done(self) -> bool:
        """Whether the server has been asked to stop (TensorFlowOnSpark reads it)."""
        return self._server.done

    @property
    def stopped(self) -> bool:
        """Whether the server has stopped and closed its socket."""
        return self._server.stopped

    def start(self) -> tuple[str, int]:
        """Starts answering; returns the address the nodes reach it at.

        Raises:
            OSError: when no port of ``TFOS_SERVER_PORT`` can be bound.
        """
        port = self._server.listen(self.bind_host, server_ports())
        self.address = (self.advertise_host, port)
        return self.address

    def stop(self) -> None:
        """Stops the server; returns once its socket is closed."""
        self._server.stop()

    def stop_when_served(self, timeout_s: float = SERVED_TIMEOUT_S) -> None:
        """Stops the server (in the background) once every node has fetched the complete
        reservation list, or after ``timeout_s``."""

        def wait_and_stop() -> None:
            if not self.reservations.all_served.wait(timeout_s):
                log.debug("reservation server: not every node fetched the cluster; stopping")
            self.stop()

        threading.Thread(
            target=wait_and_stop, name="sparktf-reservations-stop", daemon=True
        ).start()


class AuthClient:
    """TensorFlowOnSpark's reservation ``Client`` (``register``, ``get_reservations``,
    ``await_reservations``, ``request_stop``, ``close``) speaking :class:`AuthServer`'s frames,
    with the run's secret (what :func:`sparktf.train.process.launcher.join_cluster` uses).

    Raises:
        OSError: when the server cannot be reached.
    """

    def __init__(
        self,
        server_addr,
        *,
        secret: bytes,
        timeout_s: float = CLIENT_TIMEOUT_S,
        source: str | None = None,
    ):
        self.server_addr = tuple(server_addr)
        self._client = FramedClient(
            self.server_addr,
            Codec(secret),
            what=WHAT,
            timeout_s=timeout_s,
            retries=tfos_reservation.MAX_RETRIES,
            error=ReservationError,
            source=source,
        )
        log.debug("connected to the reservation server at %s", self.server_addr)

    def request(self, msg_type: str, msg_data: Any = None) -> Any:
        """Sends one message of the protocol; returns the server's answer.

        Raises:
            ReservationError: when the answer cannot be used (see
                :meth:`sparktf.train.wire.frames.FramedClient.request`).
        """
        msg: dict[str, Any] = {"type": msg_type}
        if msg_data:
            msg["data"] = msg_data
        return self._client.request(msg)

    def register(self, reservation: dict, *, gathers: bool = False) -> Any:
        """Registers this node; returns ``"OK"`` (TensorFlowOnSpark's answer). A control token
        in the answer is kept (:func:`sparktf.train.wire.control.keep_issued_token`).
        ``gathers``: the node learns the cluster from the other nodes (Spark's barrier
        ``allGather``) and will not ask the server for it.

        Raises:
            ReservationError: when the server refused the registration.
        """
        msg: dict[str, Any] = {"type": "REG", "data": reservation}
        if gathers:
            msg["gathers"] = True
        answer = self._client.request(msg)
        if isinstance(answer, dict) and isinstance(answer.get("token"), str):
            control.keep_issued_token(answer["token"])
            return "OK"
        if answer != "OK":
            raise ReservationError(f"the {WHAT} refused this node's registration: {answer!r}")
        return answer

    def get_reservations(self) -> list[dict]:
        return self.request("QINFO")

    def await_reservations(self) -> list[dict]:
        """Asks every ``AWAIT_POLL_S`` until every node has registered, then returns the
        cluster (TensorFlowOnSpark's client sleeps a whole second, even after the answer)."""
        while not self.request("QUERY"):
            time.sleep(AWAIT_POLL_S)
        return self.get_reservations()

    def request_stop(self) -> Any:
        return self.request("STOP")

    def close(self) -> None:
        self._client.close()


# ----------------------------------------------------------------------------- addresses


def ipv4(host: str) -> str:
    """The IPv4 address ``host`` resolves to.

    Raises:
        OSError: naming ``host`` when it does not resolve.
    """
    try:
        return socket.getaddrinfo(host, None, socket.AF_INET, socket.SOCK_STREAM)[0][4][0]
    except OSError as exc:
        raise OSError(f"cannot resolve the driver address {host!r}: {exc}") from None


def route_to(host: str, port: int) -> str:
    """The local IPv4 address this machine uses to reach ``host`` (no packet is sent): a
    node's address as the driver and the other nodes see it. (TensorFlowOnSpark's guess
    routes to 8.8.8.8, and on a host without a default route falls back to the host name,
    which may resolve to loopback.)"""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.connect((ipv4(host), port or 15002))
        return sock.getsockname()[0]
