"""Nothing left behind, append-only artifacts: scratch directories removed on every exit and
swept when their owner is gone (a training process's, ``sparktf submit``'s), the executors'
model cache bounded, TensorBoard events on HDFS published in segments, checkpoint uploads that
never look complete when cut short."""

from __future__ import annotations

import contextlib
import fcntl
import os
import posixpath
import signal
import struct
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from sparktf import scratch, storage
from sparktf.train import artifacts
from tests.conftest import ROOT, descendants
from tests.helpers import assert_nothing_left

pytestmark = pytest.mark.unit  # tests of another tier carry their own mark

OTHER_UID = 54321  # a user that owns nothing here


def _python(code: str, **env) -> subprocess.Popen:
    """``python -c code`` in the repository, its standard output a pipe."""
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.PIPE,
        text=True,
    )


# ----------------------------------------------------------------------------- scratch


def test_sweep_removes_only_this_users_scratch_whose_owner_is_gone(tmp_path):
    base = str(tmp_path)
    held = scratch.make_dir("sparktf-modeldir-", dir=base)
    assert os.listdir(held) == [scratch.OWNER_FILE] and not scratch.is_stale(held)

    # Another process's directories: live while it runs, stale once it is SIGKILLed.
    child = _python(
        "import sys, time; from sparktf import scratch\n"
        f"print(scratch.make_dir('sparktf-modeldir-', dir={base!r}))\n"
        f"print(scratch.make_dir('sparktf-feed-abc-executor-0-', dir={base!r}))\n"
        f"print(scratch.make_dir('sparktf-ps-', dir={base!r}), flush=True)\n"  # the driver's ps
        "time.sleep(600)\n"
    )
    try:
        theirs = [child.stdout.readline().strip() for _ in range(3)]
        assert all(os.path.isdir(p) for p in theirs)
        assert scratch.sweep([base]) == []  # alive: untouched
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()

    # No owner file: a directory being created (recent) is kept, an old one is removed.
    fresh = tmp_path / "sparktf-feed-0-executor-1-fresh"
    old = tmp_path / "sparktf-node-old"
    fresh.mkdir()
    old.mkdir()
    (old / "error.json").write_text("{}")
    then = time.time() - scratch.UNOWNED_GRACE_S - 60
    os.utime(old, (then, then))
    # Never touched: another user's, a symbolic link, another name.
    foreign = tmp_path / "sparktf-modeldir-foreign"
    foreign.mkdir()
    os.utime(foreign, (then, then))
    os.chown(foreign, OTHER_UID, OTHER_UID)
    target = tmp_path / "elsewhere"
    target.mkdir()
    os.utime(target, (then, then))
    link = tmp_path / "sparktf-modeldir-link"
    link.symlink_to(target)
    unrelated = tmp_path / "sparktf-models-0"
    unrelated.mkdir()
    os.utime(unrelated, (then, then))

    removed = scratch.sweep([base])
    assert sorted(removed) == sorted([*theirs, str(old)])
    assert sorted(os.listdir(base)) == sorted(
        [
            os.path.basename(held),
            fresh.name,
            foreign.name,
            target.name,
            link.name,
            unrelated.name,
        ]
    )
    scratch.remove_dir(held)
    assert not os.path.exists(held) and held not in scratch.held_dirs()


def test_scratch_that_holds_secrets_is_owned_and_swept_once_its_owner_is_gone(tmp_path):
    """The directory of a new JVM's private settings (Spark's secret, the run's token, the
    UI's key: ``sparktf-secret-*``) and that of a process's HDFS token file
    (``sparktf-token-*``) are scratch directories like the others: held by their owner's
    lock (a sweep leaves them, however old they look, while the process lives) and swept once
    it is killed. The secret's used to be no swept name, and the token's had no owner file, so
    a sweep removed it from a process that still used it once it had not changed for
    ``UNOWNED_GRACE_S``."""
    base = str(tmp_path)
    child = _python(
        "import os, shlex, time\n"
        "from pyspark.sql import SparkSession\n"
        "from sparktf.spark.transport import private_for_new_jvm\n"
        "from sparktf.storage import native\n"
        "private = {'spark.authenticate.secret': 's3cr3t-value-0123'}\n"
        "with private_for_new_jvm(SparkSession.Builder(), private):\n"
        "    given = shlex.split(os.environ['PYSPARK_SUBMIT_ARGS'])\n"
        "    print(os.path.dirname(given[1]))\n"
        "    print(native._token_dir(), flush=True)\n"
        "    time.sleep(600)\n",
        TMPDIR=base,
    )
    try:
        held = [child.stdout.readline().strip() for _ in range(2)]
        names = [os.path.basename(path) for path in held]
        assert names[0].startswith("sparktf-secret-") and names[1].startswith("sparktf-token-")
        then = time.time() - scratch.UNOWNED_GRACE_S - 60
        for path in held:
            assert os.path.isfile(os.path.join(path, scratch.OWNER_FILE)), os.listdir(path)
            assert os.stat(path).st_mode & 0o077 == 0
            os.utime(path, (then, then))  # unchanged for long: its owner still holds it
        assert scratch.sweep([base]) == []
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert sorted(scratch.sweep([base])) == sorted(held)
    assert not any(os.path.exists(path) for path in held)


