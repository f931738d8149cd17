"""The export (a SavedModel written by a run's ``export``) as the driver sees it, without
loading it.

:func:`resolve_export` finds the version directory a path names, :func:`export_fingerprint`
hashes it (the executors verify their local copies against it) and :func:`inspect_export`
reads the signatures from ``saved_model.pb`` alone (the variables are not read):
:class:`ExportInfo`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import posixpath
from collections.abc import Mapping
from typing import Any

from sparktf import storage

__all__ = [
    "ExportInfo",
    "ModelNotFoundError",
    "Signature",
    "TensorSpec",
    "export_fingerprint",
    "inspect_export",
    "resolve_export",
]

# TensorFlow DataType enum values (tensorflow/core/framework/types.proto) -> numpy names.
_TF_DTYPES = {
    1: "float32",
    2: "float64",
    3: "int32",
    4: "uint8",
    5: "int16",
    6: "int8",
    7: "string",
    9: "int64",
    10: "bool",
    17: "uint16",
    19: "float16",
    22: "uint32",
    23: "uint64",
}


class ModelNotFoundError(storage.PathNotFoundError):
    """No SavedModel at the given model path."""


@dataclasses.dataclass(frozen=True)
class TensorSpec:
    """One input or output of a signature: numpy dtype name ("string" for tf.string) and
    shape (``None`` for an unknown dimension; the first is the batch)."""

    name: str
    dtype: str
    shape: tuple[int | None, ...] | None

    def describe(self) -> str:
        """``dtype[B,d1,...]``: ``B`` for an unknown batch dimension, ``?`` for another."""
        if self.shape is None:
            return f"{self.dtype}[?]"
        dims = [
            "B" if i == 0 and d is None else ("?" if d is None else str(d))
            for i, d in enumerate(self.shape)
        ]
        return f"{self.dtype}[{','.join(dims)}]"


@dataclasses.dataclass(frozen=True)
class Signature:
    """One signature of a SavedModel: its inputs and outputs by name."""

    name: str
    inputs: Mapping[str, TensorSpec]
    outputs: Mapping[str, TensorSpec]

    def describe(self) -> str:
        """``name(input: spec, ...) -> (output: spec, ...)``, for messages."""
        ins = ", ".join(f"{k}: {v.describe()}" for k, v in sorted(self.inputs.items()))
        outs = ", ".join(f"{k}: {v.describe()}" for k, v in sorted(self.outputs.items()))
        return f"{self.name}({ins}) -> ({outs})"


@dataclasses.dataclass(frozen=True)
class ExportInfo:
    """What the driver knows about an export (a SavedModel) without loading it.

    ``uri``: the version directory; ``version``: its name when numeric, else ``None``;
    ``fingerprint``: :func:`export_fingerprint` of the directory, which names the executors'
    local copies and verifies them.
    """

    uri: str
    version: int | None
    fingerprint: str
    signatures: Mapping[str, Signature]


def resolve_export(export: str | os.PathLike) -> str:
    """The SavedModel directory that ``export`` names.

    ``export`` is a local path, ``file://``, ``hdfs://`` or ``s3://`` URI of a version
    directory (holding ``saved_model.pb``), of ``MODEL_DIR/export`` (the highest numbered
    version is used) or of ``MODEL_DIR`` itself (then ``MODEL_DIR/export``).

    Raises :class:`ModelNotFoundError` naming the path when there is none, and
    :class:`~sparktf.storage.NotCommittedError` for an S3 version directory whose publish did
    not finish.
    """
    path = os.fspath(export)
    if not storage.exists(path):
        raise ModelNotFoundError(f"model {path} does not exist")
    if storage.exists(storage.join(path, "saved_model.pb")):
        storage.require_committed(path)
        return path
    versions = []
    if storage.isdir(path):
        for entry in storage.listdir(path):
            name = posixpath.basename(storage.parse(entry).path)
            if name.isdigit():
                versions.append((int(name), entry))
    for _, entry in sorted(versions, reverse=True):
        # The newest version first: on S3 one whose publish died is refused, naming its
        # marker, whatever of it was copied (saved_model.pb or not) before it died.
        storage.require_committed(entry)
        if storage.exists(storage.join(entry, "saved_model.pb")):
            return entry
    exports = storage.join(path, "export")
    if storage.isdir(exports):
        return resolve_export(exports)
    raise ModelNotFoundError(
        f"model {path} holds no SavedModel: expected saved_model.pb in it, or numbered version "
        "directories holding one (MODEL_DIR/export/<version>/), or MODEL_DIR/export"
    )


def export_fingerprint(uri: str, *, graph: bytes | None = None) -> str:
    """SHA-256 over a SavedModel directory (local or ``hdfs://``): the bytes of
    ``saved_model.pb`` and ``variables/variables.index`` (the index holds the offset, size
    and CRC32C of every variable, which TensorFlow checks when it reads one) and the
    relative path and size of every file. The driver computes it from the source; an
    executor recomputes it on its local copy and trusts the copy only when both agree.
    ``graph``: the bytes of ``saved_model.pb`` when the caller has read them already."""
    root = storage.parse(uri).path.rstrip("/")
    digest = hashlib.sha256()
    if graph is None:
        graph = storage.read_bytes(storage.join(uri, "saved_model.pb"))
    digest.update(b"saved_model.pb\0%d\0" % len(graph) + graph)
    index = storage.join(uri, "variables", "variables.index")
    if storage.exists(index):
        data = storage.read_bytes(index)
        digest.update(b"variables.index\0%d\0" % len(data) + data)
    for path in storage.walk_files(uri):
        rel = posixpath.relpath(storage.parse(path).path, root)
        digest.update(f"file\0{rel}\0{storage.size(path)}\0".encode())
    return digest.hexdigest()


def inspect_export(export: str | os.PathLike) -> ExportInfo:
    """Resolves ``export`` (:func:`resolve_export`) and reads its signatures from
    ``saved_model.pb`` (no variables). Raises :class:`ModelNotFoundError` when there is no
    SavedModel or its ``saved_model.pb`` is not one."""
    uri = resolve_export(export)  # before importing TensorFlow: a missing one fails fast
    from tensorflow.core.protobuf import saved_model_pb2  # imports TensorFlow (driver only)

    graph = storage.read_bytes(storage.join(uri, "saved_model.pb"))
    fingerprint = export_fingerprint(uri, graph=graph)
    proto = saved_model_pb2.SavedModel()
    try:
        proto.ParseFromString(graph)
    except Exception as exc:  # protobuf's DecodeError
        raise ModelNotFoundError(f"{uri}/saved_model.pb is not a SavedModel: {exc}") from exc
    if not proto.meta_graphs:
        raise ModelNotFoundError(f"{uri}/saved_model.pb holds no meta graph")

    def spec(key: str, info: Any) -> TensorSpec:
        shape = (
            None
            if info.tensor_shape.unknown_rank
            else tuple(None if d.size < 0 else int(d.size) for d in info.tensor_shape.dim)
        )
        return TensorSpec(key, _TF_DTYPES.get(info.dtype, f"dtype{info.dtype}"), shape)

    signatures = {
        name: Signature(
            name,
            {k: spec(k, v) for k, v in sig.inputs.items()},
            {k: spec(k, v) for k, v in sig.outputs.items()},
        )
        for name, sig in proto.meta_graphs[0].signature_def.items()
        if not name.startswith("__")
    }
    name = posixpath.basename(storage.parse(uri).path)
    return ExportInfo(
        uri=uri,
        version=int(name) if name.isdigit() else None,
        fingerprint=fingerprint,
        signatures=signatures,
    )
