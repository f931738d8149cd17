"""Hadoop client security below the storage layer: the client configuration and Kerberos.

- :mod:`~sparktf.security.hadoop_conf`: the Hadoop configuration directory and its properties;
- :mod:`~sparktf.security.gss`: a ctypes binding of MIT Kerberos' GSS-API (no build needed);
- :mod:`~sparktf.security.kerberos`: whether Kerberos is on, the login, the check that fails a
  job before Spark starts, the Spark settings;
- :mod:`~sparktf.security.spnego`: ``Authorization: Negotiate`` for ``requests`` sessions;
- :mod:`~sparktf.security.redact`: delegation tokens kept out of every log record.

The WebHDFS clients that use them, and the delegation tokens of a run, are in
:mod:`sparktf.storage.hdfs` and :mod:`sparktf.storage.delegation`.
"""

from __future__ import annotations

from sparktf.security.kerberos import (
    KerberosError,
    NoCredentialsError,
    enabled,
    preflight,
    spark_settings,
)

__all__ = ["KerberosError", "NoCredentialsError", "enabled", "preflight", "spark_settings"]
