"""The driver's servers under abuse, standalone (sparktf.train.wire.limits, the reservation's
FramedServer, the control server's BoundedHTTPServer).

Connections in all and per peer are bounded (a new one displaces the oldest that has not
completed a message, and is refused when none can be displaced); a client that trickles its
message is cut off at the deadline; the control server answers on a fixed pool of threads;
refusals are logged at a bounded rate. Small limits keep the tests fast.
"""

from __future__ import annotations

import contextlib
import logging
import secrets
import socket
import threading
import time

import pytest

from sparktf.train.wire import reservation
from sparktf.train.wire.control import ControlClient, ControlServer
from sparktf.train.wire.limits import ConnectionLimits, ConnectionTable, RejectLog

pytestmark = pytest.mark.unit

LOOPBACK = "127.0.0.1"
LIMITS = ConnectionLimits(max_connections=24, max_per_peer=12, message_deadline_s=1.0)


def rejection_lines(caplog, what: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelname == "WARNING" and r.getMessage().startswith(f"{what}: rejected")
    ]


def test_reject_log_writes_a_bounded_number_of_lines_and_a_summary(caplog):
    logger = logging.getLogger("sparktf.test.rejects")
    rejects = RejectLog(logger, "test server", limit=3, window_s=0.3)
    for i in range(1000):
        rejects.reject(f"10.0.0.1:{i}", "refused: too many", kind="connection limit")
    rejects.reject("10.0.0.2:1", "not authentic")
    time.sleep(0.35)
    rejects.flush()
    lines = rejection_lines(caplog, "test server")
    assert len(lines) == 4, lines
    assert lines[-1].startswith("test server: rejected 998 more requests in the last")
    assert "connection limit x997" in lines[-1] and "not authentic x1" in lines[-1]
    assert rejects.total == 1001
    rejects.flush()  # nothing new: no line
    assert len(rejection_lines(caplog, "test server")) == 4


def test_connection_table_displaces_the_oldest_unfinished_then_refuses():
    rejects = RejectLog(logging.getLogger("sparktf.test.table"), "t")
    table = ConnectionTable(ConnectionLimits(max_connections=3, max_per_peer=2), rejects)
    assert table.admit("a1", "A", "A:1") == (True, [])
    assert table.admit("a2", "A", "A:2") == (True, [])
    assert table.admit("a3", "A", "A:3") == (True, ["a1"])  # per-peer: a1 was the oldest
    table.completed("a2")  # a client that completed a message is never displaced
    assert table.admit("a4", "A", "A:4") == (True, ["a3"])
    table.completed("a4")
    assert table.admit("a5", "A", "A:5") == (False, [])  # every one of A's completed one
    assert table.admit("b1", "B", "B:1") == (True, [])
    assert table.admit("c1", "C", "C:1") == (True, ["b1"])  # the total: b1 the only candidate
    assert len(table) == 3 and rejects.total == 4


def test_connection_table_deadlines():
    rejects = RejectLog(logging.getLogger("sparktf.test.table"), "t")
    table = ConnectionTable(
        ConnectionLimits(message_deadline_s=0.2, idle_s=0.4, max_connections=10), rejects
    )
    for key in ("silent", "trickle", "client"):
        table.admit(key, "A", "A:1")
    table.progress("trickle", pending=True)
    table.completed("client")
    time.sleep(0.3)
    expired = dict(table.expired())
    assert set(expired) == {"silent", "trickle"}
    assert "within 0.2 s" in expired["silent"] and "within 0.2 s" in expired["trickle"]
    time.sleep(0.2)
    assert table.expired() == [("client", None)]  # idle after a message: closed quietly


class Trickler:
    """Sends one byte every ``every_s`` until the server closes the connection; records
    how long that took."""

    def __init__(self, addr, payload: bytes, every_s: float = 0.2):
        self.sock = socket.create_connection(addr, timeout=5.0)
        self.payload, self.every_s = payload, every_s
        self.cut_after: float | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        start = time.monotonic()
        try:
            for byte in self.payload:
                self.sock.sendall(bytes([byte]))
                time.sleep(self.every_s)
        except OSError:
            pass
        finally:
            self.cut_after = time.monotonic() - start
            self.sock.close()


def hold(addr, n: int) -> list[socket.socket]:
    """``n`` connections that send nothing."""
    return [socket.create_connection(addr, timeout=5.0) for _ in range(n)]


def closed_by_server(sock: socket.socket, timeout: float = 0.0) -> bool:
    sock.settimeout(timeout or 0.01)
    try:
        return sock.recv(1) == b""
    except (TimeoutError, BlockingIOError):
        return False
    except OSError:
        return True


