"""Spark profiles and sizing: the ``spark/<profile>.conf`` files of the conf directories
(``sparktf.paths``; spark-defaults style), a cluster's master and resources, the executors' size.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import time
from collections.abc import Mapping, MutableMapping
from pathlib import Path

from sparktf import paths, placement
from sparktf.errors import SparktfValueError

__all__ = [
    "SPARK_HOME_ENV",
    "installed_spark_home",
    "local_spark_home",
    "remove_work_dir",
    "use_local_spark_home",
    "PROFILES",
    "PROPAGATED_ENV",
    "cluster_master",
    "cluster_resources",
    "executor_sizing",
    "local_cluster_env",
    "log4j_conf",
    "profile_conf",
    "profile_file",
    "read_conf_file",
    "spark_cluster_dir",
    "worked_in",
    "yarn_site",
]

log = logging.getLogger(__name__)


PROFILES = ("local", "standalone", "yarn", "k8s")
# Environment variables that executors need to reach HDFS the way the driver does.
PROPAGATED_ENV = (
    "SPARKTF_WEBHDFS_URL",
    "SPARKTF_HDFS_USER",
    "SPARKTF_HDFS_TIMEOUT",
    "HADOOP_CONF_DIR",
    "HADOOP_USER_NAME",
)


def read_conf_file(path: str | os.PathLike) -> dict[str, str]:
    """Parses a spark-defaults style file: ``key value`` per line, ``#`` comments."""
    conf = {}
    for number, raw in enumerate(Path(path).read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        if len(parts) != 2:
            raise SparktfValueError(f"{path}:{number}: expected 'key value', got {raw!r}")
        conf[parts[0]] = parts[1].strip()
    return conf


def profile_conf(profile: str) -> dict[str, str]:
    """The Spark settings of a profile (``spark/PROFILE.conf`` of the conf directories,
    ``sparktf.paths``) or of a spark-defaults style file."""
    return read_conf_file(profile_file(profile))


def profile_file(profile: str) -> Path:
    """The file of a profile: a path as given, else ``spark/PROFILE.conf`` of the conf
    directories; FileNotFoundError names the profiles there."""
    path = Path(profile)
    if not path.is_file():
        path = paths.conf_file(f"spark/{profile}.conf")
    if not path.is_file():
        where = ", ".join(str(d / "spark") for d in paths.conf_dirs())
        raise FileNotFoundError(
            f"no Spark profile {profile!r}: expected one of "
            f"{', '.join(paths.conf_names('spark', '.conf'))} (files in {where}) or a path to a "
            "spark-defaults style file"
        )
    return path


def spark_cluster_dir() -> Path:
    """The local standalone cluster's directory (``scripts/spark-cluster.sh``):
    ``$SPARKTF_SPARK_CLUSTER_DIR``, else ``spark-cluster`` under sparktf's home."""
    value = os.environ.get("SPARKTF_SPARK_CLUSTER_DIR")
    return Path(value) if value else paths.home() / "spark-cluster"


def log4j_conf() -> Path:
    """The log4j2 file that keeps the driver's console to warnings."""
    return paths.conf_file("log4j2.properties")


def cluster_master(profile: str) -> str | None:
    """The master ``sparktf submit`` would use besides the profile's: ``$SPARKTF_SPARK_MASTER``,
    else for the standalone profile the cluster ``scripts/spark-cluster.sh start`` runs
    (``SPARK_MASTER_URL`` in its ``master.env``)."""
    if os.environ.get("SPARKTF_SPARK_MASTER"):
        return os.environ["SPARKTF_SPARK_MASTER"]
    if profile != "standalone":
        return None
    return local_cluster_env().get("SPARK_MASTER_URL")


def local_cluster_env() -> dict[str, str]:
    """The ``master.env`` of the local standalone cluster (empty when it is not running)."""
    env_file = spark_cluster_dir() / "master.env"
    if not env_file.is_file():
        return {}
    pairs = (line.split("=", 1) for line in env_file.read_text().splitlines() if "=" in line)
    return {key.strip(): value.strip() for key, value in pairs}


def cluster_resources(master: str, conf: Mapping[str, str]) -> placement.Cluster | None:
    """What the cluster of ``master`` has (a standalone master's workers, YARN's
    NodeManagers), or None where that cannot be read: another kind of master, or no answer
    within a few seconds. The standalone master's web UI: the local cluster's (its
    ``master.env``), else ``spark.sparktf.master.webui``, else port 8080 of the master's host;
    YARN's ResourceManager: ``yarn-site.xml`` of ``$YARN_CONF_DIR`` or ``$HADOOP_CONF_DIR``."""
    try:
        if master.startswith("spark://"):
            return placement.standalone_cluster(_standalone_webui(master, conf))
        if master == "yarn":
            site = yarn_site()
            webapp = placement.yarn_webapp(site)
            return placement.yarn_cluster(webapp, site) if webapp else None
    except (OSError, ValueError, KeyError) as exc:
        log.debug("could not read the cluster's resources (%s): %s", master, exc)
    return None


def executor_sizing(
    master: str, conf: Mapping[str, str], executors: int, *, fixed: bool = False
) -> dict[str, str]:
    """Settings that size ``executors`` executors to what the cluster of ``master`` has.

    Empty when the executors ``conf`` asks for fit, or when the cluster cannot be read (not a
    standalone or YARN master, no answer); else ``conf``'s executors shrunk until they fit
    (``placement.fit``). With ``fixed`` (the user sized them) nothing is changed and
    ``placement.PlacementError`` says, in numbers, why they do not fit.
    """
    if not master.startswith("spark://") and master != "yarn":
        return {}
    cluster = cluster_resources(master, conf)
    if cluster is None:
        log.info("the cluster's resources could not be read: executors as configured")
        return {}
    ask = placement.ask_from_conf(dict(conf), executors, yarn=master == "yarn")
    if fixed:
        placement.check(cluster, ask)
        return {}
    fitted = placement.fit(cluster, ask)
    if fitted == ask:
        return {}
    overhead = f" + {placement.mb_text(fitted.overhead_mb)} overhead" if fitted.overhead_mb else ""
    log.info(
        "%s; %s: using %s and %s%s per executor",
        ask.describe(),
        cluster.describe(),
        placement.cores_text(fitted.cores),
        placement.mb_text(fitted.memory_mb),
        overhead,
    )
    return placement.sizing_conf(fitted)


def _standalone_webui(master: str, conf: Mapping[str, str]) -> str:
    local = local_cluster_env()
    if local.get("SPARK_MASTER_URL") == master and local.get("SPARK_MASTER_WEBUI_URL"):
        return local["SPARK_MASTER_WEBUI_URL"]
    host = master[len("spark://") :].split(",")[0].rsplit(":", 1)[0]
    return conf.get("spark.sparktf.master.webui", f"http://{host}:8080")


def yarn_site() -> dict[str, str]:
    """``yarn-site.xml`` of ``$YARN_CONF_DIR`` or ``$HADOOP_CONF_DIR`` (empty when none)."""
    conf_dir = os.environ.get("YARN_CONF_DIR") or os.environ.get("HADOOP_CONF_DIR")
    return placement.yarn_site(conf_dir) if conf_dir else {}


# ----------------------------------------------------------------------------- work directories

SPARK_HOME_ENV = "SPARK_HOME"
_LOCAL_HOMES = "spark-home"  # under $SPARKTF_HOME: one local Spark home per real one


def installed_spark_home() -> Path:
    """The Spark home of the installed pyspark (its package directory)."""
    import importlib.util

    spec = importlib.util.find_spec("pyspark")
    return Path(next(iter(spec.submodule_search_locations)))


def local_spark_home(real: Path | None = None) -> Path:
    """A Spark home of sparktf's own for ``local-cluster`` applications, under
    ``$SPARKTF_HOME/spark-home/``: every entry of the real one (``real``, default
    :func:`installed_spark_home`) linked, and a ``work/`` directory of its own.

    Spark's Workers write each executor's logs and fetched jars under ``SPARK_HOME/work``,
    which for a pip-installed pyspark lies inside ``site-packages`` (never cleaned, and
    read-only in a system install); no setting moves it for ``local-cluster``. A driver whose
    ``SPARK_HOME`` is this directory writes them here instead, and
    :func:`remove_work_dir` removes an application's when it ends."""
    real = (real or installed_spark_home()).resolve()
    digest = hashlib.sha256(str(real).encode()).hexdigest()[:12]
    home = paths.state_dir(_LOCAL_HOMES) / digest
    home.mkdir(exist_ok=True, mode=0o700)
    (home / "work").mkdir(exist_ok=True, mode=0o700)
    for entry in real.iterdir():
        link = home / entry.name
        if entry.name == "work" or (link.is_symlink() and link.resolve() == entry):
            continue
        tmp = home / f".{entry.name}.{os.getpid()}"
        tmp.unlink(missing_ok=True)
        tmp.symlink_to(entry)
        os.replace(tmp, link)  # atomic: another process linking the same entry is harmless
    return home


def use_local_spark_home(master: str, env: MutableMapping[str, str] = os.environ) -> None:
    """Points ``SPARK_HOME`` of ``env`` (default: this process's, and so the JVM's that
    PySpark starts next) at :func:`local_spark_home` when ``master`` is ``local-cluster``
    and ``SPARK_HOME`` is not a Spark of the user's choosing."""
    if not master.strip().startswith("local-cluster"):
        return
    current = env.get(SPARK_HOME_ENV)
    theirs = current and not _is_local_spark_home(Path(current))
    if theirs and Path(current).resolve() != installed_spark_home().resolve():
        return  # the user's own Spark: left alone
    env[SPARK_HOME_ENV] = str(local_spark_home())


def _is_local_spark_home(path: Path) -> bool:
    try:
        return path.resolve().parent == (paths.home() / _LOCAL_HOMES).resolve()
    except OSError:
        return False


def remove_work_dir(app_id: str | None, *, settle_s: float = 3.0) -> None:
    """Removes the work directory of the ``local-cluster`` application ``app_id`` (its
    executors' logs and jars) when it lies in :func:`local_spark_home` and no live process
    works in it.

    A local-cluster application's id is ``app-<second it started>-0000``: two started in the
    same second on one machine (two jobs, two test processes) share it, and with it the work
    directory. The first to stop then leaves it to the other, whose executors still run
    there (removed, their Python workers fail on a missing working directory); the last
    one removes it. Its own executors are waited for up to ``settle_s``."""
    home = os.environ.get(SPARK_HOME_ENV)
    if not app_id or not home or not _is_local_spark_home(Path(home)):
        return
    work = Path(home) / "work" / app_id
    deadline = time.monotonic() + settle_s
    while worked_in(work):
        if time.monotonic() > deadline:
            log.debug("%s: left to the application that still runs there", work)
            return
        time.sleep(0.2)
    shutil.rmtree(work, ignore_errors=True)


def worked_in(path: Path) -> bool:
    """Whether a live process has its working directory in ``path`` (Linux's ``/proc``;
    elsewhere: False)."""
    inside = str(path)
    try:
        pids = [name for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return False
    for pid in pids:
        try:
            cwd = os.readlink(f"/proc/{pid}/cwd")
        except OSError:  # gone, a zombie, or not ours to read
            continue
        if cwd == inside or cwd.startswith(inside + os.sep):
            return True
    return False
