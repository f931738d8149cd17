"""Spark sessions: ``get_session`` (under ``spark-submit`` the submitted configuration wins and
only what is missing is filled in; from plain Python it reads the profile and starts the session
itself; given a Spark Connect URL it returns a Connect session, ``sparktf.remote``) and
``job_session`` for the jobs.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from sparktf import remote as connect
from sparktf.remote import is_connect
from sparktf.security import kerberos
from sparktf.security.redact import quiet_py4j
from sparktf.spark import launches, s3a, ui
from sparktf.spark.profiles import (
    PROPAGATED_ENV,
    cluster_master,
    executor_sizing,
    log4j_conf,
    profile_conf,
    remove_work_dir,
    use_local_spark_home,
)
from sparktf.spark.transport import (
    SECRET_CONF,
    private_for_new_jvm,
    private_settings,
    transport_defaults,
    transport_secret,
)

__all__ = [
    "get_session",
    "job_session",
    "launched_by_spark_submit",
    "quiet_py4j",
    "session_conf",
    "stop_session",
]

log = logging.getLogger(__name__)


def session_conf(
    profile: str = "local", overrides: Mapping[str, str] | None = None
) -> dict[str, str]:
    """The full configuration ``get_session`` would apply outside spark-submit (without the
    shared secret a standalone or local-cluster master needs: ``transport_secret``)."""
    conf = profile_conf(profile)
    master = cluster_master(profile)
    if master:
        conf["spark.master"] = master
    if conf.get("spark.master", "").startswith("spark://127.0.0.1:"):
        conf.setdefault("spark.driver.host", "127.0.0.1")  # a loopback cluster: stay on it
        conf.setdefault("spark.driver.bindAddress", "127.0.0.1")
    conf.setdefault("spark.python.worker.reuse", "true")
    python = os.environ.get("PYSPARK_PYTHON", sys.executable)
    conf.setdefault("spark.pyspark.python", python)
    conf.setdefault("spark.pyspark.driver.python", sys.executable)
    for name in PROPAGATED_ENV:
        if os.environ.get(name):
            conf.setdefault(f"spark.executorEnv.{name}", os.environ[name])
    if not _debug_logging():  # the driver JVM's console: warnings only (conf/log4j2.properties)
        quiet = f"-Dlog4j2.configurationFile={log4j_conf().resolve().as_uri()}"
        java = conf.get("spark.driver.extraJavaOptions", "")
        conf["spark.driver.extraJavaOptions"] = f"{java} {quiet}".strip()
    conf.update(overrides or {})
    # on standalone, YARN and Kubernetes: Spark's transport protected unless the profile or
    # the overrides say otherwise
    conf.update(transport_defaults(conf.get("spark.master", ""), conf))
    return conf


def _debug_logging() -> bool:
    """True when sparktf logs at DEBUG: Spark's own INFO lines are then wanted too."""
    level = os.environ.get("SPARKTF_LOG_LEVEL", "").upper()
    return level == "DEBUG" or logging.getLogger().getEffectiveLevel() <= logging.DEBUG


