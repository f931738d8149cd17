"""Spark ML Pipeline stages: :class:`TFEstimator` trains, :class:`TFModel` predicts.

>>> from pyspark.ml import Pipeline
>>> from pyspark.ml.feature import VectorAssembler
>>> from sparktf.ml import TFEstimator
>>> pipeline = Pipeline(stages=[
...     VectorAssembler(inputCols=["x1", "x2", "x3"], outputCol="features"),
...     TFEstimator(model="my_mlp", modelDir="hdfs://nn:8020/models/mlp", numWorkers=2,
...                 epochs=5, batchSize=32),
... ])
>>> fitted = pipeline.fit(train_df)            # trains on the executors (sparktf.train.fit)
>>> scored = fitted.transform(test_df)         # + prediction, probability, rawPrediction
>>> MulticlassClassificationEvaluator(metricName="accuracy").evaluate(scored)
>>> fitted.stages[-1].summary.final_step       # the fit's TrainResult, saved with the model
>>> fitted.save("hdfs://nn:8020/pipelines/mlp"); PipelineModel.load(...)

``TFEstimator.fit(df)`` checks the DataFrame's feature, label and id columns in one Spark
job (:func:`sparktf.datasets.tables.check_table`: a bad row fails naming its column and id,
before TensorFlow starts), then feeds them to the TensorFlow processes as they are (the
``spark`` input mode, :func:`sparktf.train.fit` with the DataFrame as ``TrainConfig.data``:
no copy is written; each epoch runs the DataFrame's plan again, so cache a costly one), and
returns a :class:`TFModel` of the run's export. ``TFModel``
adds the columns of a Spark ML classifier (``prediction`` double, ``probability`` and
``rawPrediction`` Vectors), so Spark's evaluators, ``CrossValidator`` and
``TrainValidationSplit`` work on it unchanged. Both stages save and
load with Spark ML, also inside ``Pipeline`` and ``PipelineModel``. The column contract, what
``rawPrediction`` holds, the model directories of a ``CrossValidator`` and what a saved model
contains are in docs/ml.md.
"""

# pyspark.ml names its Params, their getters and setters in mixedCase: so do these stages.
# ruff: noqa: N802, N803, N815

from __future__ import annotations

import dataclasses
import json
import logging
import posixpath
import threading
import urllib.parse
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (
    HasLabelCol,
    HasPredictionCol,
    HasProbabilityCol,
    HasRawPredictionCol,
)
from pyspark.ml.util import (
    DefaultParamsReadable,
    DefaultParamsReader,
    DefaultParamsWritable,
    DefaultParamsWriter,
    MLReadable,
    MLReader,
    MLWritable,
    MLWriter,
)

from sparktf import storage
from sparktf.datasets.tables import FEATURE, TableInputError, write_table
from sparktf.errors import SparktfError, SparktfTypeError
from sparktf.spark import is_connect

if TYPE_CHECKING:  # pragma: no cover - typing only
    from pyspark.ml.param import ParamMap
    from pyspark.sql import DataFrame

    from sparktf.train import TrainResult

__all__ = [
    "FEATURE",
    "SAVED_MODEL",
    "NoSummaryError",
    "TFEstimator",
    "TFModel",
    "write_table",
]

log = logging.getLogger(__name__)

SAVED_MODEL = "savedmodel"  # TFModel.save: the SavedModel's copy under the path


# TrainResult's former field names, as summaries saved before the rename hold them.
_RENAMED_RESULT_KEYS = {
    "checkpoint": "last_checkpoint",
    "export_path": "export_dir",
    "best_export_path": "best_export_dir",
}


class NoSummaryError(SparktfError, RuntimeError):
    """``TFModel.summary`` of a model that was not made by ``TFEstimator.fit`` (nor loaded
    from one that was)."""


def _to_dict(value: Any) -> dict:
    """A JSON object (a dict, or its JSON text) -> dict; anything else is a TypeError, which
    Spark ML reports as an invalid value of the Param."""
    if isinstance(value, str):
        try:
            value = json.loads(value) if value.strip() else {}
        except ValueError as exc:
            raise SparktfTypeError(
                f"expected a dict or its JSON text, got {value!r}: {exc}"
            ) from None
    if not isinstance(value, dict):
        raise SparktfTypeError(f"expected a dict (or its JSON text), got {value!r}")
    return json.loads(json.dumps(value))  # JSON-able, as Spark ML saves it


