"""A user's model of several named inputs: one per column, as a dict (``inputs=``).

:class:`NamedInputs` is the part of :class:`sparktf.models.custom.CustomTask` that reads the
config key ``inputs``: a list of column names (their dtypes and shapes then come from the
data a run is planned on) or ``{name: {"dtype", "shape"}}``. An input is ``float32`` (a
number, or a fixed-shape array), ``int64`` or ``string`` (e.g. for a ``StringLookup`` layer
inside the model). The build function gets ``{name: keras.Input}`` and returns a model of
that dict; batches are dicts by name; the export's ``serving_default`` takes each input by
its name, which :func:`sparktf.predict` feeds from the column of that name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf

from sparktf.errors import SparktfValueError
from sparktf.models.task import Batch

__all__ = ["NAMED_INPUT_DTYPES", "NamedInputs", "check_inputs", "inputs_from_dataset"]

NAMED_INPUT_DTYPES = ("float32", "int64", "string")


class NamedInputs:
    """The named inputs of a task whose config has ``inputs`` (None: one input)."""

    @property
    def input_names(self) -> tuple[str, ...] | None:
        """The names of a model's several inputs (``inputs``), else None (one input)."""
        inputs = self.config["inputs"]
        return None if inputs is None else tuple(inputs)

    @property
    def input_specs(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """Each named input's dtype and per-row shape (read from the data when not given)."""
        inputs = self.config["inputs"]
        if not isinstance(inputs, Mapping):
            raise SparktfValueError(
                f"model {self.name!r}: the dtype and shape of its inputs {list(inputs or ())} "
                "are not known: give inputs as {name: {'dtype', 'shape'}} or train on data "
                "(they are read from there)"
            )
        return {k: (v["dtype"], tuple(int(d) for d in v["shape"])) for k, v in inputs.items()}

    @property
    def features(self) -> tuple[str, ...]:
        return (*(self.input_names or (self.feature,)), "label")

    def model_inputs(self, batch: Batch) -> Any:
        if self.input_names is None:
            return batch[self.feature]
        return {name: batch[name] for name in self.input_names}

    def named_endpoints(self, model: keras.Model) -> dict[str, Any]:
        """``serving_default``: each input by its name -> the kind's predictions."""
        names = list(self.input_specs)

        def predict_inputs(*values: tf.Tensor) -> dict[str, tf.Tensor]:
            return self.predictions(model, dict(zip(names, values)))

        specs = [
            tf.TensorSpec([None, *shape], tf.as_dtype(dtype), name=name)
            for name, (dtype, shape) in self.input_specs.items()
        ]
        return {"serving_default": (predict_inputs, specs)}

    def named_info(self) -> dict[str, str]:
        """Each input of ``serving_default``: its dtype and shape, as signature_info shows."""
        return {
            name: f"{dtype}[B{''.join(f',{d}' for d in shape)}]"
            for name, (dtype, shape) in self.input_specs.items()
        }


def inputs_from_dataset(task: Any, fields: Sequence[Any], where: str) -> dict[str, Any]:
    """``{"inputs": {name: {"dtype", "shape"}}}`` read from a dataset's columns (held to
    the config's when it gives them); ``{}`` when a column is missing (the run's plan names
    it). A ValueError for a dtype a named input cannot have."""
    by_name = {f.name: f for f in fields}
    given = task.config["inputs"] if isinstance(task.config["inputs"], Mapping) else {}
    inputs = {}
    for name in task.input_names:
        column = by_name.get(name)
        if column is None:
            return {}  # describe_data names the missing column
        spec = {"dtype": str(column.dtype), "shape": list(column.shape or ())}
        if spec["dtype"] not in NAMED_INPUT_DTYPES:
            raise SparktfValueError(
                f"model {task.name!r}: column {name!r} of {where} holds {spec['dtype']}; "
                f"named inputs read {NAMED_INPUT_DTYPES}"
            )
        if name in given and dict(given[name]) != spec:
            raise SparktfValueError(
                f"model {task.name!r} expects input {name!r} of {given[name]} but {where} "
                f"holds {spec}"
            )
        inputs[name] = spec
    return {"inputs": inputs}


def check_inputs(inputs: Any) -> None:
    """``inputs``: None, a list of column names, or ``{name: {"dtype", "shape"}}``."""
    if inputs is None:
        return
    names = list(inputs)
    if not names or not all(isinstance(n, str) and n and n != "label" for n in names):
        raise SparktfValueError(
            f"inputs must name one column or more (not 'label'), got {inputs!r}"
        )
    if len(set(names)) != len(names):
        raise SparktfValueError(f"inputs names a column twice: {names}")
    if isinstance(inputs, Mapping):
        for name, spec in inputs.items():
            if (
                not isinstance(spec, Mapping)
                or spec.get("dtype") not in NAMED_INPUT_DTYPES
                or not isinstance(spec.get("shape"), list)
                or not all(isinstance(d, int) and d > 0 for d in spec["shape"])
            ):
                raise SparktfValueError(
                    f"inputs[{name!r}] must be {{'dtype': one of {NAMED_INPUT_DTYPES}, "
                    f"'shape': [positive integers]}}, got {spec!r}"
                )
