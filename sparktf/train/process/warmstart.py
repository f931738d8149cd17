"""Fine-tuning: start a model from another run's weights, and train only some of its layers.

* :func:`resolve_source` -- what ``--warm-start-from`` names, without TensorFlow: a
  checkpoint prefix (``.../checkpoints/ckpt-N``), a checkpoints directory (its ``checkpoint``
  state file names the latest), a model directory (its latest checkpoint, else its latest
  export), a SavedModel (``export/<step>``) or a directory of exports (``MODEL_DIR/export``:
  the highest step). Local or ``hdfs://`` (fetched through :mod:`sparktf.storage`).
* :func:`warm_start` -- loads those weights into a built Keras model, variable by variable,
  skipping the ``exclude_scopes`` (e.g. the classifier head when the number of classes
  changes: those keep their fresh initialisation). Returns and logs how many variables were
  restored, excluded and missing. Its steps: :func:`saved_variables` (what the source
  holds), :func:`match_variables` (which saved variable each model variable takes, as a
  :class:`Matching` that refuses a source that does not fit), then the assignment.
* :func:`apply_trainable_scopes` -- freezes everything outside ``trainable_scopes`` and
  returns the variables left to train.

How variables are matched. Both sources are TensorFlow checkpoints with an object graph:
a sparktf checkpoint (``tf.train.Checkpoint(model=..., optimizer=..., ...)``) and a SavedModel's
``variables/variables`` (the export's ``model_variables`` list). Every saved variable records
its TensorFlow name, which for the functional models of the registry is its Keras path
(``w.path``: ``logits/kernel``, ``unit_1_0_conv1/kernel``). A variable of the model is matched
to the saved variable with the same TensorFlow name; where several share a name (the LSTM
cells of ``ptb_*`` are all ``<model>/kernel``), the n-th of the model's variables of that name
takes the n-th saved one, in the source model's variable order (the export's list order, or
the order of a checkpoint's optimizer variable list). Only the source *model's* variables
take part: optimizer slots, step counters and other objects of the checkpoint are ignored.
Random-generator states (``seed_generator*``) are neither restored nor counted.

Scopes are prefixes of the Keras path (``w.path``), also tried with the model's own name
stripped (``ptb_small/softmax/kernel`` is in scope ``softmax``); like TF-slim's they are plain
string prefixes (``logits`` also covers ``logits_2/...``; write ``logits/`` to be exact).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import posixpath
import re
import tempfile
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from sparktf import storage
from sparktf.errors import SparktfError, SparktfRuntimeError
from sparktf.train.artifacts import CHECKPOINTS, EXPORT, STATE_FILE, latest_checkpoint

__all__ = [
    "OBJECT_GRAPH_KEY",
    "SAVED_MODEL_FILE",
    "Matching",
    "SavedVariable",
    "Source",
    "WarmStartError",
    "apply_trainable_scopes",
    "by_name",
    "in_scopes",
    "local_checkpoint",
    "match_variables",
    "resolve_source",
    "saved_variables",
    "split_scopes",
    "warm_start",
]

log = logging.getLogger(__name__)

SAVED_MODEL_FILE = "saved_model.pb"
OBJECT_GRAPH_KEY = "_CHECKPOINTABLE_OBJECT_GRAPH"
_STATE_RE = re.compile(r'^model_checkpoint_path:\s*"([^"]+)"', re.M)
_RNG_STATE = "seed_generator"


class WarmStartError(SparktfError, ValueError):
    """The source cannot be found or read, or its weights do not fit the model."""


@dataclasses.dataclass(frozen=True)
class Source:
    """A resolved ``--warm-start-from``: ``kind`` is ``"checkpoint"`` (``path`` is the
    checkpoint prefix) or ``"saved_model"`` (``path`` is the SavedModel directory)."""

    kind: str
    path: str


def split_scopes(text: str | Iterable[str] | None) -> tuple[str, ...]:
    """Scopes from a comma-separated string (or an iterable of them): stripped, no empties."""
    if text is None:
        return ()
    parts = text.split(",") if isinstance(text, str) else [p for t in text for p in t.split(",")]
    return tuple(p.strip() for p in parts if p.strip())


# ------------------------------------------------------------------------------ the source


def _parent(path: str) -> str:
    loc = storage.parse(path)
    return storage.Location(loc.scheme, loc.netloc, posixpath.dirname(loc.path)).uri


def _basename(path: str) -> str:
    return posixpath.basename(storage.parse(path).path)


def _checkpoint_in(checkpoint_dir: str) -> str | None:
    """The prefix the ``checkpoint`` state file of ``checkpoint_dir`` names, or None."""
    try:
        text = storage.read_text(storage.join(checkpoint_dir, STATE_FILE))
    except storage.PathNotFoundError:
        return None
    match = _STATE_RE.search(text)
    if not match:
        return None
    return storage.join(checkpoint_dir, posixpath.basename(match.group(1)))


def _latest_export(directory: str) -> str | None:
    """The SavedModel of the highest numeric step directly under ``directory``, or None."""
    try:
        entries = storage.listdir(directory)
    except (storage.PathNotFoundError, NotADirectoryError):
        return None
    steps = sorted(
        (int(_basename(e)), e)
        for e in entries
        if _basename(e).isdigit() and storage.exists(storage.join(e, SAVED_MODEL_FILE))
    )
    return steps[-1][1] if steps else None


def resolve_source(path: str) -> Source:
    """The checkpoint or SavedModel ``path`` names (see the module docstring).

    Raises :class:`WarmStartError` naming ``path`` when it holds neither; storage errors
    (HDFS unreachable, permission denied) propagate.
    """
    path = str(path)
    if storage.exists(storage.join(path, SAVED_MODEL_FILE)):
        return Source("saved_model", path)
    if storage.exists(path + ".index"):
        return Source("checkpoint", path)
    if not storage.isdir(path):
        raise WarmStartError(
            f"TrainConfig.warm_start_from {path}: no such checkpoint, model directory or SavedModel"
        )
    stated = None
    if storage.exists(storage.join(path, STATE_FILE)):  # a checkpoints directory
        stated = _checkpoint_in(path)
    elif storage.isdir(storage.join(path, CHECKPOINTS)):  # a model directory
        stated = latest_checkpoint(path)
    if stated is not None:
        if not storage.exists(stated + ".index"):
            raise WarmStartError(
                f"TrainConfig.warm_start_from {path}: its checkpoint state names {stated}, "
                "which has no .index file (an incomplete or deleted checkpoint)"
            )
        return Source("checkpoint", stated)
    for exports in (path, storage.join(path, EXPORT)):
        found = _latest_export(exports)
        if found is not None:
            return Source("saved_model", found)
    raise WarmStartError(
        f"TrainConfig.warm_start_from {path} holds no checkpoint (no checkpoint state file, in "
        f"it or in {CHECKPOINTS}/) and no SavedModel ({SAVED_MODEL_FILE}, in it, in a numeric "
        f"subdirectory or in {EXPORT}/<step>/)"
    )


@contextlib.contextmanager
def local_checkpoint(source: Source) -> Iterator[str]:
    """A local checkpoint prefix holding the source's variables (a temporary download for
    ``hdfs://``): the checkpoint itself, or the SavedModel's ``variables/variables``."""
    if source.kind == "saved_model":
        with storage.local_copy(storage.join(source.path, "variables")) as local:
            yield posixpath.join(local, "variables")
        return
    if not storage.is_remote(source.path):
        yield storage.parse(source.path).path
        return
    name = _basename(source.path)
    files = [
        e for e in storage.listdir(_parent(source.path)) if _basename(e).startswith(name + ".")
    ]
    with tempfile.TemporaryDirectory(prefix="sparktf-warmstart-") as tmp:
        for entry in files:
            storage.copy_file(entry, posixpath.join(tmp, _basename(entry)))
        yield posixpath.join(tmp, name)


