"""One loop of attempts for every run: :func:`run_attempts`, used by ``fit`` and ``run(train_fn)``.

A run is a sequence of *attempts*, each a whole TensorFlow cluster of a fixed size
(:class:`~sparktf.train.driver.cluster.ClusterRun`). An attempt ends in one of three ways:

* **done**: the chief reported its result; the run is over.
* **failed**: a process, its executor or a Spark job of the run failed. The next attempt
  starts from the run's resume point (``fit``: the latest checkpoint in the model directory;
  ``run(train_fn)``: the last checkpoint the function reported), with the same workers (a
  *restart*) or, in an elastic run, with the workers that can be placed now (a *shrink*, or a
  restart when as many fit again: an executor that died and came straight back).
* **paused** (elastic runs): the driver asked the training processes to stop at their next
  checkpoint because task slots stayed free (:class:`~sparktf.train.driver.elastic.GrowWatch`);
  the chief saved and said so. The next attempt starts from that checkpoint with the workers
  that fit now (a *grow*; a restart when no more fit after all). A pause the driver did not
  ask for fails the run.

Every change between attempts is one **event**, the same record for every kind of run
(:class:`Event`; ``TrainResult.restarts`` holds the restarts, ``TrainResult.resizes`` the
shrinks and grows), logged as a WARNING, given to MLflow (:mod:`~sparktf.train.driver.tracking`)
and to the next attempt's plan (``RunPlan.event``: the chief writes it to TensorBoard).

The budget: a run of a fixed size makes at most ``FailureConfig.max_restarts`` restarts. In an
elastic run every event counts against ``FailureConfig.max_resizes`` (10 by default), a
restart included: a lost executor that Spark relaunches at once (the same slots free again)
is an elastic event, so an elastic run survives it with the default settings however fast
the executor comes back.

What a kind of run resumes from, and how its chief's answer is read, is its :class:`Resume`:
:class:`CheckpointResume` for ``fit``, :class:`ReportResume` for ``run(train_fn)``.

Importing this module imports neither TensorFlow nor TensorFlowOnSpark.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass
from typing import Any

from sparktf.train import artifacts
from sparktf.train.driver import elastic, gang
from sparktf.train.driver.cluster import ClusterRun
from sparktf.train.errors import TrainingError
from sparktf.train.feed.order import Position
from sparktf.train.plan import RunPlan
from sparktf.train.result import PAUSED, ProcessResult, ResultRejected, within
from sparktf.train.wire.control import MAX_KEPT

__all__ = [
    "KINDS",
    "record_outcome",
    "CheckpointResume",
    "Event",
    "Outcome",
    "ReportResume",
    "Resume",
    "run_attempts",
]

log = logging.getLogger("sparktf.train")

KINDS = ("restart", "shrink", "grow")


@dataclass(frozen=True)
class Event:
    """One change between two attempts of a run (an entry of ``TrainResult.restarts`` or
    ``TrainResult.resizes``)."""

    kind: str  # "restart" | "shrink" | "grow"
    old: int  # workers before
    new: int  # workers after
    step: int  # the last step the run reached before it
    resumed_from_step: int  # the step of the checkpoint the next attempt starts from
    cause: str  # what ended the attempt: the error, or why the driver asked for a pause
    time: float  # time.time() when it was decided
    resumed_from_checkpoint: str | None = None  # run(train_fn): the reported checkpoint

    def to_dict(self) -> dict[str, Any]:
        out = {
            "kind": self.kind,
            "from": self.old,
            "to": self.new,
            "step": self.step,
            "resumed_from_step": self.resumed_from_step,
            "cause": self.cause,
            "time": self.time,
        }
        if self.resumed_from_checkpoint is not None:
            out["resumed_from_checkpoint"] = self.resumed_from_checkpoint
        return out

    def describe(self) -> str:
        if self.kind == "restart":
            what = f"restart with {self.new} workers"
        else:
            what = f"{self.kind} from {self.old} to {self.new} workers"
        where = self.resumed_from_checkpoint or f"the checkpoint of step {self.resumed_from_step}"
        if not self.resumed_from_step and not self.resumed_from_checkpoint:
            where = "the start (no checkpoint yet)"
        return f"{what} at step {self.step} (resuming from {where}): {self.cause}"


@dataclass(frozen=True)
class Outcome:
    """How the runs ended: the chief's answer as the kind of run reads it (``fit``: a
    :class:`~sparktf.train.result.ProcessResult`; ``run``: the ``done`` event's data), the
    events in order and the last attempt's cluster (its placement, its feed's counts)."""

    result: Any
    events: list[dict[str, Any]]
    cluster: ClusterRun
    feed_epochs: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def restarts(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] == "restart"]

    @property
    def resizes(self) -> list[dict[str, Any]]:
        return [e for e in self.events if e["kind"] != "restart"]


class Resume:
    """What a kind of run resumes from and how its chief's answer is read."""

    watch_steps = True  # the driver's stall check follows the global step (fit)

    def attempt_plan(self, plan: RunPlan) -> RunPlan:
        """``plan`` with the resume point of the next attempt."""
        return plan

    def collect(self, cluster: ClusterRun) -> None:
        """Keeps what an ended attempt left (called whatever the attempt's end)."""

    def resume_point(self) -> tuple[int, str | None]:
        """The step the next attempt starts from and, for a function, its checkpoint."""
        raise NotImplementedError

    def read(self, done: dict) -> tuple[Any, bool]:
        """The chief's ``done`` data as this kind of run keeps it, and whether it paused.

        Raises:
            ResultRejected: a result naming a path outside the model directory.
        """
        raise NotImplementedError

    def first_step_wall(self, result: Any) -> float | None:
        """When the attempt's first step ended (``time.time()``), if it says."""
        return None


