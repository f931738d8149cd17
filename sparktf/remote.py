"""Spark Connect sessions: telling one apart, its URL, the settings it takes, its progress.

A Spark Connect client (``SparkSession.builder.remote("sc://host:port")``) runs no JVM of its
own: its session has no SparkContext, no RDDs and no accumulators, and it takes only runtime
settings (Spark SQL's modifiable ones); the cluster's settings (master, executors, memory,
Python) are the Connect server's. :func:`sparktf.spark.get_session` comes here when it is given
a Connect URL (``--remote``, or ``$SPARK_REMOTE``).

A classic SparkContext and a Connect session cannot live in one Python process (PySpark's
functions pick their implementation per process): :func:`connect_session` refuses, saying so,
when a classic one is running.

Everything a client sends goes to the server over its gRPC channel: a run's functions and the
secrets they hold among it. A channel in clear (no TLS) to another host is refused
(:func:`check_channel`, by :func:`connect_session` and again when a run starts on a session
of the user's own) unless the user accepts the risk by name, ``SPARKTF_CONNECT_ALLOW_CLEAR=1``.

Nothing of PySpark's Connect client is imported unless a Connect session is asked for, so
this works where its dependencies (grpcio, ...) are not installed.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import sys
import threading
import weakref
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sparktf.errors import SparktfError, SparktfValueError
from sparktf.security.redact import redact_url

__all__ = [
    "ALLOW_CLEAR_ENV",
    "CONNECT_URL_EXAMPLE",
    "DEFAULT_PORT",
    "REMOTE_ENV",
    "ClassicSessionError",
    "ConnectUnreachableError",
    "InsecureChannelError",
    "allow_clear",
    "channel",
    "channel_warning",
    "check_channel",
    "check_url",
    "classic_context",
    "clear_channel",
    "connect_session",
    "is_connect",
    "is_loopback",
    "remote_url",
    "split_runtime",
    "stage_counts",
    "url_address",
    "url_protected",
]

log = logging.getLogger(__name__)

REMOTE_ENV = "SPARK_REMOTE"  # PySpark's own variable for the Connect URL
# The user's opt-in to a Connect channel in clear to another host (refused otherwise).
ALLOW_CLEAR_ENV = "SPARKTF_CONNECT_ALLOW_CLEAR"
DEFAULT_PORT = 15002  # a Connect URL without a port means this one
CONNECT_URL_EXAMPLE = "sc://localhost:15002/;token=..."
REACH_TIMEOUT_S = 5.0

_URL = re.compile(r"sc://(?P<host>\[[^\]]+\]|[^:/;]+)(?::(?P<port>\d+))?(?P<rest>/.*)?\Z", re.I)


# is_connect's answers, by session (or SparkContext), while the object lives
_CONNECT: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


class ClassicSessionError(SparktfError, RuntimeError):
    """A Spark Connect session was asked for in a process that runs a classic SparkContext."""


class ConnectUnreachableError(SparktfError, ConnectionError):
    """Nothing answers at the address of a Spark Connect URL."""


class InsecureChannelError(SparktfError, PermissionError):
    """A Spark Connect channel in clear to another host, which the user did not accept."""


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (``pyspark.sql.connect.session.
    SparkSession``). False for anything else: a classic session, a SparkContext, None.

    Asked once per object: the answer is kept while the object lives (an object's class does
    not change), so every later check of the same session is a lookup and agrees with the
    first. What cannot be kept (None, an object without weak references) is asked each time.
    """
    try:
        return _CONNECT[spark]
    except (KeyError, TypeError):  # not asked yet, or not kept
        pass
    module = sys.modules.get("pyspark.sql.connect.session")  # no instance without the module
    cls = getattr(module, "SparkSession", None)
    answer = cls is not None and isinstance(spark, cls)
    try:
        _CONNECT[spark] = answer
    except TypeError:
        pass
    return answer


def channel(spark: Any) -> tuple[str, int, bool]:
    """A Connect session's server: its host, its port and whether the channel is protected
    (TLS, or a token over gRPC local credentials to ``localhost``).

    Raises:
        SparktfValueError: when the session does not tell (another pyspark client).
    """
    try:
        builder = spark.client._builder
        host = (builder.host or "localhost").strip("[]")
        return host, int(builder._port or DEFAULT_PORT), bool(builder.secure)
    except (AttributeError, TypeError, ValueError) as exc:
        raise SparktfValueError(f"cannot read the Spark Connect session's server: {exc}") from None


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine's loopback interface."""
    if host == "localhost":
        return True
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except OSError:
        return False
    return bool(infos) and all(
        info[4][0].startswith("127.") or info[4][0] == "::1" for info in infos
    )


