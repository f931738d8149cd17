"""The settings machinery of the configs (:mod:`sparktf.train.config`).

A config is a frozen dataclass whose fields are made by :func:`setting`: each carries its
documentation in its metadata (``help``, appended to the class docstring by
:func:`documented`) with how the training jobs show it (``group``, ``flag``, ...), and the
jobs' flags are generated from it (:mod:`sparktf.jobs.flags`). :func:`check_choices` and
:func:`positive` check fields in a config's ``__post_init__``, raising
:class:`~sparktf.train.errors.ConfigError` naming the field as ``Class.field``
(``EvalConfig.split``); :func:`worker_pair` and :func:`worker_range` read an elastic run's
``(min, max)`` workers.
"""

from __future__ import annotations

import dataclasses
import textwrap
from dataclasses import field
from typing import Any

from sparktf.train.errors import ConfigError

__all__ = [
    "check_choices",
    "documented",
    "positive",
    "setting",
    "worker_pair",
    "worker_range",
]


def setting(
    default: Any = dataclasses.MISSING,
    *,
    help: str,
    group: str,
    factory: Any = dataclasses.MISSING,
    **cli: Any,
) -> Any:
    """A config field with its documentation, which is also its flag's help, and how the
    training jobs present it: ``group`` (the ``--help`` section), and optionally ``flag``
    (when it is not ``--<field-name>``), ``flag_help`` (when the flag's help differs),
    ``choices``, ``metavar``. See :mod:`sparktf.jobs.flags`."""
    return field(
        default=default, default_factory=factory, metadata={"help": help, "group": group, **cli}
    )


def documented(cls: type) -> type:
    """Appends each field's help (its metadata) to the class docstring: one source for the
    Python documentation of a setting and for its flag's help."""
    lines = ["Fields (each is also a flag of the training jobs, see sparktf.jobs.flags):", ""]
    for f in dataclasses.fields(cls):
        text = f"* ``{f.name}`` -- {f.metadata['help']}"
        lines += textwrap.wrap(text, 88, subsequent_indent="  ", break_on_hyphens=False)
    cls.__doc__ = (cls.__doc__ or "").rstrip() + "\n\n" + textwrap.indent("\n".join(lines), "    ")
    return cls


def check_choices(config: Any) -> None:
    """Checks the fields of ``config`` that have ``choices`` in their metadata."""
    for f in dataclasses.fields(config):
        choices = f.metadata.get("choices")
        if choices and getattr(config, f.name) not in choices:
            raise ConfigError(
                f"{type(config).__name__}.{f.name} must be one of {tuple(choices)}, "
                f"got {getattr(config, f.name)!r}"
            )


def positive(config: Any, name: str, *, allow_none: bool = False, allow_zero: bool = False) -> None:
    """Raises :class:`ConfigError` naming ``Class.name`` unless the field is > 0 (>= 0 with
    ``allow_zero``; None allowed with ``allow_none``)."""
    value = getattr(config, name)
    if value is None and allow_none:
        return
    if value is None or value < 0 or (value == 0 and not allow_zero):
        raise ConfigError(
            f"{type(config).__name__}.{name} must be {'>= 0' if allow_zero else '> 0'}, "
            f"got {value!r}"
        )


def worker_pair(value: Any) -> tuple[int, int]:
    """``(min, max)`` workers of an elastic run, checked."""
    if len(value) != 2 or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise ConfigError(
            f"ScalingConfig.num_workers must be a number or a (min, max) pair, got {value!r}"
        )
    low, high = value
    if not 1 <= low <= high:
        raise ConfigError(
            f"ScalingConfig.num_workers {low}:{high}: the range must have 1 <= min <= max"
        )
    return low, high


def worker_range(text: str) -> int | tuple[int, int]:
    """``--num-workers``: ``N`` or ``MIN:MAX`` (argparse ``type``)."""
    if ":" not in str(text):
        return int(text)
    low, _, high = str(text).partition(":")
    return int(low), int(high)
