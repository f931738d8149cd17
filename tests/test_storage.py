"""The storage layer on local disk and on the real HDFS started by scripts/hdfs.sh."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time

import pytest

from sparktf import storage
from sparktf.ports import free_port
from sparktf.storage import lock, publishing
from tests import helpers

pytestmark = pytest.mark.unit  # tests of another tier carry their own mark


@pytest.fixture(params=["local", pytest.param("hdfs", marks=pytest.mark.integration)])
def base(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "store")
    hdfs = request.getfixturevalue("hdfs")
    return hdfs.fresh("storage")


def test_binary_and_text_round_trip(base):
    storage.write_bytes(storage.join(base, "a/b.bin"), bytes(range(256)) * 3)
    storage.write_text(storage.join(base, "a/c.txt"), "héllo\nwörld\n")
    assert storage.read_bytes(storage.join(base, "a/b.bin")) == bytes(range(256)) * 3
    assert storage.read_text(storage.join(base, "a/c.txt")) == "héllo\nwörld\n"
    assert storage.listdir(storage.join(base, "a")) == [
        storage.join(base, "a/b.bin"),
        storage.join(base, "a/c.txt"),
    ]
    assert storage.size(storage.join(base, "a/b.bin")) == 768
    assert storage.isdir(storage.join(base, "a"))
    assert not storage.isdir(storage.join(base, "a/b.bin"))
    assert storage.walk_files(base) == storage.listdir(storage.join(base, "a"))


def test_multi_megabyte_file_streams_in_chunks(base):
    chunk = 1 << 20
    blocks = [os.urandom(chunk) for _ in range(9)]
    path = storage.join(base, "big.bin")
    with storage.open_file(path, "wb") as f:
        for block in blocks:
            f.write(block)
    digest = hashlib.sha256(b"".join(blocks)).hexdigest()
    h, reads = hashlib.sha256(), 0
    with storage.open_file(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
            reads += 1
    assert h.hexdigest() == digest
    assert reads == 9
    with storage.open_file(path, "rb") as f:  # seekable: random access reads a range
        f.seek(5 * chunk + 7)
        assert f.read(100) == blocks[5][7:107]
    assert storage.size(path) == 9 * chunk


def test_rename_delete_makedirs(base):
    src, dst = storage.join(base, "x/one.txt"), storage.join(base, "y/two.txt")
    storage.write_text(src, "1")
    storage.rename(src, dst)
    assert not storage.exists(src) and storage.read_text(dst) == "1"
    storage.write_text(src, "again")
    with pytest.raises(storage.PathExistsError):
        storage.rename(src, dst)
    storage.makedirs(storage.join(base, "z/deep/er"))
    assert storage.isdir(storage.join(base, "z/deep/er"))
    storage.delete(storage.join(base, "z"))
    assert not storage.exists(storage.join(base, "z"))
    with pytest.raises(storage.PathNotFoundError):
        storage.delete(storage.join(base, "z"), missing_ok=False)


def test_publish_is_atomic(base):
    target = storage.join(base, "dataset")
    with pytest.raises(RuntimeError, match="half way"):
        with storage.publish(target) as tmp:
            storage.write_text(storage.join(tmp, "part-0"), "rows")
            raise RuntimeError("failed half way")
    assert not storage.exists(target)
    assert not storage.exists(base) or storage.listdir(base) == []  # no temporary left

    with storage.publish(target) as tmp:
        storage.write_text(storage.join(tmp, "part-0"), "v1")
    assert storage.read_text(storage.join(target, "part-0")) == "v1"
    with pytest.raises(storage.PathExistsError):
        with storage.publish(target):
            pass
    with storage.publish(target, overwrite=True) as tmp:
        storage.write_text(storage.join(tmp, "part-0"), "v2")
    assert storage.read_text(storage.join(target, "part-0")) == "v2"
    assert storage.listdir(base) == [target]  # no temporary left beside it


def test_missing_path_errors_name_the_path(base):
    missing = storage.join(base, "no/such/file")
    with pytest.raises(storage.PathNotFoundError, match="no/such/file"):
        storage.read_bytes(missing)
    with pytest.raises(storage.PathNotFoundError, match="no/such/file"):
        storage.listdir(missing)
    with pytest.raises(FileNotFoundError):  # also a standard FileNotFoundError
        storage.size(missing)


@pytest.mark.integration
def test_copy_tree_between_file_systems(hdfs, tmp_path):
    src = tmp_path / "model"
    (src / "variables").mkdir(parents=True)
    (src / "saved_model.pb").write_bytes(b"pb" * 1000)
    (src / "variables" / "variables.index").write_bytes(b"idx")
    remote = hdfs.fresh("copy")
    storage.copy_tree(str(src), remote)
    with storage.local_copy(remote) as local:
        assert open(os.path.join(local, "saved_model.pb"), "rb").read() == b"pb" * 1000
        assert open(os.path.join(local, "variables", "variables.index"), "rb").read() == b"idx"


@pytest.mark.parametrize("uri", ["gs://b/k", "webhdfs://h/x", "hdfs:///no-host"])
def test_unknown_scheme_is_a_clear_error(uri):
    with pytest.raises(storage.UnknownSchemeError) as err:
        storage.exists(uri)
    assert uri in str(err.value) and "hdfs://host:port/path" in str(err.value)


def test_unreachable_namenode_fails_fast_and_names_the_address(monkeypatch):
    port = free_port()  # nothing listens on it
    monkeypatch.setenv("SPARKTF_WEBHDFS_URL", f"http://127.0.0.1:{port}")
    started = time.monotonic()
    with pytest.raises(storage.NameNodeUnreachableError) as err:
        storage.read_bytes(f"hdfs://127.0.0.1:{port}/data/x")
    assert time.monotonic() - started < 10
    assert f"127.0.0.1:{port}" in str(err.value)


def test_hung_namenode_times_out_within_seconds():
    # A loopback socket that accepts connections and never answers: the request timeout
    # (SPARKTF_HDFS_TIMEOUT) must bound the wait and the error must name the address.
    import socket

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(16)
        port = server.getsockname()[1]
        code = (
            "import time, sparktf.storage as s\n"
            "t = time.monotonic()\n"
            "try:\n    s.exists('hdfs://127.0.0.1:1/x')\n"
            "except s.NameNodeUnreachableError as e:\n"
            "    print('ERR', round(time.monotonic() - t, 1), e)\n"
        )
        env = dict(
            os.environ, SPARKTF_WEBHDFS_URL=f"http://127.0.0.1:{port}", SPARKTF_HDFS_TIMEOUT="2"
        )
        out = subprocess.run(
            [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env
        )
    assert out.stdout.startswith("ERR"), out.stdout + out.stderr
    assert float(out.stdout.split()[1]) < 10
    assert f"127.0.0.1:{port}" in out.stdout


def test_a_transfer_cut_short_is_resumed_or_fails_never_short(monkeypatch):
    """A DataNode whose connection closes before the declared Content-Length: the scan and
    the seekable reader ask again from the byte reached (same bytes in the end); when every
    answer is cut short the scan fails instead of handing over a short file."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
    from urllib.parse import parse_qs, urlparse

    data = bytes(range(256)) * 64
    cut = {"every": False, "first": True}

    class WebHdfsOpen(BaseHTTPRequestHandler):
        def do_GET(self):
            query = parse_qs(urlparse(self.path).query)
            if query["op"] == ["GETFILESTATUS"]:  # what the seekable reader asks first
                status = {"FileStatus": {"length": len(data), "type": "FILE"}}
                answer = json.dumps(status).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)
                return
            offset = int(query.get("offset", ["0"])[0])
            body = data[offset:]
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            short = cut["every"] or cut["first"]
            cut["first"] = False
            self.wfile.write(body[: len(body) // 2] if short else body)
            self.close_connection = True

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), WebHdfsOpen)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        port = server.server_address[1]
        monkeypatch.setenv("SPARKTF_WEBHDFS_URL", f"http://127.0.0.1:{port}")
        uri = f"hdfs://127.0.0.1:{port}/data/part-0"
        with storage.open_scan(uri) as scan:
            assert scan.read(len(data) + 1) + scan.read() == data  # resumed once, complete
        cut["first"] = True
        with storage.open_file(uri) as reader:
            assert reader.read() == data
            reader.seek(100)
            assert reader.read(10) == data[100:110]
        cut["every"] = True
        with pytest.raises(storage.StorageError) as err, storage.open_scan(uri) as scan:
            while scan.read(1 << 12):
                pass
        assert "/data/part-0" in str(err.value)
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.integration
def test_permission_denied_names_path_and_user(hdfs, monkeypatch):
    private = hdfs.fresh("private")
    storage.makedirs(private)
    storage.webhdfs_client(hdfs.webhdfs_url, storage.hdfs_user()).set_permission(
        storage.parse(private).path, "755"
    )
    monkeypatch.setenv("SPARKTF_HDFS_USER", "alice")
    with pytest.raises(storage.StoragePermissionError) as err:
        storage.write_text(storage.join(private, "x.txt"), "no")
    assert "alice" in str(err.value) and "private" in str(err.value)
    assert isinstance(err.value, PermissionError)


