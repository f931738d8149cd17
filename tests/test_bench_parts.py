"""Pure parts of the benchmarks: bench/train.py's start-up phases, bench/wire.py's traffic
classes and bound (what their figures are made of)."""

from __future__ import annotations

import importlib.util
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.unit


def _load(name: str):
    sys.path.insert(0, str(ROOT / "bench"))  # as the scripts run: `import common`
    try:
        spec = importlib.util.spec_from_file_location(
            f"bench_{name}", ROOT / "bench" / f"{name}.py"
        )
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module
    finally:
        sys.path.remove(str(ROOT / "bench"))


def test_the_start_up_phases_add_up_to_the_time_to_first_step():
    train = _load("train")
    startup = {"launched": 2.5, "joined": 3.0, "tensorflow_imported": 4.25, "first_step": 7.0}
    got = train.phases(startup)
    assert got == {
        "to_launched": 2.5,
        "launched_to_joined": 0.5,
        "joined_to_tensorflow_imported": 1.25,
        "tensorflow_imported_to_first_step": 2.75,
    }
    assert sum(got.values()) == pytest.approx(startup["first_step"])


def test_the_wire_bound_and_the_traffic_classes():
    wire = _load("wire")
    # a ring all-reduce: 2 (N - 1) / N of the gradient per worker, N workers
    assert wire.bound("allreduce", 2, 1000, 1200) == 2000
    assert wire.bound("allreduce", 4, 1000, 1200) == 6000
    assert wire.bound("ps", 2, 1000, 1200) == 2400  # every variable pulled, then pushed
    assert wire.category("tf", "tf") == "tensorflow"
    assert wire.category("python", "tf") == wire.category("tf", "python") == "sparktf"
    assert wire.category("tf", "jvm") == wire.category("worker", "jvm") == "spark"
    assert wire.category("worker", "tf") == "feed"
    assert wire._endpoint("[::ffff:10.231.0.13]:4040") == ("10.231.0.13", "4040")
    assert wire._endpoint("127.0.0.53%lo:53") == ("127.0.0.53", "53")
    assert wire._same_host("10.0.0.1", "10.0.0.1") and not wire._same_host("10.0.0.1", "10.0.0.2")
