"""The model directory of a run: checkpoints, TensorBoard events, exports (local or HDFS).

TensorFlow 2.21 cannot open ``hdfs://``, so TensorFlow always writes to a local directory and
this module mirrors it to the model directory through :mod:`sparktf.storage`:

* checkpoints: after each save the new ``ckpt-<step>.*`` files are copied, then the
  ``checkpoint`` state file is published atomically (a reader never sees a state that names
  files not yet there), then checkpoints the manager dropped are deleted;
* events: the chief's event files are copied every ``sync_every_s`` and at the end;
* exports: written locally, then published atomically as ``export/<global step>/``.

A rerun with the same model directory resumes: :meth:`ModelDir.attach` copies the latest
checkpoint down (HDFS) or points at it (local) and restores it.

Checkpoints are named by global step (``ckpt-<step>``), so the driver can tell the step of
the latest checkpoint without TensorFlow (:func:`latest_checkpoint_step`).
"""

from __future__ import annotations

import json
import logging
import os
import posixpath
import re
import shutil
import tempfile
import time

from sparktf import storage

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
EVENTS = "events/train"
EXPORT = "export"
RUN_FILE = "sparktf_train.json"
STATE_FILE = "checkpoint"
CKPT_NAME = "ckpt"
_STATE_RE = re.compile(r'^model_checkpoint_path:\s*"([^"]+)"', re.M)


def latest_checkpoint(model_dir: str) -> str | None:
    """The latest checkpoint prefix (full path or URI) recorded in ``model_dir``, or None."""
    state = storage.join(model_dir, CHECKPOINTS, STATE_FILE)
    try:
        text = storage.read_text(state)
    except storage.PathNotFoundError:
        return None
    match = _STATE_RE.search(text)
    if not match:
        return None
    name = posixpath.basename(match.group(1))
    return storage.join(model_dir, CHECKPOINTS, name)


def latest_checkpoint_step(model_dir: str) -> int:
    """Global step of the latest checkpoint in ``model_dir`` (0 when there is none)."""
    prefix = latest_checkpoint(model_dir)
    if prefix is None:
        return 0
    match = re.search(r"-(\d+)$", prefix)
    return int(match.group(1)) if match else 0


