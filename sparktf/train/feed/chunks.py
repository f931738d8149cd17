"""The ``spark`` input mode: DataFrame rows into the TensorFlow processes, at Spark's speed.

TensorFlowOnSpark's own feed (``TFCluster.train`` / ``DataFeed.next_batch``) pushes every row,
pickled one by one, through a multiprocessing-manager queue, which delivers rows far slower
than Spark reads them (docs/versions.md). This module keeps TensorFlowOnSpark's plumbing --
the executor's ``TFManager`` and its ``input`` queue, which pair a Spark task with the
TensorFlow process on the same executor -- but moves the rows around the queue:

1. Feeding tasks (``DataFrame.mapInArrow`` in a barrier stage, :func:`make_feeder`), one
   per process and pass, each holding one process's share of an epoch in the epoch's order
   (:mod:`sparktf.train.feed.order`), receive Arrow record batches straight from the JVM,
   cut them into chunks of about ``chunk_bytes`` and write each chunk as an Arrow IPC file
   into a node-local directory (``/dev/shm`` when it has room) that the TensorFlow process
   on the same host created (:func:`share_node`). Only ``(path, rows)`` goes on the
   ``input`` queue. A feeding task blocks while ``max_buffered`` chunks wait unread
   (back-pressure) and fails after ``feed_timeout_s`` without progress.
2. The TensorFlow process (:class:`FeedReader`) memory-maps each file, decodes whole columns
   at once (``image``/``tokens`` hold ``numpy.save`` bytes of one fixed shape, so a column
   is a strided view of one buffer), deletes the file, and re-batches rows, in the order
   they came, into exact batches on a prefetch thread.
3. The end: when the driver's feed jobs have finished it publishes how many chunks each
   executor received (:mod:`sparktf.train.wire.control`); a reader ends after reading its count
   (once it has read every chunk queued it asks the driver for the count itself, rather
   than waiting for its next heartbeat's answer). Every share is whole global batches, so
   nothing is left short of a batch (``dropped_rows`` counts what would be).

When a TensorFlow process stops early (its step target reached, or it failed) it sets its
manager's ``sparktf_state``; feeding tasks on that executor then skip their rows.

Neither TensorFlow nor Spark is imported here: feeding tasks stay light. The driver's side,
the Spark job that runs the feeding tasks, is :mod:`sparktf.train.feed.job`.
"""

from __future__ import annotations

import logging
import os
import queue as queue_lib
import shutil
import stat
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from sparktf import scratch
from sparktf.datasets.formats import Field, NdarrayColumnError, decode_ndarray_column
from sparktf.errors import SparktfError

__all__ = [
    "DEFAULT_CHUNK_BYTES",
    "DEFAULT_MAX_BUFFERED",
    "DONE",
    "FAILED",
    "FEED_KEY",
    "RUNNING",
    "STATE_KEY",
    "SUMMARY_SCHEMA",
    "FeedError",
    "FeedReader",
    "FeedTimeout",
    "Rebatcher",
    "connect_manager",
    "decode_table",
    "feed_dir_names",
    "forget_managers",
    "input_queue",
    "make_feeder",
    "node_local_dir",
    "remove_feed_dirs",
    "share_node",
    "write_chunk",
]

log = logging.getLogger(__name__)

FEED_KEY = "sparktf_feed"
STATE_KEY = "sparktf_state"
RUNNING, DONE, FAILED = "running", "done", "failed"
DEFAULT_CHUNK_BYTES = 8 << 20
DEFAULT_MAX_BUFFERED = 8
# A reader that has read every chunk queued asks the driver whether the feed has ended after
# END_POLL_S, then less and less often (x1.5 each time, at most once a second, as often as
# the heartbeat): quick at the end of a feed, light on the driver while Spark is just slow.
END_POLL_S = 0.2
END_POLL_MAX_S = 1.0
# A feeding task blocked by back-pressure looks for room every ROOM_POLL_MAX_S at most (the
# reader still holds up to max_buffered chunks) and at the reader's state every STATE_POLL_S.
ROOM_POLL_MAX_S = 0.1
STATE_POLL_S = 1.0
SUMMARY_SCHEMA = "executor string, chunks long, rows long, skipped long"


