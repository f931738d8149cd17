"""A real Spark standalone cluster (scripts/spark-cluster.sh) and the jobs on it through
``scripts/submit.sh --profile standalone``, as a user runs them.

One cluster for the module: Spark's own Master and three Workers (1 core, 1 GiB each) on
127.0.0.1, in a private directory under the test's tmp dir; stopped at the end, also when a test
fails, and no JVM of it may remain. On it: convert a tiny synthetic MNIST to the session HDFS,
train with ps (chief + worker + ps on executors, fed by Spark) and with all-reduce (two workers
reading their files), then batch prediction with the all-reduce export. Each job must exit 0 and
show up at the master as a finished application with exactly the cores it needs. Spark's
transport is protected throughout: the cluster's daemons and every application share the
secret spark-cluster.sh made (private, never on a command line), and the applications ran
with authentication, RPC and I/O encryption on.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from sparktf import spark, storage
from sparktf.datasets.synthetic import write_mnist
from tests import helpers
from tests.test_transport import app_settings, assert_transport_protected, event_log_conf

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent
CLUSTER_SH = ROOT / "scripts" / "spark-cluster.sh"
SUBMIT_SH = ROOT / "scripts" / "submit.sh"
N_TRAIN, N_TEST = 64, 16


def cluster_jvms(directory: Path) -> list[int]:
    """Pids of live JVMs of the cluster in ``directory`` (its daemons carry the tag)."""
    import psutil

    tag = f"-Dsparktf.spark.cluster={directory}"
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and tag in (proc.info["cmdline"] or []):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def cluster_sh(*args: str, timeout: float = 300, env=None) -> subprocess.CompletedProcess:
    return helpers.run_command([CLUSTER_SH, *args], timeout=timeout, env=env)


def master_state(webui: str) -> dict:
    with urllib.request.urlopen(webui + "/json/", timeout=10) as reply:
        return json.load(reply)


def parse_env(text: str) -> dict[str, str]:
    return dict(line.split("=", 1) for line in text.splitlines() if "=" in line)


def test_the_default_cluster_runs_the_readme_commands_as_written(tmp_path):
    """``scripts/spark-cluster.sh start`` with its defaults (2 workers of 1 core and 1g), then
    the README's ``scripts/submit.sh --profile standalone jobs/train_mnist.py ...``: the
    profile's executors (4 cores, 8g) are sized to what the workers offer. A run the cluster
    cannot hold fails within seconds with the numbers, through submit.sh and through a plain
    spark-submit. (First in the module: the module's own cluster is not up yet.)"""
    env = {
        **os.environ,
        "SPARKTF_HOME": str(tmp_path / "home"),
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
    }
    env.pop("SPARKTF_SPARK_CLUSTER_DIR", None)
    directory = tmp_path / "home" / "spark-cluster"

    def command(*args, timeout: float = 600):
        return helpers.run_command(args, cwd=tmp_path, env=env, timeout=timeout)

    try:
        started = command(CLUSTER_SH, "start", timeout=300)
        assert started.returncode == 0, started.stderr[-3000:]
        webui = parse_env(started.stdout)["SPARK_MASTER_WEBUI_URL"]
        run = command(
            SUBMIT_SH, "--profile", "standalone", ROOT / "jobs" / "train_mnist.py",
            "--strategy", "allreduce", "--num-workers", "2", "--steps", "20",
            "--result-json", tmp_path / "result.json",
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-4000:]
        sized = (
            "each executor asks 4 cores and 8g; the 2 ALIVE workers offer 1 core and 1g each: "
            "using 1 core and 1g per executor"
        )
        assert sized in run.stderr
        result = json.loads((tmp_path / "result.json").read_text())
        assert (result["final_step"], result["strategy"]) == (20, "allreduce")
        assert (tmp_path / ".local" / "runs" / "mnist_mlp").is_dir()  # the job's default, here
        apps = master_state(webui)["completedapps"]
        assert [a["cores"] for a in apps if a["name"] == "sparktf-train-mnist_mlp"] == [2]

        too_many = (
            "--strategy",
            "allreduce",
            "--num-workers",
            "3",
            "--batch-size",
            "30",
            "--steps",
            "1",
        )
        clock = time.monotonic()
        refused = command(SUBMIT_SH, "--profile", "standalone", ROOT / "jobs" / "train_mnist.py",
                          *too_many)  # fmt: skip
        assert refused.returncode == 2, refused.stderr[-3000:]
        assert time.monotonic() - clock < 30
        assert "the 2 ALIVE workers offer 1 core and 1g each: 2 of the 3 executors" in (
            refused.stderr
        )
        master = parse_env(started.stdout)["SPARK_MASTER_URL"]
        clock = time.monotonic()
        secret_conf = parse_env(started.stdout)["SPARK_SECRET_FILE"]
        assert secret_conf == str(directory / "secret.conf")
        plain = command(
            "spark-submit", "--master", master, "--conf", "spark.driver.host=127.0.0.1",
            "--properties-file", secret_conf,  # the cluster's secret, as its help says
            "--executor-memory", "1g", ROOT / "jobs" / "train_mnist.py", *too_many,
            "--model-dir", tmp_path / "refused",
        )  # fmt: skip
        assert plain.returncode != 0
        assert time.monotonic() - clock < 90  # not the 120 s registration wait
        said = plain.stdout + plain.stderr
        error = [line for line in said.splitlines() if "ERROR sparktf" in line]
        assert error, said[-3000:]
        assert error[-1].endswith(
            "the run needs 3 task slots: each executor asks 1 core and 1g; the 2 ALIVE "
            "workers offer 1 core and 1g each: 2 of the 3 executors the run needs fit"
        ), error[-1]
    finally:
        stopped = command(CLUSTER_SH, "stop", timeout=120)
        assert stopped.returncode == 0, stopped.stderr
        assert cluster_jvms(directory) == []


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    directory = tmp_path_factory.mktemp("spark-cluster") / "cluster"
    args = ["--workers", "3", "--cores", "1", "--memory", "1g", "--dir", str(directory)]
    try:
        started = cluster_sh("start", *args)
        assert started.returncode == 0, started.stderr[-3000:]
        values = parse_env(started.stdout)
        secret = {"SPARKTF_SPARK_SECRET_FILE": values["SPARK_SECRET_FILE"]}
        yield {"dir": directory, "args": args, "secret_env": secret, **values}
    finally:
        stopped = cluster_sh("stop", "--dir", str(directory), timeout=120)
        leftovers = cluster_jvms(directory)
        assert stopped.returncode == 0, stopped.stderr
        assert leftovers == []
        status = cluster_sh("status", "--dir", str(directory))
        assert status.returncode == 3 and "not running" in status.stdout
        assert not (directory / "secret.conf").exists()  # the secret goes with the cluster


def submit(*args: str, env: dict | None = None, timeout: float = 600):
    """scripts/submit.sh --profile standalone ARGS with small executors, as a user would
    (the cluster's secret from ``env``'s SPARKTF_SPARK_SECRET_FILE or its master.env)."""
    run = helpers.run_command(
        [
            SUBMIT_SH,
            "--profile",
            "standalone",
            "--executor-cores",
            "1",
            "--executor-memory",
            "1g",
            "--conf",
            "spark.ui.enabled=false",
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})},
    )
    assert run.returncode == 0, run.stderr[-4000:]
    return run


