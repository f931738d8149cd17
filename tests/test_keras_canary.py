"""The canary of sparktf's Keras mend (:mod:`sparktf.train.process.keras_fit`): Keras 3
``model.fit`` under ``MultiWorkerMirroredStrategy``, two plain Python processes on loopback
(tests/keras_canary.py, started once for the module; no Spark, no JVM).

- without the mend, ``fit`` must still fail as keras-team/keras#20585 says, and the failing
  version must be one the mend knows (``KNOWN_BROKEN``); when a release trains, the canary
  fails and says to retire the mend;
- with only the model's build mended, it must still fail at the metrics' reduction;
- ``keras_fit.apply()`` on a version outside ``KNOWN_BROKEN`` leaves Keras alone and warns;
- as sparktf runs it (after ``keras_fit.apply()``), each worker must report the loss of both
  workers' batches (learning rate 0: the global mean, computed here with numpy), and train
  as plain gradient descent on the global batches would.

Unit tier: the workers are Python processes on loopback, TensorFlow on the CPU; about 16 s.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sparktf.ports import server_port
from sparktf.train.process.keras_fit import KNOWN_BROKEN
from tests import keras_canary

pytestmark = [pytest.mark.unit, pytest.mark.tensorflow_only]  # see pyproject.toml

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "keras_canary.py"
DEADLINE_S = 120.0  # both workers, start to finish; about 16 s on 2 idle cores

# How keras#20585 shows, in the order the trainer meets its two faults.
BUILD_FAULT = "Attempt to convert a value (PerReplica"
REDUCTION_FAULT = "Invalid reduction dimension 0"

RETIRE = (
    "keras-team/keras#20585 looks fixed in Keras {version}: model.fit under "
    "MultiWorkerMirroredStrategy trained on both workers without sparktf's mend, so "
    "{version} does not belong in KNOWN_BROKEN. Once no stack's lock file (requirements.lock, "
    "requirements-petastorm.lock) holds a version of KNOWN_BROKEN {known}, retire the mend: "
    "delete sparktf/train/process/keras_fit.py and its call in "
    "sparktf/train/process/function.py, its entry in ALLOWED_PATCHES of tests/test_house.py, "
    "this canary (tests/test_keras_canary.py, tests/keras_canary.py) and "
    "tests/test_function_run.py's test of the mend, and the mention of the mend in "
    "docs and docstrings (grep keras_fit)."
)


def _start(index: int, ports: list[int], out: Path) -> subprocess.Popen:
    env = dict(
        os.environ,
        CUDA_VISIBLE_DEVICES="",  # the CPU: the fault is in Keras's trainer, not a device's
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    )
    env.pop("TF_CONFIG", None)
    with open(out.with_suffix(".log"), "w") as log:  # the child has its own copy
        return subprocess.Popen(
            [sys.executable, str(SCRIPT), str(index), ",".join(map(str, ports)), str(out)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            env=env,
        )


def _tail(path: Path, chars: int = 3000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "(no output)"


def run_pair(directory: Path) -> tuple[list[dict | None], str]:
    """Both workers, to their end or the deadline; what each wrote (None: nothing) and both
    logs' tails. Whatever happens, no worker is left running."""
    directory.mkdir(parents=True, exist_ok=True)
    ports = [server_port(), server_port()]
    while ports[1] == ports[0]:
        ports[1] = server_port()
    outs = [directory / f"worker{i}.json" for i in range(keras_canary.WORKERS)]
    procs, killed = [], []
    try:
        for i, out in enumerate(outs):
            procs.append(_start(i, ports, out))
        deadline = time.monotonic() + DEADLINE_S
        for proc in procs:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                break
    finally:
        for i, proc in enumerate(procs):
            if proc.poll() is None:
                proc.kill()
                killed.append(i)
            proc.wait(timeout=30)
    logs = "\n".join(
        f"--- worker {i} (exit {p.returncode}{', killed at the deadline' if i in killed else ''}"
        f"; ports {ports}):\n" + _tail(out.with_suffix(".log"))
        for i, (p, out) in enumerate(zip(procs, outs, strict=True))
    )
    results = [json.loads(out.read_text()) if out.exists() else None for out in outs]
    return results, logs


@pytest.fixture(scope="module")
def workers(tmp_path_factory) -> list[dict]:
    """What the two workers saw; a second pair on new ports when the first ended early
    without results (a port taken meanwhile), never after the deadline."""
    started = time.monotonic()
    for attempt in range(2):
        results, logs = run_pair(tmp_path_factory.mktemp(f"keras-canary-{attempt}"))
        if all(r is not None and "crash" not in r for r in results):
            return results
        if time.monotonic() - started > DEADLINE_S / 2:
            break
    crashes = [r.get("crash") if r else "no result" for r in results]
    pytest.fail(f"the canary's workers did not finish: {crashes}\n{logs}")


