"""HDFS through WebHDFS: where the NameNode answers, as whom, the clients of the ``hdfs``
package, and their errors mapped onto sparktf's.

WebHDFS address of a NameNode, first match wins:

1. ``SPARKTF_WEBHDFS_URL`` (``http://host:port``), for every ``hdfs://`` URI;
2. ``dfs.namenode.http-address`` in ``$HADOOP_CONF_DIR/hdfs-site.xml`` (or ``hadoop/`` of
   the conf directories, ``sparktf.paths``: a checkout's ``conf/hadoop`` is what
   ``scripts/hdfs.sh start`` writes), for the NameNode named by
   ``fs.defaultFS`` in the ``core-site.xml`` beside it;
3. ``http://HOST:9870`` (Hadoop 3's default port) for ``hdfs://HOST:PORT``.

The HDFS user is ``SPARKTF_HDFS_USER``, else ``HADOOP_USER_NAME``, else the login name.

How a client authenticates (:func:`webhdfs_client`): with the run's delegation token
(``SPARKTF_HDFS_DELEGATION_TOKEN``) when there is one, else with SPNEGO when HDFS uses
Kerberos (:mod:`sparktf.security.kerberos` says when, and with whose credentials), else as the
HDFS user (``user.name=``).
"""

from __future__ import annotations

import contextlib
import getpass
import logging
import os
from collections.abc import Iterator
from functools import lru_cache
from urllib.parse import urlparse

from sparktf.security import hadoop_conf, kerberos, redact
from sparktf.storage.errors import (
    NameNodeUnreachableError,
    PathExistsError,
    PathNotFoundError,
    StorageError,
    StoragePermissionError,
)
from sparktf.storage.uri import Location

__all__ = [
    "HDFS_DATA_TIMEOUT_S",
    "HDFS_TIMEOUT_S",
    "READ_BLOCK",
    "WebHdfs",
    "default_fs",
    "hdfs_user",
    "webhdfs_client",
    "webhdfs_url",
]

log = logging.getLogger(__name__)

# Seconds to wait for the NameNode to accept a connection and to answer a metadata request.
HDFS_TIMEOUT_S = float(os.environ.get("SPARKTF_HDFS_TIMEOUT", "5"))
# Seconds to wait for data to flow on reads and writes (DataNode transfers).
HDFS_DATA_TIMEOUT_S = float(os.environ.get("SPARKTF_HDFS_DATA_TIMEOUT", "120"))
READ_BLOCK = 4 << 20  # bytes fetched per WebHDFS read request


def default_fs() -> str | None:
    """``fs.defaultFS`` of the Hadoop client configuration when it is an ``hdfs://`` URI (the
    cluster's file system), else None."""
    value = hadoop_conf.site_properties("core-site.xml").get("fs.defaultFS", "")
    return value.rstrip("/") if value.startswith("hdfs://") else None


def webhdfs_url(netloc: str) -> str:
    """The WebHDFS base URL (``http://host:port``) of the NameNode at ``netloc``
    (``host:port`` of an ``hdfs://`` URI), found as the module docstring describes."""
    explicit = os.environ.get("SPARKTF_WEBHDFS_URL")
    if explicit:
        return explicit.rstrip("/")
    if hadoop_conf.conf_dir() is not None:
        core = hadoop_conf.site_properties("core-site.xml")
        default_fs = urlparse(core.get("fs.defaultFS", "")).netloc
        http = hadoop_conf.site_properties("hdfs-site.xml").get("dfs.namenode.http-address")
        if http and (not default_fs or default_fs == netloc):
            return "http://" + http
    host = netloc.split(":")[0]
    return f"http://{host}:9870"


def hdfs_user() -> str:
    """The user sparktf acts as on HDFS: ``SPARKTF_HDFS_USER``, else ``HADOOP_USER_NAME``,
    else the login name."""
    return (
        os.environ.get("SPARKTF_HDFS_USER")
        or os.environ.get("HADOOP_USER_NAME")
        or getpass.getuser()
    )


