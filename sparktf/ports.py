"""Free TCP ports: the one probe sparktf's servers, scripts and tests use.

A port found free can be taken by another process before it is bound again; callers that
start a server on it either retry or report the bind error with the port. A server that
another process starts later (TensorFlow's gRPC server, seconds after its port is chosen)
gets a port from :func:`server_port`, outside the range the kernel hands out by itself.

This is a bottom layer: it imports nothing of sparktf.
"""

from __future__ import annotations

import random
import socket

__all__ = ["LOOPBACK", "free_port", "port_free", "server_port"]

LOOPBACK = "127.0.0.1"
# The lowest port server_port chooses: above the well-known and most registered ones.
SERVER_PORTS_FLOOR = 10000
EPHEMERAL_RANGE = "/proc/sys/net/ipv4/ip_local_port_range"


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port free on ``host`` now (``""``: on every interface, for a server that other
    hosts must reach)."""
    with socket.socket() as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def port_free(port: int, host: str = LOOPBACK) -> bool:
    """Whether ``port`` of ``host`` can be bound now (nothing listens on it)."""
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def ephemeral_low(path: str = EPHEMERAL_RANGE) -> int | None:
    """The lowest port of the kernel's ephemeral range (what ``bind(0)`` and outgoing
    connections get); None where it cannot be read (not Linux)."""
    try:
        with open(path) as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None


def server_port(host: str = "", *, low: int | None = None, tries: int = 64) -> int:
    """A TCP port free on ``host`` now (``""``: every interface) for a server that another
    process binds later.

    :func:`free_port` takes it from the kernel's ephemeral range, where any outgoing
    connection or ``bind(0)`` of the machine may be given it before the server binds it
    (TensorFlow's "Could not start gRPC server"). This one draws ports at random between
    :data:`SERVER_PORTS_FLOOR` and the start of that range (``low``, by default read from
    the kernel), which the kernel never hands out by itself; only another chooser's
    explicit bind can take it. Where the kernel's range leaves less than 1024 ports below
    it (or cannot be read), it is :func:`free_port`."""
    low = ephemeral_low() if low is None else low
    if low is not None and low - SERVER_PORTS_FLOOR >= 1024:
        draw = random.SystemRandom()
        for _ in range(tries):
            port = draw.randrange(SERVER_PORTS_FLOOR, low)
            if port_free(port, host):
                return port
    return free_port(host)
