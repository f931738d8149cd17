"""The driver's side of a run: bring the TensorFlow cluster up on Spark, feed it, watch it,
take it down.

Layout (one TensorFlow process per Spark executor, placed by TensorFlowOnSpark):

* ``allreduce``: TensorFlowOnSpark nodes ``chief:0`` and ``worker:0..N-2``, one per executor;
  they are the N all-reduce workers.
* ``ps``: TensorFlowOnSpark's ``chief`` is the coordinator. The workers (and the parameter
  servers, unless ``ps_on_driver``) are started as TensorFlowOnSpark *ps* nodes: such a node
  keeps its executor busy for the whole run (so feeding tasks only land on the chief's
  executor), runs in a background process, and is stopped by the driver through its
  control queue at the end. The driver maps TensorFlowOnSpark's roles to TensorFlow's
  (first the workers, then the parameter servers) and hands every process its role and the
  TF cluster through the control channel. With ``ps_on_driver`` the parameter servers are
  processes of the driver (two executors then hold chief + one worker).

Stop: the chief reports ``done`` after its final checkpoint and export; the driver then
sets ``stop`` and every other process (parameter servers and ps-workers serving their
``tf.distribute.Server``, all-reduce workers waiting at the end) exits; TensorFlowOnSpark's
ps nodes get their control message; nothing waits in ``Server.join()``.

Failure: a process's exception reaches the driver through the control channel at once (with
its message: a corrupt file names the file); a process that dies silently is noticed when
its heartbeats stop (``RunConfig.heartbeat_timeout_s``); a failed Spark job (TensorFlowOnSpark's
start job, the feed) is noticed from its thread. The driver then aborts the run: every
TensorFlow process exits within a second or two, feeding tasks fail fast, and
:class:`TrainingError` carries the first error. Spark tasks are not killed (a killed PySpark
worker would orphan TensorFlowOnSpark's processes); they end because the processes they
wait for end.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from collections import Counter

import sparktf.train.feed as feed_lib
from sparktf import spark as spark_lib
from sparktf import storage
from sparktf.train import node
from sparktf.train.config import ConfigError, TrainingError
from sparktf.train.control import ControlServer
from sparktf.train.plan import ProcessSpec, Role, RunPlan

log = logging.getLogger(__name__)
_TF_TASK = re.compile(r"/job:(chief|worker|ps)/(?:replica:\d+/)?task:(\d+)")


class _GuardedContext:
    """The SparkContext as TensorFlowOnSpark sees it: its ``stop()`` and ``cancelAllJobs()``
    (called on a failure during start-up, before ``sys.exit``) are recorded, not executed --
    the run owns neither the session nor other jobs. With a ``startup``
    (:func:`sparktf.train.reservation.authenticated_startup`), the node RDD it parallelizes
    runs TensorFlowOnSpark's node function with the authenticated reservation client."""

    def __init__(self, sc, startup=None):
        self._sc = sc
        self._startup = startup
        self.requested: list[str] = []

    def parallelize(self, c, numSlices=None):  # noqa: N803 (SparkContext API)
        rdd = self._sc.parallelize(c, numSlices)
        return rdd if self._startup is None else self._startup.wrap(rdd)

    def stop(self):
        self.requested.append("stop")

    def cancelAllJobs(self):  # noqa: N802 (SparkContext API)
        self.requested.append("cancelAllJobs")

    def __getattr__(self, name):
        return getattr(self._sc, name)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class ClusterRun:
    """One run's TensorFlow cluster. Use as a context manager: ``with ClusterRun(...) as c:
    result = c.start().wait()``; leaving the block always takes everything down."""

    def __init__(self, spark, plan: RunPlan, *, feed_df=None, consume_only: bool = False):
        self.spark = spark
        self.sc = spark.sparkContext
        self.plan = plan
        self.train, self.scaling, self.run = plan.train, plan.scaling, plan.run
        self.feed_df = feed_df  # a DataFrame to feed instead of the dataset's Parquet
        self.consume_only = consume_only  # bench/feed.py: the processes only read the feed
        self.spec: ProcessSpec | None = None
        self.control: ControlServer | None = None
        self.tfos = None
        self.roles: dict[str, Role] = {}
        self.driver_ps: list[tuple[str, subprocess.Popen, str]] = []
        self.feed_thread: threading.Thread | None = None
        self.feed_error: BaseException | None = None
        self.fed = Counter()  # feed chunks per node key
        self.fed_rows_by = Counter()  # rows per node key
        self.fed_rows = 0
        self.feed_started_wall: float | None = None
        self.started_wall = time.time()
        self._first_error: tuple[str, dict] | None = None
        self._error_lock = threading.Lock()
        self._tfos_status: dict | None = None
        self._tfos_error_seen: float | None = None
        self._started = time.monotonic()
        self._jobs_before: set[int] = set()
        self._closing = False
        self.feed_group = f"sparktf-feed-{uuid.uuid4().hex[:8]}"

    # -- start --------------------------------------------------------------------------

    def __enter__(self) -> ClusterRun:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(
            failed=exc is not None, reason=f"{type(exc).__name__}: {exc}" if exc is not None else ""
        )

    def _on_event(self, key: str, event: str, data: dict) -> None:
        if event == "error":
            with self._error_lock:
                if self._first_error is None:
                    self._first_error = (key, data)

    def start(self) -> ClusterRun:
        # Lazy: importing tensorflowonspark runs logging.basicConfig(level=INFO).
        from tensorflowonspark import TFCluster

        from sparktf.train import reservation

        scaling, run = self.scaling, self.run
        tfos_log = logging.getLogger("tensorflowonspark")
        if tfos_log.level == logging.NOTSET and not log.isEnabledFor(logging.DEBUG):
            tfos_log.setLevel(logging.WARNING)  # its INFO lines include the managers' authkeys
        try:
            spark_lib.wait_for_executors(
                self.sc, scaling.num_executors, min(run.startup_timeout_s, 120.0)
            )
        except spark_lib.ExecutorCountError as exc:
            raise ConfigError(str(exc)) from None
        address = reservation.driver_address(self.sc)  # loopback on the local profile
        self.control = ControlServer(
            address.advertise, bind_host=address.bind, on_event=self._on_event
        )
        self.spec = ProcessSpec(
            plan=self.plan,
            control_url=self.control.url,
            token=self.control.token,
            driver_lost_s=max(30.0, run.failure_timeout_s / 2),
            startup_timeout_s=run.startup_timeout_s,
            consume_only=self.consume_only,
        )
        tfos_ps = (
            scaling.num_workers + (0 if scaling.ps_on_driver else scaling.num_ps)
            if scaling.strategy == "ps"
            else 0
        )
        input_mode = (
            TFCluster.InputMode.SPARK
            if self.train.input_mode == "spark"
            else TFCluster.InputMode.TENSORFLOW
        )
        TFCluster.tf_status.clear()  # module-global: a previous run's error must not leak in
        self._tfos_status = TFCluster.tf_status
        tracker = self.sc.statusTracker()
        self._jobs_before = set(tracker.getActiveJobsIds())
        log.info(
            "starting TensorFlow on %d executors (%s; input mode %s)",
            scaling.num_executors,
            scaling.describe(),
            self.train.input_mode,
        )
        try:
            # TensorFlowOnSpark's reservation exchange, authenticated (no pickle from the
            # network) and bound to the driver's address; its server stops with the block
            # on a failure, else once every node has the cluster.
            with reservation.authenticated_startup(address) as auth:
                self.tfos = TFCluster.run(
                    sc=_GuardedContext(self.sc, auth),
                    map_fun=node.tfos_main,
                    # a namespace: TensorFlowOnSpark tests `'num_gpus' in tf_args` and reads
                    # tf_args.num_gpus (a dict or None crashes in _get_gpus)
                    tf_args=argparse.Namespace(num_gpus=scaling.gpus_per_worker, spec=self.spec),
                    num_executors=scaling.num_executors,
                    num_ps=tfos_ps,
                    tensorboard=False,
                    input_mode=input_mode,
                    master_node="chief",
                    reservation_timeout=int(run.startup_timeout_s),
                    release_port=True,
                )
        except SystemExit:
            raise TrainingError(
                "TensorFlowOnSpark could not start the cluster: "
                f"{self._tfos_status.get('error', 'unknown error')}"
            ) from None
        except Exception as exc:  # e.g. "timed out waiting for reservations to complete"
            raise TrainingError(
                "TensorFlowOnSpark could not start the cluster within "
                f"{run.startup_timeout_s:.0f} s (startup_timeout_s): {type(exc).__name__}: {exc}"
            ) from None
        self.roles = self._assign_roles(self.tfos.cluster_info, address.advertise)
        self._start_driver_ps()
        self.control.publish_plans(
            {key: {**role.to_dict(), "name": role.name} for key, role in self.roles.items()}
        )
        for key, role in sorted(self.roles.items(), key=lambda kv: kv[1].name):
            log.info("  %-9s %s", role.name, key)
        if self.train.input_mode == "spark":
            self.feed_thread = threading.Thread(target=self._feed, name="sparktf-feed", daemon=True)
            self.feed_thread.start()
        return self

    def _assign_roles(self, cluster_info: list[dict], driver_host: str) -> dict[str, Role]:
        """TensorFlow roles for TensorFlowOnSpark's nodes (ps strategy: its ps nodes are
        first the workers, then the parameter servers) and the driver's ps processes."""
        scaling = self.scaling
        roles: dict[str, tuple[str, int]] = {}
        addresses: dict[str, str] = {}
        for info in cluster_info:
            key = f"executor-{info['executor_id']}"
            addresses[key] = f"{info['host']}:{info['port']}"
            job, index = info["job_name"], int(info["task_index"])
            if job == "chief":
                roles[key] = ("chief", 0)
            elif scaling.strategy == "allreduce" or index < scaling.num_workers:
                roles[key] = ("worker", index)
            else:
                roles[key] = ("ps", index - scaling.num_workers)
        if scaling.strategy == "ps" and scaling.ps_on_driver:
            for i in range(scaling.num_ps):
                key = f"driver-ps-{i}"
                roles[key] = ("ps", i)
                addresses[key] = f"{driver_host}:{_free_port()}"
        cluster: dict[str, list[str]] = {"chief": [], "worker": [], "ps": []}
        for key, (role, _) in sorted(roles.items(), key=lambda kv: kv[1]):
            cluster[role].append(addresses[key])
        cluster = {k: v for k, v in cluster.items() if v}
        self.tfos_nodes = {f"executor-{n['executor_id']}": n for n in cluster_info}
        return {
            key: Role(
                key=key,
                role=role,
                index=index,
                strategy=scaling.strategy,
                num_workers=scaling.num_workers,
                cluster=cluster,
            )
            for key, (role, index) in roles.items()
        }

    def _start_driver_ps(self) -> None:
        for key, role in self.roles.items():
            if not key.startswith("driver-"):
                continue
            tmp = tempfile.mkdtemp(prefix="sparktf-ps-")
            proc = node.start_process(self.spec.for_node(key), os.path.join(tmp, "error.json"))
            self.driver_ps.append((key, proc, tmp))
            log.info("started %s on the driver (pid %d)", role.name, proc.pid)

    # -- feeding ------------------------------------------------------------------------

    def feeding_keys(self) -> list[str]:
        return [k for k, r in self.roles.items() if not k.startswith("driver-") and r.trains]

    def _await_hello(self, keys: list[str]) -> None:
        """Returns once every feeding process has said hello (before it imports TensorFlow),
        or at the start-up deadline (the watchdog reports a process that never does): the
        feed job's tasks then do not sit on executor cores waiting for a process that is
        still starting."""
        deadline = time.monotonic() + self.run.startup_timeout_s
        while not self.control.stop and not self.control.abort:
            nodes = self.control.snapshot()
            if all(k in nodes and nodes[k].pid for k in keys) or time.monotonic() > deadline:
                return
            self.control.wait(0.1)

    def _feed(self) -> None:
        """Feeds ``feed_passes`` passes over the split (None: until the run stops)."""
        try:
            self.sc.setJobGroup(
                self.feed_group, "sparktf: feed rows to TensorFlow", interruptOnCancel=False
            )
            data = self.plan.data
            df = (
                self.feed_df
                if self.feed_df is not None
                else self.spark.read.parquet(storage.spark_uri(data.parquet))
            )
            df = df.select(*data.names)
            keys = self.feeding_keys()
            partitions = df.rdd.getNumPartitions()
            if partitions < 2 * len(keys):
                df = df.repartition(2 * len(keys))
            nodes = {}
            for key in keys:
                n = self.tfos_nodes[key]
                nodes[int(n["executor_id"])] = {
                    "addr": n["addr"],
                    "authkey": n["authkey"],
                    "key": key,
                }
            feeder = feed_lib.make_feeder(
                nodes, self.control.token, self.control.url, feed_timeout_s=self.run.feed_timeout_s
            )
            done_passes = 0
            self._await_hello(keys)
            self.feed_started_wall = time.time()
            passes = self.plan.feed_passes
            while passes is None or done_passes < passes:
                if self.control.stop:
                    return
                for row in df.mapInArrow(feeder, feed_lib.SUMMARY_SCHEMA).collect():
                    self.fed[row.executor] += row.chunks
                    self.fed_rows_by[row.executor] += row.rows
                    self.fed_rows += row.rows
                done_passes += 1
                log.debug("fed pass %d: %d rows so far", done_passes, self.fed_rows)
            self.control.set_feed_end({key: self.fed.get(key, 0) for key in keys})
            log.info("feed complete: %d passes, %d rows", done_passes, self.fed_rows)
        except BaseException as exc:
            if not self._closing and not self.control.abort:
                self.feed_error = exc

    # -- watching -----------------------------------------------------------------------

    def wait(self, *, all_nodes: bool = False) -> dict:
        """Blocks until the chief is done (returns its result) or the run fails.

        ``all_nodes``: wait until every process of the plan reported done; returns
        ``{key: result}``.
        """
        chief_key = next(k for k, r in self.roles.items() if r.is_chief)
        watch = _ProgressWatch(self.run, [k for k, r in self.roles.items() if r.trains])
        last_log = 0.0
        logged_evals = 0
        while True:
            self.control.wait(0.5)
            now = time.monotonic()
            nodes = self.control.snapshot()
            for evaluation in nodes[chief_key].evals[logged_evals:]:
                values = ", ".join(f"{k} {v:.4g}" for k, v in evaluation.items() if k != "step")
                log.info("evaluation at step %d: %s", evaluation["step"], values)
            logged_evals = len(nodes[chief_key].evals)
            self._check_errors(now)
            if all_nodes:
                if all(nodes[k].done is not None for k in self.roles if k in nodes):
                    return {k: nodes[k].done for k in self.roles}
            elif nodes[chief_key].done is not None:
                return nodes[chief_key].done
            self._check_alive(nodes, now)
            stalled = watch.update(nodes, chief_key, now)
            if stalled:
                self._fail(stalled)
            progress = nodes[chief_key].progress
            if progress.get("step") is not None and now - last_log >= self.run.progress_every_s:
                last_log = now
                log.info("%s", format_progress(progress))

    def _check_errors(self, now: float) -> None:
        """Fails the run on a process's error, a failed Spark job or a dead driver-side ps."""
        if self._first_error is not None:
            key, err = self._first_error
            self._fail(self._describe_error(key, err))
        if self._tfos_status.get("error"):
            self._tfos_error_seen = self._tfos_error_seen or now
            if now - self._tfos_error_seen > 5.0:  # the process's own report may be coming
                text = spark_lib.spark_error_text(self._tfos_status["error"])
                self._fail(f"a TensorFlowOnSpark task failed: {text}")
        if self.feed_error is not None:
            text = spark_lib.spark_error_text(str(self.feed_error))
            self._fail(f"feeding rows to TensorFlow failed: {text}")
        for key, proc, _ in self.driver_ps:
            if proc.poll() is not None:
                self._fail(
                    f"{self.roles[key].name} on the driver exited with code {proc.returncode}"
                )

    def _check_alive(self, nodes: dict, now: float) -> None:
        """Start-up deadline for processes that never said hello; heartbeats after that."""
        run = self.run
        silent_since_start = [
            k
            for k in self.roles
            if nodes[k].pid is None and now - self._started > run.startup_timeout_s
        ]
        if silent_since_start:
            names = ", ".join(f"{self.roles[k].name} ({k})" for k in sorted(silent_since_start))
            self._fail(
                f"the TensorFlow cluster did not start within {run.startup_timeout_s:.0f} s "
                f"(startup_timeout_s): {names} never reached the driver (its executor busy, "
                "its Python environment broken, or the driver unreachable from it?)"
            )
        for key in self.roles:
            node = nodes[key]
            silent = now - node.last_seen
            if node.pid is not None and not node.bye and node.done is None:
                if silent > run.heartbeat_timeout_s:
                    self._fail(
                        f"{self.roles[key].name} ({key}, pid {node.pid} on {node.host}) stopped "
                        f"responding {silent:.0f} s ago: its process died or hangs (out of "
                        "memory? killed? stopped?) or its executor was lost"
                    )

    def _describe_error(self, key: str, err: dict) -> str:
        name = self.roles[key].name if key in self.roles else key
        message = f"{name} ({key}) failed: {err.get('type')}: {err.get('message')}"
        return message + self._name_tf_tasks(message)

    def _name_tf_tasks(self, text: str) -> str:
        """TensorFlow names processes ``/job:worker/task:0``; say which ones those are."""
        nodes = self.control.snapshot()
        named = []
        for job, index in dict.fromkeys(_TF_TASK.findall(text)):
            for key, role in self.roles.items():
                if (role.role, role.index) == (job, int(index)):
                    node = nodes[key]
                    named.append(
                        f"/job:{job}/task:{index} is {role.name} ({key}, pid {node.pid} "
                        f"on {node.host})"
                    )
        return f" [{'; '.join(named)}]" if named else ""

    def _fail(self, message: str) -> None:
        log.error("%s", message)
        self.control.request_abort(message)
        raise TrainingError(message)

    # -- taking it down -----------------------------------------------------------------

    def close(self, *, failed: bool, reason: str = "") -> None:
        """Ends every process and Spark job of the run (also after a failure)."""
        if self._closing:
            return
        self._closing = True
        control = self.control
        if control is None:
            return
        if failed:
            control.request_abort(reason or "the driver ended the run")
        else:
            control.request_stop()
        deadline = time.monotonic() + self.run.cleanup_timeout_s
        # Processes leave on stop/abort; wait for their goodbyes (a dead one never says it).
        while time.monotonic() < deadline:
            nodes = control.snapshot()
            pending = [
                k for k in self.roles if not (nodes.get(k) and (nodes[k].bye or nodes[k].error))
            ]
            alive = [
                k
                for k in pending
                if nodes.get(k) is not None and time.monotonic() - nodes[k].last_seen < 3.0
            ]
            if not alive:
                break
            time.sleep(0.2)
        self._stop_tfos_ps_nodes(deadline)
        if self.feed_thread is not None:
            self.feed_thread.join(max(0.5, deadline - time.monotonic()))
            if self.feed_thread.is_alive():
                log.warning("the feed job did not end; cancelling it")
                self.sc.cancelJobGroup(self.feed_group)
                self.feed_thread.join(2.0)
        self._wait_for_jobs(deadline)
        for key, proc, tmp in self.driver_ps:
            try:
                proc.wait(timeout=max(0.5, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("%s on the driver did not exit; killing it", key)
                proc.kill()
                proc.wait()
            shutil.rmtree(tmp, ignore_errors=True)
        if self.tfos is not None:
            self.tfos.server.stop()
        control.close()

    def _stop_tfos_ps_nodes(self, deadline: float) -> None:
        """TensorFlowOnSpark's ps nodes wait for a message on their control queue."""
        if self.tfos is None:
            return
        from tensorflowonspark import TFManager

        def stop(node: dict) -> None:
            try:
                mgr = TFManager.connect(node["addr"], node["authkey"])
                mgr.get_queue("control").put(None)
            except Exception as exc:  # already gone with its task
                log.debug("ps node %s: %s", node["executor_id"], exc)

        threads = [
            threading.Thread(target=stop, args=(n,), daemon=True)
            for n in self.tfos.cluster_info
            if n["job_name"] == "ps"
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.1, deadline - time.monotonic()))

    def _wait_for_jobs(self, deadline: float) -> None:
        """Waits for the run's Spark jobs (TensorFlowOnSpark's start job) to end."""
        tracker = self.sc.statusTracker()
        while True:
            active = set(tracker.getActiveJobsIds()) - self._jobs_before
            if not active:
                return
            if time.monotonic() > deadline:
                log.warning(
                    "Spark jobs %s of the run still active; cancelling them", sorted(active)
                )
                for job in active:
                    self.sc._jsc.sc().cancelJob(int(job))
                return
            time.sleep(0.2)


class _ProgressWatch:
    """Start-up and stall deadlines over the training processes' reported global steps.

    Start-up lasts until the chief reports its first step (``startup_timeout_s`` from the
    start of the run); then the chief's step must advance within ``stall_timeout_s``. A
    stall names the training processes whose own step stopped advancing (all of them when
    none reports steps: the ps strategy's chief speaks for its workers).
    """

    def __init__(self, run, training_keys: list[str]):
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
        if chief_key not in self.seen:
            if now - self.started <= self.run.startup_timeout_s:
                return None
            waiting = ", ".join(f"{nodes[k].role} ({k})" for k in self.keys if k not in self.seen)
            return (
                f"the TensorFlow cluster did not start within {self.run.startup_timeout_s:.0f} s "
                f"(startup_timeout_s): no first training step yet from {waiting} (still "
                "building the model, restoring a checkpoint or reading the first batch)"
            )
        step, since = self.seen[chief_key]
        if now - since <= self.run.stall_timeout_s or step >= chief.get("target", step + 1):
            return None
        stuck = [
            f"{nodes[k].role} ({k}, at step {self.seen[k][0] if k in self.seen else 'none'})"
            for k in self.keys
            if k not in self.seen or now - self.seen[k][1] > self.run.stall_timeout_s
        ]
        return (
            f"no training progress for {now - since:.0f} s (stall_timeout_s "
            f"{self.run.stall_timeout_s:.0f}): the global step is stuck at {step}; processes "
            f"that stopped advancing: {', '.join(stuck)}"
        )


def format_progress(p: dict) -> str:
    parts = [f"step {p.get('step', 0)}/{p.get('target', '?')}", f"epoch {p.get('epoch', 0):.2f}"]
    for name in ("loss", "accuracy", "perplexity", "d_loss", "g_loss"):
        if name in p:
            parts.append(f"{name} {p[name]:.4g}")
    if "learning_rate" in p:
        parts.append(f"lr {p['learning_rate']:.3g}")
    if "examples_per_sec" in p:
        parts.append(f"{p['examples_per_sec']:.0f} examples/s")
    return ", ".join(parts)
