"""TensorFlowOnSpark's part of a run, on the driver: bring its nodes up, watch its Spark job,
take its nodes down.

``TFCluster.run`` starts one node per executor (:func:`sparktf.train.node.tfos_main`: each
starts sparktf's TensorFlow process) through the authenticated reservation exchange of
:mod:`sparktf.train.reservation`. TensorFlowOnSpark sees the SparkContext through
:class:`GuardedContext`: on a failed start it calls ``stop()`` and ``cancelAllJobs()``, and
neither the session nor other jobs belong to the run.

At the end, TensorFlowOnSpark's *ps* nodes (ps strategy: every node but the chief) wait for
a message on their manager's control queue; :meth:`TfosCluster.stop_ps_nodes` sends it.
Spark tasks are never killed (a killed PySpark worker would orphan TensorFlowOnSpark's
processes): they end because the processes they wait for end, and only jobs still running
at the cleanup deadline are cancelled.
"""

from __future__ import annotations

import argparse
import logging
import threading
import time

from sparktf import spark as spark_lib
from sparktf.train import node
from sparktf.train import roles as roles_lib
from sparktf.train.config import ConfigError, TrainingError
from sparktf.train.plan import ProcessSpec
from sparktf.train.tfos_logs import protect_tensorflowonspark_logs

__all__ = ["GuardedContext", "TfosCluster", "await_executors", "warn_if_transport_in_clear"]

log = logging.getLogger(__name__)
# After a TensorFlowOnSpark task failed, the run waits this long for the failed process's own
# report, which names the cause more clearly than Spark's.
TFOS_ERROR_GRACE_S = 5.0


class GuardedContext:
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


def await_executors(sc, num_executors: int, startup_timeout_s: float) -> None:
    """Waits until ``num_executors`` executors are registered.

    Raises:
        ConfigError: when they are not within ``startup_timeout_s`` (at most two minutes).
    """
    try:
        spark_lib.wait_for_executors(sc, num_executors, min(startup_timeout_s, 120.0))
    except spark_lib.ExecutorCountError as exc:
        raise ConfigError(str(exc)) from None


def warn_if_transport_in_clear(sc) -> str | None:
    """Logs one warning when Spark carries the run's secrets in clear
    (:func:`sparktf.spark.transport_warning`: authentication or RPC encryption off on a
    master whose executors are separate processes); returns the warning, else None."""
    warning = spark_lib.transport_warning(dict(sc.getConf().getAll()))
    if warning:
        log.warning("%s", warning)
    return warning


def _secrets_of(startup) -> list[bytes | str]:
    """The secret values of a reservation start-up: its bytes and text attributes of 16
    characters or more (the run's reservation secret)."""
    values = vars(startup).values() if hasattr(startup, "__dict__") else ()
    return [v for v in values if isinstance(v, bytes | str) and len(v) >= 16]


