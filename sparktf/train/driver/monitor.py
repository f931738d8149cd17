"""The driver's watch over a running cluster: progress, deadlines and failures.

:class:`RunMonitor` polls the control server until the chief is done, logging its progress
and evaluations. It fails the run (asks every process to abort, raises
:class:`~sparktf.train.errors.TrainingError` with the first cause) on

* an error a process reported (its message names the file, the record, what was expected;
  TensorFlow's ``/job:worker/task:0`` names are translated into roles and hosts);
* a failure one of its ``checks`` reports: a failed Spark job, a dead driver-side process;
* a process that never said hello within ``startup_timeout_s``, or whose heartbeats stopped
  for ``heartbeat_timeout_s``;
* no first training step within ``startup_timeout_s``, or a global step that stopped
  advancing for ``stall_timeout_s`` (:class:`ProgressWatch`).
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence

from sparktf.train.config import RunConfig
from sparktf.train.driver import roles as roles_lib
from sparktf.train.errors import TrainingError
from sparktf.train.plan import Role
from sparktf.train.wire.control import MAX_KEPT, ControlServer, NodeState

__all__ = [
    "FirstError",
    "ProgressWatch",
    "RunMonitor",
    "await_goodbyes",
    "format_progress",
]

log = logging.getLogger(__name__)

# A check of the run's other parts: given the monotonic time, a failure message or None.
Check = Callable[[float], "str | None"]


class FirstError:
    """The first error any process reported: the control server's ``on_event`` hook."""

    def __init__(self) -> None:
        self.value: tuple[str, dict] | None = None  # (process key, the error it reported)
        self._lock = threading.Lock()

    def record(self, key: str, event: str, data: dict) -> None:
        if event == "error":
            with self._lock:
                if self.value is None:
                    self.value = (key, data)


