"""SPNEGO (``Authorization: Negotiate``) for the WebHDFS requests of a ``requests`` session.

The NameNode answers a request it authenticated with a ``hadoop.auth`` cookie, which the
session keeps and sends on the next requests: a Negotiate header is made for a request only
when the session holds no such cookie, and again once when the NameNode answers 401 (the
cookie expired). The answer to a Negotiate request must carry the NameNode's own SPNEGO
token, which is checked (mutual authentication): a server that cannot prove it holds the
``HTTP/host`` key is not believed. A request whose URL carries a delegation token (the
DataNode a NameNode redirects to) goes without one.
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


def _reply_token(response) -> bytes | None:
    """The server's SPNEGO reply (``WWW-Authenticate: Negotiate <base64>``), or None."""
    for offer in response.headers.get("WWW-Authenticate", "").split(","):
        scheme, _, data = offer.strip().partition(" ")
        if scheme.lower() == "negotiate" and data.strip():
            try:
                return base64.b64decode(data.strip(), validate=True)
            except ValueError:
                return None
    return None


class NegotiateAuth:
    """A ``requests`` auth object (``session.auth = NegotiateAuth(...)``) that authenticates
    with SPNEGO to the service ``HTTP@host`` of each request's URL, and checks that the
    server authenticated itself in return (mutual authentication): an answer to a Negotiate
    request must carry the server's reply token (``WWW-Authenticate: Negotiate ...``), which
    only a holder of the ``HTTP/host`` key can make; otherwise the request raises
    KerberosError and its answer is not used.

    ``credential`` returns the Kerberos credentials to use (called for each new header, so
    it may refresh them); it raises when there are none, and that error reaches the
    caller of the request."""

    def __init__(self, credential: Callable[[], gss.Credential]):
        self.credential = credential

    def context(self, url: str) -> gss.SpnegoContext:
        """A SPNEGO context for a request to ``url`` (its ``token`` makes the header); raises
        KerberosError when the service ticket cannot be had (KDC unreachable, no
        ``HTTP/host`` principal)."""
        credential = self.credential()
        host = urlparse(url).hostname or "localhost"
        try:
            return gss.SpnegoContext(host, credential)
        except gss.GssError as exc:
            who = credential.principal if credential else "the default principal"
            raise KerberosError(f"Kerberos (SPNEGO) to WebHDFS at {host} as {who}: {exc}") from exc

    def _negotiate(self, request) -> None:
        context = self.context(request.url)
        request.headers["Authorization"] = "Negotiate " + base64.b64encode(context.token).decode()
        request._sparktf_spnego = context

    def __call__(self, request):
        if "delegation=" in (urlparse(request.url).query or ""):
            return request  # a DataNode redirect: the NameNode put a token in the URL
        if _COOKIE not in request.headers.get("Cookie", ""):
            self._negotiate(request)
        request.register_hook("response", self._on_response)
        return request

    def _on_response(self, response, **kwargs):
        """Sends a request again, with a fresh Negotiate header, when the NameNode refused it
        without one (a stale cookie) or asks to negotiate again; checks the server's reply
        to a Negotiate request."""
        request = response.request
        if not _negotiates(response) or getattr(request, "_sparktf_retried", False):
            return self._verified(response)
        _close(request)
        response.content  # noqa: B018 - drains the body so the connection can be reused
        response.close()
        retry = request.copy()
        retry._sparktf_retried = True
        retry.headers.pop("Cookie", None)
        self._negotiate(retry)
        log.debug("WebHDFS asked to negotiate again: a fresh SPNEGO token")
        sent = response.connection.send(retry, **kwargs)
        sent.history.append(response)
        sent.request = retry
        return self._verified(sent)

    def _verified(self, response):
        """``response``, once the server's reply to this request's Negotiate header (if it
        sent one) completes the mutual authentication; a refusal (4xx, 5xx) is left to the
        caller, which reports its status."""
        context = getattr(response.request, "_sparktf_spnego", None)
        if context is None:
            return response
        try:
            if response.status_code >= 400:
                return response
            host = context.host
            reply = _reply_token(response)
            if reply is None:
                raise KerberosError(
                    f"WebHDFS at {host} answered without authenticating itself (no Negotiate "
                    "token in its reply): its answer is not used. Is it the real NameNode?"
                )
            try:
                context.verify(reply)
            except gss.GssError as exc:
                raise KerberosError(
                    f"WebHDFS at {host} failed the mutual authentication: {exc}"
                ) from exc
            return response
        finally:
            _close(response.request)


def _close(request) -> None:
    context = getattr(request, "_sparktf_spnego", None)
    if context is not None:
        request._sparktf_spnego = None
        context.close()
