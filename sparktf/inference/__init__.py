"""Batch inference over Spark DataFrames with an exported SavedModel: :func:`predict`.

``sparktf.predict(df, export, ...)`` (this package's :func:`predict`) applies a SavedModel
written by a task's ``export`` (``MODEL_DIR/export/<version>/``) to every row of a
DataFrame and returns the rows with the predictions added. It runs on the executors over
Arrow record batches (``DataFrame.mapInArrow``): a batch's column buffers are turned into
numpy arrays without a Python object per row, cut into ``batch_size`` rows and passed to
one signature of the model.

Where the model comes from (the driver reads only ``saved_model.pb`` and
``variables/variables.index`` to learn the signatures; no Spark job runs for it):

* a local path, ``file://`` or ``hdfs://`` URI of a version directory (holding
  ``saved_model.pb``), of ``MODEL_DIR/export`` (the highest numbered version is used) or of
  ``MODEL_DIR`` itself (then ``MODEL_DIR/export``);
* on each executor the model is loaded once per Python worker and kept in
  :class:`ModelCache`; an ``hdfs://`` model is first copied once per machine into
  ``$SPARKTF_MODEL_CACHE_DIR`` (default ``<tempdir>/sparktf-models-<uid>/<fingerprint>``),
  a directory private to the user (0700; one that another user owns or can write, or a
  symbolic link, is refused). A copy is used only while its contents match the
  fingerprint the driver computed from the source (:func:`export_fingerprint`); one that
  does not match is copied again.

The modules, each importing only those above it in this list:

- :mod:`~sparktf.inference.saved_model` — the export (the SavedModel) as the driver sees it:
  where it is, its fingerprint, its signatures;
- :mod:`~sparktf.inference.output_columns` — any signature's outputs as Spark columns;
- :mod:`~sparktf.inference.prediction_plan` — the plan of a prediction: signature, input contract,
  added columns, checked against the DataFrame's schema;
- :mod:`~sparktf.inference.decode` — Arrow batches to checked model inputs (executors);
- :mod:`~sparktf.inference.cache` — local copies of HDFS models and the per-worker cache of
  loaded signatures (executors);
- :mod:`~sparktf.inference.execute` — the ``mapInArrow`` function run on each partition;
- :mod:`~sparktf.inference.api` — :func:`predict` itself;
- :mod:`~sparktf.inference.sql` — the model as a column function (:func:`predict_udf`) and
  a SQL function (:func:`register_udf`).
"""

from __future__ import annotations

from sparktf.inference.api import predict
from sparktf.inference.cache import (
    ModelCache,
    ModelCacheError,
    ModelCacheMismatchError,
    model_cache_dir,
)
from sparktf.inference.decode import NPZ_MAGIC
from sparktf.inference.prediction_plan import LM_OUTPUTS, PredictInputError
from sparktf.inference.saved_model import (
    ExportInfo,
    ModelNotFoundError,
    Signature,
    TensorSpec,
    export_fingerprint,
    inspect_export,
    resolve_export,
)
from sparktf.inference.sql import predict_udf, register_udf

__all__ = [
    "LM_OUTPUTS",
    "NPZ_MAGIC",
    "ExportInfo",
    "ModelCache",
    "ModelCacheError",
    "ModelCacheMismatchError",
    "ModelNotFoundError",
    "PredictInputError",
    "Signature",
    "TensorSpec",
    "export_fingerprint",
    "inspect_export",
    "model_cache_dir",
    "predict",
    "predict_udf",
    "register_udf",
    "resolve_export",
]
