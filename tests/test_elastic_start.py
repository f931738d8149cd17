"""An elastic run on the suite's session (2 task slots), in-process: it starts with the
workers the free slots hold, not the most it may have; with ``scale_batch`` each worker keeps
its share of the batch and the learning rate follows the size, also when the run resumes a
checkpoint saved at another size (Keras restores a constant learning rate with the
optimizer). The runs that lose and regain workers: tests/test_elastic.py."""

from __future__ import annotations

import pytest

from sparktf.train import RunConfig, ScalingConfig, TrainConfig, fit
from sparktf.train.config import CheckpointConfig, EvalConfig

pytestmark = pytest.mark.integration

RATE = 0.02  # the learning rate at the most workers (3)


def _train(data: str, steps: int) -> TrainConfig:
    overrides = {"learning_rate": RATE}
    return TrainConfig(model="mnist_mlp", data=data, steps=steps, batch_size=12,
                       input_mode="files", model_config=overrides)  # fmt: skip


def test_an_elastic_run_starts_with_the_free_slots_and_scales_its_batch(
    spark, mnist_data, tmp_path
):
    data = f"file://{mnist_data}/data"
    run = RunConfig(
        model_dir=f"file://{tmp_path}/model",
        checkpoint=CheckpointConfig(every_steps=2, export=False),
        evaluation=EvalConfig(split="none"),
    )
    # first 2 steps at a fixed size: the checkpoint holds the learning rate RATE
    fixed = fit(_train(data, 2), ScalingConfig(num_workers=2), run, spark=spark)
    assert fixed.final_step == 2 and fixed.metrics["learning_rate"] == pytest.approx(RATE)
    # then elastic 1..3 with 2 slots: 2 workers of 4 rows each, the rate scaled by 2/3
    scaling = ScalingConfig(num_workers=(1, 3), scale_batch=True, grow_after_s=0)
    result = fit(_train(data, 6), scaling, run, spark=spark)
    assert sorted(result.processes) == ["chief:0", "worker:0"]
    assert (result.start_step, result.final_step, result.resizes) == (2, 6, [])
    assert result.examples == 4 * 8  # 4 steps of the global batch of 2 workers x 4 rows
    assert result.metrics["learning_rate"] == pytest.approx(RATE * 2 / 3)
