"""The executors' side of the model: local copies of HDFS models and loaded signatures.

An ``hdfs://`` model is copied once per machine into :func:`model_cache_dir`, a directory
private to the user (0700; one that another user owns or can write, or a symbolic link, is
refused), and a copy is used only while its contents match the fingerprint the driver
computed from the source (:func:`~sparktf.inference.saved_model.export_fingerprint`); one that does
not match is copied again. Each Python worker loads a signature once and keeps it in
:class:`ModelCache`.

The copies take at most ``SPARKTF_MODEL_CACHE_GB`` gigabytes (default 4) per machine:
after a new copy, the least recently used copies (a copy's modification time is set each
time it is used) are deleted until the cache fits, except those in use. A process holds a
shared ``flock`` on a copy's directory while it has the model loaded (:func:`hold_model`);
eviction takes an exclusive lock without waiting and leaves a copy alone when it cannot get
one. A single copy larger than the bound is kept (and logged).
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
import threading
from collections import Counter, OrderedDict, defaultdict

import numpy as np

from sparktf import paths, storage
from sparktf.errors import SparktfError
from sparktf.inference.saved_model import ModelNotFoundError, export_fingerprint

__all__ = [
    "DEFAULT_CACHE_GB",
    "LoadedSignature",
    "ModelCache",
    "ModelCacheError",
    "ModelCacheMismatchError",
    "cache_limit_bytes",
    "evict",
    "hold_model",
    "local_model_dir",
    "model_cache_dir",
    "private_cache_dir",
]

log = logging.getLogger(__name__)

DEFAULT_CACHE_GB = 4.0
_COPY_NAME_LEN = 32  # a copy is named by the first 32 hex digits of its fingerprint


class ModelCacheError(SparktfError, PermissionError):
    """The executors' model cache cannot be used safely (the message names the path)."""


class ModelCacheMismatchError(SparktfError, RuntimeError):
    """A fresh copy of a model does not match the fingerprint the driver computed (the model
    changed after ``predict`` read it, or the copy was corrupted)."""


class ModelCache:
    """SavedModel signatures loaded in this Python process, keyed by model fingerprint.

    A Spark Python worker imports this module once and keeps it between tasks only when
    ``spark.python.worker.reuse`` is true (the default); with reuse off every task starts a
    fresh worker and loads the model again (the local copy of an HDFS model is still made
    once per machine). Spark also stops a worker that stays idle for about a minute, which
    empties its cache. Each cached model holds its variables in the worker's memory (on
    top of the executor's JVM memory: budget ``spark.executor.memoryOverhead`` or
    ``spark.executor.pyspark.memory`` for it); at most ``capacity`` models are kept.
    """

    capacity = 2
    _models: OrderedDict[tuple[str, str], LoadedSignature] = OrderedDict()
    _lock = threading.Lock()
    # Per model fingerprint: "loads", "uses" (one per partition), "batches", "copies".
    stats: defaultdict[str, Counter[str]] = defaultdict(Counter)

    @classmethod
    def get(cls, export_uri: str, fingerprint: str, signature: str) -> LoadedSignature:
        """The signature ``signature`` of the model ``export_uri``, loaded on first use (the
        least recently used model is dropped beyond ``capacity``)."""
        key = (fingerprint, signature)
        with cls._lock:
            cls.stats[fingerprint]["uses"] += 1
            if key in cls._models:
                cls._models.move_to_end(key)
                return cls._models[key]
            loaded = LoadedSignature(export_uri, fingerprint, signature)
            cls.stats[fingerprint]["loads"] += 1
            log.info(
                "loaded model %s, signature %s, in Python worker %d (kept for its later tasks)",
                export_uri,
                signature,
                os.getpid(),
            )
            cls._models[key] = loaded
            while len(cls._models) > cls.capacity:
                # Its hold on the local copy goes with the last reference (__del__): a
                # partition still running it keeps it from eviction until it ends.
                cls._models.popitem(last=False)
            return loaded


def model_cache_dir() -> str:
    """Where executors keep local copies of HDFS models: ``$SPARKTF_MODEL_CACHE_DIR``, else
    ``<tempdir>/sparktf-models-<uid>`` (one per user: the directory must be private)."""
    path = os.environ.get("SPARKTF_MODEL_CACHE_DIR") or os.path.join(
        tempfile.gettempdir(), f"sparktf-models-{os.geteuid()}"
    )
    return os.path.abspath(path)  # no trailing "/": lstat must see a symbolic link itself


