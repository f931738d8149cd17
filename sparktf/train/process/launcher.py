"""The Spark task's side of a TensorFlow process: start it, wait for it, report its death.

:func:`tfos_main` is the function TensorFlowOnSpark runs on each executor (in the Spark
task for the ``files`` input mode, in TensorFlowOnSpark's background process for ``spark``).
It does not run TensorFlow itself: it starts a fresh interpreter (``python -m
sparktf.train.process.main ERROR_FILE``, its :class:`~sparktf.train.plan.ProcessSpec` pickled
on its standard input: a private pipe, no file) and waits for it. TensorFlow thus never lives
in a reused PySpark worker -- its gRPC server port, threads and memory go away with the
process -- and a crash of TensorFlow cannot take the Spark worker down with it.

Nothing is left behind by a process that could not clean up (SIGKILL, out of memory): the
Spark task removes the node's feed directories when the node exits, and sweeps this user's
scratch directories whose owner is gone (:func:`sparktf.scratch.sweep`) before it starts the
node and after the node has exited. The parameter servers that run on the driver
(``ps_on_driver``) are started the same way (:func:`start_process`).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import subprocess
import sys

from sparktf import scratch
from sparktf.errors import SparktfError
from sparktf.train.feed.chunks import remove_feed_dirs
from sparktf.train.plan import ProcessSpec
from sparktf.train.process.main import EXIT_ABORTED
from sparktf.train.wire.control import ControlClient, issued_token

__all__ = ["NodeFailed", "run_child", "start_process", "tfos_main"]

log = logging.getLogger("sparktf.train.process.launcher")


class NodeFailed(SparktfError, RuntimeError):
    """A TensorFlow process of the run failed; the message carries its error."""


def tfos_main(tf_args, ctx) -> None:
    """TensorFlowOnSpark's map function: start this executor's TensorFlow process, wait."""
    token = issued_token()  # the reservation server's answer to this node's registration
    if token is None:
        raise NodeFailed(f"executor {ctx.executor_id} received no control token")
    spec: ProcessSpec = tf_args.spec.for_node(
        f"executor-{ctx.executor_id}",
        executor_id=ctx.executor_id,
        mgr_address=ctx.mgr.address,
        mgr_authkey=bytes(ctx.mgr._authkey),
        control_token=token,
    )
    node = f"{ctx.job_name}:{ctx.task_index}"
    run_child(spec, label=f"on executor {ctx.executor_id} (TensorFlowOnSpark node {node})")


def start_process(spec: ProcessSpec, error_file: str) -> subprocess.Popen:
    """Starts ``python -m sparktf.train.process.main`` for ``spec`` (pickled on its stdin)."""
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.pop("TF_CONFIG", None)  # the child sets its own from the driver's plan
    child = subprocess.Popen(
        [sys.executable, "-m", "sparktf.train.process.main", error_file],
        env=env,
        stdin=subprocess.PIPE,
    )
    try:
        child.stdin.write(pickle.dumps(spec))
        child.stdin.close()
    except BrokenPipeError:  # it died at once: its exit code tells
        pass
    return child


def run_child(spec: ProcessSpec, *, label: str) -> None:
    """Runs the TensorFlow process of ``spec`` and waits; raises NodeFailed on failure.

    Scratch directories of processes that are gone (this run's earlier attempts, earlier
    runs) are swept before the process starts and after it has exited."""
    scratch.sweep()
    tmp = scratch.make_dir("sparktf-node-")
    try:
        error_file = os.path.join(tmp, "error.json")
        child = start_process(spec, error_file)
        try:
            code = child.wait()
        except BaseException:  # the Spark task is being killed: take the child with us
            child.kill()
            child.wait()
            raise
        finally:
            remove_feed_dirs(spec.token, spec.key)  # whatever became of the child
            scratch.sweep()  # its scratch, if it could not remove it itself
        if code == 0:
            return
        if code == EXIT_ABORTED:  # it left because the run was aborted elsewhere
            log.info("TensorFlow process %s left: the run was aborted", label)
            return
        if os.path.exists(error_file):
            with open(error_file) as f:
                err = json.load(f)
            detail = f"{err['type']}: {err['message']}\n{err['traceback']}"
            reported = bool(err.get("reported"))
        else:  # it died without a word (killed, out of memory): tell the driver now
            detail = (
                f"killed by signal {signal.Signals(-code).name} (out of memory?)"
                if code < 0
                else f"exited with code {code} without reporting an error"
            )
            reported = _report_death(spec, f"{label}, pid {child.pid}", detail)
        message = f"TensorFlow process {label} exited with code {code}: {detail}"
        if reported:
            # The driver has the error and aborts the run. Ending this task normally keeps
            # Spark from failing the stage and killing the other tasks' PySpark workers
            # (which would orphan TensorFlowOnSpark's processes in them).
            log.error("%s", message)
            return
        raise NodeFailed(message)
    finally:
        scratch.remove_dir(tmp)


def _report_death(spec: ProcessSpec, label: str, why: str) -> bool:
    try:
        ControlClient(spec.control_url, spec.control_token, spec.key).post(
            "error",
            {
                "type": "ProcessDied",
                "message": f"TensorFlow process {label}: {why}",
                "traceback": "",
            },
            timeout=5.0,
        )
        return True
    except Exception:  # the driver will notice the missing heartbeats
        return False
