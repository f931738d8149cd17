"""The lock of publishes to one target: a file created exclusively beside it, holding the
owner's host, PID and a token, its modification time refreshed by a heartbeat so that a lock
whose publish died can be told from one still in use and broken.

The settings are read from this module when used (``LOCK_STALE_S``, ``LOCK_HEARTBEAT_S``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import posixpath
import socket
import threading
import time
import uuid
from functools import lru_cache
from pathlib import Path

from sparktf.storage.errors import (
    PathExistsError,
    PathNotFoundError,
    PublishConflictError,
    StorageError,
)
from sparktf.storage.files import read_text
from sparktf.storage.namespace import create_exclusive, delete, mtime, touch
from sparktf.storage.uri import parse

__all__ = ["LOCK_HEARTBEAT_S", "LOCK_STALE_S", "LOCK_TAG", "PublishLock", "lock_path"]

log = logging.getLogger(__name__)

# A publish refreshes the modification time of its lock file every LOCK_HEARTBEAT_S; a lock
# not refreshed for LOCK_STALE_S (or whose process is gone, on this host) is stale and broken.
LOCK_HEARTBEAT_S = 30.0
LOCK_STALE_S = float(os.environ.get("SPARKTF_PUBLISH_LOCK_STALE", "600"))
LOCK_TAG = "publish-lock"
_HELD_LOCKS: set[str] = set()  # tokens of the locks this process holds


def lock_path(path: str) -> str:
    """The lock file of publishes to ``path``: ``.<name>.publish-lock`` beside it."""
    loc = parse(path)
    return loc.sibling(f".{posixpath.basename(loc.path)}.{LOCK_TAG}").uri


@lru_cache(maxsize=1)
def _host_id() -> str:
    """This host (and PID namespace): where a lock's PID can be checked."""
    parts = [socket.gethostname()]
    with contextlib.suppress(OSError):
        parts.append(Path("/proc/sys/kernel/random/boot_id").read_text().strip())
    with contextlib.suppress(OSError):
        parts.append(os.readlink("/proc/self/ns/pid"))
    return "/".join(parts)


def _pid_alive(pid) -> bool:
    if not isinstance(pid, int) or pid <= 0:
        return True  # cannot tell: only the heartbeat age decides
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class PublishLock:
    """The lock of publishes to ``target``: :meth:`acquire` it, :meth:`verify` it is still
    this publish's before replacing the target, :meth:`release` it at the end."""

    def __init__(self, target: str):
        self.target = target
        self.path = lock_path(target)
        self.token = uuid.uuid4().hex
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _read(self) -> tuple[dict | None, float] | None:
        """(owner record or None if unreadable, modification time), None when absent."""
        modified = mtime(self.path)
        if modified is None:
            return None
        try:
            owner = json.loads(read_text(self.path))
        except PathNotFoundError:
            return None
        except (ValueError, StorageError):
            owner = None
        return (owner if isinstance(owner, dict) else None), modified

    def _stale(self, owner: dict | None, modified: float) -> str | None:
        """Why a lock is stale, or None when its publish may still be running."""
        age = time.time() - modified
        if age > LOCK_STALE_S:
            return f"not refreshed for {age:.0f} s"
        if owner and owner.get("host_id") == _host_id():
            pid = owner.get("pid")
            if pid == os.getpid() and owner.get("token") not in _HELD_LOCKS:
                return f"left behind by this process ({pid})"
            if pid != os.getpid() and not _pid_alive(pid):
                return f"its process {pid} on {owner.get('host')} is gone"
        return None

    def _conflict(self, owner: dict | None) -> PublishConflictError:
        """The error for a lock held by ``owner``, naming its process."""
        who = (
            f"process {owner.get('pid')} on {owner.get('host')}, started "
            + time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(owner["started"]))
            if owner and "started" in owner
            else "an unknown process"
        )
        return PublishConflictError(
            f"publish {self.target}: another publish to this path is in progress "
            f"({who}; lock {self.path}); retry once it has finished "
            f"(a lock not refreshed for {LOCK_STALE_S:.0f} s is broken)"
        )

    def acquire(self) -> PublishLock:
        """Takes the lock, breaking a stale one, and starts its heartbeat; returns self.

        Raises:
            PublishConflictError: another publish holds it.
            StorageError: the lock file cannot be created or read.
        """
        record = {
            "token": self.token,
            "host": socket.gethostname(),
            "host_id": _host_id(),
            "pid": os.getpid(),
            "started": time.time(),
        }
        data = json.dumps(record).encode()
        for attempt in range(3):
            try:
                create_exclusive(self.path, data)
                break
            except PathExistsError:
                seen = self._read()
                if seen is None:
                    continue  # released meanwhile: try again
                owner, modified = seen
                reason = self._stale(owner, modified)
                if reason is None or attempt == 2:
                    raise self._conflict(owner) from None
                again = self._read()  # break it only if it is still the stale one
                if again is not None and (again[0] or {}).get("token") == (owner or {}).get(
                    "token"
                ):
                    log.warning("breaking the stale publish lock %s (%s)", self.path, reason)
                    delete(self.path)
        else:
            raise PublishConflictError(f"publish {self.target}: could not take {self.path}")
        _HELD_LOCKS.add(self.token)
        self._thread = threading.Thread(
            target=self._heartbeat, daemon=True, name=f"publish-lock {self.target}"
        )
        self._thread.start()
        return self

    def _heartbeat(self) -> None:
        while not self._stop.wait(LOCK_HEARTBEAT_S):
            try:
                touch(self.path)
            except Exception as exc:  # a missed beat only ages the lock
                log.warning("could not refresh the publish lock %s: %s", self.path, exc)

    def verify(self) -> None:
        """Raises PublishConflictError when the lock is no longer this publish's (it was
        broken as stale and taken by another publish)."""
        seen = self._read()
        if seen is None or (seen[0] or {}).get("token") != self.token:
            raise PublishConflictError(
                f"publish {self.target}: lost the lock {self.path} (broken as stale by another "
                "publish?); not replacing the target"
            )

    def release(self) -> None:
        """Stops the heartbeat and deletes the lock file if it is still this publish's (a
        failure is logged: a lock left behind is broken as stale later)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            seen = self._read()
            if seen is not None and (seen[0] or {}).get("token") == self.token:
                delete(self.path)
        except Exception as exc:  # a lock left behind is broken as stale later
            log.warning("could not remove the publish lock %s: %s", self.path, exc)
        finally:
            _HELD_LOCKS.discard(self.token)
