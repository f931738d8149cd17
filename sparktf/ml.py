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
>>> fitted.transform(test_df)                  # + prediction, probability (sparktf.predict)
>>> fitted.save("hdfs://nn:8020/pipelines/mlp"); PipelineModel.load(...)

``TFEstimator.fit(df)`` writes the DataFrame's feature, label and id columns as a ``table``
dataset (Parquet with a manifest, :func:`sparktf.datasets.formats.table_manifest`) under
``modelDir/_fit_data-<random>``, trains on it with the ``spark`` input mode (its rows are fed
to the TensorFlow processes by Spark tasks), removes it, and returns a :class:`TFModel` of
the run's export. The model (``model`` Param) is a registry name, a name entered by
:func:`sparktf.models.register`, or ``"package.module:build"`` (see
:mod:`sparktf.models.custom`); ``modelConfig`` overrides its config. A custom model's input
shape, dtype and class count are read from the data unless ``modelConfig`` sets them.

The feature column (``inputCol``) may hold a Spark ML ``Vector`` (dense or sparse, e.g.
``VectorAssembler``'s output), an ``array<float|double|int>`` (nested arrays are flattened),
or ``numpy.save`` bytes (``binary``, the dataset format's ndarray column, e.g. images). Every
row must have the model's input size: a row that does not fails ``fit`` (or ``transform``)
with a :class:`ValueError` naming the column, the row (by ``idCol`` when the DataFrame has
it) and the expected shape. Labels (``labelCol``) are integers in ``[0, num_classes)``
(integral doubles, as ``StringIndexer`` gives, are accepted).

The Spark session must have exactly the executors the run needs (``numWorkers`` for
``allreduce``; chief + workers + parameter servers for ``ps``), see
:class:`sparktf.train.ScalingConfig`. A ``modelDir`` that already holds a checkpoint is
resumed (``steps`` count across runs): use a fresh one per fit.

Persistence: both stages are ``MLWritable``/``MLReadable`` and work inside ``Pipeline`` and
``PipelineModel`` ``save``/``load``. ``TFEstimator`` saves its Params; ``TFModel`` saves its
Params and a copy of the SavedModel (``PATH/savedmodel``), so a saved model does not depend
on the training run's model directory.
"""

# pyspark.ml names its Params, their getters and setters in mixedCase: so do these stages.
# ruff: noqa: N802, N803, N815

from __future__ import annotations

import json
import logging
import math
import posixpath
import uuid
from typing import Any

from pyspark import keyword_only
from pyspark.ml import Estimator, Model
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasLabelCol, HasPredictionCol, HasProbabilityCol
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
from sparktf.datasets import formats

log = logging.getLogger(__name__)

FEATURE = "features"  # the feature column of the written dataset (custom models)
SAVED_MODEL = "savedmodel"  # TFModel.save: the SavedModel's copy under the path


def _to_dict(value: Any) -> dict:
    """A JSON object (a dict, or its JSON text) -> dict; anything else is an error."""
    if isinstance(value, str):
        value = json.loads(value) if value.strip() else {}
    if not isinstance(value, dict):
        raise TypeError(f"expected a dict (or its JSON text), got {value!r}")
    return json.loads(json.dumps(value))  # JSON-able, as Spark ML saves it


def _param(name: str, doc: str, converter) -> Param:
    return Param(Params._dummy(), name, doc, typeConverter=converter)


class _ColumnParams(HasLabelCol, HasPredictionCol, HasProbabilityCol):
    inputCol = _param(
        "inputCol",
        "feature column: a Vector, array<number> or numpy.save bytes",
        TypeConverters.toString,
    )
    idCol = _param(
        "idCol", "column naming rows in errors (and the dataset's id)", TypeConverters.toString
    )

    def __init__(self) -> None:
        super().__init__()
        self._setDefault(inputCol="features", idCol="id")

    def _set_given(self):
        """Sets the Params a ``@keyword_only`` method was given (None: left as is)."""
        return self._set(**{k: v for k, v in self._input_kwargs.items() if v is not None})

    def getInputCol(self) -> str:
        return self.getOrDefault(self.inputCol)

    def getIdCol(self) -> str:
        return self.getOrDefault(self.idCol)

    def setInputCol(self, value: str):
        return self._set(inputCol=value)

    def setLabelCol(self, value: str):
        return self._set(labelCol=value)

    def setPredictionCol(self, value: str):
        return self._set(predictionCol=value)

    def setProbabilityCol(self, value: str):
        return self._set(probabilityCol=value)

    def setIdCol(self, value: str):
        return self._set(idCol=value)


class _TrainParams(_ColumnParams):
    model = _param(
        "model",
        "registry name, sparktf.models.register name, or 'package.module:build'",
        TypeConverters.toString,
    )
    modelConfig = _param("modelConfig", "model config overrides (a dict)", _to_dict)
    strategy = _param("strategy", "allreduce or ps", TypeConverters.toString)
    numWorkers = _param("numWorkers", "training processes (ps: workers)", TypeConverters.toInt)
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
        "more sparktf.train.RunConfig fields (a dict), e.g. failure_timeout_s",
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
    """Trains a sparktf model on a DataFrame's rows; ``fit`` returns a :class:`TFModel` (see
    the module docstring for the Params, the columns and persistence)."""

    @keyword_only
    def __init__(
        self,
        *,
        model: str | None = None,
        modelConfig: dict | None = None,
        strategy: str = "allreduce",
        numWorkers: int = 2,
        numPs: int = 1,
        psOnDriver: bool = False,
        threadsPerWorker: int = 0,
        epochs: float | None = None,
        steps: int | None = None,
        batchSize: int | None = None,
        seed: int = 0,
        modelDir: str | None = None,
        inputCol: str = "features",
        labelCol: str = "label",
        predictionCol: str = "prediction",
        probabilityCol: str = "probability",
        idCol: str = "id",
        runConfig: dict | None = None,
    ) -> None:
        super().__init__()
        self._set_given()

    @keyword_only
    def setParams(self, **kwargs: Any) -> TFEstimator:
        return self._set_given()

    def _fit(self, dataset) -> TFModel:
        from sparktf import models
        from sparktf.train import RunConfig, ScalingConfig, TrainConfig
        from sparktf.train.driver import fit

        if not self.isDefined(self.model):
            raise ValueError("TFEstimator: set model (a registry name or 'package.module:build')")
        if not self.isDefined(self.modelDir):
            raise ValueError("TFEstimator: set modelDir (where checkpoints and the export go)")
        name = self.getOrDefault(self.model)
        model_config = dict(self.getOrDefault(self.modelConfig))
        task = models.get_task(name, **model_config)
        custom = isinstance(task, models.CustomClassifierTask)
        if custom and model_config.get("feature") is None:
            model_config["feature"] = FEATURE
            task = models.get_task(name, **model_config)
        scaling = ScalingConfig(
            strategy=self.getOrDefault(self.strategy),
            num_workers=self.getOrDefault(self.numWorkers),
            num_ps=self.getOrDefault(self.numPs),
            ps_on_driver=self.getOrDefault(self.psOnDriver),
            threads_per_worker=self.getOrDefault(self.threadsPerWorker),
        )
        model_dir = storage.parse(self.getOrDefault(self.modelDir)).uri
        run = RunConfig(model_dir=model_dir, **self.getOrDefault(self.runConfig))
        data_dir = storage.join(model_dir, f"_fit_data-{uuid.uuid4().hex[:12]}")
        try:
            written = write_table(
                dataset,
                data_dir,
                input_col=self.getInputCol(),
                label_col=self.getLabelCol(),
                id_col=self.getIdCol(),
                feature=task.features[0],
                shape=_model_shape(task, model_config),
                dtype=_model_dtype(task, model_config),
                num_classes=model_config.get("num_classes") or _num_classes(task),
            )
            if custom and model_config.get("num_classes") is None:
                model_config["num_classes"] = written["num_classes"]
            train = TrainConfig(
                model=name,
                data=data_dir,
                model_config=model_config,
                input_mode="spark",
                epochs=self._maybe(self.epochs),
                steps=self._maybe(self.steps),
                batch_size=self._maybe(self.batchSize),
                seed=self.getOrDefault(self.seed),
                eval_split="none",
            )
            result = fit(train, scaling, run, spark=dataset.sparkSession)
        finally:
            try:
                storage.delete(data_dir)
            except Exception as exc:  # the run's error matters more
                log.warning("could not remove %s: %s", data_dir, exc)
        if not result.export_path:
            raise RuntimeError(f"training {name} wrote no export (RunConfig.export is off?)")
        out = TFModel(
            exportDir=result.export_path,
            inputCol=self.getInputCol(),
            predictionCol=self.getPredictionCol(),
            probabilityCol=self.getProbabilityCol(),
            idCol=self.getIdCol(),
        )
        out.trainResult = result.to_dict()
        return out


def _model_shape(task, model_config: dict) -> tuple[int, ...] | None:
    """The per-row input shape the model fixes (None: a custom model takes the data's)."""
    from sparktf import models

    if isinstance(task, models.CustomClassifierTask):
        shape = model_config.get("input_shape")
        return None if shape is None else tuple(int(d) for d in shape)
    shape = getattr(task, "input_shape", None)
    return None if shape is None else tuple(int(d) for d in shape)


def _model_dtype(task, model_config: dict) -> str | None:
    """The dtype the model reads (None: a custom model's float32 unless the data says)."""
    from sparktf import models

    if isinstance(task, models.CustomClassifierTask):
        return model_config.get("input_dtype")
    return "uint8" if task.kind == "classifier" else None


def _num_classes(task) -> int | None:
    try:
        return int(task.num_classes)
    except (AttributeError, ValueError, KeyError):
        return None


# ----------------------------------------------------------------------------- the dataset


def write_table(
    df,
    data_dir: str,
    *,
    input_col: str,
    label_col: str,
    id_col: str,
    feature: str = FEATURE,
    shape: tuple[int, ...] | None = None,
    dtype: str | None = None,
    num_classes: int | None = None,
) -> dict:
    """Writes ``df``'s feature, label and id columns as a ``table`` dataset (one ``train``
    split) in ``data_dir``; returns ``{"rows", "shape", "dtype", "num_classes"}``.

    The feature column becomes ``feature`` (``numpy.save`` bytes of ``shape``; vectors and
    arrays as ``dtype``, float32 by default; uint8 values must be integers in [0, 255]), the
    label ``label`` (int64), the id ``id`` (``id_col`` when ``df`` has it, else generated).
    ValueError naming the column and the row for a null, a row of another size than
    ``shape`` (or than the first row's, without ``shape``) or a label outside
    ``[0, num_classes)`` (``num_classes``: the largest label + 1 when not given).
    """
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    schema = df.schema
    for col, what in ((input_col, "feature"), (label_col, "label")):
        if col not in schema.names:
            raise ValueError(
                f"the DataFrame has no {what} column {col!r} (it has {schema.names}); "
                f"set {'inputCol' if what == 'feature' else 'labelCol'}"
            )
    has_id = id_col in schema.names and isinstance(
        schema[id_col].dataType, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)
    )
    ids = F.col(id_col).cast("long") if has_id else F.monotonically_increasing_id()
    label_type = schema[label_col].dataType
    if not isinstance(label_type, T.NumericType):
        raise ValueError(
            f"label column {label_col!r} has Spark type {label_type.simpleString()}: expected "
            "integer class labels (index strings with StringIndexer first)"
        )
    rows = df.select(F.col(input_col).alias("x"), F.col(label_col).alias("y"), ids.alias("id"))

    def where(row) -> str:
        return f"the row with {id_col}={row['id']}" if has_id else f"a row (label {row['y']})"

    _check_nulls(rows, input_col, label_col, where)
    bad = rows.where(F.col("y") != F.floor(F.col("y"))).first()
    if bad is not None:
        raise ValueError(
            f"label column {label_col!r}: {where(bad)} has label {bad['y']}; expected integers"
        )
    rows = rows.withColumn("y", F.col("y").cast("long"))
    low, high = rows.agg(F.min("y"), F.max("y")).first()
    if high is None:
        raise ValueError("the DataFrame is empty: nothing to train on")
    classes = int(num_classes) if num_classes else max(2, int(high) + 1)
    if low < 0 or high >= classes:
        bad = rows.where((F.col("y") < 0) | (F.col("y") >= classes)).first()
        raise ValueError(
            f"label column {label_col!r}: {where(bad)} has label {bad['y']}; expected a class "
            f"in [0, {classes})"
        )

    ftype = schema[input_col].dataType
    from sparktf.inference import _is_vector

    if isinstance(ftype, T.BinaryType):
        dtype, row_shape = _binary_layout(rows, input_col)
        if shape is not None and math.prod(shape) != math.prod(row_shape):
            raise ValueError(
                f"column {input_col!r} holds numpy.save bytes of {dtype} {row_shape}; the model "
                f"expects shape {shape}"
            )
        out_shape = shape or row_shape
        encoded = rows.select(F.col("x").alias(feature), F.col("y").alias("label"), "id")
        encoder = _binary_encoder(feature, input_col, dtype, row_shape, out_shape)
    else:
        if _is_vector(ftype):
            from pyspark.ml.functions import vector_to_array

            rows = rows.withColumn("x", vector_to_array(F.col("x"), "float32"))
        elif isinstance(ftype, T.ArrayType):
            element = ftype
            while isinstance(element, T.ArrayType):
                element = element.elementType
            if not isinstance(element, T.NumericType):
                raise ValueError(
                    f"column {input_col!r} has Spark type {ftype.simpleString()}: expected a "
                    "Vector, an array of numbers or numpy.save bytes"
                )
            x = F.col("x")
            depth = ftype
            while isinstance(depth.elementType, T.ArrayType):
                x, depth = F.flatten(x), depth.elementType
            rows = rows.withColumn("x", x.cast("array<float>"))
        else:
            raise ValueError(
                f"column {input_col!r} has Spark type {ftype.simpleString()}: expected a Vector "
                "(VectorAssembler), an array of numbers or numpy.save bytes"
            )
        dtype = dtype or "float32"
        if shape is None:
            first = rows.select(F.size("x").alias("n")).first()
            if first is None:
                raise ValueError("the DataFrame is empty: nothing to train on")
            shape = (int(first["n"]),)
        size = math.prod(shape)
        bad = rows.where(F.size("x") != size).select("id", "y", F.size("x").alias("n")).first()
        if bad is not None:
            raise ValueError(
                f"column {input_col!r}: {where(bad)} has {bad['n']} values; expected shape "
                f"{tuple(shape)} ({size} values) for the model"
            )
        out_shape = tuple(shape)
        encoded = rows.select(F.col("x").alias(feature), F.col("y").alias("label"), "id")
        encoder = _list_encoder(feature, input_col, out_shape, dtype)

    out_schema = f"`{feature}` binary, label bigint, id bigint"
    table = encoded.mapInArrow(encoder, out_schema)
    parquet = storage.join(data_dir, "train", "parquet")
    table.write.parquet(storage.spark_uri(parquet))
    spark = df.sparkSession
    counts = {
        posixpath.basename(r["f"]): int(r["n"])
        for r in spark.read.parquet(storage.spark_uri(parquet))
        .groupBy(F.input_file_name().alias("f"))
        .agg(F.count("*").alias("n"))
        .collect()
    }
    files = sorted(
        posixpath.basename(storage.parse(p).path)
        for p in storage.listdir(parquet)
        if p.endswith(".parquet")
    )
    records = [counts.get(name, 0) for name in files]
    total = sum(records)
    if total == 0:
        raise ValueError("the DataFrame is empty: nothing to train on")
    fields = [
        formats.Field(feature, dtype, tuple(out_shape)),
        formats.Field("label", "int64"),
        formats.Field("id", "int64"),
    ]
    manifest = formats.table_manifest(
        "dataframe",
        fields,
        {
            "train": {
                "records": total,
                "files": [f"train/parquet/{name}" for name in files],
                "file_records": records,
            }
        },
        num_classes=classes,
    )
    storage.write_text(formats.manifest_path(data_dir), json.dumps(manifest, indent=1))
    log.info(
        "wrote %d rows (%s %s features, %d classes) to %s",
        total,
        dtype,
        tuple(out_shape),
        classes,
        data_dir,
    )
    return {"rows": total, "shape": tuple(out_shape), "dtype": dtype, "num_classes": classes}


def _check_nulls(rows, input_col: str, label_col: str, where) -> None:
    from pyspark.sql import functions as F

    bad = rows.where(F.col("x").isNull() | F.col("y").isNull()).first()
    if bad is not None:
        col = input_col if bad["x"] is None else label_col
        raise ValueError(f"column {col!r}: {where(bad)} is null")


def _binary_layout(rows, input_col: str) -> tuple[str, tuple[int, ...]]:
    first = rows.select("x").first()
    if first is None:
        raise ValueError("the DataFrame is empty: nothing to train on")
    try:
        head = formats.read_npy_header(bytes(first["x"]))
    except ValueError as exc:
        raise ValueError(
            f"column {input_col!r}: the first row is not numpy.save bytes: {exc}"
        ) from None
    return str(head.dtype), tuple(head.shape)


def _list_encoder(feature: str, input_col: str, shape: tuple[int, ...], dtype: str):
    def encode(batches):
        import numpy as np
        import pyarrow as pa

        for batch in batches:
            values = batch.column(0).flatten().to_numpy(zero_copy_only=False)
            x = np.asarray(values, dtype=np.float32).reshape(batch.num_rows, *shape)
            if dtype == "uint8":  # images given as numbers: integers in [0, 255]
                flat = x.reshape(len(x), -1)
                bad = ((flat < 0) | (flat > 255) | (flat != np.floor(flat))).any(axis=1)
                if bad.any():
                    i = int(np.flatnonzero(bad)[0])
                    raise ValueError(
                        f"column {input_col!r}: the row with id={batch.column(2)[i].as_py()} "
                        "has values that are not integers in [0, 255]; the model reads uint8 "
                        "images"
                    )
            x = x.astype(dtype, copy=False)
            yield pa.RecordBatch.from_arrays(
                [formats.encode_ndarray_column(x), batch.column(1), batch.column(2)],
                names=[feature, "label", "id"],
            )

    return encode


def _binary_encoder(feature: str, input_col: str, dtype: str, shape, out_shape):
    def encode(batches):
        import pyarrow as pa

        for batch in batches:
            try:
                x = formats.decode_ndarray_column(batch.column(0), dtype, shape, name=input_col)
            except formats.NdarrayColumnError as exc:
                raise ValueError(f"{exc} (rows counted within one Arrow batch)") from None
            yield pa.RecordBatch.from_arrays(
                [
                    formats.encode_ndarray_column(x.reshape(len(x), *out_shape)),
                    batch.column(1),
                    batch.column(2),
                ],
                names=[feature, "label", "id"],
            )

    return encode


# ----------------------------------------------------------------------------- TFModel


class _TFModelWriter(MLWriter):
    """Params (Spark ML metadata) plus a copy of the SavedModel in ``PATH/savedmodel``."""

    def __init__(self, instance: TFModel) -> None:
        super().__init__()
        self.instance = instance

    def saveImpl(self, path: str) -> None:
        DefaultParamsWriter.saveMetadata(
            self.instance, path, self.sc, extraMetadata={"savedModel": SAVED_MODEL}
        )
        from sparktf.inference import resolve_model

        source = resolve_model(self.instance.getExportDir())
        target = storage.join(storage.parse(path).uri, SAVED_MODEL)
        storage.copy_tree(source, target)
        log.info("TFModel saved to %s (SavedModel copied from %s)", path, source)


class _TFModelReader(MLReader):
    def __init__(self, cls: type) -> None:
        super().__init__()
        self.cls = cls

    def load(self, path: str) -> TFModel:
        metadata = DefaultParamsReader.loadMetadata(path, self.sc)
        model = self.cls()
        DefaultParamsReader.getAndSetParams(model, metadata)
        model._resetUid(metadata["uid"])
        saved = metadata.get("savedModel", SAVED_MODEL)
        model._set(exportDir=storage.join(storage.parse(path).uri, saved))
        return model


class TFModel(_ColumnParams, Model, MLWritable, MLReadable):
    """A SavedModel as a Spark ML Model: ``transform(df)`` is :func:`sparktf.predict` on
    ``inputCol``, adding ``predictionCol`` (long, the class) and ``probabilityCol``
    (array<float>, one probability per class)."""

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
        predictionCol: str = "prediction",
        probabilityCol: str = "probability",
        idCol: str = "id",
        batchSize: int = 128,
        signature: str = "",
    ) -> None:
        super().__init__()
        self._setDefault(batchSize=128, signature="")
        self.trainResult: dict | None = None  # TFEstimator.fit: the run's TrainResult
        self._set_given()

    def setExportDir(self, value: str) -> TFModel:
        return self._set(exportDir=value)

    def getExportDir(self) -> str:
        if not self.isDefined(self.exportDir):
            raise ValueError("TFModel: exportDir is not set")
        return self.getOrDefault(self.exportDir)

    def _transform(self, dataset):
        from sparktf.inference import predict

        return predict(
            dataset,
            self.getExportDir(),
            input_col=self.getInputCol(),
            output_col=self.getPredictionCol(),
            probabilities_col=self.getProbabilityCol(),
            batch_size=self.getOrDefault(self.batchSize),
            signature=self.getOrDefault(self.signature) or None,
        )

    def write(self) -> MLWriter:
        return _TFModelWriter(self)

    @classmethod
    def read(cls) -> MLReader:
        return _TFModelReader(cls)