def test_sweep_leaves_a_directory_whose_owner_has_not_locked_it_yet(tmp_path):
    """Between the owner file's creation and its lock (the record is written after it), a
    sweep neither removes the directory nor takes the lock its creator is about to take."""
    being_made = tmp_path / "sparktf-modeldir-new"
    being_made.mkdir()
    owner = being_made / scratch.OWNER_FILE
    owner.touch()
    assert not scratch.is_stale(str(being_made)) and scratch.sweep([str(tmp_path)]) == []
    fd = os.open(owner, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the creator still gets its lock
    finally:
        os.close(fd)
    then = time.time() - scratch.UNOWNED_GRACE_S - 60
    os.utime(owner, (then, then))  # a creator that died before locking, long ago
    assert scratch.sweep([str(tmp_path)]) == [str(being_made)]


def test_an_aborted_process_removes_its_scratch_and_feed_dirs(tmp_path):
    """The abort path (``os._exit`` after the exit hooks) leaves no directory behind."""
    child = _python(
        "from sparktf.train import artifacts\n"
        "from sparktf.train.feed import chunks as feed\n"
        "from sparktf.train.process import main as node\n"
        f"md = artifacts.ModelDir({str(tmp_path / 'model')!r}, writer=False)\n"
        "print(md.local)\n"
        "print(feed.node_local_dir('0123456789', 'executor-0'), flush=True)\n"
        "node.exit_process(node.EXIT_ABORTED)\n",
        TMPDIR=str(tmp_path),
        SPARKTF_FEED_DIR=str(tmp_path / "feeds"),
    )
    made = child.stdout.read().split()
    assert child.wait() == 3
    assert len(made) == 2 and all(p.startswith(str(tmp_path)) for p in made), made
    assert [p for p in made if os.path.exists(p)] == []


# ----------------------------------------------------------------------------- sparktf submit

# A spark-submit that says where its properties file is, and which signal it got.
FAKE_SUBMIT = """#!/bin/sh
for arg in "$@"; do
  case "$prev" in --extra-properties-file|--properties-file) props="$arg" ;; esac
  prev="$arg"
done
trap 'echo TERM > "$OUT/signal"; exit 143' TERM
echo "$$ $props" > "$OUT/started.tmp" && mv "$OUT/started.tmp" "$OUT/started"
while :; do sleep 0.1; done
"""


def _submit(tmp_path: Path, *args: str) -> subprocess.Popen:
    """``sparktf submit`` of a standalone run (a shared secret in its scratch) through the
    fake spark-submit, its home under ``tmp_path``."""
    fake = tmp_path / "spark-submit"
    fake.write_text(FAKE_SUBMIT)
    fake.chmod(0o700)
    secret = tmp_path / "cluster-secret.conf"
    secret.write_text("spark.authenticate.secret " + "5ec2e7" * 8 + "\n")
    secret.chmod(0o600)
    env = {k: v for k, v in os.environ.items() if k not in ("HADOOP_CONF_DIR", "SPARKTF_PROFILE")}
    env.update(
        OUT=str(tmp_path),
        SPARKTF_HOME=str(tmp_path / "home"),
        SPARKTF_SPARK_SUBMIT=str(fake),
        SPARKTF_SPARK_MASTER="spark://127.0.0.1:7077",
        SPARKTF_SPARK_SECRET_FILE=str(secret),
        SPARKTF_SPARK_CLUSTER_DIR=str(tmp_path / "no-cluster"),
    )
    closed = "spark.sparktf.master.webui=http://127.0.0.1:9"  # nothing answers: no sizing
    argv = [sys.executable, "-m", "sparktf", "submit", "--profile", "standalone"]
    return subprocess.Popen([*argv, "--conf", closed, *args, "predict"], cwd=ROOT, env=env)


def _started(tmp_path: Path, submit: subprocess.Popen) -> tuple[int, Path]:
    """The fake spark-submit's pid and the properties file it was given."""
    started = tmp_path / "started"
    deadline = time.monotonic() + 60
    while not started.exists():
        assert submit.poll() is None, f"sparktf submit ended with {submit.returncode}"
        assert time.monotonic() < deadline, "the fake spark-submit did not start"
        time.sleep(0.05)
    pid, props = started.read_text().split()
    return int(pid), Path(props)


def _stop(submit: subprocess.Popen, tmp_path: Path) -> None:
    """Stops the ``sparktf submit`` and its fake spark-submit, whatever a test left."""
    if submit.poll() is None:
        submit.kill()
        submit.wait()
    started = tmp_path / "started"
    if started.exists():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(started.read_text().split()[0]), signal.SIGKILL)


