"""Optional MLflow experiment tracking of a training run, from the driver only.

With ``TrackingConfig.mlflow_tracking_uri`` (``RunConfig.tracking``; ``--mlflow-tracking-uri``
of the training jobs), :func:`sparktf.train.fit` records one MLflow run in the experiment
``TrackingConfig.mlflow_experiment`` (default ``sparktf``, created when missing):

* **parameters** -- the run's layout and length (``model``, ``strategy``, ``num_workers``,
  ``num_ps``, ``batch_size`` (global), ``steps`` (the target global step),
  ``steps_per_epoch``, ``epochs``, ``input_mode``, ``learning_rate``, ``optimizer``, ...) and
  every entry of the model's effective config as ``model_config.<key>``;
* **training metrics with their global step** -- what the chief's progress reports to the
  driver carry (``loss``, ``accuracy`` or ``perplexity``, ``learning_rate``,
  ``examples_per_sec``, ``epoch``), read about once a second while the run goes (the
  driver's control channel; nothing is added to the TensorFlow processes), and the final
  values at the final step;
* **evaluation metrics with their step**, prefixed ``eval_`` (``eval_loss``,
  ``eval_accuracy``, ...), as each evaluation reaches the driver;
* run-level results at the final step (``run_elapsed_s``, ``run_examples_per_sec``,
  ``run_time_to_first_step_s``, ``run_restarts``);
* **artifacts** -- the SavedModel export under ``export/`` (``saved_model.pb``,
  ``variables/``, ...), the ``export_best`` export when there is one, and the run summary
  ``sparktf_train.json``. An ``hdfs://`` model directory's files are copied down to a
  temporary local directory first (deleted afterwards); their URIs are also tags
  (``sparktf.export``, ``sparktf.model_dir``, ...). Only what lies under the run's model
  directory is uploaded (the exports' paths come from the chief's report): a path elsewhere,
  or a symbolic link in a local export that leads out of the model directory, is logged as a
  warning and nothing of it is uploaded.

The MLflow run ends ``FINISHED``, or ``FAILED`` (``KILLED`` on an interrupt) with the error
in the tag ``sparktf.error``. A tracking store that stops answering during the run costs
warnings, not the training; one that cannot be reached when the run starts is a
:class:`~sparktf.train.errors.ConfigError` before Spark starts.

Needs the ``mlflow`` extra (``pip install 'sparktf[mlflow]'``: ``mlflow-skinny``). The
tracking URI is anything MLflow takes (``http(s)://`` of a tracking server, ``databricks``,
a local path or ``file://`` URI); give credentials through MLflow's environment variables
(``MLFLOW_TRACKING_TOKEN``, ``MLFLOW_TRACKING_USERNAME``/``PASSWORD``), not in the URI.
MLflow 3 refuses its file store unless ``MLFLOW_ALLOW_FILE_STORE=true``. MLflow's usage
telemetry is off unless ``MLFLOW_DISABLE_TELEMETRY`` is set otherwise: a training driver does
not call out to third parties on its own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from sparktf import paths, storage
from sparktf import spark as sparkutil
from sparktf.security.redact import redact_url, scrub
from sparktf.train.artifacts import RUN_FILE
from sparktf.train.config import RunConfig
from sparktf.train.driver import roles
from sparktf.train.errors import ConfigError
from sparktf.train.plan import RunPlan
from sparktf.train.result import TrainResult, within

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'sparktf[mlflow]'"
POLL_INTERVAL_S = 1.0  # the processes' heartbeats (with the chief's progress) come every second
# Progress entries that are not metrics of the training step.
_NOT_METRICS = frozenset({"step", "target", "first_step_wall", "eval"})
_MAX_PARAM_VALUE = 6000  # MLflow's limit on a parameter value
_BATCH = 100  # MLflow's log_batch takes at most 100 params or tags, 1000 metrics
_BAD_KEY = re.compile(r"[^\w\-./ ]")


def require_mlflow() -> None:
    """Raises :class:`ConfigError` naming the extra to install when MLflow is missing."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # read when MLflow loads
    try:
        import mlflow.tracking  # noqa: F401
    except ImportError as exc:
        raise ConfigError(
            "TrackingConfig.mlflow_tracking_uri needs MLflow, which is not installed "
            f"({exc}): {INSTALL_HINT}"
        ) from None


