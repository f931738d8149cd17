"""Atomic publish of a file or a directory: write under a temporary sibling name, rename into
place when the writing succeeds, delete the temporary otherwise; one publish at a time per
target (:mod:`sparktf.storage.lock`), the previous version put back under its name if a
replacement fails, and leftovers of crashed publishes cleaned up.

An object store has no rename, atomic or not. On S3 a publish writes under the same
temporary sibling prefix, then copies its objects into place on the server and writes the
directory's commit marker, :data:`COMMIT_MARKER` (a manifest of the files, sizes included),
last: readers trust a directory only once its marker is there
(:func:`require_committed`, called by the dataset and export readers). One object is
published by one copy, which S3 makes visible whole. An overwrite first deletes the old
version's marker (readers then refuse the directory until the new one is committed); a
publish that dies leaves a directory without a marker, which readers refuse and the next
publish to the same target deletes, with the temporary prefix and the parts of any
multipart upload under it. The lock is an object created with a conditional write
(``If-None-Match: *``).

The settings are read from this module when used (``LEFTOVER_AGE_S``, ``swap_hook``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import posixpath
import re
import socket
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

from sparktf.storage.errors import (
    NotCommittedError,
    PathExistsError,
    PublishConflictError,
    StorageError,
    StoragePermissionError,
)
from sparktf.storage.lock import LOCK_TAG, PublishLock
from sparktf.storage.namespace import delete, entries, exists, rename
from sparktf.storage.s3 import S3Object
from sparktf.storage.uri import parse, temp_sibling

__all__ = [
    "COMMIT_MARKER",
    "LEFTOVER_AGE_S",
    "commit_hook",
    "publish",
    "require_committed",
    "swap_hook",
]

log = logging.getLogger(__name__)

# Leftovers of a publish that died (temporary copies, set-aside old versions, lock files) are
# removed by the next publish to the same target, and by any publish in the same directory
# once they are older than this (seconds) and their own target is not being published.
LEFTOVER_AGE_S = float(os.environ.get("SPARKTF_PUBLISH_LEFTOVER_AGE", str(24 * 3600)))
_LEFTOVER_RE = re.compile(r"^\.(?P<target>.+)\.(?P<tag>tmp|old)-[0-9a-f]{12}$")
_LOCK_RE = re.compile(r"^\.(?P<target>.+)\." + re.escape(LOCK_TAG) + "$")
# For tests only: called as ``swap_hook(path, tmp, old)`` between the two renames of an
# overwrite (the old version set aside, the new one not yet in place).
swap_hook: Callable[[str, str, str], None] | None = None
# The object that makes a directory on an object store complete: written last by a publish.
COMMIT_MARKER = "_SPARKTF_COMMITTED"
# For tests only: called as ``commit_hook(path, copied)`` on S3 after each object copied into
# place, before the marker (``copied``: how many so far).
commit_hook: Callable[[str, int], None] | None = None
_COPY_THREADS = 8


def _recover(path: str, listing: dict[str, tuple[bool, float]] | None = None) -> None:
    """Cleans the leftovers of crashed publishes to ``path`` (its lock held): a previous
    version set aside by a publish that died mid-swap is renamed back when ``path`` is
    missing; other temporaries and set-aside versions are deleted. ``listing``: the
    directory's entries (:func:`~sparktf.storage.namespace.entries`) if already at hand."""
    loc = parse(path)
    name = posixpath.basename(loc.path)
    if listing is None:
        listing = entries(loc.parent().uri)
    if loc.scheme == "s3":
        _recover_s3(path, listing)
        return
    own = {
        n: e
        for n, e in listing.items()
        if (m := _LEFTOVER_RE.match(n)) is not None and m["target"] == name
    }
    olds = [n for n in own if _LEFTOVER_RE.match(n)["tag"] == "old"]
    if olds and name not in listing:
        newest = max(olds, key=lambda n: own[n][1])
        log.warning(
            "%s is missing after a publish died while replacing it: restoring its previous "
            "version from %s",
            loc.uri,
            newest,
        )
        rename(loc.sibling(newest).uri, loc.uri)
        del own[newest]
    for n in sorted(own):
        leftover = loc.sibling(n).uri
        try:
            delete(leftover)
            log.info("removed %s, left by a publish of %s that did not finish", leftover, loc.uri)
        except StorageError as exc:
            log.warning("could not remove the leftover %s: %s", leftover, exc)