def _param(name: str, doc: str, converter: Callable[[Any], Any]) -> Param:
    return Param(Params._dummy(), name, doc, typeConverter=converter)


class _ColumnParams(HasLabelCol, HasPredictionCol, HasProbabilityCol, HasRawPredictionCol):
    inputCol = _param(
        "inputCol",
        "feature column: a Vector, array<number> or numpy.save bytes",
        TypeConverters.toString,
    )
    featuresCols = _param(
        "featuresCols",
        "several feature columns, one per named input of the model (instead of inputCol): "
        "numbers, strings, Vectors or arrays of numbers",
        TypeConverters.toListString,
    )
    idCol = _param(
        "idCol", "column naming rows in errors (and the dataset's id)", TypeConverters.toString
    )

    def __init__(self) -> None:
        super().__init__()
        # Spark ML's classifier columns, which sparktf.predict adds under the same names
        self._setDefault(
            inputCol="features", featuresCols=[], idCol="id", rawPredictionCol="rawPrediction"
        )

    def _set_given(self) -> Any:
        """Sets the Params a ``@keyword_only`` method was given (None: left as is)."""
        return self._set(**{k: v for k, v in self._input_kwargs.items() if v is not None})

    def getInputCol(self) -> str:
        return self.getOrDefault(self.inputCol)

    def getIdCol(self) -> str:
        return self.getOrDefault(self.idCol)

    def getFeaturesCols(self) -> list[str]:
        return list(self.getOrDefault(self.featuresCols))

    def setFeaturesCols(self, value: list[str]) -> Any:
        return self._set(featuresCols=value)

    def setInputCol(self, value: str) -> Any:
        return self._set(inputCol=value)

    def setLabelCol(self, value: str) -> Any:
        return self._set(labelCol=value)

    def setPredictionCol(self, value: str) -> Any:
        return self._set(predictionCol=value)

    def setProbabilityCol(self, value: str) -> Any:
        return self._set(probabilityCol=value)

    def setRawPredictionCol(self, value: str) -> Any:
        return self._set(rawPredictionCol=value)

    def setIdCol(self, value: str) -> Any:
        return self._set(idCol=value)


class _TrainParams(_ColumnParams):
    model = _param(
        "model",
        "registry name, sparktf.models.register name, or 'package.module:build'",
        TypeConverters.toString,
    )
    modelConfig = _param("modelConfig", "model config overrides (a dict)", _to_dict)
    loss = _param(
        "loss",
        "a user's model: a Keras loss name (implies the kind: 'mse' regression, "
        "'binary_crossentropy' binary, ...)",
        TypeConverters.toString,
    )
    metrics = _param(
        "metrics", "a user's model: metric names (evaluation)", TypeConverters.toListString
    )
    strategy = _param("strategy", "allreduce or ps", TypeConverters.toString)
    numWorkers = _param("numWorkers", "training processes (ps: workers)", TypeConverters.toInt)
    minWorkers = _param(
        "minWorkers",
        "elastic runs: the fewest workers the run goes on with (numWorkers the most)",
        TypeConverters.toInt,
    )
    numPs = _param("numPs", "parameter servers (ps strategy)", TypeConverters.toInt)
    psOnDriver = _param(
        "psOnDriver", "run the parameter servers on the driver", TypeConverters.toBoolean
    )
    threadsPerWorker = _param(
        "threadsPerWorker",
        "TensorFlow intra-op threads per process (0: TF's default)",
        TypeConverters.toInt,
    )
    epochs = _param("epochs", "passes over the DataFrame", TypeConverters.toFloat)
    steps = _param(
        "steps", "global training steps (with epochs: whichever first)", TypeConverters.toInt
    )
    batchSize = _param(
        "batchSize", "global batch size (default: the model's)", TypeConverters.toInt
    )
    seed = _param("seed", "shuffle seed", TypeConverters.toInt)
    modelDir = _param(
        "modelDir",
        "model directory (checkpoints, events, export; local or hdfs://)",
        TypeConverters.toString,
    )
    runConfig = _param(
        "runConfig",
        "more sparktf.train.RunConfig fields (a dict; its groups as dicts), e.g. "
        "{'failure': {'failure_timeout_s': 60}}",
        _to_dict,
    )

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(
            modelConfig={},
            strategy="allreduce",
            numWorkers=2,
            numPs=1,
            psOnDriver=False,
            threadsPerWorker=0,
            seed=0,
            runConfig={},
        )

    def _maybe(self, param: Param) -> Any:
        return self.getOrDefault(param) if self.isDefined(param) else None


