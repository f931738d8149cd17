"""The README as written: every command of its Running jobs, Training and Spark ML sections
and every Python example (From Python, Batch inference, Spark ML) runs here, on the test HDFS
with ``--steps 2``-style limits, so the README and the code cannot drift apart: a command
added to those sections is run here too (the Training commands and the Spark ML example's in
the full suite; CI parses them into whole runs: ``pytest -m full``, docs/development.md).
The two commands of its first section are the quickstart (its training and summary run in
:func:`test_quickstart_trains_a_model_that_learned`, which also checks that the model
learned) and ``scripts/test.sh`` (this suite).

The commands are read from the README itself. What the test changes, and only that:
``hdfs://127.0.0.1:8020`` and ``hdfs://nn:8020`` become a fresh directory of the test HDFS (one
per section), ``/data/cifar-10-binary.tar.gz`` a small synthetic archive, and a training
command gets ``--steps 2`` and a ``--result-json`` (and a ``--model-dir`` in the test's
directory where it has none, so an earlier run cannot turn it into a resume). The Training
section's first command, the embedded default, is the quickstart's training: it runs as
written, to the end, in :func:`test_quickstart_trains_a_model_that_learned`. Also here: the
README's links lead somewhere, its picture has its source, and the ``--help`` of every script
and benchmark.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shlex
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

from sparktf import storage
from sparktf.datasets.conversion import convert
from sparktf.datasets.synthetic import write_cifar10, write_raw
from tests import helpers

pytestmark = pytest.mark.unit  # tests of another tier carry their own mark

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
README_HOSTS = ("hdfs://127.0.0.1:8020", "hdfs://nn:8020")
README_ARCHIVE = "/data/cifar-10-binary.tar.gz"
ML_SECTION = "Spark ML pipelines and your own models"
PYTHON_SECTION = "From Python"
QUICKSTART_TRAINING = ["./scripts/submit.sh", "jobs/train_resnet.py"]


def section_blocks(text: str, title: str) -> list[tuple[str, str]]:
    """The fenced code blocks (language, body) of the ``## title`` section (its ###
    subsections included, up to the next ``##``)."""
    match = re.search(rf"^## {re.escape(title)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    if match is None:
        raise AssertionError(f"README has no '## {title}' section")
    return re.findall(r"^```(\w*)\n(.*?)^```", match.group(1), re.M | re.S)


def shell_commands(body: str) -> list[list[str]]:
    """The commands of a bash block: continuation lines joined, comments dropped."""
    joined = body.replace("\\\n", " ")
    return [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip()]


def test_section_blocks_and_commands_parse():
    text = (
        "## A\nx\n```bash\n./a --b c \\\n    --d e   # note\n```\n"
        "### Sub\n```python\np()\n```\n## B\n```\nz\n```\n"
    )
    blocks = section_blocks(text, "A")
    assert [lang for lang, _ in blocks] == ["bash", "python"]
    assert shell_commands(blocks[0][1]) == [["./a", "--b", "c", "--d", "e"]]
    with pytest.raises(AssertionError, match="no '## C' section"):
        section_blocks(text, "C")


def test_readme_sections_hold_only_commands_this_test_runs():
    """Each command is a ``scripts/submit.sh`` job that exists; the one Python block is the
    batch-inference example. (So a new kind of command makes this test say so.)"""
    text = README.read_text()
    for title in ("Running jobs", "Training"):
        commands = [c for lang, b in section_blocks(text, title) for c in shell_commands(b)]
        assert commands, title
        for command in commands:
            assert command[0] == "./scripts/submit.sh", command
            assert (ROOT / command[1]).is_file(), command
    for title in ("Batch inference", PYTHON_SECTION):
        assert [lang for lang, _ in section_blocks(text, title)] == ["python"], title
    blocks = section_blocks(text, ML_SECTION)
    assert [lang for lang, _ in blocks] == ["bash", "python"]
    for command in shell_commands(blocks[0][1]):
        assert command[:2] == [".venv/bin/python", "examples/tabular_pipeline.py"], command


def _localise(command: list[str], prefix: str, archive: Path) -> list[str]:
    out = []
    for arg in command:
        for host in README_HOSTS:
            arg = arg.replace(host, prefix)
        out.append(arg.replace(README_ARCHIVE, str(archive)))
    return out


def _run(command: list[str], tmp_path: Path, index: int) -> dict | None:
    """Runs one README command; returns a training job's result JSON."""
    job = Path(command[1]).stem
    result_file = None
    if job.startswith("train"):
        result_file = tmp_path / f"result-{index}.json"
        command = [*command, "--steps", "2", "--result-json", str(result_file)]
        if not any(arg.startswith("--model-dir") for arg in command):
            command += ["--model-dir", str(tmp_path / f"model-{index}")]
    run = helpers.run_command(
        command,
        cwd=ROOT,
        timeout=600,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="2"),
    )
    assert run.returncode == 0, f"{shlex.join(command)}\n{run.stderr[-4000:]}"
    # The quiet console: Spark's own INFO lines are off, sparktf's progress is there (under
    # spark-submit the Python driver's log reaches the console through its stdout).
    console = run.stdout + run.stderr
    assert not re.search(r"^\d\d/\d\d/\d\d [\d:]+ INFO ", console, re.M), console[:2000]
    assert " INFO sparktf" in console
    return json.loads(result_file.read_text()) if result_file else None


