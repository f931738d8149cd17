"""The driver's side of a run: bring the TensorFlow cluster up on Spark, feed it, watch it,
take it down.

Layout (one TensorFlow process per Spark executor, placed by TensorFlowOnSpark; the mapping
from TensorFlowOnSpark's nodes to TensorFlow's roles is :mod:`sparktf.train.driver.roles`):

* ``allreduce``: TensorFlowOnSpark nodes ``chief:0`` and ``worker:0..N-2``, one per executor;
  they are the N all-reduce workers.
* ``ps``: TensorFlowOnSpark's ``chief`` is the coordinator. The workers (and the parameter
  servers, unless ``ps_on_driver``) are started as *ps* nodes: such a node keeps its
  executor busy for the whole run (its barrier task waits for its process, so feeding tasks
  only land on the chief's executor) and ends when the driver says stop. The driver hands
  every process its role and the TF cluster through the control channel. With
  ``ps_on_driver`` the parameter servers are processes of the driver
  (:mod:`sparktf.train.driver.ps`; two executors then hold chief + one worker).

:class:`ClusterRun` orchestrates the parts: TensorFlowOnSpark's bring-up and teardown
(:mod:`sparktf.train.driver.bringup`), the control channel (:mod:`sparktf.train.wire.control`), the
feed of the ``spark`` input mode (:mod:`sparktf.train.feed.job`) and the watch over the run
(:mod:`sparktf.train.driver.monitor`).

Stop: the chief reports ``done`` after its final checkpoint and export; the driver then
sets ``stop`` and every other process (parameter servers and ps-workers serving their
``tf.distribute.Server``, all-reduce workers waiting at the end) exits; TensorFlowOnSpark's
ps nodes get their control message; nothing waits in ``Server.join()``.

Failure: a process's exception reaches the driver through the control channel at once (with
its message: a corrupt file names the file); a process that dies silently is noticed when
its heartbeats stop (``FailureConfig.heartbeat_timeout_s``); a failed Spark job (TensorFlowOnSpark's
start job, the feed) is noticed from its thread. The driver then aborts the run: every
TensorFlow process exits within a second or two, feeding tasks fail fast, and
:class:`~sparktf.train.errors.TrainingError` carries the first error. Spark tasks are not
killed (a killed PySpark worker would orphan TensorFlowOnSpark's processes); they end because
the processes they wait for end.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import dataclass

from sparktf.errors import SparktfRuntimeError
from sparktf.ports import server_port
from sparktf.train.driver import roles as roles_lib
from sparktf.train.driver.bringup import TfosCluster, await_executors, driver_address
from sparktf.train.driver.monitor import FirstError, RunMonitor, await_goodbyes
from sparktf.train.driver.ps import DriverPs
from sparktf.train.feed.job import FeedJob
from sparktf.train.plan import ProcessSpec, Role, RunPlan
from sparktf.train.wire.control import ControlServer, Recent
from sparktf.train.wire.limits import ConnectionLimits

__all__ = ["BenchOptions", "ClusterRun"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class BenchOptions:
    """What only benchmarks change about a run (``bench/feed.py``).

    ``consume_only``: the TensorFlow processes only read the feed and train nothing.
    """

    consume_only: bool = False


class ClusterRun:
    """One run's TensorFlow cluster. Use as a context manager: ``with ClusterRun(...) as c:
    result = c.start().wait()``; leaving the block always takes everything down.

    ``frame``: a DataFrame to feed (``spark`` input mode) instead of the split's Parquet."""

    def __init__(
        self,
        spark,
        plan: RunPlan,
        *,
        frame=None,
        bench: BenchOptions | None = None,
        watch_steps: bool = True,
    ):
        self.spark = spark
        self.plan = plan
        self.watch_steps = watch_steps  # False: a user's function (see RunMonitor)
        self.bench = bench or BenchOptions()
        self.frame = frame
        self.control: ControlServer | None = None
        self.roles: dict[str, Role] = {}
        # where each process runs, by role name (roles.placement), once started
        self.placement: dict[str, dict[str, str | None]] = {}
        self.tfos = TfosCluster(spark)
        self.driver_ps = DriverPs()
        self.feed: FeedJob | None = None
        self.monitor: RunMonitor | None = None
        self._first_error = FirstError()
        self._started = time.monotonic()
        self._closing = False

    def __enter__(self) -> ClusterRun:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(
            failed=exc is not None, reason=f"{type(exc).__name__}: {exc}" if exc is not None else ""
        )

    @property
    def job_tags(self) -> set[str]:
        """The tags of this attempt's Spark jobs (its barrier stage's, its feed's): their
        tasks are the run's own when slots are counted (:mod:`~sparktf.train.driver.elastic`)."""
        tags = {self.tfos.stage.tag} if self.tfos.stage is not None else set()
        return tags | ({self.feed.group} if self.feed is not None else set())

    @property
    def fed_rows_by(self) -> Counter:
        """Rows fed to each process (``spark`` input mode; empty otherwise)."""
        return Counter() if self.feed is None else self.feed.rows_by

    def start(self) -> ClusterRun:
        """Starts every TensorFlow process of the plan and, in ``spark`` input mode, the feed.

        Raises:
            SlotsError: the cluster has fewer task slots than the plan has processes on
                executors (a ConfigError).
            ConfigError: the executors the plan needs are not registered.
            TrainingError: TensorFlowOnSpark could not start the cluster.
        """
        plan, scaling, run = self.plan, self.plan.scaling, self.plan.run
        await_executors(self.spark, scaling.num_executors, run.failure.startup_timeout_s)
        address = driver_address(self.spark)  # loopback on the local profile
        self.control = ControlServer(
            address.advertise,
            bind_host=address.bind,
            on_event=self._first_error.record,
            limits=ConnectionLimits.for_run(scaling.num_executors),
        )
        spec = ProcessSpec(
            plan=plan,
            control_url=self.control.url,
            token=self.control.token,
            driver_lost_s=max(30.0, run.failure.failure_timeout_s / 2),
            startup_timeout_s=run.failure.startup_timeout_s,
            consume_only=self.bench.consume_only,
        )
        log.info(
            "starting TensorFlow on %d executors (%s; input mode %s)",
            scaling.num_executors,
            scaling.describe(),
            plan.train.input_mode,
        )
        # The driver's parameter servers start first: they import TensorFlow while the
        # executors' nodes come up, and get their roles with the others'.
        driver_keys = roles_lib.driver_ps_keys(scaling)
        self.driver_ps.start(spec, driver_keys, self.control.issue_token)
        cluster_info = self.tfos.start(spec, address, issue_token=self._issue_token)
        # free on every interface: the workers on other hosts reach these servers
        driver_addresses = [f"{address.advertise}:{server_port('')}" for _ in driver_keys]
        self.roles = roles_lib.assign_roles(cluster_info, scaling, driver_addresses)
        self.driver_ps.name(self.roles)
        self.control.publish_plans(
            {key: {**role.to_dict(), "name": role.name} for key, role in self.roles.items()}
        )
        self.placement = roles_lib.placement(cluster_info, self.roles, address.advertise)
        for key, role in sorted(self.roles.items(), key=lambda kv: kv[1].name):
            where = self.placement[role.name]
            log.info(
                "  %-9s %s on %s (executor %s)", role.name, key, where["host"], where["executor"]
            )
        checks = [self.tfos.failure]
        if plan.train.input_mode == "spark":
            nodes = self.tfos.nodes
            feeding = {key: nodes[key] for key in roles_lib.feeding_keys(self.roles)}
            self.feed = FeedJob(self.spark, plan, self.control, feeding, df=self.frame)
            checks.append(self.feed.start().failure)
        checks.append(self.driver_ps.failure)
        self.monitor = RunMonitor(
            run,
            self.control,
            self.roles,
            started=self._started,
            first_error=self._first_error,
            checks=checks,
            watch_steps=self.watch_steps,
        )
        return self

    def chief_reports(self) -> tuple[Recent, dict | None]:
        """What the chief's function reported (``sparktf.train.report``): its last reports in
        order (how many came, how many were dropped), and the last one that named a
        checkpoint (kept even when that report itself was dropped)."""
        if self.control is None or not self.roles:
            return Recent(), None
        node = self.control.snapshot().get(roles_lib.chief_key(self.roles))
        return (node.reports, node.checkpointed) if node is not None else (Recent(), None)

    def _issue_token(self, meta: dict) -> str:
        """The control token of the TensorFlow process of a registering node."""
        return self.control.issue_token(f"executor-{int(meta['executor_id'])}")

    def wait(self, *, all_nodes: bool = False) -> dict:
        """Blocks until the chief is done (returns its result) or the run fails; see
        :meth:`sparktf.train.driver.monitor.RunMonitor.wait`.

        Raises:
            TrainingError: the run failed.
            RuntimeError: :meth:`start` has not been called.
        """
        if self.monitor is None:
            raise SparktfRuntimeError("ClusterRun.wait() before start()")
        return self.monitor.wait(all_nodes=all_nodes)

    def close(self, *, failed: bool, reason: str = "") -> None:
        """Ends every process and Spark job of the run (also after a failure)."""
        if self._closing:
            return
        self._closing = True
        if self.feed is not None:
            self.feed.expect_end()
        control = self.control
        if control is None:
            return
        if failed:
            control.request_abort(reason or "the driver ended the run")
        else:
            control.request_stop()
        deadline = time.monotonic() + self.plan.run.failure.cleanup_timeout_s
        # Processes leave on stop/abort; wait for their goodbyes (a dead one never says it).
        await_goodbyes(control, list(self.roles), deadline)
        if self.feed is not None:
            self.feed.stop(deadline)
        self.tfos.wait_for_jobs(deadline)
        self.driver_ps.stop(deadline)
        self.tfos.close()
        control.close()