def test_webhdfs_address_from_hadoop_conf(tmp_path, monkeypatch):
    (tmp_path / "core-site.xml").write_text(
        "<configuration><property><name>fs.defaultFS</name>"
        "<value>hdfs://nn.example:8020</value></property></configuration>"
    )
    (tmp_path / "hdfs-site.xml").write_text(
        "<configuration><property><name>dfs.namenode.http-address</name>"
        "<value>nn.example:50070</value></property></configuration>"
    )
    monkeypatch.delenv("SPARKTF_WEBHDFS_URL", raising=False)
    monkeypatch.setenv("HADOOP_CONF_DIR", str(tmp_path))
    assert storage.webhdfs_url("nn.example:8020") == "http://nn.example:50070"
    assert storage.webhdfs_url("other:8020") == "http://other:9870"


# ----------------------------------------------------------------------------- safe publish


def _names(directory: str) -> list[str]:
    return [storage.parse(p).path.rsplit("/", 1)[-1] for p in storage.listdir(directory)]


def _publish_v(target: str, text: str, **kwargs) -> None:
    with storage.publish(target, **kwargs) as tmp:
        storage.write_text(storage.join(tmp, "part-0"), text)


def test_failed_swap_puts_the_old_version_back(tmp_path, monkeypatch):
    """The new version cannot be renamed in (a cleaner removed it between the two renames):
    the old one is renamed back under its name, with its content, and nothing is left."""
    parent = str(tmp_path / "out")
    target = storage.join(parent, "dataset")
    _publish_v(target, "v1")

    def cleaner(path, tmp, old):
        assert not os.path.exists(path) and os.path.isdir(old)
        storage.delete(tmp)

    monkeypatch.setattr(publishing, "swap_hook", cleaner)
    with pytest.raises(storage.PathNotFoundError, match="rename"):
        _publish_v(target, "v2", overwrite=True)
    assert storage.read_text(storage.join(target, "part-0")) == "v1"
    assert _names(parent) == ["dataset"]


