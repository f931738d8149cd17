"""The model directory of a run: checkpoints, TensorBoard events, exports (local or HDFS).

TensorFlow 2.21 cannot open ``hdfs://``, so TensorFlow always writes to a local directory and
this module mirrors it to the model directory through :mod:`sparktf.storage`:

* checkpoints: after each save the new ``ckpt-<step>.*`` files are copied, then the
  ``checkpoint`` state file is published atomically (a reader never sees a state that names
  files not yet there), then older checkpoints beyond ``keep`` are deleted;
* events: the chief's event files are copied every ``sync_every_s`` and at the end;
* exports: written locally, then published atomically as ``export/<global step>/``.

A rerun with the same model directory resumes: :meth:`ModelDir.attach` copies the latest
checkpoint down (HDFS) or points at it (local) and restores it.

Retention holds across resumes, on local disk and HDFS alike: after each save the model
directory keeps exactly the ``keep`` newest complete checkpoints by step, whichever run wrote
them (:func:`retain_checkpoints`), and the state file lists exactly those. Nothing is deleted
before the new checkpoint's files and the state file naming it are in place, so the checkpoint
a run restored from survives until a newer one is complete. Files of a checkpoint newer than
the state's latest (a save that died before publishing the state) are deleted as well.

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

__all__ = [
    "BEST_EXPORT",
    "CHECKPOINTS",
    "CKPT_NAME",
    "EVAL_EVENTS",
    "EVENTS",
    "EXPORT",
    "ModelDir",
    "RUN_FILE",
    "STATE_FILE",
    "latest_checkpoint",
    "latest_checkpoint_step",
    "retain_checkpoints",
    "state_text",
]

log = logging.getLogger(__name__)

CHECKPOINTS = "checkpoints"
EVENTS = "events/train"
EVAL_EVENTS = "events/eval"
EXPORT = "export"
BEST_EXPORT = "export_best"
RUN_FILE = "sparktf_train.json"
STATE_FILE = "checkpoint"
CKPT_NAME = "ckpt"
_STATE_RE = re.compile(r'^model_checkpoint_path:\s*"([^"]+)"', re.M)
_PATHS_RE = re.compile(r'^all_model_checkpoint_paths:\s*"([^"]+)"', re.M)
_TIMES_RE = re.compile(r"^all_model_checkpoint_timestamps:\s*(\S+)", re.M)
_CKPT_FILE_RE = re.compile(r"^" + CKPT_NAME + r"-(\d+)\.")


def _read_state(checkpoint_dir: str) -> str | None:
    """The state file's text, or None. While a publish replaces it on HDFS (old version set
    aside, new not yet renamed in), the set-aside version is read: it names a checkpoint
    that is still complete (nothing is deleted before the new state is in place)."""
    state = storage.join(checkpoint_dir, STATE_FILE)
    try:
        return storage.read_text(state)
    except storage.PathNotFoundError:
        pass
    try:
        entries = storage.listdir(checkpoint_dir)
    except (storage.PathNotFoundError, NotADirectoryError):
        return None
    aside = f".{STATE_FILE}.old-"
    for entry in sorted(entries, reverse=True):
        if posixpath.basename(storage.parse(entry).path).startswith(aside):
            try:
                return storage.read_text(entry)
            except storage.PathNotFoundError:
                continue
    return None


def latest_checkpoint(model_dir: str) -> str | None:
    """The latest checkpoint prefix (full path or URI) recorded in ``model_dir``, or None."""
    text = _read_state(storage.join(model_dir, CHECKPOINTS))
    if text is None:
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


def state_text(names: list[str], timestamps: list[float]) -> str:
    """A ``checkpoint`` state file (TensorFlow's CheckpointState, text format) listing the
    checkpoints ``names`` (oldest first, the last one the latest) saved at ``timestamps``."""
    lines = [f'model_checkpoint_path: "{names[-1]}"']
    lines += [f'all_model_checkpoint_paths: "{name}"' for name in names]
    lines += [f"all_model_checkpoint_timestamps: {t!r}" for t in timestamps]
    lines.append(f"last_preserved_timestamp: {min(timestamps) - 1.0!r}")
    return "\n".join(lines) + "\n"


def _state_checkpoints(text: str | None) -> dict[str, float | None]:
    """``{name: timestamp or None}`` of the checkpoints a state file lists."""
    if not text:
        return {}
    names = [posixpath.basename(p) for p in _PATHS_RE.findall(text)]
    times = [float(t) for t in _TIMES_RE.findall(text)]
    return {n: (times[i] if len(times) == len(names) else None) for i, n in enumerate(names)}


def retain_checkpoints(checkpoint_dir: str, latest: int, keep: int) -> list[str]:
    """Keeps the ``keep`` newest complete checkpoints (by step, up to ``latest``, the one just
    saved, its files in place) of ``checkpoint_dir`` (a path or URI) and deletes the rest.

    The state file is republished to list exactly the kept checkpoints (the last one
    ``latest``) when it lists others; deletions come after it. A checkpoint is complete when
    its ``.index`` file is there (written and copied last); files of steps above ``latest``
    are remains of a save that died before its state file was published. Returns the kept
    names (``ckpt-<step>``), oldest first.
    """
    groups: dict[int, list[str]] = {}
    for entry in storage.listdir(checkpoint_dir):
        base = posixpath.basename(storage.parse(entry).path)
        match = _CKPT_FILE_RE.match(base)
        if match:
            groups.setdefault(int(match.group(1)), []).append(entry)
    complete = sorted(
        step
        for step, files in groups.items()
        if step <= latest and any(f.endswith(".index") for f in files)
    )
    if latest not in complete:
        log.error(
            "checkpoint %s-%d is not complete in %s (no .index file): older checkpoints kept",
            CKPT_NAME,
            latest,
            checkpoint_dir,
        )
        return [f"{CKPT_NAME}-{step}" for step in complete]
    kept = [f"{CKPT_NAME}-{step}" for step in complete[-keep:]]
    recorded = _state_checkpoints(_read_state(checkpoint_dir))
    if list(recorded) != kept or any(recorded[n] is None for n in kept):
        now = time.time()
        times = [recorded.get(n) or now for n in kept]
        times = [min(t, now) for t in times]
        with storage.publish(storage.join(checkpoint_dir, STATE_FILE), overwrite=True) as tmp:
            storage.write_text(tmp, state_text(kept, times))
    for step, files in sorted(groups.items()):
        if f"{CKPT_NAME}-{step}" in kept:
            continue
        for entry in files:
            storage.delete(entry)
        log.info(
            "deleted checkpoint %s-%d of %s (keeping %d)", CKPT_NAME, step, checkpoint_dir, keep
        )
    return kept


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
        self._keep = 1

    @property
    def checkpoint_dir(self) -> str:
        return os.path.join(self.local, CHECKPOINTS)

    @property
    def events_dir(self) -> str:
        return os.path.join(self.local, EVENTS)

    @property
    def eval_events_dir(self) -> str:
        return os.path.join(self.local, EVAL_EVENTS)

    # -- checkpoints ----------------------------------------------------------------------

    def attach(self, checkpoint, *, keep: int) -> str | None:
        """Manages ``checkpoint`` (a ``tf.train.Checkpoint``) here, keeping ``keep`` saves,
        and restores the model directory's latest checkpoint into it; returns that
        checkpoint's local prefix, or None for a fresh start."""
        import tensorflow as tf

        self._keep = keep
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
        model directory, then keeps the ``keep`` newest checkpoints there (of any run).
        Returns the checkpoint's prefix (URI for the writer)."""
        prefix = self._manager.save(checkpoint_number=step)
        if self.writer:
            prefix = self._push_checkpoint(prefix, step)
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

    def _push_checkpoint(self, prefix: str, step: int) -> str:
        """Mirrors a new local checkpoint to the model directory (its files, then a state
        file naming it), applies the retention there; returns the checkpoint's path/URI.

        Locally TensorFlow's manager has written the files and the state, and already
        dropped what it knows of (it reads the state file, so earlier runs' checkpoints too);
        :func:`retain_checkpoints` applies the same rule to what it does not know of."""
        name = os.path.basename(prefix)
        if not self.remote:
            retain_checkpoints(self.checkpoint_dir, step, self._keep)
            return prefix
        remote_dir = storage.join(self.uri, CHECKPOINTS)
        storage.makedirs(remote_dir)
        for base in sorted(os.listdir(self.checkpoint_dir)):  # .data-* first, .index last
            if base.startswith(name + "."):
                storage.copy_file(
                    os.path.join(self.checkpoint_dir, base), storage.join(remote_dir, base)
                )
        retain_checkpoints(remote_dir, step, self._keep)
        self.sync_events(force=True)
        return storage.join(remote_dir, name)

    # -- events ---------------------------------------------------------------------------

    def sync_events(self, *, force: bool = False) -> None:
        """Copies new or grown event files to an hdfs:// model directory."""
        events = os.path.dirname(self.events_dir)  # train/ and eval/
        if not (self.remote and self.writer) or not os.path.isdir(events):
            return
        if not force and time.monotonic() - self._last_sync < self.sync_every_s:
            return
        self._last_sync = time.monotonic()
        for root, _, files in os.walk(events):
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

    def export(self, write, version: int, *, root: str = EXPORT) -> str:
        """Calls ``write(local_dir)`` and publishes the result as ``<root>/<version>``."""
        target = storage.join(self.uri, root, str(version))
        storage.makedirs(storage.join(self.uri, root))
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

    def export_best(self, write, version: int) -> str:
        """Publishes ``export_best/<version>`` (the best evaluation so far) like
        :meth:`export`, then removes the previous best."""
        path = self.export(write, version, root=BEST_EXPORT)
        for entry in storage.listdir(storage.join(self.uri, BEST_EXPORT)):
            name = posixpath.basename(storage.parse(entry).path)
            if name.isdigit() and int(name) != version:
                storage.delete(entry)
        return path

    def finish(self, run_info: dict) -> None:
        """The writer's last word: every event file copied, the run's summary written
        atomically (readers see the previous summary or the new one, never a partial one)."""
        self.sync_events(force=True)
        with storage.publish(storage.join(self.uri, RUN_FILE), overwrite=True) as tmp:
            storage.write_text(tmp, json.dumps(run_info, indent=2) + "\n")

    def close(self) -> None:
        if self._scratch:
            shutil.rmtree(self._scratch, ignore_errors=True)
