"""SIGTERM runs the fixtures' teardown, in the controller and in every test process.

A run stopped with SIGTERM (``timeout``, CI's time limit, ``kill``) must still stop what
its fixtures started: HDFS, YARN, the S3 store, the multi-host cluster. Python's default
for SIGTERM ends the process at once, with no teardown; here it raises
``KeyboardInterrupt``, on which pytest finishes the session and tears the fixtures down.

With pytest-xdist the fixtures live in the worker processes. A SIGTERM sent to the
controller alone (``kill PID``) used to leave them running: the controller tore its
workers down within execnet's 10 s and killed the rest. So the controller passes the
signal on to its own child processes (the workers) and goes on: each worker tears its
fixtures down (stopping the clusters its modules started takes seconds to a minute) and
reports its session interrupted, and the controller then ends the run as pytest ends an
interrupted one (exit code 2). A second SIGTERM to the controller ends it at once. A
process raises ``KeyboardInterrupt`` once: a second SIGTERM (``timeout`` signals the
whole process group, so a worker may get two) does not cut its teardown short.

Loaded by ``tests/conftest.py``; a plugin of its own (``-p tests.terminate``) so that
``tests/test_cleanup.py`` can check it on a pytest run of its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

import pytest


def children(pid: int) -> list[int]:
    """The live direct child processes of ``pid`` (from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            # after the command name (in parentheses, which may hold spaces): state, ppid
            fields = stat.read_text().rsplit(")", 1)[1].split()
            if int(fields[1]) == pid and fields[0] != "Z":
                found.append(int(stat.parent.name))
    return found


_config: pytest.Config | None = None
_signalled = False


def pytest_configure(config: pytest.Config) -> None:
    global _config
    _config = config


def _is_xdist_controller() -> bool:
    return _config is not None and _config.pluginmanager.has_plugin("dsession")


def _terminate(signum, frame):
    global _signalled
    first, _signalled = not _signalled, True
    if first and _is_xdist_controller():
        for pid in children(os.getpid()):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)
        return  # the workers end the session: see the module's docstring
    if first or _is_xdist_controller():
        raise KeyboardInterrupt(f"signal {signum}")


signal.signal(signal.SIGTERM, _terminate)
