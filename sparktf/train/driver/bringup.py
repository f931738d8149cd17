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

The driver's address and the start-up's secret are read and made here:
:func:`driver_address` (``spark.driver.bindAddress``/``spark.driver.host``, loopback on the
local profile; on a Spark Connect client, :func:`connect_driver_address`, the address that
reaches the Connect server) is where the reservation server and the control server listen,
never every interface; :func:`authenticated_startup` serves one bring-up with a fresh secret
and stops its server on every exit path -- at once when the start fails, and as soon as every
node has fetched the complete cluster when it succeeds (the control server takes over from
there).
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from sparktf import remote
from sparktf import spark as spark_lib
from sparktf.errors import SparktfValueError
from sparktf.remote import is_connect
from sparktf.security.redact import REDACTED, protect_tensorflowonspark_logs
from sparktf.train.driver import gang
from sparktf.train.driver import roles as roles_lib
from sparktf.train.errors import ConfigError, TrainingError
from sparktf.train.plan import ProcessSpec
from sparktf.train.process import launcher
from sparktf.train.wire import reservation

__all__ = [
    "DRIVER_HOST_ENV",
    "DriverAddress",
    "Startup",
    "TfosCluster",
    "authenticated_startup",
    "await_executors",
    "cluster_template",
    "connect_driver_address",
    "driver_address",
    "warn_if_transport_in_clear",
]

log = logging.getLogger(__name__)
# After a TensorFlowOnSpark task failed, the run waits this long for the failed process's own
# report, which names the cause more clearly than Spark's.
TFOS_ERROR_GRACE_S = 5.0
# Where a Spark Connect client's servers listen, when the executors reach it there.
DRIVER_HOST_ENV = "SPARKTF_DRIVER_HOST"


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
    master whose executors are separate processes), or a Spark Connect channel in clear to
    another host that the user accepted; returns the warning, else None.

    Raises:
        InsecureChannelError: a Connect channel in clear to another host, not accepted
            (:func:`sparktf.remote.check_channel`): the node function and its secrets would
            cross the network in clear.
    """
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
        :class:`DriverAddress`; ``issue_token`` gives each
        registering node its process's control token (see
        :class:`~sparktf.train.wire.reservation.ReservationBook`).

        Raises:
            SlotsError: the cluster has fewer task slots than the run has nodes.
            TrainingError: a node failed, or not every node registered within
                ``startup_timeout_s``.
        """
        scaling, run, train = spec.plan.scaling, spec.plan.run, spec.plan.train
        n = scaling.num_executors
        # its INFO lines include the managers' authkeys: redacted, quiet unless DEBUG
        protect_tensorflowonspark_logs(spec.token)
        warn_if_transport_in_clear(self.spark)
        with authenticated_startup(address, n, issue_token=issue_token) as startup:
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


# ----------------------------------------------------------------------------- start-up


@dataclass(frozen=True)
class DriverAddress:
    """Where the driver's servers listen (:func:`driver_address`)."""

    bind: str  # the IPv4 address the driver's servers bind
    advertise: str  # the name or address executors connect to


def connect_driver_address(spark) -> DriverAddress:
    """A Spark Connect client is the run's driver: its servers listen where the cluster's
    executors reach this machine -- ``SPARKTF_DRIVER_HOST``, else ``SPARK_LOCAL_IP`` (unless
    it is loopback and the server is not), else the address that routes to the Connect
    server (loopback for a server on this machine). Never every interface.

    Raises:
        ValueError: a wildcard address, or no way to tell the address.
    """
    host, port, _ = remote.channel(spark)
    advertise = os.environ.get(DRIVER_HOST_ENV)
    local_ip = os.environ.get("SPARK_LOCAL_IP")
    if not advertise and local_ip:
        if remote.is_loopback(local_ip) and not remote.is_loopback(host):
            log.warning(
                "SPARK_LOCAL_IP=%s is loopback and the Connect server %s is not: the run's "
                "servers listen where this machine reaches it instead (set %s to choose)",
                local_ip,
                host,
                DRIVER_HOST_ENV,
            )
        else:
            advertise = local_ip
    advertise = advertise or reservation.route_to(host, port)
    if advertise in ("0.0.0.0", "::", "*"):
        raise SparktfValueError(
            f"{advertise} would listen on every interface: set {DRIVER_HOST_ENV} to the "
            "address the Connect server's executors reach this machine at"
        )
    return DriverAddress(bind=reservation.ipv4(advertise), advertise=advertise)


def driver_address(spark) -> DriverAddress:
    """Where the driver's servers listen: Spark's own driver address.

    Advertised: ``spark.driver.host`` (what executors already use to reach the driver), else
    ``SPARK_LOCAL_IP``, else TensorFlowOnSpark's guess. Bound: ``spark.driver.bindAddress``
    when it names one address, else the advertised one -- never every interface. On the local
    profile both are 127.0.0.1. ``spark`` may be a Spark Connect session: see
    :func:`connect_driver_address`.
    """
    from tensorflowonspark import util

    if is_connect(spark):
        return connect_driver_address(spark)
    conf = spark.sparkContext.getConf()
    advertise = (
        conf.get("spark.driver.host", None)
        or os.environ.get("SPARK_LOCAL_IP")
        or util.get_ip_address()
    )
    bind = conf.get("spark.driver.bindAddress", None)
    if not bind or bind in ("0.0.0.0", "::", "*"):
        bind = advertise
    return DriverAddress(bind=reservation.ipv4(bind), advertise=advertise)


@dataclass
class Startup:
    """One authenticated start-up: the secret and its reservation server."""

    secret: bytes
    address: DriverAddress
    server: reservation.AuthServer | None = None


@contextmanager
def authenticated_startup(
    address: DriverAddress,
    count: int,
    *,
    served_timeout_s: float = reservation.SERVED_TIMEOUT_S,
    issue_token: Callable[[dict], str] | None = None,
) -> Iterator[Startup]:
    """A started :class:`~sparktf.train.wire.reservation.AuthServer` for ``count`` nodes,
    with a fresh secret, for the block (one bring-up).

    Leaving the block stops the server: at once when the block raised (anything,
    ``SystemExit`` included), else once every node has fetched the cluster (within
    ``served_timeout_s``).
    ``issue_token`` (see :class:`~sparktf.train.wire.reservation.ReservationBook`) gives each
    registering node the control token of its TensorFlow process.

    Raises:
        OSError: when no port of ``TFOS_SERVER_PORT`` can be bound.
    """
    startup = Startup(secret=secrets.token_bytes(32), address=address)
    startup.server = reservation.AuthServer(
        count,
        secret=startup.secret,
        bind_host=address.bind,
        advertise_host=address.advertise,
        issue_token=issue_token,
    )
    startup.server.start()
    succeeded = False
    try:
        yield startup
        succeeded = True
    finally:
        if succeeded:
            startup.server.stop_when_served(served_timeout_s)
        else:
            startup.server.stop()
