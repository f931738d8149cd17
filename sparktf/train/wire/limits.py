"""What unauthenticated network clients can hold of the driver's servers, and how their
refusals are logged.

The driver's reservation server (:mod:`sparktf.train.wire.frames`) and control server
(:mod:`sparktf.train.wire.control`) accept connections from anyone who can reach their address.
Before a message is authenticated a client costs the server a socket and a buffer, so both
servers keep a :class:`ConnectionTable` under :class:`ConnectionLimits`:

* at most ``max_connections`` open connections in all and ``max_per_peer`` from one IP
  address; a new connection over a limit takes the place of the oldest connection (of that
  peer, or of all) that has not yet completed a message -- a legitimate client completes
  its message within milliseconds of connecting, so it is never the oldest for long (and a
  reservation client sends its request again when displaced before an answer) -- and is
  refused when every open connection has completed one;
* a message (a frame, or an HTTP request's header and body) must be complete within
  ``message_deadline_s`` of its first byte, and a new connection must send a complete first
  message within that deadline of connecting: a client that trickles bytes is cut off;
* a connection that has completed a message may stay silent for ``idle_s`` between messages;
* the bytes a server holds of messages not yet complete, across all its connections, stay
  under ``max_buffered_bytes`` (a message is authenticated only once complete, so these are
  what unauthenticated peers make the driver hold): over it, the connections that hold the
  most and have not completed a message are closed first, largest first. The bound does not
  grow with a run's size; a real client's message is small and quick, never the largest for
  long.

:class:`RejectLog` writes refusals at a bounded rate: at most ``limit`` lines naming the
peer and the reason per window, then one summary line per window with the counts by reason.

The defaults can be changed with environment variables of the driver
(:meth:`ConnectionLimits.from_env`).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from sparktf.errors import SparktfValueError

__all__ = [
    "DEFAULT_LIMITS",
    "ENV_MAX_BUFFERED_BYTES",
    "ENV_MAX_CONNECTIONS",
    "ENV_MAX_PER_PEER",
    "ENV_MESSAGE_DEADLINE_S",
    "ConnectionLimits",
    "ConnectionTable",
    "RejectLog",
]

ENV_MAX_CONNECTIONS = "SPARKTF_SERVER_MAX_CONNECTIONS"
ENV_MAX_PER_PEER = "SPARKTF_SERVER_MAX_PER_PEER"
ENV_MESSAGE_DEADLINE_S = "SPARKTF_SERVER_MESSAGE_DEADLINE_S"
ENV_MAX_BUFFERED_BYTES = "SPARKTF_SERVER_MAX_BUFFERED_BYTES"


class RejectLog:
    """WARNING lines for rejected network input, naming the peer and the reason: at most
    ``limit`` per ``window_s``; the refusals past that are counted and summed up in one line
    (``"<what>: rejected N more requests in the last W s: <reason> xK, ..."``) when the
    window ends (at the next refusal or :meth:`flush`). A flood of forged requests thus
    writes at most ``limit + 1`` lines per window to the driver's log."""

    def __init__(
        self, logger: logging.Logger, what: str, *, limit: int = 5, window_s: float = 10.0
    ):
        self._log, self._what = logger, what
        self._limit, self._window_s = limit, window_s
        self._lock = threading.Lock()
        self._window_start = time.monotonic()
        self._count = 0
        self._suppressed: Counter[str] = Counter()
        self.total = 0  # every rejection, logged or not

    def reject(self, peer: str, reason: str, *, kind: str | None = None) -> None:
        """Records one refusal; ``kind`` (default ``reason``) groups it in the summary."""
        now = time.monotonic()
        with self._lock:
            self.total += 1
            summary = self._roll(now)
            if self._count >= self._limit:
                self._suppressed[kind or reason] += 1
                line = None
            else:
                self._count += 1
                line = reason
        if summary:
            self._log.warning("%s", summary)
        if line is not None:
            self._log.warning("%s: rejected a request from %s: %s", self._what, peer, line)

    def flush(self) -> None:
        """Writes the summary of a window that has ended (servers call it as they poll)."""
        with self._lock:
            summary = self._roll(time.monotonic())
        if summary:
            self._log.warning("%s", summary)

    def _roll(self, now: float) -> str | None:
        """Starts a new window when the current one has ended; its summary, if any."""
        if now - self._window_start <= self._window_s:
            return None
        suppressed, self._suppressed = self._suppressed, Counter()
        elapsed = now - self._window_start
        self._window_start, self._count = now, 0
        if not suppressed:
            return None
        reasons = ", ".join(f"{reason} x{n}" for reason, n in suppressed.most_common(5))
        more = len(suppressed) - 5
        return (
            f"{self._what}: rejected {sum(suppressed.values())} more requests in the last "
            f"{elapsed:.0f} s without a line each: {reasons}"
            + (f" and {more} other reasons" if more > 0 else "")
        )


