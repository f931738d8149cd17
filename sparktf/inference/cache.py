"""The executors' side of the model: local copies of HDFS models and loaded signatures.

An ``hdfs://`` model is copied once per machine into :func:`model_cache_dir`, a directory
private to the user (0700; one that another user owns or can write, or a symbolic link, is
refused), and a copy is used only while its contents match the fingerprint the driver
computed from the source (:func:`~sparktf.inference.model.model_fingerprint`); one that does
not match is copied again. Each Python worker loads a signature once and keeps it in
:class:`ModelCache`.
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
from sparktf.inference.model import ModelNotFoundError, model_fingerprint

__all__ = [
    "LoadedSignature",
    "ModelCache",
    "ModelCacheError",
    "ModelCacheMismatchError",
    "local_model_dir",
    "model_cache_dir",
    "private_cache_dir",
]

log = logging.getLogger(__name__)


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
    def get(cls, model_uri: str, fingerprint: str, signature: str) -> LoadedSignature:
        """The signature ``signature`` of the model ``model_uri``, loaded on first use (the
        least recently used model is dropped beyond ``capacity``)."""
        key = (fingerprint, signature)
        with cls._lock:
            cls.stats[fingerprint]["uses"] += 1
            if key in cls._models:
                cls._models.move_to_end(key)
                return cls._models[key]
            loaded = LoadedSignature(model_uri, fingerprint, signature)
            cls.stats[fingerprint]["loads"] += 1
            cls._models[key] = loaded
            while len(cls._models) > cls.capacity:
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
        return model_fingerprint(path) == fingerprint
    except (OSError, storage.StorageError):  # being replaced by another worker
        return False


def local_model_dir(model_uri: str, fingerprint: str) -> str:
    """A local directory holding the model: itself when local, else a copy made once per
    machine in the user's private cache (a lock file serialises the workers of all
    executors on it). A copy is used only when its contents match ``fingerprint``; a copy
    that does not (tampered, truncated) is replaced by a fresh one."""
    loc = storage.parse(model_uri)
    if loc.scheme == "file":
        if not os.path.isfile(os.path.join(loc.path, "saved_model.pb")):
            raise ModelNotFoundError(
                f"model {loc.path} is not on this executor's file system: on a cluster, give "
                "an hdfs:// model or a path that every executor sees"
            )
        return loc.path
    base = private_cache_dir()
    target = os.path.join(base, fingerprint[:32])
    if _verified(target, fingerprint):
        return target
    lock = _open_lock(target + ".lock")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _verified(target, fingerprint):
            return target
        # Holding the lock, any partial copy of this model is a crashed worker's leftover.
        for name in os.listdir(base):
            if name.startswith(f"{fingerprint[:32]}.tmp-"):
                shutil.rmtree(os.path.join(base, name), ignore_errors=True)
        if os.path.lexists(target):
            log.warning(
                "the cached copy %s of model %s does not match its fingerprint: "
                "copying the model again",
                target,
                model_uri,
            )
        partial = tempfile.mkdtemp(prefix=f"{fingerprint[:32]}.tmp-", dir=base)
        try:
            copy = os.path.join(partial, "model")
            storage.copy_tree(model_uri, copy)
            if model_fingerprint(copy) != fingerprint:
                raise ModelCacheMismatchError(
                    f"the copy of model {model_uri} made on this executor does not match the "
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
        log.info("copied model %s to %s", model_uri, target)
    finally:
        fcntl.flock(lock, fcntl.LOCK_UN)
        os.close(lock)
    return target


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

    def __init__(self, model_uri: str, fingerprint: str, signature: str):
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        _configure_tensorflow_threads()
        import tensorflow as tf

        self._tf = tf
        # The loaded root owns the variables: keep it as long as its signature is used.
        self._root = tf.saved_model.load(local_model_dir(model_uri, fingerprint))
        self._fn = self._root.signatures[signature]

    def __call__(self, **inputs: np.ndarray) -> dict[str, np.ndarray]:
        tensors = {k: self._tf.constant(v) for k, v in inputs.items()}
        return {k: v.numpy() for k, v in self._fn(**tensors).items()}
