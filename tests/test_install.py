"""sparktf as a user gets it: the wheel installed into a fresh venv outside the checkout, and
the mission's own command, ``spark-submit jobs/train_resnet.py``, as written.

The fresh venv takes its third-party packages from the tested environment (a ``.pth`` line
naming its site-packages: the same locked versions, not a second 2 GB install); sparktf itself,
its configuration and its ``sparktf`` command come only from the wheel. A ``.pth`` line is not
a site directory, so the checkout's editable install is not seen there.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

from sparktf.datasets.synthetic import write_mnist
from tests import helpers
from tests.conftest import ROOT

pytestmark = pytest.mark.e2e

# What the wheel is built from: the files a source distribution would carry.
SOURCES = ("pyproject.toml", "README.md", "LICENSE", "sparktf", "conf")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SPARKTF_", "PYTHON"))}
    env.update(TF_CPP_MIN_LOG_LEVEL="2", **extra)
    return env


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A fresh venv with sparktf's wheel installed: the path of its ``bin``."""
    base = tmp_path_factory.mktemp("install")
    source = base / "source"
    source.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "hadoop", "*.egg-info")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=ignore)
        else:
            shutil.copy2(ROOT / name, source / name)
    wheels = base / "wheels"
    built = helpers.run_command(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q"]
        + ["--disable-pip-version-check", "-w", wheels, source],
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-3000:]
    (wheel,) = wheels.glob("sparktf-*.whl")

    venv = base / "venv"
    base_python = getattr(sys, "_base_executable", sys.executable)
    made = helpers.run_command([base_python, "-m", "venv", "--without-pip", venv], timeout=120)
    assert made.returncode == 0, made.stderr
    (packages,) = venv.glob("lib/python3.*/site-packages")
    (packages / "tested-stack.pth").write_text(site.getsitepackages()[0] + "\n")
    install = helpers.run_command(
        [venv / "bin" / "python", "-m", "pip", "install", "--no-deps", "--no-index", "-q"]
        + ["--disable-pip-version-check", wheel],
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-3000:]
    return venv / "bin"


def test_the_wheel_carries_its_configuration_and_command(installed, tmp_path):
    home = tmp_path / "home"
    env = _env(HOME=str(home), XDG_DATA_HOME="")
    where = helpers.run_command(
        [installed / "python", "-c", "import sparktf, sparktf.paths as p; "
         "print(sparktf.__file__); print(p.default_conf_dir()); print(p.home()); "
         "print(p.source_checkout())"],
        cwd=tmp_path, env=env, timeout=60,
    )  # fmt: skip
    assert where.returncode == 0, where.stderr
    module, conf, state, checkout = where.stdout.split()
    packages = str(installed.parent / "lib")
    assert module.startswith(packages) and conf.startswith(packages)
    assert (Path(conf) / "spark" / "local.conf").is_file()
    assert os.access(Path(conf) / "spark" / "gpu_discovery.sh", os.X_OK)
    assert state == str(home / ".local" / "share" / "sparktf") and checkout == "None"

    version = helpers.run_command([installed / "sparktf", "--version"], env=env, timeout=60)
    assert version.returncode == 0 and version.stdout.startswith("sparktf 0."), version.stderr
    help_text = helpers.run_command([installed / "sparktf", "--help"], env=env, timeout=60)
    assert "train-resnet" in help_text.stdout and str(home) in help_text.stdout
    meta = helpers.run_command(
        [installed / "python", "-c", "from importlib.metadata import metadata as m; "
         "d = m('sparktf'); print(d['License']); print(*d.get_all('Classifier'), sep='\\n')"],
        env=env, timeout=60,
    )  # fmt: skip
    assert meta.stdout.splitlines()[0] == "Apache-2.0"
    assert "License :: OSI Approved :: Apache Software License" in meta.stdout.splitlines()


