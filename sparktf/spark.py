"""Spark plumbing: sessions, running a list of tasks, progress, readable Spark errors.

Sessions are configured from ``conf/spark/<profile>.conf`` (spark-defaults style). Under
``spark-submit`` (``scripts/submit.sh``) the submitted configuration wins and
``get_session`` only fills in what is missing; from plain Python (tests, notebooks) it reads
the profile file and starts the session itself.

``run_tasks`` runs one Spark task per item with progress in the log; ``task_progress`` and
``stage_progress`` report a running job; ``spark_failure`` and ``spark_error_text`` turn a
Py4J/Spark failure into the Python error that caused it, not the JVM trace around it.

This is a bottom layer: it imports nothing of sparktf, and nothing heavy at import time
(executors import it to run tasks).
"""

from __future__ import annotations

import functools
import logging
import os
import pickle
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = REPO_ROOT / "conf" / "spark"
LOG4J_CONF = REPO_ROOT / "conf" / "log4j2.properties"
PROFILES = ("local", "standalone", "yarn", "k8s")
# Environment variables that executors need to reach HDFS the way the driver does.
PROPAGATED_ENV = (
    "SPARKTF_WEBHDFS_URL",
    "SPARKTF_HDFS_USER",
    "SPARKTF_HDFS_TIMEOUT",
    "HADOOP_CONF_DIR",
    "HADOOP_USER_NAME",
)


