"""Atomic publish of a file or a directory: write under a temporary sibling name, rename into
place when the writing succeeds, delete the temporary otherwise; one publish at a time per
target (:mod:`sparktf.storage.lock`), the previous version put back under its name if a
replacement fails, and leftovers of crashed publishes cleaned up.

The settings are read from this module when used (``LEFTOVER_AGE_S``, ``swap_hook``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import posixpath
import re
import time
from collections.abc import Callable, Iterator

from sparktf.storage.errors import (
    PathExistsError,
    PublishConflictError,
    StorageError,
    StoragePermissionError,
)
from sparktf.storage.lock import LOCK_TAG, PublishLock
from sparktf.storage.namespace import delete, entries, exists, rename
from sparktf.storage.uri import parse, temp_sibling

__all__ = ["LEFTOVER_AGE_S", "publish", "swap_hook"]

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


def _recover(path: str, listing: dict[str, tuple[bool, float]] | None = None) -> None:
    """Cleans the leftovers of crashed publishes to ``path`` (its lock held): a previous
    version set aside by a publish that died mid-swap is renamed back when ``path`` is
    missing; other temporaries and set-aside versions are deleted. ``listing``: the
    directory's entries (:func:`~sparktf.storage.namespace.entries`) if already at hand."""
    loc = parse(path)
    name = posixpath.basename(loc.path)
    if listing is None:
        listing = entries(loc.parent().uri)
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


@contextlib.contextmanager
def publish(path: str, *, overwrite: bool = False) -> Iterator[str]:
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

    Args:
        path: the file or directory to publish, local or ``hdfs://``.
        overwrite: replace an existing ``path``; else PathExistsError.

    Raises:
        PathExistsError: ``path`` exists (before or after the block) and not ``overwrite``.
        PublishConflictError: another publish to ``path`` holds its lock, or took it over.
        StorageError: the block wrote nothing, or the file system refused a step.
    """
    if not overwrite and exists(path):
        raise PathExistsError(f"{path} already exists (pass overwrite to replace it)")
    lock = PublishLock(path).acquire()
    try:
        listing = entries(parse(path).parent().uri)
        _recover(path, listing)
        _clean_aged(path, listing)
        if not overwrite and exists(path):
            raise PathExistsError(f"{path} already exists (pass overwrite to replace it)")
        tmp = temp_sibling(path)
        try:
            yield tmp
            if not exists(tmp):
                raise StorageError(f"publish {path}: nothing was written to {tmp}")
            lock.verify()
            if exists(path):
                if not overwrite:
                    raise PathExistsError(f"publish {path}: it was created meanwhile")
                _swap(path, tmp)
            else:
                rename(tmp, path)
            log.info("published %s", path)
        except BaseException:
            with contextlib.suppress(Exception):
                delete(tmp)
            raise
    finally:
        lock.release()
