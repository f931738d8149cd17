"""Paths and URIs: parsing a local path, ``file://``, ``hdfs://host:port/path`` or
``s3://bucket/key`` (``s3a://``, the same store) URI into a :class:`Location`, and the names
built from one (joins, Spark's view, hidden siblings)."""

from __future__ import annotations

import os
import posixpath
import re
import uuid
from dataclasses import dataclass
from urllib.parse import urlparse

from sparktf.errors import SparktfValueError
from sparktf.storage.errors import UnknownSchemeError

__all__ = [
    "SUPPORTED_SCHEMES",
    "Location",
    "is_hdfs",
    "is_remote",
    "is_s3",
    "join",
    "parse",
    "spark_uri",
    "temp_sibling",
]

SUPPORTED_SCHEMES = ("", "file", "hdfs", "s3", "s3a")
# S3's rules for a bucket name: 3-63 lower-case letters, digits, dots and hyphens, starting
# and ending with a letter or a digit.
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


@dataclass(frozen=True)
class Location:
    """A parsed path: ``scheme`` is "file", "hdfs" or "s3" (``s3a://`` URIs too); ``netloc``
    the NameNode's ``host:port`` or the bucket; ``path`` is absolute (an S3 key is
    ``path`` without its leading "/")."""

    scheme: str
    netloc: str
    path: str

    @property
    def uri(self) -> str:
        """The path itself for a local file, else ``hdfs://netloc/path`` or
        ``s3://bucket/key``."""
        if self.scheme == "file":
            return self.path
        return f"{self.scheme}://{self.netloc}{self.path}"

    def join(self, *parts: str) -> Location:
        """This location with ``parts`` appended to its path."""
        return Location(self.scheme, self.netloc, posixpath.join(self.path, *parts))

    def sibling(self, name: str) -> Location:
        """The entry ``name`` in the same directory."""
        return Location(
            self.scheme, self.netloc, posixpath.join(posixpath.dirname(self.path), name)
        )

    def parent(self) -> Location:
        """The directory holding this location."""
        return Location(self.scheme, self.netloc, posixpath.dirname(self.path))


def parse(path: str | os.PathLike) -> Location:
    """Parses a local path, a ``file://``, an ``hdfs://host:port/path`` or an
    ``s3://bucket/key`` URI (``s3a://``, Hadoop's name for the same store, parses as ``s3``).

    Args:
        path: the path or URI; a relative local path is made absolute.

    Returns:
        its :class:`Location`.

    Raises:
        UnknownSchemeError: another scheme, an ``hdfs://`` URI without a NameNode address, or
            an ``s3://`` URI without a valid bucket name.
        ValueError: an empty path.
    """
    text = os.fspath(path)
    if not isinstance(text, str) or not text:
        raise SparktfValueError(f"empty or invalid path: {path!r}")
    parsed = urlparse(text)
    # A Windows-like "C:/x" is not a concern here; a single letter scheme would be odd anyway.
    scheme = parsed.scheme.lower()
    if scheme not in SUPPORTED_SCHEMES:
        raise UnknownSchemeError(
            f"unsupported URI scheme {parsed.scheme!r} in {text!r}: "
            "use a local path, file:///abs/path, hdfs://host:port/path or s3://bucket/key"
        )
    if scheme in ("", "file"):
        local = parsed.path if scheme == "file" else text
        return Location("file", "", os.path.abspath(local))
    if scheme in ("s3", "s3a"):
        if not _BUCKET.match(parsed.netloc):
            raise UnknownSchemeError(
                f"{text!r} names no valid bucket (expected s3://bucket/key, a bucket name of "
                "3-63 lower-case letters, digits, dots and hyphens)"
            )
        path = posixpath.normpath(parsed.path or "/")
        if path.startswith("//"):  # normpath keeps a leading "//"
            path = "/" + path.lstrip("/")
        return Location("s3", parsed.netloc, path)
    if not parsed.netloc:
        raise UnknownSchemeError(
            f"hdfs URI without a NameNode address: {text!r} (expected hdfs://host:port/path)"
        )
    return Location("hdfs", parsed.netloc, posixpath.normpath(parsed.path or "/"))


def join(base: str, *parts: str) -> str:
    """Joins path parts onto a path or URI, keeping its scheme."""
    return parse(base).join(*parts).uri if "://" in str(base) else os.path.join(base, *parts)


def is_hdfs(path: str) -> bool:
    """Whether ``path`` is an ``hdfs://`` URI (raises UnknownSchemeError as :func:`parse`)."""
    return parse(path).scheme == "hdfs"


def is_s3(path: str) -> bool:
    """Whether ``path`` is an ``s3://`` or ``s3a://`` URI (raises as :func:`parse`)."""
    return parse(path).scheme == "s3"


def is_remote(path: str) -> bool:
    """Whether ``path`` is on a file system TensorFlow cannot open itself (HDFS, S3): what
    sparktf copies through a local directory (raises as :func:`parse`)."""
    return parse(path).scheme != "file"


def spark_uri(path: str | os.PathLike) -> str:
    """``path`` as Spark (and petastorm) must see it: local paths as ``file://`` URIs, so
    that a ``fs.defaultFS`` of HDFS in the Hadoop configuration does not redirect them, and
    S3 ones as ``s3a://`` (Hadoop's S3A connector)."""
    loc = parse(path)
    if loc.scheme == "file":
        return f"file://{loc.path}"
    if loc.scheme == "s3":
        return f"s3a://{loc.netloc}{loc.path}"
    return loc.uri


def temp_sibling(path: str, tag: str = "tmp") -> str:
    """A fresh hidden name beside ``path`` (same directory, so a rename is atomic)."""
    loc = parse(path)
    return loc.sibling(f".{posixpath.basename(loc.path)}.{tag}-{uuid.uuid4().hex[:12]}").uri
