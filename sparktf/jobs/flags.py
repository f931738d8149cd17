"""The training jobs' flags, generated from the configs' field metadata.

Every field of :class:`~sparktf.train.config.TrainConfig`,
:class:`~sparktf.train.config.ScalingConfig` and :class:`~sparktf.train.config.RunConfig`
(and of any config dataclass nested in them, which contributes its own fields) says in its
``dataclasses.field(metadata=...)`` how it looks on the command line:

* ``help`` -- what the setting means: the field's documentation and its flag's help. It may
  name other settings as ``Class.field`` (``TrainConfig.epochs``); ``--help`` shows their
  flags instead;
* ``group`` -- the section of ``--help`` it belongs to, a key of :data:`GROUPS`;
* ``flag`` (optional) -- the flag when it is not ``--<field-name>``, e.g.
  ``--checkpoint-every`` for ``CheckpointConfig.every_steps`` (``RunConfig.checkpoint``). A
  switch that is on by default is turned off by ``--no-<name>``;
* ``flag_help``, ``choices``, ``metavar`` (optional) -- the help where the command line
  differs from the Python API (``--no-export``), the allowed values, the value's name;
* ``parse`` (optional) -- the argparse ``type`` when the annotation's is not enough
  (``--num-workers MIN:MAX``).

The flag's type comes from the field's annotation (``int``, ``float``, ``str``; ``bool`` is a
switch; ``dict`` a JSON object; ``tuple[str, ...]`` a comma-separated list; any of them
``| None``), its default from the field's default. The argparse ``dest`` is the flag's name
without the dashes (``--checkpoint-every``: ``checkpoint_every``, ``--no-export``:
``export``); the keys of ``conf/jobs/*.json`` are these names.

:func:`add_flags` adds the flags to a parser, :func:`build` makes a config back from the
parsed namespace, :func:`flag_names` maps ``Class.field`` to its flag and
:func:`for_command_line` rewrites a message (a :class:`~sparktf.train.errors.ConfigError`'s,
a help text) in terms of flags: one mapping, the metadata, for all three.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import re
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from sparktf import cli
from sparktf.train.config import RunConfig, ScalingConfig, TrainConfig
from sparktf.train.driver.tracking import INSTALL_HINT

__all__ = [
    "CONFIGS",
    "GROUPS",
    "Flag",
    "add_flags",
    "build",
    "comma_list",
    "flag_names",
    "flags",
    "for_command_line",
    "json_object",
]

# The configs of a training job, in the order their flags are read.
CONFIGS: tuple[type, ...] = (TrainConfig, ScalingConfig, RunConfig)

# The sections of a training job's --help, in order: key -> (title, description).
GROUPS: dict[str, tuple[str, str | None]] = {
    "data": ("data", "what to train on, and for how long"),
    "model": ("model", "the model, its configuration and the weights it starts from"),
    "optimizer": (
        "optimizer",
        "optimizer, learning rate, regularisation, precision; an option left out keeps the "
        "model's own setting (sparktf.models.describe(MODEL))",
    ),
    "input": ("input", "how the data reaches the TensorFlow processes"),
    "strategy": ("strategy", "where and how many TensorFlow processes"),
    "failure": ("failure handling", "time limits and restarts"),
    "checkpoints": ("checkpoints", "the model directory: checkpoints and exports"),
    "evaluation": ("evaluation", "evaluation during training"),
    "tracking": (
        "tracking",
        "summaries, progress, and experiment tracking in MLflow: optional; needs the mlflow "
        f"extra ({INSTALL_HINT}). The driver logs the run's parameters, its training metrics "
        "and evaluations with their steps, and the export as an artifact to MLflow",
    ),
}


def json_object(text: str) -> dict[str, Any]:
    """A JSON object given on the command line (argparse ``type``)."""
    value = json.loads(text)
    if not isinstance(value, dict):
        raise ValueError(f"not a JSON object: {text!r}")
    return value


def comma_list(text: str | typing.Iterable[str]) -> tuple[str, ...]:
    """Comma-separated items (or an iterable of such strings): stripped, no empties."""
    parts = text.split(",") if isinstance(text, str) else [p for t in text for p in t.split(",")]
    return tuple(p.strip() for p in parts if p.strip())


def _kind(annotation: Any) -> Any:
    """The type a field holds, without ``None`` and without type arguments."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(args) == 1:
            annotation = args[0]
    return typing.get_origin(annotation) or annotation


@dataclass(frozen=True)
class Flag:
    """One config field on the command line.

    ``top`` is the config the flag belongs to (``RunConfig``), ``owner`` the dataclass that
    declares ``field`` (``top`` itself or a config nested in it); ``path`` the field names
    from ``top`` down to it (``("checkpoint", "every_steps")`` for a nested one); ``kind`` the
    type it holds; ``name`` the flag (``--checkpoint-every``); ``dest`` its argparse
    destination and ``conf/jobs`` key (``checkpoint_every``).
    """

    top: type
    owner: type
    path: tuple[str, ...]
    field: dataclasses.Field
    kind: Any
    name: str
    dest: str

    @property
    def qualnames(self) -> tuple[str, ...]:
        """How messages name the field: ``Owner.field``, and from the top config down."""
        names = [f"{self.owner.__name__}.{self.field.name}"]
        if len(self.path) > 1:
            names.append(f"{self.top.__name__}.{'.'.join(self.path)}")
        return tuple(names)

    @property
    def default(self) -> Any:
        """The flag's default: the field's, or None (the field keeps its own default)."""
        if self.kind in (dict, tuple) or self.field.default is dataclasses.MISSING:
            return None
        return self.field.default

    def argparse_options(self) -> dict[str, Any]:
        """The keyword arguments of ``add_argument`` besides the help."""
        meta = self.field.metadata
        if self.kind is bool:
            return {"action": "store_false" if self.default else "store_true"}
        options = {"type": meta.get("parse") or _PARSERS[self.kind], "default": self.default}
        for key in ("choices", "metavar"):
            if key in meta:
                options[key] = list(meta[key]) if key == "choices" else meta[key]
        return options