def finished_apps(cluster) -> list[dict]:
    deadline = time.monotonic() + 30
    while True:  # the master moves an application to completedapps shortly after it ends
        state = master_state(cluster["SPARK_MASTER_WEBUI_URL"])
        if not state["activeapps"] or time.monotonic() > deadline:
            return state["completedapps"]
        time.sleep(1)


def spark_secret(cluster) -> str:
    """The cluster's shared secret (its secret.conf)."""
    return spark.read_secret(cluster["SPARK_SECRET_FILE"])


def executor_stderrs(cluster, app_id: str) -> list[Path]:
    """The stderr files of an application's executors (the workers' work directories)."""
    found = sorted((cluster["dir"] / "work").glob(f"worker-*/{app_id}/*/stderr"))
    assert found, f"no executor logs of {app_id}"
    return found


def assert_ran_on_cluster(cluster, name: str, cores: int) -> None:
    apps = [a for a in finished_apps(cluster) if a["name"] == name]
    assert apps, f"{name} is not among the master's finished applications"
    assert apps[-1]["state"] == "FINISHED" and apps[-1]["cores"] == cores


@pytest.fixture(scope="module")
def mnist_on_cluster(cluster, hdfs, tmp_path_factory):
    """A tiny synthetic MNIST, raw files uploaded to HDFS and converted there on the cluster
    (the master's URL taken from the master.env that spark-cluster.sh wrote)."""
    base = hdfs.fresh("standalone")
    raw = tmp_path_factory.mktemp("standalone-raw")
    write_mnist(raw, n_train=N_TRAIN, n_test=N_TEST, gzip=True)
    storage.copy_tree(str(raw), storage.join(base, "raw"))
    data = storage.join(base, "mnist")
    run = submit(
        "jobs/convert_mnist.py",
        "--input",
        storage.join(base, "raw"),
        "--output",
        data,
        "--shards",
        "2",
        env={"SPARKTF_SPARK_CLUSTER_DIR": str(cluster["dir"])},
    )
    assert f"master {cluster['SPARK_MASTER_URL']}" in run.stderr
    assert_ran_on_cluster(cluster, "sparktf-convert-mnist", cores=3)
    try:
        yield {"base": base, "data": data}
    finally:
        storage.delete(base)