def private_cache_dir() -> str:
    """:func:`model_cache_dir`, created 0700 if missing; ModelCacheError unless it is a real
    directory owned by this user that no one else can write (another user could otherwise
    plant a model that every later prediction would load)."""
    base = model_cache_dir()
    problem = paths.private_dir_problem(base)
    if problem:
        raise ModelCacheError(
            f"model cache directory {base} {problem}: refusing to use it, since a model "
            "placed there would be loaded and run. Remove it, or set "
            "SPARKTF_MODEL_CACHE_DIR to a directory only this user can write"
        )
    return base


def _open_lock(path: str) -> int:
    """The lock file at ``path``, opened without following a symbolic link (0600 if new)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        return os.open(path, flags, 0o600)
    except OSError as exc:
        if os.path.islink(path):
            raise ModelCacheError(
                f"model cache lock file {path} is a symbolic link: refusing to follow it; remove it"
            ) from exc
        raise


def _verified(path: str, fingerprint: str) -> bool:
    """Whether the local copy at ``path`` exists and matches ``fingerprint``."""
    if not os.path.isfile(os.path.join(path, "saved_model.pb")):
        return False
    try:
        return export_fingerprint(path) == fingerprint
    except (OSError, storage.StorageError):  # being replaced by another worker
        return False


def cache_limit_bytes() -> int:
    """The bound on the model cache: ``$SPARKTF_MODEL_CACHE_GB`` gigabytes (2**30 bytes),
    default :data:`DEFAULT_CACHE_GB`; ModelCacheError when it is not a number >= 0."""
    text = os.environ.get("SPARKTF_MODEL_CACHE_GB", "")
    try:
        gb = float(text) if text.strip() else DEFAULT_CACHE_GB
    except ValueError:
        gb = -1.0
    if not gb >= 0:
        raise ModelCacheError(f"SPARKTF_MODEL_CACHE_GB={text!r} is not a number of gigabytes >= 0")
    return int(gb * (1 << 30))


def _hold(path: str) -> int | None:
    """A shared lock on the copy ``path`` (its directory, opened without following a link),
    or None when ``path`` is not that copy any more (evicted or replaced meanwhile)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        if os.path.samestat(os.fstat(fd), os.lstat(path)) and os.path.isfile(
            os.path.join(path, "saved_model.pb")
        ):
            os.utime(path)  # the recency eviction goes by
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _tree_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_size
            except OSError:
                pass
    return total


def evict(base: str, *, limit: int, keep: str | None = None) -> list[str]:
    """Deletes the least recently used model copies in ``base`` until they take at most
    ``limit`` bytes; copies in use (another process holds :func:`hold_model`'s lock, or
    its copy lock) and ``keep`` are never deleted. Returns the deleted names."""
    copies = []
    for name in os.listdir(base):
        path = os.path.join(base, name)
        if len(name) != _COPY_NAME_LEN or not os.path.isdir(path) or os.path.islink(path):
            continue
        try:
            used = os.lstat(path).st_mtime
        except OSError:
            continue
        copies.append((used, name, _tree_bytes(path)))
    total = sum(size for _, _, size in copies)
    deleted = []
    for _, name, size in sorted(copies):
        if total <= limit:
            break
        if name == keep or not _evict_one(base, name):
            continue
        total -= size
        deleted.append(name)
        log.info("evicted the cached model copy %s (%d bytes, least recently used)", name, size)
    if total > limit:
        log.warning(
            "the model cache %s holds %d bytes, over SPARKTF_MODEL_CACHE_GB (%d bytes): the "
            "rest is in use",
            base,
            total,
            limit,
        )
    return deleted


def _evict_one(base: str, name: str) -> bool:
    """Deletes the copy ``name`` unless it is in use or being copied; whether it did."""
    path = os.path.join(base, name)
    try:
        lock = _open_lock(path + ".lock")
    except (OSError, ModelCacheError):
        return False
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            trash = tempfile.mkdtemp(prefix=f"{name}.tmp-", dir=base)
            os.rename(path, os.path.join(trash, "evicted"))
        finally:
            os.close(fd)
        shutil.rmtree(trash, ignore_errors=True)
        return True
    except OSError:  # in use, being copied, or gone
        return False
    finally:
        os.close(lock)


