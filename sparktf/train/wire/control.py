"""The driver's control channel to the TensorFlow processes of one run.

The driver runs a small HTTP server (:class:`ControlServer`); every TensorFlow process
(:class:`ControlClient`) posts JSON events to it and reads the run's state from each answer:

========  ==============================================================================
hello     first call; the answer carries the node's role and the TF cluster, once the
          driver has them (the node polls until then)
beat      heartbeat every second with the node's latest progress (step, loss, ...)
peek      a feeding task asks for the flags only (no node state)
eval      the chief evaluated during training: the step and its metrics (the driver logs
          each one and keeps the last ``MAX_KEPT`` for the result's history)
report    a user's training function called ``sparktf.train.report``: its metrics and,
          from the chief, the checkpoint it published (the last ``MAX_KEPT`` kept in order
          for the result)
feed      a user's training function opened its DataFrame feed: the global batch it asked
          for (the driver's feed waits for it from every training process)
error     the node failed: exception type, message and traceback tail
done      the chief finished the run: its final result (no other process may send it)
finished  a process other than the chief finished its part (its own report)
bye       the node's process is about to exit
========  ==============================================================================

Credentials: every TensorFlow process has a token of its own (:meth:`ControlServer.issue_token`,
handed to it by the reservation server when its node registers, or by the driver to the
parameter servers it starts itself), which the server maps to the process's key: a request
speaks for the process whose token it carries, and only the chief's token may send ``done``.
The run's token (:attr:`ControlServer.token`), which feeding tasks receive in their Spark
closure, may only ``peek``.

The server is a :class:`~sparktf.train.wire.bounded_http.BoundedHTTPServer`: limits on
connections in all and per peer, a deadline to send a whole request, a fixed pool of threads
(:mod:`sparktf.train.wire.limits`).

Every answer holds ``stop`` (the run is over: leave), ``abort`` (the run failed elsewhere:
exit now), ``feed_end`` (spark input mode: how many feed chunks each node receives in
total, once the feed has ended) and ``pause`` (an elastic run changes size: the training
processes stop together at their next checkpoint, the chief reports ``done`` with
``end_reason`` ``"paused"``; None otherwise).

Why not files in the model directory: the driver must learn about a failure within seconds
and tell every process, and every executor can reach the driver anyway (TensorFlowOnSpark's
reservation server relies on it). A node that cannot reach the driver for
``driver_lost_s`` exits: a dead driver leaves nothing behind.

This module imports neither TensorFlow nor Spark.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

from sparktf.errors import SparktfError, SparktfRuntimeError, SparktfValueError
from sparktf.train.wire.bounded_http import BoundedHTTPServer
from sparktf.train.wire.limits import ConnectionLimits, RejectLog

__all__ = [
    "BEAT_INTERVAL_S",
    "CONTROL_THREADS",
    "HELLO_POLL_S",
    "MAX_KEPT",
    "MAX_REQUEST_BYTES",
    "REQUEST_TIMEOUT_S",
    "ControlClient",
    "ControlHandler",
    "ControlServer",
    "DriverLost",
    "NodeState",
    "Recent",
    "RejectLog",
    "RunFlags",
    "encode",
    "issued_token",
    "keep_issued_token",
]

log = logging.getLogger(__name__)

BEAT_INTERVAL_S = 1.0
HELLO_POLL_S = 0.1  # how often a process that has no role yet asks for it
MAX_REQUEST_BYTES = 1 << 20  # events are a few hundred bytes; larger bodies are not read
REQUEST_TIMEOUT_S = ConnectionLimits.message_deadline_s  # the default time to send a request
CONTROL_THREADS = 8  # the pool that answers complete requests (each takes microseconds)
MAX_KEPT = 1000  # of each process's evaluations and reports: the last ones (NodeState)

_ISSUED: list[str] = []  # the control token this executor's node received (at most one)


def keep_issued_token(token: str | None) -> None:
    """Keeps (None: forgets) the control token the reservation server issued to this
    executor's node, for :func:`issued_token` (the node function, later in the same Spark
    task or in TensorFlowOnSpark's process forked from it)."""
    _ISSUED[:] = [] if token is None else [token]


def issued_token() -> str | None:
    """The control token kept by :func:`keep_issued_token`, or None."""
    return _ISSUED[0] if _ISSUED else None


