"""ResNet-20 CIFAR training examples/s through sparktf, against one plain TensorFlow process,
measured in the same run.

    .venv/bin/python bench/train.py [--steps 80] [--batch-size 64] [--configs all] [--rounds 3]
        [--budget SECONDS] [--s3]

Data: the synthetic CIFAR-format demo dataset (``sparktf.datasets.demo``, both formats, local
disk; converted once and cached under .local/demo). With ``--s3`` (off by default) a copy of
it on a throwaway S3-compatible store too (bench/common.s3: SeaweedFS through scripts/s3.sh,
on the same machine, started before the Spark session so that the session gives the
executors' Python its ``AWS_*`` settings): published with ``sparktf.storage.publish`` (the
copy, then its commit marker), timed as ``startup_s.copy_to_s3`` (the store's start:
``startup_s.s3_store``).

Baseline: the best plain TensorFlow a user would write -- one process (a subprocess) running
Keras ``model.fit`` on a ``tf.data`` pipeline (``TFRecordDataset`` with parallel reads,
shuffle, batch, batched ``parse_example`` + ``decode_raw`` in a parallel ``map``,
``prefetch``) with the same model, optimizer and global batch, and as many TensorFlow
threads as sparktf's processes have together (``--threads``, default: the CPU count).

sparktf: ``fit`` on a local-cluster[2,1,1024] session (one core per executor) for each
strategy x input mode:

* ``allreduce``: chief + one worker, each computing half of the global batch with one
  intra-op thread;
* ``ps``: chief (coordinator, reads the input) + one worker on the executors, the parameter
  server on the driver: one process computes, with TensorFlow's default threads (sparktf's
  default ``threads_per_worker=0``);
* ``allreduce/files-s3`` (``--s3`` only): ``allreduce`` with files input read from the S3
  copy (sparktf's readers through its boto3 client), the model directory on local disk as
  for the others.

Neither side evaluates: sparktf runs with ``EvalConfig(split="none")`` (its default evaluates
the test split once per epoch on the chief, which the Keras ``fit`` baseline does not do, and
which would fall inside sparktf's window).

Same window for both (bench/common.py): examples/s from the end of the first step to the
end of the last; what comes before the first step (process or cluster start, model build,
first trace) is start-up, reported apart as ``time_to_first_step_s``: the baseline's from
the top of its script (before TensorFlow is imported) to the end of its first step,
sparktf's from the call of ``fit`` (everything it does first: the plan, the cluster, the
TensorFlow processes) to the end of the chief's first step. ``startup_overhead_s``: per
round, sparktf's time to first step minus that round's baseline's (recorded). The start-up
goals come from rounds of their own, first thing in the session (``startup_rounds``:
``--startup-rounds``, default 5, of one-step runs, the baseline then each configuration;
with ``--budget`` at least 2, more while they fit in 40 % of what is left of it): the cold
first round, and the warm median of the others with every throughput round's first step
(warm runs too), each against the same round's baseline, with where sparktf's seconds went
(``phases_s``: from the chief's milestones, ``TrainResult.startup_s``: Spark's tasks and
the process start, the wait for the others,
TensorFlow's import, the strategy, the model, the first step). ``--rounds`` rounds (with
``--budget``: as many as fit, at least 2; bench/common.py), round robin (baseline, then each
configuration), medians count. Goals: allreduce/files >= 0.9x, allreduce/spark >= 0.8x,
ps/files >= 0.8x, ps/spark >= 0.7x the baseline, and with ``--s3`` allreduce/files-s3 >=
0.9x (as from local files: reading from S3 must not slow training); start-up overhead
(the warm median, the worse strategy of each input mode, local input; the cold round is
recorded beside it) <= 3 s with
files input (``train.startup_overhead_files_s``), <= 5 s with the spark feed
(``train.startup_overhead_spark_s``); allreduce/files-s3's is recorded, not a goal. With
both allreduce/files and allreduce/files-s3 run, ``ratio_s3_over_local_files`` (their
medians' ratio, and each round's) is recorded, not a goal. Peak memory of the whole process
tree is sampled. Prints JSON and writes it to bench/results/.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

from sparktf import cli

log = logging.getLogger("bench.train")
# name: (strategy, input mode, where the data is: the local copy or the S3 one)
CONFIGS = {
    "allreduce/files": ("allreduce", "files", "local"),
    "allreduce/spark": ("allreduce", "spark", "local"),
    "ps/files": ("ps", "files", "local"),
    "ps/spark": ("ps", "spark", "local"),
    "allreduce/files-s3": ("allreduce", "files", "s3"),  # --s3 only
}
S3_CONFIGS = {name for name, (_, _, store) in CONFIGS.items() if store == "s3"}

GOALS = {
    "allreduce/files": 0.9,
    "allreduce/spark": 0.8,
    "ps/files": 0.8,
    "ps/spark": 0.7,
    "allreduce/files-s3": 0.9,  # --s3 only
}
# sparktf's time to first step over the baseline's, by input mode (the worse strategy)
OVERHEAD_GOALS_S = {"files": 3.0, "spark": 5.0}
MIN_STARTUP_ROUNDS = 2  # the cold one and a warm one
STARTUP_SHARE = 0.4  # of what is left of --budget, for the start-up rounds
GPU_RATIO_GOAL = 0.9
GPU_BF16_RATE_GOAL = 30_000.0

BASELINE = textwrap.dedent("""
    import json, os, sys, time
    started = time.perf_counter()
    data, batch, steps, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    gpus, precision = int(sys.argv[5]), sys.argv[6]
    if not gpus:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    import keras
    import tensorflow as tf
    from sparktf import models, storage
    from sparktf.datasets import formats
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(threads)
    manifest = formats.load_manifest(data)
    files = [storage.parse(f).path
             for f in formats.split_files(manifest, data, "train", "tfrecord")]
    spec = {k: v for k, v in formats.feature_spec("image").items() if k in ("image", "label")}

    def parse(serialized):
        f = tf.io.parse_example(serialized, spec)
        image = tf.reshape(tf.io.decode_raw(f["image"], tf.uint8), [-1, 32, 32, 3])
        return image, f["label"]

    ds = (tf.data.TFRecordDataset(files, num_parallel_reads=tf.data.AUTOTUNE)
          .shuffle(2048, seed=0).repeat().batch(batch, drop_remainder=True)
          .map(parse, num_parallel_calls=tf.data.AUTOTUNE).prefetch(tf.data.AUTOTUNE))
    task = models.get_task("resnet20", batch_size=batch, precision=precision)
    with models.precision_policy(precision):  # as sparktf's trainer builds its model
        model = task.build_model()
    model.compile(optimizer=task.make_optimizer(max(1, 2045 // batch), model),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    ends = []

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, step, logs=None):
            ends.append(time.perf_counter())

    model.fit(ds, epochs=1, steps_per_epoch=steps, callbacks=[Clock()], verbose=0)
    seconds = ends[-1] - ends[0]
    print(json.dumps({"examples_per_sec": (len(ends) - 1) * batch / seconds if seconds else None,
                      "seconds_after_first_step": seconds,
                      "time_to_first_step_s": ends[0] - started, "steps": len(ends),
                      "threads": threads, "gpus": len(tf.config.list_physical_devices("GPU")),
                      "precision": precision}))
""")


def baseline(
    data: str, batch: int, steps: int, threads: int, gpus: int = 0, precision: str = "fp32"
) -> dict:
    argv = [data, str(batch), str(steps), str(threads), str(gpus), precision]
    with common.PeakMemory() as memory:
        out = subprocess.run(
            [sys.executable, "-c", BASELINE, *argv],
            capture_output=True,
            text=True,
            timeout=1800,
            env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(common.ROOT)},
        )
    if out.returncode != 0:
        raise RuntimeError(f"baseline failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result.update(memory.report())
    return result


def scaling(strategy: str, gpus: int = 0):
    """The cluster of a configuration: CPU: two executors of one core (allreduce: two
    workers of one TensorFlow thread each; ps: coordinator + one worker, ps on the driver,
    TensorFlow's default threads, sparktf's default: the worker is the one process that
    computes); GPU: one worker per GPU."""
    from sparktf.train import ScalingConfig

    workers = (gpus or 2) if strategy == "allreduce" else 1
    return ScalingConfig(
        strategy=strategy,
        num_workers=workers,
        num_ps=1,
        ps_on_driver=True,
        gpus_per_worker=1 if gpus else 0,
        threads_per_worker=1 if strategy == "allreduce" and not gpus else 0,
    )


def sparktf_run(
    spark,
    data: str,
    strategy: str,
    input_mode: str,
    batch: int,
    steps: int,
    model_dir: str,
    gpus: int = 0,
    precision: str = "fp32",
) -> dict:
    from sparktf.train import RunConfig, TrainConfig, fit

    with common.PeakMemory() as memory:
        result = fit(
            TrainConfig(
                model="resnet20",
                data=data,
                input_mode=input_mode,
                steps=steps,
                batch_size=batch,
                model_config={"precision": precision},
            ),
            scaling(strategy, gpus),
            RunConfig(
                model_dir=model_dir,
                checkpoint={"every_steps": 10 * steps, "export": False},
                evaluation={"split": "none"},  # the baseline does not evaluate either
                tracking={"summary_every_steps": 10},
            ),
            spark=spark,
        )
    return {
        "examples_per_sec": result.examples_per_sec,
        "time_to_first_step_s": result.time_to_first_step_s,
        "elapsed_s": result.elapsed_s,
        "final_step": result.final_step,
        "loss": result.metrics.get("loss"),
        "startup_s": result.startup_s,  # the chief's milestones, s from the call
        # the share of its training time each process waited for its next batch (and the
        # driver's finding when the run waited much): an input that slows training shows here
        "input_wait": result.input_wait,
        "input_diagnosis": result.input_diagnosis,
        **memory.report(),
    }


def gpu_goals(med: dict, precision: str) -> dict:
    """GPU goals: every configuration run >= 0.9x the single process;
    bf16: >= 30k training images/s through sparktf (an H200-class GPU)."""
    base_rate = med["baseline_keras_fit"]
    goals = {
        f"{name} / Keras fit, GPU {precision}": common.goal(
            common.ratio(rate, base_rate), GPU_RATIO_GOAL
        )
        for name, rate in med.items()
        if name != "baseline_keras_fit"
    }
    if precision == "bf16":
        best = max((v for k, v in med.items() if k != "baseline_keras_fit"), default=None)
        goals["sparktf images/s, GPU bf16"] = common.goal(best, GPU_BF16_RATE_GOAL)
        goals["single process images/s, GPU bf16"] = common.goal(base_rate, GPU_BF16_RATE_GOAL)
    return goals


def overhead_goals(warm: dict[str, float]) -> dict:
    """``train.startup_overhead_<input mode>_s``: the warm median of sparktf's time to first
    step minus the baseline's (:func:`startup_rounds`), for the worse strategy of the input
    mode."""
    goals = {}
    for mode, target in OVERHEAD_GOALS_S.items():
        values = [v for name, v in warm.items() if name.endswith(f"/{mode}")]
        goals[f"train.startup_overhead_{mode}_s"] = common.goal(
            max(values) if values else None, target, "<="
        )
    return goals


def phases(startup_s: dict[str, float]) -> dict[str, float]:
    """The chief's milestones (s from the call, in order) as the seconds each phase took:
    ``to_launched`` (the plan, Spark's tasks, the process's start and sparktf's imports),
    then from each milestone to the next (``launched_to_joined``: the wait for the other
    processes; ``..._to_first_step``: the first trace and the first all-reduce)."""
    out, before, last = {}, "", 0.0
    for name, at in startup_s.items():
        out[f"{before}to_{name}" if before else f"to_{name}"] = round(at - last, 2)
        before, last = f"{name}_", at
    return out


def startup_rounds(
    spark, where: dict, configs: list[str], args, tmp: str
) -> tuple[dict, dict[str, list[float]]]:
    """Time to first step in rounds of its own (``--startup-rounds``), before anything else
    has run in the session: one-step runs, round robin (the baseline, then each
    configuration). The first round is the cold one a user's first run meets (the session's
    first TensorFlow processes, Python workers and imports); the others are warm. Returns
    the report (each configuration's overhead over the same round's baseline, cold and the
    warm median, and where its seconds went: :func:`phases`, cold and the warm medians) and
    each configuration's overheads, round by round (``main`` adds the throughput rounds' to
    the warm ones for the goal). With ``--budget``: :class:`common.RoundBudget` with
    :data:`STARTUP_SHARE` of what is left, at least :data:`MIN_STARTUP_ROUNDS`."""
    first, overheads, breakdowns = common.Rounds(), common.Rounds(), {}
    rounds = common.RoundBudget(
        args.startup_rounds, args.budget, min_rounds=MIN_STARTUP_ROUNDS, share=STARTUP_SHARE
    )
    for r in rounds:
        base = baseline(where["local"], args.batch_size, 1, args.threads, args.gpus, args.precision)
        first.add("baseline_keras_fit", base["time_to_first_step_s"])
        for name in configs:
            strategy, input_mode, store = CONFIGS[name]
            run = sparktf_run(
                spark, where[store], strategy, input_mode, args.batch_size, 1,
                os.path.join(tmp, f"startup-{r}-{name.replace('/', '-')}"),
                args.gpus, args.precision,
            )  # fmt: skip
            seconds = run["time_to_first_step_s"] or float("nan")
            first.add(name, seconds)
            overheads.add(name, seconds - base["time_to_first_step_s"])
            breakdowns.setdefault(name, []).append(phases(run["startup_s"]))
            log.info(
                "start-up round %d %s: first step after %.2f s (%+.2f s over the baseline): %s",
                r, name, seconds, overheads.values[name][-1], breakdowns[name][-1],
            )  # fmt: skip

    def warm_median(values: list) -> float | None:
        return round(statistics.median(values[1:]), 2) if len(values) > 1 else None

    report = {
        **rounds.report(),
        "time_to_first_step_s": first.report(2),
        "overhead_s": {
            name: {
                "cold": round(values[0], 2),
                "warm_median": warm_median(values),
                "rounds": [round(v, 2) for v in values],
            }
            for name, values in overheads.values.items()
        },
        "phases_s": {
            name: {
                "cold": each[0],
                "warm_median": {
                    key: warm_median([r[key] for r in each if key in r]) for key in each[0]
                },
            }
            for name, each in breakdowns.items()
        },
    }
    return report, overheads.values


def publish_to_s3(local: str, remote: str) -> None:
    """A copy of the local dataset at ``remote`` (s3://), published: the copy under a
    temporary prefix, put in place with its commit marker last (sparktf's readers refuse an
    S3 directory without it)."""
    from sparktf import storage

    with storage.publish(remote, overwrite=True) as tmp:
        storage.copy_tree(local, tmp)


def parse_configs(p: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    """The configurations of ``--configs``: ``all`` is every one, allreduce/files-s3 only
    with ``--s3`` (without it, naming it is a usage error)."""
    if args.configs == "all":
        return [name for name in CONFIGS if args.s3 or name not in S3_CONFIGS]
    configs = [c.strip() for c in args.configs.split(",") if c.strip()]
    for name in configs:
        if name not in CONFIGS:
            p.error(f"--configs: expected some of {', '.join(CONFIGS)}, got {name}")
        if name in S3_CONFIGS and not args.s3:
            p.error(f"--configs: {name} needs --s3 (the S3 store to read from)")
    if not configs:
        p.error("--configs: no configuration given")
    return list(dict.fromkeys(configs))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--steps",
        type=int,
        default=80,
        help="steps per run (default 80: a window long enough that a run's first seconds "
        "do not decide the ratio)",
    )
    p.add_argument("--batch-size", type=int, default=64, help="global batch")
    p.add_argument(
        "--threads",
        type=int,
        default=os.cpu_count() or 1,
        help="TensorFlow threads of the baseline process (default: the CPU count, what "
        "sparktf's processes have together)",
    )
    p.add_argument(
        "--configs",
        default="all",
        help="comma list of strategy/input_mode, e.g. allreduce/files,ps/spark; "
        "allreduce/files-s3 (files input from S3) needs --s3 (default: all, with "
        "allreduce/files-s3 only with --s3)",
    )
    p.add_argument(
        "--s3",
        action="store_true",
        help="also train with files input from a throwaway S3 store (SeaweedFS, scripts/s3.sh; "
        "the configuration allreduce/files-s3; off by default: one more run a round)",
    )
    p.add_argument(
        "--gpus",
        type=int,
        default=0,
        help="GPUs: the baseline process uses them, sparktf runs one worker per GPU "
        "(--gpus-per-worker 1); 0 (default): CPU only",
    )
    p.add_argument(
        "--precision",
        choices=["fp32", "bf16"],
        default="fp32",
        help="compute precision of both sides (bf16: Keras mixed precision)",
    )
    p.add_argument(
        "--startup-rounds",
        type=common.positive_int,
        default=5,
        help="rounds of one-step runs that measure the time to first step, first thing in "
        "the session: the first is the cold one, the median of the others the warm one "
        "(default 5)",
    )
    common.add_tag(p, "train", "gpu-bf16")
    common.add_rounds(p)
    args = p.parse_args(argv)
    configs = parse_configs(p, args)
    cli.setup_logging("WARNING")
    logging.getLogger("bench").setLevel(logging.INFO)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

    from sparktf.datasets import demo

    startup: dict = {}
    with contextlib.ExitStack() as stack:
        s3_uri = None
        if args.s3:  # before the session: it gives the executors' Python the AWS_* settings
            seconds, s3_uri = common.timed(stack.enter_context, common.s3())
            startup["s3_store"] = round(seconds, 2)
        seconds, spark = common.local_session(
            "sparktf-bench-train", **common.gpu_overrides(args.gpus)
        )
        startup["spark_session"] = round(seconds, 2)
        result: dict = {
            "benchmark": "train",
            "model": "resnet20",
            "steps": args.steps,
            "global_batch": args.batch_size,
            "baseline_threads": args.threads,
            "gpus": args.gpus,
            "precision": args.precision,
            "configs": configs,
            "s3": common.s3_store_name() if args.s3 else "not measured (--s3)",
            "machine": common.machine(),
            "window": "end of the first step to end of the last step, both sides",
            "startup_s": startup,
        }
        rates, first_step, overheads = common.Rounds(), common.Rounds(), common.Rounds()
        runs: dict = {}
        try:
            data = demo.ensure_dataset("resnet20", spark)
            result["data"] = data
            where = {"local": data}
            if s3_uri is not None:
                where["s3"] = f"{s3_uri}/bench/demo-resnet20"
                seconds, _ = common.timed(publish_to_s3, data, where["s3"])
                startup["copy_to_s3"] = round(seconds, 2)
                result["data_s3"] = where["s3"]
            with tempfile.TemporaryDirectory(prefix="sparktf-bench-train-") as tmp:
                result["startup_rounds"], startup_overheads = startup_rounds(
                    spark, where, configs, args, tmp
                )
                rounds = common.RoundBudget.from_args(args)
                for r in rounds:
                    base = baseline(
                        data, args.batch_size, args.steps, args.threads, args.gpus, args.precision
                    )
                    rates.add("baseline_keras_fit", base["examples_per_sec"])
                    first_step.add("baseline_keras_fit", base["time_to_first_step_s"])
                    runs.setdefault("baseline_keras_fit", []).append(base)
                    log.info(
                        "round %d baseline: %.1f examples/s, first step after %.1f s",
                        r,
                        base["examples_per_sec"],
                        base["time_to_first_step_s"],
                    )
                    for name in configs:
                        strategy, input_mode, store = CONFIGS[name]
                        run = sparktf_run(
                            spark,
                            where[store],
                            strategy,
                            input_mode,
                            args.batch_size,
                            args.steps,
                            os.path.join(tmp, f"{r}-{name.replace('/', '-')}"),
                            args.gpus,
                            args.precision,
                        )
                        rates.add(name, run["examples_per_sec"])
                        first_step.add(name, run["time_to_first_step_s"] or float("nan"))
                        overheads.add(
                            name,
                            (run["time_to_first_step_s"] or float("nan"))
                            - base["time_to_first_step_s"],
                        )
                        runs.setdefault(name, []).append(run)
                        log.info(
                            "round %d %s: %.1f examples/s, first step after %.1f s (%+.1f s)",
                            r,
                            name,
                            run["examples_per_sec"],
                            run["time_to_first_step_s"] or -1,
                            overheads.values[name][-1],
                        )
            rounds.record(result)
            result["examples_per_sec"] = rates.report(1)
            result["time_to_first_step_s"] = first_step.report(2)
            result["startup_overhead_s"] = overheads.report(2)
            result["runs"] = runs
            med = rates.medians()
            base_rate = med["baseline_keras_fit"]
            result["ratio_to_baseline"] = {
                k: round(v / base_rate, 3) for k, v in med.items() if k != "baseline_keras_fit"
            }
            if "allreduce/files" in med and "allreduce/files-s3" in med:
                # informational, not a goal: what reading from S3 costs training
                result["ratio_s3_over_local_files"] = {
                    "median": round(med["allreduce/files-s3"] / med["allreduce/files"], 3),
                    "rounds": [
                        round(s3 / local, 3)
                        for s3, local in zip(
                            rates.values["allreduce/files-s3"], rates.values["allreduce/files"]
                        )
                    ],
                }
            if args.gpus:
                goals = gpu_goals(med, args.precision)
            else:
                goals = {
                    f"{name} / Keras fit": common.goal(
                        common.ratio(med.get(name), base_rate), target
                    )
                    for name, target in GOALS.items()
                    if args.s3 or name not in S3_CONFIGS
                }
                # warm: the start-up rounds after the first and every throughput round (each
                # a warm run, against its round's baseline): the median of all of them
                warm = {
                    name: statistics.median(values[1:] + overheads.values.get(name, []))
                    for name, values in startup_overheads.items()
                }
                result["startup_rounds"]["warm_median_s"] = {
                    k: round(v, 2) for k, v in warm.items()
                }
                goals.update(overhead_goals(warm))
            result["goals"] = goals
            result["machine_after"] = common.machine()
        finally:
            spark.stop()
    common.write_results(common.result_name("train", args.tag), result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
