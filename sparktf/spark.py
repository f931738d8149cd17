"""Spark sessions configured from ``conf/spark/<profile>.conf`` (spark-defaults style).

Under ``spark-submit`` (``scripts/submit.sh``) the submitted configuration wins and
``get_session`` only fills in what is missing; from plain Python (tests, notebooks) it reads
the profile file and starts the session itself.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path
from typing import Mapping

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = REPO_ROOT / "conf" / "spark"
PROFILES = ("local", "standalone", "yarn", "k8s")
# Environment variables that executors need to reach HDFS the way the driver does.
PROPAGATED_ENV = ("SPARKTF_WEBHDFS_URL", "SPARKTF_HDFS_USER", "SPARKTF_HDFS_TIMEOUT",
                  "HADOOP_CONF_DIR", "HADOOP_USER_NAME")


def read_conf_file(path: str | os.PathLike) -> dict[str, str]:
    """Parses a spark-defaults style file: ``key value`` per line, ``#`` comments."""
    conf = {}
    for number, raw in enumerate(Path(path).read_text().splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        if len(parts) != 2:
            raise ValueError(f"{path}:{number}: expected 'key value', got {raw!r}")
        conf[parts[0]] = parts[1].strip()
    return conf


def profile_conf(profile: str) -> dict[str, str]:
    """The Spark settings of a profile in ``conf/spark/`` (or a path to a conf file)."""
    path = Path(profile)
    if not path.is_file():
        path = CONF_DIR / f"{profile}.conf"
    if not path.is_file():
        raise FileNotFoundError(
            f"no Spark profile {profile!r}: expected one of {', '.join(PROFILES)} "
            f"(files in {CONF_DIR}) or a path to a spark-defaults style file")
    return read_conf_file(path)


def session_conf(profile: str = "local",
                 overrides: Mapping[str, str] | None = None) -> dict[str, str]:
    """The full configuration ``get_session`` would apply outside spark-submit."""
    conf = profile_conf(profile)
    conf.setdefault("spark.python.worker.reuse", "true")
    python = os.environ.get("PYSPARK_PYTHON", sys.executable)
    conf.setdefault("spark.pyspark.python", python)
    conf.setdefault("spark.pyspark.driver.python", sys.executable)
    for name in PROPAGATED_ENV:
        if os.environ.get(name):
            conf.setdefault(f"spark.executorEnv.{name}", os.environ[name])
    conf.update(overrides or {})
    return conf


def get_session(app_name: str = "sparktf", profile: str | None = None,
                overrides: Mapping[str, str] | None = None):
    """Returns the active SparkSession, or builds one from ``profile`` and ``overrides``.

    ``profile`` defaults to ``$SPARKTF_PROFILE`` or "local". When launched by spark-submit,
    the submitted settings are kept and the profile is not read.
    """
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:
        return active
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    python = os.environ["PYSPARK_PYTHON"]
    if os.sep in python and not os.path.isabs(python) and os.path.exists(python):
        # Executors start Python from their own work directory: a relative path such as
        # .venv/bin/python would not be found there.
        os.environ["PYSPARK_PYTHON"] = os.path.abspath(python)
    builder = SparkSession.builder.appName(app_name)
    if _launched_by_spark_submit():
        for key, value in (overrides or {}).items():
            builder = builder.config(key, value)
    else:
        profile = profile or os.environ.get("SPARKTF_PROFILE", "local")
        conf = session_conf(profile, overrides)
        if conf.get("spark.master", "").startswith(("local", "local-cluster")):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # stay on loopback
        log.info("starting Spark (%s profile, master %s)", profile, conf.get("spark.master"))
        for key, value in conf.items():
            builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel(os.environ.get("SPARKTF_SPARK_LOG_LEVEL", "WARN"))
    return spark


def _launched_by_spark_submit() -> bool:
    # spark-submit starts the Python driver with PYSPARK_GATEWAY_PORT set to its own JVM.
    return "PYSPARK_GATEWAY_PORT" in os.environ