def _submit_scratch(tmp_path: Path) -> list[str]:
    state = tmp_path / "home" / "submit"
    return sorted(p.name for p in state.iterdir()) if state.exists() else []


def test_a_terminated_submit_stops_spark_submit_and_removes_its_secret(tmp_path):
    submit = _submit(tmp_path)
    try:
        _, props = _started(tmp_path, submit)
        assert "5ec2e7" in props.read_text() and _submit_scratch(tmp_path)
        submit.send_signal(signal.SIGTERM)
        assert submit.wait(30) == 143  # spark-submit's code, as a shell reports it
    finally:
        _stop(submit, tmp_path)
    assert (tmp_path / "signal").read_text().strip() == "TERM"  # passed on
    assert not props.exists() and _submit_scratch(tmp_path) == []


def test_a_killed_submits_scratch_is_swept_once_its_spark_submit_is_gone(tmp_path):
    submit = _submit(tmp_path)
    try:
        child, props = _started(tmp_path, submit)
        submit.kill()  # SIGKILL: nothing of sparktf submit runs after it
        submit.wait()
        left = _submit_scratch(tmp_path)
        assert props.exists() and len(left) == 1
        # the orphaned spark-submit still holds the scratch's owner lock: a later submit
        # leaves it alone
        dry = _submit(tmp_path, "--dry-run")
        assert dry.wait(60) == 0 and _submit_scratch(tmp_path) == left
        os.kill(child, signal.SIGTERM)
        held = str(tmp_path / "home" / "submit" / left[0])
        deadline = time.monotonic() + 30
        while not scratch.is_stale(held):  # its lock goes with the last process holding it
            assert time.monotonic() < deadline, "the fake spark-submit did not stop"
            time.sleep(0.05)
        dry = _submit(tmp_path, "--dry-run")
        assert dry.wait(60) == 0
    finally:
        _stop(submit, tmp_path)
    assert not props.exists() and _submit_scratch(tmp_path) == []


# ----------------------------------------------------------------------------- model cache


def _fake_copy(base: Path, name: str, size: int, used: float) -> Path:
    path = base / name
    path.mkdir()
    (path / "saved_model.pb").write_bytes(b"\0" * size)
    os.utime(path, (used, used))
    return path


def test_model_cache_evicts_least_recently_used_first_never_one_in_use(tmp_path, monkeypatch):
    from sparktf.inference import cache

    mib = 1 << 20
    now = time.time()
    names = [c * 32 for c in "abcd"]  # oldest first
    copies = [_fake_copy(tmp_path, n, mib, now - 100 + i) for i, n in enumerate(names)]
    (tmp_path / (names[0] + ".lock")).touch()
    in_use = os.open(copies[0], os.O_RDONLY | os.O_DIRECTORY)  # as hold_model holds it
    try:
        fcntl.flock(in_use, fcntl.LOCK_SH)
        evicted = cache.evict(str(tmp_path), limit=int(2.5 * mib), keep=names[3])
        assert evicted == [names[1], names[2]]  # the oldest is in use, the newest kept
        assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [names[0], names[3]]
    finally:
        os.close(in_use)
    assert cache.evict(str(tmp_path), limit=int(1.5 * mib)) == [names[0]]
    assert cache.evict(str(tmp_path), limit=0, keep=names[3]) == []

    monkeypatch.delenv("SPARKTF_MODEL_CACHE_GB", raising=False)
    assert cache.cache_limit_bytes() == 4 << 30
    monkeypatch.setenv("SPARKTF_MODEL_CACHE_GB", "0.5")
    assert cache.cache_limit_bytes() == 1 << 29
    monkeypatch.setenv("SPARKTF_MODEL_CACHE_GB", "lots")
    with pytest.raises(cache.ModelCacheError, match="SPARKTF_MODEL_CACHE_GB"):
        cache.cache_limit_bytes()


