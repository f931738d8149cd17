"""Private local files (issue 10, item 2): the spark input mode's feed directories and chunk
files, and the executors' model cache.

Real files, a real TensorFlowOnSpark TFManager (its own process) and control server for the
feed, a real HDFS and Spark local-cluster for the cached model. Modes are checked with the
process umask at 0, so they come from how the files are created, not from the umask.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
import tempfile
import time
import uuid
from queue import Empty

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np
import pyarrow as pa
import pytest

from sparktf import scratch
from sparktf.datasets.formats import Field
from sparktf.train.feed import chunks as feed

pytestmark = pytest.mark.unit  # tests of another tier carry their own mark

OTHER_UID = 54321  # a user that owns nothing here
LOOPBACK = "127.0.0.1"  # the control server's address, and so the feeding task's host


def mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


@contextlib.contextmanager
def umask(value: int):
    old = os.umask(value)
    try:
        yield
    finally:
        os.umask(old)


# ----------------------------------------------------------------------------- feed


@pytest.fixture
def tf_manager():
    """A TensorFlowOnSpark TFManager with its ``input`` queue, as an executor has."""
    from tensorflowonspark import TFManager

    authkey = uuid.uuid4().bytes
    mgr = TFManager.start(authkey, ["input"], "local")
    try:
        yield mgr, authkey
    finally:
        mgr.shutdown()
        feed.forget_managers()


@pytest.fixture
def one_node_feeder(tf_manager, control, tmp_path, monkeypatch):
    """A feeding task's function for a run whose one TensorFlow process is ``tf_manager``'s
    node (executor 0, this process's working directory): (manager, control, feeder)."""
    mgr, authkey = tf_manager
    monkeypatch.chdir(tmp_path)
    (tmp_path / "executor_id").write_text("0")
    feeder = feed.make_feeder(
        [{"addr": mgr.address, "authkey": authkey, "key": "executor-0", "host": LOOPBACK}],
        control.token,
        control.url,
        feed_timeout_s=5,
    )
    return mgr, control, feeder


@pytest.fixture
def control():
    from sparktf.train.wire.control import ControlServer

    server = ControlServer("127.0.0.1")
    try:
        yield server
    finally:
        server.close()


def test_feed_dir_and_chunks_written_by_the_feeder_are_private(
    tf_manager, control, tmp_path, monkeypatch
):
    """The TF process's FeedReader creates the node's directory, a feeding task (the real
    mapInArrow function) writes chunks into it: 0700 and 0600 even with umask 0; the name
    is not derivable from the run token and node key; the rows arrive; nothing is left."""
    from sparktf.train.wire.control import ControlClient

    mgr, authkey = tf_manager
    key = "executor-0"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "executor_id").write_text("0")  # what TensorFlowOnSpark leaves for a task
    client = ControlClient(control.url, control.issue_token(key), key)
    with umask(0):
        reader = feed.FeedReader(
            mgr_address=mgr.address,
            authkey=authkey,
            token=control.token,
            key=key,
            fields=[Field("id", "int64"), Field("label", "int64")],
            control=client,
            feed_timeout_s=30,
        ).open()
        try:
            directory = reader.dir
            assert mode(directory) == 0o700, oct(mode(directory))
            assert os.lstat(directory).st_uid == os.geteuid()
            name = os.path.basename(directory)
            predictable = f"sparktf-feed-{control.token[:8]}-{key}"
            assert name.startswith(predictable + "-") and len(name) > len(predictable) + 6
            assert feed.feed_dir_names(control.token, key) == [directory]

            rows = 600
            batch = pa.RecordBatch.from_pydict(
                {"id": np.arange(rows), "label": np.arange(rows) % 10}
            )
            feeder = feed.make_feeder(
                [{"addr": mgr.address, "authkey": authkey, "key": key, "host": LOOPBACK}],
                control.token,
                control.url,
                feed_timeout_s=30,
                chunk_bytes=16 * 200,  # 200 rows of two int64 columns: 3 chunks
            )
            (summary,) = list(feeder(iter([batch])))
            assert summary.to_pydict() == {
                "executor": [key],
                "chunks": [3],
                "rows": [rows],
                "skipped": [0],
            }
            chunks = sorted(set(os.listdir(directory)) - {scratch.OWNER_FILE})
            assert len(chunks) == 3 and all(c.endswith(".arrow") for c in chunks), chunks
            for chunk in chunks:
                path = os.path.join(directory, chunk)
                assert mode(path) == 0o600, (chunk, oct(mode(path)))
                assert os.lstat(path).st_uid == os.geteuid()

            control.set_feed_end({key: 3})
            client.post("beat")  # the reader learns the count from the driver's answer
            got = list(reader.chunk_stream())
            np.testing.assert_array_equal(np.concatenate([c["id"] for c in got]), np.arange(rows))
            # The reader deletes what it read (its owner file stays while it runs).
            assert os.listdir(directory) == [scratch.OWNER_FILE]
        finally:
            reader.close()
    assert not os.path.exists(directory)
    assert feed.feed_dir_names(control.token, key) == []


