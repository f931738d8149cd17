"""The input-bound doctor: every training process times the wait for each batch against its
steps (``InputClock``), the driver names the likely cause of a run that waited more than 20%
of its time (``doctor.diagnose``) and logs one WARNING. The pure parts here; at the end three
small runs on the session's cluster, a DataFrame whose plan sleeps in a Python UDF (flagged,
through ``fit`` and through a function's ``dataset()``) and a plain one (not flagged)."""

from __future__ import annotations

import json
import logging
from types import SimpleNamespace

import pytest

from sparktf.train.driver import doctor
from sparktf.train.driver.doctor import Evidence, diagnose
from sparktf.train.driver.monitor import format_progress
from sparktf.train.process import inputs
from sparktf.train.process.inputs import InputClock
from sparktf.train.result import ProcessResult

pytestmark = pytest.mark.unit


class _Time:
    """A monotonic clock that moves only when told."""

    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _timed_batches(clock: InputClock, fake: _Time, waits: list[float], steps: list[float]):
    """Hands ``len(waits)`` batches through ``clock``: batch i takes ``waits[i]`` to arrive,
    and the step after it ``steps[i]``."""
    source = iter(range(len(waits)))

    class Slow:
        def __iter__(self):
            return self

        def __next__(self):
            value = next(source)
            fake.now += waits[value]
            return value

    batches = Slow()
    for i in range(len(waits)):
        assert clock.next(batches, None) == i
        fake.now += steps[i]
    assert clock.next(batches, None) is None  # the end of the data: not a wait


def test_the_clock_counts_from_the_second_batch_and_the_end_is_no_wait(monkeypatch):
    fake = _Time()
    monkeypatch.setattr(inputs.time, "monotonic", fake)
    monkeypatch.setattr(inputs, "cpu_times", lambda: None)
    clock = InputClock()
    assert clock.fraction() is None and clock.stats() == {}
    # the first batch (start-up: 30 s) and the first step (tracing: 10 s) are not counted
    _timed_batches(clock, fake, waits=[30.0, 1.0, 1.0, 1.0], steps=[10.0, 3.0, 3.0, 3.0])
    clock.stop()
    fake.now += 50.0  # what follows the training is not a step
    assert clock.next(iter([9])) == 9 and clock.batches == 4  # nor a batch read ahead
    assert clock.fraction() == pytest.approx(3.0 / 12.0)
    stats = clock.stats()
    assert stats["wait_fraction"] == 0.25 and stats["steps"] == 3
    assert (stats["wait_s"], stats["step_s"]) == (3.0, 9.0)
    assert "feed_wait_s" not in stats and "cpu_busy" not in stats


def test_the_clock_takes_the_feed_readers_figures_over_the_same_span(monkeypatch):
    fake = _Time()
    monkeypatch.setattr(inputs.time, "monotonic", fake)
    cpu = iter([(10.0, 100.0), (55.0, 150.0)])  # 45 of 50 ticks busy over the span
    monkeypatch.setattr(inputs, "cpu_times", lambda: next(cpu))
    reader = SimpleNamespace(wait_s=20.0, decode_s=1.0, chunks=1, rows=100)  # at start-up
    clock = InputClock(reader)
    batches = iter(range(3))
    clock.next(batches)
    fake.now += 5.0
    clock.next(batches)  # the span starts: the reader's counters are read here
    reader.wait_s, reader.decode_s, reader.chunks, reader.rows = 26.0, 1.5, 3, 300
    fake.now += 4.0
    stats = clock.stats()
    assert (stats["feed_wait_s"], stats["decode_s"], stats["chunks"], stats["rows"]) == (
        6.0,
        0.5,
        2,
        200,
    )
    assert stats["cpu_busy"] == 0.9 and stats["wait_fraction"] == 0.0


def test_the_clock_times_a_generator_pass_after_pass(monkeypatch):
    fake = _Time()
    monkeypatch.setattr(inputs.time, "monotonic", fake)
    clock = InputClock()
    shared = iter(range(6))
    first, second = clock.timed(shared), clock.timed(shared)
    assert [next(first), next(first), next(second)] == [0, 1, 2]
    assert list(second) == [3, 4, 5] and clock.batches == 6


def test_a_process_result_carries_its_input_timing():
    timing = {"wait_fraction": 0.4, "wait_s": 2.0, "step_s": 3.0, "steps": 10}
    result = ProcessResult(start_step=0, final_step=10, end_reason="x", input_timing=timing)
    back = ProcessResult.from_dict(json.loads(json.dumps(result.to_dict())))
    assert back.input_timing == timing
    assert (
        ProcessResult.from_dict({"start_step": 0, "final_step": 1, "end_reason": "x"}).input_timing
        == {}
    )