def test_cluster_is_private_on_loopback_and_starts_once(cluster):
    import psutil

    directory = cluster["dir"]
    assert cluster["SPARK_MASTER_URL"].startswith("spark://127.0.0.1:")
    assert (directory.stat().st_mode & 0o777) == 0o700
    for name in ("master.log", "worker-1.log", "worker-3.log"):
        assert (directory / "logs" / name).is_file()
    state = master_state(cluster["SPARK_MASTER_WEBUI_URL"])
    assert state["status"] == "ALIVE" and state["url"] == cluster["SPARK_MASTER_URL"]
    assert [w["state"] for w in state["workers"]] == ["ALIVE"] * 3
    assert state["cores"] == 3 and state["memory"] == 3 * 1024
    jvms = cluster_jvms(directory)
    assert len(jvms) == 4  # master + 3 workers
    for pid in jvms:  # every port the daemons listen on is on loopback
        for addr in helpers.listening(pid):
            assert addr.ip in ("127.0.0.1", "::ffff:127.0.0.1"), (pid, addr)

    # the shared secret: private files only, on no daemon's command line
    secret = (directory / "secret.conf").read_text().split("spark.authenticate.secret")[1]
    secret = secret.split()[0]
    assert len(secret) == 64
    for name in ("secret.conf", "conf/spark-defaults.conf"):
        assert ((directory / name).stat().st_mode & 0o777) == 0o600, name
        assert secret in (directory / name).read_text()
    for pid in jvms:
        assert secret not in " ".join(psutil.Process(pid).cmdline())
    for log in (directory / "logs").iterdir():
        assert secret not in log.read_text(errors="replace"), log

    status = cluster_sh("status", "--dir", str(directory))
    assert status.returncode == 0 and "3 of 3 workers ALIVE" in status.stdout
    again = cluster_sh("start", *cluster["args"])  # harmless: the same cluster, no new JVM
    assert again.returncode == 0 and "already running" in again.stderr
    assert parse_env(again.stdout)["SPARK_MASTER_URL"] == cluster["SPARK_MASTER_URL"]
    assert sorted(cluster_jvms(directory)) == sorted(jvms)


def test_cluster_script_rejects_bad_input_and_stops_idempotently(tmp_path):
    bad = cluster_sh("start", "--workers", "0", "--dir", str(tmp_path / "c"))
    assert bad.returncode == 2 and "--workers must be a positive integer" in bad.stderr
    bad = cluster_sh("start", "--memory", "lots", "--dir", str(tmp_path / "c"))
    assert bad.returncode == 2 and "--memory must look like" in bad.stderr
    unknown = cluster_sh("start", "--nodes", "2")
    assert unknown.returncode == 2 and "unknown option --nodes" in unknown.stderr
    stopped = cluster_sh("stop", "--dir", str(tmp_path / "c"))
    assert stopped.returncode == 0 and "not running" in stopped.stdout
    status = cluster_sh("status", "--dir", str(tmp_path / "c"))
    assert status.returncode == 3 and "not running" in status.stdout
    help_ = cluster_sh("--help")
    assert help_.returncode == 0 and "SPARK_MASTER_URL" in help_.stdout
    assert "start-worker --worker N" in help_.stdout
    which = cluster_sh("start-worker", "--dir", str(tmp_path / "c"))
    assert which.returncode == 2 and "start-worker needs --worker N" in which.stderr
    lost = cluster_sh("start-worker", "--worker", "1", "--dir", str(tmp_path / "c"))
    assert lost.returncode == 1 and "no running cluster" in lost.stderr


