"""Spark's own channels kept private: RPC authentication and encryption settings, the shared
secret a standalone or local-cluster master needs, kept off command lines.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sparktf import scratch
from sparktf.errors import SparktfError
from sparktf.security import redact
from sparktf.spark.profiles import local_cluster_env

__all__ = [
    "SECRET_CONF",
    "SECRET_FILE_ENV",
    "SECRET_NAME",
    "TRANSPORT_SETTINGS",
    "TransportError",
    "read_secret",
    "remote_executors",
    "secret_file",
    "private_for_new_jvm",
    "private_properties_args",
    "private_settings",
    "secret_setting",
    "transport_defaults",
    "transport_secret",
    "transport_warning",
    "write_private_conf",
]

log = logging.getLogger(__name__)


# What keeps a run's secrets private on Spark's own channels (they travel in task closures):
# RPC authentication, AES encryption of the RPC connections, encryption of what Spark writes
# to local disk (shuffle files, spills, broadcast blocks).
TRANSPORT_SETTINGS = {
    "spark.authenticate": "true",
    "spark.network.crypto.enabled": "true",
    "spark.io.encryption.enabled": "true",
}
# On one machine: RPC authentication, with a fresh secret per application (Spark makes one
# for local[N]; sparktf for local-cluster, given to the JVM in a private file).
LOCAL_TRANSPORT_SETTINGS = {"spark.authenticate": "true"}
SECRET_CONF = "spark.authenticate.secret"
SECRET_DIR_PREFIX = "sparktf-secret-"  # the scratch directory of a new JVM's private settings
SECRET_FILE_ENV = "SPARKTF_SPARK_SECRET_FILE"
# The names of settings that hold a secret (Spark's own spark.redaction.regex, and the names
# of keys and credentials: spark.executorEnv.HADOOP_TOKEN, spark.hadoop.fs.s3a.secret.key,
# spark.executorEnv.AWS_SECRET_ACCESS_KEY, spark.ssl.keyPassword, ...).
SECRET_NAME = re.compile(
    r"(?i)secret|passw(?:or)?d|token|credential|access[._-]?key|private[._-]?key|signing[._-]?key"
)


class TransportError(SparktfError, ValueError):
    """Spark's authentication is on and the shared secret the master needs is not known."""


def remote_executors(master: str) -> bool:
    """Whether the executors of ``master`` may run on other machines (a standalone master,
    YARN, Kubernetes): every master but ``local``, ``local[N]`` and ``local-cluster``."""
    return bool(master) and not master.startswith("local")


def _on(conf: Mapping[str, str], key: str) -> bool:
    return str(conf.get(key, "false")).strip().lower() == "true"


def transport_defaults(master: str, conf: Mapping[str, str]) -> dict[str, str]:
    """The transport settings sparktf adds for ``master``: where its executors may run on
    other machines (``remote_executors``), each of ``TRANSPORT_SETTINGS`` that ``conf`` (the
    user's configuration: profile, command line, overrides) does not set; on a local master
    (``local``, ``local[N]``, ``local-cluster``) RPC authentication only, since another user
    of the machine could otherwise connect to the driver's ports and read the task closures
    (loopback needs no encryption). A setting the user gives, ``false`` included, wins."""
    wanted = TRANSPORT_SETTINGS if remote_executors(master) else LOCAL_TRANSPORT_SETTINGS
    return {key: value for key, value in wanted.items() if key not in conf}


def transport_secret(master: str, conf: Mapping[str, str]) -> str | None:
    """The shared secret to give the application where Spark does not make one itself: with
    ``spark.authenticate`` on in ``conf`` and no ``spark.authenticate.secret`` there, a
    standalone master's cluster secret (``secret_file``), on ``local-cluster`` a fresh one.
    None otherwise (YARN and Kubernetes make one per application).

    Raises:
        TransportError: a standalone master and no secret file, or one without a secret.
    """
    if not _on(conf, "spark.authenticate") or conf.get(SECRET_CONF):
        return None
    if master.startswith("local-cluster"):
        return secrets.token_hex(32)
    if not master.startswith("spark://"):
        return None
    path = secret_file(master)
    if path is None:
        raise TransportError(
            f"spark.authenticate is on and the standalone master {master} needs its cluster's "
            f"shared secret: set {SECRET_FILE_ENV} to a private file holding it (a "
            f"'{SECRET_CONF} VALUE' line, or the secret alone; scripts/spark-cluster.sh writes "
            "one: DIR/secret.conf), or turn authentication off with --conf "
            "spark.authenticate=false (the run's secrets then travel in clear)"
        )
    return read_secret(path)


def secret_file(master: str) -> Path | None:
    """Where the shared secret of the standalone ``master`` is: ``$SPARKTF_SPARK_SECRET_FILE``,
    else, for the cluster ``scripts/spark-cluster.sh`` runs, its ``SPARK_SECRET_FILE``."""
    if os.environ.get(SECRET_FILE_ENV):
        return Path(os.environ[SECRET_FILE_ENV])
    local = local_cluster_env()
    if local.get("SPARK_MASTER_URL") == master and local.get("SPARK_SECRET_FILE"):
        return Path(local["SPARK_SECRET_FILE"])
    return None


def read_secret(path: str | os.PathLike) -> str:
    """The secret in ``path``: its ``spark.authenticate.secret`` line, or its one word.

    Raises:
        TransportError: the file cannot be read or holds no secret.
    """
    try:
        text = Path(path).read_text()
        mode = os.stat(path).st_mode & 0o777
    except OSError as exc:
        raise TransportError(f"cannot read the Spark secret file {path}: {exc}") from None
    if mode & 0o077:
        log.warning(
            "the Spark secret file %s is readable by others (mode %o): chmod 600", path, mode
        )
    lines = [line.split() for line in text.splitlines() if line.strip() and line[0] != "#"]
    for words in lines:
        if len(words) == 2 and words[0] == SECRET_CONF:
            return words[1]
    if len(lines) == 1 and len(lines[0]) == 1:
        return lines[0][0]
    raise TransportError(f"{path}: no '{SECRET_CONF} VALUE' line and not a secret alone")


