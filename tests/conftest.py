"""Shared fixtures: one real HDFS and one local-cluster Spark session for the suite, the
suite's tiny MNIST dataset, a clean sparktf environment; and the tiers (``--tier
unit|integration|e2e|all``): each test module declares its own (``pytestmark =
pytest.mark.unit``, see tests/tiers.py), checked here when the tests are collected and
against what each test starts while it runs.

HDFS: when ``scripts/test.sh`` has started one it exports SPARKTF_TEST_HDFS_URI,
SPARKTF_WEBHDFS_URL and HADOOP_CONF_DIR, and the fixture uses it; otherwise the fixture
starts its own with ``scripts/hdfs.sh`` on free ports and stops it at the end, also when
tests fail.

Several test processes may run at once (``scripts/test.sh`` runs two, pytest-xdist). Each
marks what it starts with ``SPARKTF_TEST_PROCESS`` and gives it a temporary directory
(``TMPDIR``) and a feed directory (``SPARKTF_FEED_DIR``, in ``/dev/shm`` like the default) of
its own, inherited by its Spark executors and their TensorFlow processes, so the checks that
nothing is left (``tests/helpers.py``) see this process's runs only (:func:`_own_places`).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path

import pytest

from sparktf.ports import free_port
from tests import durations, terminate, tiers
from tests.helpers import drop_py4j_connection

ROOT = Path(__file__).resolve().parent.parent
HDFS_SH = ROOT / "scripts" / "hdfs.sh"
S3_SH = ROOT / "scripts" / "s3.sh"


_SPAWNS = tiers.SpawnWatch()
_TIER = pytest.StashKey[str]()
_STARTED = pytest.StashKey[dict]()
_REQUEST = pytest.StashKey[pytest.FixtureRequest]()
_COUNTS = pytest.StashKey[dict]()


@pytest.fixture(scope="session", autouse=True)
def _own_places(tmp_path_factory):
    """This test process's mark, temporary and feed directories (see the module's
    docstring), set before anything starts and removed at the end; pytest's own
    ``tmp_path`` directories stay where they were."""
    tmp_path_factory.getbasetemp()
    saved = {k: os.environ.get(k) for k in ("SPARKTF_TEST_PROCESS", "TMPDIR", "SPARKTF_FEED_DIR")}
    shm = "/dev/shm" if os.access("/dev/shm", os.W_OK) else None
    places = [
        tempfile.mkdtemp(prefix="sparktf-test-tmp-"),
        tempfile.mkdtemp(prefix="sparktf-test-feeds-", dir=shm),
    ]
    os.environ.update(
        SPARKTF_TEST_PROCESS=uuid.uuid4().hex, TMPDIR=places[0], SPARKTF_FEED_DIR=places[1]
    )
    tempfile.tempdir = None  # read TMPDIR again
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        tempfile.tempdir = None
        for place in places:
            shutil.rmtree(place, ignore_errors=True)


def pytest_configure(config):
    if not config.pluginmanager.is_registered(terminate):  # SIGTERM's teardown
        config.pluginmanager.register(terminate, "tests.terminate")


def pytest_addoption(parser):
    parser.addoption(
        "--tier",
        choices=(*tiers.TIERS, "all"),
        default="all",
        help="run only the tests of one tier (declared by each test module, tests/tiers.py): "
        "unit (no JVM, no job subprocess), integration (the session's Spark and HDFS), e2e "
        "(separate applications and clusters); default all",
    )


@pytest.hookimpl(tryfirst=True)  # before -m selects on the tier markers
def pytest_collection_modifyitems(config, items):
    """Finds every test's declared tier (unit, integration or e2e), stops when one has none or
    an ambiguous one, and keeps the tests of --tier."""
    chosen = config.getoption("tier")
    keep, drop, problems = [], [], []
    counts = dict.fromkeys(tiers.TIERS, 0)
    for item in items:
        try:
            tier = tiers.declared(item)
            tiers.check_fixtures(item, tier)
        except tiers.TierError as error:
            problems.append(str(error))
            continue
        item.stash[_TIER] = tier
        counts[tier] += 1
        (keep if chosen in ("all", tier) else drop).append(item)
    if problems:
        raise pytest.UsageError(
            f"the tier of {len(problems)} test(s) is missing or wrong:\n  " + "\n  ".join(problems)
        )
    for item in items:
        tiers.keep_only(item, item.stash[_TIER])
    config.stash[_COUNTS] = counts
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep
    items.sort(key=_longest_first(items))


def _longest_first(items):
    """The order of the modules: the longest first, by the seconds each took in a measured
    whole-suite run (tests/durations.json, :mod:`tests.durations`), each module's tests in
    their own order. A module not measured
    yet is placed by what it runs: a minute per separate application (e2e test), ten seconds
    per integration test, a second per other test. With two test processes (pytest-xdist, a
    module each at a time) the long modules then start early and both processes end about
    together."""
    measured = durations.load()
    tiers_of: dict[str, list[str]] = {}
    for item in items:
        tiers_of.setdefault(item.module.__name__, []).append(item.stash[_TIER])
    weight = {}
    for name, found in tiers_of.items():
        guess = 60 * found.count("e2e") + 10 * found.count("integration") + found.count("unit")
        weight[name] = (-measured.get(name, guess), name)
    return lambda item: weight[item.module.__name__]


def pytest_report_collectionfinish(config, items):
    counts = config.stash.get(_COUNTS, None)
    if counts is None:  # the collection stopped on a tier
        return None
    chosen = config.getoption("tier")
    return f"tier {chosen}; collected: " + ", ".join(f"{n} {t}" for t, n in counts.items())


@pytest.fixture(autouse=True)
def _tier_fixtures(request):
    """Keeps the test's request, whose ``fixturenames`` also lists the fixtures it asks for
    by name (``request.getfixturevalue``), for the tier check of its report."""
    request.node.stash[_REQUEST] = request


def _watched(phase):
    @pytest.hookimpl(wrapper=True)
    def hook(item):
        with _SPAWNS.watching() as started:
            try:
                return (yield)
            except BaseException:
                drop_py4j_connection()
                raise
            finally:
                item.stash.setdefault(_STARTED, {})[phase] = list(started)

    return hook


pytest_runtest_setup = _watched("setup")
pytest_runtest_call = _watched("call")
pytest_runtest_teardown = _watched("teardown")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    """A test that started a process (or used a fixture) its tier does not allow fails,
    naming it."""
    report = yield
    tier = item.stash.get(_TIER, "e2e")
    started = item.stash.get(_STARTED, {}).get(call.when, ())
    fixtures = ()  # also those asked for by name: checked once, with the test's own code
    if call.when != "setup" and _REQUEST in item.stash:
        fixtures = item.stash[_REQUEST].fixturenames if call.when == "call" else ()
        del item.stash[_REQUEST]
    found = tiers.violations(tier, started, fixtures)
    if found and report.outcome != "failed":
        report.outcome = "failed"
        report.longrepr = tiers.explain(item, tier, found)
    return report


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


class S3Store:
    """The session's object store (scripts/s3.sh): what its ``start`` printed."""

    def __init__(self, values: dict[str, str]):
        self.env = {k: v for k, v in values.items() if k.startswith("AWS_")}
        self.uri = values["S3_URI"]

    def fresh(self, name: str = "t") -> str:
        """A new, unused prefix URI for one test."""
        return f"{self.uri}/tests/{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="session")
