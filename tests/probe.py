"""A stranger's probe (``tests/multihost.py``'s ``Prober``): reads ``ADDRESS PORT`` lines on
stdin, tries each port once, and writes one JSON line per port on stdout: ``outcome`` is
``refused``, ``silent`` (accepted, then said nothing and closed or timed out), ``http STATUS``
(an HTTP answer), or ``bytes`` (something else came back), with the first bytes as
``sample``. Only the standard library: it runs on the outsider host as a plain script."""

from __future__ import annotations

import json
import socket
import sys

REQUEST = b"GET / HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n"


def probe(address: str, port: int, timeout_s: float = 3.0) -> dict:
    out = {"address": address, "port": port}
    try:
        sock = socket.create_connection((address, port), timeout=timeout_s)
    except OSError as exc:
        return {**out, "outcome": "refused", "sample": type(exc).__name__}
    received = b""
    with sock:
        try:
            sock.sendall(REQUEST)
            while len(received) < 512:
                chunk = sock.recv(512)
                if not chunk:
                    break
                received += chunk
        except OSError:
            pass  # reset or timed out: what came before it is the answer
    if not received:
        return {**out, "outcome": "silent", "sample": ""}
    if received.startswith(b"HTTP/"):
        status = received.split(b" ", 2)[1].decode(errors="replace")
        return {
            **out,
            "outcome": f"http {status}",
            "sample": received[:120].decode(errors="replace"),
        }
    return {**out, "outcome": "bytes", "sample": received[:64].hex()}


def main() -> None:
    for line in sys.stdin:
        if line.strip():
            address, port = line.split()
            print(json.dumps(probe(address, int(port))), flush=True)


if __name__ == "__main__":
    main()
