"""Tests of the driver's network surface during a run: TensorFlowOnSpark's reservation
exchange (sparktf.train.wire.reservation) and the control server (sparktf.train.wire.control).

What an attacker on the same network would try, with real sockets: a forged pickle (whose
unpickling would create a marker file), a message signed with another key, a replayed
message, an oversize length or Content-Length, a wrong token; from 127.0.0.1 and from this
machine's external address. Each must run nothing, be logged as rejected, and leave the
server working. The last test starts a real run on the local-cluster session while such
messages are sent to its reservation port.
"""

from __future__ import annotations

import json
import os
import pickle
import secrets
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from tensorflowonspark import reservation as tfos_reservation

from sparktf.ports import free_port
from sparktf.security import redact
from sparktf.train.driver import bringup
from sparktf.train.wire import reservation
from sparktf.train.wire.control import MAX_REQUEST_BYTES, ControlClient, ControlServer
from tests import helpers

pytestmark = pytest.mark.unit  # tests of another tier carry their own mark

LOOPBACK = "127.0.0.1"


def external_address() -> str:
    """A non-loopback IPv4 address of this machine (skips the test when it has none)."""
    import psutil

    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if a.family == socket.AF_INET and not a.address.startswith("127."):
                with socket.socket() as s:  # really ours: it can be bound
                    s.bind((a.address, 0))
                return a.address
    pytest.skip("this machine has no non-loopback IPv4 address")


class Forged:
    """Unpickling this creates ``marker``: what an attacker's payload would do."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def prefixed(data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + data


def exchange(addr: tuple[str, int], data: bytes, timeout: float = 5.0) -> bytes:
    """Sends ``data`` on a new connection; returns everything received until the server
    closes the connection (b'' when it answered nothing)."""
    with socket.create_connection(addr, timeout=timeout) as sock:
        sock.sendall(data)
        received = b""
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                return received
            if not chunk:
                return received
            received += chunk


def ask(addr: tuple[str, int], frame: bytes) -> bytes:
    """Sends one frame; returns the server's length-prefixed answer (without its prefix)."""
    with socket.create_connection(addr, timeout=5.0) as sock:
        sock.sendall(frame)
        data = b""
        while len(data) < 4 or len(data) < 4 + struct.unpack(">I", data[:4])[0]:
            chunk = sock.recv(65536)
            assert chunk, "the server closed the connection without an answer"
            data += chunk
        return data[4:]


def refused(addr: tuple[str, int]) -> bool:
    try:
        socket.create_connection(addr, timeout=2.0).close()
    except ConnectionRefusedError:
        return True
    return False


def listens(port: int) -> set[str]:
    """The addresses on which this process listens on ``port`` (its own sockets only: another
    service may hold the same port number on another interface, or take it in the meantime)."""
    return {addr.ip for addr in helpers.listening() if addr.port == port}


def rejections(caplog, what: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelname == "WARNING" and r.getMessage().startswith(f"{what}: rejected")
    ]


NODE = {
    "executor_id": 0,
    "host": LOOPBACK,
    "job_name": "chief",
    "task_index": 0,
    "port": 2222,
    "tb_pid": 0,
    "tb_port": 0,
    "addr": (LOOPBACK, 40000),
    "authkey": b"\x00secret-authkey\xff",
}


@pytest.fixture
def server():
    secret = secrets.token_bytes(32)
    srv = reservation.AuthServer(2, secret=secret, bind_host=LOOPBACK)
    srv.secret = secret
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


# ----------------------------------------------------------------------------- reservations


def test_reservation_forged_pickle_runs_nothing_and_is_logged(server, tmp_path, caplog):
    marker = tmp_path / "pwned"
    client = reservation.AuthClient(server.address, secret=server.secret)
    assert client.register(NODE) == "OK"
    # The forged pickle: the connection is closed without an answer; nothing ran.
    assert exchange(server.address, prefixed(pickle.dumps(Forged(marker)))) == b""
    # TensorFlowOnSpark's own (unauthenticated) client cannot read the reservations.
    with pytest.raises(Exception, match="socket closed"):
        tfos_reservation.Client(server.address).get_reservations()
    time.sleep(0.2)
    assert not marker.exists()
    logged = rejections(caplog, "reservation server")
    assert len(logged) == 2 and all(f"from {LOOPBACK}:" in m for m in logged)
    assert all("not authentic" in m for m in logged)  # the pickle and TFoS's 30-byte QINFO
    # The server still serves the run.
    assert client.get_reservations() == [NODE]
    client.close()


