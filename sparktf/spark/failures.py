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
    "registered_executors",
    "spark_error_text",
    "spark_failure",
    "task_error",
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
