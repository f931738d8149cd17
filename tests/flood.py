"""A connection flood against one server, run as its own process by the tests
(``python tests/flood.py HOST PORT SECONDS OUT``).

It keeps ``--hold`` connections open that send nothing (opening a new one, after a short
pause, whenever the server closes one, and retrying while nothing listens yet) and
``--tricklers`` connections that send one byte a second, each reopened when cut off. ``--kind
http`` trickles an HTTP request, ``frame`` a length-prefixed frame. When ``SECONDS`` have
passed or the file ``OUT.stop`` exists, it writes its counts to ``OUT`` (JSON): connections
opened, closed by the server, refused, and how long each trickler lasted before it was cut.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import selectors
import socket
import time

REOPEN_S = 0.5
PAYLOADS = {
    "http": b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n" + b" " * 100,
    "frame": b"\x00\x00\x01\x00" + b"x" * 256,
}


class Flood:
    def __init__(self, addr, hold: int, tricklers: int, payload: bytes):
        self.addr, self.payload = addr, payload
        self.selector = selectors.DefaultSelector()
        self.conns: dict[socket.socket, dict] = {}
        self.due: list[tuple[float, bool]] = [(0.0, False)] * hold + [(0.0, True)] * tricklers
        self.stats = {"opened": 0, "closed_by_server": 0, "refused": 0, "trickles_cut_s": []}

    def _open(self, trickle: bool) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setblocking(False)
        code = sock.connect_ex(self.addr)
        if code not in (0, errno.EINPROGRESS):
            sock.close()
            self.stats["refused"] += 1
            self.due.append((time.monotonic() + REOPEN_S, trickle))
            return
        self.conns[sock] = {"trickle": trickle, "sent": 0, "first": None, "next": 0.0}
        self.selector.register(sock, selectors.EVENT_READ)
        self.stats["opened"] += 1

    def _closed(self, sock: socket.socket, by_server: bool) -> None:
        conn = self.conns.pop(sock)
        self.selector.unregister(sock)
        sock.close()
        if by_server:
            self.stats["closed_by_server"] += 1
            if conn["trickle"] and conn["first"] is not None:
                self.stats["trickles_cut_s"].append(round(time.monotonic() - conn["first"], 2))
        self.due.append((time.monotonic() + REOPEN_S, conn["trickle"]))

    def step(self) -> None:
        now = time.monotonic()
        ready = [d for d in self.due if d[0] <= now]
        self.due = [d for d in self.due if d[0] > now]
        for _, trickle in ready:
            self._open(trickle)
        for key, _ in self.selector.select(0.05):
            sock = key.fileobj
            try:
                data = sock.recv(4096)
            except BlockingIOError:
                continue
            except OSError as exc:
                refused = exc.errno == errno.ECONNREFUSED
                self.stats["refused"] += refused
                self._closed(sock, by_server=not refused)
                continue
            if not data:
                self._closed(sock, by_server=True)
        for sock, conn in list(self.conns.items()):
            if conn["trickle"] and now >= conn["next"] and conn["sent"] < len(self.payload):
                try:
                    sock.send(self.payload[conn["sent"] : conn["sent"] + 1])
                except BlockingIOError:
                    continue
                except OSError:
                    continue  # not connected yet, or closed: the selector tells
                conn["sent"] += 1
                conn["first"] = conn["first"] or now
                conn["next"] = now + 1.0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("host")
    parser.add_argument("port", type=int)
    parser.add_argument("seconds", type=float)
    parser.add_argument("out")
    parser.add_argument("--hold", type=int, default=300)
    parser.add_argument("--tricklers", type=int, default=1)
    parser.add_argument("--kind", choices=sorted(PAYLOADS), default="frame")
    args = parser.parse_args()
    flood = Flood((args.host, args.port), args.hold, args.tricklers, PAYLOADS[args.kind])
    end = time.monotonic() + args.seconds
    while time.monotonic() < end and not os.path.exists(args.out + ".stop"):
        flood.step()
    flood.stats["open_at_end"] = len(flood.conns)
    with open(args.out, "w") as f:
        json.dump(flood.stats, f)


if __name__ == "__main__":
    main()
