"""The driver's web UI kept to its user on a shared cluster.

Spark's UI listens on every interface of the driver's host (``SPARK_LOCAL_IP`` when set) and
answers anyone who reaches it: the jobs, the SQL plans, the environment, the executors' logs.
On YARN it is reached through the ResourceManager's proxy, which Spark's own filter enforces;
on a standalone cluster nothing guards it. There sparktf turns on Spark's ``JWSFilter``
(Spark 4.0 on): every request must carry ``Authorization: Bearer <token>``, a JSON web token
signed with a key made for the application. The key reaches the JVM like the cluster's secret
(never on a command line); the token is written to a private file of the user's, named in the
log, so that the user, and only the user, can open the UI::

    curl -H "Authorization: Bearer $(cat ~/.local/share/sparktf/ui/app-....token)" http://drv:4040/

A browser needs the header too (a header extension, or ``ssh -L`` to the driver's host and a
local proxy that adds it). ``spark.sparktf.ui.protect=false``, or the user's own
``spark.ui.filters``, leaves the UI as Spark has it.
"""

from __future__ import annotations

import base64
import getpass
import hashlib
import hmac
import json
import logging
import os
import secrets
from collections.abc import Mapping
from pathlib import Path

from sparktf import paths

__all__ = [
    "JWS_FILTER",
    "KEY_CONF",
    "PROTECT_CONF",
    "bearer_token",
    "forget_token",
    "protect_settings",
    "publish_token",
    "token_file",
]

log = logging.getLogger(__name__)

JWS_FILTER = "org.apache.spark.ui.JWSFilter"
KEY_CONF = f"spark.{JWS_FILTER}.param.secretKey"
PROTECT_CONF = "spark.sparktf.ui.protect"
_HEADER = {"alg": "HS256", "typ": "JWT"}


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def _b64url_decode(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _off(conf: Mapping[str, str], key: str, default: str = "true") -> bool:
    return str(conf.get(key, default)).strip().lower() == "false"


def protect_settings(conf: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """The settings that put the driver's UI behind a bearer token, for the application
    settings ``conf``: ``(public, private)``, the private ones (the signing key) to be given
    without a command line. Empty unless the master is a standalone one (``spark://``), the
    UI is on, and neither ``spark.ui.filters`` nor ``spark.sparktf.ui.protect=false`` is
    set."""
    if not str(conf.get("spark.master", "")).startswith("spark://"):
        return {}, {}
    if _off(conf, "spark.ui.enabled") or _off(conf, PROTECT_CONF) or conf.get("spark.ui.filters"):
        return {}, {}
    return {"spark.ui.filters": JWS_FILTER}, {KEY_CONF: _b64url(secrets.token_bytes(32))}


def bearer_token(key: str, subject: str) -> str:
    """A JSON web token (HS256) for ``subject`` signed with ``key`` (base64url, as
    :data:`KEY_CONF` holds it): what ``JWSFilter`` accepts."""
    header = _b64url(json.dumps(_HEADER, separators=(",", ":")).encode())
    payload = _b64url(json.dumps({"sub": subject}, separators=(",", ":")).encode())
    signed = f"{header}.{payload}".encode()
    signature = hmac.new(_b64url_decode(key), signed, hashlib.sha256).digest()
    return f"{header}.{payload}.{_b64url(signature)}"


def token_file(app_id: str) -> Path:
    """Where the UI token of the application ``app_id`` is kept (``home()/ui``, private;
    not created here)."""
    return paths.home() / "ui" / f"{app_id}.token"


def publish_token(sc, key: str) -> Path | None:
    """Writes the bearer token of the UI of ``sc`` (a SparkContext whose UI ``key`` guards)
    to :func:`token_file`, readable by this user only, and logs how to use it; returns the
    file (None when the application has no UI)."""
    url = sc.uiWebUrl
    if not url:
        return None
    paths.state_dir("ui")  # created private
    path = token_file(sc.applicationId)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(bearer_token(key, getpass.getuser()) + "\n")
    log.info(
        'the Spark UI at %s asks for a bearer token: curl -H "Authorization: Bearer $(cat %s)" %s',
        url,
        path,
        url,
    )
    return path


def forget_token(app_id: str | None) -> None:
    """Removes the UI token of ``app_id`` (the application has ended: its key with it)."""
    if app_id:
        try:
            token_file(app_id).unlink(missing_ok=True)
        except OSError as exc:
            log.debug("UI token of %s not removed: %s", app_id, exc)