def _training_commands(text: str) -> list[list[str]]:
    """The Training section's commands but the embedded default, which is the quickstart's
    training: it runs as written, to the end, in test_quickstart_trains_a_model_that_learned."""
    training = [c for _, b in section_blocks(text, "Training") for c in shell_commands(b)]
    assert QUICKSTART_TRAINING in training
    training.remove(QUICKSTART_TRAINING)
    return training


def test_readme_training_commands_are_complete_runs_as_written():
    """Each Training command, as written, parses into a whole run with its job's flags and
    defaults (conf/jobs/): a flag the job lacks or a setting it requires (a model directory)
    fails here, in seconds. Both strategies and both input modes are among them. (They run,
    two steps each, in test_readme_training_commands_run_as_written.)"""
    from sparktf import cli
    from sparktf.jobs import train as train_job
    from sparktf.jobs.catalog import JOBS

    seen = set()
    for command in _training_commands(README.read_text()):
        job = JOBS[Path(command[1]).stem]
        assert job.module == "train", command
        options = dict(job.options)
        parser = train_job.parser(job.description, options["section"], options.get("default_model"))
        args = cli.parse(parser, command[2:], own_logging=False)
        train, scaling, run = train_job.configs(args)  # a usage error names what is missing
        assert run.model_dir and train.data, command
        assert train_job.executors_needed(options["section"], command[2:]), command
        seen.add((scaling.strategy, train.input_mode))
    assert {("allreduce", "files"), ("ps", "spark")} <= seen, seen


@pytest.mark.e2e
# not in CI (pyproject.toml): the test above parses these commands, and their jobs,
# strategies and input modes train in CI (the Running jobs chain, test_train)
@pytest.mark.full
@pytest.mark.timeout(1800)
def test_readme_training_commands_run_as_written(spark, hdfs, tmp_path):
    """The Training section's commands, each its own Spark application, two steps, two at a
    time, on the datasets they name (CIFAR-format and PTB, made first)."""
    write_cifar10(tmp_path / "raw", n_train=160, n_test=64, archive=True)
    archive = tmp_path / "raw" / "cifar-10-binary.tar.gz"
    prefix = hdfs.fresh("readme-train")
    convert("cifar10", str(tmp_path / "raw"), f"{prefix}/datasets/cifar10", spark=spark)
    write_raw("ptb", tmp_path / "raw-ptb", n_train=6000, n_test=600)
    convert("ptb", str(tmp_path / "raw-ptb"), f"{prefix}/datasets/ptb", spark=spark)
    training = _training_commands(README.read_text())
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        trained = [
            (command, pool.submit(_run, _localise(command, prefix, archive), tmp_path, i))
            for i, command in enumerate(training, start=100)
        ]
        seen = set()
        for command, future in trained:
            result = future.result()
            assert result["final_step"] == 2, command
            seen.add((result["strategy"], result["input_mode"]))
    assert {("allreduce", "files"), ("ps", "spark")} <= seen


