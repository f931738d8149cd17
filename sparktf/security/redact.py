"""The one redactor: no secret of sparktf's in any log line, at any level.

Two ways in, over one set of registered secrets (:func:`add_secret`, every form a secret
takes in a line: raw, hex, base64, the inside of a bytes ``repr``):

* :func:`install` wraps the log record factory of the process, so every record, of any logger
  and at any level, has its message and its traceback text redacted before a handler sees
  it: ``delegation=`` and ``token=`` query values (``urllib3`` logs each request's full URL at
  DEBUG, and WebHDFS URLs carry the token as ``delegation=...``) and the registered secrets;
* :data:`FILTER` (a :class:`SecretFilter`) goes further on the loggers that print whole
  dicts of secrets (TensorFlowOnSpark's, :mod:`sparktf.train.wire.tfos_logs`): the value of
  any ``authkey``, ``secret``, ``token`` or ``password`` entry (``'authkey': b'...'``,
  ``token=...``) is redacted too.

:func:`quiet_py4j` keeps Py4J's DEBUG lines, which dump the pickled task closures that carry
a run's secrets, out of the logs.
"""

from __future__ import annotations

import base64
import logging
import re
import threading
import traceback

__all__ = [
    "FILTER",
    "REDACTED",
    "SecretFilter",
    "add_secret",
    "install",
    "quiet_py4j",
    "redact",
    "secret_forms",
]

REDACTED = "<redacted>"
_PARAM = re.compile(r"(?i)\b((?:delegation|token)=)[^&\s'\"<>]+")
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


def _needs(text: str) -> bool:
    lowered = text.lower()
    return "delegation=" in lowered or "token=" in lowered or any(s in text for s in _secrets)


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
