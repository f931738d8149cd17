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

:func:`run_node` is what each task of the run's barrier stage runs (in place of
TensorFlowOnSpark's ``TFSparkNode.run``, through TensorFlowOnSpark's public parts only: its
``TFManager`` and its executor-id file): it starts the executor's manager (the queues of the
``spark`` input mode, on a Unix socket: only this host's feeding tasks reach it), registers
the node with the driver's authenticated reservation server
(:class:`~sparktf.train.wire.reservation.AuthClient`), and runs :func:`tfos_main`: in the
task itself, or, for a node that Spark feeds (``spark`` input mode), in a process of its own
while the task returns and leaves the executor's slot to the feeding tasks.

A TensorFlow process the task runs itself is started *before* its node joins
(:func:`start_early`, CPU runs): it imports TensorFlow while the node registers and gathers
the cluster, and gets its spec once the node knows it (an all-reduce run from files reached
its first step 1.7 s sooner in bench/train.py: 1.08 s against 2.74 s over plain Keras).
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sparktf import scratch
from sparktf.errors import SparktfError
from sparktf.ports import server_port
from sparktf.security.redact import protect_tensorflowonspark_logs
from sparktf.train.feed.chunks import remove_feed_dirs
from sparktf.train.plan import ProcessSpec
from sparktf.train.process.main import EARLY, EXIT_ABORTED, preloads, runtime_env
from sparktf.train.wire.control import ControlClient, issued_token, keep_issued_token
from sparktf.train.wire.reservation import AuthClient, route_to

__all__ = [
    "QUEUES",
    "NodeContext",
    "NodeFailed",
    "NodeSetup",
    "join_cluster",
    "read_error_file",
    "run_child",
    "run_node",
    "start_process",
    "tfos_main",
]

log = logging.getLogger("sparktf.train.process.launcher")


QUEUES = ("input",)  # each node's manager queues: the spark input mode's chunks


class NodeFailed(SparktfError, RuntimeError):
    """A TensorFlow process of the run failed; the message carries its error."""


@dataclass(frozen=True)
class NodeSetup:
    """What every task of one bring-up receives, inside its Spark task closure.

    ``template`` maps TensorFlowOnSpark's node roles (``chief``, ``worker``, ``ps``) to
    executor ids; ``fed``: the ``spark`` input mode, where every node but the ``ps`` ones
    is fed by Spark and runs behind its task."""

    secret: bytes
    server_addr: tuple[str, int]
    template: dict[str, list[int]]
    spec: ProcessSpec
    num_gpus: int = 0
    fed: bool = False


@dataclass
class NodeContext:
    """One node of the run on this executor, once registered (what :func:`tfos_main` reads,
    as TensorFlowOnSpark's ``TFNodeContext`` has it)."""

    executor_id: int
    job_name: str
    task_index: int
    mgr: Any  # the executor's TFManager
    authkey: bytes  # its key
    cluster_info: list[dict]


# This Python worker's node manager: feeding tasks of later stages reach it through the
# executor-id file; a reused worker drops an earlier run's (its process ends with it).
_MANAGER: list[Any] = []


def join_cluster(setup: NodeSetup, executor_id: int) -> NodeContext:
    """Starts this executor's manager, registers the node with the driver's reservation
    server and waits until every node has: the node's context.

    Raises:
        ReservationError: the server refused the node or its answers could not be used.
        OSError: the server could not be reached.
    """
    from tensorflowonspark import TFManager, util

    protect_tensorflowonspark_logs(setup.secret)
    job_name, task_index = node_role(setup, executor_id)
    util.write_executor_id(executor_id)  # where a feeding task learns its node
    authkey = os.urandom(16)
    _MANAGER[:] = [TFManager.start(authkey, list(QUEUES), "local")]  # a Unix socket
    mgr = _MANAGER[0]
    mgr.set("state", "running")
    port = tensorflow_port()  # the TensorFlow server's (it listens on every interface)
    node = {
        "executor_id": executor_id,
        "host": route_to(*setup.server_addr),  # the address that reaches the driver
        "job_name": job_name,
        "task_index": task_index,
        "port": port,
        "tb_pid": 0,
        "tb_port": 0,
        "addr": mgr.address,
        "authkey": authkey,
    }
    keep_issued_token(None)  # a reused worker: nothing of an earlier run's node
    barrier = _barrier_context()
    node["executor"] = spark_executor(barrier)
    client = AuthClient(setup.server_addr, secret=setup.secret)
    try:
        client.register(node, gathers=barrier is not None)
        if barrier is None:  # not a barrier task (a test): ask the driver until all are in
            cluster_info = client.await_reservations()
    finally:
        client.close()  # the driver's server is not held while the others register
    if barrier is not None:
        cluster_info = gather_cluster(barrier, node)
    return NodeContext(executor_id, job_name, task_index, mgr, authkey, cluster_info)


