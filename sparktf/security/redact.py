"""Keeps HDFS delegation tokens out of every log line.

``urllib3`` logs each request's full URL at DEBUG, WebHDFS URLs carry the token as
``delegation=...``, and an exception's text may repeat the URL. :func:`install` wraps the
log record factory of the process, so every record, of any logger and at any level, has its
message and its traceback text redacted before a handler sees it: ``delegation=`` and
``token=`` query values, and the values registered with :func:`add_secret`.
"""

from __future__ import annotations

import logging
import re
import threading
import traceback

__all__ = ["REDACTED", "add_secret", "install", "redact"]

REDACTED = "<redacted>"
_PARAM = re.compile(r"(?i)\b((?:delegation|token)=)[^&\s'\"<>]+")
_secrets: set[str] = set()
_lock = threading.Lock()
_installed = False


def add_secret(value: str) -> None:
    """Redacts ``value`` wherever it appears in a log record from now on (and installs the
    redaction)."""
    if value:
        with _lock:
            _secrets.add(value)
        install()


def redact(text: str) -> str:
    """``text`` with delegation tokens and registered secrets replaced by ``<redacted>``."""
    for secret in list(_secrets):
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
