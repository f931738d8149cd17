"""The delegation token of a run on a Kerberized HDFS: obtained by the driver, handed to the
executors and their TensorFlow processes, renewed while the run lasts, cancelled at its end.

The driver authenticates with SPNEGO (:mod:`sparktf.security.kerberos`); the processes on the
executors hold no Kerberos credentials of their own and use the token instead: it travels in
the environment variable ``SPARKTF_HDFS_DELEGATION_TOKEN``, which the Spark session passes to
its executors (``spark.executorEnv``), whose Python workers and TensorFlow processes inherit
it. :func:`run_delegation` is the whole lifecycle: ``GETDELEGATIONTOKEN`` (then one
``RENEWDELEGATIONTOKEN`` to learn its expiry), a daemon thread that renews it when three
quarters of its remaining time have passed, ``CANCELDELEGATIONTOKEN`` when the block ends,
normally or not. The token never appears in a log record (:mod:`sparktf.security.redact`) or an
error message.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable, Iterator
from urllib.parse import urlparse

from sparktf import scratch
from sparktf.security import kerberos, redact
from sparktf.storage import hdfs
from sparktf.storage.errors import NameNodeUnreachableError, StorageError

__all__ = [
    "DelegationTokenError",
    "TokenRenewer",
    "cancel_delegation_token",
    "get_delegation_token",
    "job_credentials",
    "renew_delegation_token",
    "run_delegation",
    "token_file",
    "token_forms",
]

log = logging.getLogger(__name__)

# A renewal that fails is tried again after this many seconds (while the token is valid).
RETRY_S = 60.0
# The renewer never waits less than this between renewals.
MIN_WAIT_S = 5.0


class DelegationTokenError(StorageError):
    """The NameNode refused to issue, renew or cancel a delegation token."""


def _session():
    import requests

    from sparktf.security.spnego import NegotiateAuth

    redact.install()
    session = requests.Session()
    session.auth = NegotiateAuth(kerberos.credential)
    return session


def _call(url: str, method: str, op: str, **params: str) -> dict:
    """One WebHDFS token operation on the NameNode at ``url``, authenticated with SPNEGO; its
    JSON answer. Errors name the operation and the NameNode, never the token."""
    import requests

    where = f"{op} at {url}"
    try:
        with _session() as session:
            response = session.request(
                method,
                f"{url}/webhdfs/v1/",
                params={"op": op, **params},
                timeout=(hdfs.HDFS_TIMEOUT_S, hdfs.HDFS_TIMEOUT_S),
            )
    except (requests.ConnectionError, requests.Timeout) as exc:
        raise NameNodeUnreachableError(
            f"HDFS NameNode did not answer {where}: {type(exc).__name__}"
        ) from None
    if response.status_code != 200:
        try:
            remote = response.json().get("RemoteException", {})
            reason = f"{remote.get('exception', '')}: {remote.get('message', '')}".strip(": ")
        except ValueError:
            reason = response.reason
        raise DelegationTokenError(
            f"HDFS refused {where} (HTTP {response.status_code}): {redact.redact(reason)}"
        )
    return response.json() if response.content else {}


def get_delegation_token(url: str) -> str:
    """A new HDFS delegation token (its URL-safe string) from the NameNode whose WebHDFS is at
    ``url``, for the Kerberos principal of this process, renewable by it.

    Raises NoCredentialsError without Kerberos credentials, NameNodeUnreachableError or
    DelegationTokenError when the NameNode does not answer or refuses."""
    token = _call(url, "GET", "GETDELEGATIONTOKEN").get("Token", {}).get("urlString")
    if not token:
        raise DelegationTokenError(f"HDFS NameNode at {url} issued no delegation token")
    redact.add_secret(token)
    return token


def renew_delegation_token(url: str, token: str) -> float:
    """Renews ``token`` at the NameNode at ``url``; returns its new expiry (seconds since the
    epoch). Raises as :func:`get_delegation_token`."""
    answer = _call(url, "PUT", "RENEWDELEGATIONTOKEN", token=token)
    return float(answer["long"]) / 1000.0


def cancel_delegation_token(url: str, token: str) -> None:
    """Cancels ``token`` at the NameNode at ``url``: no process can use it any more. Raises as
    :func:`get_delegation_token`."""
    _call(url, "PUT", "CANCELDELEGATIONTOKEN", token=token)


class TokenRenewer:
    """A daemon thread that renews a token before it expires: ``renew()`` returns the new
    expiry (epoch seconds); it runs when three quarters of the time left have passed, and
    again after ``RETRY_S`` when it fails."""

    def __init__(self, renew: Callable[[], float], expires: float, name: str = "token"):
        self.renew, self.expires, self.name = renew, expires, name
        self.renewals = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sparktf-token-renewer", daemon=True)

    def next_wait(self, now: float | None = None) -> float:
        """Seconds from ``now`` to the next renewal."""
        left = self.expires - (time.time() if now is None else now)
        return max(MIN_WAIT_S, 0.75 * left)

    def start(self) -> TokenRenewer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=hdfs.HDFS_TIMEOUT_S * 2)

    def _run(self) -> None:
        wait = self.next_wait()
        while not self._stop.wait(wait):
            try:
                self.expires = self.renew()
                self.renewals += 1
                wait = self.next_wait()
                log.info("renewed the run's %s; it expires in %.0f s", self.name, wait / 0.75)
            except Exception as exc:  # keep the run going: the token may still be valid
                left = self.expires - time.time()
                log.warning(
                    "renewing the run's %s failed (%s); %.0f s left, trying again in %.0f s",
                    self.name,
                    redact.redact(str(exc)),
                    left,
                    RETRY_S,
                )
                wait = min(RETRY_S, max(MIN_WAIT_S, left / 2))


def _run_webhdfs_url() -> str | None:
    """The WebHDFS URL of the run's HDFS: ``SPARKTF_WEBHDFS_URL``, else the NameNode of
    ``fs.defaultFS``; None when neither is configured."""
    if os.environ.get("SPARKTF_WEBHDFS_URL"):
        return hdfs.webhdfs_url("")
    default = hdfs.default_fs()
    return hdfs.webhdfs_url(urlparse(default).netloc) if default else None


@contextlib.contextmanager
def run_delegation(url: str | None = None) -> Iterator[str | None]:
    """The delegation token of a run, for the block: obtained from the NameNode whose WebHDFS
    is at ``url`` (default: ``SPARKTF_WEBHDFS_URL``, else ``fs.defaultFS``'s), put in
    ``SPARKTF_HDFS_DELEGATION_TOKEN`` for this process and the Spark sessions and processes it
    starts, renewed by a daemon thread, cancelled and removed from the environment when the
    block ends (also on an error). For the NameNode of ``fs.defaultFS`` it is also written as
    a Hadoop credentials file in a private directory (``SPARKTF_HDFS_TOKEN_FILE``), which the
    executor JVMs on this machine read (:func:`sparktf.security.kerberos.spark_settings`).
    Yields the token; yields None and does nothing when
    Kerberos is off, a token is already given, or no HDFS is configured.

    Raises NoCredentialsError without Kerberos credentials, NameNodeUnreachableError or
    DelegationTokenError when the NameNode does not answer or refuses a token."""
    url = url or _run_webhdfs_url()
    if not kerberos.enabled() or os.environ.get(kerberos.TOKEN_ENV) or not url:
        yield None
        return
    token = get_delegation_token(url)
    renewer: TokenRenewer | None = None
    directory: str | None = None
    try:  # from here on, whatever fails: the renewer stopped, the token cancelled
        expires = renew_delegation_token(url, token)
        renewer = TokenRenewer(lambda: renew_delegation_token(url, token), expires).start()
        log.info("HDFS delegation token for the run obtained from %s", url)
        # private (0700), swept by a later run when this process is killed
        directory = scratch.make_dir("sparktf-token-")
        os.environ[kerberos.TOKEN_ENV] = token
        rpc = urlparse(hdfs.default_fs() or "").netloc
        if rpc:  # for the executor JVMs Spark gives no token (sparktf.security.spark_settings)
            services = rpc_services(rpc)
            os.environ[kerberos.TOKEN_FILE_ENV] = token_file(token, services, directory)
            os.environ[kerberos.RPC_TOKENS_ENV] = rpc_tokens(token, services)
            redact.add_secret(*token_forms(token, services))
        yield token
    finally:
        for name in (kerberos.TOKEN_ENV, kerberos.TOKEN_FILE_ENV, kerberos.RPC_TOKENS_ENV):
            os.environ.pop(name, None)
        if directory is not None:
            scratch.remove_dir(directory)
        if renewer is not None:
            renewer.stop()
        _cancel_quietly(url, token)


def _cancel_quietly(url: str, token: str) -> None:
    try:
        cancel_delegation_token(url, token)
        log.info("HDFS delegation token of the run cancelled")
    except Exception as exc:  # it expires on its own: say so, do not mask the run's result
        log.warning(
            "cancelling the run's HDFS delegation token failed: %s", redact.redact(str(exc))
        )


@contextlib.contextmanager
def job_credentials(spark_conf: dict[str, str] | None = None) -> Iterator[str | None]:
    """What a job needs on a Kerberized HDFS, for the block: the check that there are
    Kerberos credentials (:func:`sparktf.security.kerberos.preflight`, with the
    ``spark.kerberos.*`` settings of ``spark_conf``), then the run's delegation token
    (:func:`run_delegation`). Does nothing when Kerberos is off.

    Raises NoCredentialsError, naming the principal tried and how to get a ticket, before
    anything starts when there is no ticket and no keytab; otherwise as
    :func:`run_delegation`."""
    if not kerberos.enabled():
        yield None
        return
    kerberos.preflight(spark_conf)
    with run_delegation() as token:
        yield token


def _read_vint(data: bytes, pos: int) -> tuple[int, int]:
    """Hadoop's ``WritableUtils.readVLong`` at ``pos``: the value and the next position."""
    first = data[pos] - 256 if data[pos] > 127 else data[pos]
    if first >= -112:
        return first, pos + 1
    negative = first < -120
    size = (-119 - first) if negative else (-111 - first)
    value = int.from_bytes(data[pos + 1 : pos + size], "big")
    return (~value if negative else value), pos + size


def _vint(value: int) -> bytes:
    """Hadoop's ``WritableUtils.writeVLong`` of a non-negative ``value``."""
    if value <= 127:
        return bytes([value])
    body = value.to_bytes((value.bit_length() + 7) // 8, "big")
    return bytes([256 - 112 - len(body)]) + body


def _field(data: bytes, pos: int) -> tuple[bytes, int]:
    size, pos = _read_vint(data, pos)
    return data[pos : pos + size], pos + size


def rpc_services(netloc: str) -> list[str]:
    """The services (``host:port``) under which the NameNode RPC address ``netloc`` looks up
    its token: as written, and by IP address (Hadoop's default,
    ``hadoop.security.token.service.use_ip``) when the host is a name that resolves."""
    import socket

    services = [netloc]
    host, _, port = netloc.rpartition(":")
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return services
    if f"{address}:{port}" != netloc:
        services.append(f"{address}:{port}")
    return services


def _rpc_token(token: str, service: str) -> bytes:
    """``token`` (a WebHDFS delegation token's URL string) as Hadoop's ``Token.write`` of an
    ``HDFS_DELEGATION_TOKEN`` for ``service``: the identifier and the password the NameNode
    issued are the same for its RPC port as for WebHDFS."""
    import base64

    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    identifier, pos = _field(raw, 0)
    password, pos = _field(raw, pos)
    fields = (identifier, password, b"HDFS_DELEGATION_TOKEN", service.encode())
    return b"".join(_vint(len(x)) + x for x in fields)  # identifier, password, kind, service


def token_forms(token: str, services: list[str]) -> list[bytes | str]:
    """Every form of ``token`` (a WebHDFS delegation token's URL string) that sparktf hands
    out or that could be printed: the URL string, its bytes, its password, and its encoding
    for each NameNode RPC service (``$HADOOP_TOKEN``'s, alone and comma-separated) with
    their bytes. :func:`sparktf.security.redact.add_secret` adds the hex and base64 forms of
    each."""
    import base64

    raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    _, pos = _field(raw, 0)  # the identifier: not secret
    password, _ = _field(raw, pos)
    forms: list[bytes | str] = [token, raw, password, rpc_tokens(token, services)]
    for service in services:
        forms += [_rpc_token(token, service), rpc_tokens(token, [service])]
    return forms


def rpc_tokens(token: str, services: list[str]) -> str:
    """``token`` for the NameNode RPC ``services``, as Hadoop reads ``$HADOOP_TOKEN``
    (URL strings, comma-separated): how an executor JVM on another host gets the run's
    token without a file."""
    import base64

    return ",".join(
        base64.urlsafe_b64encode(_rpc_token(token, service)).rstrip(b"=").decode()
        for service in services
    )


def token_file(token: str, services: str | list[str], directory: str) -> str:
    """Writes ``token`` (a WebHDFS delegation token's URL string) as a Hadoop credentials file
    (``HADOOP_TOKEN_FILE_LOCATION``'s format) for the NameNode RPC address(es) ``services``
    (``host:port``), readable by this user only, in ``directory``; returns its path."""
    services = [services] if isinstance(services, str) else services
    body = b"".join(
        _vint(len(service.encode())) + service.encode() + _rpc_token(token, service)
        for service in services
    )
    data = b"HDTS\x00" + _vint(len(services)) + body + _vint(0)
    os.makedirs(directory, mode=0o700, exist_ok=True)
    path = os.path.join(directory, f"hdfs-token-{os.getpid()}")
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)
    return path