def webhdfs_client(url: str, user: str, data: bool = False):
    """A WebHDFS client (cached) of the NameNode at ``url``: with the run's delegation token
    when ``SPARKTF_HDFS_DELEGATION_TOKEN`` holds one, else with SPNEGO when HDFS uses
    Kerberos, else acting as ``user``; ``data`` clients wait longer for bytes to flow than
    metadata ones.

    Raises NoCredentialsError (:mod:`sparktf.security.kerberos`) from the requests it makes
    when Kerberos is on and there is no ticket and no keytab."""
    token = os.environ.get(kerberos.TOKEN_ENV) or None
    if token:
        return _client(url, "token", token, data)
    if kerberos.enabled():
        return _client(url, "kerberos", None, data)
    return _client(url, "user", user, data)


@lru_cache(maxsize=16)
def _client(url: str, auth: str, credential: str | None, data: bool):
    import hdfs  # deferred: keeps `import sparktf.storage` light
    import requests

    timeout = (HDFS_TIMEOUT_S, HDFS_DATA_TIMEOUT_S if data else HDFS_TIMEOUT_S)
    if auth == "user":
        return hdfs.InsecureClient(url, user=credential, timeout=timeout)
    redact.install()  # urllib3 logs every URL at DEBUG, with its delegation= token
    session = requests.Session()
    if auth == "token":
        redact.add_secret(credential)
        return hdfs.TokenClient(url, credential, timeout=timeout, session=session)
    from sparktf.security.spnego import NegotiateAuth

    session.auth = NegotiateAuth(kerberos.credential)
    return hdfs.Client(url, timeout=timeout, session=session)


def _credentials_used() -> str:
    """Which credentials the clients present, for error messages (never the token)."""
    if os.environ.get(kerberos.TOKEN_ENV):
        return f"the run's delegation token, {kerberos.TOKEN_ENV}"
    if kerberos.enabled():
        return "Kerberos (SPNEGO)"
    return f"user.name={hdfs_user()}"


class WebHdfs:
    """Thin adapter over the `hdfs` package that maps its errors onto sparktf.storage's."""

    def __init__(self, loc: Location):
        self.loc = loc
        self.url = webhdfs_url(loc.netloc)
        self.client = webhdfs_client(self.url, hdfs_user())
        self.data_client = webhdfs_client(self.url, hdfs_user(), data=True)

    @contextlib.contextmanager
    def errors(self, what: str, path: str) -> Iterator[None]:
        """Raises the `hdfs` package's errors in the block as NameNodeUnreachableError,
        PathNotFoundError, StoragePermissionError, PathExistsError or StorageError, naming
        ``what`` was done to ``path``."""
        import hdfs
        import requests

        try:
            yield
        except (TimeoutError, requests.ConnectionError, requests.Timeout) as exc:
            raise NameNodeUnreachableError(
                f"HDFS NameNode at {self.url} (WebHDFS for hdfs://{self.loc.netloc}) did not "
                f"answer while trying to {what} {path}: {type(exc).__name__}"
            ) from exc
        except hdfs.HdfsError as exc:
            message = str(exc)
            exception = getattr(exc, "exception", "") or ""
            uri = f"hdfs://{self.loc.netloc}{path}"
            if exception == "FileNotFoundException" or "does not exist" in message:
                raise PathNotFoundError(f"{what}: no such path {uri}") from exc
            if message.startswith("Authentication failure") or exception == "InvalidToken":
                raise StoragePermissionError(
                    f"{what}: HDFS at {self.url} did not accept sparktf's credentials for "
                    f"{uri} ({_credentials_used()}): {redact.redact(message.splitlines()[0])}"
                ) from exc
            if (
                exception in ("AccessControlException", "SecurityException")
                or "Permission denied" in message
            ):
                raise StoragePermissionError(
                    f"{what}: permission denied on {uri} for user {hdfs_user()!r}: "
                    f"{message.splitlines()[0]}"
                ) from exc
            if exception == "FileAlreadyExistsException" or "already exists" in message:
                raise PathExistsError(f"{what}: {uri} already exists") from exc
            raise StorageError(
                f"HDFS {what} {uri} failed (WebHDFS at {self.url}): {message.splitlines()[0]}"
            ) from exc

    def status(self, path: str) -> dict | None:
        """WebHDFS's FileStatus of ``path``, None when it does not exist (a refused request
        raises, as :meth:`errors` says)."""
        import hdfs

        with self.errors("stat", path):
            try:
                return self.client.status(path)
            except hdfs.HdfsError as exc:  # only a missing path is None, not a refusal
                if getattr(exc, "exception", "") == "FileNotFoundException":
                    return None
                raise