# ----------------------------------------------------------------------------- TFEstimator


class TFEstimator(_TrainParams, Estimator, DefaultParamsWritable, DefaultParamsReadable):
    """Trains a sparktf model on a DataFrame's rows; ``fit(df)`` returns a :class:`TFModel`.

    Params (keyword arguments of the constructor and of ``setParams``; ``getOrDefault`` and
    the ``set...``/``get...`` methods of the column Params read and change them):

    * ``model`` (required): a registry name, a name entered by
      :func:`sparktf.models.register`, or ``"package.module:build"``
      (:mod:`sparktf.models.custom`); ``modelConfig``: its config overrides (a dict). A
      custom model's input shape, dtype and class count come from the data unless
      ``modelConfig`` sets them. ``loss`` and ``metrics`` (a user's model only): its
      ``loss`` and ``metrics`` config keys (:mod:`sparktf.models.custom`), e.g.
      ``loss="mse"`` for a regression model.
    * ``modelDir`` (required): where checkpoints, events and the export go (local or
      ``hdfs://``). One that already holds a checkpoint is resumed (``steps`` count across
      runs): use a fresh one per ``fit``. ``fitMultiple`` (what ``CrossValidator`` and
      ``TrainValidationSplit`` call) trains each of its param maps in a new directory
      ``modelDir/fits-<random>/<index>`` instead, unless the param map sets ``modelDir``.
    * ``strategy`` (``"allreduce"`` or ``"ps"``), ``numWorkers`` (2), ``numPs`` (1),
      ``psOnDriver`` (False), ``threadsPerWorker`` (0: TensorFlow's default): the
      :class:`sparktf.train.ScalingConfig`. The Spark session needs a task slot per
      process (``numWorkers`` for ``allreduce``; chief, workers and parameter servers on
      executors for ``ps``). ``minWorkers`` (unset) makes the run elastic: it goes on with
      down to ``minWorkers`` workers when executors are lost and grows back to
      ``numWorkers`` (docs/training.md "Elastic runs").
    * ``epochs``, ``steps`` (whichever ends first), ``batchSize`` (global; default the
      model's), ``seed`` (0): the :class:`sparktf.train.TrainConfig`; ``runConfig``: more
      :class:`sparktf.train.RunConfig` fields (a dict, its groups as dicts, e.g.
      ``{"checkpoint": {"every_steps": 100}, "failure": {"max_restarts": 1}}``); the fit
      does not evaluate during training (``EvalConfig.split`` is ``"none"``).
    * ``inputCol`` (``"features"``): a Spark ML ``Vector``, an ``array`` of numbers or
      ``numpy.save`` bytes of the model's input size; ``labelCol`` (``"label"``): for a
      classifier integer classes in ``[0, num_classes)`` (integral doubles, as
      ``StringIndexer`` gives, are accepted), for a binary model 0 or 1, for a regression
      or custom model a number (or a Vector or array of numbers of one size), for a
      multi-label model a Vector or array of 0/1 values; ``idCol`` (``"id"``): an integer
      column that names rows in errors. ``featuresCols`` (a list; default empty: one
      input, ``inputCol``): several columns, one per named input of a user's model (its
      ``inputs``, set to these names when the model does not set them): numbers, strings,
      Vectors or arrays of numbers (:mod:`sparktf.models.named`).
    * ``predictionCol``, ``probabilityCol``, ``rawPredictionCol``: passed to the
      :class:`TFModel` ``fit`` returns.

    ``fit(df)`` returns a :class:`TFModel` reading the run's export, whose ``summary`` is
    the run's :class:`sparktf.train.TrainResult`. It raises
    :class:`sparktf.train.ConfigError` when ``model`` or ``modelDir`` is not set or the
    settings cannot work; :class:`sparktf.datasets.tables.TableInputError` (a
    ``ValueError``) naming the column and the row for data the model cannot read (a missing
    column, a null, a label outside the classes, a row of another size), before training
    starts; :class:`sparktf.train.TrainingError` when the run fails or writes no export.
    No copy of the DataFrame is written: its rows are fed as they are, and each epoch runs
    its plan again (cache a costly one).
    """

    @keyword_only
    def __init__(
        self,
        *,
        model: str | None = None,
        modelConfig: dict | None = None,
        loss: str | None = None,
        metrics: list[str] | None = None,
        strategy: str = "allreduce",
        numWorkers: int = 2,
        minWorkers: int | None = None,
        numPs: int = 1,
        psOnDriver: bool = False,
        threadsPerWorker: int = 0,
        epochs: float | None = None,
        steps: int | None = None,
        batchSize: int | None = None,
        seed: int = 0,
        modelDir: str | None = None,
        inputCol: str = "features",
        featuresCols: list[str] | None = None,
        labelCol: str = "label",
        predictionCol: str = "prediction",
        probabilityCol: str = "probability",
        rawPredictionCol: str = "rawPrediction",
        idCol: str = "id",
        runConfig: dict | None = None,
    ) -> None:
        super().__init__()
        self._set_given()

    @keyword_only
    def setParams(self, **kwargs: Any) -> TFEstimator:
        """Sets the Params given (the constructor's keywords); returns this estimator."""
        return self._set_given()

    def fitMultiple(self, dataset: DataFrame, paramMaps: Sequence[ParamMap]) -> _FitIterator:
        """Fits one model per param map, each in a new directory under ``modelDir``.

        Args:
            dataset: the training rows.
            paramMaps: Param values per model, as ``ParamGridBuilder`` builds them.

        Returns:
            A thread-safe iterator of ``(index, TFModel)`` in the order the fits finish,
            as Spark ML's ``Estimator.fitMultiple``; a fit starts when the iterator is
            advanced. Each fit raises what ``fit`` raises.
        """
        maps = list(paramMaps)
        root = None
        if self.isDefined(self.modelDir):
            parent = storage.parse(self.getOrDefault(self.modelDir)).uri
            root = storage.join(parent, f"fits-{uuid.uuid4().hex[:12]}")

        def fit_one(index: int) -> TFModel:
            params = dict(maps[index])
            if root is not None and self.modelDir not in params:
                params[self.modelDir] = storage.join(root, str(index))
            return self.fit(dataset, params)

        return _FitIterator(fit_one, len(maps))

    def _fit(self, dataset: DataFrame) -> TFModel:
        from sparktf import models
        from sparktf.train import ConfigError, TrainConfig, TrainingError, fit

        for param in (self.model, self.modelDir):
            if not self.isDefined(param):
                raise ConfigError(f"TFEstimator: set {param.name} ({param.doc})")
        inputs = self.getFeaturesCols()
        given = [(col, "featuresCols") for col in inputs] or [(self.getInputCol(), "inputCol")]
        for col, name in (*given, (self.getLabelCol(), "labelCol")):
            if col not in dataset.columns:
                raise TableInputError(
                    f"the DataFrame has no column {col!r} (TFEstimator {name}); it has "
                    f"{dataset.columns}"
                )
        name = self.getOrDefault(self.model)
        model_config = dict(self.getOrDefault(self.modelConfig))
        for param, key in ((self.loss, "loss"), (self.metrics, "metrics")):
            if self.isDefined(param):
                model_config[key] = self.getOrDefault(param)
        try:
            task = models.get_task(name, **model_config)
            custom = isinstance(task, models.CustomTask)
            if custom and inputs and task.input_names is None:
                model_config["inputs"] = inputs
                task = models.get_task(name, **model_config)
            elif custom and not inputs and model_config.get("feature") is None:
                model_config["feature"] = FEATURE
                task = models.get_task(name, **model_config)
        except ValueError as exc:  # an unknown model or config key
            raise ConfigError(f"TFEstimator model {name!r}: {exc}") from None
        if custom and task.output_specs is not None:
            raise ConfigError(
                f"TFEstimator model {name!r} has several outputs ({list(task.output_specs)}), "
                "a label column each: TFEstimator has one labelCol; train it with "
                "sparktf.train.fit (docs/training.md)"
            )
        if inputs and (not custom or list(task.input_names or ()) != inputs):
            raise ConfigError(
                f"TFEstimator featuresCols {inputs}: model {name!r} reads "
                + (
                    f"the named inputs {list(task.input_names)}"
                    if custom and task.input_names
                    else "one input (inputCol)"
                )
            )
        if task.kind not in ("classifier", "binary") and not custom:
            raise ConfigError(
                f"TFEstimator model {name!r} is a {task.kind}; TFEstimator trains classifiers "
                "of the registry and a user's models (sparktf.models.register)"
            )
        scaling, run = self._scaling_and_run()
        train = TrainConfig(
            model=name,
            data=dataset,
            model_config=model_config,
            input_mode="spark",
            epochs=self._maybe(self.epochs),
            steps=self._maybe(self.steps),
            batch_size=self._maybe(self.batchSize),
            seed=self.getOrDefault(self.seed),
        )
        columns = {"label": self.getLabelCol(), "id": self.getIdCol()}
        if not inputs:
            columns["features"] = self.getInputCol()
        result = fit(train, scaling, run, spark=dataset.sparkSession, columns=columns)
        if not result.export_dir:
            raise TrainingError(
                f"training {name} wrote no export (CheckpointConfig.export is off?)"
            )
        out = TFModel(
            exportDir=result.export_dir,
            inputCol=self.getInputCol(),
            featuresCols=inputs,
            predictionCol=self.getPredictionCol(),
            probabilityCol=self.getProbabilityCol(),
            rawPredictionCol=self.getRawPredictionCol(),
            idCol=self.getIdCol(),
        )
        out._summary = result
        return out

    def _scaling_and_run(self) -> tuple[Any, Any]:
        """The run's ScalingConfig and RunConfig, from the Params (no evaluation during
        training: the fit's data has no evaluation split)."""
        from sparktf.train import RunConfig, ScalingConfig

        scaling = ScalingConfig(
            strategy=self.getOrDefault(self.strategy),
            num_workers=self.getOrDefault(self.numWorkers),
            min_workers=(
                self.getOrDefault(self.minWorkers) if self.isDefined(self.minWorkers) else None
            ),
            num_ps=self.getOrDefault(self.numPs),
            ps_on_driver=self.getOrDefault(self.psOnDriver),
            threads_per_worker=self.getOrDefault(self.threadsPerWorker),
        )
        model_dir = storage.parse(self.getOrDefault(self.modelDir)).uri
        run = RunConfig.from_dict({**self.getOrDefault(self.runConfig), "model_dir": model_dir})
        no_eval = dataclasses.replace(run.evaluation, split="none")
        return scaling, dataclasses.replace(run, evaluation=no_eval)


