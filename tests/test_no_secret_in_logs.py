"""No secret of a run in any log, at DEBUG: a short ps run fed by Spark on the session's
local-cluster, with sparktf and TensorFlowOnSpark logging everything they log. The secrets
are those the run actually used, read from its own objects (the real classes, wrapped to keep
what they make): the reservation start-up's secret, every control token the control server
issued (and the run's own), every TensorFlowOnSpark manager's authkey, and whatever the
driver drew from :mod:`secrets` during the run. Each is searched, raw and in hex, base64 and
``repr`` forms, in every driver log record, in the driver's own output (the driver's
parameter servers write there) and in every executor's stdout and stderr files. Py4J's
logger starts at DEBUG as in a fresh job: its command dump carries the task closures.
"""

from __future__ import annotations

import base64
import logging
import secrets
from contextlib import contextmanager
from pathlib import Path

import pytest

from sparktf.security import redact
from tests.helpers import assert_nothing_left

pytestmark = pytest.mark.integration


class Records(logging.Handler):
    """Every record the driver logs, formatted with its traceback."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))

    def emit(self, record):
        self.lines.append(self.format(record))


@pytest.fixture
def spied(monkeypatch):
    """The run's secrets, kept as its objects make them."""
    from sparktf.train.driver import bringup
    from sparktf.train.wire import control

    found: dict[str, list] = {"drawn": [], "startups": [], "servers": [], "issued": [], "nodes": []}
    for name in ("token_bytes", "token_hex", "token_urlsafe"):
        real = getattr(secrets, name)

        def draw(*args, _real=real, **kwargs):
            value = _real(*args, **kwargs)
            found["drawn"].append(value)
            return value

        monkeypatch.setattr(secrets, name, draw)

    real_startup = bringup.authenticated_startup

    @contextmanager
    def startup(*args, **kwargs):
        with real_startup(*args, **kwargs) as made:
            found["startups"].append(made)
            yield made

    monkeypatch.setattr(bringup, "authenticated_startup", startup)
    real_init = control.ControlServer.__init__

    def init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        found["servers"].append(self)

    monkeypatch.setattr(control.ControlServer, "__init__", init)
    if hasattr(control.ControlServer, "issue_token"):
        real_issue = control.ControlServer.issue_token

        def issue(self, *args, **kwargs):
            token = real_issue(self, *args, **kwargs)
            found["issued"].append(token)
            return token

        monkeypatch.setattr(control.ControlServer, "issue_token", issue)
    real_start = bringup.TfosCluster.start

    def start(self, *args, **kwargs):
        nodes = real_start(self, *args, **kwargs)
        found["nodes"].extend(nodes)
        return nodes

    monkeypatch.setattr(bringup.TfosCluster, "start", start)
    return found


def run_secrets(found: dict) -> dict[str, bytes | str]:
    """Each secret the run used, by a name that says where it came from."""
    named: dict[str, bytes | str] = {}
    for i, made in enumerate(found["startups"]):
        for attr, value in vars(made).items():
            if isinstance(value, bytes):
                named[f"reservation start-up {i} {attr}"] = value
    for i, server in enumerate(found["servers"]):
        for attr, value in vars(server).items():
            if "token" in attr and isinstance(value, str):
                named[f"control server {i} {attr}"] = value
    for i, token in enumerate(found["issued"]):
        named[f"issued control token {i}"] = token
    for node in found["nodes"]:
        named[f"authkey of executor {node['executor_id']}"] = bytes(node["authkey"])
    for i, value in enumerate(found["drawn"]):
        if len(value) >= 16:
            named[f"drawn from secrets {i}"] = value
    return named


def search_forms(secret: bytes | str) -> set[str]:
    """``redact.secret_forms`` and the base64 of the secret inside a longer base64 text
    (a pickled closure in Py4J's command dump): its stable part at each of the 3 offsets."""
    raw = secret if isinstance(secret, bytes) else secret.encode()
    forms = set(redact.secret_forms(secret))
    for offset in range(3):
        encoded = base64.b64encode(b"\0" * offset + raw).decode()
        start, end = (0, 2, 3)[offset], (offset + len(raw)) // 3 * 4
        forms.add(encoded[start:end])
    return {form for form in forms if len(form) >= 8}