class FeedError(SparktfError, RuntimeError):
    """The spark input mode cannot continue (the message says where and why)."""


class FeedTimeout(FeedError, TimeoutError):
    """The other end of the feed made no progress within ``feed_timeout_s``."""


# ----------------------------------------------------------------------------- managers

_MANAGERS: dict[Any, Any] = {}
_QUEUES: dict[int, tuple[Any, Any]] = {}


def connect_manager(address: Any, authkey: bytes):
    """A connected TensorFlowOnSpark ``TFManager`` (cached per address in this process)."""
    from tensorflowonspark import TFManager

    key = address if isinstance(address, str) else tuple(address)
    mgr = _MANAGERS.get(key)
    if mgr is None:
        mgr = TFManager.connect(address, bytes(authkey))
        _MANAGERS[key] = mgr
    return mgr


def input_queue(mgr):
    """The proxy of the manager's ``input`` queue (one per manager in this process: each
    new proxy opens an authenticated connection)."""
    found = _QUEUES.get(id(mgr))
    if found is None or found[0] is not mgr:
        found = _QUEUES[id(mgr)] = (mgr, mgr.get_queue("input"))
    return found[1]


def forget_managers() -> None:
    """Drops the cached manager connections of this process (their managers are gone)."""
    _MANAGERS.clear()
    _QUEUES.clear()


def _get(mgr, key: str, default=None):
    """A value of the manager's key-value store. TFManager's ``get`` returns a proxy of the
    value (TensorFlowOnSpark compares ``str()`` of it); ``_getvalue()`` gives the value."""
    from multiprocessing.managers import RemoteError

    try:
        value = mgr.get(key)
    except (KeyError, RemoteError) as exc:
        if isinstance(exc, RemoteError) and "KeyError" not in str(exc):
            raise
        return default
    return value._getvalue() if hasattr(value, "_getvalue") else value


def _feed_bases() -> list[str]:
    """Where feed directories may live: ``SPARKTF_FEED_DIR``, else ``/dev/shm`` and the
    system temporary directory."""
    if os.environ.get("SPARKTF_FEED_DIR"):
        return [os.environ["SPARKTF_FEED_DIR"]]
    return ["/dev/shm", tempfile.gettempdir()]


def _feed_prefix(token: str, key: str) -> str:
    return f"sparktf-feed-{token[:8]}-{key}-"


def feed_dir_names(token: str, key: str) -> list[str]:
    """The feed directories of node ``key`` of run ``token`` that exist and belong to this
    user (their names end in a random part: see :func:`node_local_dir`)."""
    prefix = _feed_prefix(token, key)
    found = []
    for base in _feed_bases():
        try:
            names = os.listdir(base)
        except OSError:
            continue
        for name in names:
            # mkdtemp's random part has no "-": "executor-1-" never matches "executor-12-".
            if not name.startswith(prefix) or "-" in name[len(prefix) :]:
                continue
            path = os.path.join(base, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode) and st.st_uid == os.geteuid():
                found.append(path)
    return sorted(found)


def node_local_dir(token: str, key: str, *, min_free: int = 1 << 30) -> str:
    """Creates the feed directory of one node: in ``/dev/shm`` when it has ``min_free`` bytes
    free, else in the system temporary directory (``SPARKTF_FEED_DIR`` overrides both).

    The directory is private: created with mode 0700 in one step (``mkdtemp``), its name
    ends in a random part, so another user on the machine can neither read the rows nor
    plant a file or a symbolic link there. Feeding tasks learn the name from the node's
    TFManager (:func:`_await_feed_dir`); they run as the same user. The name starts with
    run and node, so the Spark task that started the node can find it and remove it
    whatever happened to the node (:func:`remove_feed_dirs`). The node holds the directory's
    owner lock (:func:`sparktf.scratch.make_dir`) while it lives, so a later run's
    sweep removes a directory whose node and Spark task were both killed."""
    bases = _feed_bases()
    base = bases[-1]
    if len(bases) > 1:
        try:
            st = os.statvfs("/dev/shm")
            if os.access("/dev/shm", os.W_OK) and st.f_bavail * st.f_frsize >= min_free:
                base = bases[0]
        except OSError:
            pass
    os.makedirs(base, exist_ok=True)
    return scratch.make_dir(_feed_prefix(token, key), dir=base)


