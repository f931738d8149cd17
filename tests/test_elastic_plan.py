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
from sparktf.train.config import FailureConfig
from sparktf.train.driver.attempts import Event, history_text
from sparktf.train.driver.elastic import fit_workers
from sparktf.train.plan import DataInfo, check_layout
from sparktf.train.settings import worker_range
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


def test_every_change_between_attempts_is_one_kind_of_record():
    shrink = Event("shrink", 3, 2, 120, 100, "worker:1 failed", 1.5)
    assert shrink.to_dict() == {
        "kind": "shrink", "from": 3, "to": 2, "step": 120, "resumed_from_step": 100,
        "cause": "worker:1 failed", "time": 1.5,
    }  # fmt: skip
    assert "shrink from 3 to 2 workers at step 120" in shrink.describe()
    assert "(resuming from the checkpoint of step 100)" in shrink.describe()
    # a function's restart names the checkpoint it reported
    restart = Event("restart", 2, 2, 7, 5, "ValueError: bad\n  at line 3", 2.0, "/m/report-2")
    assert restart.to_dict()["resumed_from_checkpoint"] == "/m/report-2"
    assert restart.describe().startswith("restart with 2 workers at step 7 (resuming from /m/")
    assert (
        Event("restart", 2, 2, 3, 0, "lost", 1.0)
        .describe()
        .endswith("(resuming from the start (no checkpoint yet)): lost")
    )
    # a run's error lists what happened, each cause by its first line
    history = history_text([shrink.to_dict(), restart.to_dict()])
    assert history.count("\n  ") == 2 and "ValueError: bad" in history and "line 3" not in history


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


