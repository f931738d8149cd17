"""The model directory of a run: checkpoints, TensorBoard events, exports (local or HDFS).

TensorFlow 2.21 cannot open ``hdfs://``, so TensorFlow always writes to a local directory and
this module mirrors it to the model directory through :mod:`sparktf.storage`:

* checkpoints: after each save the new ``ckpt-<step>.*`` files are uploaded, each under a
  temporary name then renamed into place, the data files first and the ``.index`` file
  last, then the ``checkpoint`` state file is published atomically, then older checkpoints
  beyond ``keep`` are deleted. An upload that dies at any point leaves no ``.index`` of the
  new checkpoint (its remains are not a complete checkpoint) and a state that still names
  the previous one;
* events: append-only. Every ``sync_every_s``, at each checkpoint and at the end, the
  complete records the chief's event files gained since the last sync are published as a
  new segment file (:func:`segment_name`), written under a temporary name without
  ``tfevents`` in it and renamed into place; a segment is never rewritten. Segments of a
  local event file sort after it and in the order they were written, so TensorBoard, which
  reads the event files of a directory in name order, sees one stream;
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
import struct
import time
import uuid

from sparktf import scratch, storage

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
    "complete_records",
    "retain_checkpoints",
    "segment_name",
    "state_text",
    "upload_checkpoint",
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
_CKPT_TEMP_RE = re.compile(r"^\." + CKPT_NAME + r"-\d+\..+\.tmp-[0-9a-f]{12}$")
# Segments are staged under this prefix (no "tfevents": TensorBoard ignores them).
_SEGMENT_TEMP = ".sparktf-segment.tmp-"


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


FEED_SUFFIX = ".feed.json"


def add_to_run_record(model_dir: str, values: dict) -> None:
    """Adds ``values`` (the driver's part: the events between attempts, the feed's passes)
    to the model directory's record of the run (``sparktf_train.json``, written whole by
    the chief), published atomically; a record is started when there is none."""
    path = storage.join(model_dir, RUN_FILE)
    try:
        record = json.loads(storage.read_text(path))
    except storage.PathNotFoundError:
        record = {}
    record.update(values)
    with storage.publish(path, overwrite=True) as tmp:
        storage.write_text(tmp, json.dumps(record, indent=2) + "\n")


def checkpoint_feed(model_dir: str, step: int) -> dict | None:
    """Where the feed stood at the checkpoint of ``step`` (:meth:`ModelDir.save`'s
    ``feed``), or None when the checkpoint has no such record."""
    path = storage.join(model_dir, CHECKPOINTS, f"{CKPT_NAME}-{step}{FEED_SUFFIX}")
    try:
        return json.loads(storage.read_text(path))
    except storage.PathNotFoundError:
        return None


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
    are remains of a save that died before its state file was published, and so are the
    temporary files of an upload that died (:func:`upload_checkpoint`). Returns the kept
    names (``ckpt-<step>``), oldest first.
    """
    groups: dict[int, list[str]] = {}
    leftovers = []
    for entry in storage.listdir(checkpoint_dir):
        base = posixpath.basename(storage.parse(entry).path)
        match = _CKPT_FILE_RE.match(base)
        if match:
            groups.setdefault(int(match.group(1)), []).append(entry)
        elif _CKPT_TEMP_RE.match(base):
            leftovers.append(entry)
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
    for entry in leftovers:
        storage.delete(entry)
        log.info("deleted %s, left by a checkpoint upload that did not finish", entry)
    for step, files in sorted(groups.items()):
        if f"{CKPT_NAME}-{step}" in kept:
            continue
        for entry in files:
            storage.delete(entry)
        log.info(
            "deleted checkpoint %s-%d of %s (keeping %d)", CKPT_NAME, step, checkpoint_dir, keep
        )
    return kept