def _clean_aged(path: str, listing: dict[str, tuple[bool, float]]) -> None:
    """Cleans the leftovers older than LEFTOVER_AGE_S of other targets in ``path``'s
    directory (listed in ``listing``), each under its target's lock (a publish in progress
    is left alone)."""
    loc = parse(path)
    name = posixpath.basename(loc.path)
    now = time.time()
    targets = set()
    for n, (_, modified) in listing.items():
        m = _LEFTOVER_RE.match(n) or _LOCK_RE.match(n)
        if m is not None and m["target"] != name and now - modified > LEFTOVER_AGE_S:
            targets.add(m["target"])
    for target in sorted(targets):
        other = loc.sibling(target).uri
        try:
            lock = PublishLock(other).acquire()
        except PublishConflictError:
            log.info("leftovers of %s kept: a publish of it is in progress", other)
            continue
        except StorageError as exc:
            log.warning("could not clean the leftovers of %s: %s", other, exc)
            continue
        try:
            _recover(other)
        except StorageError as exc:
            log.warning("could not clean the leftovers of %s: %s", other, exc)
        finally:
            lock.release()


def _swap(path: str, tmp: str) -> None:
    """Replaces ``path`` by ``tmp``: the old version is set aside, the new one renamed in,
    then the old one deleted. If the new one cannot be renamed in, the old one is renamed
    back under its name before the error propagates. A local file is replaced in one step
    (``os.replace``): readers never find it missing."""
    target, new = parse(path), parse(tmp)
    if target.scheme == "file" and os.path.isfile(new.path) and not os.path.isdir(target.path):
        try:
            os.replace(new.path, target.path)
        except PermissionError as exc:
            raise StoragePermissionError(f"replace: permission denied on {target.path}") from exc
        return
    old = temp_sibling(path, "old")
    rename(path, old)
    try:
        if swap_hook is not None:
            swap_hook(path, tmp, old)
        rename(tmp, path)
    except BaseException as exc:
        try:
            rename(old, path)
        except BaseException as again:
            log.error(
                "publish %s failed and its previous version could not be put back: it is at "
                "%s (the next publish to %s restores it): %s",
                path,
                old,
                path,
                again,
            )
            exc.add_note(
                f"the previous version of {path} is at {old} (restored by the next "
                f"publish to {path})"
            )
        else:
            log.error(
                "publish %s failed while renaming the new version in (%s): the previous "
                "version is back under its name",
                path,
                exc,
            )
        raise
    try:
        delete(old)
    except StorageError as exc:
        log.warning("published %s but could not delete its previous version %s: %s", path, old, exc)


def publish(path: str, *, overwrite: bool = False) -> contextlib.AbstractContextManager[str]:
    """Atomic publish: yields a temporary sibling path to write (a file or a directory).

    When the block succeeds the temporary is renamed to ``path``; when it raises, the
    temporary is deleted and ``path`` is untouched. An existing ``path`` is refused up front
    unless ``overwrite``: then it is replaced only after the new content is complete, and if
    the new version cannot be renamed in, the old one is renamed back under its name.

    One publish at a time per target: a lock file ``.<name>.publish-lock`` beside ``path``
    (created exclusively, refreshed while the publish runs) makes a concurrent publish fail
    with PublishConflictError. Leftovers of publishes that died (``.<name>.tmp-*``,
    ``.<name>.old-*``, stale locks) are cleaned by the next publish to ``path``, and those
    of other targets in the same directory once older than LEFTOVER_AGE_S.

    On S3 the temporary prefix is copied into place and the commit marker written last
    (the module's description): readers refuse the directory until then.

    Args:
        path: the file or directory to publish, local, ``hdfs://`` or ``s3://``.
        overwrite: replace an existing ``path``; else PathExistsError.

    Raises:
        PathExistsError: ``path`` exists (before or after the block) and not ``overwrite``.
        PublishConflictError: another publish to ``path`` holds its lock, or took it over.
        StorageError: the block wrote nothing, or the file system refused a step.
    """
    return _publish(path, overwrite)


def _present(path: str) -> bool:
    """Whether ``path`` holds a published version: exists, and on S3 is one object or a
    directory with its commit marker (one without is a dead publish's, cleaned up)."""
    loc = parse(path)
    if loc.scheme != "s3":
        return exists(path)
    obj = S3Object(loc)
    return obj.head() is not None or obj.head(obj.prefix + COMMIT_MARKER) is not None


@contextlib.contextmanager
def _publish(path: str, overwrite: bool) -> Iterator[str]:
    s3 = parse(path).scheme == "s3"
    if not overwrite and _present(path):
        raise PathExistsError(f"{path} already exists (pass overwrite to replace it)")
    lock = PublishLock(path).acquire()
    try:
        listing = entries(parse(path).parent().uri)
        _recover(path, listing)
        _clean_aged(path, listing)
        if not overwrite and _present(path):
            raise PathExistsError(f"{path} already exists (pass overwrite to replace it)")
        tmp = temp_sibling(path)
        try:
            yield tmp
            if not exists(tmp):
                raise StorageError(f"publish {path}: nothing was written to {tmp}")
            lock.verify()
            if not overwrite and _present(path):
                raise PathExistsError(f"publish {path}: it was created meanwhile")
            if s3:
                _commit_s3(path, tmp)
            elif exists(path):
                _swap(path, tmp)
            else:
                rename(tmp, path)
            log.info("published %s", path)
        except BaseException:
            with contextlib.suppress(Exception):
                delete(tmp)
            if s3:
                with contextlib.suppress(Exception):
                    _abort_uploads(tmp)
            raise
    finally:
        lock.release()


