"""A local-cluster application's work directories (its executors' logs and jars) live under
``$SPARKTF_HOME``, not inside the installed pyspark, and go when the application ends
cleanly (``sparktf.spark.profiles.local_spark_home``). A real session starts in
``test_a_local_cluster_writes_its_work_dir_under_sparktf_home_and_removes_it``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sparktf.spark import profiles

pytestmark = pytest.mark.unit


def _real_spark(tmp_path: Path) -> Path:
    real = tmp_path / "spark"
    for name in ("bin", "jars", "python"):
        (real / name).mkdir(parents=True)
    (real / "work" / "app-old").mkdir(parents=True)  # what a pip install collects
    return real


def test_the_local_spark_home_links_the_real_one_and_has_a_work_dir_of_its_own(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("SPARKTF_HOME", str(tmp_path / "home"))
    real = _real_spark(tmp_path)
    home = profiles.local_spark_home(real)
    assert home.parent == tmp_path / "home" / "spark-home"
    assert {p.name for p in home.iterdir()} == {"bin", "jars", "python", "work"}
    for name in ("bin", "jars", "python"):
        assert (home / name).resolve() == real / name
    assert not (home / "work").is_symlink() and list((home / "work").iterdir()) == []
    assert oct((home / "work").stat().st_mode & 0o777) == oct(0o700)
    (real / "conf").mkdir()  # a Spark that changed: linked again, nothing else moves
    assert profiles.local_spark_home(real) == home and (home / "conf").resolve() == real / "conf"


def test_only_a_local_cluster_gets_it_and_a_users_own_spark_is_left_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKTF_HOME", str(tmp_path / "home"))
    env: dict[str, str] = {}
    profiles.use_local_spark_home("local[2]", env)
    assert env == {}
    profiles.use_local_spark_home("local-cluster[2,1,1024]", env)
    assert Path(env["SPARK_HOME"]).parent == tmp_path / "home" / "spark-home"
    own = {"SPARK_HOME": str(_real_spark(tmp_path))}
    profiles.use_local_spark_home("local-cluster[2,1,1024]", own)
    assert own == {"SPARK_HOME": str(tmp_path / "spark")}


def test_an_applications_work_dir_is_removed_and_no_other(tmp_path, monkeypatch):
    monkeypatch.setenv("SPARKTF_HOME", str(tmp_path / "home"))
    home = profiles.local_spark_home(_real_spark(tmp_path))
    for app in ("app-1", "app-2"):
        (home / "work" / app / "0").mkdir(parents=True)
    monkeypatch.setenv("SPARK_HOME", str(home))
    profiles.remove_work_dir("app-1")
    assert sorted(p.name for p in (home / "work").iterdir()) == ["app-2"]
    monkeypatch.setenv("SPARK_HOME", str(tmp_path / "spark"))  # not ours: nothing removed
    profiles.remove_work_dir("app-old")
    assert (tmp_path / "spark" / "work" / "app-old").is_dir()


def test_a_work_dir_shared_with_a_running_application_is_left_to_it(tmp_path, monkeypatch):
    """Two local-cluster applications started in the same second share an id: the first to
    stop leaves the directory to the other's executors (their working directory), the last
    removes it."""
    monkeypatch.setenv("SPARKTF_HOME", str(tmp_path / "home"))
    home = profiles.local_spark_home(_real_spark(tmp_path))
    monkeypatch.setenv("SPARK_HOME", str(home))
    executor_dir = home / "work" / "app-1" / "0"
    executor_dir.mkdir(parents=True)
    other = subprocess.Popen(["sleep", "60"], cwd=executor_dir)
    try:
        profiles.remove_work_dir("app-1", settle_s=0.5)
        assert executor_dir.is_dir()
    finally:
        other.kill()
        other.wait()
    profiles.remove_work_dir("app-1", settle_s=0.5)
    assert not (home / "work" / "app-1").exists()


@pytest.mark.e2e
def test_a_local_cluster_writes_its_work_dir_under_sparktf_home_and_removes_it(tmp_path):
    """A real local-cluster application, as a program of its own (its SPARK_HOME must be set
    before its JVM starts): its executor's stdout and stderr under $SPARKTF_HOME while it
    runs, nothing new inside the installed pyspark, nothing left after a clean stop."""
    code = (
        "import os, sys\n"
        "from pathlib import Path\n"
        "from sparktf import spark as S\n"
        "s = S.get_session('work-dir', profile='local',\n"
        "                  overrides={'spark.master': 'local-cluster[1,1,1024]'})\n"
        "assert s.sparkContext.parallelize(range(4), 2).sum() == 6\n"
        "work = Path(os.environ['SPARK_HOME']) / 'work' / s.sparkContext.applicationId\n"
        "print(work, sorted(p.name for p in work.rglob('*')))\n"
        "S.stop_session(s)\n"
        "print(work.exists())\n"
    )
    installed = profiles.installed_spark_home() / "work"
    before = set(os.listdir(installed)) if installed.is_dir() else set()
    env = {**os.environ, "SPARKTF_HOME": str(tmp_path / "home")}
    env.pop("SPARK_HOME", None)
    run = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=env
    )
    assert run.returncode == 0, run.stderr[-3000:]
    work_line, after = run.stdout.strip().splitlines()[-2:]
    assert work_line.startswith(str(tmp_path / "home" / "spark-home"))
    assert "stderr" in work_line and "stdout" in work_line  # the executor wrote there
    assert after == "False"  # removed with the clean stop
    now = set(os.listdir(installed)) if installed.is_dir() else set()
    assert now == before


def test_launches_that_died_before_registering_and_their_first_error(tmp_path, monkeypatch):
    """What the executor start watch counts: directories of executors that never registered
    and whose process is gone; and the line of their stderr it names."""
    from sparktf.spark import launches

    app = tmp_path / "work" / "app-1"
    for name, text in (
        ("0", 'Spark Executor Command: "java" "-javaagent:/x.jar"\n========\n'
         "WARNING: Using incubator modules\n"
         "Error opening zip file or JAR manifest missing : /x.jar\nagent library failed\n"),
        ("1", "Spark Executor Command: ...\nstarted\n"),
        ("2", ""),
    ):  # fmt: skip
        (app / name).mkdir(parents=True)
        (app / name / "stderr").write_text(text)
    roots = [tmp_path / "work"]
    assert [p.name for p in launches.failed_launches(roots, "app-1", {"1"})] == ["0", "2"]
    assert launches.failed_launches(roots, "app-2", set()) == []
    ours = '"spark://CoarseGrainedScheduler@127.0.0.1:4040"'
    (app / "3").mkdir()
    (app / "3" / "stderr").write_text(f'Spark Executor Command: "java" "--driver-url" {ours}\n')
    only = launches.failed_launches(roots, "app-1", set(), driver=ours[9:])
    assert [p.name for p in only] == ["3"]  # another driver's, of the same app id: not ours
    assert launches.first_error(app / "0") == (
        "Error opening zip file or JAR manifest missing : /x.jar"
    )
    assert launches.first_error(app / "1") == "started"  # no error word: the last line
    assert launches.first_error(app / "2") == "(stderr is empty)"
    monkeypatch.chdir(app / "2")  # a live process works there: it is still starting
    assert [p.name for p in launches.failed_launches(roots, "app-1", {"1"})] == ["0", "3"]