def _flip_last_byte(frame: bytes) -> bytes:
    return frame[:-1] + bytes([frame[-1] ^ 1])


def test_reservation_wrong_mac_and_replay_are_rejected(server, caplog):
    query = {"msg": {"type": "QINFO"}}
    for forged in (
        reservation.Codec(b"another run's secret").seal(b"Q", query)[0],  # another run's key
        reservation.Codec(server.secret).seal(b"A", query)[0],  # an answer sent back as a request
        _flip_last_byte(reservation.Codec(server.secret).seal(b"Q", query)[0]),  # tampered
    ):
        assert exchange(server.address, forged) == b""
        assert "not authentic" in rejections(caplog, "reservation server")[-1]

    # A valid REG, as a client of this run sends it, answered once ...
    codec = reservation.Codec(server.secret)
    frame, nonce = codec.seal(b"Q", {"msg": {"type": "REG", "data": NODE}})
    answer = codec.open(*codec.verify(b"A", ask(server.address, frame)))
    assert answer == {"re": nonce.hex(), "msg": "OK"}
    assert server.reservations.get() == [NODE]
    # ... and sent again by someone who recorded it: rejected, not registered twice.
    assert exchange(server.address, frame) == b""
    assert "replayed message" in rejections(caplog, "reservation server")[-1]
    assert server.reservations.get() == [NODE]


def test_reservation_oversize_length_is_rejected_without_reading(server, caplog):
    start = time.monotonic()
    assert exchange(server.address, struct.pack(">I", 0xFFFFFFFF) + b"x" * 100) == b""
    elapsed = time.monotonic() - start
    assert elapsed < 1.0, f"took {elapsed:.2f} s"
    assert "too large: 4294967295 bytes" in rejections(caplog, "reservation server")[-1]


def test_reservation_client_gets_authkeys_and_address_tuples(server):
    second = {**NODE, "executor_id": 1, "job_name": "worker", "addr": "/tmp/pymp-x/listener"}
    clients = [reservation.AuthClient(server.address, secret=server.secret) for _ in range(2)]
    assert clients[0].register(NODE) == "OK"
    assert clients[0].request("QUERY") is False
    assert clients[1].register(second) == "OK"
    for client in clients:
        info = client.await_reservations()
        assert info == [NODE, second]
        assert type(info[0]["addr"]) is tuple and type(info[0]["authkey"]) is bytes
        client.close()
    assert server.reservations.done() and server.reservations.get() == [NODE, second]
    # A client with another run's secret gets nothing.
    with pytest.raises(reservation.ReservationError, match="closed the connection"):
        reservation.AuthClient(server.address, secret=secrets.token_bytes(32)).get_reservations()
    # stop() closes the port before it returns.
    server.stop()
    assert refused(server.address)


def test_reservation_server_listens_on_loopback_only(server):
    assert not refused(server.address)
    assert listens(server.address[1]) == {LOOPBACK}


def test_reservation_forged_pickle_from_the_external_address(tmp_path, caplog):
    """A cluster profile: the server bound to the machine's address rejects the forgery."""
    external = external_address()
    marker = tmp_path / "pwned"
    srv = reservation.AuthServer(1, secret=secrets.token_bytes(32), bind_host=external)
    addr = srv.start()
    try:
        assert addr[0] == external and listens(addr[1]) == {external}
        with socket.create_connection(addr, timeout=5.0, source_address=(external, 0)) as sock:
            sock.sendall(prefixed(pickle.dumps(Forged(marker))))
            assert sock.recv(100) == b""
        time.sleep(0.2)
        assert not marker.exists()
        assert f"from {external}:" in rejections(caplog, "reservation server")[-1]
    finally:
        srv.stop()


