"""bench/results.py, which bench/all.sh calls to write bench/RESULTS.md: on a fixture of
result files shaped as bench/common.write_results writes them."""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def results_module():
    spec = importlib.util.spec_from_file_location("bench_results", ROOT / "bench" / "results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _goal(value, goal, op=">="):
    met = value is not None and (value >= goal if op == ">=" else value <= goal)
    return {"value": value, "goal": goal, "op": op, "met": met}


MACHINE = {"cpu": "Test CPU 9000", "cpus": 2, "memory_gib": 7.5, "load_average_1m": 1.25}


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    """One run's result files, plus an older convert result and a file of another kind."""
    files = {
        "convert-20261201-090000.json": {"goals": {"old": _goal(9.0, 1.0)}},
        "convert-20261202-100000.json": {
            "benchmark": "convert",
            "goals": {
                "Parquet / TFRecord": _goal(0.761, 1.3, "<="),
                "speed": _goal(0.5, 1.0),
                "just under": _goal(0.7997, 0.8),
            },
            "machine": MACHINE,
            "finished_at": "2026-12-02 10:00:00",
        },
        "feed-20261202-101500.json": {
            "benchmark": "feed",
            "goals": {"sparktf / petastorm converter": _goal(None, 1.0)},
            "machine": {**MACHINE, "load_average_1m": 3.5},
            "finished_at": "2026-12-02 10:15:00",
        },
        "train-gpu-fp32-20261202-110000.json": {"goals": {"gpu": _goal(1.0, 0.9)}},
    }
    for name, result in files.items():
        (tmp_path / name).write_text(json.dumps(result))
    (tmp_path / "convert.log").write_text("not a result\n")
    return tmp_path


def test_latest_takes_the_newest_file_of_each_benchmark(results_module, run_dir):
    found = results_module.latest(run_dir)
    assert {name: path.name for name, path in found.items()} == {
        "convert": "convert-20261202-100000.json",
        "feed": "feed-20261202-101500.json",
    }
    gpu = results_module.latest(run_dir, names=["train-gpu-fp32"])
    assert list(gpu) == ["train-gpu-fp32"]
    old = run_dir / "feed-20261202-101500.json"
    os.utime(old, (1000, 1000))
    assert "feed" not in results_module.latest(run_dir, since=2000)


def test_the_page_has_the_table_the_machine_and_the_stack(results_module, run_dir):
    files = results_module.latest(run_dir)
    text = results_module.page(files, stack="pyspark 9.9", note="Sizes: small.")
    assert text.startswith("# Benchmark results\n")
    assert "| convert | Parquet / TFRecord | 0.761 | ≤ 1.3 | yes |" in text
    assert "| convert | speed | 0.5 | ≥ 1.0 | no |" in text
    assert "| convert | just under | 0.7997 | ≥ 0.8 | no |" in text  # not "0.8"
    assert "| feed | sparktf / petastorm converter | not measured | ≥ 1.0 | no |" in text
    assert "old" not in text  # the older convert result is not shown
    assert "- **Finished:** 2026-12-02 10:15:00" in text
    # The machine of the results (the load average of the last one), not of this machine.
    assert "Test CPU 9000, 2 CPU cores, 7.5 GiB memory, load average 3.5 at the end" in text
    assert "- **Stack:** pyspark 9.9" in text
    assert "1 of 4 goals met." in text
    assert "`convert-20261202-100000.json`, `feed-20261202-101500.json`" in text
    assert text.endswith("\nSizes: small.\n")


def test_the_command_line_writes_the_page_and_checks_expected_results(
    results_module, run_dir, tmp_path, capsys
):
    out = tmp_path / "RESULTS.md"
    argv = ["--results", str(run_dir), "--output", str(out), "--expect", "convert", "feed"]
    assert results_module.main(argv) == 0
    printed = capsys.readouterr().out
    assert "1 of 4 goals met" in printed and "Parquet / TFRecord" in printed
    text = out.read_text()
    assert "| feed |" in text
    assert "Python " in text and "pyspark " in text  # --stack auto: this interpreter's
    assert results_module.main([*argv, "train"]) == 1  # an expected benchmark without result
    assert "no results for: train" in capsys.readouterr().err


def test_a_whole_run_records_its_wall_time_and_keeps_its_files(
    results_module, run_dir, tmp_path, capsys
):
    kept = tmp_path / "runs" / "20261202-1200"
    out = tmp_path / "RESULTS.md"
    argv = ["--results", str(run_dir), "--output", str(out), "--keep", str(kept)]
    assert results_module.main([*argv, "--wall-s", "901", "--took", "convert=60", "feed=70"]) == 0
    capsys.readouterr()
    (wall,) = run_dir.glob("all-*.json")
    result = json.loads(wall.read_text())
    assert result["goals"]["all.wall_s"] == {"value": 901.0, "goal": 900, "op": "<=", "met": False}
    assert result["seconds"] == {"convert": 60.0, "feed": 70.0}
    assert result["machine"]["cpus"] == os.cpu_count()
    assert sorted(p.name for p in kept.iterdir()) == sorted(
        ["convert-20261202-100000.json", "feed-20261202-101500.json", wall.name]
    )
    text = out.read_text()
    assert "| all | all.wall_s | 901 | ≤ 900 | no |" in text
    assert f"Result files (in {kept})" in text
    with pytest.raises(SystemExit):
        results_module.main([*argv, "--wall-s", "10", "--took", "convert"])
    assert "expected NAME=SECONDS" in capsys.readouterr().err


def test_the_committed_results_page_comes_from_the_committed_run(results_module):
    """bench/RESULTS.md was written by this code from the run directory it names under
    bench/runs/: its table is that run's."""
    table = (ROOT / "bench" / "RESULTS.md").read_text()
    named = re.search(r"Result files \(in (bench/runs/[0-9-]+)\)", table)
    assert named, "bench/RESULTS.md names no run directory under bench/runs/"
    files = results_module.latest(ROOT / named[1])
    assert set(files) >= set(results_module.BENCHMARKS) - {"all"}
    expected = results_module.page(files, stack="-")
    rows = [line for line in expected.splitlines() if line.startswith("| ")]
    missing = [row for row in rows if row not in table]
    assert not missing, f"rows of {named[1]} not on bench/RESULTS.md: {missing}"