def upload_checkpoint(local_dir: str, name: str, remote_dir: str) -> list[str]:
    """Uploads the files of checkpoint ``name`` (``ckpt-<step>``) from ``local_dir`` to
    ``remote_dir``: each under a temporary name (``.<file>.tmp-<hex>``), renamed into place
    once complete, the data files first and the ``.index`` file last. A checkpoint is
    complete once its ``.index`` is there, so an upload that dies leaves none, only files
    :func:`retain_checkpoints` removes. Returns the uploaded names in upload order.

    Raises:
        StorageError: a write or a rename failed (the temporary file is deleted first).
    """
    names = sorted(n for n in os.listdir(local_dir) if n.startswith(name + "."))
    names.sort(key=lambda n: n.endswith(".index"))  # stable: data files, then the index
    storage.makedirs(remote_dir)
    for base in names:
        target = storage.join(remote_dir, base)
        tmp = storage.temp_sibling(target)
        try:
            storage.copy_file(os.path.join(local_dir, base), tmp)
            if storage.exists(target):  # a file of an unfinished save of the same step
                storage.delete(target)
            storage.rename(tmp, target)
        except BaseException:
            try:
                storage.delete(tmp)
            except Exception as exc:  # the next retention pass removes it
                log.warning("could not delete %s after a failed upload: %s", tmp, exc)
            raise
    return names


def complete_records(data: bytes) -> int:
    """The length of the longest prefix of ``data`` that is whole TFRecords (the format of
    event files: a little-endian uint64 length, a 4-byte CRC, the record, a 4-byte CRC);
    the rest is a record TensorFlow has not finished writing."""
    end = 0
    while end + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, end)
        after = end + 12 + length + 4
        if after > len(data):
            break
        end = after
    return end


def segment_name(event_file: str, index: int) -> str:
    """The name of segment ``index`` (1, 2, ...) of the local event file named
    ``event_file``: ``<event_file>.<index, 6 digits>``. Segments sort after ``event_file``'s
    own name and among themselves in order, and contain ``tfevents`` as TensorBoard needs."""
    return f"{event_file}.{index:06d}"