class RunMonitor:
    """Watches one started run; :meth:`wait` returns when it is done or raises when it fails.

    ``started`` is the monotonic time the run started (the start-up deadline counts from
    it); ``checks`` are asked on every poll, in order, after the processes' own errors.
    """

    def __init__(
        self,
        run: RunConfig,
        control: ControlServer,
        roles: dict[str, Role],
        *,
        started: float,
        first_error: FirstError,
        checks: Sequence[Check] = (),
        watch_steps: bool = True,
    ):
        self.run = run
        self.control = control
        self.roles = roles
        self.started = started
        self.first_error = first_error
        self.checks = list(checks)
        # the start-up and stall deadlines read the built-in loop's steps; a user's function
        # (sparktf.train.run) reports when it likes, so only its heartbeats are watched
        self.watch_steps = watch_steps

    def wait(self, *, all_nodes: bool = False) -> dict:
        """Blocks until the chief is done (returns its result) or the run fails.

        ``all_nodes``: wait until every process of the plan reported done; returns
        ``{key: result}``.

        Raises:
            TrainingError: the run failed (the message says which process and why); every
                process has been asked to abort.
        """
        chief_key = roles_lib.chief_key(self.roles)
        watch = ProgressWatch(self.run, roles_lib.training_keys(self.roles))
        last_log = 0.0
        logged_evals = logged_reports = 0
        while True:
            self.control.wait(0.5)
            now = time.monotonic()
            nodes = self.control.snapshot()
            chief = nodes[chief_key]  # its lists keep the last entries: read by number
            for evaluation in chief.evals.since(logged_evals):
                values = ", ".join(f"{k} {v:.4g}" for k, v in evaluation.items() if k != "step")
                log.info("evaluation at step %d: %s", evaluation["step"], values)
            for entry in chief.reports.since(logged_reports):
                values = ", ".join(f"{k} {v:.4g}" for k, v in entry["metrics"].items())
                saved = f" (checkpoint {entry['checkpoint']})" if entry.get("checkpoint") else ""
                wait = entry.get("input_wait")
                waited = f", input wait {wait:.0%}" if isinstance(wait, int | float) else ""
                log.info("report %d: %s%s%s", entry["n"], values, waited, saved)
            unlogged = chief.evals.dropped - logged_evals, chief.reports.dropped - logged_reports
            if max(unlogged) > 0:
                log.info(
                    "%d evaluations and %d reports were dropped before they were logged (the "
                    "driver keeps the last %d of each)",
                    *unlogged,
                    MAX_KEPT,
                )
            logged_evals, logged_reports = chief.evals.total, chief.reports.total
            self._check_errors(now)
            if all_nodes:
                if all(nodes[k].done is not None for k in self.roles if k in nodes):
                    return {k: nodes[k].done for k in self.roles}
            elif nodes[chief_key].done is not None:
                return nodes[chief_key].done
            self._check_alive(nodes, now)
            stalled = watch.update(nodes, chief_key, now) if self.watch_steps else None
            if stalled:
                self._fail(stalled)
            progress = nodes[chief_key].progress
            if (
                progress.get("step") is not None
                and self.watch_steps
                and now - last_log >= self.run.tracking.progress_every_s
            ):
                last_log = now
                log.info("%s", format_progress(progress))

    def _check_errors(self, now: float) -> None:
        """Fails the run on a process's error, then on what a check reports."""
        if self.first_error.value is not None:
            key, err = self.first_error.value
            self._fail(self.describe_error(key, err))
        for check in self.checks:
            message = check(now)
            if message:
                self._fail(message)

    def _check_alive(self, nodes: dict[str, NodeState], now: float) -> None:
        """Start-up deadline for processes that never said hello; heartbeats after that."""
        run = self.run
        silent_since_start = [
            k
            for k in self.roles
            if nodes[k].pid is None and now - self.started > run.failure.startup_timeout_s
        ]
        if silent_since_start:
            names = ", ".join(f"{self.roles[k].name} ({k})" for k in sorted(silent_since_start))
            self._fail(
                "the TensorFlow cluster did not start within "
                f"{run.failure.startup_timeout_s:.0f} s (FailureConfig.startup_timeout_s): "
                f"{names} never reached the driver (its executor busy, "
                "its Python environment broken, or the driver unreachable from it?)"
            )
        for key in self.roles:
            node = nodes[key]
            silent = now - node.last_seen
            if node.pid is not None and not node.bye and node.done is None:
                if silent > run.failure.heartbeat_timeout_s:
                    self._fail(
                        f"{self.roles[key].name} ({key}, pid {node.pid} on {node.host}) stopped "
                        f"responding {silent:.0f} s ago: its process died or hangs (out of "
                        "memory? killed? stopped?) or its executor was lost"
                    )

    def describe_error(self, key: str, err: dict) -> str:
        """One line for the error process ``key`` reported, naming the processes behind
        the TensorFlow task names in its message."""
        name = self.roles[key].name if key in self.roles else key
        message = f"{name} ({key}) failed: {err.get('type')}: {err.get('message')}"
        where = innermost_frame(err.get("traceback") or "")
        if where:
            message += f" (at {where})"
        nodes = self.control.snapshot()
        named = []
        for task, task_key in roles_lib.name_tf_tasks(message, self.roles):
            node = nodes[task_key]
            named.append(
                f"{task} is {self.roles[task_key].name} ({task_key}, pid {node.pid} on {node.host})"
            )
        return message + (f" [{'; '.join(named)}]" if named else "")

    def _fail(self, message: str) -> None:
        log.error("%s", message)
        self.control.request_abort(message)
        raise TrainingError(message)


_SPARKTF_DIR = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + "/"