@contextlib.contextmanager
def reservation_server(limits: ConnectionLimits):
    """A reservation server for one node on loopback under ``limits``: yields it, its address
    and its secret; stopped on exit."""
    secret = secrets.token_bytes(32)
    srv = reservation.AuthServer(1, secret=secret, bind_host=LOOPBACK, limits=limits)
    addr = srv.start()
    try:
        yield srv, addr, secret
    finally:
        srv.stop()


def test_reservation_server_under_a_flood_still_serves_and_cuts_slow_senders(caplog):
    with reservation_server(LIMITS) as (_, addr, secret):
        idle = hold(addr, 60)  # five times the per-peer limit
        trickle = Trickler(addr, b"\x00\x00\x01\x00" + b"x" * 40)
        time.sleep(0.3)
        client = reservation.AuthClient(addr, secret=secret)  # a node of the run
        assert client.register({"executor_id": 0}) == "OK"
        assert client.get_reservations() == [{"executor_id": 0}]
        trickle.thread.join(5.0)
        assert trickle.cut_after is not None and trickle.cut_after < 2.5, trickle.cut_after
        # within the deadline (1 s) and a poll, every idle connection was closed
        time.sleep(1.0)
        assert all(closed_by_server(s, 0.5) for s in idle)
        # the node's connection, which completed messages, stays
        assert client.request("QUERY") is True
        client.close()
        for s in idle:
            s.close()
    lines = rejection_lines(caplog, "reservation server")
    assert 1 <= len(lines) <= 6, lines  # five lines and a summary at most per window


def test_a_client_displaced_before_its_request_was_read_sends_it_again(caplog):
    """A node connects, a flood takes its place before the server has read its request (the
    table holds two connections a peer): the request goes again on a new connection and is
    answered, instead of the node failing with "connection reset"."""
    limits = ConnectionLimits(max_connections=4, max_per_peer=2, message_deadline_s=5.0)
    with reservation_server(limits) as (srv, addr, secret):
        client = reservation.AuthClient(addr, secret=secret)  # connected, nothing sent yet
        idle = hold(addr, 2)
        time.sleep(0.5)  # the server admitted both, displacing the node's connection
        assert any(
            "connection limit reached" in line
            for line in rejection_lines(caplog, "reservation server")
        )
        assert client.get_reservations() == []
        assert client.register({"executor_id": 0}) == "OK"
        assert client.request("QUERY") is True
        client.close()
        for s in idle:
            s.close()
    assert srv.reservations.get() == [{"executor_id": 0}]  # registered once


