"""Parameter servers that run as processes of the driver (``ScalingConfig.ps_on_driver``).

Each is ``python -m sparktf.train.process.main``
(:func:`sparktf.train.process.launcher.start_process`), told its
role through the control channel like any executor's process, with a private scratch
directory for its error file (``sparktf-ps-*``: a later run sweeps it when this one was
killed, :mod:`sparktf.scratch`). :meth:`DriverPs.failure` reports one that exited;
:meth:`DriverPs.stop` waits for them to leave after the run's stop or abort and kills what
does not.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time

from sparktf import scratch
from sparktf.train.driver import roles as roles_lib
from sparktf.train.plan import ProcessSpec, Role
from sparktf.train.process import launcher

__all__ = ["DriverPs"]

log = logging.getLogger(__name__)


class DriverPs:
    """The driver's own TensorFlow processes of one run (none unless ``ps_on_driver``)."""

    def __init__(self) -> None:
        self.processes: list[tuple[str, subprocess.Popen, str]] = []  # key, process, tmp dir
        self._names: dict[str, str] = {}

    def start(self, spec: ProcessSpec, keys: list[str], issue_token) -> None:
        """Starts a process for every key of ``keys``, each with its control token
        (``issue_token(key)``). A process asks the driver for its role (and imports
        TensorFlow meanwhile): it may start before the roles are assigned."""
        for key in keys:
            if not roles_lib.is_driver_key(key):
                raise ValueError(f"{key!r} is not a key of the driver's processes")
            tmp = scratch.make_dir("sparktf-ps-")  # swept by a later run if this one is killed
            own = spec.for_node(key, control_token=issue_token(key))
            proc = launcher.start_process(own, os.path.join(tmp, "error.json"))
            self.processes.append((key, proc, tmp))
            self._names[key] = key
            log.info("started %s on the driver (pid %d)", key, proc.pid)

    def name(self, roles: dict[str, Role]) -> None:
        """Names the processes by their roles (in the messages of :meth:`failure`)."""
        for key in self._names:
            if key in roles:
                self._names[key] = roles[key].name

    def failure(self, now: float | None = None) -> str | None:
        """A message naming a process that exited before the run ended, else None (a
        :class:`~sparktf.train.driver.monitor.RunMonitor` check)."""
        for key, proc, _ in self.processes:
            if proc.poll() is not None:
                return f"{self._names[key]} on the driver exited with code {proc.returncode}"
        return None

    def stop(self, deadline: float) -> None:
        """Waits for every process to exit until ``deadline`` (monotonic), kills those that
        do not, and removes their directories."""
        for key, proc, tmp in self.processes:
            try:
                proc.wait(timeout=max(0.5, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s on the driver did not exit; killing it", key)
                proc.kill()
                proc.wait()
            scratch.remove_dir(tmp)