class CheckpointResume(Resume):
    """``fit``: the chief's :class:`ProcessResult`; every attempt resumes from the latest
    checkpoint in the model directory (the processes find it themselves)."""

    def __init__(self, model_dir: str):
        self.model_dir = model_dir

    def attempt_plan(self, plan: RunPlan) -> RunPlan:
        if plan.train.input_mode not in ("spark", "files"):
            return plan
        step = artifacts.latest_checkpoint_step(self.model_dir)
        feed = artifacts.checkpoint_feed(self.model_dir, step) if step else None
        if plan.train.input_mode == "files":  # each process places its shard's stream
            return dataclasses.replace(plan, feed_start=feed, feed_start_step=step)
        if step and (feed is None or "cursor" not in feed):  # an older sparktf's checkpoint
            feed = Position().advance(step, plan.global_batch, plan.data.rows).to_dict()
        return dataclasses.replace(plan, feed_start=feed, feed_start_step=step)

    def resume_point(self) -> tuple[int, str | None]:
        return artifacts.latest_checkpoint_step(self.model_dir), None

    def read(self, done: dict) -> tuple[ProcessResult, bool]:
        result = ProcessResult.from_dict(done, model_dir=self.model_dir)
        return result, result.end_reason == PAUSED

    def first_step_wall(self, result: ProcessResult) -> float | None:
        return result.first_step_wall