def read_conf_file(path: str | os.PathLike) -> dict[str, str]:
    """Parses a spark-defaults style file: ``key value`` per line, ``#`` comments."""
    conf = {}
    for number, raw in enumerate(Path(path).read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        if len(parts) != 2:
            raise ValueError(f"{path}:{number}: expected 'key value', got {raw!r}")
        conf[parts[0]] = parts[1].strip()
    return conf


def profile_conf(profile: str) -> dict[str, str]:
    """The Spark settings of a profile in ``conf/spark/`` (or a path to a conf file)."""
    path = Path(profile)
    if not path.is_file():
        path = CONF_DIR / f"{profile}.conf"
    if not path.is_file():
        raise FileNotFoundError(
            f"no Spark profile {profile!r}: expected one of {', '.join(PROFILES)} "
            f"(files in {CONF_DIR}) or a path to a spark-defaults style file"
        )
    return read_conf_file(path)


def cluster_master(profile: str) -> str | None:
    """The master ``scripts/submit.sh`` would use besides the profile's: ``$SPARKTF_SPARK_MASTER``,
    else for the standalone profile the cluster ``scripts/spark-cluster.sh start`` runs
    (``SPARK_MASTER_URL`` in its ``master.env``)."""
    if os.environ.get("SPARKTF_SPARK_MASTER"):
        return os.environ["SPARKTF_SPARK_MASTER"]
    if profile != "standalone":
        return None
    cluster = os.environ.get(
        "SPARKTF_SPARK_CLUSTER_DIR", str(REPO_ROOT / ".local" / "spark-cluster")
    )
    env_file = Path(cluster) / "master.env"
    if env_file.is_file():
        for line in env_file.read_text().splitlines():
            if line.startswith("SPARK_MASTER_URL="):
                return line.split("=", 1)[1].strip()
    return None


def session_conf(
    profile: str = "local", overrides: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The full configuration ``get_session`` would apply outside spark-submit."""
    conf = profile_conf(profile)
    master = cluster_master(profile)
    if master:
        conf["spark.master"] = master
    if conf.get("spark.master", "").startswith("spark://127.0.0.1:"):
        conf.setdefault("spark.driver.host", "127.0.0.1")  # a loopback cluster: stay on it
        conf.setdefault("spark.driver.bindAddress", "127.0.0.1")
    conf.setdefault("spark.python.worker.reuse", "true")
    python = os.environ.get("PYSPARK_PYTHON", sys.executable)
    conf.setdefault("spark.pyspark.python", python)
    conf.setdefault("spark.pyspark.driver.python", sys.executable)
    for name in PROPAGATED_ENV:
        if os.environ.get(name):
            conf.setdefault(f"spark.executorEnv.{name}", os.environ[name])
    if not _debug_logging():  # the driver JVM's console: warnings only (conf/log4j2.properties)
        quiet = f"-Dlog4j2.configurationFile={LOG4J_CONF.as_uri()}"
        java = conf.get("spark.driver.extraJavaOptions", "")
        conf["spark.driver.extraJavaOptions"] = f"{java} {quiet}".strip()
    conf.update(overrides or {})
    return conf


def _debug_logging() -> bool:
    """True when sparktf logs at DEBUG: Spark's own INFO lines are then wanted too."""
    level = os.environ.get("SPARKTF_LOG_LEVEL", "").upper()
    return level == "DEBUG" or logging.getLogger().getEffectiveLevel() <= logging.DEBUG


def get_session(
    app_name: str = "sparktf",
    profile: str | None = None,
    overrides: Mapping[str, str] | None = None,
):
    """Returns the active SparkSession, or builds one from ``profile`` and ``overrides``.

    ``profile`` defaults to ``$SPARKTF_PROFILE`` or "local". When launched by spark-submit,
    the submitted settings are kept and the profile is not read.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    python = os.environ["PYSPARK_PYTHON"]
    if os.sep in python and not os.path.isabs(python) and os.path.exists(python):
        # Executors start Python from their own work directory: a relative path such as
        # .venv/bin/python would not be found there.
        os.environ["PYSPARK_PYTHON"] = os.path.abspath(python)
    builder = SparkSession.builder.appName(app_name)
    if _launched_by_spark_submit():
        for key, value in (overrides or {}).items():
            builder = builder.config(key, value)
    else:
        profile = profile or os.environ.get("SPARKTF_PROFILE", "local")
        conf = session_conf(profile, overrides)
        if conf.get("spark.master", "").startswith(("local", "local-cluster")):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # stay on loopback
        log.info("starting Spark (%s profile, master %s)", profile, conf.get("spark.master"))
        for key, value in conf.items():
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    default = "INFO" if _debug_logging() else "WARN"
    spark.sparkContext.setLogLevel(os.environ.get("SPARKTF_SPARK_LOG_LEVEL", default))
    return spark


@contextmanager
def job_session(
    app_name: str,
    profile: str | None = None,
    overrides: Mapping[str, str] | None = None,
    spark=None,
) -> Iterator[Any]:
    """The session a job runs on: ``spark`` when its caller has one (a notebook, a test, a
    pipeline running several jobs), left running; otherwise ``get_session``'s, stopped when
    the job ends (a clean stop: executors are not relaunched at exit)."""
    if spark is not None:
        yield spark
        return
    session = get_session(app_name, profile=profile, overrides=overrides)
    try:
        yield session
    finally:
        session.stop()


def _launched_by_spark_submit() -> bool:
    # spark-submit starts the Python driver with PYSPARK_GATEWAY_PORT set to its own JVM.
    return "PYSPARK_GATEWAY_PORT" in os.environ


# ----------------------------------------------------------------------------- progress

PROGRESS_EVERY_S = 1.0  # task_progress: how often the count is logged (when it changed)
STAGE_PROGRESS_EVERY_S = 15.0


@contextmanager
def every(seconds: float, report: Callable[[], None], name: str) -> Iterator[None]:
    """Calls ``report`` every ``seconds`` on a daemon thread named ``name`` while the block
    runs (progress logs of Spark jobs, the MLflow follower of a training run)."""
    stop = threading.Event()

    def loop() -> None:
        while not stop.wait(seconds):
            report()

    thread = threading.Thread(target=loop, name=name, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


@contextmanager
def task_progress(sc, what: str, total: int, every_s: float = PROGRESS_EVERY_S) -> Iterator[Any]:
    """An accumulator that tasks add 1 to; its count is logged while the job runs
    ("WHAT: n/total tasks done"), and once more with the time taken when the block ends."""
    done = sc.accumulator(0)
    last = 0

    def report() -> None:
        nonlocal last
        value = done.value
        if value != last:
            log.info("%s: %d/%d tasks done", what, value, total)
            last = value

    started = time.monotonic()
    with every(every_s, report, f"progress {what}"):
        yield done
    log.info("%s: %d/%d tasks done in %.1f s", what, done.value, total, time.monotonic() - started)


@contextmanager
def stage_progress(sc, every_s: float = STAGE_PROGRESS_EVERY_S) -> Iterator[None]:
    """Logs the running stages' task counts every ``every_s`` seconds while the block runs
    (for Spark actions whose tasks do not count themselves, e.g. a DataFrame write)."""
    tracker = sc.statusTracker()

    def report() -> None:
        for stage_id in tracker.getActiveStageIds():
            info = tracker.getStageInfo(stage_id)
            if info is not None:
                log.info(
                    "stage %d: %d of %d tasks done", stage_id, info.numCompletedTasks, info.numTasks
                )

    with every(every_s, report, "progress"):
        yield


# ----------------------------------------------------------------------------- running tasks


def run_tasks(
    sc,
    what: str,
    items: Sequence,
    fn: Callable,
    *,
    expected: tuple[type[BaseException], ...] = (),
    failure: type[Exception] = RuntimeError,
) -> list:
    """Runs ``fn`` on each item, one Spark task per item; returns the results in order.

    An exception of a type in ``expected`` (errors of the input, which a retry cannot fix)
    comes back from its task as data and is raised here, the first one in item order; it
    travels pickled, so it must rebuild from its pickle (define ``__reduce__`` when its
    ``__init__`` takes other arguments than its message). Any other failure of the Spark job
    is raised as ``failure`` with the task's Python error (``spark_failure``).
    """
    if not items:
        return []
    with task_progress(sc, what, len(items)) as done:
        task = functools.partial(_counted, functools.partial(_catching, fn, tuple(expected)), done)
        try:
            outcomes = sc.parallelize(list(items), len(items)).map(task).collect()
        except Exception as exc:
            if is_spark_error(exc):
                raise spark_failure(what, exc, failure) from None
            raise
    for outcome in outcomes:
        if "error" in outcome:
            raise outcome["error"]
    return [o["result"] for o in outcomes]


def _catching(fn: Callable, expected: tuple, item) -> dict:
    """Runs one task; an expected exception comes back as data (no retries of a
    deterministic error), provided that it survives pickling; else it fails the task."""
    try:
        return {"result": fn(item)}
    except expected as exc:
        if not _pickles(exc):
            raise
        return {"error": exc}


def _pickles(obj) -> bool:
    try:
        pickle.loads(pickle.dumps(obj))
    except Exception:
        return False
    return True


def _counted(fn: Callable, done, item):
    result = fn(item)
    done.add(1)
    return result


# ----------------------------------------------------------------------------- errors

# A Python exception line of a task's traceback inside a Py4J/Spark error text.
_PYTHON_ERROR = re.compile(r"^((?:sparktf|builtins)?[\w.]*(?:Error|Exception)): (.+)$", re.M)
_WRAPPERS = ("Py4J", "SparkException", "PythonException")


def is_spark_error(exc: BaseException) -> bool:
    """Whether ``exc`` comes from Py4J or PySpark (a failed Spark job, the JVM's error)."""
    return type(exc).__module__.split(".")[0] in ("py4j", "pyspark")


def task_error(exc: BaseException) -> str:
    """The Python error a failed Spark job reports (``Name: message``, the last one that is
    not a Py4J/Spark wrapper), else the first line of its text."""
    text = str(exc)
    for name, message in reversed(_PYTHON_ERROR.findall(text)):
        if not any(wrapper in name for wrapper in _WRAPPERS):
            return f"{name.rsplit('.', 1)[-1]}: {message}"
    return text.strip().splitlines()[0] if text.strip() else type(exc).__name__


def spark_failure(
    what: str, exc: BaseException, error: type[Exception] = RuntimeError
) -> Exception:
    """A readable ``error`` for a failed Spark job: "WHAT failed: Name: message", the Python
    error raised in the task (see ``task_error``). Raise it ``from None``."""
    return error(f"{what} failed: {task_error(exc)}")


def spark_error_text(text: str, limit: int = 3000) -> str:
    """The useful part of a Py4J/Spark error text: its last lines without the JVM trace
    (``at ...`` frames and ``java.`` lines), at most ``limit`` characters from the end."""
    lines = [line for line in str(text).splitlines() if line.strip()]
    keep = [
        line for line in lines if not line.lstrip().startswith("at ") and "java." not in line[:40]
    ]
    tail = keep[-12:] if len(keep) > 12 else keep
    return "\n".join(tail)[-limit:]


# ----------------------------------------------------------------------------- executors


class ExecutorCountError(RuntimeError):
    """The application does not have the number of executors a run needs."""


def registered_executors(sc) -> int:
    """Executors registered with the driver (the driver itself not counted)."""
    infos = sc._jsc.sc().statusTracker().getExecutorInfos()
    return max(0, len(infos) - 1)


def wait_for_executors(sc, count: int, timeout_s: float) -> None:
    """Waits until exactly ``count`` executors are registered; raises ExecutorCountError when
    more are, or when fewer are after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        have = registered_executors(sc)
        if have == count:
            return
        if have > count:
            raise ExecutorCountError(
                f"the run needs exactly {count} Spark executors (one per TensorFlow process) "
                f"but {have} are registered: extra executors would receive tasks meant for "
                "TensorFlow processes. Size the Spark application (e.g. local-cluster"
                f"[{count},1,1024], spark.executor.instances={count}) or change the scaling"
            )
        if time.monotonic() > deadline:
            raise ExecutorCountError(
                f"the run needs {count} Spark executors; only {have} "
                f"registered within {timeout_s:.0f} s"
            )
        time.sleep(0.5)
