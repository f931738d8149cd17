"""Session-wide fixtures: one real HDFS and one local-cluster Spark session for the suite;
the tiers (``--tier unit|integration|e2e|all``, tests/tiers.py), found from what each test
uses and checked against what it starts.

HDFS: when ``scripts/test.sh`` has started one it exports SPARKTF_TEST_HDFS_URI,
SPARKTF_WEBHDFS_URL and HADOOP_CONF_DIR, and the fixture uses it; otherwise the fixture
starts its own with ``scripts/hdfs.sh`` on free ports and stops it at the end, also when
tests fail.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from sparktf.ports import free_port
from tests import tiers

ROOT = Path(__file__).resolve().parent.parent
HDFS_SH = ROOT / "scripts" / "hdfs.sh"


def _terminate(signum, frame):  # SIGTERM (e.g. from `timeout`) runs the fixtures' teardown
    raise KeyboardInterrupt(f"signal {signum}")


signal.signal(signal.SIGTERM, _terminate)

_SPAWNS = tiers.SpawnWatch()
_TIER = pytest.StashKey[tuple]()
_STARTED = pytest.StashKey[dict]()
_COUNTS = pytest.StashKey[dict]()


def pytest_addoption(parser):
    parser.addoption(
        "--tier",
        choices=(*tiers.TIERS, "all"),
        default="all",
        help="run only the tests of one tier (tests/tiers.py): unit (no JVM, no job "
        "subprocess), integration (the session's Spark and HDFS), e2e (separate "
        "applications and clusters); default all",
    )


@pytest.hookimpl(tryfirst=True)  # before -m selects on the tier markers set here
def pytest_collection_modifyitems(config, items):
    """Marks every test with its tier (unit, integration or e2e) and keeps those of --tier."""
    chosen = config.getoption("tier")
    keep, drop = [], []
    counts = dict.fromkeys(tiers.TIERS, 0)
    for item in items:
        tier, why = tiers.item_tier(item)
        item.stash[_TIER] = (tier, why)
        item.add_marker(getattr(pytest.mark, tier))
        counts[tier] += 1
        (keep if chosen in ("all", tier) else drop).append(item)
    config.stash[_COUNTS] = counts
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_report_collectionfinish(config, items):
    counts = config.stash.get(_COUNTS, {})
    chosen = config.getoption("tier")
    return f"tier {chosen}; collected: " + ", ".join(f"{n} {t}" for t, n in counts.items())


def _watched(phase):
    @pytest.hookimpl(hookwrapper=True)
    def hook(item, *args):
        with _SPAWNS.watching() as started:
            yield
        item.stash.setdefault(_STARTED, {})[phase] = list(started)

    return hook


pytest_runtest_setup = _watched("setup")
pytest_runtest_call = _watched("call")
pytest_runtest_teardown = _watched("teardown")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that started a process its tier does not allow fails, naming the process."""
    outcome = yield
    report = outcome.get_result()
    tier, why = item.stash.get(_TIER, ("e2e", ""))
    started = item.stash.get(_STARTED, {}).get(call.when, ())
    used = getattr(getattr(item, "_request", None), "_fixture_defs", {})  # by name too
    found = tiers.violations(tier, started, used)
    if found and report.outcome != "failed":
        report.outcome = "failed"
        report.longrepr = tiers.explain(item, tier, why, found)


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


@tiers.needs("e2e")
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
    with _SPAWNS.exempt():
        server, args = start_hdfs(base)
    saved = {k: os.environ.get(k) for k in ("SPARKTF_WEBHDFS_URL", "HADOOP_CONF_DIR")}
    os.environ["SPARKTF_WEBHDFS_URL"] = server.webhdfs_url
    os.environ["HADOOP_CONF_DIR"] = str(base / "hadoop-conf")
    try:
        yield server
    finally:
        with _SPAWNS.exempt():
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
    with _SPAWNS.exempt():
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


@pytest.fixture(scope="session")
def mnist_data(spark, tmp_path_factory) -> Path:
    """The suite's tiny MNIST-format dataset, converted once: BASE/data (100 train and 10 test
    rows, TFRecord and Parquet, 2 shards) and BASE/uneven (the train Parquet in 3 parts of
    different sizes). Shared: a test that changes it works on a copy."""
    from sparktf.datasets.conversion import convert
    from sparktf.datasets.synthetic import write_mnist

    base = tmp_path_factory.mktemp("mnist")
    write_mnist(base / "raw", n_train=100, n_test=10)
    convert("mnist", str(base / "raw"), str(base / "data"), shards=2, spark=spark)
    parquet = base / "data" / "train" / "parquet"
    spark.read.parquet(f"file://{parquet}").repartition(3).write.mode("overwrite").parquet(
        f"file://{base / 'uneven'}"
    )
    return base


@pytest.fixture(scope="session")
def mnist_hdfs(mnist_data, hdfs) -> str:
    """``mnist_data``'s dataset copied to the session HDFS."""
    from sparktf import storage

    uri = hdfs.fresh("mnist")
    storage.copy_tree(str(mnist_data / "data"), uri)
    return uri