def executor_logs(sc) -> list[Path]:
    """The stdout and stderr files of this application's executors (local-cluster keeps them
    in SPARK_HOME/work/APP/EXECUTOR)."""
    import os

    import pyspark

    homes = {Path(pyspark.__file__).parent}
    if os.environ.get("SPARK_HOME"):
        homes.add(Path(os.environ["SPARK_HOME"]))
    return sorted(
        path
        for home in homes
        for path in (home / "work" / sc.applicationId).glob("*/std*")
        if path.is_file()
    )


def test_a_debug_run_logs_none_of_its_secrets(spark, mnist_data, tmp_path, spied, capfd):
    from sparktf.train import RunConfig, ScalingConfig, TrainConfig, fit

    records = Records()
    root = logging.getLogger()
    level, tfos = root.level, logging.getLogger("tensorflowonspark")
    tfos_level = tfos.level
    root.addHandler(records)
    root.setLevel(logging.DEBUG)
    tfos.setLevel(logging.NOTSET)  # not quieted by an earlier run: its lines must show
    py4j = logging.getLogger("py4j")
    py4j_level = py4j.level
    py4j.setLevel(logging.NOTSET)  # as in a job at DEBUG before the run quiets it
    try:
        result = fit(
            TrainConfig(
                model="mnist_mlp",
                data=str(mnist_data / "data"),
                input_mode="spark",
                steps=3,
                batch_size=8,
                model_config={"hidden_units": 8},
            ),
            ScalingConfig(
                strategy="ps", num_workers=1, num_ps=1, ps_on_driver=True, threads_per_worker=1
            ),
            RunConfig(
                model_dir=str(tmp_path / "model"),
                failure={"failure_timeout_s": 60.0, "feed_timeout_s": 60.0},
            ),
            spark=spark,
        )
    finally:
        root.removeHandler(records)
        root.setLevel(level)
        tfos.setLevel(tfos_level)
        py4j.setLevel(py4j_level)
    assert result.final_step == 3
    assert_nothing_left()

    named = run_secrets(spied)
    kinds = " ".join(named)
    assert "reservation start-up" in kinds and "authkey of executor" in kinds
    assert "control server" in kinds
    assert len([k for k in named if k.startswith("authkey")]) == 2
    driver = "\n".join(records.lines)
    assert "DEBUG sparktf" in driver  # the run did log at DEBUG
    # the nodes TensorFlowOnSpark registered were logged, their authkeys redacted
    nodes = [line for line in records.lines if "TensorFlowOnSpark node" in line]
    assert len(nodes) == 2 and all("'authkey': '<redacted>'" in line for line in nodes), nodes
    captured = capfd.readouterr()
    texts = {"driver log records": driver, "driver output": captured.out + captured.err}
    logs = executor_logs(spark.sparkContext)
    assert len([p for p in logs if p.name == "stderr"]) == 2, logs
    blobs = {str(p): p.read_bytes() for p in logs}
    leaks = []
    for name, secret in named.items():
        forms = search_forms(secret)
        raw = secret if isinstance(secret, bytes) else secret.encode()
        for where, text in texts.items():
            leaks += [f"{name} ({form!r}) in {where}" for form in forms if form in text]
        for where, blob in blobs.items():
            found = [form for form in forms if form.encode() in blob]
            if raw in blob:
                found.append("raw bytes")
            leaks += [f"{name} ({form!r}) in {where}" for form in found]
    assert not leaks, "\n".join(leaks)


def test_a_local_session_authenticates_its_rpc_with_a_secret_no_command_line_shows(spark):
    """The local profile's session has Spark's RPC authentication on (another user of the
    machine could otherwise reach the driver's ports and read the task closures), with a
    fresh secret that no process's command line carries."""
    import psutil

    conf = spark.sparkContext.getConf()
    assert conf.get("spark.authenticate") == "true"
    secret = conf.get("spark.authenticate.secret", "")
    assert len(secret) >= 32, "no secret of the application's own"
    shown = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        if secret in " ".join(proc.info["cmdline"] or []):
            shown.append(proc.info["pid"])
    assert shown == [], f"the secret is on the command line of {shown}"
    assert spark.range(4).repartition(2).count() == 4  # the executors authenticate too
