"""Per-process credentials on the control channel (sparktf.train.wire.control) and the paths a
result may name (sparktf.train.result, sparktf.train.driver.tracking).

Every TensorFlow process has a token of its own, handed out by the reservation server in its
sealed answer to the node's registration; the control server maps it to the process: a token
speaks only for its own process, only the chief's may report ``done``, the run's token (in
the feeding tasks' closure) may only ``peek``. A result naming a path outside the model
directory is refused, and MLflow uploads nothing from outside it.
"""

from __future__ import annotations

import json
import os
import secrets
import urllib.error

import pytest

from sparktf.train.errors import TrainingError
from sparktf.train.result import ProcessResult, ResultRejected, within
from sparktf.train.wire import control as control_lib
from sparktf.train.wire import reservation
from sparktf.train.wire.control import ControlClient, ControlServer

pytestmark = pytest.mark.unit

LOOPBACK = "127.0.0.1"
CHIEF, WORKER = "executor-0", "executor-1"


@pytest.fixture
def server():
    srv = ControlServer(LOOPBACK)
    srv.publish_plans(
        {
            CHIEF: {"name": "chief:0", "role": "chief", "index": 0},
            WORKER: {"name": "worker:0", "role": "worker", "index": 0},
        }
    )
    try:
        yield srv
    finally:
        srv.close()


def status(client: ControlClient, event: str, data: dict | None = None) -> int:
    try:
        client.post(event, data, timeout=5.0)
    except urllib.error.HTTPError as exc:
        return exc.code
    return 200


def test_only_the_chiefs_token_reports_done(server, caplog):
    chief = ControlClient(server.url, server.issue_token(CHIEF), CHIEF)
    worker = ControlClient(server.url, server.issue_token(WORKER), WORKER)
    assert status(worker, "done", {"final_step": 99, "export_dir": "/etc"}) == 403
    assert server.snapshot()[WORKER].done is None
    assert "only the chief reports done" in caplog.text
    # A worker's own end of its part is "finished"; its report is kept as its own.
    assert status(worker, "finished", {"final_step": 5}) == 200
    assert server.snapshot()[WORKER].done == {"final_step": 5}
    assert status(chief, "done", {"final_step": 5}) == 200
    assert server.snapshot()[CHIEF].done == {"final_step": 5}


def test_a_token_speaks_only_for_its_own_process(server, caplog):
    worker_token = server.issue_token(WORKER)
    server.issue_token(CHIEF)
    # The worker's token naming the chief: refused, nothing recorded for either.
    assert status(ControlClient(server.url, worker_token, CHIEF), "done", {"x": 1}) == 403
    assert status(ControlClient(server.url, worker_token, CHIEF), "beat") == 403
    assert server.snapshot()[CHIEF].done is None and server.snapshot()[CHIEF].pid is None
    assert "the token of executor-1 used for 'executor-0'" in caplog.text
    # One token per process: the first registration wins.
    with pytest.raises(ValueError, match="already has a control token"):
        server.issue_token(CHIEF)


def test_forged_and_other_runs_tokens_are_refused(server):
    other = ControlServer(LOOPBACK)
    try:
        other_chief = other.issue_token(CHIEF)
        for token in (other_chief, other.token, secrets.token_hex(16), "", "x" * 5000):
            assert status(ControlClient(server.url, token, CHIEF), "done", {"a": 1}) == 403
            assert status(ControlClient(server.url, token, CHIEF), "hello") == 403
        assert server.snapshot()[CHIEF].done is None
    finally:
        other.close()
    # The run's own token (the feeding tasks') may peek, nothing else.
    run = ControlClient(server.url, server.token, CHIEF)
    assert status(run, "peek") == 200
    for event in ("hello", "beat", "error", "done", "finished", "bye"):
        assert status(run, event) == 403, event
    assert server.snapshot()[CHIEF].error is None


