"""SavedModel export with named signatures (what ``ModelTask.export`` writes)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras
import tensorflow as tf

__all__ = ["Endpoint", "write_saved_model"]

logger = logging.getLogger(__name__)

# A serving function and the input signature it is traced with.
Endpoint = tuple[Callable[..., Mapping[str, tf.Tensor]], Sequence[tf.TensorSpec]]


def write_saved_model(
    model: keras.Model, export_dir: str, endpoints: Mapping[str, Endpoint]
) -> str:
    """Writes ``tf.saved_model.save`` output with one signature per endpoint.

    The SavedModel root holds the model's variables, its layers' lookup tables (e.g.
    ``StringLookup``'s) and the endpoint functions only (not the Keras object graph), so it
    loads with plain ``tf.saved_model.load`` / TF Serving.
    """
    root = tf.Module()
    root.model_variables = list(model.variables)
    root.model_resources = _resources(model)
    signatures = {}
    for name, (fn, input_signature) in endpoints.items():
        function = tf.function(fn, input_signature=list(input_signature), autograph=False)
        setattr(root, name, function)
        signatures[name] = function.get_concrete_function()
    tf.saved_model.save(root, export_dir, signatures=signatures)
    logger.info("exported %s to %s with signatures %s", model.name, export_dir, list(signatures))
    return export_dir


def _resources(model: keras.Model) -> list[Any]:
    """The TensorFlow resources (lookup tables) held by the model's layers, at any depth."""
    found: list[Any] = []
    seen: set[int] = set()
    stack = list(model.layers)
    while stack:
        layer = stack.pop()
        if id(layer) in seen:
            continue
        seen.add(id(layer))
        stack.extend(getattr(layer, "layers", None) or ())
        for value in vars(layer).values():
            if isinstance(value, tf.saved_model.experimental.TrackableResource):
                found.append(value)
    return found
