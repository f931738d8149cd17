"""The parts of the training loop that need no cluster: the process result that crosses the
control channel, the evaluation tracker's records and best exports, the reporter's
snapshots with what a task draws (a GAN's samples), the input whose first batch is
fetched while the model is built, and a TensorFlow process started before its node joined."""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from sparktf.train.config import RunConfig, ScalingConfig
from sparktf.train.errors import TrainingError
from sparktf.train.plan import ProcessSpec
from sparktf.train.process.evaluation import BestMetric, EvaluationTracker
from sparktf.train.result import ProcessResult
from tests import helpers

pytestmark = pytest.mark.unit

TINY_DCGAN = {"gf_dim": 4, "df_dim": 4, "gfc_dim": 16, "dfc_dim": 16}


# ----------------------------------------------------------------------------- the result


def _result(**changes) -> ProcessResult:
    values = dict(
        start_step=4,
        final_step=12,
        end_reason="target steps reached",
        metrics={"loss": 0.5, "accuracy": 0.75},
        last_checkpoint="hdfs://nn:8020/m/checkpoints/ckpt-12",
        export_dir="hdfs://nn:8020/m/export/12",
        examples=64,
        examples_per_sec=123.5,
        first_step_wall=1_700_000_000.25,
        fed_rows=96,
        dropped_rows=0,
        gpus=["/device:GPU:0"],
        progress={"step": 12, "target": 12, "epoch": 1.5, "eval": {"step": 12, "loss": 0.6}},
        eval_metrics={"loss": 0.6, "accuracy": 0.7},
        eval_history=[{"step": 6, "loss": 0.9}, {"step": 12, "loss": 0.6, "accuracy": 0.7}],
        best_export="hdfs://nn:8020/m/export_best/12",
        startup={
            "launched": 1_699_999_990.5,
            "joined": 1_699_999_993.0,
            "first_step": 1_700_000_000.25,
        },
    )
    return ProcessResult(**{**values, **changes})


def test_process_result_survives_the_control_channel_json():
    result = _result()
    wire = json.loads(json.dumps(result.to_dict()))
    back = ProcessResult.from_dict(wire)
    assert back == result
    # an evaluation's step stays an integer: export_best/<step> is named by it
    assert all(type(e["step"]) is int for e in back.eval_history)
    # the control server keeps a done event's progress as the node's latest state
    assert wire["progress"]["step"] == 12
    assert list(back.startup) == ["launched", "joined", "first_step"]  # in the order reached


def test_process_result_of_a_process_that_fed_nothing_and_evaluated_nothing():
    minimal = {"start_step": 0, "final_step": 3, "end_reason": "end of the data"}
    result = ProcessResult.from_dict(minimal)
    assert (result.fed_rows, result.first_step_wall, result.best_export) == (None, None, None)
    assert result.eval_history == [] and result.metrics == {}
    assert ProcessResult.from_dict(json.loads(json.dumps(result.to_dict()))) == result
    with pytest.raises(TrainingError, match="lacks 'final_step'"):
        ProcessResult.from_dict({"start_step": 0, "end_reason": "x"})
    with pytest.raises(TrainingError, match="malformed"):
        ProcessResult.from_dict({**minimal, "metrics": {"loss": "not a number"}})


# ----------------------------------------------------------------------------- evaluation


def test_best_metric_keeps_the_better_value_in_its_direction():
    loss = BestMetric("loss", higher_is_better=False)
    assert loss.improves({"loss": 2.0}, 2)  # the first always does
    assert not loss.improves({"loss": 2.5}, 4)
    assert not loss.improves({"loss": 2.0}, 6)  # a tie is no improvement
    assert loss.improves({"loss": 1.0}, 8) and (loss.value, loss.step) == (1.0, 8)
    accuracy = BestMetric("accuracy", higher_is_better=True)
    assert accuracy.improves({"accuracy": 0.5, "loss": 9.0}, 2)
    assert not accuracy.improves({"accuracy": 0.4}, 4)
    assert accuracy.improves({"accuracy": 0.6}, 6) and accuracy.step == 6


class _Events:
    def __init__(self, enabled: bool = True):
        self.enabled = enabled
        self.scalar_calls: list[tuple[int, dict]] = []
        self.image_calls: list[tuple[int, str, tuple]] = []
        self.histogram_steps: list[int] = []
        self.closed = False

    def scalars(self, step, values):
        self.scalar_calls.append((step, dict(values)))

    def histograms(self, step, names, weights):
        assert len(names) == len(weights)
        self.histogram_steps.append(step)

    def images(self, step, name, images):
        self.image_calls.append((step, name, tuple(np.asarray(images).shape)))

    def close(self):
        self.closed = True