@pytest.mark.integration
def test_model_cache_stays_within_its_bound_as_models_are_copied(hdfs, tmp_path, monkeypatch):
    """Copies of HDFS models beyond SPARKTF_MODEL_CACHE_GB evict the least recently used
    copy that no process holds; a held copy stays."""
    from sparktf.inference import cache, export_fingerprint

    monkeypatch.setenv("SPARKTF_MODEL_CACHE_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("SPARKTF_MODEL_CACHE_GB", str(1.5 / 1024))  # 1.5 MiB
    base = hdfs.fresh("cache-bound")
    models = []
    for i in range(3):
        uri = storage.join(base, f"m{i}")
        storage.write_bytes(storage.join(uri, "saved_model.pb"), os.urandom(600 << 10))
        models.append((uri, export_fingerprint(uri)))
    try:
        first, held_first = cache.hold_model(*models[0])
        second, held_second = cache.hold_model(*models[1])
        assert os.path.isdir(first) and os.path.isdir(second)  # 1.2 MiB: within the bound
        os.close(held_first)  # no longer used
        time.sleep(0.01)
        third, held_third = cache.hold_model(*models[2])  # 1.8 MiB: the first must go
        assert not os.path.exists(first)
        assert os.path.isdir(second) and os.path.isdir(third)
        os.close(held_third)
        # The second is still held: a new copy of the first evicts the third instead.
        again, held_again = cache.hold_model(*models[0])
        assert again == first and os.path.isdir(second) and not os.path.exists(third)
        os.close(held_again)
        os.close(held_second)
    finally:
        storage.delete(base)


# ----------------------------------------------------------------------------- events


def _record(payload: bytes) -> bytes:
    return struct.pack("<Q", len(payload)) + b"\0" * 4 + payload + b"\0" * 4


def test_complete_records_and_segment_names():
    whole = _record(b"a" * 5) + _record(b"") + _record(b"b" * 300)
    assert artifacts.complete_records(whole) == len(whole)
    for cut in (1, 11, 12, 20, len(_record(b"c" * 40)) - 1):
        assert artifacts.complete_records(whole + _record(b"c" * 40)[:cut]) == len(whole)
    assert artifacts.complete_records(b"") == 0
    local = "events.out.tfevents.1764730000.host.123.0.v2"
    names = [artifacts.segment_name(local, i) for i in (1, 2, 10, 100)]
    assert names == sorted(names) and all(n > local and "tfevents" in n for n in names)
    later = artifacts.segment_name("events.out.tfevents.1764730100.host.99.0.v2", 1)
    assert later > names[-1]


def _segments(directory: str) -> dict[str, tuple[int, float]]:
    return {
        name: (storage.size(storage.join(directory, name)), modified)
        for name, (_, modified) in storage.namespace.entries(directory).items()
    }


def _read_events(directory: str) -> list:
    """The events of every event file of ``directory``, the files read in name order (as
    TensorBoard reads a run's directory)."""
    import tensorflow as tf

    events = []
    with storage.local_copy(directory) as local:
        for name in sorted(os.listdir(local)):
            events += list(tf.compat.v1.train.summary_iterator(os.path.join(local, name)))
    return events


@pytest.mark.integration
def test_events_on_hdfs_go_out_in_segments_never_rewritten(hdfs):
    from sparktf.train.process.summaries import EventWriter

    uri = storage.join(hdfs.fresh("segments"), "model")
    md = artifacts.ModelDir(uri, writer=True, sync_every_s=0.0)
    remote = storage.join(uri, *artifacts.EVENTS.split("/"))
    try:
        events = EventWriter(md, enabled=True)
        seen: dict[str, tuple[int, float]] = {}
        for step in range(1, 10):
            events.scalars(step, {"loss": 1.0 / step})  # each one a sync: a new segment
            if step == 4:
                seen = _segments(remote)
        events.histograms(9, ["w"], [np.arange(10.0)])
        events.close()
        md.finish({"final_step": 9})
    finally:
        md.close()
    segments = _segments(remote)
    assert len(segments) >= 5 and all("tfevents" in n for n in segments), segments
    assert not [n for n in segments if n.startswith(".")]
    # Published once, never rewritten: the early segments are as they were.
    assert seen and {n: segments[n] for n in seen} == seen
    read = _read_events(remote)
    assert read[0].file_version.startswith("brain.Event")
    steps = [e.step for e in read for v in e.summary.value if v.tag == "loss"]
    assert steps == list(range(1, 10))  # in step order, each once
    assert [e.step for e in read for v in e.summary.value if v.tag == "weights/w"] == [9]
    wall = [e.wall_time for e in read]
    assert wall == sorted(wall)


def _webhdfs_put(hdfs, path: str, **params) -> None:
    query = urllib.parse.urlencode({**params, "user.name": storage.hdfs_user()})
    url = f"{hdfs.webhdfs_url}/webhdfs/v1{storage.parse(path).path}?{query}"
    with urllib.request.urlopen(urllib.request.Request(url, method="PUT"), timeout=30):
        pass


def _names_in(hdfs, path: str) -> int:
    query = urllib.parse.urlencode({"op": "GETCONTENTSUMMARY", "user.name": storage.hdfs_user()})
    url = f"{hdfs.webhdfs_url}/webhdfs/v1{storage.parse(path).path}?{query}"
    import json

    with urllib.request.urlopen(url, timeout=30) as answer:
        summary = json.load(answer)["ContentSummary"]
    return summary["directoryCount"] + summary["fileCount"]


@pytest.mark.integration
def test_a_checkpoint_upload_cut_short_leaves_the_previous_checkpoint_latest(hdfs):
    """HDFS refuses a write halfway through uploading a checkpoint (a namespace quota that
    lets the data file in but not the index): the state still names the previous checkpoint,
    the new one has no index, a rerun restores the previous one and cleans the remains."""
    import tensorflow as tf

    uri = storage.join(hdfs.fresh("upload-cut"), "model")
    ckpt_dir = storage.join(uri, artifacts.CHECKPOINTS)

    def writer():
        value = tf.Variable(0.0)
        md = artifacts.ModelDir(uri, writer=True)
        md.attach(tf.train.Checkpoint(value=value), keep=3)
        return md, value

    md, value = writer()
    try:
        value.assign(1.0)
        md.save(1)
        # Room for one more name: the first file of the next checkpoint, nothing after it.
        _webhdfs_put(hdfs, ckpt_dir, op="SETQUOTA", namespacequota=_names_in(hdfs, ckpt_dir) + 1)
        try:
            value.assign(2.0)
            with pytest.raises(storage.StorageError, match="quota"):
                md.save(2)
        finally:
            _webhdfs_put(hdfs, ckpt_dir, op="SETQUOTA", namespacequota=-1)
    finally:
        md.close()
    names = sorted(posixpath.basename(storage.parse(p).path) for p in storage.listdir(ckpt_dir))
    assert [n for n in names if n.startswith("ckpt-2.")] == ["ckpt-2.data-00000-of-00001"]
    assert artifacts.latest_checkpoint_step(uri) == 1

    md, value = writer()  # a rerun: restores the previous checkpoint
    try:
        assert value.numpy() == 1.0
        value.assign(3.0)
        md.save(3)
    finally:
        md.close()
    names = sorted(posixpath.basename(storage.parse(p).path) for p in storage.listdir(ckpt_dir))
    assert not [n for n in names if n.startswith(("ckpt-2.", "."))], names
    assert artifacts.latest_checkpoint_step(uri) == 3


# ----------------------------------------------------------------------------- runs


def _scratch_dirs() -> set[str]:
    found = set()
    for base in scratch.scratch_bases():
        try:
            names = os.listdir(base)
        except OSError:
            continue
        found |= {os.path.join(base, n) for n in names if n.startswith(scratch.PREFIXES)}
    return found


def _fit(spark, data, model_dir, *, steps, failure=None):
    from sparktf.train import RunConfig, ScalingConfig, TrainConfig, fit

    return fit(
        TrainConfig(
            model="mnist_mlp",
            data=str(data),
            input_mode="spark",
            steps=steps,
            batch_size=8,
            model_config={"hidden_units": 8},
        ),
        ScalingConfig(strategy="allreduce", num_workers=2, threads_per_worker=1),
        RunConfig(
            model_dir=str(model_dir),
            checkpoint={"every_steps": 5},
            failure={"failure_timeout_s": 60.0, "feed_timeout_s": 60.0, **(failure or {})},
        ),
        spark=spark,
    )


def _kill_worker_and_feeder(model_dir: Path, before: set[str]) -> set[str]:
    """Once the run has a checkpoint: SIGKILLs its non-chief worker and the Spark-side
    process of its chief (which feeds it and would remove its feed directory). Returns the
    scratch directories that appeared since ``before``."""
    deadline = time.monotonic() + 240
    while artifacts.latest_checkpoint_step(str(model_dir)) < 5:
        assert time.monotonic() < deadline, "no checkpoint"
        time.sleep(0.2)
    nodes = sorted(descendants("sparktf.train.process.main"))
    roles = {p: Path(f"/proc/{p}/comm").read_text().strip() for p in nodes}
    during = _scratch_dirs() - before
    assert any("sparktf-modeldir-" in p for p in during), during
    assert any("sparktf-feed-" in p for p in during), during
    worker = next(p for p, r in roles.items() if "worker" in r)
    chief = next(p for p, r in roles.items() if "chief" in r)
    feeder = int(Path(f"/proc/{chief}/stat").read_text().rsplit(")", 1)[1].split()[1])
    os.kill(worker, signal.SIGKILL)
    os.kill(feeder, signal.SIGKILL)
    return during


@pytest.mark.e2e
def test_a_killed_worker_and_feeder_leave_no_directory_after_the_next_run(
    spark, mnist_data, tmp_path
):
    """A run whose non-chief worker is SIGKILLed and whose chief's Spark-side process (the
    one that feeds it and would remove its feed directory) is SIGKILLed too fails; after the
    next run no scratch or feed directory of the first run is left on the machine."""
    import threading

    before = _scratch_dirs()
    box: dict = {}

    def first_run():
        try:
            box["result"] = _fit(
                spark,
                mnist_data / "data",
                tmp_path / "first",
                steps=100000,
                failure={"max_restarts": 0},
            )
        except BaseException as exc:
            box["error"] = exc

    thread = threading.Thread(target=first_run, daemon=True)
    thread.start()
    during = _kill_worker_and_feeder(tmp_path / "first", before)
    thread.join(300)
    assert not thread.is_alive() and "error" in box, box
    print(f"left by the first run before the next one: {sorted(during & _scratch_dirs())}")

    result = _fit(spark, mnist_data / "data", tmp_path / "second", steps=4)
    assert result.final_step == 4
    assert_nothing_left()
    assert sorted(during & _scratch_dirs()) == []


# ----------------------------------------------------------------------------- SIGTERM

_FIXTURE_HELD = """
import os, time
from pathlib import Path

import pytest

MARKS = Path(os.environ["MARKS"])


@pytest.fixture(scope="session")
def cluster():
    (MARKS / f"up-{os.getpid()}").write_text("")
    yield
    time.sleep(1)  # a cluster's stop
    (MARKS / f"down-{os.getpid()}").write_text("")


def test_one(cluster):
    time.sleep(120)


def test_two(cluster):
    time.sleep(120)
"""


def test_sigterm_to_the_controller_tears_down_every_workers_fixtures(tmp_path):
    """``kill PID`` of a pytest run with two test processes (as CI stops an over-time run):
    each worker's session fixture (a cluster in the suite) ends its teardown, and the run
    exits with pytest's code for an interrupted session."""
    (tmp_path / "test_held.py").write_text(_FIXTURE_HELD)
    marks = tmp_path / "marks"
    marks.mkdir()
    run = subprocess.Popen(
        [sys.executable, "-m", "pytest", "-q", "-p", "tests.terminate", "-n", "2",
         "--dist", "each", "-p", "no:cacheprovider", str(tmp_path / "test_held.py")],
        cwd=tmp_path,
        env=dict(os.environ, MARKS=str(marks), PYTHONPATH=str(ROOT)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while len(list(marks.glob("up-*"))) < 2:
            assert run.poll() is None and time.monotonic() < deadline, run.stdout.read()
            time.sleep(0.1)
        run.send_signal(signal.SIGTERM)
        output = run.communicate(timeout=90)[0].decode()
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    ups = sorted(p.name[3:] for p in marks.glob("up-*"))
    assert sorted(p.name[5:] for p in marks.glob("down-*")) == ups, output
    assert run.returncode == 2, output  # pytest.ExitCode.INTERRUPTED
