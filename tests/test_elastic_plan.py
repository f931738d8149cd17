"""Elastic runs without a cluster: the worker range as Python and as a flag, what the plan
refuses for every size in the range, how many workers fit in the free slots, and the pause
a resize sends through the control channel (a real server on loopback).

The runs themselves, on a standalone cluster that loses and regains workers, are
tests/test_elastic.py.
"""

from __future__ import annotations

import pytest

from sparktf import cli
from sparktf.jobs import flags
from sparktf.jobs import train as job
from sparktf.train import ConfigError, RunConfig, ScalingConfig, run
from sparktf.train.config import FailureConfig, worker_range
from sparktf.train.driver.elastic import Resize, fit_workers
from sparktf.train.plan import DataInfo, check_layout
from sparktf.train.wire.control import ControlClient, ControlServer
from tests import helpers

pytestmark = pytest.mark.unit


def test_a_worker_range_is_min_and_max():
    scaling = ScalingConfig(num_workers=(1, 3))
    assert (scaling.min_workers, scaling.num_workers, scaling.elastic) == (1, 3, True)
    assert list(scaling.worker_counts) == [1, 2, 3]
    assert ScalingConfig(num_workers=3, min_workers=2) == ScalingConfig(num_workers=(2, 3))
    assert not ScalingConfig(num_workers=(2, 2)).elastic and not ScalingConfig().elastic
    assert list(ScalingConfig(num_workers=4).worker_counts) == [4]
    # an attempt with fewer workers keeps the floor
    two = scaling.with_workers(2)
    assert (two.min_workers, two.num_workers) == (1, 2)
    ps = ScalingConfig(strategy="ps", num_workers=(1, 2), num_ps=2)
    assert ps.other_processes == 3 and ps.num_executors == 5
    assert ScalingConfig(strategy="ps", num_workers=(1, 2), ps_on_driver=True).other_processes == 1


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"num_workers": (3, 1)}, "1 <= min <= max"),
        ({"num_workers": (0, 2)}, "1 <= min <= max"),
        ({"num_workers": (1, 2, 3)}, "a (min, max) pair"),
        ({"num_workers": (1.0, 2)}, "a (min, max) pair"),
        ({"num_workers": (1, 3), "min_workers": 2}, "disagree"),
        ({"num_workers": 2, "min_workers": 3}, "must not exceed"),
        ({"num_workers": 2, "min_workers": 0}, "ScalingConfig.min_workers must be > 0"),
        ({"grow_after_s": -1}, "ScalingConfig.grow_after_s must be >= 0"),
    ],
)
def test_a_bad_range_is_refused_naming_the_setting(kwargs, says):
    with pytest.raises(ConfigError, match="ScalingConfig") as error:
        ScalingConfig(**kwargs)
    assert says in str(error.value)


def test_failure_config_bounds_the_resizes_and_the_wait_below_min():
    assert FailureConfig().max_resizes == 10 and FailureConfig().below_min_timeout_s == 120
    with pytest.raises(ConfigError, match="FailureConfig.max_resizes"):
        FailureConfig(max_resizes=-1)
    with pytest.raises(ConfigError, match="FailureConfig.below_min_timeout_s"):
        FailureConfig(below_min_timeout_s=0)


def test_num_workers_min_max_on_the_command_line():
    assert worker_range("4") == 4 and worker_range("1:3") == (1, 3)
    base = ["--model", "m", "--data", "d", "--model-dir", "/m"]
    parser = job.parser("t", "train", None)
    args = cli.parse(parser, [*base, "--num-workers", "1:3", "--grow-after", "7"])
    scaling = flags.build(ScalingConfig, args)
    assert (scaling.min_workers, scaling.num_workers, scaling.grow_after_s) == (1, 3, 7.0)
    args = cli.parse(parser, [*base, "--num-workers", "3", "--min-workers", "2"])
    assert flags.build(ScalingConfig, args) == ScalingConfig(num_workers=(2, 3))
    args = cli.parse(parser, [*base, "--max-resizes", "4", "--below-min-timeout", "30"])
    failure = flags.build(RunConfig, args).failure
    assert (failure.max_resizes, failure.below_min_timeout_s) == (4, 30.0)
    # a range the config refuses is named by its flag on the command line
    with pytest.raises(ConfigError) as error:
        flags.build(ScalingConfig, cli.parse(parser, [*base, "--num-workers", "3:1"]))
    assert "--num-workers 3:1" in flags.for_command_line(str(error.value), *flags.CONFIGS)
    with pytest.raises(SystemExit):  # not a number: argparse's own usage error
        cli.parse(parser, [*base, "--num-workers", "one:3"])


