"""The closing summary of ``scripts/quickstart.sh``: what was trained, how it did, where the
export is, whether the data was the synthetic demo set, and the commands to run next.

    python -m sparktf.jobs.quickstart RESULT_JSON [TRAIN-ARGS]

``RESULT_JSON`` is the training job's ``--result-json``; ``TRAIN-ARGS`` are the arguments the
quickstart passed to ``jobs/train_resnet.py`` (to know the model and the data it used).

On the demo set the evaluation line names the accuracy of guessing (one over the number of
classes), so the reader sees how far above chance the model got.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Mapping, Sequence

from sparktf import cli, storage
from sparktf.datasets import demo
from sparktf.jobs import train as train_job

__all__ = ["SECTION", "chance_accuracy", "main", "summary"]

SECTION = "train_resnet"
# What each demo set is, for the summary's data line.
DEMO_CONTENT = {
    "cifar10": "10 classes of striped patterns plus noise, not CIFAR-10",
    "mnist": "10 classes of striped patterns plus noise, not MNIST",
    "ptb": "words of a Markov chain, not the Penn Treebank",
}


def _shown(path: str) -> str:
    """A path as the user types it from the current directory (scripts/quickstart.sh runs
    from the checkout): relative when inside it."""
    if storage.is_remote(path):
        return path
    full = os.path.abspath(path)
    root = os.getcwd()
    return os.path.relpath(full, root) if full.startswith(root + os.sep) else full


def _metrics(values: Mapping[str, float]) -> str:
    return ", ".join(f"{name} {value:.4g}" for name, value in values.items()) or "none"


def chance_accuracy(model: str) -> float | None:
    """The accuracy of guessing a class at random for a registry classifier (one over its
    number of classes); None for a model without classes (a language model, a GAN).
    Raises ``ValueError`` for a model the registry does not know."""
    from sparktf import models  # deferred: imports TensorFlow

    classes = getattr(models.get_task(model), "num_classes", None)
    return 1.0 / classes if classes else None


def summary(result: Mapping, model: str, data: str) -> str:
    """The text printed at the end of the quickstart.

    Parameters: ``result``, the training job's result (``--result-json``: strategy, input
    mode, steps, metrics, evaluation history, export path); ``model``, the registry model
    that was trained; ``data``, the job's ``--data`` (``"demo"`` for the synthetic set).
    Returns the lines to print: what ran, the training and evaluation metrics, where the
    export is, and the commands to run next. Raises ``KeyError`` when ``result`` lacks a
    field and ``ValueError`` for a model with no demo set when ``data`` is ``"demo"``.
    """
    synthetic = data == "demo"
    dataset = str(demo.demo_dir() / demo.dataset_for(model)) if synthetic else data
    export = result.get("export_dir") or ""
    export_root = os.path.dirname(export.rstrip("/")) if export else ""
    lines = [
        "",
        "sparktf quickstart: done",
        f"  model       {model} ({result['strategy']}, input mode {result['input_mode']})",
        f"  steps       {result['start_step']} -> {result['final_step']} "
        f"in {result['elapsed_s']:.0f} s",
        f"  training    {_metrics(result.get('metrics') or {})}",
    ]
    history = result.get("eval_history") or []
    if history:
        last = history[-1]
        chance = chance_accuracy(model) if "accuracy" in last else None
        guess = f"; guessing: accuracy {chance:.2g}" if chance else ""
        lines.append(
            f"  evaluation  {_metrics({k: v for k, v in last.items() if k != 'step'})} "
            f"(step {last['step']}{guess})"
        )
    lines.append(f"  export      {_shown(export) if export else 'none'}")
    if synthetic:
        content = DEMO_CONTENT[demo.dataset_for(model)]
        lines.append(
            f"  data        SYNTHETIC: the demo set in {_shown(dataset)} ({content}); the "
            "figures show the pipeline works and the model learns, not its quality on real data"
        )
    else:
        lines.append(f"  data        {_shown(dataset)}")
    lines += ["", "Next:"]
    if export_root:
        test_split = storage.join(dataset, "test", "parquet")
        lines += [
            "  # predictions for the test split (Parquet: id, label, prediction, probability, "
            "rawPrediction)",
            "  ./scripts/submit.sh jobs/predict.py --export "
            f"{_shown(export_root)} --input {_shown(test_split)} "
            "--output .local/predictions/quickstart --overwrite",
            "  # accuracy, per-class metrics and the confusion matrix of this export",
            f"  ./scripts/submit.sh jobs/evaluate.py --export {_shown(export_root)} "
            f"--data {_shown(dataset)} --output .local/eval/quickstart.json --overwrite",
        ]
    lines += [
        "  # real CIFAR-10 (cifar-10-binary.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html)",
        "  ./scripts/submit.sh jobs/convert_cifar10.py --input cifar-10-binary.tar.gz "
        "--output .local/datasets/cifar10",
        "  ./scripts/submit.sh jobs/train_resnet.py --data .local/datasets/cifar10 "
        "--model-dir .local/runs/cifar10-resnet20 --epochs 10",
        "",
    ]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the quickstart's summary; ``argv`` is ``RESULT_JSON [TRAIN-ARGS]`` (default:
    ``sys.argv[1:]``). Returns 0, or 2 without arguments (the usage is printed then). A
    summary that cannot be made (a model without a demo set) becomes a one-line note."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    result_file, train_args = argv[0], argv[1:]
    with open(result_file) as f:
        result = json.load(f)
    args = cli.parse(
        train_job.parser("", SECTION, "resnet20"), [*train_args, "--log-level", "WARNING"]
    )
    try:
        print(summary(result, args.model, args.data))
    except (KeyError, ValueError) as exc:  # a model without a demo set: say what ran
        print(f"quickstart: trained; summary unavailable ({exc}): {shlex.join(argv)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
