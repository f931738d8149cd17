"""Free ports (sparktf.ports): a server that another process starts later, TensorFlow's gRPC
server, gets a port outside the kernel's ephemeral range, so that no outgoing connection or
``bind(0)`` of the machine can be given it first."""

from __future__ import annotations

import socket

import pytest

from sparktf import ports

pytestmark = pytest.mark.unit


def test_a_server_port_is_free_and_below_the_ephemeral_range():
    low = ports.ephemeral_low()
    if low is None or low - ports.SERVER_PORTS_FLOOR < 1024:
        pytest.skip(f"the kernel's ephemeral range starts at {low}: no room below it")
    chosen = {ports.server_port("") for _ in range(20)}
    assert all(ports.SERVER_PORTS_FLOOR <= port < low for port in chosen)
    assert len(chosen) > 1  # drawn at random: two choosers rarely meet
    port = chosen.pop()
    with socket.socket() as server:
        server.bind(("", port))  # free now, on every interface


def test_taken_ports_are_not_chosen_and_no_room_falls_back_to_the_kernel():
    low = ports.ephemeral_low()
    if low is None or low - ports.SERVER_PORTS_FLOOR < 1024:
        pytest.skip(f"the kernel's ephemeral range starts at {low}: no room below it")
    floor = ports.SERVER_PORTS_FLOOR
    # No room below the range: the kernel's own choice (free_port), from its range.
    assert ports.server_port("", low=floor + 10) >= low
    # Every port of a 1024-port range taken (what could be bound of it): never one of them.
    held = []
    try:
        for port in range(floor, floor + 1024):
            sock = socket.socket()
            try:
                sock.bind(("", port))
            except OSError:  # taken by someone else already: as good
                sock.close()
                continue
            held.append(sock)
        assert ports.server_port("", low=floor + 1024) >= low
    finally:
        for sock in held:
            sock.close()


def test_the_ephemeral_range_is_read_from_the_kernel_file(tmp_path):
    (tmp_path / "range").write_text("40000\t60999\n")
    assert ports.ephemeral_low(str(tmp_path / "range")) == 40000
    (tmp_path / "bad").write_text("")
    assert ports.ephemeral_low(str(tmp_path / "bad")) is None
    assert ports.ephemeral_low(str(tmp_path / "missing")) is None


def test_tensorflow_port_pins_the_server_port_or_names_a_bad_value(monkeypatch):
    from sparktf.train.process import launcher

    monkeypatch.setenv("TENSORFLOW_PORT", "23456")
    assert launcher.tensorflow_port() == 23456
    for bad in ("http", "0", "70000"):
        monkeypatch.setenv("TENSORFLOW_PORT", bad)
        with pytest.raises(launcher.NodeFailed, match=f"TENSORFLOW_PORT.*{bad}"):
            launcher.tensorflow_port()
    monkeypatch.delenv("TENSORFLOW_PORT")
    assert 0 < launcher.tensorflow_port() < 65536


@pytest.mark.tensorflow_only  # TensorFlow's server alone: left to the first stack
def test_tensorflow_binds_its_server_to_every_interface_whatever_the_cluster_says():
    """The documented exception (docs/reliability.md, "What listens"): TensorFlow's gRPC
    server takes no address (``ServerDef`` has ``port`` only) and listens on every interface
    even when the cluster spec names 127.0.0.1. When a TensorFlow release lets it bind to the
    cluster address, this fails, and sparktf should bind it there."""
    import json
    import subprocess
    import sys

    from tensorflow.core.protobuf import tensorflow_server_pb2

    assert "address" not in {f.name for f in tensorflow_server_pb2.ServerDef.DESCRIPTOR.fields}
    for _ in range(3):  # a free port can be taken (the other test process) before TF binds it
        port = ports.free_port()
        script = (
            "import json, psutil, tensorflow as tf\n"
            f"spec = tf.train.ClusterSpec({{'worker': ['127.0.0.1:{port}']}})\n"
            "server = tf.distribute.Server(spec, job_name='worker', task_index=0)\n"
            "print(json.dumps([c.laddr.ip for c in psutil.Process().net_connections('tcp')\n"
            f"       if c.status == 'LISTEN' and c.laddr.port == {port}]))\n"
        )
        out = subprocess.run(  # 120 s ran out once in CI, four test processes on 2 cores
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
        )
        if "Could not start gRPC server" not in out.stderr:
            break
    assert out.returncode == 0, out.stderr[-2000:]
    bound = json.loads(out.stdout.strip().splitlines()[-1])
    assert bound and set(bound) <= {"0.0.0.0", "::"}, bound