class ModelDir:
    """A run's model directory as seen by one TensorFlow process.

    ``writer``: this process writes the run's results (the chief). Other processes get a
    private scratch directory (multi-worker saves must happen on every worker, but only the
    chief's count), made by :func:`sparktf.scratch.make_dir`: removed by
    :meth:`close`, on any exit of a TensorFlow process, or by a later run's sweep.
    """

    def __init__(self, uri: str, *, writer: bool, sync_every_s: float = 60.0):
        self.uri = uri
        self.writer = writer
        self.remote = storage.is_remote(uri)
        self.sync_every_s = sync_every_s
        self._scratch = None
        if writer and not self.remote:
            self.local = storage.parse(uri).path
        else:
            self._scratch = scratch.make_dir("sparktf-modeldir-")
            self.local = self._scratch
        os.makedirs(self.checkpoint_dir, exist_ok=True)
        self._last_sync = time.monotonic()
        self._synced: dict[str, tuple[int, int]] = {}  # event file -> (bytes, segments) out
        self._flushers: list = []
        self._staging_cleaned = False
        self._manager = None
        self._options = None  # tf.train.CheckpointOptions (attach's io_device)
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

    def attach(self, tf_checkpoint, *, keep: int, io_device: str | None = None) -> str | None:
        """Manages ``tf_checkpoint`` (a ``tf.train.Checkpoint``) here, keeping ``keep`` saves,
        and restores the model directory's latest checkpoint into it; returns that
        checkpoint's local prefix, or None for a fresh start.

        ``io_device``: the device whose host reads and writes the files (this process's
        CPU). Under ps it must be given: TensorFlow saves each variable on the device that
        holds it, so a parameter server on another host would write its part into that
        host's own directory of this path, which does not exist there."""
        import tensorflow as tf

        self._keep = keep
        self._options = (
            tf.train.CheckpointOptions(experimental_io_device=io_device) if io_device else None
        )
        self._manager = tf.train.CheckpointManager(
            tf_checkpoint, self.checkpoint_dir, max_to_keep=keep, checkpoint_name=CKPT_NAME
        )
        prefix = self._fetch_latest()
        if prefix:
            tf_checkpoint.restore(prefix, options=self._options).expect_partial()
            log.info("restored %s", prefix)
        return prefix

    def save(self, step: int, *, feed: dict | None = None) -> str:
        """Saves the attached checkpoint as ``ckpt-<step>``; the writer mirrors it to the
        model directory, then keeps the ``keep`` newest checkpoints there (of any run).
        ``feed``: where the run's feed stands at this step, kept beside the checkpoint as
        ``ckpt-<step>.feed.json`` (a file of the checkpoint: uploaded before its ``.index``,
        deleted with it; :func:`checkpoint_feed` reads it). Returns the checkpoint's prefix
        (URI for the writer)."""
        prefix = self._manager.save(checkpoint_number=step, options=self._options)
        if feed is not None:
            with open(f"{prefix}{FEED_SUFFIX}", "w") as f:
                json.dump(feed, f)
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
        upload_checkpoint(self.checkpoint_dir, name, remote_dir)
        retain_checkpoints(remote_dir, step, self._keep)
        self.sync_events(force=True)
        return storage.join(remote_dir, name)

    # -- events ---------------------------------------------------------------------------

    def add_flusher(self, flush) -> None:
        """Registers ``flush()`` (an event writer's) to run before each sync of the events."""
        self._flushers.append(flush)

    def sync_due(self) -> bool:
        """Whether :meth:`sync_events` would publish now (an hdfs:// writer, interval out)."""
        return (
            self.remote and self.writer and time.monotonic() - self._last_sync >= self.sync_every_s
        )

    def sync_events(self, *, force: bool = False) -> None:
        """Publishes what the local event files gained since the last sync, as new segment
        files of an hdfs:// model directory (see the module's description)."""
        events = os.path.dirname(self.events_dir)  # train/ and eval/
        if not (self.remote and self.writer) or not os.path.isdir(events):
            return
        if not force and not self.sync_due():
            return
        self._last_sync = time.monotonic()
        for flush in self._flushers:
            flush()
        for root, _, files in os.walk(events):
            remote = storage.join(self.uri, *os.path.relpath(root, self.local).split(os.sep))
            for base in sorted(files):
                if "tfevents" in base:
                    self._publish_segment(os.path.join(root, base), remote)

    def _publish_segment(self, path: str, remote_dir: str) -> None:
        """Publishes the complete records of the event file ``path`` not yet out as its next
        segment in ``remote_dir`` (staged under a name TensorBoard ignores, then renamed)."""
        done, segments = self._synced.get(path, (0, 0))
        with open(path, "rb") as f:
            f.seek(done)
            data = f.read()
        length = complete_records(data)
        if not length:
            return
        if not self._staging_cleaned:
            self._clean_staging()
        target = storage.join(remote_dir, segment_name(os.path.basename(path), segments + 1))
        tmp = storage.join(remote_dir, f"{_SEGMENT_TEMP}{uuid.uuid4().hex[:12]}")
        try:
            storage.write_bytes(tmp, data[:length])
            storage.rename(tmp, target)
        except BaseException:
            try:
                storage.delete(tmp)
            except Exception as exc:
                log.warning("could not delete %s after a failed event upload: %s", tmp, exc)
            raise
        self._synced[path] = (done + length, segments + 1)

    def _clean_staging(self) -> None:
        """Deletes segments staged by a writer that died before renaming them (the chief is
        the model directory's only writer), in both event directories."""
        self._staging_cleaned = True
        for run in (EVENTS, EVAL_EVENTS):
            directory = storage.join(self.uri, *run.split("/"))
            for entry in storage.listdir(directory) if storage.exists(directory) else []:
                if posixpath.basename(storage.parse(entry).path).startswith(_SEGMENT_TEMP):
                    storage.delete(entry)
                    log.info("deleted %s, left by an event upload that did not finish", entry)

    # -- exports and run info -------------------------------------------------------------

    def export_dir(self, version: int) -> str:
        return storage.join(self.uri, EXPORT, str(version))

    def export(self, write, version: int, *, root: str = EXPORT) -> str:
        """Calls ``write(local_dir)`` and publishes the result as ``<root>/<version>``."""
        target = storage.join(self.uri, root, str(version))
        storage.makedirs(storage.join(self.uri, root))
        with storage.publish(target, overwrite=True) as tmp:
            if self.remote:
                local = scratch.make_dir("sparktf-export-")
                try:
                    write(os.path.join(local, "model"))
                    storage.copy_tree(os.path.join(local, "model"), tmp)
                finally:
                    scratch.remove_dir(local)
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
        """Removes this process's scratch directory (if it has one)."""
        if self._scratch:
            scratch.remove_dir(self._scratch)