def test_authenticated_startup_always_stops_the_server():
    address = bringup.DriverAddress(bind=LOOPBACK, advertise=LOOPBACK)
    # A failed start (anything raised, SystemExit included): the server stops at once.
    for error in (RuntimeError("boom"), SystemExit(1)):
        with pytest.raises(type(error)):
            with bringup.authenticated_startup(address, 1) as startup:
                srv = startup.server
                addr = srv.address
                assert addr[0] == LOOPBACK and not refused(addr)
                raise error
        assert srv.stopped and refused(addr)
    # A successful start: the server stops once every node has fetched the cluster.
    with bringup.authenticated_startup(address, 1, served_timeout_s=30) as startup:
        srv = startup.server
        client = reservation.AuthClient(srv.address, secret=startup.secret)
        client.register(NODE)
    assert not srv.stopped  # the node has not fetched the complete list yet
    assert client.await_reservations() == [NODE]
    deadline = time.monotonic() + 3.0
    while not srv.stopped and time.monotonic() < deadline:
        time.sleep(0.05)
    assert srv.stopped and refused(srv.address)


def test_a_node_joins_with_the_authenticated_client_and_a_private_manager(
    tmp_path, monkeypatch, caplog
):
    """What a barrier task runs before its TensorFlow process: the executor's manager on a
    Unix socket (no network listener: TensorFlowOnSpark's own remote mode listens on every
    interface, and its address and authkey let anyone run code in the executor), the node
    registered over the authenticated frames, the control token kept, nothing of
    TensorFlowOnSpark replaced, and no authkey in a log line."""
    import logging

    from tensorflowonspark import TFManager as tfos_manager  # noqa: N813 (a module)

    from sparktf.train.process import launcher
    from sparktf.train.wire.control import issued_token

    monkeypatch.chdir(tmp_path)  # the executor-id file goes to the task's directory
    caplog.set_level(logging.DEBUG)
    originals = (tfos_reservation.Client, tfos_manager.TFManager, tfos_manager.start)
    secret = secrets.token_bytes(32)
    srv = reservation.AuthServer(
        1, secret=secret, bind_host=LOOPBACK, issue_token=lambda meta: "control-token-0123"
    )
    srv.start()

    inherited = helpers.listening()  # a forked manager holds this process's sockets too
    try:
        setup = launcher.NodeSetup(
            secret=secret, server_addr=srv.address, template={"chief": [3]}, spec=None
        )
        ctx = launcher.join_cluster(setup, 3)
    finally:
        srv.stop()
    try:
        (node,) = srv.reservations.get()
        assert node["executor_id"] == 3 and (node["job_name"], node["task_index"]) == ("chief", 0)
        assert ctx.cluster_info == [node] and node["authkey"] == ctx.authkey
        assert issued_token() == "control-token-0123"
        assert (tmp_path / "executor_id").read_text() == "3"
        assert isinstance(ctx.mgr.address, str)  # a Unix socket, in a private directory
        assert os.stat(os.path.dirname(ctx.mgr.address)).st_mode & 0o077 == 0
        assert helpers.listening(ctx.mgr._process.pid) <= inherited  # no listener of its own
        assert str(ctx.mgr.get("state")) == "'running'"
        assert (tfos_reservation.Client, tfos_manager.TFManager, tfos_manager.start) == originals
        for form in redact.secret_forms(ctx.authkey) | redact.secret_forms(secret):
            assert form not in caplog.text, form
    finally:
        ctx.mgr.shutdown()


