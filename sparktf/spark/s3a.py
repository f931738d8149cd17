"""Hadoop's S3A connector for Spark's ``s3a://`` (and ``s3://``) paths: its jars, which
``scripts/setup.sh`` fetches at the Hadoop version pyspark bundles (``hadoop-aws`` and the
AWS SDK v2 modules it uses, ``.local/hadoop/s3a-VERSION``, or ``$SPARKTF_S3A_JARS``), and
the ``spark.hadoop.fs.s3a.*`` settings made from the AWS settings sparktf's Python side uses
(:mod:`sparktf.security.aws`: the standard variables, the shared files and their profiles,
``AWS_ENDPOINT_URL``, session tokens).

The keys go to Spark as ``fs.s3a.access.key``, ``fs.s3a.secret.key`` and
``fs.s3a.session.token`` and, for the Python of executors on other machines, as
``spark.executorEnv.AWS_*``: all settings that :func:`sparktf.spark.transport.private_settings`
moves into a private file, never onto a JVM's command line.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlparse

from sparktf import paths
from sparktf.security import aws

__all__ = ["S3A_JARS_ENV", "hadoop_version", "s3a_jars", "spark_settings"]

log = logging.getLogger(__name__)

S3A_JARS_ENV = "SPARKTF_S3A_JARS"
S3A_FS = "org.apache.hadoop.fs.s3a.S3AFileSystem"
_PROVIDERS = "org.apache.hadoop.fs.s3a"


@lru_cache(maxsize=1)
def hadoop_version() -> str | None:
    """The Hadoop version of pyspark's own Hadoop client (its ``hadoop-client-api`` jar)."""
    import pyspark

    found = glob.glob(
        os.path.join(os.path.dirname(pyspark.__file__), "jars", "hadoop-client-api-*.jar")
    )
    if not found:
        return None
    return os.path.basename(found[0])[len("hadoop-client-api-") : -len(".jar")]


def s3a_jars() -> list[str]:
    """The jars of the S3A connector for pyspark's Hadoop version: ``$SPARKTF_S3A_JARS`` (a
    directory), else ``hadoop/s3a-VERSION`` of the checkout's ``.local`` or of
    ``$SPARKTF_HOME``; [] when there are none."""
    version = hadoop_version()
    candidates = []
    if os.environ.get(S3A_JARS_ENV):
        candidates.append(Path(os.environ[S3A_JARS_ENV]))
    elif version:
        checkout = paths.source_checkout()
        if checkout is not None:
            candidates.append(checkout / ".local" / "hadoop" / f"s3a-{version}")
        candidates.append(paths.home() / "hadoop" / f"s3a-{version}")
    for directory in candidates:
        jars = sorted(glob.glob(str(directory / "*.jar")))
        if any(os.path.basename(j).startswith("hadoop-aws-") for j in jars):
            return jars
    return []


def spark_settings(conf: Mapping[str, str]) -> dict[str, str]:
    """The settings that let Spark read and write ``s3a://`` and ``s3://`` with this
    process's AWS settings, for a session about to start (``conf``: its settings so far,
    which win): the connector's jars added to ``spark.jars``, the endpoint (path-style
    addressing for a store that is not AWS's), the region and the credentials. Empty when
    this process has no AWS setting at all or the jars are missing (said once at INFO)."""
    if not aws.aws_configured():
        return {}
    jars = s3a_jars()
    if not jars:
        log.info(
            "AWS settings found but no S3A connector for Hadoop %s (run scripts/setup.sh, or "
            "set %s): Spark cannot read s3a:// paths",
            hadoop_version(),
            S3A_JARS_ENV,
        )
        return {}
    settings = aws.s3_settings()
    given = [j for j in conf.get("spark.jars", "").split(",") if j]
    out = {
        "spark.jars": ",".join(dict.fromkeys(given + jars)),
        "spark.hadoop.fs.s3.impl": S3A_FS,
        "spark.hadoop.fs.s3a.connection.establish.timeout": "15s",
    }
    if settings.endpoint:
        url = urlparse(settings.endpoint)
        out["spark.hadoop.fs.s3a.endpoint"] = settings.endpoint
        out["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(url.scheme == "https").lower()
        out["spark.hadoop.fs.s3a.path.style.access"] = str(settings.path_style).lower()
    if settings.region:
        out["spark.hadoop.fs.s3a.endpoint.region"] = settings.region
    if settings.access_key:
        out["spark.hadoop.fs.s3a.access.key"] = settings.access_key
        out["spark.hadoop.fs.s3a.secret.key"] = settings.secret_key or ""
        provider = "SimpleAWSCredentialsProvider"
        if settings.token:
            out["spark.hadoop.fs.s3a.session.token"] = settings.token
            provider = "TemporaryAWSCredentialsProvider"
        out["spark.hadoop.fs.s3a.aws.credentials.provider"] = f"{_PROVIDERS}.{provider}"
        # the executors' Python (sparktf's readers and writers) resolves the same, anywhere
        env = {
            "AWS_ACCESS_KEY_ID": settings.access_key,
            "AWS_SECRET_ACCESS_KEY": settings.secret_key or "",
            "AWS_SESSION_TOKEN": settings.token,
            "AWS_ENDPOINT_URL_S3": settings.endpoint,
            "AWS_REGION": settings.region,
        }
        out.update({f"spark.executorEnv.{k}": v for k, v in env.items() if v})
    return {k: v for k, v in out.items() if k == "spark.jars" or k not in conf}