@pytest.mark.e2e
@pytest.mark.timeout(2700)  # five applications and two trainings in the session
def test_readme_commands_run_as_written(spark, hdfs, tmp_path):
    """The Running jobs chain and the Spark ML example run as written, each its own Spark
    application, one at a time; then the Python blocks on what they made.
    (The Training commands: the two tests above.)"""
    text = README.read_text()
    write_cifar10(tmp_path / "raw", n_train=160, n_test=64, archive=True)
    archive = tmp_path / "raw" / "cifar-10-binary.tar.gz"
    # From Python: the CIFAR-format dataset it names, made first.
    train_prefix = hdfs.fresh("readme-train")
    convert("cifar10", str(tmp_path / "raw"), f"{train_prefix}/datasets/cifar10", spark=spark)

    jobs_prefix = hdfs.fresh("readme-jobs")
    chain = [c for _, b in section_blocks(text, "Running jobs") for c in shell_commands(b)]
    (bash, python) = [body for _, body in section_blocks(text, ML_SECTION)]

    def running_jobs() -> list:  # convert -> train -> predict -> evaluate, each on the last
        return [
            _run(_localise(command, jobs_prefix, archive), tmp_path, index)
            for index, command in enumerate(chain)
        ]

    for result in running_jobs():
        assert result is None or result["final_step"] == 2
    # The Spark ML example's command parses into a whole run with the example's own flags;
    # its run() trains on this session in test_ml (test_tabular_pipeline_example_trains_...),
    # and the command as written, its own application, runs in the full suite
    # (test_readme_ml_example_runs_as_written).
    for command in shell_commands(bash):
        with helpers.imported_example(ROOT / command[1], "readme_ml_example") as example:
            args = example.parser().parse_args(command[2:])
        assert args.demo_rows and args.csv and args.model_dir and args.output, command

    # Running jobs: what each command left for the next.
    assert storage.exists(f"{jobs_prefix}/models/resnet20/export")
    predictions = spark.read.parquet(f"{jobs_prefix}/predictions/resnet20")
    assert predictions.count() == 64
    metrics = json.loads(storage.read_bytes(f"{jobs_prefix}/eval/resnet20.json"))
    assert metrics["examples"] == 64 and 0.0 <= metrics["accuracy"] <= 1.0

    # Batch inference: the README's Python block, on the model and data made above.
    (block,) = [body for _, body in section_blocks(text, "Batch inference")]
    for host in README_HOSTS:
        block = block.replace(host, jobs_prefix)
    exec(compile(block, "README.md (Batch inference)", "exec"), {"spark": spark})
    written = spark.read.parquet(f"{jobs_prefix}/predictions/resnet20-top3")
    assert written.count() == 64
    assert {"id", "label", "prediction", "probability"} <= set(written.columns)

    # From Python: fit and predict on this session, on the CIFAR-format data made above.
    (block,) = [body for _, body in section_blocks(text, PYTHON_SECTION)]
    for host in README_HOSTS:
        block = block.replace(host, train_prefix)
    fitted: dict = {}
    exec(compile(block, f"README.md ({PYTHON_SECTION})", "exec"), fitted)
    assert fitted["spark"] is spark  # get_session() returned the active session
    assert fitted["result"].final_step >= 1 and fitted["result"].export_dir
    assert fitted["scored"].count() == 64
    assert {"id", "label", "prediction"} <= set(fitted["scored"].columns)

    # Spark ML: the Python block on a small 3-class table with the columns it names.
    ml_prefix = hdfs.fresh("readme-ml")
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 3, 240)
    points = rng.normal(size=(240, 4)) + 4.0 * np.eye(3, 4)[labels]
    rows = [(i, int(y), *map(float, x)) for i, (y, x) in enumerate(zip(labels, points))]
    table = spark.createDataFrame(rows, ["id", "label", "x1", "x2", "x3", "x4"])
    for host in README_HOSTS:
        python = python.replace(host, ml_prefix)
    scope = {"train_df": table.filter("id < 180"), "test_df": table.filter("id >= 180")}
    exec(compile(python, f"README.md ({ML_SECTION})", "exec"), scope)
    scored = scope["scored"].toPandas()
    assert len(scored) == 60
    assert (scored["prediction"] == scored["label"]).mean() > 0.8  # chance: 1/3

    # The quickstart's closing summary: its "predict with this export" command, as printed,
    # is the Running jobs predict above (which ran, on the same export and input), with
    # --overwrite for a second run and flags the job takes. (Not run again: an application
    # costs minutes in a busy CI.)
    from sparktf.jobs import predict
    from sparktf.jobs.quickstart import summary

    export, dataset = f"{jobs_prefix}/models/resnet20/export", f"{jobs_prefix}/datasets/cifar10"
    shown = summary(_train_result(storage.join(export, "2")), "resnet20", dataset)
    (line,) = [line for line in shown.splitlines() if "jobs/predict.py" in line]
    printed = shlex.split(line)
    (ran,) = [command for command in chain if command[1] == "jobs/predict.py"]
    assert printed[:2] == ran[:2] == ["./scripts/submit.sh", "jobs/predict.py"], printed
    flags = predict.parser().parse_args(printed[2:])
    assert (flags.export, flags.input) == (export, f"{dataset}/test/parquet"), flags
    assert flags.overwrite and flags.output
    assert {a for a in printed if a.startswith("--")} == {
        *(a for a in ran if a.startswith("--")),
        "--overwrite",
    }, (printed, ran)