def _env_number(name: str, default: float, kind: type) -> Any:
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        value = kind(text)
    except ValueError:
        raise SparktfValueError(f"{name}={text!r} is not a {kind.__name__}") from None
    if value <= 0:
        raise SparktfValueError(f"{name}={text!r} must be positive")
    return value


@dataclass(frozen=True)
class ConnectionLimits:
    """How much of a server unauthenticated clients may hold (see the module docstring).

    Raises:
        ValueError: when a limit is not positive.
    """

    max_connections: int = 256
    max_per_peer: int = 64
    message_deadline_s: float = 5.0
    idle_s: float = 60.0
    # of incomplete messages, all connections together: a few of the largest (1 MiB) messages
    max_buffered_bytes: int = 8 << 20

    def __post_init__(self):
        names = ("max_connections", "max_per_peer", "message_deadline_s", "idle_s")
        for name in (*names, "max_buffered_bytes"):
            if getattr(self, name) <= 0:
                raise SparktfValueError(f"ConnectionLimits.{name} must be positive")

    @classmethod
    def from_env(cls) -> ConnectionLimits:
        """The defaults, changed by ``SPARKTF_SERVER_MAX_CONNECTIONS``,
        ``SPARKTF_SERVER_MAX_PER_PEER``, ``SPARKTF_SERVER_MESSAGE_DEADLINE_S`` and
        ``SPARKTF_SERVER_MAX_BUFFERED_BYTES``.

        Raises:
            ValueError: when a setting is not a positive number.
        """
        return cls(
            max_connections=_env_number(ENV_MAX_CONNECTIONS, cls.max_connections, int),
            max_per_peer=_env_number(ENV_MAX_PER_PEER, cls.max_per_peer, int),
            message_deadline_s=_env_number(ENV_MESSAGE_DEADLINE_S, cls.message_deadline_s, float),
            max_buffered_bytes=_env_number(ENV_MAX_BUFFERED_BYTES, cls.max_buffered_bytes, int),
        )

    @classmethod
    def for_run(cls, processes: int) -> ConnectionLimits:
        """:meth:`from_env`, raised where a run of ``processes`` TensorFlow processes needs
        more: every process may connect at once (``max_connections`` at least ``processes``
        plus ``max_per_peer``), all from one address (``max_per_peer`` at least
        ``processes``: one large host). The limits stay against abuse, not against scale; the
        bytes held of incomplete messages stay bounded whatever the size
        (``max_buffered_bytes`` does not grow)."""
        base = cls.from_env()
        return cls(
            max_connections=max(base.max_connections, processes + base.max_per_peer),
            max_per_peer=max(base.max_per_peer, processes),
            message_deadline_s=base.message_deadline_s,
            idle_s=base.idle_s,
            max_buffered_bytes=base.max_buffered_bytes,
        )


DEFAULT_LIMITS = ConnectionLimits()


@dataclass
class _Entry:
    host: str
    opened: float
    started: float | None = None  # when the message under way began
    completed: int = 0  # messages completed on this connection
    last: float = field(default=0.0)  # when the last message completed
    busy: bool = False  # its request is being answered (not evictable)


