"""The root of sparktf's exceptions.

Every error sparktf raises on purpose derives from :class:`SparktfError`, and also from the
built-in exception a Python caller would expect (``ValueError`` for bad input, ``OSError`` for
storage, ``RuntimeError`` for a failed run), so both ``except SparktfError`` and the usual
``except ValueError`` work::

    try:
        sparktf.predict(df, "hdfs:///models/mnist")
    except sparktf.SparktfError as err:
        log.error("sparktf failed: %s", err)
"""

from __future__ import annotations

__all__ = [
    "SparktfError",
    "SparktfRuntimeError",
    "SparktfTypeError",
    "SparktfValueError",
    "background_failure",
    "set_background_failure",
]

# A failure a background watch found (executors that cannot start): it explains the error
# the main thread sees next, such as "SparkContext was shut down".
_background: list[BaseException] = []


class SparktfError(Exception):
    """Base class of every exception sparktf defines."""


class SparktfValueError(SparktfError, ValueError):
    """A bad argument or bad input data, where no more specific sparktf error applies."""


class SparktfTypeError(SparktfError, TypeError):
    """An argument of the wrong type."""


class SparktfRuntimeError(SparktfError, RuntimeError):
    """A failure while running, where no more specific sparktf error applies."""


def set_background_failure(error: BaseException) -> None:
    """Records ``error``, found by a background thread, as the cause of what fails next."""
    _background[:] = [error]


def background_failure() -> BaseException | None:
    """The failure a background thread recorded, if any (``cli.run`` reports it)."""
    return _background[0] if _background else None
