"""The training jobs' flags come from the configs' field metadata (sparktf.jobs.flags):
every field has a flag and a help, every flag lands in its field, ``--help`` is grouped,
errors name the field to Python callers and the flag on the command line.

No Spark session, no TensorFlow: these build parsers and configs only.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sparktf import cli
from sparktf.jobs import flags
from sparktf.jobs import train as job
from sparktf.train import ConfigError, RunConfig, ScalingConfig, TrainConfig

pytestmark = pytest.mark.unit

ROOT = Path(__file__).resolve().parents[1]


def _leaves(cls: type, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """The paths of the fields of ``cls`` that hold values (nested configs opened)."""
    out = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(f.default_factory):
            out += _leaves(f.default_factory, (*path, f.name))
        else:
            out.append((*path, f.name))
    return out


def _get(config, path: tuple[str, ...]):
    for name in path:
        config = getattr(config, name)
    return config


def test_every_config_field_has_a_flag_a_help_and_a_group():
    found = {(f.top, f.path): f for f in flags.flags(*flags.CONFIGS)}
    for cls in flags.CONFIGS:
        for path in _leaves(cls):
            flag = found.pop((cls, path))
            assert flag.name.startswith("--") and flag.field.metadata["help"].strip()
            assert flag.field.metadata["group"] in flags.GROUPS
            doc = " ".join(flag.owner.__doc__.split())  # the class that declares the field
            assert " ".join(flag.field.metadata["help"].split()) in doc, flag.qualnames[0]
    assert not found


def _value_for(flag: flags.Flag):
    """A value unlike the field's default, as (command-line words, the field's value)."""
    meta, default = flag.field.metadata, flag.default
    if flag.kind is bool:
        return [flag.name], not default
    if "choices" in meta:
        value = next(c for c in meta["choices"] if c != default)
        return [flag.name, value], value
    if flag.kind is dict:
        return [flag.name, '{"hidden_units": 7}'], {"hidden_units": 7}
    if flag.kind is tuple:
        return [flag.name, "a, b,"], ("a", "b")
    if flag.kind is int:
        return [flag.name, str((default or 0) + 7)], (default or 0) + 7
    if flag.kind is float:
        return [flag.name, str((default or 0) + 2.5)], (default or 0) + 2.5
    return [flag.name, f"/{flag.dest}"], f"/{flag.dest}"


def test_every_flag_lands_in_its_field():
    parser = job.parser("t", "train", None)
    argv, expected = [], {}
    for flag in flags.flags(*flags.CONFIGS):
        words, value = _value_for(flag)
        argv += words
        expected[(flag.top, flag.path)] = value
    args = parser.parse_args(argv)
    built = {cls: flags.build(cls, args) for cls in flags.CONFIGS}
    for (cls, path), value in expected.items():
        assert _get(built[cls], path) == value, f"{cls.__name__}.{'.'.join(path)}"


def test_defaults_are_the_fields_defaults():
    args = job.parser("t", "train", None).parse_args(["--model", "m", "--data", "d"])
    args.model_dir = "/m"
    train, scaling, run = (flags.build(cls, args) for cls in flags.CONFIGS)
    assert train == TrainConfig(model="m", data="d")
    assert scaling == ScalingConfig()
    assert run == RunConfig(model_dir="/m")


def test_flag_names_and_conf_keys_stay():
    """The flags the README, conf/ and the tests use keep their names and dests."""
    dests = {a.dest for a in job.parser("t", "train", None)._actions}
    names = {s for a in job.parser("t", "train", None)._actions for s in a.option_strings}
    for name in (
        "--model", "--model-config", "--data", "--split", "--input-mode", "--file-format",
        "--epochs", "--steps", "--batch-size", "--seed", "--no-shuffle", "--eval-split",
        "--eval-every", "--export-best", "--strategy", "--num-workers", "--num-ps",
        "--ps-on-driver", "--gpus-per-worker", "--threads-per-worker", "--model-dir",
        "--checkpoint-every", "--keep-checkpoints", "--summary-every", "--progress-every",
        "--feed-timeout", "--failure-timeout", "--startup-timeout", "--stall-timeout",
        "--max-restarts", "--no-export", "--result-json", "--mlflow-tracking-uri",
        "--mlflow-experiment", "--warm-start-from", "--warm-start-exclude-scopes",
        "--trainable-scopes", "--no-augment", "--optimizer", "--learning-rate",
        "--lr-boundaries-epochs", "--precision", "--config", "--profile", "--log-level",
    ):  # fmt: skip
        assert name in names
    confs = sorted((ROOT / "conf" / "jobs").glob("train*.json"))
    confs += sorted((ROOT / "conf" / "jobs" / "recipes").glob("*.json"))
    assert confs
    for path in confs:
        unknown = set(json.loads(path.read_text())) - dests
        assert not unknown, f"{path.name}: {unknown}"


def test_help_is_grouped():
    parser = job.parser("t", "train", None)
    titles = [g.title for g in parser._action_groups]
    for key, (title, _) in flags.GROUPS.items():
        assert title in titles, key
    for key in ("data", "model", "strategy", "input", "checkpoints", "evaluation", "optimizer"):
        assert key in titles
    assert "tracking" in titles
    by_title = {g.title: {a.dest for a in g._group_actions} for g in parser._action_groups}
    for flag in flags.flags(*flags.CONFIGS):
        title = flags.GROUPS[flag.field.metadata["group"]][0]
        assert flag.dest in by_title[title], flag.name
    assert {"optimizer", "learning_rate", "precision"} <= by_title["optimizer"]
    assert "augment" in by_title["model"]
    text = parser.format_help()
    assert "data:" in text and "evaluation:" in text and "TrainConfig." not in text


def test_errors_name_the_field_for_python_and_the_flag_on_the_command_line():
    with pytest.raises(ConfigError, match=r"TrainConfig\.input_mode must be one of") as error:
        TrainConfig(model="m", data="/d", input_mode="queue")
    assert flags.for_command_line(str(error.value)).startswith("--input-mode must be one of")
    with pytest.raises(ConfigError, match=r"CheckpointConfig\.every_steps must be > 0"):
        RunConfig(model_dir="/m", checkpoint={"every_steps": 0})
    with pytest.raises(ConfigError, match=r"ScalingConfig\.num_workers"):
        ScalingConfig(num_workers=0)
    text = "EvalConfig.export_best needs RunConfig.evaluation.split. RunConfig.model_dir_x stays"
    assert (
        flags.for_command_line(text)
        == "--export-best needs --eval-split. RunConfig.model_dir_x stays"
    )
    args = cli.parse(job.parser("t", "train", None), ["--data", "/d", "--model-dir", "/m"])
    with pytest.raises(cli.UsageError, match="^--model is required"):
        job.configs(args)
    args = cli.parse(
        job.parser("t", "train", None),
        ["--model", "m", "--data", "/d", "--model-dir", "/m", "--num-workers", "0"],
    )
    with pytest.raises(cli.UsageError, match="^--num-workers must be > 0, got 0"):
        job.configs(args)


@dataclasses.dataclass(frozen=True)
class _Inner:
    every_steps: int = dataclasses.field(
        default=5, metadata={"help": "steps", "group": "checkpoints", "flag": "--inner-every"}
    )
    on: bool = dataclasses.field(default=True, metadata={"help": "on", "group": "checkpoints"})


@dataclasses.dataclass(frozen=True)
class _Outer:
    name: str = dataclasses.field(metadata={"help": "the name", "group": "data"})
    inner: _Inner = dataclasses.field(default_factory=_Inner, metadata={"help": "nested"})


def test_nested_configs_get_flags_and_are_built():
    import argparse

    parser = argparse.ArgumentParser()
    flags.add_flags(parser, _Outer)
    args = parser.parse_args(["--name", "x", "--inner-every", "9", "--no-on"])
    assert flags.build(_Outer, args) == _Outer("x", _Inner(9, False))
    assert flags.build(_Outer, parser.parse_args(["--name", "y"])) == _Outer("y")
    names = flags.flag_names(_Outer)
    assert names["_Inner.every_steps"] == names["_Outer.inner.every_steps"] == "--inner-every"
    assert flags.for_command_line("_Outer.inner.on and _Inner.on", _Outer) == "--no-on and --no-on"


def test_a_field_without_help_or_a_shared_flag_is_refused():
    @dataclasses.dataclass
    class Bare:
        x: int = 0

    with pytest.raises(TypeError, match="Bare.x has no 'help'"):
        flags.flags(Bare)

    @dataclasses.dataclass
    class Twice:
        a: int = dataclasses.field(default=0, metadata={"help": "a", "group": "data"})
        b: int = dataclasses.field(
            default=0, metadata={"help": "b", "group": "data", "flag": "--a"}
        )

    with pytest.raises(ValueError, match="share --a"):
        flags.flags(Twice)


def test_run_config_is_grouped_and_each_group_keeps_its_flags():
    from sparktf.train import CheckpointConfig, EvalConfig, FailureConfig, TrackingConfig

    run = RunConfig(
        model_dir="/m",
        checkpoint=CheckpointConfig(every_steps=5, export=False),
        failure={"max_restarts": 2, "failure_timeout_s": 40.0},
        evaluation=EvalConfig(split="test", export_best="accuracy"),
    )
    assert (run.checkpoint.every_steps, run.checkpoint.keep, run.checkpoint.export) == (
        5,
        3,
        False,
    )
    assert run.failure == FailureConfig(max_restarts=2, failure_timeout_s=40.0)
    assert run.failure.heartbeat_timeout_s == 20.0
    assert run.tracking == TrackingConfig()
    assert RunConfig.from_dict(dataclasses.asdict(run)) == run
    with pytest.raises(ConfigError, match=r"RunConfig\.failure: .*'nope'"):
        RunConfig(model_dir="/m", failure={"nope": 1})
    with pytest.raises(ConfigError, match=r"RunConfig\.evaluation must be a EvalConfig"):
        RunConfig(model_dir="/m", evaluation="test")
    with pytest.raises(ConfigError, match=r"RunConfig: .*'checkpoint_every_steps'"):
        RunConfig.from_dict({"model_dir": "/m", "checkpoint_every_steps": 5})
    names = flags.flag_names(*flags.CONFIGS)
    assert names["EvalConfig.split"] == names["RunConfig.evaluation.split"] == "--eval-split"
    assert names["CheckpointConfig.every_steps"] == "--checkpoint-every"
    assert names["FailureConfig.max_restarts"] == "--max-restarts"
    assert names["TrackingConfig.mlflow_tracking_uri"] == "--mlflow-tracking-uri"
    assert "eval_split" not in {f.name for f in dataclasses.fields(TrainConfig)}
