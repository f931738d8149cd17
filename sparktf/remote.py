"""Spark Connect sessions: telling one apart, its URL, the settings it takes, its progress.

A Spark Connect client (``SparkSession.builder.remote("sc://host:port")``) runs no JVM of its
own: its session has no SparkContext, no RDDs and no accumulators, and it takes only runtime
settings (Spark SQL's modifiable ones); the cluster's settings (master, executors, memory,
Python) are the Connect server's. :func:`sparktf.spark.get_session` comes here when it is given
a Connect URL (``--remote``, or ``$SPARK_REMOTE``).

A classic SparkContext and a Connect session cannot live in one Python process (PySpark's
functions pick their implementation per process): :func:`connect_session` refuses, saying so,
when a classic one is running.

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
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sparktf.errors import SparktfError, SparktfValueError

__all__ = [
    "CONNECT_URL_EXAMPLE",
    "DEFAULT_PORT",
    "REMOTE_ENV",
    "ClassicSessionError",
    "ConnectUnreachableError",
    "channel",
    "channel_warning",
    "check_url",
    "classic_context",
    "connect_session",
    "is_connect",
    "is_loopback",
    "redacted",
    "remote_url",
    "split_runtime",
    "stage_counts",
    "url_address",
]

log = logging.getLogger(__name__)

REMOTE_ENV = "SPARK_REMOTE"  # PySpark's own variable for the Connect URL
DEFAULT_PORT = 15002  # a Connect URL without a port means this one
CONNECT_URL_EXAMPLE = "sc://localhost:15002/;token=..."
REACH_TIMEOUT_S = 5.0

_URL = re.compile(r"sc://(?P<host>\[[^\]]+\]|[^:/;]+)(?::(?P<port>\d+))?(?P<rest>/.*)?\Z", re.I)
# a token parameter wherever it stands (a malformed URL included), up to the next separator
_TOKEN = re.compile(r"(token=)[^;&/?#\s]*", re.I)


class ClassicSessionError(SparktfError, RuntimeError):
    """A Spark Connect session was asked for in a process that runs a classic SparkContext."""


class ConnectUnreachableError(SparktfError, ConnectionError):
    """Nothing answers at the address of a Spark Connect URL."""


def is_connect(spark: Any) -> bool:
    """Whether ``spark`` is a Spark Connect session (``pyspark.sql.connect.session.
    SparkSession``). False for anything else: a classic session, a SparkContext, None."""
    module = sys.modules.get("pyspark.sql.connect.session")  # no instance without the module
    cls = getattr(module, "SparkSession", None)
    return cls is not None and isinstance(spark, cls)


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


def channel_warning(spark: Any) -> str | None:
    """What a run should be told when the functions it sends to a Connect server (and the
    run's secrets they hold) cross the network in clear; None on loopback or a protected
    channel."""
    host, port, protected = channel(spark)
    if protected or is_loopback(host):
        return None
    return (
        f"the Spark Connect channel to {host}:{port} is not encrypted (the URL has neither "
        "use_ssl=true nor a token): the run's secrets (reservation secret, control tokens) "
        "travel in clear inside the functions sent to the server; use "
        f"sc://{host}:{port}/;use_ssl=true;token=..."
    )


def redacted(url: str) -> str:
    """``url`` with the value of its ``token`` parameter hidden (for logs and errors)."""
    return _TOKEN.sub(r"\1***", url)


def check_url(url: str) -> str:
    """``url`` when it is a Spark Connect URL, ``sc://HOST[:PORT][/;PARAM=VALUE...]``.

    Raises:
        SparktfValueError: naming the form expected (the token, if any, hidden).
    """
    if not isinstance(url, str) or not _URL.match(url.strip()):
        raise SparktfValueError(
            f"expected a Spark Connect URL, sc://HOST[:PORT][/;token=TOKEN] (e.g. "
            f"{CONNECT_URL_EXAMPLE}), got {redacted(str(url))!r}"
        )
    rest = _URL.match(url.strip()).group("rest") or ""
    if rest not in ("", "/") and not rest.startswith("/;"):
        raise SparktfValueError(
            f"the parameters of a Spark Connect URL follow '/;' (e.g. {CONNECT_URL_EXAMPLE}), "
            f"got {redacted(url)!r}"
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
        ConnectUnreachableError: nothing answers at the URL's address within a few seconds.
    """
    from pyspark import SparkContext

    url = check_url(url)
    running = SparkContext._active_spark_context
    if running is not None:
        raise ClassicSessionError(
            f"a Spark Connect session ({redacted(url)}) was asked for, but this Python process "
            f"already runs a classic Spark session (master {running.master}); PySpark cannot mix "
            "the two in one process: stop that session (spark.stop()) or run the Connect client "
            "in a process of its own; without --remote and with SPARK_REMOTE unset the job "
            "uses a classic session"
        )
    host, port = url_address(url)
    try:
        socket.create_connection((host, port), timeout=REACH_TIMEOUT_S).close()
    except OSError as exc:
        raise ConnectUnreachableError(
            f"no Spark Connect server answers at {host}:{port} ({redacted(url)}): {exc}; start "
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
    log.info("Spark Connect session on %s (%s, Spark %s)", redacted(url), app_name, spark.version)
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