@pytest.mark.e2e
# not in CI (pyproject.toml): the README's test parses this command with the example's flags
# and test_ml trains the example's run() on the session; its own application cost CI minutes
@pytest.mark.full
def test_readme_ml_example_runs_as_written(tmp_path):
    """The Spark ML section's command, as written, its own application (its scratch directory
    moved into the test's): it writes predictions of the held-out rows."""
    (bash, _) = [body for _, body in section_blocks(README.read_text(), ML_SECTION)]
    for command in shell_commands(bash):
        command = [arg.replace(".local/tabular", str(tmp_path / "tabular")) for arg in command]
        run = helpers.run_command(command, cwd=ROOT, timeout=600)
        assert run.returncode == 0, f"{shlex.join(command)}\n{run.stderr[-4000:]}"
    predictions = storage.spark_uri(str(tmp_path / "tabular" / "predictions"))
    assert [f for f in storage.walk_files(predictions) if f.endswith(".parquet")]


def _train_result(export: str) -> dict:
    return {
        "strategy": "allreduce",
        "input_mode": "files",
        "start_step": 0,
        "final_step": 64,
        "elapsed_s": 15.2,
        "metrics": {"loss": 0.02, "accuracy": 1.0},
        "eval_history": [{"step": 64, "loss": 0.028, "accuracy": 0.9961, "top5_accuracy": 1.0}],
        "export_dir": export,
    }


def test_quickstart_summary_says_what_ran_and_what_to_run_next():
    from sparktf.jobs.quickstart import summary

    text = summary(_train_result(str(ROOT / ".local/runs/resnet20/export/64")), "resnet20", "demo")
    assert "resnet20 (allreduce, input mode files)" in text
    assert "0 -> 64" in text
    # How far above guessing the model got: one in ten classes.
    assert "accuracy 0.9961, top5_accuracy 1 (step 64; guessing: accuracy 0.1)" in text
    assert "export      .local/runs/resnet20/export/64" in text
    assert "SYNTHETIC" in text and ".local/demo/cifar10" in text
    assert "10 classes of striped patterns plus noise, not CIFAR-10" in text
    predict = [line.strip() for line in text.splitlines() if "jobs/predict.py" in line]
    assert predict == [
        "./scripts/submit.sh jobs/predict.py --export .local/runs/resnet20/export --input "
        ".local/demo/cifar10/test/parquet --output .local/predictions/quickstart --overwrite"
    ]
    assert "jobs/convert_cifar10.py" in text
    real = summary(_train_result("hdfs://nn:8020/m/export/3"), "resnet20", "hdfs://nn:8020/c10")
    assert "SYNTHETIC" not in real and "data        hdfs://nn:8020/c10" in real
    assert "--input hdfs://nn:8020/c10/test/parquet" in real
    # The README's sample of the summary has the summary's lines, in its order.
    (sample,) = [
        body for lang, body in section_blocks(README.read_text(), "Two commands") if lang == "text"
    ]
    labels = [line.split()[0] for line in sample.splitlines() if line.startswith("  ")]
    shown = [line.split()[0] for line in text.splitlines() if line.startswith("  ")]
    assert labels[:6] == shown[:6] == ["model", "steps", "training", "evaluation", "export", "data"]


