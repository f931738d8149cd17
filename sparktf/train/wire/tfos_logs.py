"""TensorFlowOnSpark's log lines without the run's secrets, on the driver and the executors.

TensorFlowOnSpark logs every node's description at INFO (``TFCluster.run`` on the driver,
``TFSparkNode.reserve`` on the executors), and a node's description holds its manager's
*authkey*: whoever reads the log can drive that node's manager. Its import also sets the
root logger to INFO. :func:`protect_tensorflowonspark_logs` is the one switch for its
loggers, called where TensorFlowOnSpark runs (the driver's
:class:`~sparktf.train.driver.bringup.TfosCluster`, the executors' reservation client):

* the redactor's :data:`~sparktf.security.redact.FILTER` on each of its loggers (and on the
  root logger, which its ``TFNode`` logs to) rewrites a record before any handler sees it: the
  value of any ``authkey``, ``secret``, ``token`` or ``password`` entry and every registered
  secret (raw, hex, base64, ``repr``) become ``<redacted>``, at every level;
* its loggers go to WARNING unless sparktf logs at DEBUG or their level was set on purpose:
  its INFO lines are start-up chatter;
* Py4J's logger goes to INFO (:func:`sparktf.security.redact.quiet_py4j`): at DEBUG it dumps
  every command sent to the JVM, the pickled task closures that carry the secrets included.
"""

from __future__ import annotations

import logging
import threading

from sparktf.security.redact import FILTER, add_secret, quiet_py4j

__all__ = ["TFOS_LOGGERS", "protect_tensorflowonspark_logs"]

# TensorFlowOnSpark's package logger and its modules' (each logs on its own logger, and a
# logger's filter does not see the records of its children).
TFOS_LOGGERS = tuple(
    "tensorflowonspark" + suffix
    for suffix in (
        "",
        ".TFCluster",
        ".TFManager",
        ".TFNode",
        ".TFParallel",
        ".TFSparkNode",
        ".dfutil",
        ".gpu_info",
        ".pipeline",
        ".reservation",
        ".util",
    )
)
_LOCK = threading.Lock()


def protect_tensorflowonspark_logs(*secrets: bytes | str | None) -> None:
    """Installs the redaction on TensorFlowOnSpark's loggers and the root logger (once per
    process), registers ``secrets`` with it, and sets TensorFlowOnSpark's loggers to WARNING
    unless sparktf logs at DEBUG or their level was set on purpose; Py4J's goes to INFO. Safe
    to call again (each run, each task)."""
    quiet_py4j()  # its DEBUG lines dump the task closures, secrets included
    add_secret(*secrets)
    debug = logging.getLogger("sparktf").isEnabledFor(logging.DEBUG)
    with _LOCK:
        names = set(TFOS_LOGGERS) | {
            name
            for name in list(logging.root.manager.loggerDict)
            if name.startswith("tensorflowonspark.")
        }
        for logger in [logging.getLogger(name) for name in sorted(names)] + [logging.root]:
            if FILTER not in logger.filters:
                logger.addFilter(FILTER)
        package = logging.getLogger("tensorflowonspark")
        if package.level == logging.NOTSET and not debug:
            package.setLevel(logging.WARNING)