def test_feeder_refuses_a_feed_dir_that_is_not_private(one_node_feeder, tmp_path):
    """A feeding task writes rows only into a private directory of its own user, whatever
    the TFManager names."""
    mgr, control, feeder = one_node_feeder
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o755)
    mgr.set(feed.STATE_KEY, feed.RUNNING)
    mgr.set(feed.FEED_KEY, {"token": control.token, "dir": str(shared)})
    batch = pa.RecordBatch.from_pydict({"id": np.arange(10)})
    with pytest.raises(feed.FeedError, match=r"not a private directory.*drwxr-xr-x"):
        list(feeder(iter([batch])))
    assert os.listdir(shared) == []


def test_a_feeding_task_that_starts_as_its_reader_ends_writes_nothing_and_succeeds(
    one_node_feeder, tmp_path, monkeypatch
):
    """A reader that ends sets its state, then removes its directory. A feeding task that
    starts just then must end quietly, whatever moment it looks: found in the README test,
    where a late task failed the run on the missing directory (about 1 start in 20 here
    failed so before the fix). A directory missing while the reader runs stays an error."""
    import random
    import threading

    mgr, control, feeder = one_node_feeder
    monkeypatch.setenv("SPARKTF_FEED_DIR", str(tmp_path / "feeds"))
    batch = pa.RecordBatch.from_pydict({"id": np.arange(10)})
    rng = random.Random(0)
    queue = feed.input_queue(mgr)
    for _ in range(100):  # a late task failed 1 start in 20 before the fix
        while queue.qsize():  # what the last reader left unread: room for this task
            try:
                queue.get_nowait()
            except Empty:  # the last task's chunk was taken meanwhile
                break
        target = feed.node_local_dir(control.token, "executor-0")
        mgr.set(feed.STATE_KEY, feed.RUNNING)
        mgr.set(feed.FEED_KEY, {"token": control.token, "dir": target})
        delay = rng.uniform(0, 0.004)

        def reader_ends(target=target, delay=delay):
            time.sleep(delay)
            mgr.set(feed.STATE_KEY, feed.DONE)
            scratch.remove_dir(target)  # as FeedReader.close does

        ending = threading.Thread(target=reader_ends)
        ending.start()
        try:
            (summary,) = list(feeder(iter([batch])))
        finally:
            ending.join()
        written = summary.to_pydict()
        assert written["rows"][0] + written["skipped"][0] == 10

    gone = str(tmp_path / "removed-while-running")
    mgr.set(feed.STATE_KEY, feed.RUNNING)
    mgr.set(feed.FEED_KEY, {"token": control.token, "dir": gone})
    with pytest.raises(feed.FeedError, match=f"{gone} of executor-0 is not usable"):
        list(feeder(iter([batch])))


