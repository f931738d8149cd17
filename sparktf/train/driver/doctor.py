"""The input-bound doctor: how long a run waited for its input, and why.

Every training process times the wait for each batch against its steps
(:class:`~sparktf.train.process.inputs.InputClock`) and reports it with its result. After
a run the driver gathers those figures and what the feed measured (:func:`gather`: the
passes' seconds in Spark, the frame's partitions and plan, the data's place), and when a
process waited more than :data:`THRESHOLD` of its training time it logs one WARNING with
the share waited, the likely cause and what to try (:func:`diagnose`, :func:`examine`).

The causes, in the order they are tried, each decided from a measured figure:

* ``hdfs``: the ``files`` input mode reads an ``hdfs://`` dataset;
* the ``spark`` feed, when its reader waited for Spark's rows for most of the time its
  process waited (Spark is the slow end):

  - ``partitions``: the frame fed has fewer partitions than there are processes (each
    epoch's plan runs in that many tasks);
  - ``plan``: a DataFrame whose plan reads no cache: it runs again every epoch;
  - ``hdfs``: the split's Parquet is read from HDFS every epoch;
  - ``cpu``: the hosts' CPUs were busy (at least :data:`BUSY`) while the processes waited;
  - ``spark``: none of these: the passes are slower than the training;

* otherwise the time went into the process's own reading:

  - ``chunk_size``: decoding one feed chunk took longer than the steps of the batches
    read ahead (:data:`READ_AHEAD`);
  - ``cpu``: the hosts' CPUs were busy;
  - ``reader``: none of these.

Importing this module imports neither TensorFlow nor Spark.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field
from typing import Any

from sparktf.train.driver import roles as roles_lib
from sparktf.train.plan import RunPlan

__all__ = ["BUSY", "READ_AHEAD", "THRESHOLD", "Diagnosis", "Evidence", "diagnose", "examine"]

log = logging.getLogger("sparktf.train")

THRESHOLD = 0.2  # a run that waited more than this share of its time is input-bound
BUSY = 0.9  # the hosts' CPUs this busy while the processes waited: contention
READ_AHEAD = 4  # the batches a feed reader decodes ahead (FeedReader.batches's prefetch)


@dataclass(frozen=True)
class Evidence:
    """What the driver measured of a run's input.

    ``timings``: each training process's figures by role name
    (:meth:`~sparktf.train.process.inputs.InputClock.stats`); ``mode``: ``spark`` or
    ``files``; ``data``: the dataset's path (or the name of a DataFrame); ``frame``: a
    DataFrame is fed (not a split's Parquet); ``processes``: those the feed fed;
    ``partitions``: of the frame fed; ``plan``: what its physical plan does
    (:func:`sparktf.train.feed.passes.plan_facts`); ``passes``: the feed's passes of the
    attempt, each with its ``seconds`` in Spark and its ``rows``.
    """

    timings: dict[str, dict[str, float]]
    mode: str
    data: str = ""
    frame: bool = False
    processes: int = 0
    partitions: int | None = None
    plan: dict[str, bool] = field(default_factory=dict)
    passes: list[dict[str, Any]] = field(default_factory=list)

    @property
    def worst(self) -> str | None:
        """The process that waited the largest share of its time (None: none measured)."""
        if not self.timings:
            return None
        return max(self.timings, key=lambda name: self.timings[name].get("wait_fraction", 0.0))

    @property
    def wait_fraction(self) -> float:
        """The largest share waited: under all-reduce the slowest input holds every
        process at the next collective."""
        worst = self.worst
        return self.timings[worst].get("wait_fraction", 0.0) if worst else 0.0

    def share(self, name: str) -> float | None:
        """``name`` (``feed_wait_s``, ``decode_s``) of the worst process as a share of its
        measured time; None when it did not report it."""
        timing = self.timings.get(self.worst or "", {})
        span = timing.get("wait_s", 0.0) + timing.get("step_s", 0.0)
        return timing[name] / span if name in timing and span > 0 else None

    def cpu_busy(self) -> float | None:
        """How busy the busiest host's CPUs were while its process trained (0-1)."""
        found = [t["cpu_busy"] for t in self.timings.values() if "cpu_busy" in t]
        return max(found) if found else None

    def pass_seconds(self) -> float | None:
        """The median seconds of the feed's whole passes (a pass cut short is left out)."""
        whole = [p["seconds"] for p in self.passes if "seconds" in p and not p.get("skipped")]
        return statistics.median(whole) if whole else None

    def pass_rows(self) -> int:
        rows = [sum(p.get("rows", {}).values()) for p in self.passes if not p.get("skipped")]
        return max(rows, default=0)


@dataclass(frozen=True)
class Diagnosis:
    """An input-bound run: the share waited (by ``process``), the likely ``cause`` (a key
    of the module's list), what was measured for it and what to try."""

    wait_fraction: float
    process: str
    cause: str
    found: str  # the cause in words, with its numbers
    advice: str
    evidence: dict[str, Any] = field(default_factory=dict)

    def message(self, timings: dict[str, dict[str, float]]) -> str:
        others = ", ".join(
            f"{name} {t['wait_fraction']:.0%}"
            for name, t in sorted(timings.items())
            if name != self.process and "wait_fraction" in t
        )
        return (
            f"input-bound: {self.process} waited {self.wait_fraction:.0%} of its training time "
            f"for its next batch{f' ({others})' if others else ''}; likely cause: {self.found}; "
            f"try: {self.advice}"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "wait_fraction": round(self.wait_fraction, 4),
            "process": self.process,
            "cause": self.cause,
            "found": self.found,
            "advice": self.advice,
            "evidence": self.evidence,
        }


def diagnose(ev: Evidence) -> Diagnosis | None:
    """The likely cause of an input-bound run (see the module), or None when no process
    waited more than :data:`THRESHOLD` of its time."""
    fraction = ev.wait_fraction
    if fraction <= THRESHOLD or ev.worst is None:
        return None
    feed_wait = ev.share("feed_wait_s")
    numbers = {
        "wait_fraction": round(fraction, 4),
        "mode": ev.mode,
        "feed_wait_fraction": None if feed_wait is None else round(feed_wait, 4),
        "cpu_busy": ev.cpu_busy(),
        "partitions": ev.partitions,
        "processes": ev.processes,
        "pass_seconds": ev.pass_seconds(),
        **{f"plan_{k}": v for k, v in ev.plan.items()},
    }
    if ev.mode == "spark" and feed_wait is not None and feed_wait >= fraction / 2:
        cause, found, advice = _spark_bound(ev, feed_wait)
    else:
        cause, found, advice = _reader_bound(ev)
    return Diagnosis(fraction, ev.worst, cause, found, advice, numbers)


def _on_hdfs(data: str) -> bool:
    return data.lower().startswith(("hdfs://", "webhdfs://", "swebhdfs://"))


def _cpu(ev: Evidence) -> tuple[str, str, str] | None:
    busy = ev.cpu_busy()
    if busy is None or busy < BUSY:
        return None
    who = "Spark's feeding tasks and TensorFlow" if ev.mode == "spark" else "TensorFlow's threads"
    return (
        "cpu",
        f"CPU contention: the hosts' CPUs were {busy:.0%} busy while the processes waited "
        f"({who} share the same cores)",
        "fewer TensorFlow threads (ScalingConfig.threads_per_worker) so that the input keeps "
        "a core, executors with more cores than task slots, or a cheaper input (cache() a "
        "DataFrame, select only the columns the model reads)",
    )


def _spark_bound(ev: Evidence, feed_wait: float) -> tuple[str, str, str]:
    """The causes when the feed's reader waited for Spark's rows."""
    seconds, rows = ev.pass_seconds(), ev.pass_rows()
    passes = (
        f"each epoch's pass took {seconds:.1f} s in Spark"
        + (f" ({1000 * seconds / rows:.2f} ms a row)" if rows else "")
        if seconds is not None
        else "no pass ended"
    )
    waited = f"the feed's reader waited {feed_wait:.0%} of the time for Spark's rows"
    if ev.partitions is not None and ev.processes and ev.partitions < ev.processes:
        return (
            "partitions",
            f"too few partitions: the DataFrame has {ev.partitions} for {ev.processes} "
            f"processes, so each epoch's plan runs in {ev.partitions} Spark task(s); "
            f"{passes}, {waited}",
            f"df.repartition(N), N at least {ev.processes} (better: the executors' cores), "
            "where the rows are read, before the costly part of the plan; or cache() it",
        )
    if ev.frame and not ev.plan.get("cached"):
        udf = ", a Python UDF among it," if ev.plan.get("python_udf") else ""
        return (
            "plan",
            f"a slow DataFrame plan run again every epoch (its plan{udf} reads no cache): "
            f"{passes}, {waited}",
            "df.cache() (or persist(), or write it out once and train from the copy) before "
            "training: the first pass fills the cache, the next epochs read it",
        )
    if not ev.frame and _on_hdfs(ev.data):
        return (
            "hdfs",
            f"HDFS reads: Spark reads the split's Parquet from {ev.data} every epoch; "
            f"{passes}, {waited}",
            "more executor cores for the feed, or feed a cached DataFrame of the split "
            "(fit(TrainConfig(data=spark.read.parquet(...).cache())))",
        )
    return _cpu(ev) or (
        "spark",
        f"Spark's passes are slower than the training: {passes}, {waited}",
        "more executor cores or executors for the feed, fewer or smaller columns (select "
        "what the model reads first), or a cached DataFrame",
    )


def _reader_bound(ev: Evidence) -> tuple[str, str, str]:
    """The causes when the process's own reading kept it waiting."""
    if ev.mode == "files" and _on_hdfs(ev.data):
        return (
            "hdfs",
            f"HDFS reads: every process reads its shard of {ev.data} over WebHDFS",
            "a copy of the dataset on local disks, fewer and larger files, or the spark input "
            "mode (Spark's executors read HDFS in parallel and feed the processes)",
        )
    timing = ev.timings[ev.worst or ""]
    chunks, decode = timing.get("chunks", 0), timing.get("decode_s", 0.0)
    steps, step_s = timing.get("steps", 0), timing.get("step_s", 0.0)
    if chunks and steps:
        per_chunk, per_step = decode / chunks, step_s / steps
        if per_chunk > READ_AHEAD * per_step:
            rows = timing.get("rows", 0) / chunks
            fit_rows = max(1, int(rows * READ_AHEAD * per_step / per_chunk / 2))
            return (
                "chunk_size",
                f"the feed's chunk size: decoding one chunk ({rows:.0f} rows) took "
                f"{1000 * per_chunk:.0f} ms, longer than the {READ_AHEAD} batches read ahead "
                f"last ({1000 * READ_AHEAD * per_step:.0f} ms of steps)",
                "smaller chunks: spark.sql.execution.arrow.maxRecordsPerBatch (each Arrow "
                f"batch of a feeding task is at most one chunk) of about {fit_rows} rows",
            )
    return _cpu(ev) or (
        "reader",
        "the process's own reading"
        + (" (decoding the feed's chunks and re-batching them)" if ev.mode == "spark" else "")
        + " is slower than its steps",
        "fewer or smaller columns, a larger batch per step, or fewer processes per host",
    )


def _timing(raw: Any) -> dict[str, float]:
    """A process's reported figures, the numbers only."""
    if not isinstance(raw, dict):
        return {}
    return {
        str(k): float(v)
        for k, v in raw.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }


def gather(plan: RunPlan, cluster) -> Evidence:
    """What the last attempt's processes and feed measured (``cluster``: its
    :class:`~sparktf.train.driver.cluster.ClusterRun`, ended). A process whose result did
    not come counts by its last progress report."""
    timings: dict[str, dict[str, float]] = {}
    if cluster.control is not None and cluster.roles:
        nodes = cluster.control.snapshot()
        for key in roles_lib.training_keys(cluster.roles):
            node = nodes.get(key)
            if node is None:
                continue
            timing = _timing((node.done or {}).get("input_timing"))
            if not timing and "input_wait" in node.progress:
                timing = _timing({"wait_fraction": node.progress["input_wait"]})
            if "wait_fraction" in timing:
                timings[cluster.roles[key].name] = timing
    feed = cluster.feed
    return Evidence(
        timings=timings,
        mode="spark" if plan.train.input_mode == "spark" else "files",
        data=plan.data.data,
        frame=plan.data.frame,
        processes=len(feed.nodes) if feed is not None else 0,
        partitions=feed.partitions if feed is not None else None,
        plan=dict(feed.plan_facts) if feed is not None else {},
        passes=list(feed.epochs) if feed is not None else [],
    )


def examine(plan: RunPlan, cluster) -> tuple[dict[str, float], dict[str, Any] | None]:
    """The share each process waited for its input (by role name) and, for an input-bound
    run, the diagnosis (logged as one WARNING)."""
    ev = gather(plan, cluster)
    waits = {name: round(t["wait_fraction"], 4) for name, t in ev.timings.items()}
    found = diagnose(ev)
    if found is None:
        if waits:
            log.info("input wait: %s", ", ".join(f"{k} {v:.0%}" for k, v in sorted(waits.items())))
        return waits, None
    log.warning("%s", found.message(ev.timings))
    return waits, found.to_dict()
