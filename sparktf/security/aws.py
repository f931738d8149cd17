"""AWS credentials and S3 settings, resolved the way AWS's own tools resolve them (botocore):
what sparktf's S3 client (:mod:`sparktf.storage.s3`) and Spark's S3A connector
(:mod:`sparktf.spark.s3a`) both use; the secret key and session token are registered with
the redactor as soon as they are read.

Credentials: ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` (with ``AWS_SESSION_TOKEN`` for
temporary ones), else the profile ``AWS_PROFILE`` (else ``default``) of the shared
credentials and config files (``~/.aws/credentials``, ``~/.aws/config``, or
``AWS_SHARED_CREDENTIALS_FILE``/``AWS_CONFIG_FILE``: keys, assumed roles, SSO, a credential
process), else a container's or an instance's role. Endpoint: ``AWS_ENDPOINT_URL_S3``, else
``AWS_ENDPOINT_URL``, else the profile's ``endpoint_url``, else AWS's. Region:
``AWS_REGION``, ``AWS_DEFAULT_REGION`` or the profile's.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlparse

from sparktf.security import redact

__all__ = ["S3Settings", "aws_configured", "env_key", "s3_settings", "settings_for"]

# The variables of botocore's resolution (credentials, profile, files, endpoint, region):
# settings are resolved again when one of them changes.
_ENV_PREFIX = "AWS_"


def env_key() -> tuple:
    """The ``AWS_*`` variables now: what the resolution depends on besides the files."""
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_ENV_PREFIX)))


def aws_configured() -> bool:
    """Whether this process was given any AWS setting: an ``AWS_*`` variable, or the shared
    config or credentials file. (Without one, resolving would only ask an instance metadata
    service, which sparktf leaves to the cloud machines that have one.)"""
    if env_key():
        return True
    home = Path.home() / ".aws"
    return (home / "credentials").is_file() or (home / "config").is_file()


@dataclass(frozen=True)
class S3Settings:
    """What an S3 client of this process uses, resolved as AWS's tools do (module docstring).

    ``method`` says where the credentials came from, in botocore's words (``env``,
    ``shared-credentials-file``, ``config-file``, ``assume-role``, ``sso``, ``iam-role``,
    ...); None when there are none. ``endpoint`` is None for AWS's own."""

    endpoint: str | None
    region: str | None
    profile: str | None
    path_style: bool
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    token: str | None = field(default=None, repr=False)
    method: str | None = None

    def describe(self) -> str:
        """The endpoint and the credentials' source, for messages (never a secret)."""
        where = self.endpoint or f"AWS S3 ({self.region or 'default region'})"
        if self.method is None:
            return f"{where}, no credentials found"
        profile = f", profile {self.profile}" if self.profile else ""
        temporary = ", with a session token" if self.token else ""
        return f"{where}, credentials from {self.method}{profile}{temporary}"


def s3_settings() -> S3Settings:
    """The endpoint, region and credentials this process's S3 client uses (resolved again
    when an ``AWS_*`` variable changes); registers the secret key and session token with the
    redactor. No credentials at all is not an error here: the store may allow anonymous
    reads, and a request then fails naming what is missing."""
    return settings_for(env_key())


@lru_cache(maxsize=8)
def settings_for(env: tuple) -> S3Settings:
    """The settings for the ``AWS_*`` variables ``env`` (:func:`env_key`), cached."""
    import botocore.session

    session = botocore.session.Session()
    profile = session.get_config_variable("profile") or os.environ.get("AWS_PROFILE")
    region = os.environ.get("AWS_REGION") or session.get_config_variable("region")
    endpoint = _endpoint(session)
    path_style = endpoint is not None and not _is_aws(endpoint)
    credentials = session.get_credentials()
    if credentials is None:
        return S3Settings(endpoint, region, profile, path_style)
    frozen = credentials.get_frozen_credentials()
    redact.add_secret(frozen.secret_key, frozen.token)
    return S3Settings(
        endpoint,
        region,
        profile,
        path_style,
        access_key=frozen.access_key,
        secret_key=frozen.secret_key,
        token=frozen.token or None,
        method=getattr(credentials, "method", None) or "botocore",
    )


def _endpoint(session) -> str | None:
    """The S3 endpoint the user gave (``AWS_ENDPOINT_URL_S3``, ``AWS_ENDPOINT_URL``, the
    profile's ``endpoint_url`` or its ``s3`` section's), None for AWS's own."""
    for name in ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL"):
        if os.environ.get(name):
            return os.environ[name].rstrip("/")
    try:
        config = session.get_scoped_config()
    except Exception:  # a profile that does not exist: botocore says so on first use
        return None
    nested = config.get("s3")
    if isinstance(nested, dict) and nested.get("endpoint_url"):
        return str(nested["endpoint_url"]).rstrip("/")
    services = config.get("services")
    if services:
        with contextlib.suppress(Exception):
            section = session.full_config.get("services", {}).get(services, {})
            url = (section.get("s3") or {}).get("endpoint_url")
            if url:
                return str(url).rstrip("/")
    url = config.get("endpoint_url")
    return str(url).rstrip("/") if url else None


def _is_aws(endpoint: str) -> bool:
    host = urlparse(endpoint).hostname or ""
    return host.endswith((".amazonaws.com", ".amazonaws.com.cn"))