def s3(tmp_path_factory) -> S3Store:
    """A real S3-compatible store (SeaweedFS through scripts/s3.sh) for the session, its
    endpoint and keys exported (``AWS_*``) as a user does with what ``start`` prints."""
    args = ["--dir", str(tmp_path_factory.mktemp("s3") / "store")]
    with _SPAWNS.exempt():
        out = subprocess.run(
            [str(S3_SH), "start", *args], capture_output=True, text=True, timeout=120
        )
    if out.returncode != 0:
        with _SPAWNS.exempt():
            subprocess.run([str(S3_SH), "stop", *args], capture_output=True, timeout=60)
        raise RuntimeError(f"scripts/s3.sh start failed:\n{out.stdout}\n{out.stderr}")
    store = S3Store(dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line))
    saved = {k: os.environ.get(k) for k in store.env}
    os.environ.update(store.env)
    try:
        yield store
    finally:
        with _SPAWNS.exempt():
            subprocess.run([str(S3_SH), "stop", *args], capture_output=True, timeout=60)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


@pytest.fixture(scope="session")
def spark(hdfs):
    """A local-cluster[2,1,1024] session: two executor JVMs with their own Python workers."""
    from sparktf.spark import get_session, stop_session

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
        stop_session(session)  # its executors' work directory goes too


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


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No sparktf setting of the user's environment (configuration and home directories,
    profile, master, cluster secret, Hadoop configuration, AWS settings: the ``s3`` fixture
    exports its store's for the session), and no local cluster's directory:
    the monkeypatch, to set some for the test; all restored after it."""
    from sparktf import spark

    names = ("SPARKTF_CONF_DIR", "SPARKTF_HOME", "SPARKTF_PROFILE", "SPARKTF_SPARK_MASTER")
    aws = [name for name in os.environ if name.startswith("AWS_")]  # the session's S3 store's
    for name in (*names, spark.SECRET_FILE_ENV, "HADOOP_CONF_DIR", *aws):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SPARKTF_SPARK_CLUSTER_DIR", str(tmp_path / "no-cluster"))
    return monkeypatch