def url_protected(url: str) -> bool:
    """Whether pyspark protects the channel of the Connect URL ``url`` (its ``secure``):
    ``use_ssl=true``, or a token (TLS to any host but ``localhost``, where gRPC's local
    credentials stand for it)."""
    rest = _URL.match(check_url(url)).group("rest") or ""
    params = dict(
        part.split("=", 1) if "=" in part else (part, "") for part in rest[2:].split(";") if part
    )
    params = {key.lower(): value for key, value in params.items()}
    return params.get("use_ssl", "").lower() == "true" or "token" in params


def allow_clear() -> bool:
    """Whether the user accepts a Connect channel in clear to another host
    (``SPARKTF_CONNECT_ALLOW_CLEAR=1``)."""
    return os.environ.get(ALLOW_CLEAR_ENV, "").strip().lower() in ("1", "true", "yes")


def clear_channel(host: str, port: int, protected: bool) -> str | None:
    """What is wrong with a Connect channel to ``host:port`` that is not ``protected`` (TLS,
    or a token to ``localhost``) and goes over the network: None on loopback or a protected
    channel."""
    if protected or is_loopback(host):
        return None
    return (
        f"the Spark Connect channel to {host}:{port} is not encrypted (the URL has neither "
        "use_ssl=true nor a token): everything sent to the server, the run's secrets among it "
        "(reservation secret, control tokens, inside the functions sent), travels in clear"
    )


def check_channel(host: str, port: int, protected: bool) -> str | None:
    """Refuses a Connect channel in clear to another host (:func:`clear_channel`) unless the
    user opted in (``SPARKTF_CONNECT_ALLOW_CLEAR=1``): then returns the warning to log; None
    for a protected or loopback channel.

    Raises:
        InsecureChannelError: naming the channel, how to protect it and the opt-in.
    """
    problem = clear_channel(host, port, protected)
    if problem is None:
        return None
    if allow_clear():
        return f"{problem} ({ALLOW_CLEAR_ENV} is set)"
    raise InsecureChannelError(
        f"{problem}: refused. Use sc://{host}:{port}/;use_ssl=true;token=... (a server behind "
        f"TLS), or run on the server's host (sc://localhost:{port}/;token=...), or set "
        f"{ALLOW_CLEAR_ENV}=1 to accept that anyone on the network path can read the run's "
        "secrets and data (docs/deploy.md, Spark Connect)"
    )


def channel_warning(spark: Any) -> str | None:
    """What a run should be told when the functions it sends to a Connect server (and the
    run's secrets they hold) cross the network in clear, which the user accepted
    (:func:`check_channel`); None on loopback or a protected channel.

    Raises:
        InsecureChannelError: a channel in clear to another host, not accepted.
    """
    return check_channel(*channel(spark))


def check_url(url: str) -> str:
    """``url`` when it is a Spark Connect URL, ``sc://HOST[:PORT][/;PARAM=VALUE...]``.

    Raises:
        SparktfValueError: naming the form expected (the token, if any, hidden).
    """
    if not isinstance(url, str) or not _URL.match(url.strip()):
        raise SparktfValueError(
            f"expected a Spark Connect URL, sc://HOST[:PORT][/;token=TOKEN] (e.g. "
            f"{CONNECT_URL_EXAMPLE}), got {redact_url(str(url))!r}"
        )
    rest = _URL.match(url.strip()).group("rest") or ""
    if rest not in ("", "/") and not rest.startswith("/;"):
        raise SparktfValueError(
            f"the parameters of a Spark Connect URL follow '/;' (e.g. {CONNECT_URL_EXAMPLE}), "
            f"got {redact_url(url)!r}"
        )
    return url.strip()


def url_address(url: str) -> tuple[str, int]:
    """``(host, port)`` of a Connect URL (port 15002 when it names none)."""
    match = _URL.match(check_url(url))
    host = match.group("host").strip("[]")
    return host, int(match.group("port") or DEFAULT_PORT)