class _FitIterator:
    """``(index, model)`` pairs of ``fit_one(0..count-1)``; threads may share it."""

    def __init__(self, fit_one: Callable[[int], TFModel], count: int) -> None:
        self._fit_one = fit_one
        self._count = count
        self._next = 0
        self._lock = threading.Lock()

    def __iter__(self) -> _FitIterator:
        return self

    def __next__(self) -> tuple[int, TFModel]:
        with self._lock:
            index = self._next
            if index >= self._count:
                raise StopIteration
            self._next += 1
        return index, self._fit_one(index)


# ----------------------------------------------------------------------------- TFModel


class _TFModelWriter(MLWriter):
    """Params and the summary (Spark ML's JSON metadata) plus a copy of the SavedModel in
    ``PATH/savedmodel``."""

    def __init__(self, instance: TFModel) -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        from sparktf.inference import resolve_export

        extra: dict[str, Any] = {"savedModel": SAVED_MODEL}
        if self.instance.hasSummary:
            extra["summary"] = self.instance.summary.to_dict()
        spark = self.sparkSession
        DefaultParamsWriter.saveMetadata(self.instance, path, spark, extraMetadata=extra)
        source = resolve_export(self.instance.getExportDir())
        target = storage.join(_as_spark_resolves(spark, path), SAVED_MODEL)
        storage.copy_tree(source, target)
        log.info("TFModel saved to %s (SavedModel copied from %s)", path, source)

    def _handleOverwrite(self, path: str) -> None:
        if not is_connect(self.sparkSession):
            super()._handleOverwrite(path)
            return
        from pyspark.ml.util import ML_CONNECT_HELPER_ID
        from pyspark.ml.wrapper import JavaWrapper

        # Spark Connect's ML helper removes the path on the server, as Spark resolves it.
        JavaWrapper(java_obj=ML_CONNECT_HELPER_ID)._call_java("handleOverwrite", path, True)


