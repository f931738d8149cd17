"""The one redactor: no secret of sparktf's in any log line or error, at any level, and one
marker for what was hidden, :data:`REDACTED` (``<redacted>``).

One set of registered secrets (:func:`add_secret`, every form a secret takes in a line: raw,
hex, base64, the inside of a bytes ``repr``), and four ways in:

* :func:`install` wraps the log record factory of the process, so every record, of any logger
  and at any level, has its message and its traceback text redacted before a handler sees
  it: ``delegation=`` and ``token=`` parameter values (``urllib3`` logs each request's full
  URL at DEBUG, and WebHDFS URLs carry the token as ``delegation=...``), token variables
  (``HADOOP_TOKEN=...``) and the registered secrets;
* :data:`FILTER` (a :class:`SecretFilter`) goes further on the loggers that print whole
  dicts of secrets: the value of any ``authkey``, ``secret``, ``token`` or ``password``
  entry (``'authkey': b'...'``, ``token=...``) is redacted too;
* :func:`redact_url` and :func:`scrub`, for the URLs that sparktf itself names in a log line
  or an error: a Spark Connect URL's ``;token=``, the password of an MLflow tracking URI (and
  wherever a library's error quotes it);
* :func:`protect_tensorflowonspark_logs`, the one switch for TensorFlowOnSpark's loggers,
  called where TensorFlowOnSpark runs (the driver's
  :class:`~sparktf.train.driver.bringup.TfosCluster`, the executors' node task).
  TensorFlowOnSpark logs every node's description at INFO (``TFCluster.run`` on the driver,
  ``TFSparkNode.reserve`` on the executors), and a node's description holds its manager's
  *authkey*: whoever reads the log can drive that node's manager; its import also sets the
  root logger to INFO. The switch puts :data:`FILTER` on each of its loggers (and on the root
  logger, which its ``TFNode`` logs to) and sends its loggers to WARNING unless sparktf logs
  at DEBUG or their level was set on purpose: its INFO lines are start-up chatter.

:func:`quiet_py4j` keeps Py4J's DEBUG lines, which dump the pickled task closures that carry
a run's secrets, out of the logs.
"""

from __future__ import annotations

import base64
import logging
import re
import threading
import traceback
from urllib.parse import urlsplit, urlunsplit

__all__ = [
    "FILTER",
    "REDACTED",
    "TFOS_LOGGERS",
    "SecretFilter",
    "add_secret",
    "holds_secret",
    "install",
    "protect_tensorflowonspark_logs",
    "quiet_py4j",
    "redact",
    "redact_url",
    "scrub",
    "secret_forms",
]

REDACTED = "<redacted>"
# a token parameter's or variable's value (``token=``, ``delegation=``, ``HADOOP_TOKEN=``,
# ``SPARKTF_HDFS_RPC_TOKENS=``), up to the next separator of a query (&) or a Spark Connect URL (;)
_PARAM = re.compile(r"(?i)\b(\w*?(?:delegation|tokens?)=)[^;&\s'\"<>]+")
# A secret-named entry of a dict's repr, a keyword argument or a query string, up to the end
# of its value: a quoted string (bytes or text, with escapes) or a bare word.
_ENTRY = re.compile(
    r"""(?ix)
    (['"]?\b\w*(?:authkey|secret|token|password)\w*['"]?\s*[:=]\s*)
    (b?'(?:[^'\\]|\\.)*' | b?"(?:[^"\\]|\\.)*" | [^\s,;&)}\]]+)
    """
)
_secrets: set[str] = set()
_lock = threading.Lock()
_installed = False


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


def add_secret(*values: bytes | str | None) -> None:
    """Redacts ``values`` (in each of their forms) wherever they appear in a log record from
    now on, and installs the redaction; None and empty values are ignored."""
    forms = set().union(*(secret_forms(v) for v in values if v))
    if forms:
        with _lock:
            _secrets.update(forms)
        install()


