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
"""

from __future__ import annotations

import contextlib
import getpass
import logging
import os
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlparse

from sparktf import paths
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


def _conf_dir() -> Path | None:
    """$HADOOP_CONF_DIR, else ``hadoop/`` of the conf directories (``sparktf.paths``; in a
    checkout, what scripts/hdfs.sh start writes)."""
    local = [d / "hadoop" for d in paths.conf_dirs()]
    for candidate in (os.environ.get("HADOOP_CONF_DIR"), *local):
        if candidate and (Path(candidate) / "hdfs-site.xml").is_file():
            return Path(candidate)
    return None


def _xml_props(path: Path) -> dict[str, str]:
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as exc:
        log.warning("cannot read Hadoop configuration %s: %s", path, exc)
        return {}
    props = {}
    for prop in root.iter("property"):
        name, value = prop.findtext("name"), prop.findtext("value")
        if name and value is not None:
            props[name.strip()] = value.strip()
    return props


def default_fs() -> str | None:
    """``fs.defaultFS`` of the Hadoop client configuration when it is an ``hdfs://`` URI (the
    cluster's file system), else None."""
    conf = _conf_dir()
    if conf is None or not (conf / "core-site.xml").is_file():
        return None
    value = _xml_props(conf / "core-site.xml").get("fs.defaultFS", "")
    return value.rstrip("/") if value.startswith("hdfs://") else None


def webhdfs_url(netloc: str) -> str:
    """The WebHDFS base URL (``http://host:port``) of the NameNode at ``netloc``
    (``host:port`` of an ``hdfs://`` URI), found as the module docstring describes."""
    explicit = os.environ.get("SPARKTF_WEBHDFS_URL")
    if explicit:
        return explicit.rstrip("/")
    conf = _conf_dir()
    if conf is not None:
        core = _xml_props(conf / "core-site.xml") if (conf / "core-site.xml").is_file() else {}
        default_fs = urlparse(core.get("fs.defaultFS", "")).netloc
        http = _xml_props(conf / "hdfs-site.xml").get("dfs.namenode.http-address")
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


@lru_cache(maxsize=16)
def webhdfs_client(url: str, user: str, data: bool = False):
    """A WebHDFS client (``hdfs.InsecureClient``, cached) of the NameNode at ``url`` acting
    as ``user``; ``data`` clients wait longer for bytes to flow than metadata ones."""
    import hdfs  # deferred: keeps `import sparktf.storage` light

    read_timeout = HDFS_DATA_TIMEOUT_S if data else HDFS_TIMEOUT_S
    return hdfs.InsecureClient(url, user=user, timeout=(HDFS_TIMEOUT_S, read_timeout))


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
        """WebHDFS's FileStatus of ``path``, None when it does not exist."""
        with self.errors("stat", path):
            return self.client.status(path, strict=False)