class _Control:
    def __init__(self):
        self.sent: list[tuple[str, dict]] = []
        self.progress: dict = {}

    def send(self, event, data=None):
        self.sent.append((event, data))

    def set_progress(self, progress):
        self.progress = dict(progress)


def _tracker(losses: dict[int, float], *, best: BestMetric | None):
    """A tracker whose evaluation of the weights ``[np.array(step)]`` gives ``losses[step]``."""
    exported: list[int] = []
    events, control = _Events(), _Control()

    def export_best(weights, step):
        assert int(weights[0]) == step  # the weights of the step that was evaluated
        exported.append(step)
        return f"/m/export_best/{step}"

    tracker = EvaluationTracker(
        lambda weights: {"loss": losses[int(weights[0])], "accuracy": 0.5},
        split="test",
        events=events,
        control=control,
        best=best,
        export_best=export_best,
    )
    return tracker, exported, events, control


def test_evaluation_tracker_records_each_evaluation_and_exports_only_improvements():
    losses = {2: 3.0, 4: 2.0, 6: 2.5, 8: 1.0}
    tracker, exported, events, control = _tracker(losses, best=BestMetric("loss", False))
    assert tracker.latest is None and tracker.metrics == {}
    for step in sorted(losses):
        tracker.evaluate(step, [np.array(step)])
    assert exported == [2, 4, 8]
    assert tracker.best_export == "/m/export_best/8"
    assert [e["step"] for e in tracker.history] == [2, 4, 6, 8]
    assert tracker.latest == {"step": 8, "loss": 1.0, "accuracy": 0.5}
    assert tracker.metrics == {"loss": 1.0, "accuracy": 0.5}
    assert [s for s, _ in events.scalar_calls] == [2, 4, 6, 8]
    assert control.sent == [("eval", e) for e in tracker.history]
    tracker.close()
    assert events.closed


def test_evaluation_tracker_without_export_best_exports_nothing():
    tracker, exported, _, _ = _tracker({2: 3.0, 4: 2.0}, best=None)
    tracker.evaluate(2, [np.array(2)])
    tracker.evaluate(4, [np.array(4)])
    assert exported == [] and tracker.best_export is None and len(tracker.history) == 2


def test_evaluations_beside_training_are_recorded_one_at_a_time_in_step_order():
    release = threading.Event()
    losses = {2: 3.0, 4: 2.0}

    def evaluate(weights):
        step = int(weights[0])
        if step == 2:
            assert release.wait(10)
        return {"loss": losses[step]}

    events, control = _Events(), _Control()
    exported: list[int] = []
    tracker = EvaluationTracker(
        evaluate,
        split="test",
        events=events,
        control=control,
        best=BestMetric("loss", False),
        export_best=lambda weights, step: exported.append(step) or f"/m/export_best/{step}",
    )
    tracker.evaluate(2, [np.array(2)], aside=True)
    tracker.collect(wait=False)  # still running: nothing recorded yet
    assert tracker.history == []
    release.set()
    tracker.evaluate(4, [np.array(4)], aside=True)  # waits for step 2's first
    assert [e["step"] for e in tracker.history] == [2]
    tracker.collect(wait=True)
    assert [e["step"] for e in tracker.history] == [2, 4] and exported == [2, 4]


# ----------------------------------------------------------------------------- reporting


def _reporter(task, events, latest_evaluation=lambda: None):
    from sparktf.train.process.reporting import Reporter

    plan = SimpleNamespace(
        global_batch=8,
        target_steps=4,
        steps_per_epoch=2,
        run=SimpleNamespace(tracking=SimpleNamespace(summary_every_steps=2, progress_every_s=60.0)),
    )
    role = SimpleNamespace(is_chief=events.enabled)
    control = _Control()
    reporter = Reporter(
        plan, role, control, events, task, started=0.0, latest_evaluation=latest_evaluation
    )
    return reporter, control


