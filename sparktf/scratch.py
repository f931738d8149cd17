"""Node-local scratch directories of a run's processes, and the removal of those left behind.

A TensorFlow process keeps checkpoints in a private ``sparktf-modeldir-*`` directory, reads
the ``spark`` input mode's chunks from a ``sparktf-feed-*`` directory, and the Spark task
that starts it keeps its error file in a ``sparktf-node-*`` directory; a new Spark JVM's
private settings (Spark's shared secret, the run's token, the UI's key) wait for it in a
``sparktf-secret-*`` directory and a process's HDFS credentials file lives in a
``sparktf-token-*`` one. Each is made by
:func:`make_dir`, which holds an exclusive ``flock`` on an owner file inside it
(:data:`OWNER_FILE`) for as long as the directory is in use. The kernel drops that lock when
the process ends, however it ends (``os._exit``, SIGKILL, out of memory), so "the process
that owns this directory is gone" is one non-blocking lock attempt away, with no pid that
could have been reused.

Removal:

* the owner removes its directories when it is done (:func:`remove_dir`) and, through
  :mod:`sparktf.exit_hooks`, on every exit path of a TensorFlow process;
* :func:`sweep`, run by each Spark task that starts a TensorFlow process (before starting it
  and after it has exited) and by the driver when a run starts, removes this user's
  directories whose owner is gone: a directory whose owner file can be locked, or one
  without an owner file (a crash between its creation and its lock, or an older sparktf)
  that has not changed for :data:`UNOWNED_GRACE_S`. Directories of other users, symbolic
  links and anything that is not one of the names above are never touched.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import socket
import stat
import tempfile
import time
from collections.abc import Iterable

from sparktf import exit_hooks

__all__ = [
    "OWNER_FILE",
    "PREFIXES",
    "UNOWNED_GRACE_S",
    "held_dirs",
    "is_stale",
    "make_dir",
    "owner_fd",
    "remove_all",
    "remove_dir",
    "scratch_bases",
    "sweep",
]

log = logging.getLogger(__name__)

OWNER_FILE = ".sparktf-owner"
# The names of the scratch directories sparktf makes; only these are ever swept.
PREFIXES = (
    "sparktf-modeldir-",
    "sparktf-feed-",
    "sparktf-node-",
    "sparktf-export-",
    "sparktf-submit-",
    "sparktf-ps-",
    "sparktf-token-",
    "sparktf-secret-",
)
# A directory with no owner file is left alone this long after its last change (seconds).
UNOWNED_GRACE_S = 600.0

_HELD: dict[str, int] = {}  # directory -> the open, locked owner file
_HOOKED = False


def scratch_bases() -> list[str]:
    """The directories where scratch directories may live: ``/dev/shm``, the system
    temporary directory and ``SPARKTF_FEED_DIR`` when set."""
    bases = ["/dev/shm", tempfile.gettempdir()]
    if os.environ.get("SPARKTF_FEED_DIR"):
        bases.append(os.environ["SPARKTF_FEED_DIR"])
    seen: list[str] = []
    for base in bases:
        path = os.path.abspath(base)
        if path not in seen:
            seen.append(path)
    return seen


def make_dir(prefix: str, *, dir: str | None = None) -> str:
    """Creates a private scratch directory (mode 0700, ``prefix`` and a random part, in
    ``dir`` or the system temporary directory) and holds its owner lock until
    :func:`remove_dir` or the end of the process; returns its path.

    Args:
        prefix: one of :data:`PREFIXES`, possibly followed by more of the name.
        dir: the parent directory (default: the system temporary directory).

    Raises:
        ValueError: ``prefix`` does not start with one of :data:`PREFIXES`.
        OSError: the directory or its owner file cannot be created.
    """
    if not prefix.startswith(PREFIXES):
        raise ValueError(f"scratch directory prefix {prefix!r} is not one of {PREFIXES}")
    path = tempfile.mkdtemp(prefix=prefix, dir=dir)
    flags = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(os.path.join(path, OWNER_FILE), flags, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            owner = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
            os.write(fd, json.dumps(owner).encode())
        except BaseException:
            os.close(fd)
            raise
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    _HELD[path] = fd
    _hook()
    return path


def _hook() -> None:
    global _HOOKED
    if not _HOOKED:
        exit_hooks.on_exit(remove_all)
        _HOOKED = True


def remove_dir(path: str) -> None:
    """Removes the scratch directory ``path`` and releases its owner lock (no error if it is
    gone already)."""
    shutil.rmtree(path, ignore_errors=True)
    fd = _HELD.pop(path, None)
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass


def remove_all() -> None:
    """Removes every scratch directory this process holds (run on the way out)."""
    for path in list(_HELD):
        remove_dir(path)


def owner_fd(path: str) -> int:
    """The open, locked owner file of the scratch directory ``path`` this process holds: a
    child started with it (``pass_fds``) holds the lock too, so the directory is not swept
    while the child runs, even after this process is gone."""
    return _HELD[path]


def held_dirs() -> list[str]:
    """The scratch directories this process holds."""
    return sorted(_HELD)


def _candidate(base: str, name: str, prefixes: tuple[str, ...]) -> str | None:
    """``base/name`` when it is a scratch directory of this user (a real directory), else
    None."""
    if not name.startswith(prefixes):
        return None
    path = os.path.join(base, name)
    try:
        st = os.lstat(path)
    except OSError:
        return None
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
        return None
    return path


def is_stale(path: str, *, now: float | None = None) -> bool:
    """Whether the scratch directory ``path`` belongs to no live process: its owner file can
    be locked, or it has none (or an empty one) and has not changed for
    :data:`UNOWNED_GRACE_S`. A directory
    this process holds is never stale."""
    if path in _HELD:
        return False
    try:
        fd = os.open(os.path.join(path, OWNER_FILE), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        try:
            changed = os.lstat(path).st_mtime
        except OSError:
            return False
        return (time.time() if now is None else now) - changed > UNOWNED_GRACE_S
    except OSError:  # a symbolic link, or unreadable: not ours to judge
        return False
    try:
        # The owner writes its record only once it holds the lock: an empty owner file is a
        # directory being made (locking it now could make its creator's lock fail), or one
        # whose creator died before locking it, judged like one without an owner file.
        if os.fstat(fd).st_size == 0:
            changed = os.fstat(fd).st_mtime
            return (time.time() if now is None else now) - changed > UNOWNED_GRACE_S
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:  # held: its owner is alive
        return False
    finally:
        os.close(fd)
    return True


def sweep(bases: Iterable[str] | None = None, *, prefixes: tuple[str, ...] = PREFIXES) -> list[str]:
    """Removes this user's scratch directories in ``bases`` (default :func:`scratch_bases`)
    whose owner is gone (:func:`is_stale`); returns the removed paths. Never raises: a
    directory that cannot be judged or removed is left for a later sweep."""
    removed = []
    for base in scratch_bases() if bases is None else bases:
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in sorted(names):
            path = _candidate(base, name, prefixes)
            if path is None or not is_stale(path):
                continue
            shutil.rmtree(path, ignore_errors=True)
            if not os.path.lexists(path):
                removed.append(path)
    if removed:
        log.info(
            "removed %d scratch directories left by processes that are gone: %s",
            len(removed),
            ", ".join(removed),
        )
    return removed