def node_role(setup: NodeSetup, executor_id: int) -> tuple[str, int]:
    """TensorFlowOnSpark's role of the node of ``executor_id`` and its index in the role."""
    return next(
        (role, ids.index(executor_id)) for role, ids in setup.template.items() if executor_id in ids
    )


def _barrier_context():
    """This task's ``BarrierTaskContext`` when it runs in a barrier stage, else None."""
    from pyspark import BarrierTaskContext, TaskContext

    task = TaskContext.get()
    return BarrierTaskContext.get() if isinstance(task, BarrierTaskContext) else None


def spark_executor(barrier) -> str | None:
    """The Spark executor this barrier task runs in, as Spark's scheduler names its address
    (``host:port``, one per executor JVM); None outside a barrier stage."""
    if barrier is None:
        return None
    return barrier.getTaskInfos()[barrier.partitionId()].address


def gather_cluster(barrier, node: dict) -> list[dict]:
    """Every node of the run, learnt from the other barrier tasks (``allGather``, through
    Spark's own authenticated RPC) rather than from the driver: the start-up of N nodes
    costs the driver one short connection per node, not N held until the last registers.
    Each node's manager authkey stays out of it (only this node's own is kept): the nodes
    need each other's host and role, and the driver has every authkey from ``REG``."""
    public = {key: value for key, value in node.items() if key != "authkey"}
    nodes = [json.loads(text) for text in barrier.allGather(json.dumps(public))]
    return [node if n["executor_id"] == node["executor_id"] else n for n in nodes]


def run_node(setup: NodeSetup, executor_ids: Iterator[int]) -> None:
    """One barrier task of the bring-up: joins the cluster as the executor of
    ``executor_ids`` (the task's one element), then runs its TensorFlow process."""
    (executor_id,) = list(executor_ids)
    in_task = not setup.fed or node_role(setup, executor_id)[0] == "ps"
    # A process the task runs itself starts now and imports TensorFlow while the node
    # joins the cluster (CPU runs: the environment of its import is known already).
    early = start_early(setup.spec) if in_task else None
    try:
        ctx = join_cluster(setup, executor_id)
        _assign_gpus(setup.num_gpus, ctx)
    except BaseException:
        if early is not None:
            early.cancel()
        raise
    if in_task:
        tfos_main(setup, ctx, early)
        return
    import multiprocessing

    # The task returns and frees the executor's slot for the feeding tasks; the process
    # keeps the node, and a failure is told to the driver by run_child.
    process = multiprocessing.Process(target=tfos_main, args=(setup, ctx), daemon=False)
    process.start()


def _assign_gpus(num_gpus: int, ctx: NodeContext) -> None:
    """``CUDA_VISIBLE_DEVICES`` of the node's process: the GPUs Spark gave this task (at most
    ``num_gpus`` of them), else ``num_gpus`` free ones of this host (TensorFlowOnSpark's
    choice), else none."""
    from pyspark import TaskContext

    gpus: list[str] = []
    task = TaskContext.get()
    resources = task.resources() if task is not None else {}
    if "gpu" in resources:
        gpus = list(resources["gpu"].addresses)[: num_gpus or None]
    elif num_gpus > 0:
        from tensorflowonspark import gpu_info

        host = next(n["host"] for n in ctx.cluster_info if n["executor_id"] == ctx.executor_id)
        peers = [n["executor_id"] for n in ctx.cluster_info if n["host"] == host]
        index = peers.index(ctx.executor_id)  # this process's place among its host's
        gpus = gpu_info.get_gpus(num_gpus, index, format=gpu_info.AS_LIST)
        if len(gpus) < num_gpus:
            raise NodeFailed(f"executor {ctx.executor_id}: {num_gpus} GPU(s) asked, {gpus} free")
    os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)


def tensorflow_port() -> int:
    """The port of this executor's TensorFlow server: ``$TENSORFLOW_PORT`` when set (as
    TensorFlowOnSpark reads it; e.g. ``spark.executorEnv.TENSORFLOW_PORT``, for a firewall
    that opens one port), else a free port outside the kernel's ephemeral range
    (:func:`sparktf.ports.server_port`)."""
    pinned = os.environ.get("TENSORFLOW_PORT", "").strip()
    if not pinned:
        return server_port("")
    if not pinned.isdigit() or not 0 < int(pinned) < 65536:
        raise NodeFailed(f"TENSORFLOW_PORT must be a port number (1-65535), got {pinned!r}")
    return int(pinned)