def split_runtime(
    overrides: Mapping[str, str], modifiable: Callable[[str], bool]
) -> tuple[dict[str, str], list[str]]:
    """``overrides`` split into the settings a running session takes (``modifiable(key)``,
    e.g. the Connect session's ``conf.isModifiable``) and the names of the others, sorted."""
    runtime = {key: value for key, value in overrides.items() if modifiable(key)}
    return runtime, sorted(key for key in overrides if key not in runtime)


def connect_session(app_name: str, url: str, overrides: Mapping[str, str] | None = None) -> Any:
    """A Spark Connect session on the server of ``url`` (the process's Connect session when
    it has one), with the runtime settings of ``overrides`` set; the others are logged at
    INFO as ignored, by name: the server's configuration stands for them.

    Raises:
        SparktfValueError: ``url`` is not a Connect URL.
        ClassicSessionError: this process runs a classic SparkContext.
        InsecureChannelError: the channel would be in clear to another host and the user did
            not accept it (:func:`check_channel`).
        ConnectUnreachableError: nothing answers at the URL's address within a few seconds.
    """
    from pyspark import SparkContext

    url = check_url(url)
    host, port = url_address(url)
    warning = check_channel(host, port, url_protected(url))  # before anything else
    running = SparkContext._active_spark_context
    if running is not None:
        raise ClassicSessionError(
            f"a Spark Connect session ({redact_url(url)}) was asked for, but this Python process "
            f"already runs a classic Spark session (master {running.master}); PySpark cannot mix "
            "the two in one process: stop that session (spark.stop()) or run the Connect client "
            "in a process of its own; without --remote and with SPARK_REMOTE unset the job "
            "uses a classic session"
        )
    if warning:
        log.warning("%s", warning)
    try:
        socket.create_connection((host, port), timeout=REACH_TIMEOUT_S).close()
    except OSError as exc:
        raise ConnectUnreachableError(
            f"no Spark Connect server answers at {host}:{port} ({redact_url(url)}): {exc}; start "
            "one (docs/deploy.md, Spark Connect) or correct --remote / SPARK_REMOTE"
        ) from None
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(url).getOrCreate()
    runtime, ignored = split_runtime(dict(overrides or {}), spark.conf.isModifiable)
    for key, value in runtime.items():
        spark.conf.set(key, value)
    if ignored:
        log.info(
            "Spark Connect: settings ignored, the server's configuration stands (only runtime "
            "settings apply to a Connect session): %s",
            ", ".join(ignored),
        )
    log.info("Spark Connect session on %s (%s, Spark %s)", redact_url(url), app_name, spark.version)
    return spark


@contextmanager
def stage_counts(spark: Any) -> Iterator[Callable[[], list[tuple[int, int, int]]]]:
    """While the block runs, what the Connect server last reported of the running stages of
    this client's operations; yields a function returning ``[(stage id, completed tasks,
    tasks)]`` of the stages not done."""
    lock = threading.Lock()
    latest: list[tuple[int, int, int]] = []

    def handler(stages=None, inflight_tasks=0, operation_id=None, done=False, **_: Any) -> None:
        running = [
            (s.stage_id, s.num_completed_tasks, s.num_tasks)
            for s in (stages or [])
            if not done and not s.done
        ]
        with lock:
            latest[:] = running

    def read() -> list[tuple[int, int, int]]:
        with lock:
            return list(latest)

    spark.registerProgressHandler(handler)
    try:
        yield read
    finally:
        spark.removeProgressHandler(handler)


def remote_url(remote: str | None, *, spark_submit: bool) -> str | None:
    """The Spark Connect URL a session is to use: ``remote``; when it is None and the process
    was not started by spark-submit, ``$SPARK_REMOTE``. None (also for an empty ``remote``)
    means a classic session."""
    if remote is None and not spark_submit:
        remote = os.environ.get(REMOTE_ENV)
    return remote or None


def classic_context(spark: Any, what: str) -> Any:
    """The SparkContext of ``spark`` (a session or a SparkContext); for a Spark Connect
    session, which has none, a ClassicSessionError saying that ``what`` needs one."""
    if is_connect(spark):
        raise ClassicSessionError(
            f"{what} needs a classic Spark session (a SparkContext), and a Spark Connect session "
            "has none: run it without --remote and with SPARK_REMOTE unset"
        )
    return getattr(spark, "sparkContext", spark)
