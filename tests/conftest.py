"""Session-wide fixtures: one real HDFS and one local-cluster Spark session for the suite.

HDFS: when ``scripts/test.sh`` has started one it exports SPARKTF_TEST_HDFS_URI,
SPARKTF_WEBHDFS_URL and HADOOP_CONF_DIR, and the fixture uses it; otherwise the fixture
starts its own with ``scripts/hdfs.sh`` on free ports and stops it at the end, also when
tests fail.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
HDFS_SH = ROOT / "scripts" / "hdfs.sh"


def _terminate(signum, frame):  # SIGTERM (e.g. from `timeout`) runs the fixtures' teardown
    raise KeyboardInterrupt(f"signal {signum}")


signal.signal(signal.SIGTERM, _terminate)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def descendants(pattern: str) -> set[int]:
    """Pids of live processes started (directly or not) by this test process whose command
    line contains ``pattern``: what a test started and must have stopped."""
    import psutil

    found = set()
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and pattern in " ".join(proc.cmdline()):
                found.add(proc.pid)
        except psutil.Error:
            continue
    return found


class Hdfs:
    def __init__(self, uri: str, webhdfs_url: str):
        self.uri = uri
        self.webhdfs_url = webhdfs_url

    def path(self, *parts: str) -> str:
        return self.uri + "/" + "/".join(p.strip("/") for p in parts)

    def fresh(self, name: str = "t") -> str:
        """A new, unused directory URI for one test."""
        return self.path("tests", f"{name}-{uuid.uuid4().hex[:8]}")


def start_hdfs(base: Path) -> tuple[Hdfs, list[str]]:
    args = [
        "--port",
        str(free_port()),
        "--http-port",
        str(free_port()),
        "--dir",
        str(base / "hdfs"),
        "--conf-dir",
        str(base / "hadoop-conf"),
    ]
    out = subprocess.run(
        [str(HDFS_SH), "start", *args], capture_output=True, text=True, timeout=240
    )
    if out.returncode != 0:
        subprocess.run([str(HDFS_SH), "stop", *args], capture_output=True)
        raise RuntimeError(f"scripts/hdfs.sh start failed:\n{out.stdout}\n{out.stderr}")
    values = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
    return Hdfs(values["HDFS_URI"], values["WEBHDFS_URL"]), args


@pytest.fixture(scope="session")
def hdfs(tmp_path_factory) -> Hdfs:
    uri = os.environ.get("SPARKTF_TEST_HDFS_URI")
    if uri:
        yield Hdfs(uri, os.environ["SPARKTF_WEBHDFS_URL"])
        return
    base = tmp_path_factory.mktemp("hdfs")
    server, args = start_hdfs(base)
    saved = {k: os.environ.get(k) for k in ("SPARKTF_WEBHDFS_URL", "HADOOP_CONF_DIR")}
    os.environ["SPARKTF_WEBHDFS_URL"] = server.webhdfs_url
    os.environ["HADOOP_CONF_DIR"] = str(base / "hadoop-conf")
    try:
        yield server
    finally:
        subprocess.run([str(HDFS_SH), "stop", *args], capture_output=True, timeout=120)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def spark(hdfs):
    """A local-cluster[2,1,1024] session: two executor JVMs with their own Python workers."""
    from sparktf.spark import get_session

    os.environ["PYSPARK_PYTHON"] = sys.executable
    session = get_session(
        "sparktf-tests",
        profile="local",
        overrides={
            "spark.master": "local-cluster[2,1,1024]",
            "spark.executorEnv.SPARKTF_WEBHDFS_URL": hdfs.webhdfs_url,
            "spark.executorEnv.PYTHONPATH": str(ROOT),
        },
    )
    try:
        yield session
    finally:
        session.stop()