def test_feed_dirs_have_fresh_names_and_removal_finds_only_its_own(tmp_path, monkeypatch):
    """Two directories for the same run and node get different names; removal takes the
    node's own (not executor-12's for executor-1, not another user's)."""
    monkeypatch.setenv("SPARKTF_FEED_DIR", str(tmp_path))
    token = uuid.uuid4().hex
    with umask(0):
        first = feed.node_local_dir(token, "executor-1")
        second = feed.node_local_dir(token, "executor-1")
        other = feed.node_local_dir(token, "executor-12")
    assert first != second
    assert {mode(first), mode(second), mode(other)} == {0o700}
    foreign = tmp_path / f"sparktf-feed-{token[:8]}-executor-1-planted"
    foreign.mkdir()
    os.chown(foreign, OTHER_UID, OTHER_UID)
    assert feed.feed_dir_names(token, "executor-1") == sorted([first, second])
    feed.remove_feed_dirs(token, "executor-1")
    assert not os.path.exists(first) and not os.path.exists(second)
    assert os.path.isdir(other) and foreign.is_dir()
    feed.remove_feed_dirs(token, "executor-12")
    assert not os.path.exists(other)


def test_write_chunk_is_0600_and_a_vanished_directory_reads_as_reader_done(tmp_path):
    """A chunk is 0600 whatever the umask; once the reader removed its directory, writing
    raises FileNotFoundError (the feeder's signal to skip the rest) and leaves nothing."""
    directory = tmp_path / "feed"
    directory.mkdir(mode=0o700)
    batch = pa.RecordBatch.from_pydict({"id": np.arange(5)})
    with umask(0):
        path = feed.write_chunk(str(directory), batch)
    assert mode(path) == 0o600 and os.listdir(directory) == [os.path.basename(path)]
    with pa.memory_map(path) as source:
        assert pa.ipc.open_file(source).read_all().column("id").to_pylist() == list(range(5))
    shutil.rmtree(directory)
    with pytest.raises(FileNotFoundError):
        feed.write_chunk(str(directory), batch)
    assert not directory.exists()


# ----------------------------------------------------------------------------- model cache


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> str:
    path = tmp_path / "models"
    monkeypatch.setenv("SPARKTF_MODEL_CACHE_DIR", str(path))
    return str(path)


FAKE_HDFS_MODEL = "hdfs://127.0.0.1:9/never/contacted"  # the checks come before any copy