@pytest.mark.integration
def test_failed_swap_on_hdfs_keeps_the_old_dataset_readable(hdfs, monkeypatch):
    """A real refusal by the NameNode: in a sticky directory, the superuser hands the new
    copy to another user between the two renames, so alice may no longer rename it in."""
    parent = hdfs.fresh("swap")
    admin = storage.webhdfs_client(hdfs.webhdfs_url, storage.hdfs_user())  # started HDFS: superuser
    storage.makedirs(parent)
    admin.set_permission(storage.parse(parent).path, "1777")
    target = storage.join(parent, "dataset")
    monkeypatch.setenv("SPARKTF_HDFS_USER", "alice")
    _publish_v(target, "v1")

    def hand_over(path, tmp, old):
        admin.set_owner(storage.parse(tmp).path, owner="bob")

    monkeypatch.setattr(publishing, "swap_hook", hand_over)
    with pytest.raises(storage.StoragePermissionError, match="alice"):
        _publish_v(target, "v2", overwrite=True)
    assert storage.read_text(storage.join(target, "part-0")) == "v1"  # readable, as before
    left = [n for n in _names(parent) if n != "dataset"]
    assert len(left) == 1 and left[0].startswith(".dataset.tmp-")  # bob's: alice cannot delete

    # The next publish to the same target (by a user allowed to) removes the leftover.
    monkeypatch.setattr(publishing, "swap_hook", None)
    monkeypatch.delenv("SPARKTF_HDFS_USER")
    _publish_v(target, "v3", overwrite=True)
    assert storage.read_text(storage.join(target, "part-0")) == "v3"
    assert _names(parent) == ["dataset"]


