"""The namespace of a file system, local or HDFS: what exists, listings, directories,
deletes, renames, exclusive creates and modification times."""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
import time

from sparktf.storage.errors import (
    PathExistsError,
    PathNotFoundError,
    StorageError,
    StoragePermissionError,
)
from sparktf.storage.hdfs import WebHdfs
from sparktf.storage.uri import parse

__all__ = [
    "create_exclusive",
    "delete",
    "entries",
    "exists",
    "isdir",
    "listdir",
    "makedirs",
    "mtime",
    "rename",
    "size",
    "touch",
    "walk_files",
]


def exists(path: str) -> bool:
    """Whether ``path`` exists (a file or a directory)."""
    loc = parse(path)
    if loc.scheme == "file":
        return os.path.exists(loc.path)
    return WebHdfs(loc).status(loc.path) is not None


def isdir(path: str) -> bool:
    """Whether ``path`` is an existing directory."""
    loc = parse(path)
    if loc.scheme == "file":
        return os.path.isdir(loc.path)
    st = WebHdfs(loc).status(loc.path)
    return st is not None and st["type"] == "DIRECTORY"


def size(path: str) -> int:
    """Size in bytes of a file; PathNotFoundError if it does not exist."""
    loc = parse(path)
    if loc.scheme == "file":
        try:
            return os.path.getsize(loc.path)
        except FileNotFoundError as exc:
            raise PathNotFoundError(f"size: no such file {loc.path}") from exc
    st = WebHdfs(loc).status(loc.path)
    if st is None:
        raise PathNotFoundError(f"size: no such file {loc.uri}")
    return int(st["length"])


def listdir(path: str) -> list[str]:
    """Full paths (same scheme as ``path``) of the entries of a directory, sorted.
    PathNotFoundError if it does not exist, NotADirectoryError if it is a file."""
    loc = parse(path)
    if loc.scheme == "file":
        try:
            names = os.listdir(loc.path)
        except FileNotFoundError as exc:
            raise PathNotFoundError(f"list: no such directory {loc.path}") from exc
        except NotADirectoryError as exc:
            raise NotADirectoryError(f"list: {loc.path} is not a directory") from exc
    else:
        fs = WebHdfs(loc)
        with fs.errors("list", loc.path):
            names = fs.client.list(loc.path)
    return sorted(loc.join(name).uri for name in names)


def walk_files(path: str) -> list[str]:
    """All files below ``path`` (recursively), sorted."""
    files = []
    for entry in listdir(path):
        (files.extend(walk_files(entry)) if isdir(entry) else files.append(entry))
    return sorted(files)


def makedirs(path: str) -> None:
    """Creates the directory ``path`` and its parents (nothing if it exists);
    StoragePermissionError if refused."""
    loc = parse(path)
    if loc.scheme == "file":
        try:
            os.makedirs(loc.path, exist_ok=True)
        except PermissionError as exc:
            raise StoragePermissionError(f"mkdir: permission denied on {loc.path}") from exc
        return
    fs = WebHdfs(loc)
    with fs.errors("mkdir", loc.path):
        fs.client.makedirs(loc.path)


def delete(path: str, *, recursive: bool = True, missing_ok: bool = True) -> None:
    """Deletes the file or directory ``path``.

    Args:
        path: what to delete.
        recursive: delete a directory with its content; else a non-empty one is an error.
        missing_ok: a missing ``path`` is fine; else PathNotFoundError.

    Raises:
        PathNotFoundError: ``path`` is missing and ``missing_ok`` is false.
        StorageError: a non-empty directory without ``recursive``, or a refusal of HDFS.
    """
    loc = parse(path)
    if loc.scheme == "file":
        if os.path.isdir(loc.path) and not os.path.islink(loc.path):
            if not recursive and os.listdir(loc.path):
                raise StorageError(f"delete: {loc.path} is a non-empty directory")
            shutil.rmtree(loc.path)
        elif os.path.lexists(loc.path):
            os.remove(loc.path)
        elif not missing_ok:
            raise PathNotFoundError(f"delete: no such path {loc.path}")
        return
    fs = WebHdfs(loc)
    with fs.errors("delete", loc.path):
        deleted = fs.client.delete(loc.path, recursive=recursive)
    if not deleted and not missing_ok:
        raise PathNotFoundError(f"delete: no such path {loc.uri}")