def train_on_cluster(
    cluster, mnist_on_cluster, tmp_path, name, *args, strategy, input_mode, cores, env=None
):
    """Trains mnist_mlp 4 steps with submit.sh (``args``: more submit/job arguments) and
    checks what a user would: spark.cores.max sized to the run, the job's result, the export
    on HDFS and the application FINISHED on the master with ``cores`` cores. Returns the
    export directory."""
    model_dir = storage.join(mnist_on_cluster["base"], f"model-{name}")
    result = tmp_path / "result.json"
    events = tmp_path / "events"
    events.mkdir()
    run = submit(
        *event_log_conf(events),
        *args,
        "--data",
        mnist_on_cluster["data"],
        "--strategy",
        strategy,
        "--input-mode",
        input_mode,
        "--steps",
        "4",
        "--batch-size",
        "16",
        "--eval-split",
        "none",
        "--model-dir",
        model_dir,
        "--result-json",
        str(result),
        env=env,
    )
    assert f"spark.cores.max={cores}" in run.stderr
    # the application ran with Spark's transport protected; the run said nothing about it
    settings = app_settings(events)
    assert_transport_protected(settings)
    assert settings.get("spark.authenticate.secret", "").endswith("(redacted)")
    assert "transport is not protected" not in run.stdout + run.stderr
    secret = spark_secret(cluster)
    for stderr in executor_stderrs(cluster, settings["spark.app.id"]):
        text = stderr.read_text(errors="replace")
        assert "-Dspark.authenticate=true" in text and "-Dspark.network.crypto.enabled=true" in text
        assert secret not in text
    assert secret not in run.stdout + run.stderr
    summary = json.loads(result.read_text())
    assert (summary["final_step"], summary["strategy"], summary["input_mode"]) == (
        4,
        strategy,
        input_mode,
    )
    export = storage.join(model_dir, "export", "4")
    assert summary["export_dir"] == export
    assert storage.exists(storage.join(export, "saved_model.pb"))
    assert_ran_on_cluster(cluster, "sparktf-train-mnist_mlp", cores=cores)
    return export


@pytest.mark.full  # not in CI (pyproject.toml): ps fed by Spark trains on local-cluster in CI
def test_ps_training_fed_by_spark_on_the_cluster(cluster, mnist_on_cluster, tmp_path):
    """chief + worker + ps, each on its own executor: submit.sh sizes spark.cores.max to 3."""
    config = json.loads((ROOT / "conf" / "jobs" / "train_mnist.json").read_text())
    config["ps_on_driver"] = False  # the ps runs on an executor, as on a real cluster
    (tmp_path / "ps.json").write_text(json.dumps(config))
    train_on_cluster(
        cluster,
        mnist_on_cluster,
        tmp_path,
        "ps",
        "jobs/train_mnist.py",
        "--config",
        str(tmp_path / "ps.json"),
        "--num-workers",
        "1",
        "--num-ps",
        "1",
        strategy="ps",
        input_mode="spark",
        cores=3,
        env={"SPARKTF_SPARK_MASTER": cluster["SPARK_MASTER_URL"], **cluster["secret_env"]},
    )
    # the executors' logs (served by the workers' UI) hold no manager authkey
    logs = [p for p in (cluster["dir"] / "work").rglob("stderr") if p.is_file()]
    assert logs and not [p for p in logs if "'authkey'" in p.read_text(errors="replace")]


