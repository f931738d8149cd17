"""A user's model's config read from the data it is trained on: the input column, its dtype
and shape, the classes or the label's shape (:func:`config_from_dataset`), for the entries
its registration leaves ``None``."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from sparktf.errors import SparktfValueError
from sparktf.models.named import inputs_from_dataset

__all__ = ["INPUT_DTYPES", "config_from_dataset"]

INPUT_DTYPES = ("float32", "uint8")  # what a model of one input reads


def config_from_dataset(
    task: Any, fields: Sequence[Any], manifest: Mapping[str, Any]
) -> dict[str, Any]:
    """The config entries ``task`` leaves ``None`` (input column, shape, dtype, classes, label
    shape), read from a dataset's columns (``formats.Field``) and manifest.

    Raises ``ValueError`` when the dataset cannot feed the model: several ndarray columns and
    no ``feature``, a dtype custom models do not read, or a dtype or shape other than the
    config's.
    """
    c = task.config
    where = f"dataset {manifest.get('dataset', '?')}"
    if task.input_names is not None:
        return {
            **inputs_from_dataset(task, fields, where),
            **_label_config(task, fields, manifest, where),
        }
    arrays = [f for f in fields if f.shape is not None and f.name != "label"]
    if c["feature"] is not None:
        column = next((f for f in fields if f.name == c["feature"]), None)
    elif c["input_dtype"] is not None and any(f.name == task.feature for f in arrays):
        column = next(f for f in arrays if f.name == task.feature)
    elif len(arrays) == 1:
        column = arrays[0]
    else:
        raise SparktfValueError(
            f"model {task.name!r}: {where} has ndarray columns "
            f"{[f.name for f in arrays]}: set feature= to the one it reads"
        )
    if column is None or column.shape is None:
        return {}  # describe_data names the missing column
    out: dict[str, Any] = {}
    if c["feature"] is None:
        out["feature"] = column.name
    dtype = str(np.dtype(column.dtype))
    if c["input_dtype"] is None:
        if dtype not in INPUT_DTYPES:
            raise SparktfValueError(
                f"model {task.name!r}: column {column.name!r} of {where} holds {dtype}; "
                f"custom models read {INPUT_DTYPES}"
            )
        out["input_dtype"] = dtype
    elif c["input_dtype"] != dtype:
        raise SparktfValueError(
            f"model {task.name!r} reads {c['input_dtype']} but column {column.name!r} of "
            f"{where} holds {dtype}"
        )
    shape = list(column.shape)
    if c["input_shape"] is None:
        out["input_shape"] = shape
    elif list(c["input_shape"]) != shape and math.prod(c["input_shape"]) != math.prod(shape):
        raise SparktfValueError(
            f"model {task.name!r} expects input_shape {tuple(c['input_shape'])} but column "
            f"{column.name!r} of {where} holds {dtype} of shape {tuple(shape)}"
        )
    out.update(_label_config(task, fields, manifest, where))
    return out


def _label_config(
    task: Any, fields: Sequence[Any], manifest: Mapping[str, Any], where: str
) -> dict[str, Any]:
    """``num_classes`` (a classifier's, from the manifest; a multi-label model's, the label
    vector's size) or ``label_shape`` (regression, custom), when the config leaves them
    ``None``."""
    c, kind = task.config, task.kind
    label = next((f for f in fields if f.name == "label"), None)
    shape = list(label.shape or ()) if label is not None else None
    if kind == "classifier" and c["num_classes"] is None:
        schema = (manifest.get("schema") or {}).get("label") or {}
        return {"num_classes": int(schema["num_classes"])} if schema.get("num_classes") else {}
    if kind == "multilabel" and shape is not None:
        if len(shape) != 1:
            raise SparktfValueError(
                f"model {task.name!r} (multilabel) reads a vector of 0/1 labels, but the label "
                f"column of {where} has shape {tuple(shape)}"
            )
        if c["num_classes"] is None:
            return {"num_classes": int(shape[0])}
        if int(c["num_classes"]) != shape[0]:
            raise SparktfValueError(
                f"model {task.name!r} has num_classes={c['num_classes']} labels but the label "
                f"column of {where} holds {shape[0]}"
            )
    if kind in ("regression", "custom") and shape is not None:
        if c["label_shape"] is None:
            return {"label_shape": shape}
        if list(c["label_shape"]) != shape:
            raise SparktfValueError(
                f"model {task.name!r} expects label_shape {tuple(c['label_shape'])} but the "
                f"label column of {where} has shape {tuple(shape)}"
            )
    return {}