class Recent:
    """The last ``keep`` entries of a stream a process sends (its evaluations, its reports),
    numbered from 0 in the order they came: :attr:`total` came in all, the first
    :attr:`dropped` of them are no longer kept. A reader keeps the number it has read up to
    (``total`` when it read) and asks :meth:`since` for the rest: the numbers stay right when
    old entries go."""

    def __init__(self, keep: int = MAX_KEPT, entries=(), total: int | None = None):
        self.keep = keep
        self._entries: deque = deque(entries, maxlen=keep)
        self.total = len(self._entries) if total is None else total

    def append(self, entry: Any) -> None:
        self._entries.append(entry)
        self.total += 1

    @property
    def dropped(self) -> int:
        """How many of the entries that came are no longer kept (the oldest)."""
        return self.total - len(self._entries)

    def since(self, seen: int) -> list:
        """The kept entries numbered ``seen`` and after (those dropped before they could be
        read: ``dropped - seen`` when positive)."""
        return list(self._entries)[max(0, seen - self.dropped) :]

    def copy(self) -> Recent:
        return Recent(self.keep, self._entries, self.total)

    def __iter__(self) -> Iterator:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __getitem__(self, index):
        return list(self._entries)[index]

    def __eq__(self, other) -> bool:
        if isinstance(other, Recent):
            return (list(self), self.total) == (list(other), other.total)
        return list(self) == other

    def __repr__(self) -> str:
        return f"Recent({list(self._entries)!r}, total={self.total})"


@dataclass
class NodeState:
    """What the driver knows of one TensorFlow process (by its node key). Its evaluations
    and reports are the last :data:`MAX_KEPT` of each (:class:`Recent`: how many came, how
    many were dropped): a process that reports every step cannot grow the driver's memory."""

    key: str
    role: str = "?"
    first_seen: float = field(default_factory=time.monotonic)
    last_seen: float = field(default_factory=time.monotonic)
    progress: dict = field(default_factory=dict)
    done: dict | None = None
    error: dict | None = None
    bye: bool = False
    evals: Recent = field(default_factory=Recent)  # the chief's evaluations, in order
    reports: Recent = field(default_factory=Recent)  # sparktf.train.report()s, in order
    checkpointed: dict | None = None  # the last report naming a checkpoint, even if dropped
    feed: dict | None = None  # spark input mode: how the process opened its feed ({"batch"})
    pid: int | None = None
    host: str | None = None


class ControlHandler(BaseHTTPRequestHandler):
    """The HTTP side of :class:`ControlServer`: one request, checked (its length, that it is a
    JSON object) and handed to the control server its HTTP server serves
    (``self.server.control``); anything but a POST is refused, and malformed HTTP is logged
    as a rejection, never as the standard library's line on stderr."""

    server: BoundedHTTPServer  # with .control, set by ControlServer

    def _peer(self) -> str:
        return f"{self.client_address[0]}:{self.client_address[1]}"

    def _reply(self, status: int, answer: dict, *, close: bool = False) -> None:
        body = json.dumps(answer).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        control = self.server.control
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_REQUEST_BYTES:
            reason = (
                f"Content-Length {length} above {MAX_REQUEST_BYTES}"
                if length > MAX_REQUEST_BYTES
                else "no valid Content-Length"
            )
            control.rejects.reject(self._peer(), reason)
            status = 413 if length > MAX_REQUEST_BYTES else 411
            self._reply(status, {"error": reason}, close=True)
            return
        try:
            request = json.loads(self.rfile.read(length) or b"{}")
            if not isinstance(request, dict):
                raise SparktfValueError("not a JSON object")
        except (ValueError, UnicodeDecodeError, RecursionError) as exc:
            control.rejects.reject(self._peer(), f"not JSON ({type(exc).__name__})")
            self._reply(400, {"error": "the request is not a JSON object"}, close=True)
            return
        try:
            status, answer = control.answer(request)
        except Exception as exc:  # a malformed request must not kill the server
            status, answer = 400, {"error": f"{type(exc).__name__}: {exc}"}
        if status == 403:
            control.rejects.reject(self._peer(), answer["error"], kind="refused credentials")
        self._reply(status, answer)

    def _refuse_method(self):
        # only POSTs carrying a token are answered: a stranger's GET learns nothing
        self.server.control.rejects.reject(self._peer(), f"{self.command} request")
        self._reply(401, {"error": "only POST requests with a control token"}, close=True)

    do_GET = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _refuse_method  # noqa: N815

    def log_error(self, format, *args):
        # malformed HTTP (a request line that is not HTTP, an oversize header, ...);
        # the message quotes the sender's bytes: escaped and shortened for the log
        message = (format % args).encode("ascii", "backslashreplace").decode()
        self.server.control.rejects.reject(self._peer(), message[:160])

    def log_message(self, *args):  # keep the driver's log clean
        pass