class TfosCluster:
    """One run's TensorFlowOnSpark cluster: :meth:`start` brings it up, :meth:`failure`
    reports its failed Spark job, the rest takes it down."""

    def __init__(self, sc):
        self.sc = sc
        self.cluster = None  # TensorFlowOnSpark's TFCluster once started
        self._status: dict = {}
        self._error_seen: float | None = None
        self._jobs_before: set[int] | None = None  # Spark's active jobs before the start

    @property
    def cluster_info(self) -> list[dict]:
        """TensorFlowOnSpark's nodes (empty before the start)."""
        return [] if self.cluster is None else list(self.cluster.cluster_info)

    @property
    def nodes(self) -> dict[str, dict]:
        """TensorFlowOnSpark's nodes by process key."""
        return {roles_lib.node_key(n): n for n in self.cluster_info}

    def start(self, spec: ProcessSpec, address, *, issue_token=None) -> list[dict]:
        """Starts a node on every executor, each with ``spec``; returns TensorFlowOnSpark's
        ``cluster_info``. ``address`` is the driver's
        :class:`~sparktf.train.reservation.DriverAddress`; ``issue_token`` gives each
        registering node its process's control token (see
        :class:`~sparktf.train.reservation.ReservationBook`).

        Raises:
            TrainingError: TensorFlowOnSpark could not start the cluster (a node failed, or
                not every node registered within ``startup_timeout_s``).
        """
        # Lazy: importing tensorflowonspark runs logging.basicConfig(level=INFO).
        from tensorflowonspark import TFCluster

        from sparktf.train import reservation

        scaling, run, train = spec.plan.scaling, spec.plan.run, spec.plan.train
        # its INFO lines include the managers' authkeys: redacted, quiet unless DEBUG
        protect_tensorflowonspark_logs(spec.token)
        warn_if_transport_in_clear(self.sc)
        input_mode = (
            TFCluster.InputMode.SPARK
            if train.input_mode == "spark"
            else TFCluster.InputMode.TENSORFLOW
        )
        TFCluster.tf_status.clear()  # module-global: a previous run's error must not leak in
        self._status = TFCluster.tf_status
        self._jobs_before = set(self.sc.statusTracker().getActiveJobsIds())
        try:
            # TensorFlowOnSpark's reservation exchange, authenticated (no pickle from the
            # network) and bound to the driver's address; its server stops with the block
            # on a failure, else once every node has the cluster.
            with reservation.authenticated_startup(address, issue_token=issue_token) as auth:
                protect_tensorflowonspark_logs(*_secrets_of(auth))
                self.cluster = TFCluster.run(
                    sc=GuardedContext(self.sc, auth),
                    map_fun=node.tfos_main,
                    # a namespace: TensorFlowOnSpark tests `'num_gpus' in tf_args` and reads
                    # tf_args.num_gpus (a dict or None crashes in _get_gpus)
                    tf_args=argparse.Namespace(num_gpus=scaling.gpus_per_worker, spec=spec),
                    num_executors=scaling.num_executors,
                    num_ps=roles_lib.tfos_ps_count(scaling),
                    tensorboard=False,
                    input_mode=input_mode,
                    master_node="chief",
                    reservation_timeout=int(run.failure.startup_timeout_s),
                    release_port=True,
                )
        except SystemExit:
            raise TrainingError(
                "TensorFlowOnSpark could not start the cluster: "
                f"{self._status.get('error', 'unknown error')}"
            ) from None
        except Exception as exc:  # e.g. "timed out waiting for reservations to complete"
            raise TrainingError(
                "TensorFlowOnSpark could not start the cluster within "
                f"{run.failure.startup_timeout_s:.0f} s (FailureConfig.startup_timeout_s): "
                f"{type(exc).__name__}: {exc}"
            ) from None
        return self.cluster_info

    def failure(self, now: float) -> str | None:
        """A message once a TensorFlowOnSpark task has failed for ``TFOS_ERROR_GRACE_S``
        (the failed process's own, clearer report usually arrives first), else None."""
        if not self._status.get("error"):
            return None
        self._error_seen = self._error_seen or now
        if now - self._error_seen <= TFOS_ERROR_GRACE_S:
            return None
        return (
            f"a TensorFlowOnSpark task failed: {spark_lib.spark_error_text(self._status['error'])}"
        )

    def stop_ps_nodes(self, deadline: float) -> None:
        """Sends TensorFlowOnSpark's ps nodes the message they wait for on their control
        queue; waits for the sends until ``deadline`` (monotonic)."""
        if self.cluster is None:
            return
        from tensorflowonspark import TFManager

        def stop(info: dict) -> None:
            try:
                mgr = TFManager.connect(info["addr"], info["authkey"])
                mgr.get_queue("control").put(None)
            except Exception as exc:  # already gone with its task
                log.debug("ps node %s: %s", info["executor_id"], exc)

        threads = [
            threading.Thread(target=stop, args=(n,), daemon=True)
            for n in self.cluster_info
            if n["job_name"] == "ps"
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(max(0.1, deadline - time.monotonic()))

    def wait_for_jobs(self, deadline: float) -> None:
        """Waits for the run's Spark jobs (TensorFlowOnSpark's start job) to end; cancels
        those still active at ``deadline`` (monotonic)."""
        if self._jobs_before is None:
            return
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

    def close(self) -> None:
        """Stops TensorFlowOnSpark's reservation server (when it has not stopped yet)."""
        if self.cluster is not None:
            self.cluster.server.stop()