def tfos_main(setup: NodeSetup, ctx: NodeContext, early: Early | None = None) -> None:
    """Starts this executor's TensorFlow process (or hands the early one its spec) and
    waits for it."""
    token = issued_token()  # the reservation server's answer to this node's registration
    if token is None:
        raise NodeFailed(f"executor {ctx.executor_id} received no control token")
    spec: ProcessSpec = setup.spec.for_node(
        f"executor-{ctx.executor_id}",
        executor_id=ctx.executor_id,
        mgr_address=ctx.mgr.address,
        mgr_authkey=ctx.authkey,
        control_token=token,
    )
    node = f"{ctx.job_name}:{ctx.task_index}"
    run_child(spec, label=f"on executor {ctx.executor_id} (node {node})", early=early)


def _spawn(error_file: str, env_extra: dict[str, str] | None = None) -> subprocess.Popen:
    """``python -m sparktf.train.process.main ERROR_FILE`` with a pipe for its spec; with
    ``env_extra`` an early process (:data:`~sparktf.train.process.main.EARLY`)."""
    env = dict(os.environ)
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    env.pop("TF_CONFIG", None)  # the child sets its own from the driver's plan
    argv = [sys.executable, "-m", "sparktf.train.process.main", error_file]
    if env_extra is not None:
        env.update(env_extra)
        argv.append(EARLY)
    return subprocess.Popen(argv, env=env, stdin=subprocess.PIPE)


def _send(child: subprocess.Popen, spec: ProcessSpec) -> None:
    """Hands ``child`` its spec (pickled on its stdin, which is then closed)."""
    try:
        child.stdin.write(pickle.dumps(spec))
        child.stdin.close()
    except BrokenPipeError:  # it died at once: its exit code tells
        pass


def start_process(spec: ProcessSpec, error_file: str) -> subprocess.Popen:
    """Starts ``python -m sparktf.train.process.main`` for ``spec`` (pickled on its stdin)."""
    child = _spawn(error_file)
    _send(child, spec)
    return child


_ERROR_FILE = "error.json"  # in a TensorFlow process's scratch directory


@dataclass
class Early:
    """A TensorFlow process started before its node joined the cluster (it imports
    TensorFlow meanwhile), in its scratch directory; :func:`run_child` hands it its spec."""

    child: subprocess.Popen
    tmp: str

    def cancel(self) -> None:
        """The node could not join: the process goes, and its scratch."""
        self.child.kill()
        self.child.wait()
        scratch.remove_dir(self.tmp)


def start_early(spec: ProcessSpec) -> Early | None:
    """The TensorFlow process of a node that is about to join, started now when its
    import does not depend on its role (:func:`~sparktf.train.process.main.preloads`)."""
    if not preloads(spec):
        return None
    scratch.sweep()
    tmp = scratch.make_dir("sparktf-node-")
    child = _spawn(os.path.join(tmp, _ERROR_FILE), runtime_env(spec, cpu_only=True))
    return Early(child, tmp)


def run_child(spec: ProcessSpec, *, label: str, early: Early | None = None) -> None:
    """Runs the TensorFlow process of ``spec`` (``early``: hands the process started
    before its spec was known) and waits; raises NodeFailed on failure.

    Scratch directories of processes that are gone (this run's earlier attempts, earlier
    runs) are swept before the process starts and after it has exited."""
    if early is None:
        scratch.sweep()
        tmp, child = scratch.make_dir("sparktf-node-"), None
    else:
        tmp, child = early.tmp, early.child
    error_file = os.path.join(tmp, _ERROR_FILE)
    try:
        if child is None:
            child = _spawn(error_file)
        _send(child, spec)
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
        err = read_error_file(error_file)
        if err is not None:
            detail = f"{err['type']}: {err['message']}\n{err['traceback']}"
            reported = bool(err.get("reported"))
        else:  # it died without a word (killed, out of memory): tell the driver now
            detail = (
                f"killed by signal {signal.Signals(-code).name} (out of memory?)"
                if code < 0
                else f"exited with code {code} without reporting an error"
            )
            if os.path.exists(error_file):
                detail += " (its error file could not be read)"
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


def read_error_file(path: str) -> dict | None:
    """The error a TensorFlow process wrote before it exited (``type``, ``message``,
    ``traceback``, ``reported``), or None when there is none or it cannot be read (cut short,
    not JSON, fields missing: logged), so that the exit code still tells what happened."""
    try:
        with open(path) as f:
            err = json.load(f)
        if all(isinstance(err.get(k), str) for k in ("type", "message", "traceback")):
            return err
        problem = "fields missing"
    except FileNotFoundError:
        return None
    except (OSError, ValueError, AttributeError) as exc:
        problem = f"{type(exc).__name__}: {exc}"
    log.warning("ignoring the unreadable error file %s (%s)", path, problem)
    return None


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