class ControlServer:
    """Driver side: nodes' state, the published cluster plan, and the run's flags.

    Listens on ``bind_host`` only (default: ``advertise_host``; the driver passes Spark's
    driver address, loopback on the local profile). A request is rejected -- logged at
    WARNING with the peer's address (at a bounded rate), nothing else done -- when its
    ``Content-Length`` is missing or above :data:`MAX_REQUEST_BYTES` (413, before the body is
    read), its body is not a JSON object (400), its token is neither a process's token
    (:meth:`issue_token`) nor, for ``peek``, the run's, its key is not its token's process,
    or it sends ``done`` with a token other than the chief's (403). ``limits`` (default
    :meth:`~sparktf.train.wire.limits.ConnectionLimits.from_env`) bound the connections and the
    time to send a request; ``threads`` answer the complete requests.

    Raises:
        OSError: when ``bind_host`` cannot be bound.
    """

    def __init__(
        self,
        advertise_host: str,
        *,
        on_event: Callable[[str, str, dict], None] | None = None,
        bind_host: str | None = None,
        limits: ConnectionLimits | None = None,
        threads: int = CONTROL_THREADS,
    ):
        self.token = secrets.token_hex(16)  # the run's: feeding tasks' peek only
        self._keys: dict[str, str] = {}  # process token -> the process's key
        self._issued: set[str] = set()  # keys that have a token
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self.nodes: dict[str, NodeState] = {}
        self.plans: dict[str, dict] = {}
        self.stop = False
        self.abort: str | None = None
        self.feed_end: dict[str, int] | None = None
        self.pause: str | None = None  # an elastic run's resize: stop at the next checkpoint
        self._on_event = on_event
        self.rejects = RejectLog(log, "control server")
        self._httpd = BoundedHTTPServer(
            (bind_host or advertise_host, 0),
            ControlHandler,
            rejects=self.rejects,
            limits=limits or ConnectionLimits.from_env(),
            threads=threads,
            max_body=MAX_REQUEST_BYTES,
        )
        self._httpd.control = self  # what ControlHandler answers for
        self.url = f"http://{advertise_host}:{self._httpd.server_address[1]}"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="sparktf-control", daemon=True
        )
        self._thread.start()
        log.debug("control server at %s (bound to %s)", self.url, self._httpd.server_address[0])

    @property
    def address(self) -> tuple[str, int]:
        """The address the server is bound to."""
        return self._httpd.server_address[:2]

    # -- requests ------------------------------------------------------------------------

    def issue_token(self, key: str) -> str:
        """A new control token for the process ``key`` (one per key: the first registration
        of a node wins).

        Raises:
            ValueError: when ``key`` already has a token.
        """
        with self._lock:
            if key in self._issued:
                raise SparktfValueError(f"{key} already has a control token")
            token = secrets.token_hex(16)
            self._issued.add(key)
            self._keys[token] = key
            return token

    def _authorize(self, request: dict) -> tuple[str | None, str | None]:
        """The key the request may speak for (None: the run's token, peek only), or an
        error saying why it is refused."""
        token, event = request.get("token"), request.get("event")
        if not isinstance(token, str):
            return None, "no token"
        if hmac.compare_digest(token.encode(), self.token.encode()):
            return None, None if event == "peek" else f"the run's token may not send {event!r}"
        with self._lock:
            key = self._keys.get(token)
            plan = self.plans.get(key) if key is not None else None
        if key is None:
            return None, "wrong token: not a process of this run"
        if request.get("key") != key:
            return None, f"the token of {key} used for {str(request.get('key'))[:40]!r}"
        if event == "done" and (plan is None or plan.get("role") != "chief"):
            return None, f"{key} is not the chief: only the chief reports done"
        return key, None

    def answer(self, request: dict) -> tuple[int, dict]:
        """The status and the answer to one request (a JSON object), for its handler."""
        key, refused = self._authorize(request)
        if refused:
            return 403, {"error": refused}
        event, data = request["event"], request.get("data") or {}
        now = time.monotonic()
        if event == "peek":  # feeding tasks: the run's flags, no node state
            with self._lock:
                return 200, {
                    "stop": self.stop,
                    "abort": self.abort,
                    "feed_end": None,
                    "plan": None,
                    "pause": None,
                }
        with self._lock:
            node = self.nodes.get(key)
            if node is None:
                node = self.nodes[key] = NodeState(key)
            node.last_seen = now
            if event == "hello":
                node.pid, node.host = data.get("pid"), data.get("host")
            elif event == "beat":
                if data.get("progress"):
                    node.progress = data["progress"]
            elif event == "error":
                node.error = data
            elif event in ("done", "finished"):
                node.done = data
                if data.get("progress"):
                    node.progress = data["progress"]
            elif event == "eval":
                node.evals.append(data)
            elif event == "report":
                node.reports.append(data)
                if data.get("checkpoint"):  # what the next attempt resumes from: always kept
                    node.checkpointed = data
            elif event == "feed":
                node.feed = data
            elif event == "bye":
                node.bye = True
            plan = self.plans.get(key)
            if plan:
                node.role = plan["name"]
            answer = {
                "stop": self.stop,
                "abort": self.abort,
                "feed_end": self.feed_end,
                "plan": plan if event == "hello" else None,
                "pause": self.pause,
            }
            self._changed.notify_all()
        if self._on_event is not None and event in ("error", "done"):
            self._on_event(key, event, data)
        return 200, answer

    # -- driver API ----------------------------------------------------------------------

    def publish_plans(self, plans: dict[str, dict]) -> None:
        with self._lock:
            self.plans.update(plans)
            for key, plan in plans.items():
                self.nodes.setdefault(key, NodeState(key)).role = plan["name"]
            self._changed.notify_all()

    def set_feed_end(self, counts: dict[str, int]) -> None:
        with self._lock:
            self.feed_end = dict(counts)
            self._changed.notify_all()

    def request_pause(self, reason: str) -> None:
        """Asks the training processes to stop at their next checkpoint (an elastic run's
        planned resize); the chief then reports ``done`` with ``end_reason`` ``"paused"``."""
        with self._lock:
            if self.pause is None:
                self.pause = reason
            self._changed.notify_all()

    def request_stop(self) -> None:
        with self._lock:
            self.stop = True
            self._changed.notify_all()

    def request_abort(self, reason: str) -> None:
        with self._lock:
            if self.abort is None:
                self.abort = reason
            self.stop = True
            self._changed.notify_all()

    def snapshot(self) -> dict[str, NodeState]:
        with self._lock:
            return {
                k: NodeState(**{**vars(v), "evals": v.evals.copy(), "reports": v.reports.copy()})
                for k, v in self.nodes.items()
            }

    def wait(self, timeout: float) -> None:
        """Waits up to ``timeout`` seconds for the next event."""
        with self._lock:
            self._changed.wait(timeout)

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()