def get_session(
    app_name: str = "sparktf",
    profile: str | None = None,
    overrides: Mapping[str, str] | None = None,
    remote: str | None = None,
):
    """Returns the active SparkSession, or builds one from ``profile`` and ``overrides``.

    With a Spark Connect URL (``remote``, else ``$SPARK_REMOTE`` outside spark-submit) it
    returns ``sparktf.remote.connect_session``'s session: the profile is not read, only the
    overrides that are runtime settings apply.

    ``profile`` defaults to ``$SPARKTF_PROFILE`` or "local". When launched by spark-submit,
    the submitted settings are kept and the profile is not read. Otherwise a master whose
    executors may run elsewhere gets ``TRANSPORT_SETTINGS`` unless the configuration sets
    them, and the shared secret a standalone master needs (``transport_secret``) and every
    other setting that holds a secret (:func:`~sparktf.spark.transport.private_settings`:
    the run's delegation token in both its forms for executors on other machines, keys,
    passwords) go to the JVM in a private file, never on its command line
    (:func:`~sparktf.spark.transport.private_for_new_jvm`).

    Raises:
        TransportError: authentication on, a standalone master, and its secret not known.
    """
    from pyspark.sql import SparkSession

    quiet_py4j()
    url = connect.remote_url(remote, spark_submit=launched_by_spark_submit())
    if url is not None:
        kerberos.preflight(dict(overrides or {}))  # this process still reads and writes HDFS
        return connect.connect_session(app_name, url, overrides)
    if os.environ.pop(connect.REMOTE_ENV, None):  # PySpark would go to Connect with it
        log.info("a classic Spark session: %s ignored", connect.REMOTE_ENV)
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
    private: dict[str, str] = {}
    if launched_by_spark_submit():
        kerberos.preflight()
        submitted = _submitted_conf()
        settings = _kerberos_under_submit(submitted)
        ui_public, private = ui.protect_settings({**submitted, **(overrides or {})})
        for key, value in {**settings, **ui_public, **(overrides or {})}.items():
            builder = builder.config(key, value)
    else:
        profile = profile or os.environ.get("SPARKTF_PROFILE", "local")
        conf = session_conf(profile, overrides)
        conf.update(_fitted_executors(conf, overrides or {}))
        kerberos.preflight(conf)  # no ticket and no keytab: fail before the JVM starts
        conf.update(kerberos.spark_settings(conf))
        conf.update(s3a.spark_settings(conf))  # s3a:// with this process's AWS settings
        if conf.get("spark.master", "").startswith(("local", "local-cluster")):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # stay on loopback
        use_local_spark_home(conf.get("spark.master", ""))  # work dirs out of site-packages
        log.info("starting Spark (%s profile, master %s)", profile, conf.get("spark.master"))
        secret = conf.pop(SECRET_CONF, None) or transport_secret(conf.get("spark.master", ""), conf)
        if secret:
            private[SECRET_CONF] = secret
        ui_public, ui_private = ui.protect_settings(conf)
        conf.update(ui_public)
        private.update(ui_private)
        # every setting that holds a secret (the run's token in both its forms for executors
        # elsewhere, keys, passwords), by its name or by its value: never on a command line
        private.update(private_settings(conf))
        for key, value in conf.items():
            builder = builder.config(key, value)
    with private_for_new_jvm(builder, private) as builder:
        spark = builder.getOrCreate()
    if ui.KEY_CONF in private:  # the UI answers its user only: the user's token
        if ui.publish_token(spark.sparkContext, private[ui.KEY_CONF]) is not None:
            # gone with the application, however it is stopped (spark.stop() included)
            atexit.register(ui.forget_token, spark.sparkContext.applicationId)
    default = "INFO" if _debug_logging() else "WARN"
    spark.sparkContext.setLogLevel(os.environ.get("SPARKTF_SPARK_LOG_LEVEL", default))
    launches.watch(spark.sparkContext)  # executors that die at start fail it, not hang it
    # A script that ends without spark.stop() ends quietly: stopped here, before Python exits,
    # the executors are not relaunched (and reported lost) while the JVM shuts down.
    atexit.register(_stop_at_exit, spark)
    return spark


