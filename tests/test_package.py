"""sparktf as a package: where it finds its configuration and keeps its state
(``sparktf.paths``), the ``sparktf`` command, ``sparktf submit``'s command line, and how
executors are sized to a cluster (``sparktf.placement``). Pure functions and in-process
commands: no Spark, no HDFS. The wheel installed outside the checkout is tested in
tests/test_install.py."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from sparktf import cli, console, paths, placement, spark
from sparktf.console import submit
from tests.conftest import ROOT

pytestmark = pytest.mark.unit


# ----------------------------------------------------------------------------- paths


def test_the_checkout_is_found_and_its_conf_is_the_default(clean_env):
    assert paths.source_checkout() == ROOT
    assert paths.default_conf_dir() == ROOT / "conf"
    assert paths.home() == ROOT / ".local"
    assert paths.conf_file("spark/local.conf") == ROOT / "conf" / "spark" / "local.conf"


def test_a_user_conf_dir_overrides_file_by_file(clean_env, tmp_path):
    user = tmp_path / "my-conf"
    (user / "spark").mkdir(parents=True)
    (user / "spark" / "yarn.conf").write_text("spark.master yarn\nspark.executor.memory 2g\n")
    (user / "spark" / "mine.conf").write_text("spark.master local-cluster[1,1,512]\n")
    (user / "jobs").mkdir()
    (user / "jobs" / "train_mnist.json").write_text(json.dumps({"steps": 7}))
    clean_env.setenv("SPARKTF_CONF_DIR", str(user))

    assert spark.profile_conf("yarn") == {"spark.master": "yarn", "spark.executor.memory": "2g"}
    assert spark.profile_conf("local")["spark.master"].startswith("local-cluster[2")  # shipped
    assert spark.profile_conf("mine")["spark.master"] == "local-cluster[1,1,512]"
    assert cli.load_config("train_mnist") == {"steps": 7}
    assert "strategy" in cli.load_config("train_resnet")  # not overridden: the shipped file
    with pytest.raises(FileNotFoundError) as missing:
        spark.profile_conf("nope")
    # the message names the profiles of both directories and where they were looked for
    assert "mine" in str(missing.value) and "yarn" in str(missing.value)
    assert str(user / "spark") in str(missing.value)


def test_config_paths_resolve_from_any_directory(clean_env, tmp_path):
    clean_env.chdir(tmp_path)
    recipe = paths.resolve_config("conf/jobs/recipes/resnet20_cifar10.json")
    assert recipe == ROOT / "conf" / "jobs" / "recipes" / "resnet20_cifar10.json"
    assert paths.resolve_config("jobs/recipes/mnist_mlp.json").is_file()
    own = tmp_path / "conf" / "mine.json"
    own.parent.mkdir()
    own.write_text("{}")
    assert paths.resolve_config("conf/mine.json") == Path("conf/mine.json")  # as given: it exists
    assert paths.resolve_config("missing.json") == Path("missing.json")  # the job says it's missing
    with pytest.raises(cli.UsageError, match="missing.json does not exist"):
        cli.load_config("train", "missing.json")


def test_home_is_sparktf_home_else_the_checkout_else_xdg(clean_env, tmp_path):
    clean_env.setenv("SPARKTF_HOME", str(tmp_path / "h"))
    assert paths.home() == tmp_path / "h"
    assert spark.spark_cluster_dir() == tmp_path / "no-cluster"  # its own variable wins
    clean_env.delenv("SPARKTF_SPARK_CLUSTER_DIR")
    assert spark.spark_cluster_dir() == tmp_path / "h" / "spark-cluster"
    state = paths.state_dir("envs")
    assert state == tmp_path / "h" / "envs" and (state.stat().st_mode & 0o777) == 0o700


# ----------------------------------------------------------------------------- the command


def test_sparktf_help_and_version(capsys):
    assert console.main(["--help"]) == 0
    text = capsys.readouterr().out
    for command in ("convert {cifar10,mnist,ptb}", "train-resnet", "predict", "submit"):
        assert command in text
    assert console.main(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"sparktf {console.version()}"
    assert console.version()[0].isdigit()


def test_sparktf_subcommands_take_their_jobs_flags(capsys):
    with pytest.raises(SystemExit) as done:
        console.main(["train-resnet", "--help"])
    assert done.value.code == 0
    text = capsys.readouterr().out
    assert "Train ResNet on CIFAR-10" in text and "--num-workers" in text
    with pytest.raises(SystemExit):
        console.main(["convert", "ptb", "--help"])
    assert "--input" in capsys.readouterr().out


def test_sparktf_refuses_what_it_does_not_know(tmp_path):
    with pytest.raises(cli.UsageError, match="needs a dataset, one of cifar10, mnist, ptb"):
        console.main(["convert", "imagenet"])
    with pytest.raises(cli.UsageError, match="unknown command 'trian'"):
        console.main(["trian"])
    with pytest.raises(cli.UsageError, match="no such directory"):
        console.main(["--conf-dir", str(tmp_path / "nope"), "--version"])


def test_every_job_file_runs_its_named_job():
    """jobs/X.py and `sparktf submit X` are the same job: each file names an entry of JOBS."""
    for path in sorted((ROOT / "jobs").glob("*.py")):
        assert f'run_job("{path.stem}")' in path.read_text(), path
        assert path.stem in console.JOBS


# ----------------------------------------------------------------------------- sparktf submit


def dry_run(capsys, *argv: str) -> list[str]:
    assert submit.main(["--dry-run", *argv]) == 0
    return shlex.split(capsys.readouterr().out.strip())


def test_submit_sizes_a_local_cluster_to_the_run(clean_env, capsys):
    argv = dry_run(capsys, "jobs/train_mnist.py", "--strategy", "allreduce", "--num-workers", "3")
    assert argv[0].endswith("spark-submit")
    assert argv[argv.index("--master") + 1] == "local-cluster[3,1,1024]"
    assert argv[-5:] == ["jobs/train_mnist.py", "--strategy", "allreduce", "--num-workers", "3"]
    given = dry_run(
        capsys, "--master", "local-cluster[5,1,512]", "train_mnist", "--num-workers", "2"
    )
    assert given.count("--master") == 1 and "local-cluster[5,1,512]" in given


def test_submit_counts_executors_by_their_task_slots(clean_env, capsys):
    """Executors of 8 cores at 1 core per task hold 8 processes each: 16 processes take 2
    executors (spark.cores.max=16 on a standalone master), not 16."""
    job = ["jobs/train_mnist.py", "--strategy", "allreduce", "--num-workers", "16"]
    slots = ["--executor-cores", "8", "--conf", "spark.task.cpus=1"]
    standalone = ["--master", "spark://nowhere.invalid:7077", "--conf", "spark.authenticate=false"]
    argv = dry_run(capsys, *standalone, *slots, *job)
    assert "spark.cores.max=16" in argv
    local = dry_run(capsys, *slots, *job)
    assert local[local.index("--master") + 1] == "local-cluster[2,8,1024]"
    one = dry_run(capsys, *standalone, "--executor-cores", "8", *job)
    assert "spark.cores.max=128" in one and "spark.task.cpus=8" in one  # a process per executor


def test_submit_runs_a_job_by_name_through_a_launcher(clean_env, capsys):
    argv = dry_run(capsys, "--profile", "yarn", "predict", "--export", "m")
    launcher = next(a for a in argv if a.endswith("sparktf_predict.py"))
    assert argv[argv.index(launcher) + 1 :] == ["--export", "m"]
    assert "--py-files" in argv  # off the local profile the library travels with the job
    with pytest.raises(cli.UsageError, match="unknown job 'trian_mnist'"):
        submit.main(["trian_mnist"])
    with pytest.raises(cli.UsageError, match="no Spark profile 'nope'"):
        submit.main(["--profile", "nope", "predict"])


def test_submit_counts_executors_on_yarn_and_standalone(clean_env, capsys, tmp_path):
    argv = dry_run(capsys, "--profile", "yarn", "train_mnist", "--num-workers", "2")
    assert "spark.executor.instances=3" in argv  # chief + worker + ps (train_mnist: ps)
    clean_env.setenv("SPARKTF_SPARK_MASTER", "spark://127.0.0.1:7077")
    secret = spark.write_private_conf(tmp_path / "secret.conf", {spark.SECRET_CONF: "s" * 64})
    clean_env.setenv(spark.SECRET_FILE_ENV, str(secret))  # the standalone cluster's secret
    closed = "spark.sparktf.master.webui=http://127.0.0.1:9"  # nothing answers: sizes as given
    argv = dry_run(
        capsys, "--profile", "standalone", "--conf", closed, "--executor-cores", "2", "train_resnet"
    )
    assert "spark.cores.max=4" in argv and "spark.task.cpus=2" in argv


def test_submit_gives_the_kerberos_configuration_to_every_jvm(clean_env, capsys, tmp_path):
    """Java does not read KRB5_CONFIG: with Kerberos on, the driver and executor JVMs get it
    as java.security.krb5.conf, after the options the profile or the command line give."""
    clean_env.setenv("SPARKTF_HDFS_PRINCIPAL", "alice@EXAMPLE.TEST")
    clean_env.setenv("KRB5_CONFIG", str(tmp_path / "krb5.conf"))
    flag = f"-Djava.security.krb5.conf={tmp_path / 'krb5.conf'}"
    argv = dry_run(capsys, "--conf", "spark.executor.extraJavaOptions=-Dmine=1", "predict")
    options = {a.split("=", 1)[0]: a.split("=", 1)[1] for a in argv if "extraJavaOptions=" in a}
    assert flag in options["spark.driver.extraJavaOptions"].split()
    assert "-Dlog4j2.configurationFile" in options["spark.driver.extraJavaOptions"]
    assert options["spark.executor.extraJavaOptions"] == f"-Dmine=1 {flag}"
    clean_env.delenv("SPARKTF_HDFS_PRINCIPAL")  # Kerberos off: nothing added
    assert not any("krb5" in arg for arg in dry_run(capsys, "predict"))


# ----------------------------------------------------------------------------- placement

STANDALONE_DEFAULT = placement.Cluster("standalone", (placement.Node(1, 1024),) * 2)
LOCAL_YARN = placement.Cluster(
    "yarn", (placement.Node(8, 8192),), max_container_mb=8192, max_container_vcores=4,
    min_container_mb=256,
)  # fmt: skip


def test_an_ask_that_cannot_be_placed_says_so_in_numbers():
    ask = placement.Ask(executors=2, cores=4, memory_mb=8192)
    with pytest.raises(placement.PlacementError) as error:
        placement.check(STANDALONE_DEFAULT, ask)
    assert str(error.value) == (
        "each executor asks 4 cores and 8g; the 2 ALIVE workers offer 1 core and 1g each: "
        "0 of the 2 executors the run needs fit"
    )
    yarn = placement.ask_from_conf(
        spark.read_conf_file(ROOT / "conf" / "spark" / "yarn.conf"), 2, yarn=True
    )
    with pytest.raises(placement.PlacementError, match="over YARN's maximum allocation of 8g"):
        placement.check(LOCAL_YARN, yarn)


def test_fit_shrinks_to_the_cluster_keeping_the_proportions():
    fitted = placement.fit(STANDALONE_DEFAULT, placement.Ask(2, 4, 8192))
    assert (fitted.cores, fitted.memory_mb) == (1, 1024)
    conf = spark.read_conf_file(ROOT / "conf" / "spark" / "yarn.conf")
    ask = placement.ask_from_conf(conf, 2, yarn=True)
    assert (ask.memory_mb, ask.overhead_mb, ask.am_mb) == (8192, 4096, 1024 + 384)
    fitted = placement.fit(LOCAL_YARN, ask)
    assert placement.placeable(LOCAL_YARN, fitted) >= 2
    assert fitted.memory_mb >= 2 * fitted.overhead_mb - placement.STEP_MB  # still 2:1
    # nothing larger in the same steps would fit
    bigger = placement.Ask(2, fitted.cores, fitted.memory_mb + 256, fitted.overhead_mb, ask.am_mb)
    assert placement.placeable(LOCAL_YARN, bigger) < 2
    assert placement.sizing_conf(fitted)["spark.task.cpus"] == str(fitted.cores)


def test_fit_gives_up_when_even_small_executors_do_not_fit():
    with pytest.raises(placement.PlacementError, match="1 of the 3 executors the run needs fit"):
        placement.fit(
            placement.Cluster("standalone", (placement.Node(1, 4096),)), placement.Ask(3, 1, 512)
        )


def test_memory_sizes_read_as_spark_writes_them():
    assert [placement.parse_mb(v) for v in ("8g", "512m", "1024", "2G", "1t")] == [
        8192, 512, 1024, 2048, 1 << 20,
    ]  # fmt: skip
    assert [placement.mb_text(v) for v in (512, 1024, 1536)] == ["512m", "1g", "1536m"]
    with pytest.raises(ValueError, match="not a memory size"):
        placement.parse_mb("lots")


def locked(lock: str) -> dict[str, str]:
    """``{normalized name: version}`` of a lock file's ``name==version`` lines."""
    from packaging.utils import canonicalize_name

    pins = {}
    for line in (ROOT / lock).read_text().splitlines():
        if line and not line.startswith("#"):
            name, sep, version = line.partition("==")
            assert sep and version, f"{lock}: {line!r} is not name==version"
            pins[canonicalize_name(name)] = version
    return pins


@pytest.mark.parametrize(
    ("lock", "extras", "stack"),
    [
        (
            "requirements.lock",
            ("test", "connect"),
            {"pyspark": "4.3", "pyarrow": "26.", "numpy": "2."},
        ),
        (
            "requirements-petastorm.lock",
            ("test", "petastorm", "connect"),
            {"pyspark": "4.0", "pyarrow": "14.", "numpy": "1.26", "petastorm": "0.13"},
        ),
    ],
)
def test_each_lock_pins_a_stack_inside_the_declared_ranges(lock, extras, stack):
    import tomllib

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = list(project["dependencies"])
    for extra in extras:
        wanted += project["optional-dependencies"][extra]
    pins = locked(lock)
    for spec in map(Requirement, wanted):
        name = canonicalize_name(spec.name)
        assert name in pins, f"{lock} does not pin {spec.name}"
        assert spec.specifier.contains(pins[name], prereleases=True), (lock, str(spec), pins[name])
    for name, prefix in stack.items():
        assert pins[name].startswith(prefix), (lock, name, pins[name])
    if "petastorm" not in extras:
        assert "petastorm" not in pins  # the default stack goes without it