class ConnectionTable:
    """The open connections of one server under ``limits``; thread-safe. Keys are whatever
    the server uses for a connection (its socket)."""

    def __init__(self, limits: ConnectionLimits, rejects: RejectLog):
        self.limits = limits
        self.rejects = rejects
        self._lock = threading.Lock()
        self._entries: dict[Any, _Entry] = {}
        self._per_host: Counter[str] = Counter()

    def __len__(self) -> int:
        with self._lock:
            return len(self._entries)

    def admit(self, key: Any, host: str, peer: str) -> tuple[bool, list[Any]]:
        """A new connection from ``host`` (``peer``: host and port, for the log): whether it
        is admitted, and the connections it displaces (the caller closes them)."""
        limits, now = self.limits, time.monotonic()
        with self._lock:
            evicted: list[Any] = []
            for scope in (host, None):
                if scope is None:
                    full = len(self._entries) - len(evicted) >= limits.max_connections
                else:
                    full = self._per_host[host] >= limits.max_per_peer
                if not full:
                    continue
                victim = self._oldest_unfinished(scope, exclude=evicted)
                if victim is None:
                    what = (
                        f"{limits.max_per_peer} connections from {host}"
                        if scope
                        else f"{limits.max_connections} connections"
                    )
                    self.rejects.reject(
                        peer, f"refused: already {what} open", kind="connection limit"
                    )
                    return False, []
                evicted.append(victim)
            for victim in evicted:
                self._drop(victim)
            self._entries[key] = _Entry(host, now)
            self._per_host[host] += 1
        for _ in evicted:
            self.rejects.reject(
                peer,
                "connection limit reached: closed the oldest connection that had not "
                "completed a message",
                kind="connection limit",
            )
        return True, evicted

    def _oldest_unfinished(self, host: str | None, *, exclude: list[Any]) -> Any:
        candidates = [
            (entry.opened, id(key), key)
            for key, entry in self._entries.items()
            if not entry.busy
            and entry.completed == 0
            and (host is None or entry.host == host)
            and key not in exclude
        ]
        return min(candidates)[2] if candidates else None

    def unfinished(self, key: Any) -> bool:
        """Whether ``key`` has completed no message yet and is not being answered (what a
        limit closes first)."""
        with self._lock:
            entry = self._entries.get(key)
            return entry is not None and entry.completed == 0 and not entry.busy

    def progress(self, key: Any, *, pending: bool) -> None:
        """Records that bytes arrived on ``key``; ``pending``: a message is incomplete."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return
            if pending and entry.started is None:
                entry.started = time.monotonic()
            elif not pending:
                entry.started = None

    def completed(self, key: Any, *, busy: bool = False) -> None:
        """Records a complete message on ``key`` (``busy``: it is being answered)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                entry.completed += 1
                entry.last = time.monotonic()
                entry.started = None
                entry.busy = busy

    def remove(self, key: Any) -> None:
        with self._lock:
            self._drop(key)

    def _drop(self, key: Any) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._per_host[entry.host] -= 1
            if not self._per_host[entry.host]:
                del self._per_host[entry.host]

    def expired(self) -> list[tuple[Any, str | None]]:
        """The connections past a deadline, with the reason to log (None: an idle client of
        its own, closed without a refusal); removed from the table, the caller closes them."""
        limits, now = self.limits, time.monotonic()
        out: list[tuple[Any, str | None]] = []
        with self._lock:
            for key, entry in list(self._entries.items()):
                if entry.busy:
                    continue
                if entry.started is not None and now - entry.started > limits.message_deadline_s:
                    why = f"message not complete within {limits.message_deadline_s:g} s"
                elif entry.completed == 0 and now - entry.opened > limits.message_deadline_s:
                    why = f"no complete message within {limits.message_deadline_s:g} s"
                elif entry.completed and now - entry.last > limits.idle_s:
                    why = None
                else:
                    continue
                out.append((key, why))
                self._drop(key)
        return out