def test_every_process_reports_its_wait_and_the_chief_writes_the_scalar():
    from sparktf.train.process.reporting import Reporter

    tracking = SimpleNamespace(summary_every_steps=1, progress_every_s=60.0)
    plan = SimpleNamespace(global_batch=8, target_steps=4, steps_per_epoch=2,
                           run=SimpleNamespace(tracking=tracking))  # fmt: skip
    task = SimpleNamespace(summary_images=lambda: lambda weights: {})
    clock = SimpleNamespace(fraction=lambda: 0.25)
    sent = {}

    for chief in (True, False):
        control = SimpleNamespace(set_progress=lambda p, chief=chief: sent.update({chief: p}))
        scalars = []
        events = SimpleNamespace(enabled=chief, scalars=lambda step, v, out=scalars: out.append(v))
        role = SimpleNamespace(is_chief=chief)
        reporter = Reporter(plan, role, control, events, task, started=0.0, clock=clock)
        reporter.report(2, {"loss": 1.0})
        assert sent[chief]["input_wait"] == 0.25
        assert scalars == ([{"loss": 1.0, "examples_per_sec": scalars[0]["examples_per_sec"],
                             "input/wait_fraction": 0.25}] if chief else [])  # fmt: skip
    assert sent[False] == {"step": 2, "input_wait": 0.25}


def test_the_progress_line_shows_the_input_wait():
    line = format_progress({"step": 5, "target": 10, "epoch": 0.5, "input_wait": 0.374})
    assert line.endswith("input wait 37%")
    assert "input wait" not in format_progress({"step": 5})


# ----------------------------------------------------------------------------- the causes


def _timing(fraction: float, **more) -> dict[str, float]:
    """A process's figures over 10 s: ``fraction`` of it waiting, 100 steps."""
    return {"wait_fraction": fraction, "wait_s": 10 * fraction, "step_s": 10 * (1 - fraction),
            "steps": 100, **more}  # fmt: skip


def _spark(fraction: float = 0.6, *, feed_wait: float = 5.0, **changes) -> Evidence:
    values = dict(
        timings={
            "chief:0": _timing(fraction, feed_wait_s=feed_wait, cpu_busy=0.5),
            "worker:0": _timing(0.1),
        },  # fmt: skip
        mode="spark",
        data="(a DataFrame)",
        frame=True,
        processes=2,
        partitions=4,
        plan={"cached": False, "python_udf": True},
        passes=[{"seconds": 4.0, "rows": {"a": 500, "b": 500}, "skipped": 0}] * 3,
    )
    return Evidence(**{**values, **changes})


def test_a_run_that_waited_at_most_a_fifth_of_its_time_is_not_input_bound():
    assert diagnose(_spark(0.2)) is None
    assert diagnose(Evidence(timings={}, mode="files")) is None
    assert diagnose(_spark(0.21)) is not None


def test_a_slow_uncached_plan_is_named_with_its_pass_time_and_the_cache_to_try():
    found = diagnose(_spark())
    assert (found.cause, found.process, found.wait_fraction) == ("plan", "chief:0", 0.6)
    assert "a Python UDF" in found.found and "4.0 s in Spark (4.00 ms a row)" in found.found
    assert "reader waited 50%" in found.found and "df.cache()" in found.advice
    message = found.message(_spark().timings)
    assert message.startswith("input-bound: chief:0 waited 60% of its training time")
    assert "(worker:0 10%)" in message and "likely cause: a slow DataFrame plan" in message
    assert found.to_dict()["evidence"]["feed_wait_fraction"] == 0.5


def test_fewer_partitions_than_processes_come_before_the_plan():
    found = diagnose(_spark(partitions=1))
    assert found.cause == "partitions" and "has 1 for 2 processes" in found.found
    assert "df.repartition(N), N at least 2" in found.advice


def test_a_cached_frame_or_a_split_points_elsewhere():
    assert diagnose(_spark(plan={"cached": True})).cause == "spark"
    on_hdfs = _spark(frame=False, data="hdfs://nn:8020/data/cifar", plan={})
    assert diagnose(on_hdfs).cause == "hdfs"
    busy = _spark(plan={"cached": True})
    busy.timings["worker:0"]["cpu_busy"] = 0.95
    assert diagnose(busy).cause == "cpu" and "95% busy" in diagnose(busy).found


def test_a_reader_that_had_its_chunks_points_at_the_chunks_or_the_cpu():
    # the reader waited 5% for Spark: the process's own reading kept it waiting
    big = _spark(feed_wait=0.5)
    big.timings["chief:0"].update(chunks=2, decode_s=1.0, rows=20000)  # 500 ms a chunk
    found = diagnose(big)  # the steps: 40 ms each, 4 read ahead = 160 ms < 500 ms
    assert found.cause == "chunk_size" and "500 ms" in found.found
    assert "maxRecordsPerBatch" in found.advice and "about 1600 rows" in found.advice
    busy = _spark(feed_wait=0.5)
    busy.timings["chief:0"]["cpu_busy"] = 0.97
    assert diagnose(busy).cause == "cpu"
    assert diagnose(_spark(feed_wait=0.5)).cause == "reader"