class ModelDir:
    """A run's model directory as seen by one TensorFlow process.

    ``writer``: this process writes the run's results (the chief). Other processes get a
    private scratch directory (multi-worker saves must happen on every worker, but only the
    chief's count).
    """

    def __init__(self, uri: str, *, writer: bool, sync_every_s: float = 60.0):
        self.uri = uri
        self.writer = writer
        self.remote = storage.is_hdfs(uri)
        self.sync_every_s = sync_every_s
        self._scratch = None
        if writer and not self.remote:
            self.local = storage.parse(uri).path
        else:
            self._scratch = tempfile.mkdtemp(prefix="sparktf-modeldir-")
            self.local = self._scratch
        os.makedirs(self.checkpoint_dir, exist_ok=True)
        self._last_sync = time.monotonic()
        self._synced_sizes: dict[str, int] = {}
        self._manager = None

    @property
    def checkpoint_dir(self) -> str:
        return os.path.join(self.local, CHECKPOINTS)

    @property
    def events_dir(self) -> str:
        return os.path.join(self.local, EVENTS)

    # -- checkpoints ----------------------------------------------------------------------

    def attach(self, checkpoint, *, keep: int) -> str | None:
        """Manages ``checkpoint`` (a ``tf.train.Checkpoint``) here, keeping ``keep`` saves,
        and restores the model directory's latest checkpoint into it; returns that
        checkpoint's local prefix, or None for a fresh start."""
        import tensorflow as tf

        self._manager = tf.train.CheckpointManager(
            checkpoint, self.checkpoint_dir, max_to_keep=keep, checkpoint_name=CKPT_NAME
        )
        prefix = self._fetch_latest()
        if prefix:
            checkpoint.restore(prefix).expect_partial()
            log.info("restored %s", prefix)
        return prefix

    def save(self, step: int) -> str:
        """Saves the attached checkpoint as ``ckpt-<step>``; the writer mirrors it to the
        model directory. Returns the checkpoint's prefix (URI for the writer)."""
        prefix = self._manager.save(checkpoint_number=step)
        if self.writer:
            prefix = self._push_checkpoint(prefix, list(self._manager.checkpoints))
            log.info("checkpoint %s", prefix)
        return prefix

    def _fetch_latest(self) -> str | None:
        """A local prefix of the model directory's latest checkpoint, or None."""
        prefix = latest_checkpoint(self.uri)
        if prefix is None:
            return None
        if not self.remote and self.writer:
            return storage.parse(prefix).path
        name = posixpath.basename(storage.parse(prefix).path)
        target = os.path.join(self._scratch or self.local, "restore")
        os.makedirs(target, exist_ok=True)
        found = False
        for entry in storage.listdir(storage.join(self.uri, CHECKPOINTS)):
            base = posixpath.basename(storage.parse(entry).path)
            if base.startswith(name + "."):
                storage.copy_file(entry, os.path.join(target, base))
                found = True
        if not found:
            raise storage.PathNotFoundError(
                f"checkpoint {prefix} is named in the state file but its files are missing"
            )
        return os.path.join(target, name)

    def _push_checkpoint(self, prefix: str, kept: list[str]) -> str:
        """Mirrors a new local checkpoint to the model directory; returns its URI."""
        name = os.path.basename(prefix)
        if not self.remote:
            return prefix
        remote_dir = storage.join(self.uri, CHECKPOINTS)
        storage.makedirs(remote_dir)
        for base in sorted(os.listdir(self.checkpoint_dir)):
            if base.startswith(name + "."):
                storage.copy_file(
                    os.path.join(self.checkpoint_dir, base), storage.join(remote_dir, base)
                )
        state = storage.join(remote_dir, STATE_FILE)
        with storage.publish(state, overwrite=True) as tmp:
            storage.copy_file(os.path.join(self.checkpoint_dir, STATE_FILE), tmp)
        keep = {os.path.basename(p) for p in kept} | {name}
        for entry in storage.listdir(remote_dir):
            base = posixpath.basename(storage.parse(entry).path)
            stem = base.split(".")[0]
            if stem.startswith(CKPT_NAME + "-") and stem not in keep:
                storage.delete(entry)
        self.sync_events(force=True)
        return storage.join(remote_dir, name)

    # -- events ---------------------------------------------------------------------------

    def sync_events(self, *, force: bool = False) -> None:
        """Copies new or grown event files to an hdfs:// model directory."""
        if not (self.remote and self.writer) or not os.path.isdir(self.events_dir):
            return
        if not force and time.monotonic() - self._last_sync < self.sync_every_s:
            return
        self._last_sync = time.monotonic()
        for root, _, files in os.walk(self.events_dir):
            for base in files:
                path = os.path.join(root, base)
                size = os.path.getsize(path)
                if self._synced_sizes.get(path) == size:
                    continue
                rel = os.path.relpath(path, self.local)
                storage.copy_file(path, storage.join(self.uri, *rel.split(os.sep)))
                self._synced_sizes[path] = size

    # -- exports and run info -------------------------------------------------------------

    def export_dir(self, version: int) -> str:
        return storage.join(self.uri, EXPORT, str(version))

    def export(self, write, version: int) -> str:
        """Calls ``write(local_dir)`` and publishes the result as ``export/<version>``."""
        target = self.export_dir(version)
        storage.makedirs(storage.join(self.uri, EXPORT))
        with storage.publish(target, overwrite=True) as tmp:
            if self.remote:
                local = tempfile.mkdtemp(prefix="sparktf-export-")
                try:
                    write(os.path.join(local, "model"))
                    storage.copy_tree(os.path.join(local, "model"), tmp)
                finally:
                    shutil.rmtree(local, ignore_errors=True)
            else:
                write(storage.parse(tmp).path)
        return target

    def finish(self, run_info: dict) -> None:
        """The writer's last word: every event file copied, the run's summary written."""
        self.sync_events(force=True)
        storage.write_text(storage.join(self.uri, RUN_FILE), json.dumps(run_info, indent=2) + "\n")

    def close(self) -> None:
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)
