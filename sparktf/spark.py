"""Spark plumbing: sessions, running a list of tasks, progress, readable Spark errors.

Sessions are configured from the profile ``spark/<profile>.conf`` of the conf directories
(``sparktf.paths``; spark-defaults style). Under
``spark-submit`` (``scripts/submit.sh``) the submitted configuration wins and
``get_session`` only fills in what is missing; from plain Python (tests, notebooks) it reads
the profile file and starts the session itself. Given a Spark Connect URL (``remote``, or
``$SPARK_REMOTE`` outside spark-submit) it returns a Connect session instead
(``sparktf.remote``): no JVM in this process, only runtime settings applied.

``run_tasks`` runs one Spark task per item with progress in the log; ``task_progress`` and
``stage_progress`` report a running job; ``spark_failure`` and ``spark_error_text`` turn a
Py4J/Spark failure into the Python error that caused it, not the JVM trace around it.

This is a bottom layer: it imports nothing of sparktf, and nothing heavy at import time
(executors import it to run tasks).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import pickle
import re
import secrets
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sparktf import paths, placement
from sparktf import remote as connect
from sparktf.errors import SparktfError, SparktfValueError
from sparktf.remote import is_connect
from sparktf.security import kerberos

__all__ = [
    "ExecutorCountError",
    "PROFILES",
    "PROGRESS_EVERY_S",
    "PROPAGATED_ENV",
    "STAGE_PROGRESS_EVERY_S",
    "cluster_master",
    "cluster_resources",
    "every",
    "executor_sizing",
    "get_session",
    "is_connect",
    "is_spark_error",
    "job_session",
    "launched_by_spark_submit",
    "local_cluster_env",
    "log4j_conf",
    "placement_problem",
    "profile_conf",
    "profile_file",
    "quiet_py4j",
    "read_conf_file",
    "registered_executors",
    "run_tasks",
    "session_conf",
    "spark_cluster_dir",
    "spark_error_text",
    "spark_failure",
    "stage_progress",
    "task_error",
    "task_progress",
    "wait_for_executors",
    "yarn_site",
    "SECRET_CONF",
    "SECRET_FILE_ENV",
    "TRANSPORT_SETTINGS",
    "TransportError",
    "read_secret",
    "remote_executors",
    "secret_file",
    "transport_defaults",
    "transport_secret",
    "transport_warning",
    "write_private_conf",
]

log = logging.getLogger(__name__)

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
            raise SparktfValueError(f"{path}:{number}: expected 'key value', got {raw!r}")
        conf[parts[0]] = parts[1].strip()
    return conf


def profile_conf(profile: str) -> dict[str, str]:
    """The Spark settings of a profile (``spark/PROFILE.conf`` of the conf directories,
    ``sparktf.paths``) or of a spark-defaults style file."""
    return read_conf_file(profile_file(profile))


def profile_file(profile: str) -> Path:
    """The file of a profile: a path as given, else ``spark/PROFILE.conf`` of the conf
    directories; FileNotFoundError names the profiles there."""
    path = Path(profile)
    if not path.is_file():
        path = paths.conf_file(f"spark/{profile}.conf")
    if not path.is_file():
        where = ", ".join(str(d / "spark") for d in paths.conf_dirs())
        raise FileNotFoundError(
            f"no Spark profile {profile!r}: expected one of "
            f"{', '.join(paths.conf_names('spark', '.conf'))} (files in {where}) or a path to a "
            "spark-defaults style file"
        )
    return path


def spark_cluster_dir() -> Path:
    """The local standalone cluster's directory (``scripts/spark-cluster.sh``):
    ``$SPARKTF_SPARK_CLUSTER_DIR``, else ``spark-cluster`` under sparktf's home."""
    value = os.environ.get("SPARKTF_SPARK_CLUSTER_DIR")
    return Path(value) if value else paths.home() / "spark-cluster"


def log4j_conf() -> Path:
    """The log4j2 file that keeps the driver's console to warnings."""
    return paths.conf_file("log4j2.properties")