# ----------------------------------------------------------------------------- object stores


def marker_path(path: str) -> str:
    """The commit marker of the directory ``path``."""
    return parse(path).join(COMMIT_MARKER).uri


def require_committed(path: str) -> None:
    """Raises NotCommittedError when ``path`` is a directory on an object store without its
    commit marker (a publish that died or is still running); nothing for a local or HDFS
    path (their publishes rename), nor for one object (which S3 makes visible whole)."""
    loc = parse(path)
    if loc.scheme != "s3":
        return
    obj = S3Object(loc)
    if not obj.key or obj.head() is not None:
        return
    if obj.head(obj.prefix + COMMIT_MARKER) is None and obj.has_children():
        raise NotCommittedError(
            f"{loc.uri} is not committed: its marker {marker_path(path)} is missing, so it may "
            "be incomplete (a publish that did not finish, or one still running). Publish it "
            f"again; a directory written by other means becomes readable with an empty "
            f"{COMMIT_MARKER} object written last"
        )


def _abort_uploads(path: str) -> int:
    """Aborts the multipart uploads under ``path`` (a file or a prefix); how many."""
    obj = S3Object(parse(path))
    return obj.abort_uploads(obj.key)


def _recover_s3(path: str, listing: dict[str, tuple[bool, float]]) -> None:
    """Cleans what crashed publishes to ``path`` left on S3 (its lock held): temporary
    prefixes and objects with the uploads under them, and ``path`` itself when it is a
    directory without its commit marker (a commit that died: readers refuse it)."""
    loc = parse(path)
    name = posixpath.basename(loc.path)
    for n in sorted(listing):
        m = _LEFTOVER_RE.match(n)
        if m is None or m["target"] != name:
            continue
        leftover = loc.sibling(n).uri
        try:
            delete(leftover)
            _abort_uploads(leftover)
            log.info("removed %s, left by a publish of %s that did not finish", leftover, loc.uri)
        except StorageError as exc:
            log.warning("could not remove the leftover %s: %s", leftover, exc)
    obj = S3Object(loc)
    if obj.head() is None and obj.head(obj.prefix + COMMIT_MARKER) is None and obj.has_children():
        log.warning("%s has no commit marker (a publish that died): deleting it", loc.uri)
        delete(path)


def _commit_s3(path: str, tmp: str) -> None:
    """Puts what was written under ``tmp`` in place at ``path`` on S3: one object by one
    server-side copy; a directory's objects copied in parallel, then its marker (a manifest
    of its files), then ``tmp`` deleted. An old version loses its marker first."""
    target, staged = S3Object(parse(path)), S3Object(parse(tmp))
    head = staged.head()
    if head is not None:  # one object: replaced in one step
        if target.has_children():
            delete(path)
        staged.copy_to(staged.key, target.key, int(head["ContentLength"]))
        delete(tmp)
        return
    objects, _, markers = staged.list(recursive=True)
    old_marker = target.prefix + COMMIT_MARKER
    if target.head() is not None:
        delete(path)  # an old version that was one object
    old = {e["Key"] for e in target.list(recursive=True)[0]} if target.has_children() else set()
    if old:
        target.delete_keys([old_marker])  # readers refuse it from now on
    files = {}
    copied = 0

    def copy(entry: dict) -> None:
        relative = entry["Key"][len(staged.prefix) :]
        staged.copy_to(entry["Key"], target.prefix + relative, int(entry["Size"]))

    with ThreadPoolExecutor(_COPY_THREADS, thread_name_prefix="s3-commit") as pool:
        for entry, _ in zip(objects, pool.map(copy, objects)):
            files[entry["Key"][len(staged.prefix) :]] = int(entry["Size"])
            copied += 1
            if commit_hook is not None:
                commit_hook(path, copied)
    for marker in markers:
        target.put(b"", key=target.prefix + marker[len(staged.prefix) :])
    stale = sorted(old - {target.prefix + name for name in files} - {old_marker})
    if stale:
        target.delete_keys(stale)
    record = {"files": files, "committed": time.time(), "host": socket.gethostname()}
    target.put(json.dumps(record, sort_keys=True).encode(), key=old_marker)
    try:
        delete(tmp)
    except StorageError as exc:  # the next publish to the target removes it
        log.warning("published %s but could not delete %s: %s", path, tmp, exc)