# ------------------------------------------------------------------------------ matching


@dataclasses.dataclass(frozen=True)
class SavedVariable:
    """One variable of the source model: TensorFlow name, checkpoint key, shape, and its
    position in the source model's variable order (None where the source does not say)."""

    name: str
    key: str
    shape: tuple[int, ...]
    order: int | None


def _tf_name(variable: Any) -> str:
    """The TensorFlow name of a Keras (or tf) variable, without the ``:0``."""
    inner = getattr(variable, "value", variable)
    name = getattr(inner, "name", None) or variable.path
    return re.sub(r":\d+$", "", name)


def saved_variables(prefix: str) -> list[SavedVariable]:
    """The source model's variables in the local checkpoint ``prefix``.

    sparktf checkpoints: what the root's ``model`` reaches, plus the entries of every
    optimizer's ``_trainable_variables`` list (ordered); SavedModel variables: the export's
    ``model_variables`` list (ordered). A checkpoint without an object graph (TF1, name
    based) is read by its keys, which are the variables' names.
    """
    import tensorflow as tf
    from tensorflow.core.protobuf import trackable_object_graph_pb2

    try:
        reader = tf.train.load_checkpoint(prefix)
    except (tf.errors.OpError, ValueError) as exc:
        raise WarmStartError(f"cannot read checkpoint {prefix}: {exc}") from exc
    shapes = reader.get_variable_to_shape_map()
    if not reader.has_tensor(OBJECT_GRAPH_KEY):
        return [
            SavedVariable(key, key, tuple(shape), None)
            for key, shape in sorted(shapes.items())
            if key != OBJECT_GRAPH_KEY
        ]
    graph = trackable_object_graph_pb2.TrackableObjectGraph()
    graph.ParseFromString(reader.get_tensor(OBJECT_GRAPH_KEY))

    def children(node_id: int) -> dict[str, int]:
        return {c.local_name: c.node_id for c in graph.nodes[node_id].children}

    def ordered(list_node: int) -> list[int]:
        items = children(list_node)
        return [items[k] for k in sorted((k for k in items if k.isdigit()), key=int)]

    root = children(0)
    order: dict[int, int] = {}
    members: set[int] = set()
    lists = []
    if "model_variables" in root:  # a SavedModel written by sparktf.models.export
        lists.append(root["model_variables"])
    else:
        lists += [
            children(node)["_trainable_variables"]
            for node in root.values()
            if "_trainable_variables" in children(node)
        ]
        if "model" in root:
            stack = [root["model"]]
            while stack:
                node = stack.pop()
                if node not in members:
                    members.add(node)
                    stack.extend(children(node).values())
    for list_node in lists:
        for node in ordered(list_node):
            order.setdefault(node, len(order))
            members.add(node)
    if not members:
        log.warning("checkpoint %s has no 'model' object: reading all its variables", prefix)
        members = set(range(len(graph.nodes)))
    found = []
    for node in sorted(members):
        for attr in graph.nodes[node].attributes:
            if attr.name == "VARIABLE_VALUE" and attr.checkpoint_key in shapes:
                found.append(
                    SavedVariable(
                        re.sub(r":\d+$", "", attr.full_name or attr.checkpoint_key),
                        attr.checkpoint_key,
                        tuple(shapes[attr.checkpoint_key]),
                        order.get(node),
                    )
                )
    return found


