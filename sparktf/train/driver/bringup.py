"""The run's nodes, on the driver: bring them up in one barrier stage, watch that stage, wait
for it to end.

:meth:`TfosCluster.start` does what TensorFlowOnSpark's ``TFCluster.run`` does, with sparktf's
own parts: the authenticated reservation exchange of :mod:`sparktf.train.wire.reservation`, and
one gang-scheduled stage of :mod:`sparktf.train.driver.gang` whose task ``i`` runs
:func:`sparktf.train.process.launcher.run_node` as executor ``i`` (TensorFlowOnSpark's
``TFManager`` holds the queues of the ``spark`` input mode; nothing of TensorFlowOnSpark is
replaced at run time). The same stage serves a classic session and a Spark Connect client:
nothing here needs a SparkContext.

Spark tasks are never killed (a killed PySpark worker would orphan the processes it
started): they end because the processes they wait for end, when the driver says stop
through the control channel, and a stage still running at the cleanup deadline is
interrupted.
"""

from __future__ import annotations

import functools
import logging
import time

from sparktf import remote
from sparktf import spark as spark_lib
from sparktf.remote import is_connect
from sparktf.security.redact import REDACTED
from sparktf.train.config import ConfigError, TrainingError
from sparktf.train.driver import gang
from sparktf.train.driver import roles as roles_lib
from sparktf.train.plan import ProcessSpec
from sparktf.train.process import launcher
from sparktf.train.wire.tfos_logs import protect_tensorflowonspark_logs

__all__ = [
    "TfosCluster",
    "await_executors",
    "cluster_template",
    "warn_if_transport_in_clear",
]

log = logging.getLogger(__name__)
# After a TensorFlowOnSpark task failed, the run waits this long for the failed process's own
# report, which names the cause more clearly than Spark's.
TFOS_ERROR_GRACE_S = 5.0


def await_executors(spark, num_executors: int, startup_timeout_s: float) -> None:
    """Waits until ``num_executors`` executors are registered, after checking that the
    settings give the cluster that many task slots. A Spark Connect client cannot see the
    executors: there the barrier stage waits for them.

    Raises:
        SlotsError: the settings give the cluster fewer task slots.
        ConfigError: when they are not within ``startup_timeout_s`` (at most two minutes).
    """
    gang.check_slots(spark, num_executors, scheduler=False)
    if is_connect(spark):
        return
    try:
        spark_lib.wait_for_executors(
            spark.sparkContext, num_executors, min(startup_timeout_s, 120.0)
        )
    except spark_lib.ExecutorCountError as exc:
        raise ConfigError(str(exc)) from None
    # now the scheduler's count: slots busy with other jobs are waited for
    gang.check_slots(spark, num_executors, free_wait_s=startup_timeout_s)


def warn_if_transport_in_clear(spark) -> str | None:
    """Logs one warning when Spark carries the run's secrets in clear
    (:func:`sparktf.spark.transport_warning`: authentication or RPC encryption off on a
    master whose executors are separate processes); returns the warning, else None."""
    keys = ("spark.master", *spark_lib.TRANSPORT_SETTINGS)
    warning = spark_lib.transport_warning(gang.conf_values(spark, keys))
    if is_connect(spark):  # the node function (and its secrets) goes to the server too
        warning = remote.channel_warning(spark) or warning
    if warning:
        log.warning("%s", warning)
    return warning


def _secrets_of(startup) -> list[bytes | str]:
    """The secret values of a reservation start-up: its bytes and text attributes of 16
    characters or more (the run's reservation secret)."""
    values = vars(startup).values() if hasattr(startup, "__dict__") else ()
    return [v for v in values if isinstance(v, bytes | str) and len(v) >= 16]


def cluster_template(num_executors: int, num_ps: int) -> dict[str, list[int]]:
    """TensorFlowOnSpark's roles by executor id: ``ps`` first, then the ``chief``, then the
    ``worker`` nodes (what ``TFCluster.run`` makes with ``master_node="chief"``)."""
    ids = list(range(num_executors))
    template = {"ps": ids[:num_ps], "chief": ids[num_ps : num_ps + 1]}
    template["worker"] = ids[num_ps + 1 :]
    return {role: nodes for role, nodes in template.items() if nodes}