def test_a_function_run_takes_a_worker_range_but_has_no_batch_to_scale(tmp_path):
    from sparktf.train.driver.train_fn import plan_function

    elastic = plan_function(lambda: None, ScalingConfig(num_workers=(1, 2)), RunConfig("/m"))
    assert elastic.scaling.elastic and elastic.with_workers(1).scaling.num_workers == 1
    with pytest.raises(ConfigError, match="ScalingConfig.scale_batch: run.train_fn. has no batch"):
        run(lambda ctx: None, scaling=ScalingConfig(num_workers=(1, 2), scale_batch=True),
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


class _Attempt:
    """What ReportResume reads of an ended attempt: the chief's reports."""

    def __init__(self, reports, checkpointed):
        self._reports = (reports, checkpointed)

    def chief_reports(self):
        return self._reports


def test_a_functions_history_is_bounded_and_never_loses_its_resume_point(caplog):
    """run(train_fn) keeps the last ``MAX_KEPT`` reports across attempts and counts the
    others, numbers the next attempt's reports after every one that came, and resumes from
    the last reported checkpoint even when that report left the lists long ago."""
    from sparktf.train.driver.attempts import ReportResume
    from sparktf.train.wire.control import MAX_KEPT, Recent

    def reports(first: int, last: int, checkpoint_at: int | None = None):
        kept, checkpointed = Recent(), None
        for n in range(first, last + 1):
            entry = {"n": n, "step": 10 * n, "metrics": {"loss": 1.0}}
            if n == checkpoint_at:
                entry["checkpoint"] = f"/models/m/report-{n:06d}"
                checkpointed = entry
            kept.append(entry)
        return kept, checkpointed

    resume = ReportResume("/models/m")
    resume.collect(_Attempt(*reports(1, 1500, checkpoint_at=5)))
    assert (resume.reports, len(resume.history), resume.dropped) == (1500, MAX_KEPT, 500)
    assert resume.history[0]["n"] == 501 and resume.history[-1]["n"] == 1500
    assert resume.resume_point() == (50, "/models/m/report-000005")
    plan = resume.attempt_plan(helpers.tiny_plan(ScalingConfig()))
    assert (plan.reports_before, plan.resume_checkpoint) == (1500, "/models/m/report-000005")
    resume.collect(_Attempt(*reports(1501, 1700)))  # an attempt that checkpointed nothing
    assert (resume.reports, len(resume.history), resume.dropped) == (1700, MAX_KEPT, 700)
    assert resume.resume_point() == (50, "/models/m/report-000005")
    outside, checkpointed = reports(1701, 1702, checkpoint_at=1702)
    checkpointed["checkpoint"] = "/etc/elsewhere"  # refused, with one warning
    resume.collect(_Attempt(outside, checkpointed))
    assert resume.resume_point() == (50, "/models/m/report-000005")
    assert "checkpoint" not in resume.history[-1]
    assert sum("not under /models/m" in r.getMessage() for r in caplog.records) == 1


class _Scheduler:
    """A classic session as sparktf reads its scheduler: ``slots`` task slots, and ``jobs``
    running now, ``{job id: (its tags, {stage id: tasks running})}``: the Python status
    tracker and what is read of the JVM (the slots, the jobs' tags, the executors' tasks)."""

    def __init__(self, slots: int, jobs: dict):
        self.slots, self.jobs = slots, jobs
        self.sparkContext = self
        self._jsc = self

    # pyspark's StatusTracker
    def statusTracker(self):  # noqa: N802 (StatusTracker API)
        return self

    def getActiveJobsIds(self):  # noqa: N802 (StatusTracker API)
        return sorted(self.jobs)

    def getJobInfo(self, job_id):  # noqa: N802 (StatusTracker API)
        from pyspark.status import SparkJobInfo

        return SparkJobInfo(job_id, list(self.jobs[job_id][1]), "RUNNING")

    def getActiveStageIds(self):  # noqa: N802 (StatusTracker API)
        return sorted(stage for _, stages in self.jobs.values() for stage in stages)

    def getStageInfo(self, stage_id):  # noqa: N802 (StatusTracker API)
        from pyspark.status import SparkStageInfo

        running = next(s[stage_id] for _, s in self.jobs.values() if stage_id in s)
        return SparkStageInfo(stage_id, 0, "stage", 8, running, 0, 0)

    # the JVM's SparkContext
    def sc(self):
        return self

    def resourceProfileManager(self):  # noqa: N802 (SparkContext API)
        return self

    def defaultResourceProfile(self):  # noqa: N802 (SparkContext API)
        return "default"

    def maxNumConcurrentTasks(self, profile):  # noqa: N802 (SparkContext API)
        return self.slots

    def statusStore(self):  # noqa: N802 (SparkContext API)
        return self

    def job(self, job_id):
        tags = self.jobs[job_id][0]

        class Data:
            def jobTags(self):  # noqa: N802 (JobData API)
                class Seq:
                    def mkString(self, sep):  # noqa: N802 (Scala API)
                        return sep.join(tags)

                return Seq()

        return Data()

    def getExecutorInfos(self):  # noqa: N802 (SparkStatusTracker API)
        class Executor:
            def __init__(self, running):
                self.running = running

            def numRunningTasks(self):  # noqa: N802 (SparkExecutorInfo API)
                return self.running

        return [Executor(sum(n for _, s in self.jobs.values() for n in s.values()))]


def test_both_elastic_decisions_count_the_same_free_slots(monkeypatch):
    """Whether a running attempt may grow (spare slots) and how many workers the next attempt
    gets count the same slots: those no task of another Spark job holds (the run's own
    jobs, known by their tags, are the run's). A grow asked for always finds its slots after
    the pause: with slots busy with another job the run used to pause, find no more workers,
    restart at its size and pause again, without end."""
    from sparktf.train.driver import elastic

    monkeypatch.setattr(elastic, "SETTLE_S", 0.01)
    monkeypatch.setattr(elastic, "POLL_S", 0.01)
    tag = "sparktf-nodes-1234abcd"
    ours = [f"spark-session-s1-thread-t1-{tag}"]  # how a classic session tags the job
    scaling = ScalingConfig(num_workers=(1, 3))
    for slots in range(1, 6):
        for others in range(slots):  # tasks of another job, the rest of the slots free
            for workers in range(1, min(3, slots - others + 1)):
                placement = {f"w:{i}": {"host": "h", "executor": f"h:{i}"} for i in range(workers)}
                running = _Scheduler(slots, {1: (ours, {10: workers}), 2: ([], {20: others})})
                spare = elastic.spare_slots(running, placement, {tag})
                paused = _Scheduler(slots, {2: ([], {20: others})} if others else {})
                next_size = elastic.size_now(paused, scaling, wait_s=0, own_tags={tag})
                case = (slots, others, workers, spare, next_size)
                assert (spare >= 1) == (next_size > workers), case
                assert spare == slots - others - workers, case
    # the run's own feed and barrier tasks are its own: not counted against it
    feeding = _Scheduler(4, {1: (ours, {10: 1}), 3: ([f"x-{tag}"], {30: 2})})
    assert elastic.free_for_run(feeding, {tag}) == 4
    assert elastic.free_for_run(feeding, ()) == 1  # at the start: everything running counts


class _PausingAttempt:
    """An attempt as ``run_attempts`` sees it (no Spark): it starts, and its chief reports
    ``done`` with ``end_reason`` ``"paused"``; ``asked`` is the pause the driver requested
    (None: none)."""

    asked: str | None = None
    sizes: list[int] = []

    def __init__(self, spark, plan, **kwargs):
        from types import SimpleNamespace

        from sparktf.train.wire.control import Recent

        self.sizes.append(plan.scaling.num_workers)
        self.control = SimpleNamespace(pause=self.asked, snapshot=dict)
        self.placement, self.job_tags, self.roles, self.feed = {}, set(), {}, None
        self._reports = (Recent(), None)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def start(self):
        return self

    def wait(self):
        return {"end_reason": "paused", "value": None}

    def chief_reports(self):
        return self._reports


class _NoGrowWatch:
    """The driver's watch for free slots, asking for nothing itself."""

    requested = None

    def __init__(self, *args):
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None


class _Tracker:
    events: list = []

    def follow(self, cluster):
        import contextlib

        return contextlib.nullcontext()

    def attempt_event(self, event):
        self.events.append(event)


def test_a_pause_is_accepted_only_once_asked_for_and_every_pause_counts(monkeypatch):
    """A chief that reports ``paused`` when the driver asked for no pause fails the run (a
    process of the run cannot make it restart at will); a pause the driver asked for that
    finds no more slots after all is a restart at the same size, and it counts against
    ``max_resizes`` like any event: a run whose every pause finds nothing ends after the
    budget instead of pausing forever."""
    from sparktf.train.config import RunConfig
    from sparktf.train.driver import attempts, elastic
    from sparktf.train.errors import TrainingError

    monkeypatch.setattr(attempts, "ClusterRun", _PausingAttempt)
    monkeypatch.setattr(elastic, "initial_size", lambda spark, scaling, failure: 2)
    monkeypatch.setattr(elastic, "size_now", lambda spark, scaling, **kwargs: 2)  # no more
    monkeypatch.setattr(elastic, "GrowWatch", _NoGrowWatch)
    failure = FailureConfig(max_resizes=3)
    plan = helpers.tiny_plan(
        ScalingConfig(num_workers=(1, 3)), run=RunConfig(model_dir="/m", failure=failure)
    )

    monkeypatch.setattr(_PausingAttempt, "asked", None)
    monkeypatch.setattr(_PausingAttempt, "sizes", [])
    with pytest.raises(TrainingError, match="a pause that the driver did not ask for"):
        attempts.run_attempts(None, plan, _Tracker(), attempts.ReportResume("/m"))
    assert _PausingAttempt.sizes == [2]  # refused at once: no second attempt

    monkeypatch.setattr(_PausingAttempt, "asked", "1 task slots free for 30 s")
    monkeypatch.setattr(_PausingAttempt, "sizes", [])
    monkeypatch.setattr(_Tracker, "events", [])
    with pytest.raises(TrainingError, match=r"changed 3 times \(FailureConfig.max_resizes\)"):
        attempts.run_attempts(None, plan, _Tracker(), attempts.ReportResume("/m"))
    assert _PausingAttempt.sizes == [2, 2, 2, 2]
    assert [e["kind"] for e in _Tracker.events] == ["restart"] * 3
    assert all(e["cause"] == "1 task slots free for 30 s" for e in _Tracker.events)
