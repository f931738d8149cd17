"""Kerberos for HDFS: whether it is on, whose credentials sparktf uses, and the check that
fails a job before Spark starts when there are none.

Kerberos is on when ``SPARKTF_HDFS_PRINCIPAL`` is set or the Hadoop client configuration
(``core-site.xml``, :mod:`sparktf.security.hadoop_conf`) says
``hadoop.security.authentication=kerberos``. The credentials, first match wins:

1. a delegation token in ``SPARKTF_HDFS_DELEGATION_TOKEN`` (what a run's driver hands its
   executors and TensorFlow processes; :mod:`sparktf.storage.delegation`);
2. the keytab ``SPARKTF_HDFS_KEYTAB`` for the principal ``SPARKTF_HDFS_PRINCIPAL``;
3. the keytab ``spark.kerberos.keytab`` for ``spark.kerberos.principal`` of the Spark
   configuration;
4. the user's ticket cache (``KRB5CCNAME``, else the system default; ``kinit`` fills it).

A keytab login goes into a private in-memory ticket cache of the process, never into the
user's own. ``KRB5_CONFIG`` names the Kerberos configuration when it is not /etc/krb5.conf.
"""

from __future__ import annotations

import getpass
import logging
import os
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from sparktf.errors import SparktfError
from sparktf.security import gss, hadoop_conf, redact

__all__ = [
    "KEYTAB_ENV",
    "KRB5_CONF_PROPERTY",
    "PRINCIPAL_ENV",
    "TOKEN_ENV",
    "TOKEN_FILE_ENV",
    "KerberosError",
    "Login",
    "NoCredentialsError",
    "credential",
    "enabled",
    "login",
    "no_credentials_message",
    "preflight",
    "principal_tried",
    "spark_settings",
]

log = logging.getLogger(__name__)

PRINCIPAL_ENV = "SPARKTF_HDFS_PRINCIPAL"
KEYTAB_ENV = "SPARKTF_HDFS_KEYTAB"
TOKEN_ENV = "SPARKTF_HDFS_DELEGATION_TOKEN"
# The run's token as a Hadoop credentials file, for executor JVMs on this machine.
TOKEN_FILE_ENV = "SPARKTF_HDFS_TOKEN_FILE"
# The run's token for the NameNode's RPC, as Hadoop reads $HADOOP_TOKEN: for executor JVMs on
# other hosts (Spark hands a standalone cluster's executors no token).
RPC_TOKENS_ENV = "SPARKTF_HDFS_RPC_TOKENS"
# The Java system property naming the Kerberos configuration (Java ignores KRB5_CONFIG).
KRB5_CONF_PROPERTY = "java.security.krb5.conf"
# Credentials are acquired again this many seconds before they expire.
_REFRESH_MARGIN_S = 300.0


class KerberosError(SparktfError, PermissionError):
    """HDFS needs Kerberos and sparktf cannot authenticate."""


class NoCredentialsError(KerberosError):
    """Kerberos is on and there is neither a ticket nor a keytab to authenticate with."""


def enabled() -> bool:
    """Whether HDFS is reached with Kerberos (see the module docstring)."""
    if os.environ.get(PRINCIPAL_ENV):
        return True
    value = hadoop_conf.site_properties("core-site.xml").get("hadoop.security.authentication", "")
    return value.strip().lower() == "kerberos"


@dataclass(frozen=True)
class Login:
    """How this process logs in: ``principal`` and ``keytab`` when configured (either may be
    None: no keytab means the ticket cache), and ``source``, the settings they came from."""

    principal: str | None
    keytab: str | None
    source: str