class _TFModelReader(MLReader):
    def __init__(self, cls: type) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> TFModel:
        metadata = DefaultParamsReader.loadMetadata(path, self.sparkSession)
        model = self.cls()
        DefaultParamsReader.getAndSetParams(model, metadata)
        model._resetUid(metadata["uid"])
        saved = metadata.get("savedModel", SAVED_MODEL)
        model._set(exportDir=storage.join(_as_spark_resolves(self.sparkSession, path), saved))
        if metadata.get("summary") is not None:
            model._summary = _summary_from_dict(metadata["summary"], path)
        return model


def _as_spark_resolves(spark: Any, path: str) -> str:
    """``path`` as the URI Spark's ``save`` and ``load`` resolve it to: a path without a
    scheme is on the Hadoop configuration's ``fs.defaultFS`` (HDFS on a cluster), so that the
    SavedModel's copy lies beside the metadata Spark writes, also inside a PipelineModel.
    From a Spark Connect client, which has no JVM to ask, it is where Spark put the metadata
    (``path/metadata``, written before and read after this is called): the file path Spark
    reports for it, less the file's own part."""
    if is_connect(spark):
        metadata = storage.join(path, "metadata")
        first = spark.read.text(metadata).select("_metadata.file_path").first()
        if first is None:
            raise storage.PathNotFoundError(f"{metadata}: no metadata file in it")
        written = urllib.parse.unquote(first[0])  # Spark gives the file's URI, %-escaped
        return storage.parse(posixpath.dirname(posixpath.dirname(written))).uri
    sc = spark.sparkContext
    jvm_path = sc._jvm.org.apache.hadoop.fs.Path(path)
    fs = jvm_path.getFileSystem(sc._jsc.hadoopConfiguration())
    return storage.parse(str(fs.makeQualified(jvm_path).toString())).uri


