"""sparktf: convert datasets with Spark, train the book's models on Spark executors, and
predict in batch.

``import sparktf`` stays light; ``sparktf.predict`` (batch inference over a DataFrame, see
:func:`sparktf.inference.predict`) is imported on first use.
"""

from __future__ import annotations

from typing import Any

from sparktf import _zipimport
from sparktf.errors import SparktfError

__all__ = ["SparktfError", "predict"]

_zipimport.install_in_spark_worker()


def __getattr__(name: str) -> Any:
    if name == "predict":
        from sparktf.inference import predict

        globals()["predict"] = predict
        return predict
    raise AttributeError(f"module 'sparktf' has no attribute {name!r}")