def test_crash_mid_swap_is_repaired_by_the_next_publish(base):
    """A publisher killed between its two renames leaves the target missing, the old version
    set aside and a lock of a dead process: the next publish restores the old version
    under its name, removes the leftovers and breaks the stale lock."""
    target = storage.join(base, "dataset")
    _publish_v(target, "v1")
    code = (
        "import os, signal, sys\n"
        "from sparktf import storage\n"
        "from sparktf.storage import publishing\n"
        "publishing.swap_hook = lambda path, tmp, old: os.kill(os.getpid(), signal.SIGKILL)\n"
        "with storage.publish(sys.argv[1], overwrite=True) as tmp:\n"
        "    storage.write_text(storage.join(tmp, 'part-0'), 'v2')\n"
    )
    crashed = subprocess.run(
        [sys.executable, "-c", code, target], capture_output=True, text=True, timeout=120
    )
    assert crashed.returncode == -9, crashed.stderr
    left = _names(base)
    assert "dataset" not in left
    assert sorted(n.split("-")[0] for n in left) == [
        ".dataset.old",
        ".dataset.publish",
        ".dataset.tmp",
    ], left

    with pytest.raises(storage.PathExistsError):  # the old version is back: not replaced
        _publish_v(target, "v3")
    assert storage.read_text(storage.join(target, "part-0")) == "v1"
    assert _names(base) == ["dataset"]
    _publish_v(target, "v3", overwrite=True)
    assert storage.read_text(storage.join(target, "part-0")) == "v3"
    assert _names(base) == ["dataset"]


def test_concurrent_publish_is_refused_not_nested(base):
    import threading

    target = storage.join(base, "dataset")
    inside, release, errors = threading.Event(), threading.Event(), []

    def first():
        try:
            with storage.publish(target) as tmp:
                storage.write_text(storage.join(tmp, "part-0"), "first")
                inside.set()
                assert release.wait(60)
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            inside.set()

    thread = threading.Thread(target=first)
    thread.start()
    try:
        assert inside.wait(60) and not errors
        with pytest.raises(storage.PublishConflictError) as err:
            _publish_v(target, "second", overwrite=True)
        assert "another publish to this path is in progress" in str(err.value)
        assert target in str(err.value) and f"process {os.getpid()}" in str(err.value)
    finally:
        release.set()
        thread.join(60)
    assert not errors, errors
    assert storage.read_text(storage.join(target, "part-0")) == "first"
    assert _names(target) == ["part-0"]  # nothing nested inside
    assert _names(base) == ["dataset"]  # lock released, no temporary