class DriverLost(SparktfError, RuntimeError):
    """The driver's control server could not be reached in time."""


# An opener with no proxy handler from the environment: the control client talks to the
# driver directly.
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class ControlClient:
    """Node side: posts events; a heartbeat thread keeps ``stop``/``abort``/``feed_end``."""

    def __init__(self, url: str, token: str, key: str, *, driver_lost_s: float = 60.0):
        self.url, self.token, self.key = url, token, key
        self.driver_lost_s = driver_lost_s
        self.stop = False
        self.abort: str | None = None
        self.feed_end: dict[str, int] | None = None
        self.pause: str | None = None  # an elastic run's resize: stop at the next checkpoint
        self._progress: dict = {}
        self._lock = threading.Lock()
        self._last_ok = time.monotonic()
        self._thread: threading.Thread | None = None
        self._on_abort: Callable[[str], None] | None = None
        self._parent = os.getppid()

    def post(self, event: str, data: dict | None = None, *, timeout: float = 10.0) -> dict:
        body = json.dumps(
            {"token": self.token, "key": self.key, "event": event, "data": data or {}}
        ).encode()
        request = urllib.request.Request(
            self.url, data=body, method="POST", headers={"Content-Type": "application/json"}
        )
        # Straight to the driver: never through $http_proxy, which would see every
        # message and its token (a cluster's proxy rarely lists the driver in no_proxy).
        with _DIRECT.open(request, timeout=timeout) as response:
            answer = json.loads(response.read())
        self._last_ok = time.monotonic()
        self._absorb(answer)
        return answer

    def _absorb(self, answer: dict) -> None:
        self.stop = bool(answer.get("stop"))
        if answer.get("feed_end") is not None:
            self.feed_end = answer["feed_end"]
        if answer.get("abort") and self.abort is None:
            self.abort = answer["abort"]
        if answer.get("pause") and self.pause is None:
            self.pause = answer["pause"]

    def hello(self, timeout_s: float) -> dict:
        """Polls the driver until it publishes this node's plan; returns the plan."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                answer = self.post("hello", {"pid": os.getpid(), "host": os.uname().nodename})
                if answer.get("abort"):
                    raise SparktfRuntimeError(f"the run was aborted: {answer['abort']}")
                if answer.get("plan"):
                    return answer["plan"]
            except (urllib.error.URLError, OSError) as exc:
                if time.monotonic() > deadline:
                    raise DriverLost(f"cannot reach the driver at {self.url}: {exc}") from exc
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"the driver did not assign a role to {self.key} within {timeout_s:.0f} s"
                )
            time.sleep(HELLO_POLL_S)

    def set_progress(self, progress: dict) -> None:
        with self._lock:
            self._progress = dict(progress)

    def start_heartbeat(self, on_abort: Callable[[str], None]) -> None:
        """Beats every second; calls ``on_abort(reason)`` (which should exit the process) when
        the driver aborts the run, is unreachable for ``driver_lost_s``, or the parent
        process (the Spark task that started this one) is gone."""
        self._on_abort = on_abort

        def beat() -> None:
            while True:
                with self._lock:
                    progress = dict(self._progress)
                try:
                    self.post("beat", {"progress": progress}, timeout=5.0)
                except Exception as exc:  # the driver may be busy or gone: count the silence
                    silent = time.monotonic() - self._last_ok
                    if silent > self.driver_lost_s:
                        on_abort(f"driver unreachable for {silent:.0f} s ({exc})")
                        return
                if self.abort:
                    on_abort(f"run aborted by the driver: {self.abort}")
                    return
                if os.getppid() != self._parent:
                    on_abort("parent process (the Spark task) is gone")
                    return
                time.sleep(BEAT_INTERVAL_S)

        self._thread = threading.Thread(target=beat, name="sparktf-heartbeat", daemon=True)
        self._thread.start()

    def wait_for_stop(self, poll_s: float = 0.5) -> None:
        """Blocks until the driver says the run is over (abort exits through the heartbeat)."""
        while not self.stop:
            time.sleep(poll_s)

    def send(self, event: str, data: dict | None = None, *, attempts: int = 3) -> dict | None:
        """Posts an event, retrying a few times; None if the driver cannot be reached."""
        for attempt in range(attempts):
            try:
                return self.post(event, data)
            except Exception as exc:
                if attempt == attempts - 1:
                    log.warning("could not send %s to the driver: %s", event, exc)
                time.sleep(0.5)
        return None


def encode(obj: Any) -> Any:
    """JSON-safe copy of progress/metrics values (numpy scalars to floats)."""
    if isinstance(obj, dict):
        return {str(k): encode(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [encode(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    try:
        return float(obj)
    except (TypeError, ValueError):
        return str(obj)


class RunFlags:
    """The run's ``stop``/``abort`` flags as a feeding task sees them (polled at most once
    per ``every_s``; an unreachable driver counts as no news)."""

    def __init__(self, url: str, token: str, every_s: float = 1.0):
        self._client = ControlClient(url, token, "feeder")
        self.every_s = every_s
        self._next = 0.0

    def check(self) -> None:
        now = time.monotonic()
        if now < self._next:
            return
        self._next = now + self.every_s
        try:
            self._client.post("peek", timeout=5.0)
        except Exception:
            return
        if self._client.abort:
            raise SparktfRuntimeError(f"the run was aborted: {self._client.abort}")

    @property
    def stopped(self) -> bool:
        return self._client.stop
