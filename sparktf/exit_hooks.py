"""Clean-ups that must run before a TensorFlow process exits, also when it is aborted.

:mod:`sparktf.train.process.main` leaves through ``os._exit`` (TensorFlow's own teardown can hang in
multi-worker runs), which skips ``atexit``; what a process must undo on the way out (a feed
reader's state on its executor) registers here, and the node runs it first.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["on_exit", "run_all"]

_HOOKS: list[Callable[[], None]] = []


def on_exit(fn: Callable[[], None]) -> None:
    """Registers ``fn()`` to run before this process exits (also when aborted)."""
    _HOOKS.append(fn)


def run_all() -> None:
    """Runs the registered clean-ups, newest first; a failing one does not stop the rest."""
    while _HOOKS:
        try:
            _HOOKS.pop()()
        except Exception:
            pass