def test_files_on_hdfs_and_files_on_local_disks():
    timings = {"chief:0": _timing(0.5)}
    assert diagnose(Evidence(timings, "files", data="hdfs://nn:8020/d")).cause == "hdfs"
    assert diagnose(Evidence(timings, "files", data="/data/d")).cause == "reader"


def test_the_driver_gathers_each_process_from_its_result_or_its_last_progress():
    roles = {
        "executor-0": SimpleNamespace(name="chief:0", trains=True),
        "executor-1": SimpleNamespace(name="worker:0", trains=True),
        "driver-ps-0": SimpleNamespace(name="ps:0", trains=False),
    }
    nodes = {
        "executor-0": SimpleNamespace(done={"input_timing": _timing(0.5)}, progress={}),
        "executor-1": SimpleNamespace(done=None, progress={"input_wait": 0.3}),
        "driver-ps-0": SimpleNamespace(done=None, progress={}),
    }
    feed = SimpleNamespace(nodes={"executor-0": {}, "executor-1": {}}, partitions=1,
                           plan_facts={"cached": False}, epochs=[{"seconds": 2.0}])  # fmt: skip
    cluster = SimpleNamespace(control=SimpleNamespace(snapshot=lambda: nodes), roles=roles,
                              feed=feed)  # fmt: skip
    plan = SimpleNamespace(train=SimpleNamespace(input_mode="spark"),
                           data=SimpleNamespace(data="(a DataFrame)", frame=True))  # fmt: skip
    ev = doctor.gather(plan, cluster)
    assert ev.timings == {"chief:0": _timing(0.5), "worker:0": {"wait_fraction": 0.3}}
    assert (ev.processes, ev.partitions, ev.pass_seconds()) == (2, 1, 2.0)
    waits, found = doctor.examine(plan, cluster)
    assert waits == {"chief:0": 0.5, "worker:0": 0.3}
    assert found["cause"] == "reader"  # no feed figures from the chief: not Spark's wait


# ----------------------------------------------------------------------------- on a cluster

BATCH = 32  # 16 rows of each process a step
SLOW_ROWS, SLOW_EPOCHS = 512, 3  # 16 steps an epoch
SLEEP_S = 0.005  # the slow UDF's time a row: each epoch's plan takes 1.3 s in each task
# Each epoch's pass costs Spark a few seconds on 2 busy cores whatever its rows (two stages,
# one a barrier stage): the fast input's epochs are long enough to hide it (128 steps).
FAST_ROWS, FAST_EPOCHS = 4096, 2


def slow_identity(values):
    """A Python UDF that takes its time (a costly plan: a parser, a lookup, a model)."""
    import time

    time.sleep(SLEEP_S)
    return values


def linear(input_shape, num_classes):
    import keras

    return keras.Sequential([keras.Input(input_shape), keras.layers.Dense(num_classes)])