def redact(text: str) -> str:
    """``text`` with delegation tokens and registered secrets replaced by ``<redacted>``."""
    for secret in sorted(_secrets, key=len, reverse=True):
        if secret in text:
            text = text.replace(secret, REDACTED)
    return _PARAM.sub(r"\1" + REDACTED, text)


def redact_url(url: str) -> str:
    """``url`` for a log line or an error: the password of its user part
    (``https://user:<redacted>@host``), the value of its ``token`` and ``delegation``
    parameters (``?token=``, a Spark Connect URL's ``;token=``) and any registered secret
    become ``<redacted>``. Text that is no URL is redacted as :func:`redact` does."""
    try:
        parts = urlsplit(url)
        password = parts.password
    except ValueError:  # not a URL (an unclosed IPv6 bracket, ...)
        password = None
    if password is not None:
        host = parts.netloc.rsplit("@", 1)[1]
        url = urlunsplit(parts._replace(netloc=f"{parts.username}:{REDACTED}@{host}"))
    return redact(url)


def scrub(text: str, url: str) -> str:
    """``text`` (e.g. a library's error that quotes ``url``) with ``url``'s password
    redacted wherever it appears, and as :func:`redact` leaves it otherwise."""
    try:
        password = urlsplit(url).password
    except ValueError:
        password = None
    if password:
        text = text.replace(password, REDACTED)
    return redact(text)


def holds_secret(text: str) -> bool:
    """Whether ``text`` holds a registered secret, in any of its forms (:func:`add_secret`)."""
    with _lock:
        return any(secret in text for secret in _secrets)


def _needs(text: str) -> bool:
    return _PARAM.search(text) is not None or holds_secret(text)


def _redact_record(record: logging.LogRecord) -> None:
    try:
        message = record.getMessage()
    except Exception:  # a malformed record: logging reports it itself, unchanged
        return
    if _needs(message):
        record.msg, record.args = redact(message), None
    if record.exc_info and record.exc_info[1] is not None:
        text = "".join(traceback.format_exception(*record.exc_info)).rstrip("\n")
        if _needs(text):
            record.exc_text = redact(text)


def install() -> None:
    """Wraps the process's log record factory with the redaction, once."""
    global _installed
    with _lock:
        if _installed:
            return
        previous = logging.getLogRecordFactory()

        def factory(*args, **kwargs):
            record = previous(*args, **kwargs)
            _redact_record(record)
            return record

        logging.setLogRecordFactory(factory)
        _installed = True


class SecretFilter(logging.Filter):
    """A logger's filter that rewrites a record's message and traceback text with the
    registered secrets and every secret-named entry replaced by ``<redacted>``; never drops
    a record."""

    def redact(self, text: str) -> str:
        """``text`` with secret-named entries and registered secrets redacted."""
        return _ENTRY.sub(lambda m: m.group(1) + REDACTED, redact(text))

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


def quiet_py4j() -> None:
    """Keeps Py4J's DEBUG lines out of the logs: they dump every command sent to the JVM,
    settings and pickled task closures included (and with them a run's secrets). Its logger
    goes to INFO unless its level was set on purpose."""
    py4j = logging.getLogger("py4j")
    if py4j.level == logging.NOTSET:
        py4j.setLevel(logging.INFO)


# ----------------------------------------------------------------------------- TensorFlowOnSpark

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
_tfos_lock = threading.Lock()


def protect_tensorflowonspark_logs(*secrets: bytes | str | None) -> None:
    """Installs the redaction on TensorFlowOnSpark's loggers and the root logger (once per
    process), registers ``secrets`` with it, and sets TensorFlowOnSpark's loggers to WARNING
    unless sparktf logs at DEBUG or their level was set on purpose; Py4J's goes to INFO. Safe
    to call again (each run, each task)."""
    quiet_py4j()  # its DEBUG lines dump the task closures, secrets included
    add_secret(*secrets)
    debug = logging.getLogger("sparktf").isEnabledFor(logging.DEBUG)
    with _tfos_lock:
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