class ReportResume(Resume):
    """``run(train_fn)``: the chief's reports, the last :data:`~sparktf.train.wire.control.
    MAX_KEPT` kept across attempts in :attr:`history` (:attr:`reports` came in all,
    :attr:`dropped` of them are not kept; a checkpoint outside the model directory dropped
    with a warning); an attempt resumes from the last checkpoint reported
    (:attr:`~sparktf.train.process.context.TrainContext.restored_dir`), kept apart from the
    history, so that it is never lost with the reports that followed it."""

    watch_steps = False  # a function's steps are its own: reports may be far apart

    def __init__(self, model_dir: str):
        self.model_dir = model_dir
        self.history: list[dict] = []
        self.reports = 0  # every report of every attempt (their numbering goes on)
        self.dropped = 0  # the oldest reports, not in history
        self._checkpointed: dict | None = None  # the last report naming a checkpoint

    def attempt_plan(self, plan: RunPlan) -> RunPlan:
        entry = self._checkpointed or {}
        return dataclasses.replace(
            plan,
            resume_checkpoint=self.last_checkpoint(),
            reports_before=self.reports,
            # a DataFrame's feed goes on where the reported checkpoint left it
            feed_start=entry.get("feed"),
            feed_start_step=int(entry.get("step", 0)) if entry.get("feed") else 0,
        )

    def collect(self, cluster: ClusterRun) -> None:
        reports, checkpointed = cluster.chief_reports()
        self.reports += reports.total
        self.dropped += reports.dropped
        self.history.extend(self._checked(entry) for entry in reports)
        if len(self.history) > MAX_KEPT:
            self.dropped += len(self.history) - MAX_KEPT
            del self.history[:-MAX_KEPT]
        if checkpointed is not None:  # warned about above unless it was dropped
            checked = self._checked(checkpointed, warn=checkpointed not in reports)
            self._checkpointed = checked if checked.get("checkpoint") else self._checkpointed

    def _checked(self, entry: dict, *, warn: bool = True) -> dict:
        """``entry`` without its checkpoint when that is outside the model directory."""
        path = entry.get("checkpoint")
        if path is None or within(path, self.model_dir):
            return entry
        if warn:
            log.warning(
                "report %s: checkpoint %r is not under %s: ignored",
                entry.get("n"),
                path,
                self.model_dir,
            )
        return {k: v for k, v in entry.items() if k != "checkpoint"}

    def last_checkpoint(self) -> str | None:
        """The last checkpoint the chief reported (None: none)."""
        return self._checkpointed["checkpoint"] if self._checkpointed else None

    def resume_point(self) -> tuple[int, str | None]:
        entry = self._checkpointed
        return (int(entry.get("step", 0)), entry["checkpoint"]) if entry else (0, None)

    def read(self, done: dict) -> tuple[dict, bool]:
        return done, done.get("end_reason") == PAUSED


def run_attempts(spark, plan: RunPlan, tracker, resume: Resume, frame=None) -> Outcome:
    """Runs ``plan`` attempt after attempt until its chief is done (see the module).

    Raises:
        TrainingError: an attempt failed and the budget is spent (its error, with the history
            of an elastic run), the chief paused unasked, or its result was malformed.
        BelowMinimum: an elastic run could not place ``min_workers`` in time.
        ResultRejected: the chief's result named a path outside the model directory (at
            once: no restart).
        SlotsError: a run of a fixed size does not fit the cluster's task slots.
    """
    scaling, failure = plan.scaling, plan.run.failure
    budget = failure.max_resizes if scaling.elastic else failure.max_restarts
    events: list[dict[str, Any]] = []
    fed: list[dict[str, Any]] = []  # the passes of every attempt's feed
    workers = elastic.initial_size(spark, scaling, failure) if scaling.elastic else 0
    run_tags: set[str] = set()  # the tags of the run's Spark jobs: its tasks are its own
    while True:
        attempt = plan.with_workers(workers) if scaling.elastic else plan
        attempt = dataclasses.replace(
            resume.attempt_plan(attempt), attempt=len(events), event=events[-1] if events else None
        )
        cluster = grow = None
        try:
            with ClusterRun(spark, attempt, frame=frame, watch_steps=resume.watch_steps) as cluster:
                cluster.start()
                grow = elastic.GrowWatch(spark, cluster, attempt.scaling, scaling.num_workers)
                with tracker.follow(cluster), grow:
                    try:
                        done = cluster.wait()
                    finally:
                        resume.collect(cluster)
        except (TrainingError, gang.SlotsError) as exc:
            fed += _passes_fed(cluster, len(events))
            if isinstance(exc, ResultRejected | elastic.BelowMinimum):
                raise
            if not scaling.elastic and (isinstance(exc, gang.SlotsError) or len(events) >= budget):
                raise
            failed: BaseException | None = exc
        else:
            fed += _passes_fed(cluster, len(events))
            failed = None
            result, paused = resume.read(done)
            if events:
                events[-1]["training_again_at"] = resume.first_step_wall(result)
            if not paused:
                return Outcome(result, events, cluster, fed)
            if not cluster.control.pause:
                raise TrainingError(
                    "the chief reported a pause that the driver did not ask for: result refused"
                )
        if cluster is not None:
            run_tags |= cluster.job_tags
        resumed, reported = resume.resume_point()
        if failed is None:  # a pause: every process stopped at the checkpoint it saved
            cause, step = (grow.requested if grow else None) or cluster.control.pause, resumed
            new = _size(spark, plan, 0, "the pause", events, run_tags)
        else:
            cause, step = _message(failed), max(_last_step(cluster), resumed)
            new = workers
            if scaling.elastic:
                new = _size(spark, plan, workers, failed, events, run_tags)
        if scaling.elastic and len(events) >= budget:
            raise TrainingError(
                f"the elastic run changed {len(events)} times (FailureConfig.max_resizes) and "
                f"would again: {cause}{history_text(events)}"
            ) from failed
        old = workers if scaling.elastic else scaling.num_workers
        new = new if scaling.elastic else old
        kind = "grow" if new > old else "shrink" if new < old else "restart"
        event = Event(kind, old, new, step, resumed, cause, time.time(), reported)
        events.append(event.to_dict())
        tracker.attempt_event(events[-1])
        if scaling.elastic:
            log.warning("elastic run: %s (%d of %d events, FailureConfig.max_resizes)",
                        event.describe(), len(events), budget)  # fmt: skip
        else:
            log.warning("restart %d of %d: %s (FailureConfig.max_restarts)", len(events), budget,
                        event.describe().removeprefix(f"restart with {new} workers "))  # fmt: skip
        workers = new