def test_convert_train_predict_with_the_sparktf_command(installed, tmp_path):
    """From a temporary directory, with nothing of the checkout on the path: convert MNIST,
    train it (2 all-reduce workers, through ``sparktf submit``), predict the test split."""
    work = tmp_path / "work"
    work.mkdir()
    write_mnist(work / "raw", n_train=100, n_test=20)
    env = _env(SPARKTF_HOME=str(tmp_path / "state"), PATH=f"{installed}:{os.environ['PATH']}")
    # spark-submit comes with pyspark, in the tested environment's bin
    env["PATH"] += f":{Path(sys.executable).parent}"

    def sparktf(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        run = helpers.run_command(
            [installed / "sparktf", *args], cwd=work, env=env, timeout=timeout
        )
        assert run.returncode == 0, f"sparktf {' '.join(args)}:\n{run.stderr[-4000:]}"
        return run

    planned = sparktf("submit", "--dry-run", "train_mnist", "--num-workers", "2").stdout
    # the driver and the executors run the fresh venv's python; nothing points at the checkout
    assert f"spark.pyspark.python={installed / 'python'}" in planned
    # (spark-submit itself is the tested environment's, which lives in the checkout)
    assert [word for word in shlex.split(planned)[1:] if str(ROOT) in word] == []
    assert "local-cluster[3,1,1024]" in planned

    sparktf("convert", "mnist", "--input", "raw", "--output", "data", "--shards", "2")
    assert json.loads((work / "data" / "manifest.json").read_text())["splits"]["train"]
    sparktf(
        "submit", "train_mnist", "--strategy", "allreduce", "--num-workers", "2",
        "--steps", "3", "--batch-size", "20", "--data", "data", "--model-dir", "model",
        "--result-json", "result.json",
    )  # fmt: skip
    result = json.loads((work / "result.json").read_text())
    assert (result["final_step"], result["strategy"]) == (3, "allreduce")
    assert Path(result["export_dir"], "saved_model.pb").is_file()
    assert not (tmp_path / "state" / "submit").exists() or not any(
        (tmp_path / "state" / "submit").iterdir()
    )  # the launcher's scratch is gone

    sparktf("predict", "--export", "model", "--input", "data/test/parquet", "--output", "preds")
    import pyarrow.parquet as pq

    table = pq.read_table(work / "preds")
    assert table.num_rows == 20 and {"prediction", "label"} <= set(table.column_names)


@pytest.mark.full  # not in CI (pyproject.toml): a plain spark-submit trains in test_kerberos in CI
def test_spark_submit_jobs_train_resnet_as_written(tmp_path):
    """``spark-submit jobs/train_resnet.py --steps 5`` with the venv's spark-submit, whose
    default master (local[*]) has no executors: the job runs on a local-cluster sized to it."""
    env = _env(PATH=f"{Path(sys.executable).parent}:{os.environ['PATH']}")
    result = tmp_path / "result.json"
    run = helpers.run_command(
        ["spark-submit", "jobs/train_resnet.py", "--steps", "5"]
        + ["--model-dir", tmp_path / "model", "--result-json", result],
        cwd=ROOT, env=env, timeout=540,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-4000:]
    # (spark-submit passes the Python driver's log on to its stdout)
    said = "master local[*] has no executors: using local-cluster[2,1,1024]"
    assert said in run.stdout + run.stderr
    trained = json.loads(result.read_text())
    assert (trained["final_step"], trained["strategy"]) == (5, "allreduce")
    assert Path(trained["export_dir"], "saved_model.pb").is_file()
    helpers.assert_nothing_left()


def test_a_script_that_never_stops_its_session_ends_quietly(tmp_path):
    """A user's script builds its session through sparktf, uses the executors and ends
    without ``spark.stop()``: no WARN or ERROR from executors relaunched while the JVM shuts
    down (the session is stopped before Python exits)."""
    script = tmp_path / "no_stop.py"
    script.write_text(
        "from sparktf.spark import get_session\n"
        "spark = get_session('no-stop')\n"
        "print(spark.sparkContext.parallelize(range(100), 4).map(lambda x: x * 2).sum())\n"
    )
    # the JVM inherits stderr: the run's output ends when the JVM's does
    run = helpers.run_command([sys.executable, script], cwd=tmp_path, env=_env(), timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == "9900"
    noise = [line for line in run.stderr.splitlines() if " WARN " in line or " ERROR " in line]
    assert noise == [], "\n".join(noise[:20])


def test_a_job_whose_executors_cannot_start_fails_naming_their_first_error(tmp_path):
    """Every executor JVM dies at start (here a -javaagent that does not exist; on a cluster
    a missing Kerberos configuration or jar): Spark would relaunch them for as long as the
    job runs. The job fails within 2 minutes, naming the executor's first error, and leaves
    no executor behind."""
    import time

    import psutil

    write_mnist(tmp_path / "raw", n_train=16, n_test=8)
    started = time.monotonic()
    run = helpers.run_command(
        [ROOT / "scripts" / "submit.sh", "--conf",
         "spark.executor.extraJavaOptions=-javaagent:/nonexistent/agent.jar",
         "jobs/convert_mnist.py", "--input", tmp_path / "raw", "--output", tmp_path / "out"],
        cwd=ROOT, env=_env(), timeout=180,
    )  # fmt: skip
    output = run.stdout + run.stderr  # (the Python driver's log comes through its stdout)
    assert run.returncode == 1, output[-3000:]
    assert time.monotonic() - started < 120
    said = [line for line in output.splitlines() if "ERROR sparktf:" in line]
    assert len(said) == 1 and "ExecutorStartError" in said[0], output[-3000:]
    assert "/nonexistent/agent.jar" in said[0] and "launches died" in said[0]
    assert not (tmp_path / "out").exists()
    time.sleep(2)
    left = [p for p in psutil.process_iter(["cmdline"]) if "agent.jar" in str(p.info["cmdline"])]
    assert left == []
