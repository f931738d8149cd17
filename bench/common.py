"""What the benchmarks share: a throwaway HDFS, a process-tree memory sampler, results files."""

from __future__ import annotations

import json
import os
import socket
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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def hdfs() -> Iterator[str]:
    """A fresh single-node HDFS (scripts/hdfs.sh) for the block; yields its hdfs:// URI.

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
            yield values["HDFS_URI"]
        finally:
            subprocess.run([script, "stop", *args], capture_output=True, timeout=120)
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


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


def write_results(name: str, result: dict) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}-{datetime.now().strftime('%Y%m%d-%H%M%S')}.json"
    text = json.dumps(result, indent=2)
    path.write_text(text + "\n")
    print(text)
    print(f"written to {path}", file=sys.stderr)
    return path


def machine() -> dict:
    return {
        "cpus": os.cpu_count(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
    }


def timed(fn, *args, **kwargs) -> tuple[float, object]:
    started = time.perf_counter()
    value = fn(*args, **kwargs)
    return time.perf_counter() - started, value
