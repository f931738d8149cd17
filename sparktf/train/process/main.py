"""One TensorFlow process of a run: ``python -m sparktf.train.process.main ERROR_FILE``.

Started by :mod:`sparktf.train.process.launcher` (in a Spark task, or on the driver for its
parameter servers), with its :class:`~sparktf.train.plan.ProcessSpec` pickled on its standard
input (a private pipe). :func:`main`:

1. says hello to the driver's control server and gets its plan: its role (``chief``,
   ``worker`` or ``ps``), its index and the TF cluster (:class:`~sparktf.train.plan.Role`,
   through :mod:`sparktf.train.wire.control`);
2. starts a heartbeat thread that exits the process at once when the driver aborts the run,
   becomes unreachable, or the parent Spark task goes away (and asks the kernel to kill it
   if the parent dies: ``PR_SET_PDEATHSIG``);
3. runs its role: a ``ps`` task, or a ``worker`` under the ``ps`` strategy, serves its
   ``tf.distribute.Server`` until the driver says stop (no ``Server.join()`` that never
   returns); the chief and the all-reduce workers train (:mod:`sparktf.train.process.trainer`);
4. reports ``done`` or ``error`` (with the exception and the end of its traceback) and
   exits through ``os._exit`` (TensorFlow's own teardown can hang in multi-worker runs),
   after the clean-ups of :mod:`sparktf.exit_hooks` (its scratch and feed directories among
   them) on every exit path, the driver's abort included. Its exit code tells the launcher:
   0 done, :data:`EXIT_ABORTED` left because the run was aborted elsewhere, else failed (the
   error in ``ERROR_FILE``).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import sys
import threading
import time
import traceback

from sparktf import exit_hooks
from sparktf.train.plan import ProcessSpec, Role
from sparktf.train.process import milestones  # its import marks the start ("launched")
from sparktf.train.wire.control import ControlClient

__all__ = [
    "EARLY",
    "EXIT_ABORTED",
    "consume_feed",
    "error_summary",
    "exit_process",
    "main",
    "preloads",
    "runtime_env",
    "serve",
]

log = logging.getLogger("sparktf.train.process.main")

EXIT_ABORTED = 3
# ``python -m sparktf.train.process.main ERROR_FILE --early``: started by a Spark task before
# its node has joined the cluster, with the runtime's environment already set
# (:func:`runtime_env`); it imports TensorFlow while it waits for its spec on stdin.
EARLY = "--early"


def error_summary(exc: BaseException, *, tail: int = 12) -> dict:
    """Type, message and the last lines of the traceback of ``exc``."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    lines = text.rstrip().splitlines()
    return {
        "type": type(exc).__name__,
        "message": str(exc).strip()[:4000],
        "traceback": "\n".join(lines[-tail * 2 :]),
    }


def _set_process_name(name: str) -> None:
    """Shows the role in ``ps``/``top`` (``/proc/PID/comm``, 15 characters)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(15, f"tf-{name}".encode()[:15], 0, 0, 0)  # PR_SET_NAME
    except Exception:  # not Linux: cosmetic only
        pass


def _die_with_parent() -> None:
    """Asks Linux to SIGKILL this process when its parent dies."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except Exception:  # not Linux: the heartbeat's parent check still applies
        pass


def exit_process(code: int) -> None:
    """Leaves this process at once with ``code`` (``os._exit``: TensorFlow's teardown can
    hang), after the clean-ups registered in :mod:`sparktf.exit_hooks` (feed and
    scratch directories) and a flush of the standard streams and the logs."""
    exit_hooks.run_all()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    logging.shutdown()
    os._exit(code)


def serve(role: Role, control) -> None:
    """A ps task, or a worker of the ps strategy: serve until the driver says stop."""
    import tensorflow as tf

    cluster = tf.train.ClusterSpec(role.cluster)
    server = tf.distribute.Server(
        cluster, job_name=role.role, task_index=role.index, protocol="grpc", start=True
    )
    log.info("%s serving at %s", role.name, server.target)
    control.set_progress(
        {
            "serving": server.target.decode()
            if isinstance(server.target, bytes)
            else str(server.target)
        }
    )
    control.wait_for_stop()
    log.info("%s: run over, exiting", role.name)


def consume_feed(spec: ProcessSpec, role: Role, control) -> dict:
    """Reads the whole feed and drops it (measures the spark input mode alone)."""
    from sparktf.train.process import inputs

    started = time.time()
    source = inputs.open_batches(spec, role, control, spec.plan.per_process_batch)
    rows, first = 0, None
    for b in source.batches:
        rows += len(next(iter(b.values())))
        first = first or time.time()
    source.close("done")
    return {
        "rows": rows,
        "started": started,
        "first_batch": first,
        "ended": time.time(),
        "wait_s": getattr(source.reader, "wait_s", None),
    }