def tracking_uri(uri: str) -> str:
    """``uri`` as MLflow gets it: a local path (relative to the driver's working directory)
    becomes an absolute ``file://`` URI; any other URI is kept."""
    if urlsplit(uri).scheme or uri == "databricks":
        return uri
    return Path(uri).expanduser().resolve().as_uri()


def connect(run: RunConfig):
    """A client for ``run``'s tracking URI and the id of its experiment (created when
    missing). Raises :class:`ConfigError` when MLflow is missing or the store refuses."""
    require_mlflow()
    from mlflow.tracking import MlflowClient

    uri = tracking_uri(run.tracking.mlflow_tracking_uri)
    try:
        client = MlflowClient(tracking_uri=uri)
        experiment = client.get_experiment_by_name(run.tracking.mlflow_experiment)
        if experiment is None:
            experiment_id = client.create_experiment(run.tracking.mlflow_experiment)
        elif experiment.lifecycle_stage != "active":
            raise ConfigError(
                f"MLflow experiment {run.tracking.mlflow_experiment!r} at {redact_url(uri)} is "
                "deleted: restore it or choose another TrackingConfig.mlflow_experiment"
            )
        else:
            experiment_id = experiment.experiment_id
    except ConfigError:
        raise
    except Exception as exc:
        raise ConfigError(
            f"MLflow tracking store {redact_url(uri)} (TrackingConfig.mlflow_tracking_uri) cannot "
            "be used: "
            f"{type(exc).__name__}: {scrub(str(exc), uri)}"
        ) from None
    return client, experiment_id


def check(run: RunConfig) -> None:
    """Fails fast (:class:`ConfigError`) when ``run`` asks for tracking that cannot work:
    MLflow missing, or a store that refuses. Nothing is logged."""
    if run.tracking.mlflow_tracking_uri:
        connect(run)


@contextlib.contextmanager
def track(plan: RunPlan) -> Iterator[Tracker | NullTracker]:
    """The run's tracker (a no-op one without a tracking URI). Leaving the block with an
    exception ends the MLflow run as ``FAILED`` (``KILLED`` for an interrupt)."""
    if not plan.run.tracking.mlflow_tracking_uri:
        yield NullTracker()
        return
    tracker = Tracker(plan)
    try:
        yield tracker
    except BaseException as exc:
        tracker.end_failed(exc)
        raise
    else:
        tracker.end()


class NullTracker:
    """Tracking off: every call does nothing."""

    run_id: str | None = None

    def follow(self, cluster) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def attempt_event(self, event: dict) -> None:
        pass

    def finish(self, result: TrainResult) -> None:
        pass