@pytest.mark.full  # not in CI (pyproject.toml): the README command trains on this cluster in CI
def test_allreduce_training_from_files_then_predict_on_the_cluster(
    cluster, mnist_on_cluster, tmp_path
):
    export = train_on_cluster(
        cluster,
        mnist_on_cluster,
        tmp_path,
        "allreduce",
        "--master",
        cluster["SPARK_MASTER_URL"],
        "jobs/train_mnist.py",
        "--num-workers",
        "2",
        strategy="allreduce",
        input_mode="files",
        cores=2,
        env=cluster["secret_env"],
    )

    output = storage.join(mnist_on_cluster["base"], "predictions")
    submit(
        "--master",
        cluster["SPARK_MASTER_URL"],
        "jobs/predict.py",
        "--export",
        export,
        "--input",
        storage.join(mnist_on_cluster["data"], "test"),
        "--output",
        output,
        env=cluster["secret_env"],
    )
    assert_ran_on_cluster(cluster, "sparktf-predict", cores=3)
    import pyarrow.parquet as pq

    with storage.local_copy(output) as local:
        table = pq.read_table(local)
    assert table.num_rows == N_TEST
    assert sorted(table.column("id").to_pylist()) == list(range(N_TEST))
    assert set(table.column("prediction").to_pylist()) <= set(range(10))


SESSION_SCRIPT = """
import json, sys, time
from sparktf.spark import get_session, registered_executors
from sparktf.train import RunConfig, ScalingConfig, TrainConfig, fit
# the profile's executors (4 cores, 8g) are shrunk to what the workers offer (1 core, 1g)
spark = get_session(
    "sparktf-session", profile="standalone", overrides={"spark.cores.max": "3"}
)
conf = dict(spark.sparkContext.getConf().getAll())
total = spark.sparkContext.parallelize(range(10), 2).sum()
keys = ("spark.authenticate", "spark.network.crypto.enabled", "spark.io.encryption.enabled")
said = {"sum": total, **{key: conf.get(key) for key in keys}}
data, model_dir = sys.argv[1:3]
deadline = time.monotonic() + 60
while registered_executors(spark.sparkContext) < 3 and time.monotonic() < deadline:
    time.sleep(0.5)
said["executors"] = registered_executors(spark.sparkContext)
result = fit(
    TrainConfig(model="mnist_mlp", data=data, steps=4, batch_size=16, input_mode="files"),
    ScalingConfig(strategy="allreduce", num_workers=2, threads_per_worker=1),
    RunConfig(model_dir=model_dir),
    spark=spark,
)
said["result"] = {"final_step": result.final_step, "processes": result.processes}
spark.stop()
print(json.dumps(said))
"""


def test_a_session_from_plain_python_joins_the_protected_cluster(
    cluster, mnist_on_cluster, tmp_path
):
    """get_session(profile="standalone") outside spark-submit: the cluster of master.env, the
    transport settings on, and the secret handed to the JVM in a private file (the master
    and its workers accept nothing else). The profile's executors are shrunk to what the
    workers offer, so the session gets its 3 executors, one more than the all-reduce run it
    then trains with ``fit``: the run takes two of them."""
    script = tmp_path / "session.py"
    script.write_text(SESSION_SCRIPT)
    env = {
        **os.environ,
        "SPARKTF_SPARK_CLUSTER_DIR": str(cluster["dir"]),
        "PYTHONPATH": str(ROOT),
        "TF_CPP_MIN_LOG_LEVEL": "2",
    }
    model_dir = storage.join(mnist_on_cluster["base"], "model-session")
    command = [sys.executable, script, mnist_on_cluster["data"], model_dir]
    run = helpers.run_command(command, cwd=tmp_path, env=env, timeout=400)
    assert run.returncode == 0, run.stderr[-3000:]
    said = json.loads(run.stdout.strip().splitlines()[-1])
    result = said.pop("result")
    assert said == {"sum": 45, "executors": 3, **{k: "true" for k in spark.TRANSPORT_SETTINGS}}
    assert result["final_step"] == 4
    executors = {where["executor"] for where in result["processes"].values()}
    assert sorted(result["processes"]) == ["chief:0", "worker:0"] and len(executors) == 2
    assert spark_secret(cluster) not in run.stdout + run.stderr
    assert_ran_on_cluster(cluster, "sparktf-session", cores=3)
    assert "using 1 core and 1g per executor" in run.stderr