def test_the_node_task_loads_without_importing_tensorflow():
    """An executor's Spark worker runs the node task without importing TensorFlow (sparktf's
    TensorFlow process is a fresh interpreter)."""
    code = (
        "import sys\n"
        "from sparktf.train.process import launcher\n"
        "from tensorflowonspark import TFManager, gpu_info, util\n"
        "assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'\n"
        "print('ok')\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "CUDA_VISIBLE_DEVICES": "", "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


# ----------------------------------------------------------------------------- control


def http_post(addr, body: bytes, headers: dict[str, str]) -> bytes:
    head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
    return exchange(addr, f"POST / HTTP/1.1\r\nHost: x\r\n{head}\r\n".encode() + body)


def status_of(response: bytes) -> int:
    if response.startswith(b"HTTP/"):
        return int(response.split(b" ", 2)[1])
    # no status line: the answer to a request line that is not HTTP/1.x (an error page)
    return int(response.split(b"Error code: ", 1)[1][:3])


@pytest.fixture
def control():
    srv = ControlServer(LOOPBACK)
    try:
        yield srv
    finally:
        srv.close()


def control_addr(srv: ControlServer) -> tuple[str, int]:
    return srv._httpd.server_address[:2]


def test_control_forged_pickle_and_non_json_are_rejected(control, tmp_path, caplog):
    marker = tmp_path / "pwned"
    addr = control_addr(control)
    forged = pickle.dumps(Forged(marker))
    # Raw, as sent to TensorFlowOnSpark's port (not even HTTP) ...
    assert status_of(exchange(addr, prefixed(forged) + b"\r\n")) == 400
    # ... and as an HTTP body.
    response = http_post(addr, forged, {"Content-Length": str(len(forged))})
    assert status_of(response) == 400 and b"not a JSON object" in response
    time.sleep(0.2)
    assert not marker.exists()
    logged = rejections(caplog, "control server")
    assert len(logged) == 2 and all(f"from {LOOPBACK}:" in m for m in logged)
    assert "not JSON" in logged[1]
    assert control.nodes == {}


def test_control_oversize_content_length_is_refused_before_reading(control, caplog):
    start = time.monotonic()
    response = http_post(control_addr(control), b"{}", {"Content-Length": str(10**12)})
    elapsed = time.monotonic() - start
    assert status_of(response) == 413 and elapsed < 2.0, (response[:100], elapsed)
    assert (
        f"Content-Length {10**12} above {MAX_REQUEST_BYTES}"
        in rejections(caplog, "control server")[-1]
    )


def test_control_answers_a_get_with_401_and_nothing_else(control, caplog):
    response = exchange(control_addr(control), b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert status_of(response) == 401 and b"control token" in response
    assert "GET request" in rejections(caplog, "control server")[-1]


def test_control_wrong_token_is_rejected_and_logged(control, caplog):
    body = json.dumps({"token": "0" * 32, "key": "executor-0", "event": "error"}).encode()
    response = http_post(control_addr(control), body, {"Content-Length": str(len(body))})
    assert status_of(response) == 403
    assert "wrong token" in rejections(caplog, "control server")[-1]
    assert control.nodes == {}
    # The run's own client still gets through.
    token = control.issue_token("executor-0")
    assert ControlClient(control.url, token, "executor-0").post("beat")["stop"] is False


def test_control_server_binds_only_the_driver_address(control, tmp_path, caplog):
    external = external_address()
    assert listens(control_addr(control)[1]) == {LOOPBACK}
    # Bound to the external address (a cluster profile): a forgery from there is rejected.
    marker = tmp_path / "pwned"
    srv = ControlServer(external)
    try:
        forged = pickle.dumps(Forged(marker))
        response = http_post(control_addr(srv), forged, {"Content-Length": str(len(forged))})
        assert status_of(response) == 400 and not marker.exists()
        assert f"from {external}:" in rejections(caplog, "control server")[-1]
        assert listens(control_addr(srv)[1]) == {external}
    finally:
        srv.close()


# ----------------------------------------------------------------------------- a real run


@pytest.mark.integration
def test_forged_pickle_during_a_real_start_runs_nothing(
    spark, mnist_data, tmp_path, monkeypatch, caplog
):
    from sparktf.train import RunConfig, ScalingConfig, TrainConfig, fit

    port = free_port()
    monkeypatch.setenv("TFOS_SERVER_PORT", str(port))
    marker = tmp_path / "pwned"
    forged = prefixed(pickle.dumps(Forged(marker)))
    qinfo = prefixed(pickle.dumps({"type": "QINFO"}))  # TensorFlowOnSpark's own request
    delivered: list[bytes] = []
    stop = threading.Event()

    def attack() -> None:
        while not stop.is_set():
            for payload in (forged, qinfo):
                try:
                    delivered.append(exchange((LOOPBACK, port), payload))
                except OSError:  # not listening (yet, or any more)
                    pass
            time.sleep(0.05)

    attacker = threading.Thread(target=attack, daemon=True)
    attacker.start()
    data = tmp_path / "data"
    shutil.copytree(mnist_data / "data", data)
    try:
        result = fit(
            TrainConfig(
                model="mnist_mlp",
                data=str(data),
                input_mode="files",
                steps=2,
                batch_size=8,
                model_config={"hidden_units": 8},
            ),
            ScalingConfig(strategy="allreduce", num_workers=2, threads_per_worker=1),
            RunConfig(
                model_dir=str(tmp_path / "model"),
                checkpoint={"every_steps": 2},
                failure={"failure_timeout_s": 60.0},
            ),
            spark=spark,
        )
    finally:
        stop.set()
        attacker.join(10.0)
    assert result.final_step == 2
    # The attacker got through to the port during the start, got no answer, ran nothing.
    assert delivered and set(delivered) == {b""}
    assert not marker.exists()
    logged = rejections(caplog, "reservation server")
    assert logged and all("not authentic" in m for m in logged)  # the pickle and QINFO
    assert refused((LOOPBACK, port))  # stopped once the cluster was up
    # The executors' Python workers (reused by PySpark) are back to TensorFlowOnSpark's client.
    clients = (
        spark.sparkContext.parallelize(range(4), 4)
        .map(lambda _: repr(__import__("tensorflowonspark.reservation").reservation.Client))
        .collect()
    )
    assert set(clients) == {repr(tfos_reservation.Client)}


FLOOD = Path(__file__).with_name("flood.py")


def start_flood(addr: tuple[str, int], out: Path, kind: str) -> subprocess.Popen:
    """300 silent connections and a one-byte-a-second sender against ``addr``, from a process
    of their own (tests/flood.py), for at most five minutes."""
    return subprocess.Popen(
        [sys.executable, str(FLOOD), addr[0], str(addr[1]), "300", str(out), "--kind", kind]
    )


def stop_flood(proc: subprocess.Popen, out: Path) -> dict:
    Path(f"{out}.stop").touch()
    proc.wait(30)
    return json.loads(out.read_text())


@pytest.mark.integration
def test_a_run_under_a_connection_flood_finishes_and_logs_refusals_at_a_bounded_rate(
    spark, mnist_data, tmp_path, monkeypatch, caplog
):
    """While a run starts and trains, 300 connections and a one-byte-a-second sender flood
    each server the driver listens on, from the moment it listens (the servers are found as
    the run creates them): the run finishes, the sender is cut off within the deadline, and
    each server's refusal lines stay within RejectLog's bound."""
    from sparktf.train import RunConfig, ScalingConfig, TrainConfig, fit
    from sparktf.train.driver import cluster
    from sparktf.train.wire.limits import ConnectionLimits

    floods: dict[str, tuple[subprocess.Popen, Path]] = {}
    controls: list[ControlServer] = []

    def flood(what: str, addr: tuple[str, int], kind: str) -> None:
        out = tmp_path / f"{what.replace(' ', '-')}.json"
        floods[what] = (start_flood(addr, out, kind), out)
        time.sleep(2.0)  # the flood is up before the run goes on

    class FloodedControlServer(ControlServer):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            controls.append(self)
            flood("control server", self.address, "http")

    start = reservation.AuthServer.start

    def flooded_start(self):
        address = start(self)
        flood("reservation server", (self.bind_host, address[1]), "frame")
        return address

    monkeypatch.setattr(cluster, "ControlServer", FloodedControlServer)
    monkeypatch.setattr(reservation.AuthServer, "start", flooded_start)
    data = tmp_path / "data"
    shutil.copytree(mnist_data / "data", data)
    started = time.monotonic()
    try:
        result = fit(
            TrainConfig(
                model="mnist_mlp",
                data=str(data),
                input_mode="files",
                steps=300,
                batch_size=8,
                model_config={"hidden_units": 8},
            ),
            ScalingConfig(strategy="allreduce", num_workers=2, threads_per_worker=1),
            RunConfig(
                model_dir=str(tmp_path / "model"),
                checkpoint={"every_steps": 300},
                failure={"failure_timeout_s": 120.0},
            ),
            spark=spark,
        )
    finally:
        stats = {what: stop_flood(*flood) for what, flood in floods.items()}
    elapsed = time.monotonic() - started
    print(json.dumps({"elapsed_s": round(elapsed, 1), **stats}))  # shown with -rA
    assert result.final_step == 300
    deadline = ConnectionLimits().message_deadline_s
    for what, counts in stats.items():
        # the flood reached the server, and no sender outlasted the deadline by much
        assert counts["opened"] >= 300, (what, counts)
        assert all(cut <= deadline + 2.0 for cut in counts["trickles_cut_s"]), (what, counts)
        # at most five lines and one summary per ten-second window
        lines = rejections(caplog, what)
        assert 0 < len(lines) <= 6 * (elapsed / 10.0 + 2), (what, len(lines), elapsed)
    assert stats["control server"]["trickles_cut_s"], stats
    assert controls[0].rejects.total > 300  # refused far more than it logged