def _rows(spark, rows: int, *, slow: bool):
    """``id``, 4 ``features`` and a ``label``, in 2 partitions; ``slow``: the features
    pass through :func:`slow_identity`."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import ArrayType, FloatType

    df = spark.range(rows, numPartitions=2).withColumn("label", (F.col("id") % 2).cast("int"))
    features = F.array(*[((F.col("id") + j) % 7).cast("float") for j in range(4)])
    if slow:
        features = F.udf(slow_identity, ArrayType(FloatType()))(features)
    return df.select("id", features.alias("features"), "label")


class _OneBatchChunks:
    """Feed chunks of one process batch each (Arrow batches of that many rows), one epoch a
    pass: a share of an epoch is then more than the 8 chunks a reader holds, and each epoch
    runs the frame's plan again, as a large table's does (a small table's epochs go several
    to a pass, its plan run once before the first step: feed/job.py PASS_BYTES), and Spark
    cannot feed the epochs ahead while TensorFlow starts."""

    KEY = "spark.sql.execution.arrow.maxRecordsPerBatch"

    def __init__(self, spark):
        self.spark = spark

    def __enter__(self):
        from sparktf.train.feed import job

        self.before = self.spark.conf.get(self.KEY), job.MAX_EPOCHS_PER_PASS
        self.spark.conf.set(self.KEY, str(BATCH // 2))
        job.MAX_EPOCHS_PER_PASS = 1

    def __exit__(self, *exc):
        from sparktf.train.feed import job

        self.spark.conf.set(self.KEY, self.before[0])
        job.MAX_EPOCHS_PER_PASS = self.before[1]


def _warnings(caplog) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno == logging.WARNING and r.getMessage().startswith("input-bound")
    ]


def _fit(spark, df, model_dir, epochs: int):
    from sparktf.train import RunConfig, ScalingConfig, TrainConfig, fit

    return fit(
        TrainConfig(model="doctor_linear", data=df, epochs=epochs, seed=1),
        ScalingConfig(num_workers=2, threads_per_worker=1),
        RunConfig.from_dict(
            {
                "model_dir": str(model_dir),
                "evaluation": {"split": "none"},
                "checkpoint": {"export": False},
            }
        ),  # fmt: skip
        spark=spark,
    )


def _scalar_tags(model_dir) -> set[str]:
    import tensorflow as tf

    return {
        value.tag
        for path in (model_dir / "events" / "train").glob("events.out.*")
        for event in tf.compat.v1.train.summary_iterator(str(path))
        for value in event.summary.value
    }


@pytest.mark.integration
def test_a_slow_udf_is_flagged_and_a_plain_frame_is_not(spark, tmp_path, caplog):
    from sparktf import models
    from tests import helpers

    caplog.set_level(logging.INFO, logger="sparktf")
    models.register("doctor_linear", linear, num_classes=2, batch_size=BATCH)
    with _OneBatchChunks(spark):
        slow = _fit(spark, _rows(spark, SLOW_ROWS, slow=True), tmp_path / "slow", SLOW_EPOCHS)
    assert slow.final_step == SLOW_EPOCHS * SLOW_ROWS // BATCH
    (message,) = _warnings(caplog)
    found = slow.input_diagnosis
    assert found["cause"] == "plan" and found["wait_fraction"] > 0.5, found
    assert f"waited {found['wait_fraction']:.0%} of its training time" in message
    assert "a Python UDF" in message and "df.cache()" in message
    assert set(slow.input_wait) == {"chief:0", "worker:0"}
    assert max(slow.input_wait.values()) == found["wait_fraction"]
    record = json.loads((tmp_path / "slow" / "sparktf_train.json").read_text())
    assert record["input_wait"] == slow.input_wait and record["input_diagnosis"] == found
    assert record["input"]["wait_fraction"] == slow.input_wait["chief:0"]  # the chief's own
    assert "input/wait_fraction" in _scalar_tags(tmp_path / "slow")
    assert all(e["seconds"] > 0 for e in slow.feed_epochs)

    caplog.clear()
    fast = _fit(spark, _rows(spark, FAST_ROWS, slow=False), tmp_path / "fast", FAST_EPOCHS)
    assert fast.final_step == FAST_EPOCHS * FAST_ROWS // BATCH
    assert _warnings(caplog) == [] and fast.input_diagnosis is None
    assert set(fast.input_wait) == {"chief:0", "worker:0"}
    assert max(fast.input_wait.values()) <= 0.2, fast.input_wait
    logged = [r.getMessage() for r in caplog.records if r.getMessage().startswith("input wait")]
    assert len(logged) == 1
    print(f"wait fractions: slow {slow.input_wait}, fast {fast.input_wait}")
    helpers.assert_nothing_left()


def read_through(config):
    """A custom loop that only reads: each step sums its batch."""
    import tensorflow as tf

    from sparktf.train import get_context, report

    ctx = get_context()
    data = ctx.dataset(batch_size=config["batch"], columns=["features", "label"])
    iterator = iter(ctx.strategy.experimental_distribute_dataset(data))

    @tf.function
    def step(batch):
        return ctx.strategy.run(lambda b: tf.reduce_sum(b["features"]), args=(batch,))

    for _ in range(config["steps"]):
        step(next(iterator))
    report({"step": config["steps"]})
    return {"steps": config["steps"]}


@pytest.mark.integration
def test_a_functions_dataset_of_a_slow_udf_is_flagged(spark, tmp_path, caplog):
    from sparktf.train import RunConfig, ScalingConfig, run

    caplog.set_level(logging.INFO, logger="sparktf")
    config = {"batch": BATCH, "steps": SLOW_EPOCHS * SLOW_ROWS // BATCH}
    with _OneBatchChunks(spark):
        result = run(read_through, ScalingConfig(num_workers=2, threads_per_worker=1),
                     RunConfig(model_dir=str(tmp_path / "model")), config=config,
                     data=_rows(spark, SLOW_ROWS, slow=True), spark=spark)  # fmt: skip
    assert result.value == {"steps": config["steps"]}
    (message,) = _warnings(caplog)
    found = result.input_diagnosis
    assert found["cause"] == "plan" and found["wait_fraction"] > 0.5, found
    assert set(result.input_wait) == {"chief:0", "worker:0"}
    assert result.history[-1]["input_wait"] > 0.5  # the chief's wait when it reported
    reported = [r.getMessage() for r in caplog.records if r.getMessage().startswith("report 1:")]
    assert "input wait" in reported[0]
    print(f"wait fractions: function {result.input_wait}")
