"""Every row once per epoch, equal shares, the same order for the same seed, and exact
resume after a lost worker: the ids that reach the training step, counted in each process,
on the session's two executors. (Three processes, and elastic runs that shrink and grow
mid-epoch: tests/test_elastic.py.)"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from sparktf.train import FailureConfig, RunConfig, ScalingConfig, run
from tests import helpers
from tests.feed_ids_job import record_ids

pytestmark = pytest.mark.integration

ROWS, BATCH = 1003, 16  # 62 steps an epoch, 11 rows left over each
STEPS_PER_EPOCH = ROWS // BATCH
EPOCHS = 3


def sorted_table(spark, rows: int = ROWS, parts: int = 7):
    """``id`` 0..rows-1 and a feature, stored sorted by id in range partitions of unequal
    sizes."""
    from pyspark.sql import functions as F

    df = spark.range(rows, numPartitions=1).withColumn("x", F.col("id").cast("float") / rows)
    return df.withColumn("k", F.col("id") * F.col("id")).repartitionByRange(parts, "k").drop("k")


def read_steps(out: Path, attempt: int, rank: int) -> dict[int, list[int]]:
    found = {}
    path = out / f"ids-a{attempt}-r{rank}.jsonl"
    for line in path.read_text().splitlines():
        step, ids = json.loads(line)
        found[step] = ids
    return found


def assert_every_row_once_per_epoch(per_process: list[dict[int, list[int]]], steps: int):
    """Each epoch's steps took every id of the epoch once, in equal shares."""
    for epoch in range(steps // STEPS_PER_EPOCH):
        span = range(epoch * STEPS_PER_EPOCH + 1, (epoch + 1) * STEPS_PER_EPOCH + 1)
        shares = [[i for s in span for i in process[s]] for process in per_process]
        assert len({len(share) for share in shares}) == 1  # equal shares
        seen = Counter(i for share in shares for i in share)
        assert max(seen.values()) == 1, f"epoch {epoch}: ids twice"
        assert len(seen) == STEPS_PER_EPOCH * BATCH == ROWS - ROWS % BATCH
        assert set(seen) <= set(range(ROWS))


def train_ids(data: str) -> list[int]:
    """The ids of the train split of the dataset ``data``, in file order."""
    from sparktf.datasets import readers

    batches = readers.tfrecord_dataset(data, split="train", batch_size=50)
    return [i for b in batches for i in b["id"].numpy().tolist()]


def _config(tmp_path):
    out = tmp_path / "ids"
    out.mkdir(parents=True, exist_ok=True)
    return {"batch": BATCH, "steps": EPOCHS * STEPS_PER_EPOCH, "every": 20, "out": str(out)}


def test_every_id_once_per_epoch_in_the_same_order_for_the_same_seed(spark, tmp_path):
    df = sorted_table(spark)
    orders = []
    for attempt in ("first", "second"):
        config = _config(tmp_path / attempt)
        result = run(record_ids, ScalingConfig(num_workers=2),
                     RunConfig(model_dir=str(tmp_path / attempt / "model")),
                     config=config, data=df, spark=spark)  # fmt: skip
        assert result.value == {"step": EPOCHS * STEPS_PER_EPOCH, "workers": 2}
        out = Path(config["out"])
        per_process = [read_steps(out, 0, rank) for rank in (0, 1)]
        assert_every_row_once_per_epoch(per_process, EPOCHS * STEPS_PER_EPOCH)
        orders.append(per_process)
        epochs = result.feed_epochs
        assert [e["epoch"] for e in epochs][:EPOCHS] == [0, 1, 2]
        assert epochs[0]["left_over"] == ROWS % BATCH and epochs[0]["from_cursor"] == 0
        assert set(epochs[0]["rows"].values()) == {STEPS_PER_EPOCH * BATCH // 2}
    assert orders[0] == orders[1]  # same seed, data and workers: same ids, same order
    # the stored order (sorted ids) is shuffled away, and each epoch anew
    first = [i for s in range(1, STEPS_PER_EPOCH + 1) for i in orders[0][0][s]]
    second = [
        i for s in range(STEPS_PER_EPOCH + 1, 2 * STEPS_PER_EPOCH + 1) for i in orders[0][0][s]
    ]
    assert abs(np.corrcoef(np.arange(len(first)), first)[0, 1]) < 0.1
    assert len(set(first) & set(second)) < 0.7 * len(first)  # not the same half of the rows
    helpers.assert_nothing_left()


def test_a_worker_killed_mid_epoch_resumes_exactly_where_its_checkpoint_was(spark, tmp_path):
    """Worker 1 dies at step 75 (epoch 1, 13 steps in); the last reported checkpoint is at
    step 60 (epoch 0 ended at 62): steps 61-75 are trained again, and counted from the resume
    point every epoch still takes each id once."""
    config = {**_config(tmp_path), "die": 75}
    once = RunConfig(model_dir=str(tmp_path / "model"), failure=FailureConfig(max_restarts=1))
    result = run(record_ids, ScalingConfig(num_workers=2), once, config=config,
                 data=sorted_table(spark), spark=spark)  # fmt: skip
    (restart,) = result.restarts
    assert restart["resumed_from_step"] == 60
    out = Path(config["out"])
    per_process = []
    for rank in (0, 1):
        before, after = read_steps(out, 0, rank), read_steps(out, 1, rank)
        assert min(after) == 61  # the attempt went on right after the checkpoint
        per_process.append({**{s: i for s, i in before.items() if s <= 60}, **after})
    assert_every_row_once_per_epoch(per_process, EPOCHS * STEPS_PER_EPOCH)
    resumed = [e for e in result.feed_epochs if e["attempt"] == 1]
    assert resumed[0]["epoch"] == 0 and resumed[0]["from_cursor"] == 60 * BATCH
    helpers.assert_nothing_left()


def _streams(per_process: list[dict[int, list[int]]]) -> list[list[int]]:
    return [[i for step in sorted(p) for i in p[step]] for p in per_process]


def assert_every_record_once_per_pass(streams: list[list[int]], sizes: list[int], ids):
    """Each process's stream of records, cut into passes of its shard, holds its shard's
    records once a pass; the shards are disjoint and together hold every id."""
    shards = []
    for stream, size in zip(streams, sizes):
        passes = [stream[k : k + size] for k in range(0, len(stream) - size + 1, size)]
        assert len(passes) >= 2 and all(sorted(p) == sorted(set(passes[0])) for p in passes)
        shards.append(set(passes[0]))
    assert sum(len(s) for s in shards) == len(set().union(*shards)) == len(ids)
    assert set().union(*shards) == set(ids)


def test_the_files_input_resumes_at_the_record_its_checkpoint_was(spark, mnist_data, tmp_path):
    """run(train_fn, data=DIR): 2 processes, each 8 records a step of its 50-record file.
    Worker 1 dies at step 13, the last checkpoint is at step 10 (record 80 of each stream:
    its second pass, 30 records in); the run that goes on from it feeds, step for step,
    what a run that never failed fed."""
    from sparktf.datasets import readers

    data = str(mnist_data / "data")
    common = {"batch": 16, "steps": 19, "every": 5, "feature": "image"}  # 152 records each
    streams = {}
    for name, extra in (("whole", {}), ("broken", {"die": 13})):
        config = {**_config(tmp_path / name), **common, **extra}
        failure = FailureConfig(max_restarts=1)
        model_dir = RunConfig(model_dir=str(tmp_path / name / "model"), failure=failure)
        result = run(record_ids, ScalingConfig(num_workers=2), model_dir, config=config,
                     data=data, spark=spark)  # fmt: skip
        assert result.value == {"step": 19, "workers": 2}
        out = Path(config["out"])
        if name == "broken":
            (restart,) = result.restarts
            assert restart["resumed_from_step"] == 10
            per_process = []
            for rank in (0, 1):
                before, after = read_steps(out, 0, rank), read_steps(out, 1, rank)
                assert min(after) == 11
                per_process.append({**{s: i for s, i in before.items() if s <= 10}, **after})
        else:
            assert not result.restarts
            per_process = [read_steps(out, 0, rank) for rank in (0, 1)]
        streams[name] = _streams(per_process)
    assert streams["broken"] == streams["whole"]  # step for step, the same records
    sizes = [readers.shard_records(data, "tfrecord", split="train", num_shards=2,
                                   shard_index=k) for k in (0, 1)]  # fmt: skip
    ids = train_ids(data)
    assert_every_record_once_per_pass(streams["whole"], sizes, ids)
    helpers.assert_nothing_left()


def _recording_layer(out_dir: str):
    """A Keras layer that passes ``x`` on and, each time it runs in a training step,
    appends the ids of its input to a file of its process (``ids-<pid>.jsonl``)."""
    import keras
    import tensorflow as tf

    def write(ids):
        with open(os.path.join(out_dir, f"ids-{os.getpid()}.jsonl"), "a") as f:
            f.write(json.dumps(ids.numpy().reshape(-1).tolist()) + "\n")
        return np.int32(0)

    class Record(keras.layers.Layer):
        def call(self, inputs, training=None):
            x = inputs["x"] if "x" in inputs else inputs["id"]  # a model of the id alone
            if training:
                done = tf.py_function(write, [inputs["id"]], tf.int32)
                with tf.control_dependencies([done]):
                    x = tf.identity(x)
            return x

    return Record()


def _recorded(out: Path) -> list[list[list[int]]]:
    """Each process's batches, in the order its training steps took them."""
    return [
        [json.loads(line) for line in path.read_text().splitlines()]
        for path in sorted(out.glob("ids-*.jsonl"))
    ]


def assert_once_per_epoch_in_steps(processes: list[list[list[int]]], rows: int, batch: int):
    """Each epoch's steps (``rows // batch`` of them, every process one batch each) took
    every id of the epoch once, in equal shares."""
    steps = rows // batch
    assert len({len(batches) for batches in processes}) == 1
    for epoch in range(len(processes[0]) // steps):
        taken = [
            i
            for batches in processes
            for b in batches[epoch * steps : (epoch + 1) * steps]
            for i in b
        ]
        assert len(taken) == len(set(taken)) == steps * batch, epoch


def keras_fit_records(config):
    import keras

    from sparktf.train import get_context

    ctx = get_context()
    data = ctx.dataset(batch_size=config["batch"], columns=["id", "x", "y"], label="y")
    with ctx.strategy.scope():
        inputs = {"id": keras.Input((), dtype="int64", name="id"), "x": keras.Input((), name="x")}
        x = _recording_layer(config["out"])(inputs)
        out = keras.layers.Dense(1)(keras.layers.Reshape((1,))(x))
        model = keras.Model(inputs, out)
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    model.fit(data, epochs=config["epochs"], steps_per_epoch=config["steps"], verbose=0)
    return {"epochs": config["epochs"]}


def test_keras_fit_takes_every_id_once_per_epoch(spark, tmp_path):
    from pyspark.sql import functions as F

    out = tmp_path / "ids"
    out.mkdir()
    df = sorted_table(spark).withColumn("y", F.col("x") * 2.0)
    config = {"batch": BATCH, "epochs": EPOCHS, "steps": STEPS_PER_EPOCH, "out": str(out)}
    model_dir = RunConfig(model_dir=str(tmp_path / "model"))
    run(keras_fit_records, ScalingConfig(num_workers=2), model_dir, config=config, data=df,
        spark=spark)  # fmt: skip
    processes = _recorded(out)
    assert len(processes) == 2 and len(processes[0]) == EPOCHS * STEPS_PER_EPOCH
    assert_once_per_epoch_in_steps(processes, ROWS, BATCH)


def recording_model(inputs, num_classes, out_dir):
    import keras

    x = _recording_layer(out_dir)(inputs)
    hidden = keras.layers.Dense(4, activation="relu")(keras.layers.Reshape((1,))(x))
    return keras.Model(inputs, keras.layers.Dense(num_classes)(hidden))


def test_fit_from_a_dataframe_takes_every_id_once_per_epoch(spark, tmp_path):
    from pyspark.sql import functions as F

    from sparktf import models
    from sparktf.train import TrainConfig, fit

    out = tmp_path / "ids"
    out.mkdir()

    def build(inputs, num_classes):
        return recording_model(inputs, num_classes, str(out))

    models.register("recording", build, inputs=["id", "x"], num_classes=2, batch_size=BATCH)
    df = sorted_table(spark).withColumn("label", (F.col("id") % 2).cast("long"))
    result = fit(
        TrainConfig(model="recording", data=df, epochs=EPOCHS, seed=4),
        ScalingConfig(num_workers=2),
        RunConfig.from_dict(
            {"model_dir": str(tmp_path / "model"), "evaluation": {"split": "none"}}
        ),
        spark=spark,
    )
    assert result.final_step == EPOCHS * STEPS_PER_EPOCH
    processes = _recorded(out)
    assert len(processes) == 2
    assert_once_per_epoch_in_steps(processes, ROWS, BATCH)
    assert [e["left_over"] for e in result.feed_epochs] == [ROWS % BATCH] * EPOCHS


def test_fit_from_files_goes_on_at_the_record_its_last_run_ended(spark, mnist_hdfs, tmp_path):
    """fit with the files input (Parquet on HDFS), 2 processes: 9 steps, then a rerun on the
    same model directory to 20, feed each process what one run of 20 steps feeds."""
    import keras

    from sparktf import models
    from sparktf.train import TrainConfig, fit

    def build_into(out_dir: str):
        def build(inputs, num_classes):
            x = _recording_layer(out_dir)(inputs)  # the ids, recorded
            x = keras.layers.Rescaling(1 / 100)(keras.layers.Reshape((1,))(x))
            return keras.Model(inputs, keras.layers.Dense(num_classes)(x))

        return build

    recorded = {}
    for name, runs in (("whole", (20,)), ("rerun", (9, 20))):
        out = tmp_path / name
        out.mkdir()
        models.register(f"recording_{name}", build_into(str(out)), inputs=["id"],
                        num_classes=10, batch_size=12)  # fmt: skip
        for steps in runs:
            train = TrainConfig(model=f"recording_{name}", data=mnist_hdfs, input_mode="files",
                                file_format="parquet", steps=steps, seed=5)  # fmt: skip
            run_config = RunConfig.from_dict(
                {"model_dir": str(out / "model"), "evaluation": {"split": "none"}}
            )
            result = fit(train, ScalingConfig(num_workers=2), run_config, spark=spark)
            assert result.final_step == steps
        recorded[name] = _recorded(out)
    whole = {tuple(i for b in p for i in b) for p in recorded["whole"]}
    assert len(whole) == 2 and all(len(stream) == 20 * 6 for stream in whole)
    # the rerun's processes (2 from each run) join into the whole run's two streams
    first, second = ([p for p in recorded["rerun"] if len(p) == n] for n in (9, 11))
    joined = {tuple(i for b in a + b_ for i in b) for a in first for b_ in second}
    assert whole <= joined


def test_fit_from_files_drains_its_pass_when_the_workers_change(spark, mnist_data, tmp_path):
    """fit with the files input, 2 processes of 6 records a step (a shard of 50 records
    each): 13 steps, 28 records into the second pass; then a rerun on the same model
    directory with 1 process. It first trains the rest of that pass, none of it twice
    (44 records: 3 steps of 12, 8 left over), then the next pass of the one-shard split."""
    import keras

    from sparktf import models
    from sparktf.train import TrainConfig, fit

    data = str(mnist_data / "data")
    out = tmp_path / "ids"
    out.mkdir()

    def build(inputs, num_classes):
        x = _recording_layer(str(out))(inputs)
        x = keras.layers.Rescaling(1 / 100)(keras.layers.Reshape((1,))(x))
        return keras.Model(inputs, keras.layers.Dense(num_classes)(x))

    models.register("recording_resize", build, inputs=["id"], num_classes=10, batch_size=12)
    run_config = RunConfig.from_dict(
        {"model_dir": str(tmp_path / "model"), "evaluation": {"split": "none"}}
    )
    for workers, steps in ((2, 13), (1, 18)):
        train = TrainConfig(model="recording_resize", data=data,
                            input_mode="files", steps=steps, seed=3)  # fmt: skip
        result = fit(train, ScalingConfig(num_workers=workers), run_config, spark=spark)
        assert result.final_step == steps
    recorded = _recorded(out)
    first = [[i for b in p for i in b] for p in recorded if len(p) == 13]
    (second,) = [[i for b in p for i in b] for p in recorded if len(p) == 5]
    assert len(first) == 2 and all(len(stream) == 78 for stream in first)
    in_pass = [i for stream in first for i in stream[50:]]  # pass 1 before the resize
    drained, after = second[:36], second[36:]
    ids = set(train_ids(data))
    assert len(set(in_pass + drained)) == 56 + 36 and set(in_pass + drained) <= ids
    assert len(set(after)) == 24  # pass 2 of the new split
    helpers.assert_nothing_left()


def test_a_function_s_dataset_drains_its_pass_when_the_workers_change(mnist_data, tmp_path):
    """``ctx.dataset`` of ``run(train_fn, data=DIR)``, global batch 12: two processes' streams
    13 steps in (6 records a step each, 28 into their second pass), then one process placed
    where their checkpoint recorded: its first 3 steps are the rest of that pass, none of it
    twice (8 records left over), then the next pass of its one-shard split."""
    from sparktf.train.feed.order import FilesPosition
    from sparktf.train.process.context import TrainContext

    data = str(mnist_data / "data")

    def context(rank: int, world_size: int, feed=None, step=0) -> TrainContext:
        return TrainContext(rank=rank, world_size=world_size, role="worker",
                            is_chief=rank == 0, strategy=None, model_dir=str(tmp_path),
                            local_dir=str(tmp_path), restored_dir=None,
                            export_dir=str(tmp_path / "export"), data=data,
                            feed_start=feed, feed_start_step=step)  # fmt: skip

    def records(ctx: TrainContext, n: int) -> list[int]:
        out: list[int] = []
        for batch in ctx.dataset(batch_size=12, columns=["id"]):
            out += batch["id"].numpy().tolist()
            if len(out) >= n:
                return out[:n]
        raise AssertionError("the stream ended")

    first = [records(context(rank, 2), 13 * 6) for rank in (0, 1)]
    place = FilesPosition(2, 6).advance(13, size=50).to_dict()  # what step 13's report keeps
    second = records(context(0, 1, place, 13), 36 + 24)
    in_pass = [i for stream in first for i in stream[50:]]  # pass 1 before the resize
    ids = set(train_ids(data))
    drained, after = second[:36], second[36:]
    assert len(set(in_pass + drained)) == 56 + 36 and set(in_pass + drained) <= ids
    assert after == records(context(0, 1, FilesPosition(1, 12, 2, 0, 2).to_dict(), 13), 24)