class Tracker:
    """One MLflow run for one :func:`~sparktf.train.fit`; every call is made on the driver."""

    def __init__(self, plan: RunPlan):
        self.plan = plan
        self.client, experiment_id = connect(plan.run)
        self.uri = tracking_uri(plan.run.tracking.mlflow_tracking_uri)
        train, scaling = plan.train, plan.scaling
        tags = {
            "sparktf.model_dir": plan.run.model_dir,
            "sparktf.data": train.data,
            "sparktf.version": paths.installed_version() or "unknown",
        }
        try:  # MLflow's own context tags: user, source, git commit
            from mlflow.tracking.context.registry import resolve_tags

            tags = resolve_tags(tags)
        except Exception as exc:
            log.debug("MLflow context tags: %s", exc)
        try:
            run = self.client.create_run(
                experiment_id, run_name=f"{train.model}-{scaling.strategy}", tags=tags
            )
        except Exception as exc:
            raise ConfigError(
                f"MLflow tracking store {redact_url(self.uri)} refused a new run: "
                f"{type(exc).__name__}: {scrub(str(exc), self.uri)}"
            ) from None
        self.run_id: str = run.info.run_id
        self._lock = threading.Lock()
        self._last_step: int | None = None
        self._eval_steps: set[int] = set()
        self._marks: dict[str, int] = {}  # events logged, by kind
        self._failures = 0
        self._ended = False
        self._call("log the parameters", lambda: self._log_batch(params=params(plan)))
        log.info(
            "MLflow: run %s in experiment %r at %s",
            self.run_id,
            plan.run.tracking.mlflow_experiment,
            redact_url(self.uri),
        )

    # -- during the run -----------------------------------------------------------------

    @contextlib.contextmanager
    def follow(self, cluster) -> Iterator[None]:
        """Logs the chief's progress and evaluations while the block runs (a thread reads
        the driver's control channel of ``cluster``, a started
        :class:`~sparktf.train.driver.cluster.ClusterRun`), and once more at its end."""
        chief = roles.chief_key(cluster.roles)
        evals_seen = [0]

        def poll() -> None:
            node = cluster.control.snapshot().get(chief)
            if node is None:
                return
            self._progress(node.progress)
            for evaluation in node.evals.since(evals_seen[0]):  # the last ones are kept
                self._evaluation(evaluation)
            evals_seen[0] = node.evals.total

        try:
            with sparkutil.every(
                POLL_INTERVAL_S, lambda: self._call("log progress", poll), "sparktf-mlflow"
            ):
                yield
        finally:
            self._call("log progress", poll)

    def _progress(self, progress: dict) -> None:
        step = progress.get("step")
        if step is None or step == self._last_step:
            return
        values = {k: v for k, v in progress.items() if k not in _NOT_METRICS and _number(v)}
        if values:
            self._log_metrics(values, int(step))
            self._last_step = int(step)

    def _evaluation(self, evaluation: dict) -> None:
        step = int(evaluation["step"])
        if step in self._eval_steps:
            return
        self._log_metrics(
            {f"eval_{k}": v for k, v in evaluation.items() if k != "step" and _number(v)}, step
        )
        self._eval_steps.add(step)

    def attempt_event(self, event: dict) -> None:
        """A restart, shrink or grow between two attempts
        (:mod:`sparktf.train.driver.attempts`): at the step the next attempt resumes from,
        the metrics ``workers`` (its workers) and ``restart_from_step``, and the event as the
        tag ``sparktf.KIND.N`` (the N-th of its kind)."""
        kind, step = event["kind"], int(event["resumed_from_step"])
        count = self._marks[kind] = self._marks.get(kind, 0) + 1
        metrics = {"workers": float(event["to"]), "restart_from_step": float(step)}
        text = f"{kind} from {event['from']} to {event['to']} workers: {event['cause']}"
        tags = {f"sparktf.{kind}.{count}": text[:5000]}
        self._call(f"log a {kind}", lambda: self._log_batch(metrics=metrics, step=step, tags=tags))

    # -- the end ------------------------------------------------------------------------

    def finish(self, result: TrainResult) -> None:
        """The final metrics and evaluations, the exports and the run summary as artifacts,
        their URIs as tags."""
        final = result.final_step

        def metrics() -> None:
            if self._last_step != final and result.metrics:
                self._log_metrics({k: v for k, v in result.metrics.items() if _number(v)}, final)
                self._last_step = final
            for evaluation in result.eval_history:
                self._evaluation(evaluation)
            overall = {
                "run_elapsed_s": result.elapsed_s,
                "run_examples_per_sec": result.examples_per_sec,
                "run_restarts": float(len(result.restarts)),
                "run_resizes": float(len(result.resizes)),
            }
            if result.time_to_first_step_s is not None:
                overall["run_time_to_first_step_s"] = result.time_to_first_step_s
            self._log_metrics(overall, final)

        self._call("log the final metrics", metrics)
        tags = {
            "sparktf.final_step": str(final),
            "sparktf.export": result.export_dir or "",
            "sparktf.checkpoint": result.last_checkpoint or "",
        }
        if result.best_export_dir:
            tags["sparktf.export_best"] = result.best_export_dir
        self._call("tag the results", lambda: self._log_batch(tags=tags))
        for path, name in (
            (result.export_dir, "export"),
            (result.best_export_dir, "export_best"),
        ):
            if path:
                self._call(
                    f"log {path} as the artifact {name}/",
                    lambda p=path, n=name: self._log_dir(p, n),
                )
        summary = storage.join(result.model_dir, RUN_FILE)
        self._call(f"log {summary}", lambda: self._log_file(summary))
        log.info(
            "MLflow: logged run %s (experiment %r at %s)%s",
            self.run_id,
            self.plan.run.tracking.mlflow_experiment,
            redact_url(self.uri),
            f", with the export as artifacts/export ({result.export_dir})"
            if result.export_dir
            else "",
        )

    def end(self) -> None:
        self._terminate("FINISHED")

    def end_failed(self, exc: BaseException) -> None:
        status = "KILLED" if isinstance(exc, KeyboardInterrupt | SystemExit) else "FAILED"
        error = f"{type(exc).__name__}: {exc}"[:_MAX_PARAM_VALUE]
        self._call("tag the error", lambda: self._log_batch(tags={"sparktf.error": error}))
        self._terminate(status)

    def _terminate(self, status: str) -> None:
        if self._ended:
            return
        self._ended = True
        self._call(
            f"end the run ({status})", lambda: self.client.set_terminated(self.run_id, status)
        )

    # -- MLflow calls -------------------------------------------------------------------

    def _call(self, what: str, fn) -> None:
        """Runs one logging call; a failure is a warning (at most a few), never the run's."""
        try:
            with self._lock:
                fn()
        except Exception as exc:
            self._failures += 1
            if self._failures <= 3:
                log.warning(
                    "MLflow (%s): could not %s: %s: %s",
                    redact_url(self.uri),
                    what,
                    type(exc).__name__,
                    scrub(str(exc), self.uri),
                )
            elif self._failures == 4:
                log.warning("MLflow (%s): more failures not logged", redact_url(self.uri))

    def _log_metrics(self, values: dict[str, float], step: int) -> None:
        self._log_batch(metrics=values, step=step)

    def _log_batch(
        self,
        *,
        metrics: dict[str, float] | None = None,
        step: int = 0,
        params: dict[str, str] | None = None,
        tags: dict[str, str] | None = None,
    ) -> None:
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        metric_list = [
            Metric(_key(k), float(v), now, int(step)) for k, v in (metrics or {}).items()
        ]
        param_list = [Param(_key(k), v) for k, v in (params or {}).items()]
        tag_list = [RunTag(k, v) for k, v in (tags or {}).items()]
        for i in range(0, max(len(metric_list), len(param_list), len(tag_list), 1), _BATCH):
            chunk = (metric_list[i : i + _BATCH], param_list[i : i + _BATCH])
            self.client.log_batch(
                self.run_id, metrics=chunk[0], params=chunk[1], tags=tag_list[i : i + _BATCH]
            )

    def _log_dir(self, path: str, name: str) -> None:
        """A directory (local or ``hdfs://``, copied down first) as the artifact ``name/``;
        nothing when it does not lie under the run's model directory."""
        model_dir = self.plan.run.model_dir
        escape = outside_model_dir(path, model_dir)
        if escape:
            log.warning(
                "MLflow: not uploading %s as the artifact %s/: %s is not under the model "
                "directory %s",
                path[:300],
                name,
                escape[:300],
                model_dir,
            )
            return
        started = time.monotonic()
        with storage.local_copy(path) as local:
            self.client.log_artifacts(self.run_id, local, artifact_path=name)
        log.info(
            "MLflow: logged %s as the artifact %s/ (%.1f s)",
            path,
            name,
            time.monotonic() - started,
        )

    def _log_file(self, path: str) -> None:
        if not storage.exists(path):
            return
        with storage.local_copy(path) as local:
            self.client.log_artifact(self.run_id, local)


