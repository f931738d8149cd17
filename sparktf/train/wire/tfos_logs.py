"""TensorFlowOnSpark's log lines without the run's secrets, on the driver and the executors.

TensorFlowOnSpark logs every node's description at INFO (``TFCluster.run`` on the driver,
``TFSparkNode.reserve`` on the executors), and a node's description holds its manager's
*authkey*: whoever reads the log can drive that node's manager. Its import also sets the
root logger to INFO. :func:`protect_tensorflowonspark_logs` is the one switch for its
loggers, called where TensorFlowOnSpark runs (the driver's
:class:`~sparktf.train.driver.bringup.TfosCluster`, the executors' reservation client):

* a :class:`SecretFilter` on each of its loggers (and on the root logger, which its
  ``TFNode`` logs to) rewrites a record before any handler sees it: the value of any
  ``authkey``, ``secret``, ``token`` or ``password`` entry (``'authkey': b'...'``,
  ``token=...``) and every registered secret (raw, hex, base64, ``repr``) become
  ``<redacted>``, at every level;
* its loggers go to WARNING unless sparktf logs at DEBUG or their level was set on purpose:
  its INFO lines are start-up chatter;
* Py4J's logger goes to INFO (:func:`sparktf.spark.quiet_py4j`): at DEBUG it dumps every
  command sent to the JVM, the pickled task closures that carry the secrets included.
"""

from __future__ import annotations

import base64
import logging
import re
import threading

__all__ = [
    "FILTER",
    "REDACTED",
    "TFOS_LOGGERS",
    "SecretFilter",
    "protect_tensorflowonspark_logs",
    "secret_forms",
]

REDACTED = "<redacted>"
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
# A secret-named entry of a dict's repr, a keyword argument or a query string, up to the end
# of its value: a quoted string (bytes or text, with escapes) or a bare word.
_ENTRY = re.compile(
    r"""(?ix)
    (['"]?\b\w*(?:authkey|secret|token|password)\w*['"]?\s*[:=]\s*)
    (b?'(?:[^'\\]|\\.)*' | b?"(?:[^"\\]|\\.)*" | [^\s,;&)}\]]+)
    """
)


def secret_forms(secret: bytes | str) -> set[str]:
    """The ways ``secret`` can appear in a log line: as text, in hex, in base64 (standard and
    URL-safe, with and without padding) and, for bytes, as the inside of its ``repr``."""
    raw = secret.encode() if isinstance(secret, str) else bytes(secret)
    forms = {raw.hex(), raw.hex().upper(), repr(raw)[2:-1]}
    for encoded in (base64.b64encode(raw), base64.urlsafe_b64encode(raw)):
        text = encoded.decode()
        forms |= {text, text.rstrip("=")}
    if isinstance(secret, str):
        forms.add(secret)
    else:
        try:
            forms.add(raw.decode())
        except UnicodeDecodeError:
            pass
    return {form for form in forms if len(form) >= 8}  # a short form would match by chance


class SecretFilter(logging.Filter):
    """Rewrites a record's message and traceback text with secrets replaced by
    ``<redacted>`` (see the module's documentation); never drops a record."""

    def __init__(self) -> None:
        super().__init__()
        self._forms: set[str] = set()
        self._lock = threading.Lock()

    def add(self, *secrets: bytes | str | None) -> None:
        """Registers secrets to redact wherever they appear (None and empty ones are
        ignored)."""
        forms = set().union(*(secret_forms(s) for s in secrets if s))
        with self._lock:
            self._forms |= forms

    def redact(self, text: str) -> str:
        """``text`` with secret-named entries and registered secrets redacted."""
        for form in sorted(self._forms, key=len, reverse=True):
            if form in text:
                text = text.replace(form, REDACTED)
        return _ENTRY.sub(lambda m: m.group(1) + REDACTED, text)

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            message = record.getMessage()
        except Exception:  # a malformed record: logging reports it itself, unchanged
            return True
        cleaned = self.redact(message)
        if cleaned != message:
            record.msg, record.args = cleaned, None
        if record.exc_info and record.exc_info[1] is not None and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = self.redact(record.exc_text)
        if record.stack_info:
            record.stack_info = self.redact(record.stack_info)
        return True


FILTER = SecretFilter()
_LOCK = threading.Lock()


def protect_tensorflowonspark_logs(*secrets: bytes | str | None) -> None:
    """Installs the redaction on TensorFlowOnSpark's loggers and the root logger (once per
    process), registers ``secrets`` with it, and sets TensorFlowOnSpark's loggers to WARNING
    unless sparktf logs at DEBUG or their level was set on purpose; Py4J's goes to INFO. Safe
    to call again (each run, each task)."""
    from sparktf.spark import quiet_py4j

    quiet_py4j()  # its DEBUG lines dump the task closures, secrets included
    FILTER.add(*secrets)
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