def login(spark_conf: Mapping[str, str] | None = None) -> Login:
    """The configured login: ``SPARKTF_HDFS_PRINCIPAL``/``SPARKTF_HDFS_KEYTAB``, else
    ``spark.kerberos.principal``/``spark.kerberos.keytab`` of ``spark_conf``, else the ticket
    cache (for ``SPARKTF_HDFS_PRINCIPAL`` when only that is set)."""
    principal = os.environ.get(PRINCIPAL_ENV) or None
    keytab = os.environ.get(KEYTAB_ENV) or None
    if keytab:
        return Login(principal, keytab, f"{PRINCIPAL_ENV}/{KEYTAB_ENV}")
    spark_conf = spark_conf or {}
    if spark_conf.get("spark.kerberos.keytab") and not principal:
        return Login(
            spark_conf.get("spark.kerberos.principal") or None,
            spark_conf["spark.kerberos.keytab"],
            "spark.kerberos.principal/spark.kerberos.keytab",
        )
    cache = os.environ.get("KRB5CCNAME") or "the default ticket cache"
    return Login(principal, None, cache)


def principal_tried(who: Login) -> str:
    """The principal named in an error: the configured one, else ``USER@REALM`` (the HDFS
    user and the default realm of the Kerberos configuration)."""
    if who.principal:
        return who.principal
    user = (
        os.environ.get("SPARKTF_HDFS_USER")
        or os.environ.get("HADOOP_USER_NAME")
        or getpass.getuser()
    )
    realm = gss.default_realm()
    return f"{user}@{realm}" if realm else user


def no_credentials_message(principal: str, reason: str) -> str:
    """The message of :class:`NoCredentialsError`: the principal tried, why it failed and how
    to get a ticket."""
    return (
        f"HDFS requires Kerberos, and there is no usable Kerberos ticket or keytab for "
        f"{principal} ({reason}). Get a ticket with `kinit {principal}`, or set "
        f"{PRINCIPAL_ENV}={principal} and {KEYTAB_ENV}=/path/to/its.keytab (or Spark's "
        f"spark.kerberos.principal and spark.kerberos.keytab)"
    )


_cache: dict[tuple, tuple[gss.Credential, float]] = {}
_cache_lock = threading.Lock()


def credential(spark_conf: Mapping[str, str] | None = None) -> gss.Credential:
    """This process's Kerberos credentials for the configured :func:`login`, acquired once
    and again shortly before they expire.

    Raises NoCredentialsError (naming the principal and how to get a ticket) when there are
    none, KerberosError when the KDC does not answer or the GSS-API library is missing."""
    who = login(spark_conf)
    key = (os.getpid(), who, os.environ.get("KRB5CCNAME"), os.environ.get("KRB5_CONFIG"))
    with _cache_lock:
        held = _cache.get(key)
        if held is not None and time.monotonic() < held[1]:
            return held[0]
        try:
            cred = gss.acquire(who.principal, who.keytab)
        except gss.GssUnavailableError as exc:
            raise KerberosError(str(exc)) from exc
        except gss.GssError as exc:
            if "Cannot contact any KDC" in str(exc):  # credentials there, the KDC is not
                raise KerberosError(
                    f"Kerberos login of {principal_tried(who)} ({who.source}) failed: no KDC "
                    f"of its realm answers; check the [realms] of KRB5_CONFIG "
                    f"({os.environ.get('KRB5_CONFIG', '/etc/krb5.conf')}): {exc}"
                ) from exc
            message = no_credentials_message(principal_tried(who), str(exc))
            raise NoCredentialsError(message) from exc
        until = time.monotonic() + max(cred.lifetime - _REFRESH_MARGIN_S, cred.lifetime / 2)
        _cache[key] = (cred, until)
        return cred