def rename(src: str, dst: str) -> None:
    """Renames ``src`` to ``dst`` on the same file system; ``dst`` must not exist.

    Raises StorageError across file systems, PathExistsError when ``dst`` exists and
    PathNotFoundError when ``src`` does not."""
    s, d = parse(src), parse(dst)
    if (s.scheme, s.netloc) != (d.scheme, d.netloc):
        raise StorageError(f"rename across file systems: {s.uri} -> {d.uri}")
    if exists(dst):
        raise PathExistsError(f"rename: destination {d.uri} already exists")
    if s.scheme == "file":
        try:
            os.makedirs(os.path.dirname(d.path), exist_ok=True)
            os.rename(s.path, d.path)
        except FileNotFoundError as exc:
            raise PathNotFoundError(f"rename: no such path {s.path}") from exc
        return
    fs = WebHdfs(s)
    if fs.status(s.path) is None:
        raise PathNotFoundError(f"rename: no such path {s.uri}")
    with fs.errors("rename", s.path):
        fs.client.makedirs(posixpath.dirname(d.path))
        fs.client.rename(s.path, d.path)


def entries(directory: str) -> dict[str, tuple[bool, float]]:
    """``{name: (is a directory, modification time in s)}`` of a directory ({} if missing)."""
    loc = parse(directory)
    if loc.scheme == "file":
        found = {}
        try:
            with os.scandir(loc.path) as it:
                for entry in it:
                    with contextlib.suppress(FileNotFoundError):
                        st = entry.stat(follow_symlinks=False)
                        found[entry.name] = (entry.is_dir(follow_symlinks=False), st.st_mtime)
        except (FileNotFoundError, NotADirectoryError):
            return {}
        return found
    fs = WebHdfs(loc)
    try:
        with fs.errors("list", loc.path):
            listing = fs.client.list(loc.path, status=True)
    except PathNotFoundError:
        return {}
    return {
        name: (st["type"] == "DIRECTORY", st["modificationTime"] / 1000.0) for name, st in listing
    }


def create_exclusive(path: str, data: bytes) -> None:
    """Creates the file ``path`` holding ``data``; PathExistsError if it exists (atomic: an
    ``O_EXCL`` open locally, a create without overwrite at the HDFS NameNode)."""
    loc = parse(path)
    if loc.scheme == "file":
        makedirs(posixpath.dirname(loc.path))
        try:
            fd = os.open(loc.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError as exc:
            raise PathExistsError(f"create: {loc.path} already exists") from exc
        except PermissionError as exc:
            raise StoragePermissionError(f"create: permission denied on {loc.path}") from exc
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return
    fs = WebHdfs(loc)
    with fs.errors("create", loc.path):
        fs.client.write(loc.path, data=data, overwrite=False)


def mtime(path: str) -> float | None:
    """Modification time (s) of ``path``, None if it does not exist."""
    loc = parse(path)
    if loc.scheme == "file":
        try:
            return os.stat(loc.path, follow_symlinks=False).st_mtime
        except FileNotFoundError:
            return None
    st = WebHdfs(loc).status(loc.path)
    return None if st is None else st["modificationTime"] / 1000.0


def touch(path: str) -> None:
    """Sets the modification time of the existing ``path`` to now."""
    loc = parse(path)
    if loc.scheme == "file":
        os.utime(loc.path)
        return
    fs = WebHdfs(loc)
    with fs.errors("touch", loc.path):
        fs.client.set_times(loc.path, modification_time=int(time.time() * 1000))