def innermost_frame(traceback_text: str) -> str | None:
    """``FILE:LINE in FUNCTION`` of the innermost frame of a formatted traceback that is the
    user's code (not an installed package's, Python's, nor sparktf's own); None when there is
    none (an error of sparktf or a library names its place in its own message)."""
    frames = re.findall(r'^\s*File "([^"]+)", line (\d+), in (\S+)', traceback_text, re.M)
    library = ("site-packages", "dist-packages", "/lib/python", _SPARKTF_DIR)
    own = [f for f in frames if not any(part in f[0] for part in library)]
    if not own:
        return None
    path, line, function = own[-1]
    return f"{path}:{line} in {function}"


def await_goodbyes(control: ControlServer, keys: Sequence[str], deadline: float) -> None:
    """After a stop or an abort: waits until every process of ``keys`` said goodbye, failed,
    or fell silent (a dead process says nothing), or until ``deadline`` (monotonic)."""
    while time.monotonic() < deadline:
        nodes = control.snapshot()
        pending = [k for k in keys if not (nodes.get(k) and (nodes[k].bye or nodes[k].error))]
        alive = [
            k
            for k in pending
            if nodes.get(k) is not None and time.monotonic() - nodes[k].last_seen < 3.0
        ]
        if not alive:
            return
        time.sleep(0.2)


class ProgressWatch:
    """Start-up and stall deadlines over the training processes' reported global steps.

    Start-up lasts until the chief reports its first step (``startup_timeout_s`` from the
    start of the run); then the chief's step must advance within ``stall_timeout_s``. A
    stall names the training processes whose own step stopped advancing (all of them when
    none reports steps: the ps strategy's chief speaks for its workers).
    """

    def __init__(self, run: RunConfig, training_keys: list[str]):
        self.run = run
        self.keys = training_keys
        self.started = time.monotonic()
        self.seen: dict[str, tuple[int, float]] = {}  # key -> (step, when it last changed)

    def update(self, nodes: dict, chief_key: str, now: float) -> str | None:
        """Records the steps; returns a failure message once a deadline has passed."""
        for key in self.keys:
            step = nodes[key].progress.get("step")
            if step is not None and self.seen.get(key, (None,))[0] != step:
                self.seen[key] = (step, now)
        chief = nodes[chief_key].progress
        failure = self.run.failure
        if chief_key not in self.seen:
            if now - self.started <= failure.startup_timeout_s:
                return None
            waiting = ", ".join(f"{nodes[k].role} ({k})" for k in self.keys if k not in self.seen)
            return (
                f"the TensorFlow cluster did not start within {failure.startup_timeout_s:.0f} s "
                f"(FailureConfig.startup_timeout_s): no first training step yet from {waiting} "
                "(still building the model, restoring a checkpoint or reading the first batch)"
            )
        step, since = self.seen[chief_key]
        if now - since <= failure.stall_timeout_s or step >= chief.get("target", step + 1):
            return None
        stuck = [
            f"{nodes[k].role} ({k}, at step {self.seen[k][0] if k in self.seen else 'none'})"
            for k in self.keys
            if k not in self.seen or now - self.seen[k][1] > failure.stall_timeout_s
        ]
        return (
            f"no training progress for {now - since:.0f} s (FailureConfig.stall_timeout_s "
            f"{failure.stall_timeout_s:.0f}): the global step is stuck at {step}; processes "
            f"that stopped advancing: {', '.join(stuck)}"
        )


def format_progress(p: dict) -> str:
    """One log line of a process's progress report (step, epoch, metrics, rate, the share
    of its training time it waited for its input)."""
    parts = [f"step {p.get('step', 0)}/{p.get('target', '?')}", f"epoch {p.get('epoch', 0):.2f}"]
    for name in ("loss", "accuracy", "perplexity", "d_loss", "g_loss"):
        if name in p:
            parts.append(f"{name} {p[name]:.4g}")
    if "learning_rate" in p:
        parts.append(f"lr {p['learning_rate']:.3g}")
    if "examples_per_sec" in p:
        parts.append(f"{p['examples_per_sec']:.0f} examples/s")
    if "input_wait" in p:
        parts.append(f"input wait {p['input_wait']:.0%}")
    return ", ".join(parts)