def test_the_reservation_answer_hands_each_node_its_own_token(server):
    secret = secrets.token_bytes(32)
    auth = reservation.AuthServer(
        2,
        secret=secret,
        bind_host=LOOPBACK,
        issue_token=lambda meta: server.issue_token(f"executor-{int(meta['executor_id'])}"),
    )
    auth.start()
    tokens = []
    try:
        for executor in (0, 1):
            client = reservation.AuthClient(auth.address, secret=secret)
            assert client.register({"executor_id": executor, "job_name": "x"}) == "OK"
            tokens.append(control_lib.issued_token())
            client.close()
        assert tokens[0] and tokens[1] and tokens[0] != tokens[1]
        # The tokens are not in what every node fetches (the reservation list).
        assert not any(t in json.dumps(auth.reservations.get()) for t in tokens)
        # A second registration of an executor is refused: no second token for it.
        control_lib.keep_issued_token(None)
        client = reservation.AuthClient(auth.address, secret=secret)
        with pytest.raises(reservation.ReservationError, match="refused"):
            client.register({"executor_id": 0, "job_name": "x"})
        client.close()
        assert control_lib.issued_token() is None
    finally:
        auth.stop()
        control_lib.keep_issued_token(None)
    chief = ControlClient(server.url, tokens[0], CHIEF)
    worker = ControlClient(server.url, tokens[1], WORKER)
    assert status(chief, "done", {"final_step": 1}) == 200
    assert status(worker, "done", {"final_step": 1}) == 403


# ----------------------------------------------------------------------------- paths


def _result(**paths) -> dict:
    return {"start_step": 0, "final_step": 3, "end_reason": "steps", **paths}


@pytest.mark.parametrize(
    "path",
    [
        "/etc",
        "/data/model-other/export/1",
        "/data/model/../secrets",
        "/data/model/export/../../x",
        "file:///home/user/.ssh",
        "hdfs://nn:8020/data/model/export/1",
        "s3://bucket/data/model/export/1",
        "relative/export",
        "/data/model\n/export",
    ],
)
def test_a_result_naming_a_path_outside_the_model_dir_is_refused(path):
    for field in ("export_dir", "last_checkpoint", "best_export"):
        with pytest.raises(ResultRejected, match="not under the run's model directory") as err:
            ProcessResult.from_dict(_result(**{field: path}), model_dir="/data/model")
        assert isinstance(err.value, TrainingError)


def test_paths_under_the_model_dir_are_accepted():
    local = ProcessResult.from_dict(
        _result(
            export_dir="/data/model/export/3",
            last_checkpoint="file:///data/model/checkpoints/ckpt-3",
            best_export="/data/model/export_best/3",
        ),
        model_dir="/data/model/",
    )
    assert local.export_dir == "/data/model/export/3"
    hdfs = "hdfs://nn:8020/runs/m"
    remote = ProcessResult.from_dict(
        _result(export_dir=f"{hdfs}/export/3", last_checkpoint=f"{hdfs}/checkpoints/ckpt-3"),
        model_dir=hdfs,
    )
    assert remote.last_checkpoint == f"{hdfs}/checkpoints/ckpt-3"
    assert not within("hdfs://other:8020/runs/m/export/3", hdfs)
    assert not within("hdfs://nn:8020/runs/m2/export/3", hdfs)


class _Recorder:
    """MLflow's client as the tracker calls it: records the uploads."""

    def __init__(self):
        self.uploads: list[tuple] = []

    def log_artifacts(self, run_id, local, artifact_path=None):
        self.uploads.append(("dir", local, artifact_path))

    def log_artifact(self, run_id, local):
        self.uploads.append(("file", local))


def _tracker(model_dir: str):
    from types import SimpleNamespace

    from sparktf.train.driver import tracking

    tracker = object.__new__(tracking.Tracker)
    tracker.plan = SimpleNamespace(run=SimpleNamespace(model_dir=model_dir))
    tracker.client, tracker.run_id = _Recorder(), "run"
    return tracker


def test_mlflow_uploads_nothing_from_outside_the_model_dir(tmp_path, caplog):
    model_dir = tmp_path / "model"
    (model_dir / "export" / "1").mkdir(parents=True)
    (model_dir / "export" / "1" / "saved_model.pb").write_bytes(b"pb")
    secret_dir = tmp_path / "private"
    secret_dir.mkdir()
    (secret_dir / "id_rsa").write_text("key")
    tracker = _tracker(str(model_dir))

    for outside in (str(secret_dir), f"{model_dir}/../private", "hdfs://nn:8020/private"):
        tracker._log_dir(outside, "export")
    assert tracker.client.uploads == []
    assert caplog.text.count("MLflow: not uploading") == 3

    # A symbolic link inside the model directory that leads out: refused too.
    os.symlink(secret_dir, model_dir / "export" / "link")
    tracker._log_dir(str(model_dir / "export" / "link"), "export")
    os.symlink(secret_dir, model_dir / "export" / "1" / "keys")
    tracker._log_dir(str(model_dir / "export" / "1"), "export")
    assert tracker.client.uploads == []

    os.unlink(model_dir / "export" / "1" / "keys")
    tracker._log_dir(str(model_dir / "export" / "1"), "export")
    assert [u[0] for u in tracker.client.uploads] == ["dir"]
