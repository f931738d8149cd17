"""ResNet-20 CIFAR training examples/s through sparktf, against one plain TensorFlow process,
measured in the same run.

    .venv/bin/python bench/train.py [--steps 40] [--batch-size 64] [--configs all]

Data: the synthetic CIFAR-format demo dataset (``sparktf.train.demo``, 2045 training rows,
both formats, local disk; converted once and cached under .local/demo).

Baseline: one TensorFlow process (a subprocess, all cores, TensorFlow's default threads)
training the same model with the same global batch: the registry's ``train_step`` in a
``tf.function``, batches from ``readers.tfrecord_dataset``; examples/s after the first step.

sparktf: ``fit`` on a local-cluster[2,1,1024] session (one core per executor, one
intra-op thread per TensorFlow process) for each strategy x input mode:

* ``allreduce``: chief + one worker, each computing half of the global batch;
* ``ps``: chief (coordinator, reads the input) + one worker on the executors, the parameter
  server on the driver: one process computes.

Reported per configuration: examples/s after the first step (as the chief measures it), the
ratio to the baseline, the time from ``fit`` being called to the end of the first training
step, the elapsed time, and the peak memory of the whole process tree. Prints JSON and writes
it to bench/results/.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

from sparktf import cli

log = logging.getLogger("bench.train")
CONFIGS = [("allreduce", "files"), ("allreduce", "spark"), ("ps", "files"), ("ps", "spark")]

BASELINE = textwrap.dedent("""
    import json, os, sys, time
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import tensorflow as tf
    from sparktf import models
    from sparktf.datasets import readers
    data, batch, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    task = models.get_task("resnet20", batch_size=batch)
    model = task.build_model()
    optimizer = task.make_optimizer(max(1, 2045 // batch), model)
    step = tf.function(lambda b: task.train_step(model, optimizer, b, batch))
    ds = readers.tfrecord_dataset(data, split="train", batch_size=batch, shuffle=True, seed=0,
                                  repeat=True, drop_remainder=True)
    it = iter(ds)
    b = next(it); step({"image": b["image"], "label": b["label"]})["loss"].numpy()
    started = time.perf_counter()
    for _ in range(steps - 1):
        b = next(it)
        m = step({"image": b["image"], "label": b["label"]})
    float(m["loss"])
    seconds = time.perf_counter() - started
    print(json.dumps({"examples_per_sec": (steps - 1) * batch / seconds, "seconds": seconds}))
""")


def baseline(data: str, batch: int, steps: int) -> dict:
    with common.PeakMemory() as memory:
        out = subprocess.run(
            [sys.executable, "-c", BASELINE, data, str(batch), str(steps)],
            capture_output=True,
            text=True,
            timeout=1800,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"},
        )
    if out.returncode != 0:
        raise RuntimeError(f"baseline failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result.update(memory.report())
    return result


def sparktf_run(
    spark, data: str, strategy: str, input_mode: str, batch: int, steps: int, model_dir: str
) -> dict:
    from sparktf.train import RunConfig, ScalingConfig, TrainConfig, fit

    with common.PeakMemory() as memory:
        result = fit(
            TrainConfig(
                model="resnet20", data=data, input_mode=input_mode, steps=steps, batch_size=batch
            ),
            ScalingConfig(
                strategy=strategy,
                num_workers=2 if strategy == "allreduce" else 1,
                num_ps=1,
                ps_on_driver=True,
                threads_per_worker=1,
            ),
            RunConfig(
                model_dir=model_dir,
                checkpoint_every_steps=10 * steps,
                summary_every_steps=10,
                export=False,
            ),
            spark=spark,
        )
    return {
        "examples_per_sec": result.examples_per_sec,
        "time_to_first_step_s": result.time_to_first_step_s,
        "elapsed_s": result.elapsed_s,
        "final_step": result.final_step,
        "loss": result.metrics.get("loss"),
        **memory.report(),
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--batch-size", type=int, default=64, help="global batch")
    p.add_argument(
        "--configs",
        default="all",
        help="comma list of strategy/input_mode, e.g. allreduce/files,ps/spark",
    )
    args = p.parse_args(argv)
    cli.setup_logging("WARNING")
    logging.getLogger("bench").setLevel(logging.INFO)
    logging.getLogger("sparktf.train").setLevel(logging.INFO)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    configs = (
        CONFIGS if args.configs == "all" else [tuple(c.split("/")) for c in args.configs.split(",")]
    )

    from sparktf.spark import get_session
    from sparktf.train import demo

    spark = get_session(
        "sparktf-bench-train",
        profile="local",
        overrides={
            "spark.master": "local-cluster[2,1,1024]",
            "spark.executorEnv.PYTHONPATH": str(common.ROOT),
        },
    )
    result: dict = {
        "benchmark": "train",
        "model": "resnet20",
        "steps": args.steps,
        "global_batch": args.batch_size,
        "machine": common.machine(),
        "runs": {},
    }
    try:
        data = demo.ensure_dataset("resnet20", spark)
        result["data"] = data
        log.info("baseline: one TensorFlow process")
        result["baseline_one_process"] = base = baseline(data, args.batch_size, args.steps)
        log.info("baseline: %.1f examples/s", base["examples_per_sec"])
        with tempfile.TemporaryDirectory(prefix="sparktf-bench-train-") as tmp:
            for strategy, input_mode in configs:
                name = f"{strategy}/{input_mode}"
                log.info("sparktf %s", name)
                run = sparktf_run(
                    spark,
                    data,
                    strategy,
                    input_mode,
                    args.batch_size,
                    args.steps,
                    os.path.join(tmp, name.replace("/", "-")),
                )
                run["ratio_to_baseline"] = round(
                    run["examples_per_sec"] / base["examples_per_sec"], 3
                )
                result["runs"][name] = run
                log.info(
                    "%s: %.1f examples/s (%.2f of baseline), first step after %.1f s",
                    name,
                    run["examples_per_sec"],
                    run["ratio_to_baseline"],
                    run["time_to_first_step_s"] or -1,
                )
        result["machine_after"] = common.machine()
    finally:
        spark.stop()
    common.write_results("train", result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