def _kerberos_under_submit(submitted: Mapping[str, str]) -> dict[str, str]:
    """Kerberos for a driver that spark-submit started: its JVM already runs, so the Kerberos
    configuration ``KRB5_CONFIG`` names is set in it now (``java.security.krb5.conf``, unless
    spark-submit gave one), before Spark's first Hadoop login; the JVM logs in with this
    process's keytab (``kerberos.login``) unless spark-submit logged it in already
    (``--principal``/``--keytab``); and the settings the executors
    need (``kerberos.spark_settings``: that option for their JVMs, the run's token), which
    apply because they start with this SparkContext (``submitted``: the settings spark-submit
    gave). Empty when Kerberos is off (a token this driver was given still goes to the
    executors)."""
    if not kerberos.enabled():
        token = os.environ.get(kerberos.TOKEN_ENV)
        return {f"spark.executorEnv.{kerberos.TOKEN_ENV}": token} if token else {}
    from pyspark import SparkContext

    jvm = SparkContext._jvm  # started by _submitted_conf
    krb5_conf = os.environ.get("KRB5_CONFIG")
    if krb5_conf and not jvm.java.lang.System.getProperty(kerberos.KRB5_CONF_PROPERTY):
        jvm.java.lang.System.setProperty(kerberos.KRB5_CONF_PROPERTY, krb5_conf)
        try:  # forget a configuration read before (Spark opens sun.security.krb5 to us)
            jvm.sun.security.krb5.Config.refresh()
        except Exception as exc:  # not read before: nothing to forget
            log.debug("Kerberos configuration not refreshed: %s", exc)
        log.info("Kerberos: the driver JVM reads %s (KRB5_CONFIG)", krb5_conf)
    who = kerberos.login()
    users = jvm.org.apache.hadoop.security.UserGroupInformation
    if who.keytab and not users.isLoginKeytabBased():
        principal = who.principal or kerberos.credential().principal
        users.loginUserFromKeytab(principal, who.keytab)
        log.info("Kerberos: the driver JVM logged in as %s from %s", principal, who.keytab)
    settings = kerberos.spark_settings(dict(submitted))
    starts_later = ("spark.executor", "spark.yarn.am.")  # the JVMs this SparkContext starts
    settings = {key: value for key, value in settings.items() if key.startswith(starts_later)}
    token = os.environ.get(kerberos.TOKEN_ENV)  # a token this driver was given
    if token:
        settings.setdefault(f"spark.executorEnv.{kerberos.TOKEN_ENV}", token)
    return settings


def _fitted_executors(conf: dict[str, str], given: Mapping[str, str]) -> dict[str, str]:
    """A standalone or YARN master from plain Python: the profile's executors shrunk to what
    the cluster offers (``executor_sizing``, as ``sparktf submit`` does), unless the caller
    sized them (``given``: a training job does, for its run). Executors that cannot be
    placed even shrunk are left as they are (Spark waits for room)."""
    from sparktf.placement import PlacementError

    if {"spark.executor.cores", "spark.executor.memory"} & set(given):
        return {}
    wanted = int(conf.get("spark.executor.instances", "1") or 1)
    for count in dict.fromkeys((wanted, 1)):  # as many as asked, else one
        try:  # {} for masters whose cluster it cannot read (only standalone and YARN)
            return executor_sizing(conf.get("spark.master", ""), conf, count)
        except PlacementError as exc:
            log.info("executors as configured: %s", exc)
    return {}


def _submitted_conf() -> dict[str, str]:
    """The settings spark-submit gave the driver's JVM (already running)."""
    from pyspark import SparkConf, SparkContext

    SparkContext._ensure_initialized()
    return dict(SparkConf().getAll())


def _stop_at_exit(spark) -> None:
    try:
        if not is_connect(spark) and spark.sparkContext._jsc is not None:
            stop_session(spark)
    except Exception as exc:  # the JVM may already be gone: nothing left to stop
        log.debug("stopping Spark at exit: %s", exc)


def stop_session(spark) -> None:
    """Stops ``spark``; a ``local-cluster`` application's work directory (its executors'
    logs and jars, :func:`~sparktf.spark.profiles.local_spark_home`) goes with it once the
    stop succeeded."""
    app_id = None if is_connect(spark) else spark.sparkContext.applicationId
    spark.stop()
    remove_work_dir(app_id)
    ui.forget_token(app_id)


@contextmanager
def job_session(
    app_name: str,
    profile: str | None = None,
    overrides: Mapping[str, str] | None = None,
    spark=None,
    remote: str | None = None,
) -> Iterator[Any]:
    """The session a job runs on: ``spark`` when its caller has one (a notebook, a test, a
    pipeline running several jobs), left running; otherwise ``get_session``'s (a Spark
    Connect one with ``remote``), stopped when the job ends (a clean stop: executors are not
    relaunched at exit; a Connect session is released on the server)."""
    if spark is not None:
        yield spark
        return
    session = get_session(app_name, profile=profile, overrides=overrides, remote=remote)
    try:
        yield session
    finally:
        stop_session(session)


def launched_by_spark_submit() -> bool:
    """Whether this Python driver was started by spark-submit."""
    # spark-submit starts the Python driver with PYSPARK_GATEWAY_PORT set to its own JVM.
    return "PYSPARK_GATEWAY_PORT" in os.environ
