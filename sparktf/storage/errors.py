"""The errors of sparktf's storage layer.

Each derives from :class:`~sparktf.errors.SparktfError` and from the built-in ``OSError``
subclass a Python caller would expect (``FileNotFoundError`` for a missing path,
``PermissionError`` for a refusal), so both ``except SparktfError`` and the usual ``except``
clauses work.
"""

from __future__ import annotations

from sparktf.errors import SparktfError

__all__ = [
    "NameNodeUnreachableError",
    "NotCommittedError",
    "ObjectStoreUnreachableError",
    "PathExistsError",
    "PathNotFoundError",
    "PublishConflictError",
    "StorageError",
    "StoragePermissionError",
    "UnknownSchemeError",
]


class StorageError(SparktfError, OSError):
    """Base class of the errors raised by sparktf.storage."""


class UnknownSchemeError(StorageError, ValueError):
    """A URI whose scheme sparktf cannot read or write."""


class NameNodeUnreachableError(StorageError, ConnectionError):
    """The NameNode's WebHDFS endpoint did not answer."""


class ObjectStoreUnreachableError(StorageError, ConnectionError):
    """The object store's endpoint did not answer."""


class PathNotFoundError(StorageError, FileNotFoundError):
    """The path does not exist."""


class PathExistsError(StorageError, FileExistsError):
    """The destination already exists."""


class StoragePermissionError(StorageError, PermissionError):
    """The file system refused the operation."""


class PublishConflictError(StorageError):
    """Another publish to the same target is in progress (its lock file is held)."""


class NotCommittedError(StorageError):
    """A directory on an object store without its commit marker: a publish that did not
    finish, or one still running (:mod:`sparktf.storage.publishing`)."""
