"""The namespace of a file system, local, HDFS or S3: what exists, listings, directories,
deletes, renames, exclusive creates and modification times.

On S3 a directory is a key prefix (:mod:`sparktf.storage.s3`), a rename a copy on the server
followed by a delete (atomic for one object only), and an exclusive create a conditional
write (``If-None-Match: *``)."""

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
from sparktf.storage.s3 import S3Object
from sparktf.storage.uri import Location, parse

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
    if loc.scheme == "s3":
        obj = S3Object(loc)
        return obj.head() is not None or obj.has_children()
    return WebHdfs(loc).status(loc.path) is not None


def isdir(path: str) -> bool:
    """Whether ``path`` is an existing directory."""
    loc = parse(path)
    if loc.scheme == "file":
        return os.path.isdir(loc.path)
    if loc.scheme == "s3":
        return S3Object(loc).has_children()
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
    if loc.scheme == "s3":
        head = S3Object(loc).head()
        if head is None:
            raise PathNotFoundError(f"size: no such object {loc.uri}")
        return int(head["ContentLength"])
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
    elif loc.scheme == "s3":
        names = _s3_names(loc)
    else:
        fs = WebHdfs(loc)
        with fs.errors("list", loc.path):
            names = fs.client.list(loc.path)
    return sorted(loc.join(name).uri for name in names)


def _s3_names(loc: Location) -> list[str]:
    obj = S3Object(loc)
    objects, dirs, markers = obj.list()
    if not (objects or dirs or markers):
        if obj.head() is not None:
            raise NotADirectoryError(f"list: {loc.uri} is an object, not a directory")
        if not obj.key and obj.bucket_exists():
            return []
        raise PathNotFoundError(f"list: no such directory {loc.uri}")
    return [entry["Key"][len(obj.prefix) :] for entry in objects] + dirs


def walk_files(path: str) -> list[str]:
    """All files below ``path`` (recursively), sorted."""
    loc = parse(path)
    if loc.scheme == "s3":  # one listing of the whole prefix
        obj = S3Object(loc)
        objects, _, markers = obj.list(recursive=True)
        if not objects and not markers and obj.head() is not None:
            raise NotADirectoryError(f"list: {loc.uri} is an object, not a directory")
        return sorted(obj.uri(entry["Key"]) for entry in objects)
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
    if loc.scheme == "s3":
        obj = S3Object(loc)
        if not obj.key:
            if not obj.bucket_exists():
                raise PathNotFoundError(f"mkdir: no such bucket {obj.bucket!r} ({loc.uri})")
        elif not obj.has_children():
            obj.put(b"", key=obj.prefix)  # the marker of an empty directory, as S3A writes
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
    if loc.scheme == "s3":
        obj = S3Object(loc)
        keys = [obj.key] if obj.key and obj.head() is not None else []
        objects, _, markers = obj.list(recursive=True)
        if (objects or set(markers) - {obj.prefix}) and not recursive:
            raise StorageError(f"delete: {loc.uri} is a non-empty directory")
        keys += [entry["Key"] for entry in objects] + markers
        if not keys and not missing_ok:
            raise PathNotFoundError(f"delete: no such path {loc.uri}")
        obj.delete_keys(keys)
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
    if s.scheme == "s3":
        _s3_rename(S3Object(s), S3Object(d))
        return
    fs = WebHdfs(s)
    if fs.status(s.path) is None:
        raise PathNotFoundError(f"rename: no such path {s.uri}")
    with fs.errors("rename", s.path):
        fs.client.makedirs(posixpath.dirname(d.path))
        fs.client.rename(s.path, d.path)


def _s3_rename(src: S3Object, dst: S3Object) -> None:
    """An object copied on the server, then deleted; a prefix object by object (not
    atomic: a reader may see part of it)."""
    head = src.head()
    if head is not None:
        src.copy_to(src.key, dst.key, int(head["ContentLength"]))
        src.delete_keys([src.key])
        return
    objects, _, markers = src.list(recursive=True)
    if not objects and not markers:
        raise PathNotFoundError(f"rename: no such path {src.uri()}")
    for entry in objects:
        src.copy_to(entry["Key"], dst.prefix + entry["Key"][len(src.prefix) :], entry["Size"])
    for marker in markers:
        dst.put(b"", key=dst.prefix + marker[len(src.prefix) :])
    src.delete_keys([entry["Key"] for entry in objects] + markers)


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
    if loc.scheme == "s3":  # a prefix has no time of its own: 0, as old as can be
        obj = S3Object(loc)
        objects, dirs, _ = obj.list()
        found = {name: (True, 0.0) for name in dirs}
        for entry in objects:
            found[entry["Key"][len(obj.prefix) :]] = (False, entry["LastModified"].timestamp())
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
    ``O_EXCL`` open locally, a create without overwrite at the HDFS NameNode, a conditional
    write on S3)."""
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
    if loc.scheme == "s3":
        S3Object(loc).put(data, exclusive=True)
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
    if loc.scheme == "s3":
        head = S3Object(loc).head()
        return None if head is None else head["LastModified"].timestamp()
    st = WebHdfs(loc).status(loc.path)
    return None if st is None else st["modificationTime"] / 1000.0


def touch(path: str) -> None:
    """Sets the modification time of the existing ``path`` to now."""
    loc = parse(path)
    if loc.scheme == "file":
        os.utime(loc.path)
        return
    if loc.scheme == "s3":
        S3Object(loc).touch()
        return
    fs = WebHdfs(loc)
    with fs.errors("touch", loc.path):
        fs.client.set_times(loc.path, modification_time=int(time.time() * 1000))
