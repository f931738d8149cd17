"""SPNEGO (``Authorization: Negotiate``) for the WebHDFS requests of a ``requests`` session.

The NameNode answers a request it authenticated with a ``hadoop.auth`` cookie, which the
session keeps and sends on the next requests: a Negotiate header is made for a request only
when the session holds no such cookie, and again once when the NameNode answers 401 (the
cookie expired). A request whose URL carries a delegation token (the DataNode a NameNode
redirects to) goes without one.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable
from urllib.parse import urlparse

from sparktf.security import gss
from sparktf.security.kerberos import KerberosError

__all__ = ["NegotiateAuth"]

log = logging.getLogger(__name__)

_COOKIE = "hadoop.auth="


def _negotiates(response) -> bool:
    offered = response.headers.get("WWW-Authenticate", "")
    return response.status_code == 401 and "negotiate" in offered.lower()


class NegotiateAuth:
    """A ``requests`` auth object (``session.auth = NegotiateAuth(...)``) that authenticates
    with SPNEGO to the service ``HTTP@host`` of each request's URL.

    ``credential`` returns the Kerberos credentials to use (called for each new header, so
    it may refresh them); it raises when there are none, and that error reaches the
    caller of the request."""

    def __init__(self, credential: Callable[[], gss.Credential]):
        self.credential = credential

    def header(self, url: str) -> str:
        """The ``Negotiate`` header value for a request to ``url``; raises KerberosError when
        the service ticket cannot be had (KDC unreachable, no ``HTTP/host`` principal)."""
        credential = self.credential()
        host = urlparse(url).hostname or "localhost"
        try:
            token = gss.spnego_token(host, credential)
        except gss.GssError as exc:
            who = credential.principal if credential else "the default principal"
            raise KerberosError(f"Kerberos (SPNEGO) to WebHDFS at {host} as {who}: {exc}") from exc
        return "Negotiate " + base64.b64encode(token).decode()

    def __call__(self, request):
        if "delegation=" in (urlparse(request.url).query or ""):
            return request  # a DataNode redirect: the NameNode put a token in the URL
        if _COOKIE not in request.headers.get("Cookie", ""):
            request.headers["Authorization"] = self.header(request.url)
        request.register_hook("response", self._retry_401)
        return request

    def _retry_401(self, response, **kwargs):
        """Sends a request again, with a fresh Negotiate header, when the NameNode refused it
        without one (a stale cookie) or asks to negotiate again."""
        request = response.request
        if not _negotiates(response) or getattr(request, "_sparktf_retried", False):
            return response
        response.content  # noqa: B018 - drains the body so the connection can be reused
        response.close()
        retry = request.copy()
        retry._sparktf_retried = True
        retry.headers.pop("Cookie", None)
        retry.headers["Authorization"] = self.header(retry.url)
        log.debug("WebHDFS asked to negotiate again: a fresh SPNEGO token")
        sent = response.connection.send(retry, **kwargs)
        sent.history.append(response)
        sent.request = retry
        return sent