def outside_model_dir(path: str, model_dir: str) -> str | None:
    """What of ``path`` lies outside ``model_dir``: ``path`` itself, a symbolic link inside a
    local ``path`` that leads out, or None when all of it is inside."""
    if not within(path, model_dir, resolve=True):
        return path
    if storage.parse(path).scheme != "file":
        return None
    for top, dirs, files in os.walk(storage.parse(path).path):
        for entry in dirs + files:
            full = os.path.join(top, entry)
            if os.path.islink(full) and not within(full, model_dir, resolve=True):
                return full
    return None


def params(plan: RunPlan) -> dict[str, str]:
    """The run's MLflow parameters: its layout and length, and the model's effective config
    (``model_config.<key>``). Unset settings (None) are left out."""
    train, scaling, run = plan.train, plan.scaling, plan.run
    config = model_config(plan)
    optimizer = config.get("optimizer")
    out: dict[str, Any] = {
        "model": train.model,
        "dataset": plan.data.dataset,
        "data": train.data,
        "split": train.split,
        "train_rows": plan.data.rows,
        "eval_split": plan.eval_data.split if plan.eval_data else "none",
        "input_mode": train.input_mode,
        "file_format": train.file_format if train.input_mode == "files" else None,
        "strategy": scaling.strategy,
        "num_workers": scaling.num_workers,
        "num_ps": scaling.num_ps_tasks,
        "ps_on_driver": scaling.ps_on_driver if scaling.strategy == "ps" else None,
        "num_executors": scaling.num_executors,
        "gpus_per_worker": scaling.gpus_per_worker,
        "threads_per_worker": scaling.threads_per_worker,
        "batch_size": plan.global_batch,
        "per_process_batch": plan.per_process_batch,
        "steps": plan.target_steps,
        "steps_per_epoch": plan.steps_per_epoch,
        "epochs": train.epochs,
        "learning_rate": config.get("learning_rate"),
        "lr_schedule": config.get("lr_schedule"),
        "optimizer": optimizer.get("name") if isinstance(optimizer, dict) else optimizer,
        "shuffle": train.shuffle,
        "seed": train.seed,
        "warm_start_from": train.warm_start_from,
        "checkpoint_every_steps": run.checkpoint.every_steps,
        "eval_every_steps": plan.eval_every_steps if plan.eval_data else None,
        "export_best": run.evaluation.export_best,
        "max_restarts": run.failure.max_restarts,
        **{f"model_config.{k}": v for k, v in config.items()},
    }
    return {k: _param_value(v) for k, v in out.items() if v is not None}


def model_config(plan: RunPlan) -> dict[str, Any]:
    """The model's full config for this run (its defaults with the run's overrides)."""
    from sparktf import models

    try:
        return dict(models.get_task(plan.train.model, **plan.model_config).config)
    except Exception as exc:  # the plan was built from it: not expected
        log.debug("the model config of %s: %s", plan.train.model, exc)
        return dict(plan.model_config)


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    return text[:_MAX_PARAM_VALUE]


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _key(name: str) -> str:
    return _BAD_KEY.sub("_", str(name))


__all__ = [
    "INSTALL_HINT",
    "NullTracker",
    "Tracker",
    "check",
    "connect",
    "outside_model_dir",
    "params",
    "require_mlflow",
    "track",
    "tracking_uri",
]