def test_default_cache_dir_is_per_user_and_created_0700(tmp_path, monkeypatch):
    from sparktf import inference
    from sparktf.inference import cache

    monkeypatch.delenv("SPARKTF_MODEL_CACHE_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    expected = str(tmp_path / f"sparktf-models-{os.geteuid()}")
    assert inference.model_cache_dir() == expected
    with umask(0):
        assert cache.private_cache_dir() == expected
    assert mode(expected) == 0o700


@pytest.mark.parametrize("problem", ["other owner", "world writable", "group writable", "symlink"])
def test_unsafe_cache_dir_is_refused(problem, tmp_path, monkeypatch):
    """A directory planted at the default cache path is never used."""
    from sparktf import inference
    from sparktf.inference import cache

    monkeypatch.delenv("SPARKTF_MODEL_CACHE_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    path = tmp_path / f"sparktf-models-{os.geteuid()}"
    if problem == "symlink":
        real = tmp_path / "elsewhere"
        real.mkdir(mode=0o700)
        path.symlink_to(real)
        expected = "is a symbolic link"
    else:
        path.mkdir()
        if problem == "other owner":
            path.chmod(0o700)
            os.chown(path, OTHER_UID, OTHER_UID)
            expected = f"is owned by uid {OTHER_UID}, not by this user"
        else:
            path.chmod(0o777 if problem == "world writable" else 0o770)
            expected = "is writable by other users"
    with pytest.raises(inference.ModelCacheError) as err:
        cache.local_model_dir(FAKE_HDFS_MODEL, "f" * 64)
    message = str(err.value)
    assert str(path) in message and expected in message and "SPARKTF_MODEL_CACHE_DIR" in message
    assert os.listdir(path) == []  # nothing written there (through the link: elsewhere)
    assert isinstance(err.value, PermissionError)


def test_lock_file_symlink_is_not_followed(cache_dir, tmp_path):
    from sparktf import inference
    from sparktf.inference import cache

    fingerprint = "a" * 64
    os.mkdir(cache_dir, 0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    lock = os.path.join(cache_dir, fingerprint[:32] + ".lock")
    os.symlink(victim, lock)
    dangling = os.path.join(cache_dir, "b" * 32 + ".lock")
    os.symlink(tmp_path / "created-through-link", dangling)
    with pytest.raises(inference.ModelCacheError, match="is a symbolic link: refusing to follow"):
        cache.local_model_dir(FAKE_HDFS_MODEL, fingerprint)
    with pytest.raises(inference.ModelCacheError, match=r"\.lock is a symbolic link"):
        cache.local_model_dir(FAKE_HDFS_MODEL, "b" * 64)
    assert victim.read_text() == "precious"
    assert not (tmp_path / "created-through-link").exists()


def export_mlp(path, seed: int) -> str:
    import keras

    from sparktf import models

    keras.utils.set_random_seed(seed)
    task = models.get_task("mnist_mlp", hidden_units=16)
    task.export(task.build_model(), str(path))
    return str(path)


def direct(model_dir: str, images: np.ndarray) -> dict[str, np.ndarray]:
    import tensorflow as tf

    out = tf.saved_model.load(model_dir).signatures["predict_images"](images=tf.constant(images))
    return {k: v.numpy() for k, v in out.items()}


@pytest.fixture(scope="module")
def models_on_hdfs(hdfs, tmp_path_factory):
    """The real model on HDFS, and a different one (same architecture) to plant."""
    from sparktf import inference, storage

    root = tmp_path_factory.mktemp("cache-models")
    real = export_mlp(root / "real", seed=1)
    planted = export_mlp(root / "planted", seed=2)
    base = hdfs.fresh("private-cache")
    uri = storage.join(base, "model", "export", "1")
    storage.copy_tree(real, uri)
    images = np.random.default_rng(0).integers(0, 256, (24, 28, 28, 1), dtype=np.uint8)
    info = inference.inspect_export(uri)
    try:
        yield {
            "uri": uri,
            "info": info,
            "real": real,
            "planted": planted,
            "images": images,
            "expected": direct(real, images),
        }
    finally:
        storage.delete(base)


@pytest.mark.integration
def test_tampered_cached_copy_is_replaced(models_on_hdfs, cache_dir):
    """A cached copy whose saved_model.pb, variables or file list differ from what the
    driver read is copied again; the fresh copy gives the real model's outputs."""
    from sparktf import inference
    from sparktf.inference import cache

    uri, fingerprint = models_on_hdfs["uri"], models_on_hdfs["info"].fingerprint
    assert fingerprint == inference.export_fingerprint(models_on_hdfs["real"])
    assert fingerprint != inference.export_fingerprint(models_on_hdfs["planted"])
    inference.ModelCache.stats.pop(fingerprint, None)
    target = os.path.join(cache_dir, fingerprint[:32])
    with umask(0):
        assert cache.local_model_dir(uri, fingerprint) == target
    assert mode(cache_dir) == 0o700
    assert mode(target + ".lock") == 0o600
    assert inference.ModelCache.stats[fingerprint]["copies"] == 1
    assert cache.local_model_dir(uri, fingerprint) == target  # verified: no new copy
    assert inference.ModelCache.stats[fingerprint]["copies"] == 1

    planted = models_on_hdfs["planted"]
    tampers = {
        "graph": lambda: shutil.copy(f"{planted}/saved_model.pb", f"{target}/saved_model.pb"),
        "variables": lambda: (
            shutil.rmtree(f"{target}/variables"),
            shutil.copytree(f"{planted}/variables", f"{target}/variables"),
        ),
        "extra file": lambda: open(f"{target}/assets.extra", "w").close(),
    }
    for n, (what, tamper) in enumerate(tampers.items(), start=2):
        tamper()
        assert cache.local_model_dir(uri, fingerprint) == target, what
        assert inference.ModelCache.stats[fingerprint]["copies"] == n, what
        assert inference.export_fingerprint(target) == fingerprint, what
    assert sorted(os.listdir(cache_dir)) == sorted([fingerprint[:32], fingerprint[:32] + ".lock"])

    loaded = cache.LoadedSignature(uri, fingerprint, "predict_images")
    out = loaded(images=models_on_hdfs["images"])
    np.testing.assert_array_equal(out["classes"], models_on_hdfs["expected"]["classes"])
    np.testing.assert_allclose(out["scores"], models_on_hdfs["expected"]["scores"], rtol=1e-6)


@pytest.mark.integration
def test_predict_ignores_a_model_planted_in_the_cache(spark, models_on_hdfs):
    """A different model planted at the cache path before any executor copied the real
    one: sparktf.predict copies the real model again and returns its outputs."""
    import sparktf
    from sparktf import inference
    from sparktf.inference import cache

    info = models_on_hdfs["info"]
    target = os.path.join(cache.private_cache_dir(), info.fingerprint[:32])
    shutil.rmtree(target, ignore_errors=True)
    shutil.copytree(models_on_hdfs["planted"], target)
    images = models_on_hdfs["images"]
    rows = [(i, images[i].tobytes()) for i in range(len(images))]
    df = spark.createDataFrame(rows, "id long, image binary").repartition(2)
    try:
        out = sorted(
            sparktf.predict(df, models_on_hdfs["uri"], batch_size=8).collect(),
            key=lambda r: r["id"],
        )
        np.testing.assert_array_equal(
            [r["prediction"] for r in out], models_on_hdfs["expected"]["classes"]
        )
        np.testing.assert_allclose(
            np.array([r["probability"] for r in out]),
            models_on_hdfs["expected"]["scores"],
            rtol=1e-5,
            atol=1e-6,
        )
        assert inference.export_fingerprint(target) == info.fingerprint
    finally:
        shutil.rmtree(target, ignore_errors=True)
        with contextlib.suppress(FileNotFoundError):
            os.remove(target + ".lock")


def test_a_feeding_task_writes_to_a_process_of_its_own_host():
    """Share j goes to process j when Spark placed its task on that process's host; tasks
    placed elsewhere are paired, host by host, with that host's processes whose own task
    is elsewhere (each process one share), and a host with more such tasks than processes
    fails naming it and the processes' hosts."""
    shares = [
        {"key": "executor-0", "host": "10.0.0.1"},
        {"key": "executor-1", "host": "10.0.0.2"},
        {"key": "executor-2", "host": "10.0.0.1"},
    ]
    placed = ["10.0.0.1", "10.0.0.2", "10.0.0.1"]
    assert [feed.share_node(shares, placed, j)["key"] for j in range(3)] == [
        "executor-0", "executor-1", "executor-2"
    ]  # fmt: skip
    swapped = ["10.0.0.2", "10.0.0.1", "10.0.0.1"]  # tasks 0 and 1 on each other's host
    assert [feed.share_node(shares, swapped, j)["key"] for j in range(3)] == [
        "executor-1", "executor-0", "executor-2"
    ]  # fmt: skip
    crowded = ["10.0.0.1", "10.0.0.1", "10.0.0.1"]  # host .1 runs 2 processes, not 3
    assert feed.share_node(shares, crowded, 0)["key"] == "executor-0"
    with pytest.raises(feed.FeedError, match=r"host 10\.0\.0\.1,.*10\.0\.0\.1, 10\.0\.0\.2"):
        feed.share_node(shares, crowded, 1)