def preflight(spark_conf: Mapping[str, str] | None = None) -> str | None:
    """Checks, before Spark starts, that HDFS can be reached when Kerberos is on: returns the
    principal sparktf authenticates as (None when Kerberos is off or a delegation token is
    given).

    A keytab login from ``spark.kerberos.*`` is exported to ``SPARKTF_HDFS_PRINCIPAL`` and
    ``SPARKTF_HDFS_KEYTAB``, so the later requests of this process and of those it starts log
    in the same way.

    Raises NoCredentialsError, naming the principal tried and how to get a ticket, when there
    is no ticket and no keytab."""
    if not enabled() or os.environ.get(TOKEN_ENV):
        return None
    who = login(spark_conf)
    cred = credential(spark_conf)
    log.info("Kerberos: HDFS as %s (%s)", cred.principal, who.source)
    if who.keytab and not os.environ.get(KEYTAB_ENV):  # Spark's keytab: for this process too
        os.environ[PRINCIPAL_ENV] = cred.principal
        os.environ[KEYTAB_ENV] = who.keytab
    return cred.principal


def spark_settings(spark_conf: Mapping[str, str] | None = None) -> dict[str, str]:
    """The Spark settings a session needs to reach a Kerberized HDFS with this process's
    login, merged with ``spark_conf``'s own: the principal and keytab of a keytab login
    (Spark's JVM logs in with them; on YARN and Kubernetes it hands delegation tokens to its
    executors) unless ``spark_conf`` names its own; for executors on this machine (``local``,
    ``local-cluster``, a standalone master on loopback), to which Spark hands no tokens, the
    run's token file (``SPARKTF_HDFS_TOKEN_FILE``) as their ``HADOOP_TOKEN_FILE_LOCATION``
    (they inherit ``SPARKTF_HDFS_DELEGATION_TOKEN`` from this process), for executors
    elsewhere the token itself as their ``SPARKTF_HDFS_DELEGATION_TOKEN`` and, for their JVMs,
    as ``HADOOP_TOKEN`` (in their environment, never on a command line: both are registered
    with the redactor, and the session gives every secret setting in a private file);
    and ``-Djava.security.krb5.conf`` for the driver and executor JVMs (on YARN also the
    application master's) when ``KRB5_CONFIG`` names the Kerberos configuration (Java does
    not read that variable). Empty when Kerberos
    is off."""
    spark_conf = spark_conf or {}
    if not enabled():
        return {}
    who = login(spark_conf)
    settings = {}
    if who.keytab and who.principal and "spark.kerberos.keytab" not in spark_conf:
        settings = {"spark.kerberos.principal": who.principal, "spark.kerberos.keytab": who.keytab}
    token_file, token = os.environ.get(TOKEN_FILE_ENV), os.environ.get(TOKEN_ENV)
    if _same_machine(spark_conf.get("spark.master", "")):
        if token_file:  # the executors inherit this process's environment, token included
            settings["spark.executorEnv.HADOOP_TOKEN_FILE_LOCATION"] = token_file
    elif token:
        rpc = os.environ.get(RPC_TOKENS_ENV, "")
        # secrets in every form: redacted in logs, and given to a JVM in a private file only
        # (sparktf.spark.transport.private_settings finds them by name and by value)
        redact.add_secret(token, rpc, *rpc.split(","))
        settings[f"spark.executorEnv.{TOKEN_ENV}"] = token
        if rpc:  # their JVMs: Hadoop's UGI reads $HADOOP_TOKEN
            settings["spark.executorEnv.HADOOP_TOKEN"] = rpc
    krb5_conf = os.environ.get("KRB5_CONFIG")
    if krb5_conf:
        flag = f"-D{KRB5_CONF_PROPERTY}={krb5_conf}"
        keys = ["spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"]
        if spark_conf.get("spark.master", "") == "yarn":  # client mode: the AM is a JVM too
            keys.append("spark.yarn.am.extraJavaOptions")
        for key in keys:
            options = spark_conf.get(key, "")
            if KRB5_CONF_PROPERTY not in options:
                settings[key] = f"{options} {flag}".strip()
    return settings


def _same_machine(master: str) -> bool:
    """Whether the executors of ``master`` run on this machine (they can read a local file)."""
    if master.startswith("local"):
        return True
    host = master.removeprefix("spark://").split(":")[0]
    return master.startswith("spark://") and host in ("127.0.0.1", "localhost")
