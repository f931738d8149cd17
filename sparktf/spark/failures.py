"""``spark_failure`` and ``spark_error_text`` turn a Py4J/Spark failure into the Python error
that caused it, not the JVM trace around it; the executors a run needs, counted and waited for.
"""

from __future__ import annotations

import logging
import re
import time

from sparktf import placement
from sparktf import remote as connect
from sparktf.errors import SparktfError
from sparktf.spark.profiles import cluster_resources

__all__ = [
    "ExecutorCountError",
    "is_spark_error",
    "placement_problem",
    "executor_slots",
    "registered_executors",
    "spark_error_text",
    "spark_failure",
    "task_error",
    "task_slots",
    "wait_for_executors",
]

log = logging.getLogger(__name__)


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


class ExecutorCountError(SparktfError, RuntimeError):
    """The application does not have the number of executors a run needs."""


def registered_executors(sc) -> int:
    """Executors registered with the driver (the driver itself not counted)."""
    sc = connect.classic_context(sc, "counting the registered executors")
    infos = sc._jsc.sc().statusTracker().getExecutorInfos()
    return max(0, len(infos) - 1)


def wait_for_executors(sc, count: int, timeout_s: float) -> None:
    """Waits until the registered executors give the application ``count`` task slots (a run
    of ``count`` processes takes any ``count`` slots: several on one executor when it has
    them, and executors beyond what it needs are left to other work); raises
    ExecutorCountError when they do not within ``timeout_s``, and at once on a ``local[N]``
    master (it has no executors) or a cluster that can never hold them
    (``placement_problem``)."""
    sc = connect.classic_context(sc, "waiting for the executors")
    master = sc.master
    if master == "local" or master.startswith("local["):
        raise ExecutorCountError(
            f"the run needs {count} Spark executors and the master {master} has none (its "
            f"tasks run in the driver); use local-cluster[{count},1,1024] (e.g. "
            f"--master 'local-cluster[{count},1,1024]', or sparktf submit, which sizes it)"
        )
    per_executor = executor_slots(dict(sc.getConf().getAll()))
    executors = -(-count // per_executor)  # the fewest executors that hold the run
    problem = placement_problem(sc, executors)
    if problem:
        raise ExecutorCountError(f"the run needs {count} task slots: {problem}")
    deadline = time.monotonic() + timeout_s
    while True:
        have = task_slots(sc)
        if have is None or have >= count:
            return
        if time.monotonic() > deadline:
            raise ExecutorCountError(
                f"the run needs {count} task slots (one per TensorFlow process); the "
                f"{registered_executors(sc)} executors registered within {timeout_s:.0f} s "
                f"give {have}"
            )
        time.sleep(0.5)


def executor_slots(conf: dict[str, str]) -> int:
    """Task slots of one executor: ``spark.executor.cores`` / ``spark.task.cpus`` (1 when
    they are not set, as on local-cluster[N,1,M])."""
    cores = int(conf.get("spark.executor.cores", "1") or 1)
    return max(1, cores // max(1, int(conf.get("spark.task.cpus", "1") or 1)))


def task_slots(sc) -> int | None:
    """The task slots of the registered executors, as the scheduler counts them (None when
    this Spark does not say)."""
    try:
        jsc = sc._jsc.sc()
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception as exc:  # another Spark version
        log.debug("cannot read the scheduler's task slots: %s", exc)
        return None


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