def write_private_conf(
    path: str | os.PathLike, conf: Mapping[str, str], *, above: str = ""
) -> Path:
    """Writes ``conf`` as a spark-defaults style file only this user can read (a new file),
    after the lines ``above`` (a later line wins)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        if above:
            out.write(above if above.endswith("\n") else above + "\n")
        out.writelines(f"{key} {value}\n" for key, value in conf.items())
    return Path(path)


def private_properties_args(
    path: str | os.PathLike, conf: Mapping[str, str], *, base: str | os.PathLike | None = None
) -> list[str]:
    """spark-submit arguments that load ``conf`` from the new private file ``path`` on top
    of the properties file ``base`` (default: spark-defaults): ``--extra-properties-file``
    (Spark 4.1 on). Spark 4.0 lacks it, so there ``--properties-file`` of a file holding
    ``base``'s lines (``$SPARK_CONF_DIR/spark-defaults.conf``, else ``$SPARK_HOME/conf/...``
    by default), then ``conf``: it takes the place of ``base``."""
    import pyspark

    major, minor = (int(part) for part in pyspark.__version__.split(".")[:2])
    if (major, minor) >= (4, 1):
        return ["--extra-properties-file", str(write_private_conf(path, conf))]
    if base is None:
        home = os.environ.get("SPARK_HOME") or os.path.dirname(pyspark.__file__)
        conf_dir = os.environ.get("SPARK_CONF_DIR") or os.path.join(home, "conf")
        base = Path(conf_dir) / "spark-defaults.conf"
    above = Path(base).read_text() if Path(base).is_file() else ""
    return ["--properties-file", str(write_private_conf(path, conf, above=above))]


def transport_warning(conf: Mapping[str, str]) -> str | None:
    """What a run should be told when Spark carries its secrets in clear: authentication or RPC
    encryption off in ``conf`` (the application's) with a master whose executors may run on
    other machines; None when they are protected, and for ``local``/``local[N]`` (one process)
    and ``local-cluster`` (its executors reach the driver over loopback only, which other
    users of the machine cannot read)."""
    master = conf.get("spark.master", "")
    if not master or master == "local" or master.startswith(("local[", "local-cluster[")):
        return None
    off = [
        key for key in ("spark.authenticate", "spark.network.crypto.enabled") if not _on(conf, key)
    ]
    if not off:
        return None
    now = ", ".join(f"{key}={conf[key]}" if key in conf else f"{key} unset" for key in off)
    secret = (
        f"; a standalone master also needs its cluster's {SECRET_CONF} ({SECRET_FILE_ENV})"
        if master.startswith("spark://")
        else ""
    )
    settings = " and ".join(f"{key}=true" for key in off)
    return (
        f"Spark's transport is not protected ({now}): the run's secrets (reservation secret, "
        "control tokens, TensorFlowOnSpark's manager keys) travel in clear in Spark's task "
        f"closures between the driver and the executors. Set {settings}"
        f"{secret} (sparktf submit sets them on standalone, YARN and Kubernetes unless the "
        "configuration turns them off)"
    )


def secret_setting(key: str, value: str) -> bool:
    """Whether the setting ``key`` holds a secret: by its name (:data:`SECRET_NAME`), or by
    its value, which holds a secret registered with the redactor
    (:func:`sparktf.security.redact.add_secret`: the run's delegation token in any form)."""
    return bool(SECRET_NAME.search(key)) or redact.holds_secret(str(value))


def private_settings(conf: dict[str, str]) -> dict[str, str]:
    """Takes every secret setting (:func:`secret_setting`) out of ``conf`` and returns them:
    what :func:`private_for_new_jvm` gives a JVM without a command line."""
    return {key: conf.pop(key) for key in [k for k, v in conf.items() if secret_setting(k, v)]}


@contextmanager
def private_for_new_jvm(builder, private: Mapping[str, str]) -> Iterator[Any]:
    """The builder, with the ``private`` settings (the shared secret, a delegation token for
    remote executors) given to the application without a command line: PySpark starts the
    driver's JVM with every setting as a ``--conf`` argument, which any local user reads in
    ``/proc/*/cmdline``, so a JVM yet to start reads them from a private properties file
    (:func:`private_properties_args` through ``PYSPARK_SUBMIT_ARGS``); to a running JVM they go
    as settings."""
    from pyspark import SparkContext

    if not private:
        yield builder
        return
    if getattr(SparkContext, "_gateway", None) is not None:
        for key, value in private.items():
            builder = builder.config(key, value)
        yield builder
        return
    import shlex

    # private (0700) and owned: swept by a later run when this process is killed meanwhile
    directory = scratch.make_dir(SECRET_DIR_PREFIX)
    before = os.environ.get("PYSPARK_SUBMIT_ARGS")
    try:
        given = private_properties_args(Path(directory) / "secret.conf", private)
        args = f"{shlex.join(given)} {before or 'pyspark-shell'}"
        os.environ["PYSPARK_SUBMIT_ARGS"] = args
        yield builder
    finally:
        if before is None:
            os.environ.pop("PYSPARK_SUBMIT_ARGS", None)
        else:
            os.environ["PYSPARK_SUBMIT_ARGS"] = before
        scratch.remove_dir(directory)
