"""Paths and URIs: parsing a local path, ``file://`` or ``hdfs://host:port/path`` URI into a
:class:`Location`, and the names built from one (joins, Spark's view, hidden siblings)."""

from __future__ import annotations

import os
import posixpath
import uuid
from dataclasses import dataclass
from urllib.parse import urlparse

from sparktf.errors import SparktfValueError
from sparktf.storage.errors import UnknownSchemeError

__all__ = ["SUPPORTED_SCHEMES", "Location", "is_hdfs", "join", "parse", "spark_uri", "temp_sibling"]

SUPPORTED_SCHEMES = ("", "file", "hdfs")


@dataclass(frozen=True)
class Location:
    """A parsed path: ``scheme`` is "file" or "hdfs"; ``path`` is absolute."""

    scheme: str
    netloc: str
    path: str

    @property
    def uri(self) -> str:
        """The path itself for a local file, else ``hdfs://netloc/path``."""
        if self.scheme == "file":
            return self.path
        return f"hdfs://{self.netloc}{self.path}"

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
    """Parses a local path, a ``file://`` or an ``hdfs://host:port/path`` URI.

    Args:
        path: the path or URI; a relative local path is made absolute.

    Returns:
        its :class:`Location`.

    Raises:
        UnknownSchemeError: another scheme, or an ``hdfs://`` URI without a NameNode address.
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
            "use a local path, file:///abs/path or hdfs://host:port/path"
        )
    if scheme in ("", "file"):
        local = parsed.path if scheme == "file" else text
        return Location("file", "", os.path.abspath(local))
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


def spark_uri(path: str | os.PathLike) -> str:
    """``path`` as Spark (and petastorm) must see it: local paths as ``file://`` URIs, so
    that a ``fs.defaultFS`` of HDFS in the Hadoop configuration does not redirect them."""
    loc = parse(path)
    return f"file://{loc.path}" if loc.scheme == "file" else loc.uri


def temp_sibling(path: str, tag: str = "tmp") -> str:
    """A fresh hidden name beside ``path`` (same directory, so a rename is atomic)."""
    loc = parse(path)
    return loc.sibling(f".{posixpath.basename(loc.path)}.{tag}-{uuid.uuid4().hex[:12]}").uri