def cluster_master(profile: str) -> str | None:
    """The master ``sparktf submit`` would use besides the profile's: ``$SPARKTF_SPARK_MASTER``,
    else for the standalone profile the cluster ``scripts/spark-cluster.sh start`` runs
    (``SPARK_MASTER_URL`` in its ``master.env``)."""
    if os.environ.get("SPARKTF_SPARK_MASTER"):
        return os.environ["SPARKTF_SPARK_MASTER"]
    if profile != "standalone":
        return None
    return local_cluster_env().get("SPARK_MASTER_URL")


def local_cluster_env() -> dict[str, str]:
    """The ``master.env`` of the local standalone cluster (empty when it is not running)."""
    env_file = spark_cluster_dir() / "master.env"
    if not env_file.is_file():
        return {}
    pairs = (line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def cluster_resources(master: str, conf: Mapping[str, str]) -> placement.Cluster | None:
    """What the cluster of ``master`` has (a standalone master's workers, YARN's
    NodeManagers), or None where that cannot be read: another kind of master, or no answer
    within a few seconds. The standalone master's web UI: the local cluster's (its
    ``master.env``), else ``spark.sparktf.master.webui``, else port 8080 of the master's host;
    YARN's ResourceManager: ``yarn-site.xml`` of ``$YARN_CONF_DIR`` or ``$HADOOP_CONF_DIR``."""
    try:
        if master.startswith("spark://"):
            return placement.standalone_cluster(_standalone_webui(master, conf))
        if master == "yarn":
            site = yarn_site()
            webapp = placement.yarn_webapp(site)
            return placement.yarn_cluster(webapp, site) if webapp else None
    except (OSError, ValueError, KeyError) as exc:
        log.debug("could not read the cluster's resources (%s): %s", master, exc)
    return None


def executor_sizing(
    master: str, conf: Mapping[str, str], executors: int, *, fixed: bool = False
) -> dict[str, str]:
    """Settings that size ``executors`` executors to what the cluster of ``master`` has.

    Empty when the executors ``conf`` asks for fit, or when the cluster cannot be read (not a
    standalone or YARN master, no answer); else ``conf``'s executors shrunk until they fit
    (``placement.fit``). With ``fixed`` (the user sized them) nothing is changed and
    ``placement.PlacementError`` says, in numbers, why they do not fit.
    """
    if not master.startswith("spark://") and master != "yarn":
        return {}
    cluster = cluster_resources(master, conf)
    if cluster is None:
        log.info("the cluster's resources could not be read: executors as configured")
        return {}
    ask = placement.ask_from_conf(dict(conf), executors, yarn=master == "yarn")
    if fixed:
        placement.check(cluster, ask)
        return {}
    fitted = placement.fit(cluster, ask)
    if fitted == ask:
        return {}
    overhead = f" + {placement.mb_text(fitted.overhead_mb)} overhead" if fitted.overhead_mb else ""
    log.info(
        "%s; %s: using %s and %s%s per executor",
        ask.describe(),
        cluster.describe(),
        placement.cores_text(fitted.cores),
        placement.mb_text(fitted.memory_mb),
        overhead,
    )
    return placement.sizing_conf(fitted)


def _standalone_webui(master: str, conf: Mapping[str, str]) -> str:
    local = local_cluster_env()
    if local.get("SPARK_MASTER_URL") == master and local.get("SPARK_MASTER_WEBUI_URL"):
        return local["SPARK_MASTER_WEBUI_URL"]
    host = master[len("spark://") :].split(",")[0].rsplit(":", 1)[0]
    return conf.get("spark.sparktf.master.webui", f"http://{host}:8080")


def yarn_site() -> dict[str, str]:
    """``yarn-site.xml`` of ``$YARN_CONF_DIR`` or ``$HADOOP_CONF_DIR`` (empty when none)."""
    conf_dir = os.environ.get("YARN_CONF_DIR") or os.environ.get("HADOOP_CONF_DIR")
    return placement.yarn_site(conf_dir) if conf_dir else {}


def session_conf(
    profile: str = "local", overrides: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The full configuration ``get_session`` would apply outside spark-submit (without the
    shared secret a standalone or local-cluster master needs: ``transport_secret``)."""
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
        quiet = f"-Dlog4j2.configurationFile={log4j_conf().resolve().as_uri()}"
        java = conf.get("spark.driver.extraJavaOptions", "")
        conf["spark.driver.extraJavaOptions"] = f"{java} {quiet}".strip()
    conf.update(overrides or {})
    # on standalone, YARN and Kubernetes: Spark's transport protected unless the profile or
    # the overrides say otherwise
    conf.update(transport_defaults(conf.get("spark.master", ""), conf))
    return conf


def quiet_py4j() -> None:
    """Keeps Py4J's DEBUG lines out of the logs: they dump every command sent to the JVM,
    settings and pickled task closures included (and with them a run's secrets). Its logger
    goes to INFO unless its level was set on purpose."""
    py4j = logging.getLogger("py4j")
    if py4j.level == logging.NOTSET:
        py4j.setLevel(logging.INFO)


def _debug_logging() -> bool:
    """True when sparktf logs at DEBUG: Spark's own INFO lines are then wanted too."""
    level = os.environ.get("SPARKTF_LOG_LEVEL", "").upper()
    return level == "DEBUG" or logging.getLogger().getEffectiveLevel() <= logging.DEBUG


def get_session(
    app_name: str = "sparktf",
    profile: str | None = None,
    overrides: Mapping[str, str] | None = None,
    remote: str | None = None,
):
    """Returns the active SparkSession, or builds one from ``profile`` and ``overrides``.

    With a Spark Connect URL (``remote``, else ``$SPARK_REMOTE`` outside spark-submit) it
    returns ``sparktf.remote.connect_session``'s session: the profile is not read, only the
    overrides that are runtime settings apply.

    ``profile`` defaults to ``$SPARKTF_PROFILE`` or "local". When launched by spark-submit,
    the submitted settings are kept and the profile is not read. Otherwise a master whose
    executors may run elsewhere gets ``TRANSPORT_SETTINGS`` unless the configuration sets
    them, and the shared secret a standalone master needs (``transport_secret``) goes to the
    JVM in a private file, never on its command line.

    Raises:
        TransportError: authentication on, a standalone master, and its secret not known.
    """
    from pyspark.sql import SparkSession

    quiet_py4j()
    url = connect.remote_url(remote, spark_submit=launched_by_spark_submit())
    if url is not None:
        kerberos.preflight(dict(overrides or {}))  # this process still reads and writes HDFS
        return connect.connect_session(app_name, url, overrides)
    if os.environ.pop(connect.REMOTE_ENV, None):  # PySpark would go to Connect with it
        log.info("a classic Spark session: %s ignored", connect.REMOTE_ENV)
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
    secret = None
    if launched_by_spark_submit():
        kerberos.preflight()
        token = os.environ.get(kerberos.TOKEN_ENV)
        settings = {f"spark.executorEnv.{kerberos.TOKEN_ENV}": token} if token else {}
        for key, value in {**settings, **(overrides or {})}.items():
            builder = builder.config(key, value)
    else:
        profile = profile or os.environ.get("SPARKTF_PROFILE", "local")
        conf = session_conf(profile, overrides)
        kerberos.preflight(conf)  # no ticket and no keytab: fail before the JVM starts
        conf.update(kerberos.spark_settings(conf))
        if conf.get("spark.master", "").startswith(("local", "local-cluster")):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # stay on loopback
        log.info("starting Spark (%s profile, master %s)", profile, conf.get("spark.master"))
        secret = conf.pop(SECRET_CONF, None) or transport_secret(conf.get("spark.master", ""), conf)
        for key, value in conf.items():
            builder = builder.config(key, value)
    with _secret_for_new_jvm(builder, secret) as builder:
        spark = builder.getOrCreate()
    default = "INFO" if _debug_logging() else "WARN"
    spark.sparkContext.setLogLevel(os.environ.get("SPARKTF_SPARK_LOG_LEVEL", default))
    # A script that ends without spark.stop() ends quietly: stopped here, before Python exits,
    # the executors are not relaunched (and reported lost) while the JVM shuts down.
    atexit.register(_stop_at_exit, spark)
    return spark


def _stop_at_exit(spark) -> None:
    try:
        if not is_connect(spark) and spark.sparkContext._jsc is not None:
            spark.stop()
    except Exception as exc:  # the JVM may already be gone: nothing left to stop
        log.debug("stopping Spark at exit: %s", exc)


@contextmanager
def job_session(
    app_name: str,
    profile: str | None = None,
    overrides: Mapping[str, str] | None = None,
    spark=None,
    remote: str | None = None,
) -> Iterator[Any]:
    """The session a job runs on: ``spark`` when its caller has one (a notebook, a test, a
    pipeline running several jobs), left running; otherwise ``get_session``'s (a Spark
    Connect one with ``remote``), stopped when the job ends (a clean stop: executors are not
    relaunched at exit; a Connect session is released on the server)."""
    if spark is not None:
        yield spark
        return
    session = get_session(app_name, profile=profile, overrides=overrides, remote=remote)
    try:
        yield session
    finally:
        session.stop()


def launched_by_spark_submit() -> bool:
    """Whether this Python driver was started by spark-submit."""
    # spark-submit starts the Python driver with PYSPARK_GATEWAY_PORT set to its own JVM.
    return "PYSPARK_GATEWAY_PORT" in os.environ


# ----------------------------------------------------------------------------- transport

# What keeps a run's secrets private on Spark's own channels (they travel in task closures):
# RPC authentication, AES encryption of the RPC connections, encryption of what Spark writes
# to local disk (shuffle files, spills, broadcast blocks).
TRANSPORT_SETTINGS = {
    "spark.authenticate": "true",
    "spark.network.crypto.enabled": "true",
    "spark.io.encryption.enabled": "true",
}
SECRET_CONF = "spark.authenticate.secret"
SECRET_FILE_ENV = "SPARKTF_SPARK_SECRET_FILE"


class TransportError(SparktfError, ValueError):
    """Spark's authentication is on and the shared secret the master needs is not known."""


def remote_executors(master: str) -> bool:
    """Whether the executors of ``master`` may run on other machines (a standalone master,
    YARN, Kubernetes): every master but ``local``, ``local[N]`` and ``local-cluster``."""
    return bool(master) and not master.startswith("local")


def _on(conf: Mapping[str, str], key: str) -> bool:
    return str(conf.get(key, "false")).strip().lower() == "true"


def transport_defaults(master: str, conf: Mapping[str, str]) -> dict[str, str]:
    """The transport settings sparktf adds for ``master``: where its executors may run on
    other machines (``remote_executors``), each of ``TRANSPORT_SETTINGS`` that ``conf`` (the
    user's configuration: profile, command line, overrides) does not set; a setting the user
    gives, ``false`` included, wins. Nothing on a local master."""
    if not remote_executors(master):
        return {}
    return {key: value for key, value in TRANSPORT_SETTINGS.items() if key not in conf}


def transport_secret(master: str, conf: Mapping[str, str]) -> str | None:
    """The shared secret to give the application where Spark does not make one itself: with
    ``spark.authenticate`` on in ``conf`` and no ``spark.authenticate.secret`` there, a
    standalone master's cluster secret (``secret_file``), on ``local-cluster`` a fresh one.
    None otherwise (YARN and Kubernetes make one per application).

    Raises:
        TransportError: a standalone master and no secret file, or one without a secret.
    """
    if not _on(conf, "spark.authenticate") or conf.get(SECRET_CONF):
        return None
    if master.startswith("local-cluster"):
        return secrets.token_hex(32)
    if not master.startswith("spark://"):
        return None
    path = secret_file(master)
    if path is None:
        raise TransportError(
            f"spark.authenticate is on and the standalone master {master} needs its cluster's "
            f"shared secret: set {SECRET_FILE_ENV} to a private file holding it (a "
            f"'{SECRET_CONF} VALUE' line, or the secret alone; scripts/spark-cluster.sh writes "
            "one: DIR/secret.conf), or turn authentication off with --conf "
            "spark.authenticate=false (the run's secrets then travel in clear)"
        )
    return read_secret(path)


def secret_file(master: str) -> Path | None:
    """Where the shared secret of the standalone ``master`` is: ``$SPARKTF_SPARK_SECRET_FILE``,
    else, for the cluster ``scripts/spark-cluster.sh`` runs, its ``SPARK_SECRET_FILE``."""
    if os.environ.get(SECRET_FILE_ENV):
        return Path(os.environ[SECRET_FILE_ENV])
    local = local_cluster_env()
    if local.get("SPARK_MASTER_URL") == master and local.get("SPARK_SECRET_FILE"):
        return Path(local["SPARK_SECRET_FILE"])
    return None


def read_secret(path: str | os.PathLike) -> str:
    """The secret in ``path``: its ``spark.authenticate.secret`` line, or its one word.

    Raises:
        TransportError: the file cannot be read or holds no secret.
    """
    try:
        text = Path(path).read_text()
        mode = os.stat(path).st_mode & 0o777
    except OSError as exc:
        raise TransportError(f"cannot read the Spark secret file {path}: {exc}") from None
    if mode & 0o077:
        log.warning(
            "the Spark secret file %s is readable by others (mode %o): chmod 600", path, mode
        )
    lines = [line.split() for line in text.splitlines() if line.strip() and line[0] != "#"]
    for words in lines:
        if len(words) == 2 and words[0] == SECRET_CONF:
            return words[1]
    if len(lines) == 1 and len(lines[0]) == 1:
        return lines[0][0]
    raise TransportError(f"{path}: no '{SECRET_CONF} VALUE' line and not a secret alone")


def write_private_conf(path: str | os.PathLike, conf: Mapping[str, str]) -> Path:
    """Writes ``conf`` as a spark-defaults style file only this user can read (a new file)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.writelines(f"{key} {value}\n" for key, value in conf.items())
    return Path(path)


def transport_warning(conf: Mapping[str, str]) -> str | None:
    """What a run should be told when Spark carries its secrets in clear: authentication or RPC
    encryption off in ``conf`` (the application's) with a master whose executors may run on
    other machines; None when they are protected, and for ``local``/``local[N]`` (one process)
    and ``local-cluster`` (its executors reach the driver over loopback only, which other
    users of the machine cannot read)."""
    master = conf.get("spark.master", "")
    if not master or master == "local" or master.startswith(("local[", "local-cluster[")):
        return None
    off = [
        key for key in ("spark.authenticate", "spark.network.crypto.enabled") if not _on(conf, key)
    ]
    if not off:
        return None
    now = ", ".join(f"{key}={conf[key]}" if key in conf else f"{key} unset" for key in off)
    secret = (
        f"; a standalone master also needs its cluster's {SECRET_CONF} ({SECRET_FILE_ENV})"
        if master.startswith("spark://")
        else ""
    )
    settings = " and ".join(f"{key}=true" for key in off)
    return (
        f"Spark's transport is not protected ({now}): the run's secrets (reservation secret, "
        "control tokens, TensorFlowOnSpark's manager keys) travel in clear in Spark's task "
        f"closures between the driver and the executors. Set {settings}"
        f"{secret} (sparktf submit sets them on standalone, YARN and Kubernetes unless the "
        "configuration turns them off)"
    )


@contextmanager
def _secret_for_new_jvm(builder, secret: str | None) -> Iterator[Any]:
    """The builder, with ``secret`` given to the application without a command line: PySpark
    starts the driver's JVM with every setting as a ``--conf`` argument, so a JVM yet to start
    reads it from a private properties file (``--extra-properties-file`` through
    ``PYSPARK_SUBMIT_ARGS``); to a running JVM it goes as a setting."""
    from pyspark import SparkContext

    if secret is None:
        yield builder
        return
    if getattr(SparkContext, "_gateway", None) is not None:
        yield builder.config(SECRET_CONF, secret)
        return
    import shlex
    import shutil
    import tempfile

    scratch = tempfile.mkdtemp(prefix="sparktf-secret-")
    before = os.environ.get("PYSPARK_SUBMIT_ARGS")
    try:
        path = write_private_conf(Path(scratch) / "secret.conf", {SECRET_CONF: secret})
        args = f"--extra-properties-file {shlex.quote(str(path))} {before or 'pyspark-shell'}"
        os.environ["PYSPARK_SUBMIT_ARGS"] = args
        yield builder
    finally:
        if before is None:
            os.environ.pop("PYSPARK_SUBMIT_ARGS", None)
        else:
            os.environ["PYSPARK_SUBMIT_ARGS"] = before
        shutil.rmtree(scratch, ignore_errors=True)


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
    ("WHAT: n/total tasks done"), and once more with the time taken when the block ends.
    ``sc``: a SparkContext (a Spark Connect session has no accumulators)."""
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
    (for Spark actions whose tasks do not count themselves, e.g. a DataFrame write).
    ``sc``: a SparkContext or a session; of a Spark Connect session, the stages its server
    reports to this client."""
    if is_connect(sc):
        with (
            connect.stage_counts(sc) as running,
            every(every_s, lambda: _log(running()), "progress"),
        ):
            yield
        return
    tracker = getattr(sc, "sparkContext", sc).statusTracker()

    def report() -> None:
        infos = (tracker.getStageInfo(stage_id) for stage_id in tracker.getActiveStageIds())
        _log([(i.stageId, i.numCompletedTasks, i.numTasks) for i in infos if i is not None])

    with every(every_s, report, "progress"):
        yield


def _log(stages: Sequence[tuple[int, int, int]]) -> None:
    for stage_id, done, total in stages:
        log.info("stage %d: %d of %d tasks done", stage_id, done, total)


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
    sc = connect.classic_context(sc, what)
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


class ExecutorCountError(SparktfError, RuntimeError):
    """The application does not have the number of executors a run needs."""


def registered_executors(sc) -> int:
    """Executors registered with the driver (the driver itself not counted)."""
    sc = connect.classic_context(sc, "counting the registered executors")
    infos = sc._jsc.sc().statusTracker().getExecutorInfos()
    return max(0, len(infos) - 1)


def wait_for_executors(sc, count: int, timeout_s: float) -> None:
    """Waits until exactly ``count`` executors are registered; raises ExecutorCountError when
    more are, when fewer are after ``timeout_s``, and at once on a ``local[N]`` master (it has
    no executors) or a cluster that can never hold them (``placement_problem``)."""
    sc = connect.classic_context(sc, "waiting for the executors")
    master = sc.master
    if master == "local" or master.startswith("local["):
        raise ExecutorCountError(
            f"the run needs {count} Spark executors and the master {master} has none (its "
            f"tasks run in the driver); use local-cluster[{count},1,1024] (e.g. "
            f"--master 'local-cluster[{count},1,1024]', or sparktf submit, which sizes it)"
        )
    problem = placement_problem(sc, count)
    if problem:
        raise ExecutorCountError(f"the run needs {count} Spark executors: {problem}")
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


def placement_problem(sc, count: int) -> str | None:
    """Why the cluster of this application can never hold its ``count`` executors
    (placement.check's numbers), or None when it can or nothing can be read."""
    conf = dict(sc.getConf().getAll())
    cluster = cluster_resources(sc.master, conf)
    if cluster is None:
        return None
    try:
        placement.check(cluster, placement.ask_from_conf(conf, count, yarn=sc.master == "yarn"))
    except placement.PlacementError as exc:
        return str(exc)
    return None