def _summary_from_dict(data: dict, path: str) -> TrainResult | None:
    """The TrainResult saved as JSON (keys it no longer has are dropped); None, with a
    warning, when the saved one lacks a field TrainResult needs."""
    from sparktf.train import TrainResult

    names = {f.name for f in dataclasses.fields(TrainResult)}
    data = {_RENAMED_RESULT_KEYS.get(k, k): v for k, v in data.items()}  # saved before a rename
    try:
        return TrainResult(**{k: v for k, v in data.items() if k in names})
    except TypeError as exc:
        log.warning("%s: the saved summary is not a TrainResult (%s); loaded without it", path, exc)
        return None


class TFModel(_ColumnParams, Model, MLWritable, MLReadable):
    """A SavedModel as a Spark ML Model: ``transform(df)`` predicts with
    :func:`sparktf.predict` on ``inputCol`` and adds a Spark ML classifier's columns.

    Params (keyword arguments of the constructor; ``set...``/``get...`` methods):

    * ``exportDir`` (required): the SavedModel, a version directory, ``MODEL_DIR/export``
      or ``MODEL_DIR`` (the highest version), local or ``hdfs://``.
    * ``inputCol`` (``"features"``): what the model reads, as :func:`sparktf.predict`
      takes it (a Spark ML ``Vector``, an ``array`` of numbers or ``numpy.save`` bytes for
      a classifier on features; images for an image classifier). ``featuresCols``: the
      columns of a model of several named inputs instead, each named as its input.
    * ``predictionCol`` (``"prediction"``), ``probabilityCol`` (``"probability"``),
      ``rawPredictionCol`` (``"rawPrediction"``): the added columns, named as Spark ML's
      classifiers name them, so its evaluators read them with their defaults; an empty name
      leaves that column out. They are the columns :func:`sparktf.predict` adds.
    * ``idCol`` (``"id"``): names rows in errors; ``batchSize`` (128): rows per model
      call; ``signature`` (``""``: :func:`sparktf.predict`'s choice).

    ``transform(df)`` returns ``df``'s columns plus, for a classifier, ``predictionCol``
    (double, the class), ``probabilityCol`` (a dense ``Vector``, one probability per class)
    and ``rawPredictionCol`` (a dense ``Vector`` of the log-probabilities, ``log(p)``: the
    model's logits less their log-sum-exp, so its ``softmax`` is ``probabilityCol``, its
    argmax the prediction and its order within a row that of the logits; the exported
    signatures give probabilities, not logits). For another model :func:`sparktf.predict`
    serves, its output with a numeric ``predictionCol`` as a double. It is lazy; the model
    runs on the executors over Arrow batches and the Vectors are made by Spark SQL
    expressions, without a Python call per row. It raises
    :class:`sparktf.inference.PredictInputError` for a missing or unreadable input column or
    an added column that already exists, :class:`sparktf.inference.ModelNotFoundError` for
    a missing model, and :class:`sparktf.train.ConfigError` when ``exportDir`` is not set;
    bad rows fail the Spark action with the column, the row and the expected shape.

    ``summary`` is the :class:`sparktf.train.TrainResult` of the fit that made the model
    (``hasSummary`` says whether there is one); ``write().save(path)`` writes it with the
    Params as JSON and a copy of the SavedModel, and ``TFModel.load(path)`` restores both.
    """

    exportDir = _param(
        "exportDir",
        "the SavedModel (a version directory, MODEL_DIR/export or MODEL_DIR)",
        TypeConverters.toString,
    )
    batchSize = _param("batchSize", "rows per model call when predicting", TypeConverters.toInt)
    signature = _param(
        "signature", "SavedModel signature ('' : the default choice)", TypeConverters.toString
    )

    @keyword_only
    def __init__(
        self,
        *,
        exportDir: str | None = None,
        inputCol: str = "features",
        featuresCols: list[str] | None = None,
        predictionCol: str = "prediction",
        probabilityCol: str = "probability",
        rawPredictionCol: str = "rawPrediction",
        idCol: str = "id",
        batchSize: int = 128,
        signature: str = "",
    ) -> None:
        super().__init__()
        self._setDefault(batchSize=128, signature="")
        self._summary: TrainResult | None = None
        self._set_given()

    @property
    def hasSummary(self) -> bool:
        """Whether the model has the TrainResult of the fit that made it."""
        return self._summary is not None

    @property
    def summary(self) -> TrainResult:
        """The :class:`sparktf.train.TrainResult` of the fit that made this model.

        Raises:
            NoSummaryError: the model was not made by ``TFEstimator.fit`` (nor loaded from
                one that was).
        """
        if self._summary is None:
            raise NoSummaryError(
                f"{self.uid} has no training summary: it was not made by TFEstimator.fit"
            )
        return self._summary

    def setExportDir(self, value: str) -> TFModel:
        return self._set(exportDir=value)

    def getExportDir(self) -> str:
        """The SavedModel; raises :class:`sparktf.train.ConfigError` when it is not set."""
        if not self.isDefined(self.exportDir):
            from sparktf.train import ConfigError

            raise ConfigError("TFModel: exportDir is not set")
        return self.getOrDefault(self.exportDir)

    def _transform(self, dataset: DataFrame) -> DataFrame:
        from sparktf.inference import predict

        hidden = f"__sparktf_{self.uid}_"  # an output the caller left out (an empty name)
        prediction = self.getPredictionCol() or f"{hidden}prediction"
        probability = self.getProbabilityCol() or f"{hidden}probability"
        raw = self.getRawPredictionCol()
        out = predict(
            dataset,
            self.getExportDir(),
            input_col=None if self.getFeaturesCols() else self.getInputCol(),
            output_col=prediction,
            probability_col=probability,
            raw_prediction_col=raw,
            batch_size=self.getOrDefault(self.batchSize),
            signature=self.getOrDefault(self.signature) or None,
            id_col=self.getIdCol(),
        )
        if probability in dataset.columns or probability not in out.columns:
            out = _as_double(out, prediction)  # not a classifier
        else:
            out = _classifier_columns(out, prediction, probability, raw)
        return out.drop(*(c for c in (prediction, probability) if c.startswith(hidden)))

    def write(self) -> MLWriter:
        """A writer of the Params, the summary and a copy of the SavedModel."""
        return _TFModelWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        """A reader of what :meth:`write` saved."""
        return _TFModelReader(cls)


def _as_double(out: DataFrame, prediction: str) -> DataFrame:
    """``prediction`` as a double when it is a number."""
    from pyspark.sql import types as T

    if prediction in out.columns and isinstance(out.schema[prediction].dataType, T.NumericType):
        from pyspark.sql import functions as F

        return out.withColumn(prediction, F.col(prediction).cast("double"))
    return out


def _classifier_columns(out: DataFrame, prediction: str, probability: str, raw: str) -> DataFrame:
    """sparktf.predict's classes (long), probabilities and raw prediction (array<float>) as
    Spark ML's prediction (double), probability and rawPrediction (Vectors)."""
    from pyspark.ml.functions import array_to_vector
    from pyspark.sql import functions as F

    columns = {prediction: F.col(prediction).cast("double")}
    for vector in (probability, raw):
        if vector:
            columns[vector] = array_to_vector(F.col(vector))
    return out.withColumns(columns)