def hold_model(export_uri: str, fingerprint: str) -> tuple[str, int | None]:
    """:func:`local_model_dir` and, for a cached copy, an open descriptor holding a shared
    lock on it (close it when the model is no longer used: eviction skips held copies).
    Raises as :func:`local_model_dir`."""
    loc = storage.parse(export_uri)
    if loc.scheme == "file":
        if not os.path.isfile(os.path.join(loc.path, "saved_model.pb")):
            raise ModelNotFoundError(
                f"model {loc.path} is not on this executor's file system: on a cluster, give "
                "an hdfs:// model or a path that every executor sees"
            )
        return loc.path, None
    base = private_cache_dir()
    target = os.path.join(base, fingerprint[:_COPY_NAME_LEN])
    for _ in range(3):
        if _verified(target, fingerprint):
            fd = _hold(target)
            if fd is not None:
                return target, fd
        fd = _copy(export_uri, fingerprint, base, target)
        if fd is not None:
            try:
                evict(base, limit=cache_limit_bytes(), keep=os.path.basename(target))
            except OSError as exc:
                log.warning("could not evict from the model cache %s: %s", base, exc)
            return target, fd
    raise ModelCacheError(f"the cached copy {target} of {export_uri} keeps changing: predict again")


def local_model_dir(export_uri: str, fingerprint: str) -> str:
    """A local directory holding the model: itself when local, else a copy made once per
    machine in the user's private cache (a lock file serialises the workers of all
    executors on it). A copy is used only when its contents match ``fingerprint``; a copy
    that does not (tampered, truncated) is replaced by a fresh one. The copy is not held
    (see :func:`hold_model`)."""
    path, fd = hold_model(export_uri, fingerprint)
    if fd is not None:
        os.close(fd)
    return path


def _copy(export_uri: str, fingerprint: str, base: str, target: str) -> int | None:
    """Makes the verified copy ``target`` under its copy lock unless another worker just
    did; returns a hold on it (:func:`_hold`), or None if it changed meanwhile."""
    lock = _open_lock(target + ".lock")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _verified(target, fingerprint):
            return _hold(target)
        # Holding the lock, any partial copy of this model is a crashed worker's leftover.
        for name in os.listdir(base):
            if name.startswith(f"{fingerprint[:32]}.tmp-"):
                shutil.rmtree(os.path.join(base, name), ignore_errors=True)
        if os.path.lexists(target):
            log.warning(
                "the cached copy %s of model %s does not match its fingerprint: "
                "copying the model again",
                target,
                export_uri,
            )
        partial = tempfile.mkdtemp(prefix=f"{fingerprint[:32]}.tmp-", dir=base)
        try:
            copy = os.path.join(partial, "model")
            storage.copy_tree(export_uri, copy)
            if export_fingerprint(copy) != fingerprint:
                raise ModelCacheMismatchError(
                    f"the copy of model {export_uri} made on this executor does not match the "
                    "model the driver read (it changed since predict() was called?): "
                    "predict again"
                )
            if os.path.lexists(target):  # the rejected copy: out of the way, then deleted
                stale = os.path.join(partial, "stale")
                os.rename(target, stale)
            os.rename(copy, target)  # atomic: a complete, verified copy or none
        finally:
            shutil.rmtree(partial, ignore_errors=True)
        ModelCache.stats[fingerprint]["copies"] += 1
        log.info("copied model %s to %s", export_uri, target)
        return _hold(target)
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        os.close(lock)


def _configure_tensorflow_threads() -> None:
    """TensorFlow's thread pools sized to ``$SPARKTF_TF_THREADS``, else the task's CPUs."""
    import tensorflow as tf

    threads = os.environ.get("SPARKTF_TF_THREADS")
    if threads is None:
        from pyspark import TaskContext

        context = TaskContext.get()
        threads = context.cpus() if context is not None else 0
    try:
        tf.config.threading.set_intra_op_parallelism_threads(int(threads))
        tf.config.threading.set_inter_op_parallelism_threads(int(threads))
    except RuntimeError:  # TensorFlow already initialised in this process: keep its setting
        pass


class LoadedSignature:
    """One signature of a loaded SavedModel, called with numpy arrays."""

    def __init__(self, export_uri: str, fingerprint: str, signature: str):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        _configure_tensorflow_threads()
        import tensorflow as tf

        self._tf = tf
        path, self._hold = hold_model(export_uri, fingerprint)
        try:
            # The loaded root owns the variables: keep it as long as its signature is used.
            self._root = tf.saved_model.load(path)
            self._fn = self._root.signatures[signature]
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Lets the model cache evict this model's local copy (the loaded model stays
        usable; done when the object is deleted, or call when it is no longer used)."""
        fd, self._hold = getattr(self, "_hold", None), None
        if fd is not None:
            os.close(fd)

    def __del__(self) -> None:
        self.release()

    def __call__(self, **inputs: np.ndarray) -> dict[str, np.ndarray]:
        tensors = {k: self._tf.constant(v) for k, v in inputs.items()}
        return {k: v.numpy() for k, v in self._fn(**tensors).items()}
