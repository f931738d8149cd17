"""S3 end to end: ``scripts/s3.sh`` started, only what it prints exported, and a user's
program (tests/s3_fit_job.py) whose Spark writes and reads Parquet on S3 through Hadoop's S3A
connector and whose ``fit(data=df)`` trains from it with the model directory on S3; no
process's command line holds the secret key meanwhile. A first run, its chief killed while it
publishes the export, leaves nothing predict's reader takes for complete; the rerun
publishes. A wrong secret key fails before
training, within 30 s, naming the endpoint and the bucket, and writes nothing. And
``scripts/submit.sh`` runs convert, train (files input), evaluate and predict with every path
on S3, the dataset and outputs committed (their marker last)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import sysconfig
import threading
import time
from pathlib import Path

import psutil
import pytest

from sparktf import storage
from sparktf.inference.saved_model import resolve_export
from tests import helpers
from tests.conftest import ROOT, S3_SH

pytestmark = pytest.mark.e2e

JOB = ROOT / "tests" / "s3_fit_job.py"


def _cmdline_scan(secret: str, stop: threading.Event, found: list[str]) -> None:
    """Every process's command line, again and again until ``stop``: those holding
    ``secret`` go to ``found``."""
    while not stop.wait(0.5):
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if secret.encode() in cmdline:
                found.append(cmdline.replace(b"\0", b" ").decode(errors="replace")[:200])


def _run(env: dict[str, str], *args: str) -> dict:
    out = helpers.run_command([sys.executable, JOB, *args], env=env, cwd=ROOT, timeout=500)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no result:\n{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    return json.loads(lines[-1])


@pytest.mark.skipif(
    not any(Path(ROOT, ".local", "hadoop").glob("s3a-*/hadoop-aws-*.jar")),
    reason="no S3A connector: scripts/setup.sh fetches it",
)
def test_fit_from_s3_parquet_into_an_s3_model_dir_with_only_what_s3_sh_prints(
    tmp_path, monkeypatch
):
    args = ["--dir", tmp_path / "store"]
    out = helpers.run_command([S3_SH, "start", *args], timeout=120)
    assert out.returncode == 0, out.stderr
    try:
        printed = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update({k: v for k, v in printed.items() if k.startswith("AWS_")})
        env.update(SPARKTF_LOG_LEVEL="INFO", PYTHONPATH=str(ROOT))
        base = f"{printed['S3_URI']}/fit"
        for key, value in printed.items():  # this process reads the store as the user
            if key.startswith("AWS_"):
                monkeypatch.setenv(key, value)

        # The chief killed (SIGKILL) while it publishes the export: the run fails, and what
        # it left is refused by predict's reader, naming the missing marker.
        killed = _run(env, base, "--kill-in-export")
        assert "SIGKILL" in killed.get("error", ""), killed
        with pytest.raises(storage.NotCommittedError, match=storage.COMMIT_MARKER):
            resolve_export(f"{base}/model")

        # The rerun (the same model directory) resumes, publishes, and cleans what was left.
        stop, found = threading.Event(), []
        scan = threading.Thread(
            target=_cmdline_scan, args=(printed["AWS_SECRET_ACCESS_KEY"], stop, found)
        )
        scan.start()
        try:
            result = _run(env, base)
        finally:
            stop.set()
            scan.join()
        assert "error" not in result, result["error"]
        assert found == [], "the secret key on a command line"
        assert result["rows"] == 512 and result["final_step"] == 2 * 512 // 32
        files = {f.removeprefix(f"{base}/model/") for f in result["files"]}
        assert {"sparktf_train.json", "checkpoints/checkpoint"} <= files
        assert result["export"] == f"{base}/model/export/{result['final_step']}"
        assert f"export/{result['final_step']}/{storage.COMMIT_MARKER}" in files
        assert not [f for f in files if "/." in f], "no temporary copy, no lock left"
        assert resolve_export(f"{base}/model") == result["export"]
        assert any(f.startswith("events/train/events.out.tfevents") for f in files)

        # A wrong secret key: refused before anything is trained or written.
        wrong = {**env, "AWS_SECRET_ACCESS_KEY": "W" * 40}
        elsewhere = f"{printed['S3_URI']}/refused"
        started = time.monotonic()
        refused = _run(wrong, elsewhere, "--in-memory")
        assert "error" in refused, refused
        assert refused["took"] < 30, refused
        assert printed["AWS_ENDPOINT_URL"] in refused["error"]
        assert storage.parse(printed["S3_URI"]).netloc in refused["error"]
        assert "W" * 40 not in refused["error"]
        assert time.monotonic() - started < 400
        assert not storage.exists(elsewhere), "nothing written with the refused key"
    finally:
        stop_out = helpers.run_command([S3_SH, "stop", *args], timeout=60)
        assert stop_out.returncode == 0
    assert not [
        p
        for p in psutil.process_iter(["cmdline"])
        if str(tmp_path) in " ".join(p.info["cmdline"] or ())
    ]


@pytest.mark.skipif(
    not any(Path(ROOT, ".local", "hadoop").glob("s3a-*/hadoop-aws-*.jar")),
    reason="no S3A connector: scripts/setup.sh fetches it",
)
@pytest.mark.timeout(1200)  # four applications, a killed one and its rerun: 413-607 s here
def test_submit_convert_train_evaluate_predict_all_on_s3(tmp_path, monkeypatch):
    """scripts/submit.sh as the README runs it, every path on S3: convert (a small
    MNIST-format input), train (all-reduce, files input), evaluate, predict; no command
    line of any process (spark-submit's JVMs included) holds the secret key. A first
    conversion, killed (kill -9, the whole job) once it has written to the store, leaves
    nothing a reader takes for complete, and the rerun publishes. TensorFlow's event reader
    (what TensorBoard reads with) finds the run's scalars and ``saved_model_cli`` loads the
    export, each after a local copy."""
    from sparktf.datasets.synthetic import write_mnist

    args = ["--dir", tmp_path / "store"]
    out = helpers.run_command([S3_SH, "start", *args], timeout=120)
    assert out.returncode == 0, out.stderr
    stop, found = threading.Event(), []
    try:
        printed = dict(line.split("=", 1) for line in out.stdout.splitlines() if "=" in line)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        env.update({k: v for k, v in printed.items() if k.startswith("AWS_")})
        base = f"{printed['S3_URI']}/chain"
        write_mnist(tmp_path / "raw", n_train=200, n_test=20)
        submit = ROOT / "scripts" / "submit.sh"
        steps = {
            "convert": [
                "jobs/convert_mnist.py",
                "--input",
                tmp_path / "raw",
                "--shards",
                "2",
                "--output",
                f"{base}/data",
            ],
            "train": [
                "jobs/train_mnist.py",
                "--data",
                f"{base}/data",
                "--model-dir",
                f"{base}/model",
                "--steps",
                "4",
                "--strategy",
                "allreduce",
                "--num-workers",
                "2",
            ],
            "evaluate": [
                "jobs/evaluate.py",
                "--export",
                f"{base}/model/export",
                "--data",
                f"{base}/data",
                "--split",
                "test",
                "--output",
                f"{base}/eval.json",
            ],
            "predict": [
                "jobs/predict.py",
                "--export",
                f"{base}/model/export",
                "--input",
                f"{base}/data/test/parquet",
                "--output",
                f"{base}/predictions",
            ],
        }
        scan = threading.Thread(
            target=_cmdline_scan, args=(printed["AWS_SECRET_ACCESS_KEY"], stop, found)
        )
        scan.start()
        for key, value in printed.items():
            if key.startswith("AWS_"):
                monkeypatch.setenv(key, value)
        _kill_a_conversion_once_it_writes(submit, steps["convert"], env, base)
        for name, argv in steps.items():
            ran = helpers.run_command([submit, *argv], env=env, cwd=ROOT, timeout=400)
            assert ran.returncode == 0, f"{name}:\n{ran.stdout[-3000:]}\n{ran.stderr[-3000:]}"
        stop.set()
        scan.join()
        assert found == [], "the secret key on a command line"
        data = {f.removeprefix(f"{base}/data/") for f in storage.walk_files(f"{base}/data")}
        assert {
            storage.COMMIT_MARKER,
            "manifest.json",
            "train/tfrecord/part-00000.tfrecord",
        } <= data
        assert not [f for f in data if "_temporary" in f or ".tmp-" in f]
        storage.require_committed(f"{base}/model/export/4")
        metrics = json.loads(storage.read_text(f"{base}/eval.json"))
        assert metrics["examples"] == 20 and metrics["model_version"] == 4
        storage.require_committed(f"{base}/predictions")
        parts = [f for f in storage.walk_files(f"{base}/predictions") if f.endswith(".parquet")]
        import pyarrow.parquet as pq

        rows = sum(pq.read_table(storage.open_file(p)).num_rows for p in parts)
        assert rows == 20
        assert [f for f in storage.walk_files(base) if ".tmp-" in f] == []  # all cleaned up
        _read_locally_as_tools_do(f"{base}/model", tmp_path / "copies")
    finally:
        stop.set()
        stop_out = helpers.run_command([S3_SH, "stop", *args], timeout=60)
        assert stop_out.returncode == 0


def _kill_a_conversion_once_it_writes(submit: Path, argv: list, env: dict, base: str) -> None:
    """Starts the conversion to ``base``/data and kills its whole job with SIGKILL once it
    has written data to the store (more than its publish lock); then nothing there reads as
    a complete dataset. The rerun takes the lock of the dead job over."""
    from sparktf.storage import NotCommittedError

    job = subprocess.Popen(
        [str(submit), *map(str, argv)], env=env, cwd=ROOT, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        while not [o for o in storage.walk_files(base) if not o.endswith("publish-lock")]:  # data
            assert job.poll() is None, f"the conversion ended ({job.returncode}) before writing"
            assert time.monotonic() < deadline, "the conversion wrote nothing in 300 s"
            time.sleep(0.1)
    finally:
        os.killpg(job.pid, signal.SIGKILL)
        job.wait(60)
    left = storage.walk_files(base)
    print(f"a killed conversion left {len(left)} objects: {left[:5]}")
    assert not storage.exists(f"{base}/data")  # not a dataset: refused as missing...
    if storage.walk_files(f"{base}/data"):  # ...or, killed while put in place, refused as such
        with pytest.raises(NotCommittedError, match="is not committed"):
            storage.require_committed(f"{base}/data")


def _read_locally_as_tools_do(model_dir: str, copies: Path) -> None:
    """The run's event files and its export, copied from S3 to local files, read with
    TensorFlow's event reader and ``saved_model_cli``: TensorBoard and the TensorFlow tools
    read no ``s3://`` paths without tensorflow-io."""
    import tensorflow as tf

    storage.copy_tree(f"{model_dir}/events/train", f"file://{copies}/events")
    tags = set()
    for path in sorted((copies / "events").glob("events.out.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            tags.update(value.tag for value in event.summary.value)
    assert "examples_per_sec" in tags and any("loss" in tag for tag in tags), tags
    storage.copy_tree(f"{model_dir}/export/4", f"file://{copies}/export")
    cli = Path(sys.executable).parent / "saved_model_cli"
    shown = helpers.run_command(
        [cli, "show", "--dir", copies / "export", "--tag_set", "serve",
         "--signature_def", "serving_default"], timeout=120,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert "The given SavedModel SignatureDef contains the following input(s)" in shown.stdout


PROBE = """
import json, sys
from pyspark.sql import SparkSession
spark = SparkSession.builder.getOrCreate()
seen = spark.sparkContext.parallelize(range(2), 2).map(lambda _: __import__("sys").executable)
print(json.dumps({"driver": sys.executable, "executors": seen.collect()}))
spark.stop()
"""


@pytest.mark.skipif(
    not any(Path(ROOT, ".local", "hadoop").glob("s3a-*/hadoop-aws-*.jar")),
    reason="no S3A connector: scripts/setup.sh fetches it",
)
def test_the_shipped_environment_goes_up_to_s3_once_and_the_executors_run_from_it(s3, tmp_path):
    """``sparktf submit --ship-env`` with ``spark.sparktf.shipEnv.dir`` on S3: the packed
    environment goes up once, named by its sha256, spark-submit gets its ``s3://`` copy, and
    the executors' Python runs from what Spark unpacked from there. A small venv stands in
    for the driver's (packing this one takes a minute): its ``sitecustomize`` reaches this
    venv's packages, which it does not ship."""
    from sparktf.console import shipenv

    base = getattr(sys, "_base_executable", None) or sys.executable
    venv = tmp_path / "venv"
    subprocess.run([base, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next(venv.glob("lib/python*/site-packages"))
    ours = sysconfig.get_paths()["purelib"]
    (site / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({ours!r})\n")
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    envs = s3.fresh("envs")
    env = {
        **os.environ,
        "SPARKTF_HOME": str(tmp_path / "home"),
        "SPARKTF_PYTHON": str(venv / "bin" / "python"),
        "SPARKTF_SPARK_SUBMIT": str(Path(sys.executable).parent / "spark-submit"),
        "PYTHONPATH": str(ROOT),
    }
    submit = [sys.executable, "-m", "sparktf", "submit", "--ship-env"]
    submit += ["--conf", f"spark.sparktf.shipEnv.dir={envs}"]
    submit += ["--master", "local-cluster[1,1,1024]", "--conf", "spark.task.maxFailures=1"]

    dry = helpers.run_command([*submit, "--dry-run", probe], env=env, cwd=ROOT, timeout=300)
    assert dry.returncode == 0, dry.stderr[-3000:]
    archive = next((tmp_path / "home" / "envs").glob("env-*.tar.gz"))
    digest = shipenv.content_digest(archive)
    copy = f"{envs}/env-{digest[:32]}.tar.gz"
    assert storage.listdir(envs) == [copy]
    assert f"{copy}#environment" in dry.stdout, dry.stdout

    out = helpers.run_command([*submit, probe], env=env, cwd=ROOT, timeout=300)
    assert out.returncode == 0, out.stderr[-5000:]
    assert f"environment on the cluster: {copy} (sha256 checked)" in out.stderr
    seen = json.loads([line for line in out.stdout.splitlines() if line.startswith("{")][-1])
    assert seen["driver"] == env["SPARKTF_PYTHON"]
    assert [Path(p).parts[-3:] for p in seen["executors"]] == [
        ("environment", "bin", "python")
    ] * 2, seen
    assert storage.listdir(envs) == [copy]  # used again, nothing else left there
    storage.delete(envs, recursive=True)
