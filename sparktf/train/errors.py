"""The two errors of training: a configuration that cannot run (:class:`ConfigError`) and a
run that failed (:class:`TrainingError`); both are :class:`sparktf.SparktfError`, and
:mod:`sparktf.train` exports them."""

from __future__ import annotations

from sparktf.errors import SparktfError

__all__ = ["ConfigError", "TrainingError"]


class ConfigError(SparktfError, ValueError):
    """A configuration that cannot run; the message names the setting (``Class.field``, e.g.
    ``EvalConfig.split``) and says why. The training jobs show the flag instead
    (:func:`sparktf.jobs.flags.for_command_line`)."""


class TrainingError(SparktfError, RuntimeError):
    """The run failed; the message names the process and its error."""
