"""Executors that cannot start: a watch that fails the application, naming the first error.

Spark relaunches an executor whose JVM dies at start for as long as the application runs:
a standalone master gives up only after ``spark.deploy.maxExecutorRetries`` failures in a
row *with no executor running*, and with several workers one launch is always running, so a
job whose executors all die (a missing Kerberos configuration, a bad JVM option, a missing
jar) hangs. ``watch`` counts the launches that died before they registered with the driver,
and after ``spark.sparktf.executorStartFailures`` (3) of them stops the SparkContext, which
ends the relaunching and fails whatever waits on it, and records why
(:func:`sparktf.errors.background_failure`): ``ExecutorStartError`` with the executor's first
error line and the file it comes from. A job (``cli.run``) reports that instead of the
"SparkContext was shut down" its main thread then sees.

It reads the executors' work directories (``WORK/APP-ID/EXECUTOR-ID/stderr``), so it covers
the masters whose workers run on this machine: ``local-cluster`` (``$SPARK_HOME/work``) and
the ``scripts/spark-cluster.sh`` standalone cluster (its ``work/worker-N``). On YARN, Spark's
own ``spark.executor.maxNumFailures`` ends such an application.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterable
from pathlib import Path

from sparktf import errors
from sparktf.errors import SparktfError
from sparktf.spark.profiles import installed_spark_home, spark_cluster_dir, worked_in

__all__ = [
    "FAILURES_CONF",
    "ExecutorStartError",
    "failed_launches",
    "first_error",
    "watch",
    "work_roots",
]

log = logging.getLogger(__name__)

FAILURES_CONF = "spark.sparktf.executorStartFailures"
DEFAULT_FAILURES = 3
POLL_S = 2.0
# Lines of an executor's stderr that are not its error: Spark's own header and JVM notes.
_NOISE = re.compile(
    r"^(Spark Executor Command:|Using Spark's default log4j|WARNING: |Picked up |={5,}|"
    r"\s*at |\s*\.\.\. \d+ more)"
)
_ERROR = re.compile(r"(?i)(error|exception|cannot|could not|can't|unable|denied|not found)")


class ExecutorStartError(SparktfError, RuntimeError):
    """The application's executors die before they register with the driver."""


def work_roots(master: str) -> list[Path]:
    """The directories on this machine under which ``master``'s workers keep each
    application's executor directories (none for masters whose workers are elsewhere)."""
    master = master.strip()
    if master.startswith("local-cluster"):
        home = os.environ.get("SPARK_HOME") or str(installed_spark_home())
        return [Path(home) / "work"]
    host = master.removeprefix("spark://").split(":")[0]
    if master.startswith("spark://") and host in ("127.0.0.1", "localhost"):
        return sorted((spark_cluster_dir() / "work").glob("worker-*"))
    return []


def failed_launches(
    roots: Iterable[Path], app_id: str, registered: set[str], driver: str = ""
) -> list[Path]:
    """The executor directories of ``app_id`` whose executor never registered
    (``registered``: the ids seen registered so far) and whose process is gone, oldest first.

    With ``driver`` (``CoarseGrainedScheduler@HOST:PORT``), only those of the executors
    launched for that driver: two local-cluster applications started in the same second
    share an id, and with it the work directory."""
    found = []
    for root in roots:
        app = root / app_id
        try:
            entries = list(app.iterdir())
        except OSError:
            continue
        for entry in entries:
            if entry.name.isdigit() and entry.name not in registered and not worked_in(entry):
                if not driver or driver in _command_line(entry):
                    found.append(entry)
    return sorted(found, key=lambda path: int(path.name))


def _command_line(executor_dir: Path) -> str:
    """The executor's command line, which its worker writes first into its stderr."""
    try:
        with open(executor_dir / "stderr", errors="replace") as stderr:
            return stderr.readline()
    except OSError:
        return ""


def first_error(executor_dir: Path, limit: int = 300) -> str:
    """The first line of the executor's stderr that reads as an error (else its last line),
    at most ``limit`` characters."""
    try:
        lines = (executor_dir / "stderr").read_text(errors="replace").splitlines()
    except OSError as exc:
        return f"(no stderr: {exc.strerror})"
    lines = [line.strip() for line in lines if line.strip() and not _NOISE.match(line)]
    picked = next((line for line in lines if _ERROR.search(line)), lines[-1] if lines else "")
    return (picked or "(stderr is empty)")[:limit]


def watch(sc, stop: threading.Event | None = None) -> threading.Thread | None:
    """Starts the daemon thread that fails ``sc``'s application when its executors keep
    dying at start (module docstring). None when the master's workers are not on this
    machine or ``spark.sparktf.executorStartFailures`` is 0."""
    limit = int(sc.getConf().get(FAILURES_CONF, str(DEFAULT_FAILURES)))
    roots = work_roots(sc.master)
    if limit <= 0 or not roots:
        return None
    thread = threading.Thread(
        target=_watch, args=(sc, roots, limit, stop or threading.Event()),
        name="sparktf-executor-starts", daemon=True,
    )  # fmt: skip
    thread.start()
    return thread


def _watch(sc, roots: list[Path], limit: int, stop: threading.Event) -> None:
    app_id = sc.applicationId
    conf = sc.getConf()
    driver = f"CoarseGrainedScheduler@{conf.get('spark.driver.host')}:"
    driver += conf.get("spark.driver.port") + '"'
    registered: set[str] = set()
    while not stop.wait(POLL_S):
        try:
            if sc._jsc is None:  # stopped
                return
            ids = sc._jsc.sc().getExecutorIds().mkString(",")  # registered now
            registered.update(filter(None, ids.split(",")))
        except Exception as exc:  # the context or its JVM is going away
            log.debug("executor start watch ends: %s", exc)
            return
        failed = failed_launches(roots, app_id, registered, driver)
        if len(failed) >= limit:
            _fail(sc, app_id, failed)
            return


def _fail(sc, app_id: str, failed: list[Path]) -> None:
    first = failed[0]
    error = ExecutorStartError(
        f"the executors of {app_id} cannot start: {len(failed)} launches died before they "
        f"registered; the first error of executor {first.name}: {first_error(first)} "
        f"(from {first / 'stderr'})"
    )
    errors.set_background_failure(error)
    log.error("%s; stopping the application", error)
    try:
        sc.stop()
    except Exception as exc:  # already stopping
        log.debug("stopping after executor start failures: %s", exc)
