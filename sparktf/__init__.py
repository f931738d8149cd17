"""sparktf: convert datasets with Spark, train the book's models on Spark executors, and
predict in batch.

``import sparktf`` stays light; ``sparktf.predict`` (batch inference over a DataFrame, see
:func:`sparktf.inference.predict`) and ``sparktf.predict_udf`` (the model as a column
function, :func:`sparktf.inference.predict_udf`) are imported on first use.
"""

from __future__ import annotations

from typing import Any

from sparktf import _zipimport
from sparktf.errors import SparktfError

__all__ = ["SparktfError", "predict", "predict_udf"]

_zipimport.install_in_spark_worker()


def __getattr__(name: str) -> Any:
    if name in ("predict", "predict_udf"):
        from sparktf import inference

        globals()[name] = getattr(inference, name)
        return globals()[name]
    raise AttributeError(f"module 'sparktf' has no attribute {name!r}")