class TfosCluster:
    """One run's TensorFlowOnSpark cluster: :meth:`start` brings it up, :meth:`failure`
    reports its failed Spark stage, the rest takes it down."""

    def __init__(self, spark):
        self.spark = spark
        self.cluster_info: list[dict] = []  # TensorFlowOnSpark's nodes once started
        self.stage: gang.BarrierStage | None = None
        self._startup = None
        self._error_seen: float | None = None

    @property
    def nodes(self) -> dict[str, dict]:
        """TensorFlowOnSpark's nodes by process key."""
        return {roles_lib.node_key(n): n for n in self.cluster_info}

    def start(self, spec: ProcessSpec, address, *, issue_token=None) -> list[dict]:
        """Starts a node on every executor, each with ``spec``, in one barrier stage;
        returns TensorFlowOnSpark's ``cluster_info``. ``address`` is the driver's
        :class:`~sparktf.train.wire.reservation.DriverAddress`; ``issue_token`` gives each
        registering node its process's control token (see
        :class:`~sparktf.train.wire.reservation.ReservationBook`).

        Raises:
            SlotsError: the cluster has fewer task slots than the run has nodes.
            TrainingError: a node failed, or not every node registered within
                ``startup_timeout_s``.
        """
        from sparktf.train.wire import reservation

        scaling, run, train = spec.plan.scaling, spec.plan.run, spec.plan.train
        n = scaling.num_executors
        # its INFO lines include the managers' authkeys: redacted, quiet unless DEBUG
        protect_tensorflowonspark_logs(spec.token)
        warn_if_transport_in_clear(self.spark)
        with reservation.authenticated_startup(address, n, issue_token=issue_token) as startup:
            self._startup = startup
            protect_tensorflowonspark_logs(*_secrets_of(startup))
            setup = launcher.NodeSetup(
                secret=startup.secret,
                server_addr=tuple(startup.server.address),
                template=cluster_template(n, roles_lib.tfos_ps_count(scaling)),
                spec=spec,
                num_gpus=scaling.gpus_per_worker,
                fed=train.input_mode == "spark",
            )
            self.stage = gang.BarrierStage(
                self.spark,
                n,
                functools.partial(launcher.run_node, setup),
                what="the TensorFlow nodes",
            ).start()
            self.cluster_info = self._await_nodes(
                startup.server, run.failure.startup_timeout_s, reservation.AWAIT_POLL_S
            )
        return self.cluster_info

    def _await_nodes(self, server, timeout_s: float, poll_s: float) -> list[dict]:
        """TensorFlowOnSpark's nodes once every one has registered.

        Raises:
            TrainingError: the stage failed, or the nodes did not register in time.
        """
        deadline = time.monotonic() + timeout_s
        book = server.reservations
        while not book.done():
            if self.stage.error is not None:
                raise TrainingError(
                    "the TensorFlow nodes could not start: "
                    f"{spark_lib.spark_error_text(self.stage.error)}"
                )
            if time.monotonic() > deadline:
                raise TrainingError(
                    f"only {len(book.get())} of {self.stage.n} TensorFlow nodes registered "
                    f"within {timeout_s:.0f} s (FailureConfig.startup_timeout_s)"
                )
            time.sleep(poll_s)
        nodes = sorted(book.get(), key=lambda info: info["executor_id"])
        for info in nodes:  # as TensorFlowOnSpark describes them, less the manager's key
            log.debug("TensorFlowOnSpark node %s", {**info, "authkey": REDACTED})
        return nodes

    def failure(self, now: float) -> str | None:
        """A message once the nodes' stage has failed for ``TFOS_ERROR_GRACE_S`` (the failed
        process's own, clearer report usually arrives first), else None."""
        if self.stage is None or self.stage.error is None:
            return None
        self._error_seen = self._error_seen or now
        if now - self._error_seen <= TFOS_ERROR_GRACE_S:
            return None
        return f"a TensorFlowOnSpark task failed: {spark_lib.spark_error_text(self.stage.error)}"

    def wait_for_jobs(self, deadline: float) -> None:
        """Waits for the nodes' stage to end; interrupts it when it runs past ``deadline``
        (monotonic)."""
        if self.stage is None or self.stage.join(deadline - time.monotonic()):
            return
        log.warning("the TensorFlow nodes' Spark stage is still running; interrupting it")
        self.stage.interrupt()
        self.stage.join(2.0)

    def close(self) -> None:
        """Stops the reservation server (when it has not stopped yet)."""
        if self._startup is not None and self._startup.server is not None:
            self._startup.server.stop()