@pytest.mark.parametrize("name", ["dcgan", "mnist_mlp"])
def test_snapshots_write_histograms_and_only_a_gan_draws_samples(name):
    from sparktf import models

    task = models.get_task(name, **(TINY_DCGAN if name == "dcgan" else {"hidden_units": 4}))
    model = task.build_model()
    events = _Events()
    reporter, _ = _reporter(task, events)
    reporter.snapshot(2, model)
    reporter.snapshot(4, model)
    assert events.histogram_steps == [2, 4]
    if name == "dcgan":
        assert events.image_calls == [(s, "samples", (16, 28, 28, 1)) for s in (2, 4)]
    else:
        assert events.image_calls == []
    silent = _Events(enabled=False)  # a process other than the chief writes nothing
    _reporter(task, silent)[0].snapshot(2, model)
    assert silent.histogram_steps == [] and silent.image_calls == []


def test_reporter_sends_progress_with_the_last_evaluation():
    from sparktf import models

    task = models.get_task("mnist_mlp", hidden_units=4)
    events = _Events()
    reporter, control = _reporter(task, events, lambda: {"step": 2, "loss": 0.5})
    for step in (1, 2):
        reporter.step(step, {"loss": np.float32(step)})
    assert control.progress["step"] == 2 and control.progress["eval"] == {"step": 2, "loss": 0.5}
    assert control.progress["epoch"] == 1.0 and control.progress["loss"] == 2.0
    # the first report goes out at once, then every summary_every_steps
    assert [s for s, _ in events.scalar_calls] == [1, 2]
    assert reporter.end_training({"loss": np.float32(3)}) >= 0.0
    assert reporter.metrics == {"loss": 3.0}


# ----------------------------------------------------------------------------- the input


def test_primed_input_fetches_its_first_item_at_once_and_keeps_the_order():
    from sparktf.train.process.inputs import Primed

    fetched = threading.Event()

    def items():
        fetched.set()
        yield from range(5)

    primed = Primed(items())
    assert fetched.wait(5)  # on its own thread, before anyone asks
    assert list(primed) == [0, 1, 2, 3, 4]
    assert list(Primed(iter([]))) == []


def test_primed_input_raises_the_first_fetch_error_in_the_consumer():
    from sparktf.train.process.inputs import Primed

    def broken():
        raise TrainingError("shard 0 has no rows")
        yield  # a generator

    primed = Primed(broken())
    with pytest.raises(TrainingError, match="no rows"):
        next(primed)
    with pytest.raises(StopIteration):
        next(primed)


def test_an_unreadable_error_file_leaves_the_exit_code_to_tell(tmp_path, caplog):
    """A TensorFlow process's error file cut short, not JSON or missing fields is ignored
    (logged), so the launcher reports the exit code instead of a JSON error."""
    import json

    from sparktf.train.process.launcher import read_error_file

    good = {"type": "ValueError", "message": "bad", "traceback": "tb", "reported": True}
    path = tmp_path / "error.json"
    path.write_text(json.dumps(good))
    assert read_error_file(str(path)) == good
    assert read_error_file(str(tmp_path / "none.json")) is None
    for broken in ('{"type": "ValueError", "mess', "[1, 2]", '{"type": "ValueError"}', ""):
        path.write_text(broken)
        assert read_error_file(str(path)) is None, broken
    assert sum("unreadable error file" in r.getMessage() for r in caplog.records) == 4


# ----------------------------------------------------------------------------- early start


def _spec(tmp_path) -> ProcessSpec:
    plan = helpers.tiny_plan(
        ScalingConfig(threads_per_worker=1), run=RunConfig(model_dir=str(tmp_path / "m"))
    )
    return ProcessSpec(plan, "http://127.0.0.1:9/", "t", 30.0, 30.0)


def test_an_early_process_leaves_quietly_when_its_node_gets_no_spec(tmp_path):
    """A process started while its node joins (it imports TensorFlow meanwhile) whose node
    then fails: the task closes its pipe or cancels it, and nothing of it stays."""
    from sparktf.train.process import launcher
    from sparktf.train.process.main import EXIT_ABORTED

    early = launcher.start_early(_spec(tmp_path))
    assert early is not None and os.path.isdir(early.tmp)
    early.child.stdin.close()  # the task gave up before it had a spec
    assert early.child.wait(60) == EXIT_ABORTED
    early.cancel()
    assert not os.path.exists(early.tmp)
    again = launcher.start_early(_spec(tmp_path))
    again.cancel()  # killed while it imports
    assert again.child.poll() is not None and not os.path.exists(again.tmp)
    # a GPU run keeps the old order: its import depends on the role's devices
    gpu = dataclasses.replace(_spec(tmp_path).plan, scaling=ScalingConfig(gpus_per_worker=1))
    assert launcher.start_early(dataclasses.replace(_spec(tmp_path), plan=gpu)) is None