def test_control_server_under_a_flood_answers_on_a_fixed_pool(caplog):
    srv = ControlServer(LOOPBACK, limits=LIMITS, threads=4)
    addr = srv.address
    key = "executor-0"
    client = ControlClient(srv.url, srv.issue_token(key), key)
    threads_before = threading.active_count()
    try:
        idle = hold(addr, 60)
        head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 30\r\n\r\n{"
        trickle = Trickler(addr, head + b" " * 40)
        time.sleep(0.3)
        for _ in range(5):  # the run's own requests get through
            assert client.post("beat", {"progress": {"step": 1}}, timeout=5.0)["stop"] is False
        assert threading.active_count() <= threads_before + 4
        trickle.thread.join(5.0)
        assert trickle.cut_after is not None and trickle.cut_after < 2.5, trickle.cut_after
        time.sleep(1.0)
        assert all(closed_by_server(s, 0.5) for s in idle)
        for s in idle:
            s.close()
        assert srv.snapshot()[key].progress == {"step": 1}
    finally:
        srv.close()
    lines = rejection_lines(caplog, "control server")
    assert 1 <= len(lines) <= 6, lines


@pytest.mark.parametrize("which", ["reservation server", "control server"])
def test_the_bytes_held_before_authentication_are_capped_across_connections(which, caplog):
    """Peers without the run's secret each send most of a large message (a frame or an HTTP
    body announced at 900 KiB, 64 KiB of it sent) and hold it: in all the server holds at most
    ``max_buffered_bytes`` of incomplete messages, whatever the number of connections the
    run's size allows, closing the largest holders first; a real client is still answered.
    (Before the cap every connection could hold up to a message's 1 MiB.)"""
    import struct

    limits = ConnectionLimits(
        max_connections=64, max_per_peer=64, message_deadline_s=5.0, max_buffered_bytes=256 << 10
    )
    head = {
        "reservation server": struct.pack(">I", 900 << 10),
        "control server": b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 921600\r\n\r\n",
    }[which]
    with contextlib.ExitStack() as stack:
        if which == "reservation server":
            srv, addr, secret = stack.enter_context(reservation_server(limits))
            server = srv._server

            def answered() -> bool:
                client = reservation.AuthClient(addr, secret=secret)
                try:
                    return client.register({"executor_id": 0}) == "OK"
                finally:
                    client.close()
        else:
            srv = ControlServer(LOOPBACK, limits=limits, threads=2)
            stack.callback(srv.close)
            addr, server, key = srv.address, srv._httpd, "executor-0"
            client = ControlClient(srv.url, srv.issue_token(key), key)

            def answered() -> bool:
                return client.post("beat", {"progress": {"step": 1}}, timeout=5.0)["stop"] is False

        holders = hold(addr, 20)
        for sock in holders:
            stack.callback(sock.close)
            with contextlib.suppress(OSError):
                sock.sendall(head + b"x" * (64 << 10))
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline and server.buffered_bytes() < 128 << 10:
            time.sleep(0.05)
        time.sleep(0.3)  # everything sent has arrived
        assert 0 < server.buffered_bytes() <= limits.max_buffered_bytes
        closed = sum(closed_by_server(sock, 0.2) for sock in holders)
        assert closed >= 20 - (256 << 10) // (64 << 10), closed  # at most 4 of 64 KiB held
        assert answered()
        assert server.buffered_bytes() <= limits.max_buffered_bytes
    assert any("bytes of incomplete messages" in line for line in rejection_lines(caplog, which))


def test_a_process_that_reports_every_step_cannot_grow_the_drivers_lists():
    """Each process's evaluations and reports are the last ``MAX_KEPT``: a function that
    reports at every one of 2,500 steps leaves 1,000, numbered as they came, with the count
    of the dropped ones; the last report that named a checkpoint (the next attempt's resume
    point) is kept even after it left the list; a reader that goes by number reads each kept
    entry once and learns how many it missed."""
    from sparktf.train.wire.control import MAX_KEPT

    srv = ControlServer(LOOPBACK, limits=LIMITS)
    key = "executor-0"
    token = srv.issue_token(key)
    srv.publish_plans({key: {"name": "chief:0", "role": "chief"}})
    client = ControlClient(srv.url, token, key)
    try:
        seen = 0
        for n in range(1, 2501):
            entry = {"n": n, "step": n, "metrics": {"loss": 1.0 / n}}
            if n == 100:
                entry["checkpoint"] = "/models/m/report-000100"
            if n in (1, 2500):  # over HTTP, as a process sends them
                assert client.post("report", entry)["stop"] is False
            else:
                event = {"token": token, "key": key, "event": "report", "data": entry}
                assert srv.answer(event)[0] == 200
            srv.answer({"token": token, "key": key, "event": "eval", "data": {"step": n}})
            if n == 600:  # a reader: everything so far, once
                node = srv.snapshot()[key]
                assert [e["n"] for e in node.reports.since(seen)] == list(range(1, 601))
                seen = node.reports.total
        node = srv.snapshot()[key]
        assert len(node.reports) == len(node.evals) == MAX_KEPT == 1000
        assert (node.reports.total, node.reports.dropped) == (2500, 1500)
        assert (node.evals.total, node.evals.dropped) == (2500, 1500)
        assert [e["n"] for e in node.reports] == list(range(1501, 2501))
        assert node.checkpointed["checkpoint"] == "/models/m/report-000100"
        assert [e["n"] for e in node.reports.since(seen)] == list(range(1501, 2501))
        assert node.reports.dropped - seen == 900  # what that reader missed
    finally:
        srv.close()


def test_a_handler_exception_answers_that_request_and_the_server_goes_on(caplog):
    """One request the handler fails on is answered with the error (named to the client and
    logged); the server, and the same connection, go on answering."""
    from sparktf.train.wire.frames import Codec, FramedClient, FramedServer, FrameError

    def handler(msg):
        if msg == "boom":
            raise ValueError("no such thing")
        return msg

    secret = secrets.token_bytes(32)
    srv = FramedServer(Codec(secret), handler, what="test server", limits=LIMITS)
    port = srv.listen(LOOPBACK)
    try:
        client = FramedClient((LOOPBACK, port), Codec(secret), what="test server", timeout_s=5.0)
        with pytest.raises(FrameError, match="could not answer the request: ValueError: no such"):
            client.request("boom")
        assert client.request("hello") == "hello"  # the same connection
        other = FramedClient((LOOPBACK, port), Codec(secret), what="test server", timeout_s=5.0)
        assert other.request("again") == "again"
        assert not srv.stopped
        client.close()
        other.close()
    finally:
        srv.stop()
    assert any("could not answer a request" in r.getMessage() for r in caplog.records)


def test_the_control_client_never_goes_through_a_proxy(monkeypatch):
    """With http_proxy set (and no no_proxy), the control client still talks to the driver
    directly: a proxy would see every message and its token."""
    proxy = socket.create_server((LOOPBACK, 0))
    proxy.settimeout(0.2)
    seen: list[bytes] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                conn, _ = proxy.accept()
            except TimeoutError:
                continue
            with conn:
                seen.append(conn.recv(4096))

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    for name in ("http_proxy", "HTTP_PROXY"):
        monkeypatch.setenv(name, f"http://{LOOPBACK}:{proxy.getsockname()[1]}")
    for name in ("no_proxy", "NO_PROXY"):
        monkeypatch.delenv(name, raising=False)
    srv = ControlServer(LOOPBACK, limits=LIMITS, threads=2)
    try:
        key = "executor-0"
        client = ControlClient(srv.url, srv.issue_token(key), key)
        assert client.post("beat", {"progress": {"step": 3}}, timeout=5.0)["stop"] is False
        assert srv.snapshot()[key].progress == {"step": 3}
    finally:
        srv.close()
        done.set()
        thread.join(2.0)
        proxy.close()
    assert seen == [], seen


@pytest.mark.parametrize(
    ("name", "value", "field", "expected"),
    [
        ("SPARKTF_SERVER_MAX_CONNECTIONS", "100", "max_connections", 100),
        ("SPARKTF_SERVER_MAX_PER_PEER", "7", "max_per_peer", 7),
        ("SPARKTF_SERVER_MESSAGE_DEADLINE_S", "2.5", "message_deadline_s", 2.5),
        ("SPARKTF_SERVER_MAX_BUFFERED_BYTES", "1048576", "max_buffered_bytes", 1 << 20),
    ],
)
def test_limits_from_the_environment(monkeypatch, name, value, field, expected):
    monkeypatch.setenv(name, value)
    assert getattr(ConnectionLimits.from_env(), field) == expected
    monkeypatch.setenv(name, "-1")
    with pytest.raises(ValueError, match=name):
        ConnectionLimits.from_env()


def _register_nodes(address, secret: bytes, source: str, ids: list[int], out) -> None:
    """One simulated host: its nodes register at once, each on a connection of its own that
    it closes after the answer (what a node of a barrier stage does); ``out`` gets the
    failures."""
    failures = []

    def node(executor_id: int) -> None:
        meta = {"executor_id": executor_id, "host": source, "port": 20000 + executor_id}
        try:
            client = reservation.AuthClient(address, secret=secret, source=source)
            try:
                client.register(meta, gathers=True)
            finally:
                client.close()
        except Exception as exc:  # reported to the test
            failures.append(f"{executor_id}: {exc!r}")

    threads = [threading.Thread(target=node, args=(i,)) for i in ids]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    out.put(failures)


def test_three_hundred_nodes_from_fifteen_hosts_start_up_against_the_driver_server():
    """No ceiling at 256 processes (TensorFlowOnSpark's): 300 nodes on 15 addresses
    (127.0.0.2-16, one process each, its 20 nodes at once) register with the real
    reservation server under its default limits sized for the run; none is refused, every
    one gets its own control token, and the server is done with them all (it stops: the
    nodes learn the cluster from each other)."""
    import multiprocessing

    n, hosts = 300, 15  # (1,000 from 50: 2.3 s alone, 126 s in a busy .ci/run here: forks)
    secret = secrets.token_bytes(32)
    srv = reservation.AuthServer(
        n, secret=secret, bind_host=LOOPBACK, issue_token=lambda meta: f"t{meta['executor_id']}"
    )
    srv.start()
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    started = time.monotonic()
    try:
        procs = [
            context.Process(
                target=_register_nodes,
                args=(srv.address, secret, f"127.0.0.{2 + h}", list(range(h, n, hosts)), out),
            )
            for h in range(hosts)
        ]
        for proc in procs:
            proc.start()
        failures = [failure for _ in procs for failure in out.get(timeout=120)]
        for proc in procs:
            proc.join(30)
        elapsed = time.monotonic() - started
        assert failures == []
        assert srv.reservations.done() and srv.reservations.all_served.is_set()
        nodes = srv.reservations.get()
        assert sorted(node["executor_id"] for node in nodes) == list(range(n))
        assert {node["host"] for node in nodes} == {f"127.0.0.{2 + h}" for h in range(hosts)}
        assert srv._server.rejects.total == 0  # nobody displaced or refused
        logging.getLogger(__name__).info("%d nodes registered in %.1f s", n, elapsed)
        assert elapsed < 120  # a hang guard; bench/README.md records the time measured
    finally:
        srv.stop()