@pytest.mark.e2e
def test_quickstart_trains_a_model_that_learned(tmp_path):
    """What ``scripts/quickstart.sh`` runs after its set-up: ``jobs/train_resnet.py`` with its
    embedded default (the synthetic demo set, made afresh here in its own home) and the
    summary; then the ``jobs/evaluate.py`` command the summary suggests. The model must have
    learned the demo's classes: evaluation accuracy of at least 0.6 (guessing: 0.1) in the
    summary and in the evaluation, and predictions spread over the classes rather than
    collapsed into one."""
    env = dict(os.environ, SPARKTF_HOME=str(tmp_path / "home"), TF_CPP_MIN_LOG_LEVEL="2")
    result_file, model_dir = tmp_path / "result.json", tmp_path / "model"
    train_args = ["--model-dir", str(model_dir)]
    run = helpers.run_command(
        [*QUICKSTART_TRAINING, *train_args] + ["--result-json", result_file],
        cwd=ROOT,
        env=env,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    # A newcomer's first run is quiet: no warning of sparktf's own stack (pyspark warned
    # about pandas 3 twice before the default stack took pandas 2.3).
    noisy = [
        line
        for line in (run.stdout + run.stderr).splitlines()
        if "FutureWarning" in line or "DeprecationWarning" in line
    ]
    assert not noisy, "\n".join(noisy)
    shown = helpers.run_command(
        [sys.executable, "-m", "sparktf.jobs.quickstart", result_file, *train_args],
        cwd=ROOT,
        env=env,
        timeout=120,
    )
    assert shown.returncode == 0, shown.stderr[-2000:]
    text = shown.stdout
    print(text)
    evaluation = re.search(r"^  evaluation .*\baccuracy ([0-9.]+),", text, re.M)
    assert evaluation, text
    assert float(evaluation.group(1)) >= 0.6, text
    assert "(step 64; guessing: accuracy 0.1)" in text

    (line,) = [line for line in text.splitlines() if "jobs/evaluate.py" in line]
    output = tmp_path / "eval" / "quickstart.json"
    command = [arg.replace(".local/eval/quickstart.json", str(output)) for arg in shlex.split(line)]
    evaluated = helpers.run_command(command, cwd=ROOT, env=env, timeout=600)
    assert evaluated.returncode == 0, evaluated.stderr[-4000:]
    metrics = json.loads(output.read_text())
    confusion = np.asarray(metrics["confusion_matrix"])
    predicted = confusion.sum(axis=0)  # rows are the true classes, columns the predictions
    assert metrics["examples"] == confusion.sum() == 256
    assert metrics["accuracy"] >= 0.6, metrics
    assert (predicted > 0).sum() >= 8, predicted  # not collapsed into a few classes
    assert predicted.max() <= 0.25 * predicted.sum(), predicted


def test_plain_python_sessions_follow_the_cluster_and_size_the_run(tmp_path, monkeypatch):
    """``python jobs/X.py`` builds what ``submit.sh`` would: the master spark-cluster.sh
    started, executors sized to the run's TensorFlow processes, the quiet console."""
    from sparktf.jobs.train import session_overrides
    from sparktf.spark import session_conf
    from sparktf.train.config import ScalingConfig

    monkeypatch.delenv("SPARKTF_SPARK_MASTER", raising=False)
    monkeypatch.delenv("SPARKTF_LOG_LEVEL", raising=False)
    monkeypatch.setenv("SPARKTF_SPARK_CLUSTER_DIR", str(tmp_path))
    (tmp_path / "master.env").write_text("SPARK_MASTER_URL=spark://127.0.0.1:7171\n")
    conf = session_conf("standalone")
    assert conf["spark.master"] == "spark://127.0.0.1:7171"
    assert conf["spark.driver.host"] == "127.0.0.1"
    assert "log4j2.properties" in conf["spark.driver.extraJavaOptions"]
    ps = ScalingConfig(strategy="ps", num_workers=2, num_ps=1)
    assert session_overrides(conf, ps)["spark.cores.max"] == str(4 * 4)  # 4 processes x 4 cores
    monkeypatch.setenv("SPARKTF_SPARK_MASTER", "yarn")
    assert session_overrides(session_conf("standalone"), ps)["spark.executor.instances"] == "4"
    monkeypatch.delenv("SPARKTF_SPARK_MASTER")
    local = session_overrides(session_conf("local"), ScalingConfig(num_workers=3))
    assert local["spark.master"] == "local-cluster[3,1,1024]"
    # executors with two task slots each hold two processes: fewer executors, not more
    two = {"spark.master": "local-cluster[1,2,2048]"}
    assert "spark.master" not in session_overrides(two, ScalingConfig(num_workers=2))
    four = session_overrides(two, ScalingConfig(num_workers=4))
    assert four["spark.master"] == "local-cluster[2,2,2048]"
    monkeypatch.setenv("SPARKTF_LOG_LEVEL", "DEBUG")
    assert "spark.driver.extraJavaOptions" not in session_conf("local")


LINKED_PAGES = [
    README,
    *sorted((ROOT / "docs").glob("*.md")),
    *sorted((ROOT / "bench").glob("*.md")),
]


def _anchor(title: str) -> str:
    """GitHub's anchor for a markdown heading."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", LINKED_PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_links_lead_somewhere(page):
    """Every relative link of the README, docs/ and bench/ pages names a file that exists,
    and a ``#section`` a heading of that file."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.exists(), f"{page.name}: {target}"
        if anchor:
            titles = re.findall(r"^#+ (.+)$", linked.read_text(), re.M)
            assert anchor in {_anchor(t) for t in titles}, f"{page.name}: {target}"


def test_the_architecture_picture_has_its_source():
    """The README's picture is rendered from docs/architecture.dot, which says how."""
    assert "](docs/architecture.svg)" in README.read_text()
    source = (ROOT / "docs" / "architecture.dot").read_text()
    assert "dot -Tsvg docs/architecture.dot -o docs/architecture.svg" in source
    picture = (ROOT / "docs" / "architecture.svg").read_text()
    assert "<svg" in picture and "Generated by graphviz" in picture
    for node in ("reservation server", "control server", "TensorFlow process", "HDFS"):
        assert node in source and node in picture, node


def test_the_first_page_is_short():
    assert len(README.read_text().splitlines()) <= 250


HELP_COMMANDS = [
    *[[str(path)] for path in sorted((ROOT / "scripts").glob("*.sh"))],
    *[["bash", str(p)] for p in sorted((ROOT / "bench").glob("*.sh"))],
    *[
        [sys.executable, str(p)]
        for p in sorted((ROOT / "bench").glob("*.py"))
        if p.stem != "common"
    ],
]


@pytest.mark.e2e
@pytest.mark.parametrize("command", HELP_COMMANDS, ids=lambda c: Path(c[-1]).name)
def test_every_script_answers_help_without_doing_anything(command):
    """``--help`` of each script and benchmark prints its usage and exits 0 (set-up, tests
    and clusters are not started by asking for help)."""
    run = helpers.run_command([*command, "--help"], cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    text = run.stdout + run.stderr
    assert len(text.strip().splitlines()) >= 2, text  # a usage text, not a one-line error
    # Nothing started: no set-up run, no HDFS, no Spark application.
    assert not re.search(r"^(setup\.sh: |HDFS_URI=|\d\d/\d\d/\d\d )", text, re.M), text[:1000]


@pytest.mark.e2e
@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="this machine has nvidia-smi")
def test_gpu_benchmark_says_it_needs_a_gpu():
    """Without a GPU, bench/gpu.sh stops at once (exit 2) and says why, before any set-up."""
    run = helpers.run_command(["bash", ROOT / "bench" / "gpu.sh"], cwd=ROOT)
    assert run.returncode == 2, run.stdout + run.stderr
    assert "needs 1 NVIDIA GPU(s); nvidia-smi found 0" in run.stderr
    assert "setup.sh" not in run.stdout