def test_old_leftovers_are_cleaned_but_not_a_publish_in_progress(base, monkeypatch):
    import threading

    # Leftovers of a publish of "gone" that died long ago (a temporary and its lock).
    storage.write_text(storage.join(base, ".gone.tmp-0123456789ab", "part-0"), "partial")
    storage.write_text(storage.join(base, ".gone.publish-lock"), "")
    monkeypatch.setattr(publishing, "LEFTOVER_AGE_S", 0.0)  # "long ago": any age
    monkeypatch.setattr(lock, "LOCK_STALE_S", 0.5)
    time.sleep(1.0)

    busy = storage.join(base, "busy")
    inside, release, errors = threading.Event(), threading.Event(), []
    monkeypatch.setattr(lock, "LOCK_HEARTBEAT_S", 0.2)  # keeps busy's lock fresh

    def in_progress():
        try:
            with storage.publish(busy) as tmp:
                storage.write_text(storage.join(tmp, "part-0"), "busy")
                inside.set()
                assert release.wait(60)
        except BaseException as exc:
            errors.append(exc)
            inside.set()

    thread = threading.Thread(target=in_progress)
    thread.start()
    try:
        assert inside.wait(60) and not errors
        time.sleep(1.0)  # busy's temporary is older than the age limit, its lock is not stale
        _publish_v(storage.join(base, "other"), "other")
        left = _names(base)
        assert not [n for n in left if n.startswith(".gone")], left
        assert [n for n in left if n.startswith(".busy.tmp-")], left  # in progress: kept
    finally:
        release.set()
        thread.join(60)
    assert not errors, errors
    assert storage.read_text(storage.join(busy, "part-0")) == "busy"
    assert _names(base) == ["busy", "other"]


def test_block_scans_and_range_reads_give_the_file_bytes(base):
    data = os.urandom((5 << 20) + 12345)  # not a multiple of any block size
    path = storage.join(base, "scan/blob.bin")
    storage.write_bytes(path, data)
    blocks = list(storage.iter_blocks(path, 1 << 20, first=4096))
    assert b"".join(blocks) == data
    assert len(blocks[0]) == 4096 and max(len(b) for b in blocks) <= 1 << 20
    assert b"".join(storage.iter_blocks(path)) == data  # default blocks
    assert storage.read_range(path, 3 << 20, 1000) == data[3 << 20 : (3 << 20) + 1000]
    assert storage.read_range(path, len(data) - 10, 1000) == data[-10:]  # cut at the end
    assert storage.read_range(path, 0, len(data)) == data
    missing = storage.join(base, "scan/none.bin")
    with pytest.raises(storage.PathNotFoundError, match="none.bin"):
        list(storage.iter_blocks(missing))
    with pytest.raises(storage.PathNotFoundError, match="none.bin"):
        storage.read_range(missing, 0, 10)
    with pytest.raises(IsADirectoryError):
        list(storage.iter_blocks(storage.join(base, "scan")))


def test_fsspec_file_system_reads_whole_files_and_ranges(base):
    data = os.urandom((9 << 20) + 7)  # more than two of its 4 MiB read-ahead blocks
    path = storage.join(base, "fsspec/blob.bin")
    storage.write_bytes(path, data)
    fs = storage.fsspec_filesystem(path)
    with fs.open(storage.parse(path).path, "rb") as f:
        assert f.read() == data
        f.seek(5 << 20)
        assert f.read(100) == data[5 << 20 : (5 << 20) + 100]


@pytest.mark.integration
def test_hdfs_client_selection(hdfs, monkeypatch, caplog):
    path = hdfs.fresh("client") + "/blob.bin"
    data = os.urandom(3 << 20)
    storage.write_bytes(path, data)
    monkeypatch.setenv("SPARKTF_HDFS_CLIENT", "ftp")
    with pytest.raises(storage.StorageError, match="SPARKTF_HDFS_CLIENT"):
        storage.read_range(path, 0, 1)
    # native: hdfs-native when installed, else WebHDFS with a warning; the bytes are the same
    monkeypatch.setenv("SPARKTF_HDFS_CLIENT", "native")
    storage.native_client.cache_clear()
    with caplog.at_level("WARNING", logger="sparktf.storage"):
        assert b"".join(storage.iter_blocks(path, 1 << 20)) == data
        assert storage.read_range(path, 100, 1 << 20) == data[100 : 100 + (1 << 20)]
    try:
        import hdfs_native  # noqa: F401
    except ImportError:
        assert "hdfs-native is not installed: using WebHDFS" in caplog.text
    else:
        assert storage.native_client(storage.parse(path).netloc, storage.hdfs_user())
    with pytest.raises(storage.PathNotFoundError, match="nothing.bin"):
        storage.read_range(hdfs.fresh("client") + "/nothing.bin", 0, 1)
    storage.native_client.cache_clear()