def remove_feed_dirs(token: str, key: str) -> None:
    """Removes the feed directories of node ``key`` of run ``token`` (rows left unread)."""
    for path in feed_dir_names(token, key):
        shutil.rmtree(path, ignore_errors=True)


def _check_feed_dir(path: str, key: str) -> str:
    """``path`` if it is a private directory of this user, else FeedError (the name came
    from the TFManager, but a feeding task writes rows only where no one else can read)."""
    try:
        st = os.lstat(path)
    except OSError as exc:
        raise FeedError(f"the feed directory {path} of {key} is not usable: {exc}") from exc
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
        raise FeedError(
            f"the feed directory {path} of {key} is not a private directory of this user "
            f"(mode {stat.filemode(st.st_mode)}, owner uid {st.st_uid}, this user "
            f"{os.geteuid()}): refusing to write rows there"
        )
    return path


def write_chunk(directory: str, batch) -> str:
    """Writes one Arrow record batch as an Arrow IPC file in ``directory``; its path.

    The file is created 0600 with ``O_EXCL | O_NOFOLLOW`` under a temporary name and renamed
    into place once complete, so a reader never maps half a chunk."""
    import pyarrow as pa

    path = os.path.join(directory, f"{uuid.uuid4().hex}.arrow")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path + ".tmp", flags, 0o600)
    try:
        with open(fd, "wb", closefd=True) as sink:
            with pa.ipc.new_file(sink, batch.schema) as writer:
                writer.write_batch(batch)
        os.rename(path + ".tmp", path)
    except BaseException:
        try:
            os.unlink(path + ".tmp")
        except OSError:
            pass
        raise
    return path


# ----------------------------------------------------------------------------- feeding side


def _host_toward(url: str) -> str:
    """This host's address toward the driver at ``url``: what its nodes registered as."""
    from urllib.parse import urlsplit

    from sparktf.train.wire.reservation import route_to

    where = urlsplit(url)
    return route_to(where.hostname, where.port or 80)


def share_node(shares: list[dict], task_hosts: list[str], index: int) -> dict:
    """The process the task of partition ``index`` of a pass feeds, the feed going through a
    Unix socket and a local directory: share ``j`` (partition ``j``) goes to process ``j``
    when its task runs on that process's host. ``task_hosts[i]`` is where the task of
    partition ``i`` runs (the barrier stage's tasks tell each other). Tasks Spark placed on
    another host than their process's are paired, host by host and in order, with the
    processes of their host whose own task is elsewhere: every process still gets one share.

    Raises:
        FeedError: a host has more such tasks than processes (its rows would have to cross
            hosts).
    """
    n = len(shares)
    placed = [task_hosts[j] == shares[j].get("host") for j in range(n)]
    if placed[index]:
        return shares[index]
    here = task_hosts[index]
    tasks = [j for j in range(n) if not placed[j] and task_hosts[j] == here]
    free = [j for j in range(n) if not placed[j] and shares[j].get("host") == here]
    position = tasks.index(index)
    if position >= len(free):
        hosts = sorted({str(s.get("host")) for s in shares})
        raise FeedError(
            f"Spark placed {len(tasks)} feeding tasks on host {here}, which runs "
            f"{len(free)} TensorFlow processes left to feed (the processes run on "
            f"{', '.join(hosts)}): in spark input mode the session's free task slots must be "
            "on the processes' hosts, one per process; use the files input mode, or a session "
            "whose executors are those of the processes"
        )
    return shares[free[position]]