def in_scopes(variable: Any, scopes: Sequence[str], model_name: str = "") -> bool:
    """Whether the Keras path of ``variable`` (or that path without the leading
    ``model_name/``) starts with one of ``scopes``."""
    path = variable.path
    paths = [path]
    if model_name and path.startswith(model_name + "/"):
        paths.append(path[len(model_name) + 1 :])
    return any(p.startswith(scope) for p in paths for scope in scopes)


def _is_rng_state(variable: Any) -> bool:
    return any(part.startswith(_RNG_STATE) for part in variable.path.split("/"))


def _shape(shape: Sequence[int]) -> str:
    return "[" + ", ".join(str(int(d)) for d in shape) + "]"


@dataclasses.dataclass
class Matching:
    """How the variables of a model pair with a source's (:func:`match_variables`).

    ``pairs``: (model variable, saved variable) to assign; ``excluded``, ``missing``: Keras
    paths of the variables left as they are (in ``exclude_scopes``; not in the source);
    ``mismatched``, ``ambiguous``: descriptions of the variables that stop the warm start
    (a shape that differs; a name the source holds several times in no known order);
    ``unused``: the source's variables nothing took.
    """

    pairs: list[tuple[Any, SavedVariable]] = dataclasses.field(default_factory=list)
    excluded: list[str] = dataclasses.field(default_factory=list)
    missing: list[str] = dataclasses.field(default_factory=list)
    mismatched: list[str] = dataclasses.field(default_factory=list)
    ambiguous: list[str] = dataclasses.field(default_factory=list)
    unused: list[str] = dataclasses.field(default_factory=list)

    def check(self, what: str, saved_names: Iterable[str]) -> None:
        """Raises :class:`WarmStartError` (``what``: "MODEL from SOURCE") unless every
        variable that is not excluded or missing fits and at least one is restored."""
        if self.mismatched:
            raise WarmStartError(
                f"cannot warm-start {what}: {len(self.mismatched)} variable(s) differ in shape: "
                f"{'; '.join(self.mismatched)}. Leave them out with "
                "TrainConfig.warm_start_exclude_scopes "
                "(e.g. the classifier head when the number of classes changes)"
            )
        if self.ambiguous:
            raise WarmStartError(
                f"cannot warm-start {what}: the source holds several variables of the same "
                f"name in no known order: {'; '.join(self.ambiguous)}. Warm-start from the "
                "run's SavedModel export instead"
            )
        if not self.pairs:
            names = sorted(saved_names)[:10]
            raise WarmStartError(
                f"cannot warm-start {what}: none of its variables is in the source (the "
                f"source holds e.g. {names}; excluded: {len(self.excluded)})"
            )