def _error(phase: dict) -> str | None:
    """A phase's failure as one line ('ValueError: first line ... last line'), or None."""
    error = phase.get("error")
    if not error:
        return None
    lines = error["message"].strip().splitlines() or [""]
    shown = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return f"{error['type']}: {shown[:400]}"


def test_keras_fit_still_fails_under_multi_worker_without_the_mend(workers):
    version = workers[0]["keras"]
    errors = [_error(w["plain"]) for w in workers]
    if not any(errors):
        pytest.fail(RETIRE.format(version=version, known=KNOWN_BROKEN))
    for error in errors:
        assert error and (BUILD_FAULT in error or REDUCTION_FAULT in error), (
            f"Keras {version}: model.fit under MultiWorkerMirroredStrategy fails otherwise "
            f"than keras-team/keras#20585 says, on some worker: {errors}"
        )
    assert version in KNOWN_BROKEN, (
        f"Keras {version} still fails keras-team/keras#20585 ({errors[0]}), but it "
        f"is not in KNOWN_BROKEN {KNOWN_BROKEN}, so keras_fit.apply() leaves it unmended and "
        f"every multi-worker model.fit of sparktf fails: add {version!r} to KNOWN_BROKEN in "
        "sparktf/train/process/keras_fit.py (after the other tests here pass with it)"
    )
    assert all(BUILD_FAULT in e for e in errors), (
        f"Keras {version} builds the model from a distributed batch now (it fails only at the "
        "metrics' reduction): the mend's _maybe_symbolic_build replacement can go. "
        f"Errors: {errors}"
    )


def test_with_the_build_mended_keras_still_fails_at_the_metrics_reduction(workers):
    version = workers[0]["keras"]
    if not workers[0]["applied"]:
        pytest.skip(f"keras_fit.apply() does not mend Keras {version} (not in KNOWN_BROKEN)")
    errors = [_error(w["build_mended"]) for w in workers]
    assert all(errors), (
        f"Keras {version} reduces the metrics of a multi-worker fit now: the mend's "
        f"reduce_per_replica replacement can go (errors: {errors})"
    )
    assert all(REDUCTION_FAULT in e for e in errors), errors


def test_apply_leaves_a_keras_it_does_not_know_alone_and_says_what_to_do(workers):
    for w in workers:
        seen = w["unknown_version"]
        assert seen["applied"] is False and seen["untouched"], seen
        assert len(seen["warnings"]) == 1, seen
        assert "tests/test_keras_canary.py" in seen["warnings"][0]
        assert "KNOWN_BROKEN" in seen["warnings"][0]


def test_the_mended_fit_reports_the_loss_of_both_workers_batches(workers):
    """Learning rate 0: the model stays as made, and the loss Keras reports on each worker
    must be the mean over both workers' batches, not over its own."""
    want = keras_canary.expected(epochs=1, learning_rate=0.0)["losses"][0]
    own = [keras_canary.expected_alone(i) for i in range(keras_canary.WORKERS)]
    assert all(abs(o - want) > 1.0 for o in own), "the workers' data must tell them apart"
    for index, w in enumerate(workers):
        phase = w["sparktf"]["rate_0"]
        assert not _error(phase), f"worker {index}: {_error(phase)}"
        assert phase["losses"][0] == pytest.approx(want, rel=1e-5), (
            f"worker {index} reports {phase['losses'][0]}; both workers' batches give {want}, "
            f"each worker's own {own}"
        )
        assert phase["kernel"] == pytest.approx(keras_canary.KERNEL.ravel().tolist())


def test_the_mended_fit_trains_as_gradient_descent_on_the_global_batches(workers):
    want = keras_canary.expected(keras_canary.EPOCHS, keras_canary.LEARNING_RATE)
    for index, w in enumerate(workers):
        phase = w["sparktf"].get("sgd", {"error": {"type": "skipped", "message": "rate 0"}})
        assert not _error(phase), f"worker {index}: {_error(phase)}"
        assert phase["losses"] == pytest.approx(want["losses"], rel=1e-4), f"worker {index}"
        assert phase["losses"][-1] < phase["losses"][0] / 2
        assert phase["kernel"] == pytest.approx(want["kernel"], rel=1e-4, abs=1e-5)
        assert phase["bias"] == pytest.approx(want["bias"], rel=1e-4, abs=1e-5)