def make_feeder(
    shares: list[dict],
    token: str,
    control_url: str,
    *,
    feed_timeout_s: float,
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    max_buffered: int = DEFAULT_MAX_BUFFERED,
) -> Callable:
    """The ``mapInArrow`` function of a pass of the feeding job, run as a barrier stage of
    one task per process (:mod:`sparktf.train.feed.passes`).

    ``shares[j]`` is the TFManager ``{"addr", "authkey", "key", "host"}`` of the process
    that partition ``j`` feeds (:func:`share_node`); ``token`` and ``control_url`` identify
    the run and its driver. The partition's rows are written in their order, in chunks.
    Yields one summary row per task (:data:`SUMMARY_SCHEMA`). A task ends early, without
    writing, once its TensorFlow process has stopped reading or the driver has ended the
    run; it fails promptly when the driver aborts the run (no task is killed: killing a
    PySpark worker would orphan TensorFlowOnSpark's processes in it).
    """

    def feed(batches: Iterator) -> Iterator:
        import pyarrow as pa

        from sparktf.train.wire.control import RunFlags

        flags = _run_flags(RunFlags, control_url, token)
        node = _task_node(shares, _host_toward(control_url))
        mgr = connect_manager(node["addr"], node["authkey"])
        queue = input_queue(mgr)
        target = _await_feed_dir(mgr, token, node["key"], feed_timeout_s, flags)
        reader = _ReaderState(mgr)
        chunks = rows = skipped = 0
        writing = target is not None
        for batch in batches:
            flags.check()
            if writing and (flags.stopped or not reader.running()):
                writing = False
            if not writing:
                skipped += batch.num_rows
                continue
            step = max(1, chunk_bytes // max(1, batch.nbytes // max(1, batch.num_rows)))
            for start in range(0, batch.num_rows, step):
                piece = batch.slice(start, step)
                if not _wait_for_room(
                    reader, queue, max_buffered, feed_timeout_s, node["key"], flags
                ):
                    writing = False
                    skipped += batch.num_rows - start
                    break
                try:
                    path = write_chunk(target, piece)
                except FileNotFoundError:  # the reader finished and removed its directory
                    writing = False
                    skipped += batch.num_rows - start
                    break
                queue.put((path, piece.num_rows))
                chunks += 1
                rows += piece.num_rows
        yield pa.RecordBatch.from_pydict(
            {"executor": [node["key"]], "chunks": [chunks], "rows": [rows], "skipped": [skipped]}
        )

    return feed


def _task_node(shares: list[dict], here: str) -> dict:
    """The process this task feeds (:func:`share_node`): the tasks of the barrier stage
    tell each other where they run. A task outside a barrier stage (called directly) feeds
    its partition's process, as if every other task ran on its process's host."""
    from pyspark import BarrierTaskContext, TaskContext

    try:
        barrier = BarrierTaskContext.get()
    except Exception:  # not a barrier stage's task
        task = TaskContext.get()
        index = task.partitionId() if task is not None else 0
        hosts = [str(s.get("host")) for s in shares]
        hosts[index] = here
        return share_node(shares, hosts, index)
    return share_node(shares, barrier.allGather(here), barrier.partitionId())


_FLAGS: dict[tuple[str, str], Any] = {}


def _run_flags(factory, url: str, token: str):
    """The run's flags, shared by the feeding tasks of one PySpark worker: a task then asks
    the driver at most once a second in all, not once when it starts (the flags are never
    older than ``RunFlags.every_s``). Flags of earlier runs are dropped."""
    flags = _FLAGS.get((url, token))
    if flags is None:
        _FLAGS.clear()
        flags = _FLAGS[(url, token)] = factory(url, token)
    return flags


def _await_feed_dir(mgr, token: str, key: str, timeout_s: float, flags) -> str | None:
    """The reader's directory, once it is ready; None if the reader already stopped."""
    deadline = time.monotonic() + timeout_s
    while True:
        flags.check()
        if flags.stopped:
            return None
        info = _get(mgr, FEED_KEY)
        if info and info.get("token") == token:
            # The directory first, then the state: a reader that ends sets its state and
            # then removes its directory, so a directory found missing by a task that starts
            # just then is a reader that has stopped, not an error.
            try:
                found, problem = _check_feed_dir(info["dir"], key), None
            except FeedError as exc:
                found, problem = None, exc
            if _get(mgr, STATE_KEY) != RUNNING:
                return None
            if problem is not None:
                raise problem
            return found
        if time.monotonic() > deadline:
            raise FeedTimeout(
                f"the TensorFlow process of {key} did not open its feed within "
                f"{timeout_s:.0f} s (feed_timeout_s)"
            )
        time.sleep(0.05)


class _ReaderState:
    """Whether the TensorFlow process still reads, asked of its manager at most every
    ``STATE_POLL_S``: each ``TFManager.get`` opens two authenticated connections, work for
    the executor's manager process that asking once per chunk would multiply. A reader that
    stops removes its directory, so a chunk written in the meantime fails to be written
    (``FileNotFoundError``) or is removed with the directory."""

    def __init__(self, mgr):
        self.mgr = mgr
        self._running = True  # the caller has just seen it running
        self._next = time.monotonic() + STATE_POLL_S

    def running(self) -> bool:
        now = time.monotonic()
        if self._running and now >= self._next:
            self._running = _get(self.mgr, STATE_KEY) == RUNNING
            self._next = now + STATE_POLL_S
        return self._running


def _wait_for_room(
    reader: _ReaderState, queue, max_buffered: int, timeout_s: float, key: str, flags
) -> bool:
    """Back-pressure: waits while ``max_buffered`` chunks are unread. False: reader stopped.

    ``qsize`` travels on the proxy's open connection; the reader's state is asked at most
    every ``STATE_POLL_S`` (:class:`_ReaderState`)."""
    deadline = None
    delay = 0.001
    while queue.qsize() >= max_buffered:
        flags.check()
        if not reader.running() or flags.stopped:
            return False
        now = time.monotonic()
        if deadline is None:
            deadline = now + timeout_s
        elif now > deadline:
            raise FeedTimeout(
                f"the TensorFlow process of {key} took no rows for "
                f"{timeout_s:.0f} s (feed_timeout_s); it may be stuck"
            )
        time.sleep(delay)
        delay = min(delay * 2, ROOM_POLL_MAX_S)
    return reader.running()


# ----------------------------------------------------------------------------- decoding


def decode_table(table, fields: list[Field], *, where: str = "feed") -> dict[str, np.ndarray]:
    """The columns ``fields`` of an Arrow table as numpy arrays: scalars as they are, ndarray
    columns decoded at once by :func:`sparktf.datasets.formats.decode_ndarray_column` (one
    vectorised pass over the column's buffer), or from Arrow lists (a DataFrame fed as it
    is: :func:`_list_column`). A FeedError starting with ``where`` when a column is missing
    or does not hold what its field says."""
    import pyarrow as pa

    out = {}
    for f in fields:
        if f.name not in table.column_names:
            raise FeedError(f"{where}: no column {f.name!r} (columns: {table.column_names})")
        column = table.column(f.name)
        if f.shape is None:
            out[f.name] = _scalar_column(column, f, where)
            continue
        if pa.types.is_list(column.type) or pa.types.is_large_list(column.type):
            out[f.name] = _list_column(column, f, where)
            continue
        try:
            out[f.name] = decode_ndarray_column(column, f.dtype, f.shape, name=f.name)
        except NdarrayColumnError as exc:
            raise FeedError(f"{where}: {exc}") from exc
    return out


def _list_column(column, field: Field, where: str) -> np.ndarray:
    """A column of Arrow lists of numbers, ``prod(field.shape)`` of them per row, as one
    ``[rows, *field.shape]`` array of ``field.dtype`` (``uint8``: integers in [0, 255])."""
    import pyarrow as pa

    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    size = int(np.prod(field.shape))
    if column.null_count:
        row = int(np.flatnonzero(column.is_null().to_numpy(zero_copy_only=False))[0])
        raise FeedError(f"{where}: column {field.name!r}: row {row} of a chunk is null")
    offsets = np.asarray(column.offsets)
    lengths = np.diff(offsets)
    if (lengths != size).any():
        row = int(np.flatnonzero(lengths != size)[0])
        raise FeedError(
            f"{where}: column {field.name!r}: row {row} of a chunk has {lengths[row]} values; "
            f"expected shape {field.shape} ({size} values)"
        )
    values = column.flatten()
    if values.null_count:
        raise FeedError(f"{where}: column {field.name!r} holds null elements")
    flat = values.to_numpy(zero_copy_only=False)
    if field.dtype == "uint8" and ((flat < 0) | (flat > 255) | (flat != np.floor(flat))).any():
        raise FeedError(
            f"{where}: column {field.name!r} holds values that are not integers in [0, 255]; "
            "the model reads uint8"
        )
    return flat.astype(field.dtype, copy=False).reshape(len(column), *field.shape)


def _scalar_column(column, field: Field, where: str) -> np.ndarray:
    """A column of numbers as a numpy array of ``field.dtype``.

    Integer and floating-point columns without nulls are read straight from their Arrow
    buffer: pyarrow's ``to_numpy`` imports pandas on first use, a slow import that would
    delay a TensorFlow process at the start of its feed."""
    import pyarrow as pa

    chunks = column.chunks if isinstance(column, pa.ChunkedArray) else [column]
    kind = column.type
    if column.null_count:
        raise FeedError(
            f"{where}: column {field.name!r} holds {column.null_count} nulls "
            f"(expected {field.dtype} values)"
        )
    if field.dtype == "string":  # a model's string input (e.g. for a StringLookup layer)
        if not (pa.types.is_string(kind) or pa.types.is_large_string(kind)):
            raise FeedError(
                f"{where}: column {field.name!r} has Arrow type {kind}, expected strings"
            )
        return column.to_numpy(zero_copy_only=False)
    if not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
        try:
            return column.to_numpy().astype(field.dtype, copy=False)
        except (pa.ArrowException, TypeError, ValueError) as exc:
            raise FeedError(
                f"{where}: column {field.name!r} has Arrow type {kind}, "
                f"expected {field.dtype} values"
            ) from exc
    code = "f" if pa.types.is_floating(kind) else "i" if pa.types.is_signed_integer(kind) else "u"
    dtype = np.dtype(f"{code}{kind.bit_width // 8}")
    parts = [
        np.frombuffer(c.buffers()[1], dtype=dtype)[c.offset : c.offset + len(c)]
        for c in chunks
        if len(c)
    ]
    if not parts:
        return np.zeros(0, dtype=field.dtype)
    values = parts[0] if len(parts) == 1 else np.concatenate(parts)
    return values.astype(field.dtype, copy=False)


class Rebatcher:
    """Turns chunks of any size into batches of exactly ``batch_size`` rows, in order."""

    def __init__(self, batch_size: int):
        self.batch_size = batch_size
        self._parts: list[dict[str, np.ndarray]] = []
        self._rows = 0

    def add(self, chunk: dict[str, np.ndarray]) -> Iterator[dict[str, np.ndarray]]:
        n = len(next(iter(chunk.values())))
        self._parts.append(chunk)
        self._rows += n
        while self._rows >= self.batch_size:
            yield self._take(self.batch_size)

    def _take(self, count: int) -> dict[str, np.ndarray]:
        taken, need = [], count
        while need:
            part = self._parts[0]
            n = len(next(iter(part.values())))
            if n <= need:
                taken.append(self._parts.pop(0))
                need -= n
            else:
                taken.append({k: v[:need] for k, v in part.items()})
                self._parts[0] = {k: v[need:] for k, v in part.items()}
                need = 0
        self._rows -= count
        if len(taken) == 1:
            return taken[0]
        return {k: np.concatenate([t[k] for t in taken]) for k in taken[0]}

    @property
    def leftover(self) -> int:
        return self._rows


# ----------------------------------------------------------------------------- reading side


class FeedReader:
    """The TensorFlow process's end of the feed: chunks in, exact batches out.

    ``control`` is the node's :class:`~sparktf.train.wire.control.ControlClient` (its
    ``feed_end`` says when the feed is complete); ``key`` is this node's key there.
    """

    def __init__(
        self,
        *,
        mgr_address: Any,
        authkey: bytes,
        token: str,
        key: str,
        fields: list[Field],
        control,
        feed_timeout_s: float,
    ):
        self.key, self.token, self.fields = key, token, fields
        self.control = control
        self.feed_timeout_s = feed_timeout_s
        self.mgr = connect_manager(mgr_address, authkey)
        self.queue = self.mgr.get_queue("input")
        self.dir = node_local_dir(token, key)
        self.chunks = self.rows = self.dropped_rows = 0
        # its thread's time waiting for Spark's next chunk, and decoding chunks
        self.wait_s = self.decode_s = 0.0
        self._closed = False
        self._next_end_poll = 0.0
        self._end_poll_s = END_POLL_S

    def open(self) -> FeedReader:
        self.mgr.set(STATE_KEY, RUNNING)
        self.mgr.set(FEED_KEY, {"token": self.token, "dir": self.dir})
        log.info("feed for %s open in %s", self.key, self.dir)
        return self

    def _expected(self) -> int | None:
        end = self.control.feed_end
        return None if end is None else int(end.get(self.key, 0))

    def _ask_for_end(self) -> None:
        """Asks the driver whether the feed has ended (see ``END_POLL_S``) instead of waiting
        up to a heartbeat for the answer: called only while no chunk is waiting."""
        now = time.monotonic()
        if now < self._next_end_poll:
            return
        self._next_end_poll = now + self._end_poll_s
        self._end_poll_s = min(self._end_poll_s * 1.5, END_POLL_MAX_S)
        try:
            self.control.post("beat", timeout=5.0)  # the answer carries feed_end
        except Exception as exc:  # the heartbeat thread judges an unreachable driver
            log.debug("%s: asking the driver for the feed's end: %s", self.key, exc)

    def chunk_stream(self) -> Iterator[dict[str, np.ndarray]]:
        """Decoded chunks in arrival order, until the feed has ended."""
        import pyarrow as pa

        last = time.monotonic()
        while True:
            expected = self._expected()
            if expected is not None and self.chunks >= expected:
                return
            try:
                item = self.queue.get(timeout=END_POLL_S / 2)
            except queue_lib.Empty:
                if expected is None:
                    self._ask_for_end()
                waited = time.monotonic() - last
                if waited > self.feed_timeout_s:
                    raise FeedTimeout(
                        f"{self.key}: no rows arrived from Spark for {waited:.0f} s "
                        f"(feed_timeout_s={self.feed_timeout_s:.0f}); {self.rows} rows read so "
                        "far"
                    ) from None
                continue
            if item is None:  # TensorFlowOnSpark's end-of-feed marker (its shutdown job)
                self.queue.task_done()
                return
            path, count = item
            started = time.monotonic()
            self._next_end_poll, self._end_poll_s = started + END_POLL_S, END_POLL_S
            self.wait_s += started - last
            try:
                with pa.memory_map(path) as source:
                    table = pa.ipc.open_file(source).read_all()
                chunk = decode_table(table, self.fields, where=f"feed chunk {path}")
                del table
            finally:
                self.queue.task_done()
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
            self.chunks += 1
            self.rows += count
            self.decode_s += time.monotonic() - started
            yield chunk
            last = time.monotonic()  # time spent handing the batches on is not a wait

    def batches(self, batch_size: int, *, prefetch: int = 4) -> Iterator[dict[str, np.ndarray]]:
        """Exact batches of ``batch_size`` rows, read ahead on a thread."""
        rebatcher = Rebatcher(batch_size)
        out: queue_lib.Queue = queue_lib.Queue(maxsize=prefetch)
        stop = threading.Event()
        END = object()

        def produce() -> None:
            try:
                for chunk in self.chunk_stream():
                    for batch in rebatcher.add(chunk):
                        while not stop.is_set():
                            try:
                                out.put(batch, timeout=0.5)
                                break
                            except queue_lib.Full:
                                continue
                        if stop.is_set():
                            return
                self.dropped_rows = rebatcher.leftover
                out.put(END)
            except BaseException as exc:  # handed to the consumer
                out.put(exc)

        thread = threading.Thread(target=produce, name=f"sparktf-feed-{self.key}", daemon=True)
        thread.start()
        try:
            while True:
                item = out.get()
                if item is END:
                    if self.dropped_rows:
                        log.info(
                            "%s: feed ended; %d rows short of a batch dropped",
                            self.key,
                            self.dropped_rows,
                        )
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            stop.set()

    def close(self, state: str = DONE) -> None:
        """Tells feeders to stop, deletes unread chunks and the directory."""
        if self._closed:
            return
        self._closed = True
        try:
            self.mgr.set(STATE_KEY, state)
            while True:
                try:
                    item = self.queue.get_nowait()
                except queue_lib.Empty:
                    break
                self.queue.task_done()
                if item:
                    try:
                        os.unlink(item[0])
                    except (FileNotFoundError, TypeError):
                        pass
        except Exception as exc:  # the manager may be gone with its Spark worker
            log.debug("closing the feed of %s: %s", self.key, exc)
        scratch.remove_dir(self.dir)