def by_name(saved: Sequence[SavedVariable]) -> dict[str, list[SavedVariable]]:
    """The saved variables grouped by TensorFlow name, each group in the source model's
    variable order (those of unknown order last, by checkpoint key)."""
    groups: dict[str, list[SavedVariable]] = {}
    for var in saved:
        groups.setdefault(var.name, []).append(var)
    last = len(saved) + 1
    for group in groups.values():
        group.sort(key=lambda v: (v.order if v.order is not None else last, v.key))
    return groups


def match_variables(
    model: Any, saved: Sequence[SavedVariable], exclude_scopes: Sequence[str]
) -> Matching:
    """Pairs every variable of ``model`` (random-generator states aside) with the saved
    variable of the same TensorFlow name: the n-th of a name takes the n-th saved one."""
    groups = by_name(saved)
    out = Matching()
    seen: dict[str, int] = {}
    for variable in model.variables:
        if _is_rng_state(variable):
            continue
        name = _tf_name(variable)
        index = seen.get(name, 0)
        seen[name] = index + 1
        group = groups.get(name, [])
        if in_scopes(variable, exclude_scopes, model.name):
            out.excluded.append(variable.path)
        elif index >= len(group):
            out.missing.append(variable.path)
        elif len(group) > 1 and any(v.order is None for v in group):
            out.ambiguous.append(f"{variable.path} (saved as {name!r} {len(group)} times)")
        elif tuple(group[index].shape) != tuple(int(d) for d in variable.shape):
            out.mismatched.append(
                f"{variable.path}: {_shape(variable.shape)} in the model, "
                f"{_shape(group[index].shape)} in the source"
            )
        else:
            out.pairs.append((variable, group[index]))
    used = {match.key for _, match in out.pairs}
    out.unused = sorted(v.name for v in saved if v.key not in used)
    return out


def _assign(prefix: str, pairs: Sequence[tuple[Any, SavedVariable]], log: logging.Logger) -> None:
    """Assigns each saved value of the local checkpoint ``prefix`` to its model variable."""
    import tensorflow as tf

    reader = tf.train.load_checkpoint(prefix)
    for variable, match in pairs:
        value = reader.get_tensor(match.key)
        if str(value.dtype) != str(variable.dtype):
            value = tf.cast(value, variable.dtype)
        variable.assign(value)
        log.debug("warm start: %s <- %s", variable.path, match.key)


def _log_matching(what: str, matching: Matching, scopes: Sequence[str], log) -> None:
    scalars = sum(math.prod(match.shape) for _, match in matching.pairs)
    log.info(
        "warm start of %s: restored %d variables (%d scalars), excluded %d (scopes %s), "
        "missing %d, unused in the source %d",
        what,
        len(matching.pairs),
        scalars,
        len(matching.excluded),
        list(scopes),
        len(matching.missing),
        len(matching.unused),
    )
    if matching.excluded:
        log.info("warm start: excluded (kept their initial values): %s", matching.excluded)
    if matching.missing:
        log.warning(
            "warm start: not in the source (kept their initial values): %s", matching.missing
        )
    if matching.unused:
        log.info("warm start: source variables not restored: %s", matching.unused)