def main(argv: list[str]) -> None:
    error_file = argv[1]
    _die_with_parent()
    early = None
    if EARLY in argv[2:]:  # started before its node joined: import while the spec comes
        early = _import_in_thread()
    try:
        spec: ProcessSpec = pickle.load(sys.stdin.buffer)
    except EOFError:  # the node gave up before it had a spec (its task failed)
        os._exit(EXIT_ABORTED)
    logging.basicConfig(
        level=spec.plan.log_level,
        stream=sys.stderr,
        format=f"%(asctime)s %(levelname)s [{spec.key}] %(name)s: %(message)s",
    )
    for noisy in ("tensorflow", "absl", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    preload = early or _preload_tensorflow(spec)

    control = ControlClient(
        spec.control_url, spec.control_token, spec.key, driver_lost_s=spec.driver_lost_s
    )
    done = threading.Event()

    def on_abort(reason: str) -> None:
        if done.is_set():
            return
        log.error("%s; exiting", reason)
        exit_process(EXIT_ABORTED)

    try:
        role = Role.from_dict(control.hello(spec.startup_timeout_s))
        milestones.mark("joined")
        log.info("role %s in %s (python %s)", role.name, json.dumps(role.cluster), sys.executable)
        _set_process_name(role.name)
        control.start_heartbeat(on_abort)
        _configure_process(spec, role)
        if preload is not None:
            preload.join()
            milestones.mark("tensorflow_imported")
        if not role.trains:
            serve(role, control)
        elif spec.plan.function is not None:  # sparktf.train.run: the user's function
            from sparktf.train.process.function import run_function

            control.send("done" if role.is_chief else "finished", run_function(spec, role, control))
            if not role.is_chief:
                control.wait_for_stop()
        elif spec.consume_only:  # bench/feed.py: the feed without TensorFlow
            control.send("done" if role.is_chief else "finished", consume_feed(spec, role, control))
            control.wait_for_stop()
        else:
            from sparktf.train.process.trainer import Trainer

            if spec.plan.custom_model is not None:  # a model registered in the driver
                from sparktf.models import custom

                log.info(
                    "installed the driver's model %s",
                    custom.install_payload(spec.plan.custom_model),
                )
            # the trainer lives until the process exits (os._exit: nothing is torn down)
            trainer = Trainer(spec, role, control)
            result = trainer.run().to_dict()
            control.send("done" if role.is_chief else "finished", result)
            if not role.is_chief:
                # Stay until the chief has finished too: a multi-worker process that leaves
                # early can fail the chief's last collective or coordination heartbeat.
                control.wait_for_stop()
        done.set()
        control.send("bye")
        exit_process(0)
    except BaseException as exc:  # report, then exit non-zero: the Spark task fails with it
        err = error_summary(exc)
        log.error("failed: %s: %s\n%s", err["type"], err["message"], err["traceback"])
        done.set()
        err["reported"] = control.send("error", err, attempts=2) is not None
        try:  # written whole, then renamed: the launcher never reads half of it
            with open(error_file + ".tmp", "w") as f:
                json.dump(err, f)
            os.replace(error_file + ".tmp", error_file)
        except OSError:
            pass
        exit_process(1)


def _preload_tensorflow(spec: ProcessSpec) -> threading.Thread | None:
    """Starts importing TensorFlow in a thread while the process waits for its role, when
    the environment TensorFlow's import sees is the same for every role (CPU only: it is
    then set here, see :func:`_configure_runtime`); None otherwise, and in a process that
    only reads the feed. The caller joins the thread before importing anything itself."""
    if not preloads(spec):
        return None
    _configure_runtime(spec, cpu_only=True)
    return _import_in_thread()


def preloads(spec: ProcessSpec) -> bool:
    """Whether a process of ``spec`` imports TensorFlow before it knows its role: CPU runs
    that train (not a process that only reads the feed)."""
    return not (spec.consume_only or spec.plan.scaling.gpus_per_worker)


def runtime_env(spec: ProcessSpec, *, cpu_only: bool) -> dict[str, str]:
    """The environment of the TensorFlow runtime that does not depend on the role (an
    early process gets it from its launcher, see :data:`EARLY`)."""
    env = {"CUDA_VISIBLE_DEVICES": ""} if cpu_only else {}
    threads = spec.plan.scaling.threads_per_worker
    if threads:
        env["OMP_NUM_THREADS"] = os.environ.get("OMP_NUM_THREADS", str(threads))
        env["TF_NUM_INTRAOP_THREADS"] = str(threads)
    return env


def _import_in_thread() -> threading.Thread:
    """Imports TensorFlow in a thread (the caller joins it before it imports anything)."""

    def load() -> None:
        try:
            import tensorflow  # noqa: F401 (the import is the point)
        except BaseException as exc:  # the main thread's own import reports it
            log.debug("preloading TensorFlow failed: %s", exc)

    thread = threading.Thread(target=load, name="sparktf-import-tensorflow", daemon=True)
    thread.start()
    return thread


def _configure_runtime(spec: ProcessSpec, *, cpu_only: bool) -> None:
    """The environment of the TensorFlow runtime that does not depend on the role."""
    os.environ.update(runtime_env(spec, cpu_only=cpu_only))


def _configure_process(spec: ProcessSpec, role: Role) -> None:
    """Environment of the TensorFlow runtime, set before TensorFlow is imported (or, when
    it was preloaded, before it initializes its devices and reads ``TF_CONFIG``)."""
    scaling = spec.plan.scaling
    cpu_only = role.role == "ps" or scaling.gpus_per_worker == 0
    if not cpu_only:  # processes that share a GPU must not each take all of its memory
        os.environ.setdefault("TF_FORCE_GPU_ALLOW_GROWTH", "true")
    _configure_runtime(spec, cpu_only=cpu_only)  # CPU only: ps tasks never take a GPU
    cluster = {k: v for k, v in role.cluster.items() if v}
    os.environ["TF_CONFIG"] = json.dumps(
        {"cluster": cluster, "task": {"type": role.role, "index": role.index}}
    )


if __name__ == "__main__":
    main(sys.argv)