@pytest.mark.integration
def test_native_client_falls_back_at_once_when_the_rpc_port_is_closed(hdfs, monkeypatch, caplog):
    pytest.importorskip("hdfs_native")
    path = hdfs.fresh("client") + "/blob.bin"
    storage.write_bytes(path, b"x" * 1000)
    port = free_port()  # nothing listens on it
    # The same file through a NameNode address whose RPC port is closed: WebHDFS serves it
    # (SPARKTF_WEBHDFS_URL) instead of hdfs-native retrying for minutes.
    closed = f"hdfs://127.0.0.1:{port}" + storage.parse(path).path
    monkeypatch.setenv("SPARKTF_HDFS_CLIENT", "native")
    storage.native_client.cache_clear()
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="sparktf.storage"):
        assert storage.read_range(closed, 0, 1000) == b"x" * 1000
    assert time.monotonic() - started < 10
    assert "does not accept connections" in caplog.text
    storage.native_client.cache_clear()


@pytest.mark.e2e
def test_hdfs_with_two_datanodes_spreads_files_and_stops_cleanly(tmp_path, monkeypatch):
    import json
    import urllib.request

    import psutil

    from tests.conftest import HDFS_SH

    bad = helpers.run_command(
        [HDFS_SH, "start", "--datanodes", "0"], capture_output=True, text=True
    )
    assert bad.returncode == 2 and "--datanodes" in bad.stderr
    args = ["--port", str(free_port()), "--http-port", str(free_port())]
    args += ["--dir", str(tmp_path / "two"), "--conf-dir", str(tmp_path / "conf")]
    pid = None
    try:
        out = helpers.run_command(
            [HDFS_SH, "start", *args, "--datanodes", "2"],
            capture_output=True,
            text=True,
            timeout=240,
            check=True,
        )
        values = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
        pid = int((tmp_path / "two" / "hdfs.pid").read_text())
        jmx = "/jmx?qry=Hadoop:service=NameNode,name=FSNamesystemState"
        with urllib.request.urlopen(values["WEBHDFS_URL"] + jmx, timeout=10) as response:
            assert json.load(response)["beans"][0]["NumLiveDataNodes"] == 2
        monkeypatch.setenv("SPARKTF_WEBHDFS_URL", values["WEBHDFS_URL"])
        data = {f"part-{i}": os.urandom(65_536 + i) for i in range(16)}
        for name, blob in data.items():
            storage.write_bytes(f"{values['HDFS_URI']}/spread/{name}", blob)
        for name, blob in data.items():
            assert storage.read_range(f"{values['HDFS_URI']}/spread/{name}", 0, 10**6) == blob
        # One replica per block: the NameNode spreads the files over both DataNodes.
        info = values["WEBHDFS_URL"] + "/jmx?qry=Hadoop:service=NameNode,name=NameNodeInfo"
        deadline = time.monotonic() + 20  # the DataNodes report new blocks within seconds
        while True:
            with urllib.request.urlopen(info, timeout=10) as response:
                nodes = json.loads(json.load(response)["beans"][0]["LiveNodes"])
            counts = sorted(n["numBlocks"] for n in nodes.values())
            if len(counts) == 2 and min(counts) > 0 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert len(counts) == 2 and min(counts) > 0 and sum(counts) >= len(data), counts
        listening = {addr.ip for addr in helpers.listening(pid)}
        assert listening == {"127.0.0.1"}  # NameNode and both DataNodes: loopback only
    finally:
        helpers.run_command([HDFS_SH, "stop", *args], timeout=120)
    assert pid is not None and not psutil.pid_exists(pid)