def warm_start(
    model: Any,
    path: str,
    *,
    exclude_scopes: Sequence[str] = (),
    log: logging.Logger = log,
) -> dict[str, Any]:
    """Loads the weights of the checkpoint or SavedModel at ``path`` into the built ``model``.

    Variables whose Keras path is in ``exclude_scopes`` keep their current values. A
    variable of the model the source does not have is *missing* (it keeps its value; listed
    in the log). Nothing is assigned unless every other variable fits: a shape that differs
    from the source's, or a source whose variables are ambiguous, raises
    :class:`WarmStartError` naming the variables. Call it under the strategy scope's model
    in every process that holds a copy of the variables (every all-reduce worker).

    Returns ``{"restored", "excluded", "missing", "unused"}`` (variable counts; ``unused``:
    the source's variables nothing took) plus ``"source"`` (the checkpoint prefix or the
    SavedModel directory read) and ``"kind"``.
    """
    exclude_scopes = split_scopes(exclude_scopes)
    source = resolve_source(path)
    what = f"{model.name} from {source.kind} {source.path}"
    with local_checkpoint(source) as prefix:
        saved = saved_variables(prefix)
        matching = match_variables(model, saved, exclude_scopes)
        matching.check(what, {v.name for v in saved})
        _assign(prefix, matching.pairs, log)
    _log_matching(what, matching, exclude_scopes, log)
    return {
        "restored": len(matching.pairs),
        "excluded": len(matching.excluded),
        "missing": len(matching.missing),
        "unused": len(matching.unused),
        "source": source.path,
        "kind": source.kind,
    }


# ------------------------------------------------------------------------------ trainable


def _freeze_layers(layer: Any, scopes: Sequence[str], model_name: str) -> list[str]:
    """Sets ``trainable = False`` on every sub-layer (recursively, through nested models)
    whose trainable variables all lie outside ``scopes``; returns their names."""
    frozen = []
    for sub in getattr(layer, "layers", []):
        variables = sub.trainable_variables
        if not variables:
            continue
        if not any(in_scopes(v, scopes, model_name) for v in variables):
            sub.trainable = False
            frozen.append(sub.name)
        else:
            frozen += _freeze_layers(sub, scopes, model_name)
    return frozen


def apply_trainable_scopes(
    model: Any, scopes: Sequence[str] | str, *, log: logging.Logger = log
) -> list[Any]:
    """Leaves only the variables in ``scopes`` trainable and returns them (``model``'s
    trainable variables, unchanged, when ``scopes`` is empty).

    Layers with nothing in scope are frozen whole (``layer.trainable = False``: their
    weights *and* their batch-norm statistics stay bit-identical; Keras runs a frozen
    ``BatchNormalization`` in inference mode), and any other out-of-scope variable is marked
    non-trainable, so afterwards ``model.trainable_variables`` is exactly the returned list
    and a step that optimises ``model.trainable_variables`` trains nothing else. Call it
    before the optimizer is built (its slots follow the trainable variables) and in every
    training process. A scope that matches no trainable variable is an error.
    """
    scopes = split_scopes(scopes)
    before = list(model.trainable_variables)
    if not scopes:
        return before
    unmatched = [s for s in scopes if not any(in_scopes(v, (s,), model.name) for v in before)]
    if unmatched:
        layers = sorted({v.path.rsplit("/", 1)[0] for v in before})
        raise WarmStartError(
            f"TrainConfig.trainable_scopes {list(unmatched)} match no trainable variable of "
            f"{model.name}; its trainable variables are under {layers}"
        )
    chosen = [v for v in before if in_scopes(v, scopes, model.name)]
    frozen_layers = _freeze_layers(model, scopes, model.name)
    for variable in model.trainable_variables:
        if not in_scopes(variable, scopes, model.name):
            variable.trainable = False
    after = list(model.trainable_variables)
    if [id(v) for v in after] != [id(v) for v in chosen]:  # a Keras change would show here
        raise SparktfRuntimeError(
            f"trainable variables after freezing {[v.path for v in after]} differ from "
            f"those in scopes {list(scopes)}: {[v.path for v in chosen]}"
        )
    log.info(
        "training %d of %d trainable variables (scopes %s); frozen layers: %s",
        len(after),
        len(before),
        list(scopes),
        frozen_layers,
    )
    return after