# The argparse type of each kind of field (bool fields are switches).
_PARSERS = {int: int, float: float, str: str, dict: json_object, tuple: comma_list}


def _flag(top: type, owner: type, path: tuple[str, ...], field: dataclasses.Field, kind) -> Flag:
    meta = field.metadata
    if kind is not bool and kind not in _PARSERS:
        raise TypeError(f"{owner.__name__}.{field.name}: no flag for a field of type {kind!r}")
    on_by_default = kind is bool and field.default is True
    name = meta.get("flag") or (("--no-" if on_by_default else "--") + field.name.replace("_", "-"))
    dest = name.removeprefix("--")
    if on_by_default:
        if not dest.startswith("no-"):
            raise TypeError(f"{owner.__name__}.{field.name}: a switch on by default is --no-...")
        dest = dest.removeprefix("no-")
    for key in ("help", "group"):
        if key not in meta:
            raise TypeError(f"{owner.__name__}.{field.name} has no {key!r} in its metadata")
    return Flag(top, owner, path, field, kind, name, dest.replace("-", "_"))


def _walk(top: type, cls: type, path: tuple[str, ...]) -> Iterator[Flag]:
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        kind = _kind(hints[field.name])
        if dataclasses.is_dataclass(kind):
            yield from _walk(top, kind, (*path, field.name))
        else:
            yield _flag(top, cls, (*path, field.name), field, kind)


@functools.cache
def flags(*classes: type) -> tuple[Flag, ...]:
    """The flags of the configs ``classes`` (default :data:`CONFIGS`), nested ones included,
    in field order. Raises TypeError for a field without ``help`` or ``group``, or of a type
    that has no flag, and ValueError when two fields would share a flag."""
    found = tuple(f for cls in classes or CONFIGS for f in _walk(cls, cls, ()))
    seen: dict[str, str] = {}
    for f in found:
        for taken in (f.name, f.dest):
            if taken in seen:
                raise ValueError(f"{f.qualnames[0]} and {seen[taken]} share {taken}")
            seen[taken] = f.qualnames[0]
    return found


def flag_names(*classes: type) -> dict[str, str]:
    """``Class.field`` (and ``Top.nested.field``) -> the flag, for the configs ``classes``."""
    return {name: f.name for f in flags(*classes) for name in f.qualnames}


@functools.cache
def _pattern(classes: tuple[type, ...]) -> re.Pattern[str]:
    names = sorted(flag_names(*classes), key=len, reverse=True)
    # Not followed by more of a name: "RunConfig.model_dir_x" is no field; a full stop is.
    return re.compile(r"\b(" + "|".join(re.escape(n) for n in names) + r")(?!\w|\.\w)")


def for_command_line(text: str, *classes: type) -> str:
    """``text`` with each config field it names (``EvalConfig.split``) replaced by its
    flag (``--eval-split``): an error message or a help text as a command-line user reads it."""
    names = flag_names(*classes)
    return _pattern(classes).sub(lambda m: names[m.group(1)], text)


def add_flags(
    parser: argparse.ArgumentParser, *classes: type
) -> dict[str, argparse._ArgumentGroup]:
    """Adds a flag for every field of the configs ``classes`` (default :data:`CONFIGS`) to
    ``parser``, each in its section of :data:`GROUPS`; returns the sections by key, for the
    job's own flags. Raises what :func:`flags` raises."""
    groups = {key: parser.add_argument_group(*text) for key, text in GROUPS.items()}
    for flag in flags(*classes):
        meta = flag.field.metadata
        text = for_command_line(meta.get("flag_help") or meta["help"], *classes)
        groups[meta["group"]].add_argument(
            flag.name, dest=flag.dest, help=text.replace("%", "%%"), **flag.argparse_options()
        )
        if meta.get("former"):  # the flag's former name: still works, with a warning
            groups[meta["group"]].add_argument(
                meta["former"],
                dest=flag.dest,
                action=cli.Renamed,
                new=flag.name,
                help=argparse.SUPPRESS,
            )
    return groups


def build(cls: type, args: argparse.Namespace) -> Any:
    """The config ``cls`` from the namespace that its flags (:func:`add_flags`) parsed: each
    field from its flag's ``dest``, nested configs built the same way; a flag left at None
    leaves its field at the field's default. Raises
    :class:`~sparktf.train.errors.ConfigError` (naming the field) for values the config
    refuses."""
    by_path = {f.path: f for f in flags(cls)}
    return _build(cls, (), by_path, args)


def _build(cls: type, path: tuple[str, ...], by_path: dict, args: argparse.Namespace) -> Any:
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if not field.init:
            continue
        kind = _kind(hints[field.name])
        if dataclasses.is_dataclass(kind):
            values[field.name] = _build(kind, (*path, field.name), by_path, args)
            continue
        value = getattr(args, by_path[(*path, field.name)].dest, None)
        has_default = (field.default, field.default_factory) != (dataclasses.MISSING,) * 2
        if value is None and has_default:
            continue
        if kind is tuple and value is not None:
            value = comma_list(value)  # a conf/jobs file may hold a list or a string
        values[field.name] = value
    return cls(**values)