def _data(rows: int) -> DataInfo:
    return DataInfo("mnist", "image", "/d", "train", rows, (), files={"tfrecord": ["/d/f"]})


def test_the_global_batch_must_divide_by_every_size_in_the_range():
    from sparktf.train import TrainConfig

    train = TrainConfig(model="mnist_mlp", data="/d", input_mode="files")
    check_layout(train, ScalingConfig(num_workers=(1, 4)), _data(100), 12)  # 1, 2, 3, 4
    with pytest.raises(ConfigError, match="with 3 workers of the elastic run"):
        check_layout(train, ScalingConfig(num_workers=(2, 4)), _data(100), 8)
    # ps: the chief reads whole batches, any number of workers takes them
    check_layout(train, ScalingConfig(strategy="ps", num_workers=(1, 3)), _data(100), 8)


def test_the_workers_that_fit_in_the_free_slots():
    allreduce = ScalingConfig(num_workers=(2, 4))
    assert [fit_workers(allreduce, free) for free in range(7)] == [0, 0, 2, 3, 4, 4, 4]
    ps = ScalingConfig(strategy="ps", num_workers=(1, 3))  # + chief + 1 ps on executors
    assert [fit_workers(ps, free) for free in range(7)] == [0, 0, 0, 1, 2, 3, 3]


def test_a_resize_reads_as_an_event():
    event = Resize("shrink", 3, 2, 120, 100, "worker:1 failed", 1.5)
    assert event.to_dict() == {
        "kind": "shrink", "from": 3, "to": 2, "step": 120, "resumed_from_step": 100,
        "reason": "worker:1 failed", "time": 1.5,
    }  # fmt: skip
    assert "shrink from 3 to 2 workers at step 120" in event.describe()


def test_a_pause_reaches_every_process_once_asked():
    server = ControlServer("127.0.0.1", bind_host="127.0.0.1")
    try:
        token = server.issue_token("executor-0")
        client = ControlClient(server.url, token, "executor-0")
        assert client.post("beat")["pause"] is None and client.pause is None
        server.request_pause("1 task slots free for 30 s")
        assert client.post("beat")["pause"] == "1 task slots free for 30 s"
        assert client.pause == "1 task slots free for 30 s" and not client.stop
        server.request_pause("a second reason")  # the first stands
        assert client.post("beat")["pause"] == "1 task slots free for 30 s"
    finally:
        server.close()


def test_a_function_run_refuses_a_worker_range(tmp_path):
    with pytest.raises(ConfigError, match="elastic runs are for sparktf.train.fit"):
        run(lambda ctx: None, scaling=ScalingConfig(num_workers=(1, 2)),
            run=RunConfig(model_dir=str(tmp_path)))  # fmt: skip


def test_an_estimator_with_min_workers_trains_elastic():
    from sparktf.ml import TFEstimator

    estimator = TFEstimator(model="m", modelDir="/m", numWorkers=3, minWorkers=1)
    scaling, _ = estimator._scaling_and_run()
    assert (scaling.elastic, scaling.min_workers, scaling.num_workers) == (True, 1, 3)
    fixed, _ = TFEstimator(model="m", modelDir="/m", numWorkers=3)._scaling_and_run()
    assert not fixed.elastic


def _plan(scaling: ScalingConfig):
    return helpers.tiny_plan(scaling, model_config={"batch_size": 24, "learning_rate": 0.3})


def test_an_attempt_keeps_the_global_batch_or_each_workers_share():
    same = _plan(ScalingConfig(num_workers=(1, 3))).with_workers(2)
    assert (same.elastic, same.scaling.num_workers, same.per_process_batch) == (True, 2, 12)
    assert (same.global_batch, same.model_config["learning_rate"]) == (24, 0.3)
    scaled = _plan(ScalingConfig(num_workers=(1, 3), scale_batch=True)).with_workers(2)
    assert (scaled.global_batch, scaled.per_process_batch, scaled.steps_per_epoch) == (16, 8, 15)
    assert scaled.model_config == {"batch_size": 16, "learning_rate": pytest.approx(0.2)}
    assert scaled.target_steps == 100  # the steps asked for stay
    full = _plan(ScalingConfig(num_workers=(1, 3), scale_batch=True)).with_workers(3)
    assert (full.global_batch, full.elastic) == (24, True)
