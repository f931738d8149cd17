"""The command lines of the jobs in ``jobs/``, one module per job family.

- :mod:`sparktf.jobs.convert` — ``jobs/convert_<dataset>.py``: raw CIFAR-10, MNIST, PTB to
  TFRecord and Parquet (:func:`sparktf.datasets.conversion.convert`);
- :mod:`sparktf.jobs.train` — ``jobs/train*.py``: flags to configs to
  :func:`sparktf.train.fit`;
- :mod:`sparktf.jobs.predict` — ``jobs/predict.py``: batch prediction over a Parquet table
  (:func:`sparktf.inference.predict`).
- :mod:`sparktf.jobs.evaluate` — ``jobs/evaluate.py``: metrics of an export on a dataset
  split (accuracy, top-5, per-class precision/recall/F1, confusion matrix; perplexity).

Each script in ``jobs/`` is a thin entry point: its docstring (documentation for readers of
the checkout), an import and ``sparktf.console.run_job(NAME)``, which ``sparktf NAME`` runs
too; ``sparktf.console.JOBS`` holds each job's ``--help`` description. Flag defaults come
from ``jobs/<job>.json`` of the conf directories (see :mod:`sparktf.paths`,
:mod:`sparktf.cli`). This is the top layer: nothing else in sparktf imports it, and this
package imports none of its modules (each job imports only what it needs).
"""

__all__ = []