def _size(spark, plan: RunPlan, prefer: int, after, events: list, run_tags: set[str]) -> int:
    """The workers of an elastic run's next attempt (:func:`elastic.size_now`, the run's own
    jobs known by ``run_tags``); below the minimum for too long the error names ``after``
    (what ended the last attempt) and the history of the run."""
    try:
        return elastic.size_now(
            spark,
            plan.scaling,
            wait_s=plan.run.failure.below_min_timeout_s,
            prefer=prefer,
            own_tags=run_tags,
        )
    except elastic.BelowMinimum as below:
        raise elastic.BelowMinimum(f"{below} after: {after}{history_text(events)}") from None


def record_outcome(result) -> None:
    """Adds what the driver saw of a run (the events between attempts, the feed's passes,
    the share of its time each process waited for its input and, for an input-bound run,
    the likely cause) to its model directory's ``sparktf_train.json``; a failure to write
    is logged, the run's result stands."""
    values = {
        "restarts": result.restarts,
        "resizes": result.resizes,
        "feed_epochs": result.feed_epochs,
        "input_wait": result.input_wait,
        "input_diagnosis": result.input_diagnosis,
    }
    try:
        artifacts.add_to_run_record(result.model_dir, values)
    except Exception as exc:  # the result is the caller's either way
        log.warning("could not add the run's events to %s: %s", artifacts.RUN_FILE, exc)


def _passes_fed(cluster: ClusterRun | None, attempt: int) -> list[dict[str, Any]]:
    """The epochs an ended attempt's feed gave whole and its training reached (its thread
    has ended with the attempt)."""
    if cluster is None or cluster.feed is None:
        return []
    return [{**e, "attempt": attempt} for e in cluster.feed.trained(_last_step(cluster))]


def _last_step(cluster: ClusterRun | None) -> int:
    """The highest step the processes of an ended attempt reported (0: none)."""
    if cluster is None or cluster.control is None:
        return 0
    steps = [n.progress.get("step", 0) for n in cluster.control.snapshot().values() if n.progress]
    return int(max(steps, default=0))


def _message(exc: BaseException) -> str:
    """An error as an event's cause (its message, or its type when it has none)."""
    return str(exc).strip() or type(exc).__name__


def history_text(events: list[dict]) -> str:
    """What happened to the run so far, for its error (each cause's first line)."""
    lines = []
    for e in events:
        cause = (e["cause"].splitlines() or [""])[0]
        event = Event(e["kind"], e["from"], e["to"], e["step"], e["resumed_from_step"], cause,
                      e["time"], e.get("resumed_from_checkpoint"))  # fmt: skip
        lines.append(f"\n  {event.describe()}")
    return "; history:" + "".join(lines) if lines else "; no event before"
