"""Free TCP ports: the one probe sparktf's servers, scripts and tests use.

A port found free can be taken by another process before it is bound again; callers that
start a server on it either retry or report the bind error with the port.

This is a bottom layer: it imports nothing of sparktf.
"""

from __future__ import annotations

import socket

__all__ = ["LOOPBACK", "free_port", "port_free"]

LOOPBACK = "127.0.0.1"


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
