"""A small ctypes binding of MIT Kerberos' GSS-API (``libgssapi_krb5.so.2``): enough to make
the SPNEGO token of an HTTP ``Authorization: Negotiate`` header and to ask which Kerberos
credentials the process holds.

It needs no build: the system library is loaded at the first use. Credentials come from the
default ticket cache (``KRB5CCNAME``) or, given a keytab, from that keytab into a private
in-memory cache of this process (``gss_acquire_cred_from`` with the ``client_keytab`` and
``ccache`` stores), so a keytab login never touches the user's own ticket cache.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from dataclasses import dataclass
from functools import lru_cache

from sparktf.errors import SparktfError

__all__ = [
    "Credential",
    "GssError",
    "GssUnavailableError",
    "SpnegoContext",
    "acquire",
    "default_realm",
    "spnego_token",
]

_uint32 = ctypes.c_uint32
_GSS_C_INITIATE = 1
_GSS_C_INDEFINITE = 0xFFFFFFFF
_GSS_C_GSS_CODE, _GSS_C_MECH_CODE = 1, 2
_GSS_C_MUTUAL_FLAG, _GSS_C_SEQUENCE_FLAG = 2, 8
_GSS_S_CONTINUE_NEEDED = 1
_ROUTINE_ERROR_MASK = 0xFFFF0000

# Object identifiers, DER-encoded without tag and length.
_OID_HOSTBASED_SERVICE = b"\x2a\x86\x48\x86\xf7\x12\x01\x02\x01\x04"  # 1.2.840.113554.1.2.1.4
_OID_KRB5_PRINCIPAL = b"\x2a\x86\x48\x86\xf7\x12\x01\x02\x02\x01"  # 1.2.840.113554.1.2.2.1
_OID_SPNEGO = b"\x2b\x06\x01\x05\x05\x02"  # 1.3.6.1.5.5.2


class GssError(SparktfError, OSError):
    """A GSS-API call failed; the message holds the library's own explanation."""


class GssUnavailableError(GssError):
    """The MIT GSS-API library (libgssapi_krb5.so.2) is not installed."""


class _Buffer(ctypes.Structure):
    _fields_ = [("length", ctypes.c_size_t), ("value", ctypes.c_void_p)]


class _Oid(ctypes.Structure):
    _fields_ = [("length", _uint32), ("elements", ctypes.c_void_p)]


class _KeyValue(ctypes.Structure):
    _fields_ = [("key", ctypes.c_char_p), ("value", ctypes.c_char_p)]


class _KeyValueSet(ctypes.Structure):
    _fields_ = [("count", _uint32), ("elements", ctypes.POINTER(_KeyValue))]


_P = ctypes.c_void_p
_PP = ctypes.POINTER(ctypes.c_void_p)
_PU = ctypes.POINTER(_uint32)
_PBUF = ctypes.POINTER(_Buffer)
_POID = ctypes.POINTER(_Oid)

_SIGNATURES = {
    "gss_import_name": [_PU, _PBUF, _POID, _PP],
    "gss_release_name": [_PU, _PP],
    "gss_display_name": [_PU, _P, _PBUF, _PP],
    "gss_release_buffer": [_PU, _PBUF],
    "gss_display_status": [_PU, _uint32, ctypes.c_int, _P, _PU, _PBUF],
    "gss_acquire_cred": [_PU, _P, _uint32, _P, ctypes.c_int, _PP, _PP, _PU],
    "gss_acquire_cred_from": [
        _PU,
        _P,
        _uint32,
        _P,
        ctypes.c_int,
        ctypes.POINTER(_KeyValueSet),
        _PP,
        _PP,
        _PU,
    ],
    "gss_inquire_cred": [_PU, _P, _PP, _PU, ctypes.POINTER(ctypes.c_int), _PP],
    "gss_release_cred": [_PU, _PP],
    "gss_init_sec_context": [
        _PU,
        _P,
        _PP,
        _P,
        _POID,
        _uint32,
        _uint32,
        _P,
        _PBUF,
        _PP,
        _PBUF,
        _PU,
        _PU,
    ],
    "gss_delete_sec_context": [_PU, _PP, _PBUF],
}


@lru_cache(maxsize=1)
def _lib() -> ctypes.CDLL:
    name = ctypes.util.find_library("gssapi_krb5") or "libgssapi_krb5.so.2"
    try:
        lib = ctypes.CDLL(name)
    except OSError as exc:
        raise GssUnavailableError(
            f"Kerberos needs MIT's GSS-API library (libgssapi_krb5.so.2, package libgssapi-krb5-2 "
            f"or krb5-libs), which cannot be loaded: {exc}"
        ) from exc
    for fn, args in _SIGNATURES.items():
        getattr(lib, fn).argtypes = args
        getattr(lib, fn).restype = _uint32
    return lib


def _oid(der: bytes) -> _Oid:
    raw = ctypes.create_string_buffer(der, len(der))
    oid = _Oid(len(der), ctypes.cast(raw, ctypes.c_void_p))
    oid._raw = raw  # keeps the bytes alive as long as the OID
    return oid


def _messages(code: int, kind: int) -> list[str]:
    lib, minor, context, out = _lib(), _uint32(0), _uint32(0), []
    while True:
        buf = _Buffer()
        if lib.gss_display_status(ctypes.byref(minor), code, kind, None, context, buf):
            break
        out.append(ctypes.string_at(buf.value, buf.length).decode(errors="replace"))
        lib.gss_release_buffer(ctypes.byref(minor), ctypes.byref(buf))
        if not context.value:
            break
    return out


def _check(major: int, minor: _uint32, what: str) -> None:
    if major & _ROUTINE_ERROR_MASK:
        text = _messages(major, _GSS_C_GSS_CODE)
        if minor.value:
            text += _messages(minor.value, _GSS_C_MECH_CODE)
        raise GssError(f"{what}: {'; '.join(t for t in text if t) or f'GSS status {major:#x}'}")


def _import_name(text: str, oid_der: bytes) -> ctypes.c_void_p:
    lib, minor, name = _lib(), _uint32(0), ctypes.c_void_p()
    data = text.encode()
    buf = _Buffer(len(data), ctypes.cast(ctypes.c_char_p(data), ctypes.c_void_p))
    oid = _oid(oid_der)
    major = lib.gss_import_name(ctypes.byref(minor), ctypes.byref(buf), ctypes.byref(oid), name)
    _check(major, minor, f"GSS-API cannot parse the name {text!r}")
    return name


def _release_name(name: ctypes.c_void_p) -> None:
    if name.value:
        _lib().gss_release_name(ctypes.byref(_uint32(0)), ctypes.byref(name))


@dataclass
class Credential:
    """Kerberos initiator credentials held by this process: their handle, the principal and
    the seconds they stay valid (``lifetime``; 0 when expired)."""

    handle: ctypes.c_void_p
    principal: str
    lifetime: int

    def __del__(self):
        if self.handle.value and _lib.cache_info().currsize:
            _lib().gss_release_cred(ctypes.byref(_uint32(0)), ctypes.byref(self.handle))


def _inquire(handle: ctypes.c_void_p) -> Credential:
    lib, minor = _lib(), _uint32(0)
    name, lifetime, usage = ctypes.c_void_p(), _uint32(0), ctypes.c_int(0)
    major = lib.gss_inquire_cred(
        ctypes.byref(minor), handle, name, ctypes.byref(lifetime), ctypes.byref(usage), None
    )
    _check(major, minor, "GSS-API cannot inspect the Kerberos credentials")
    try:
        buf = _Buffer()
        major = lib.gss_display_name(ctypes.byref(minor), name, ctypes.byref(buf), None)
        _check(major, minor, "GSS-API cannot name the Kerberos principal")
        principal = ctypes.string_at(buf.value, buf.length).decode()
        lib.gss_release_buffer(ctypes.byref(minor), ctypes.byref(buf))
    finally:
        _release_name(name)
    return Credential(handle, principal, lifetime.value)


_acquire_lock = threading.Lock()


def acquire(principal: str | None = None, keytab: str | None = None) -> Credential:
    """Kerberos initiator credentials: from ``keytab`` for ``principal`` (into a private
    in-memory ticket cache of this process), else from the default ticket cache
    (``KRB5CCNAME``; for ``principal`` when given).

    Raises GssError (with the library's reason: no cache, expired ticket, unknown principal,
    unreadable keytab, KDC unreachable) when none can be had, GssUnavailableError when the
    library is missing.
    """
    lib, minor, handle = _lib(), _uint32(0), ctypes.c_void_p()
    name = _import_name(principal, _OID_KRB5_PRINCIPAL) if principal else ctypes.c_void_p()
    try:
        with _acquire_lock:
            if keytab:
                store = (_KeyValue * 2)(
                    _KeyValue(b"client_keytab", os.fsencode(keytab)),
                    _KeyValue(b"ccache", f"MEMORY:sparktf-{os.getpid()}".encode()),
                )
                kv = _KeyValueSet(2, store)
                major = lib.gss_acquire_cred_from(
                    ctypes.byref(minor), name, _GSS_C_INDEFINITE, None, _GSS_C_INITIATE,
                    ctypes.byref(kv), handle, None, None,
                )  # fmt: skip
                source = f"keytab {keytab}"
            else:
                major = lib.gss_acquire_cred(
                    ctypes.byref(minor), name, _GSS_C_INDEFINITE, None, _GSS_C_INITIATE,
                    handle, None, None,
                )  # fmt: skip
                source = "the ticket cache " + os.environ.get("KRB5CCNAME", "(default)")
        _check(major, minor, f"no Kerberos credentials from {source}")
    finally:
        _release_name(name)
    cred = _inquire(handle)
    if cred.lifetime == 0:
        raise GssError(f"the Kerberos ticket of {cred.principal} in {source} has expired")
    return cred


class SpnegoContext:
    """One SPNEGO exchange with the service ``HTTP@host``, mutual authentication asked:
    :attr:`token` is the first token (the bytes of ``Authorization: Negotiate``), and
    :meth:`verify` checks the service's reply token (``WWW-Authenticate: Negotiate``), which
    proves that the server holds the service's key. :meth:`close` (or the end of a ``with``
    block) releases the context.

    Raises GssError naming ``host`` when the context cannot be started (no ticket, no service
    principal ``HTTP/host`` in the realm, clock skew)."""

    def __init__(self, host: str, credential: Credential | None = None):
        self.host = host
        self._credential = credential
        self._target = _import_name(f"HTTP@{host}", _OID_HOSTBASED_SERVICE)
        self._context, self._mech = ctypes.c_void_p(), _oid(_OID_SPNEGO)
        try:
            major, self.token = self._step(None, f"cannot start a SPNEGO context with HTTP@{host}")
            if major not in (0, _GSS_S_CONTINUE_NEEDED) or not self.token:
                raise GssError(f"SPNEGO with HTTP@{host} gave no token (GSS status {major:#x})")
            self.complete = major == 0
        except BaseException:
            self.close()
            raise

    def _step(self, reply: bytes | None, what: str) -> tuple[int, bytes]:
        """One call of ``gss_init_sec_context``: its status and its output token. A context
        it completes must say (its returned flags) that the service authenticated itself.

        Raises:
            GssError: the call failed, or completed the context without mutual
                authentication.
        """
        lib, minor, out, flags = _lib(), _uint32(0), _Buffer(), _uint32(0)
        given = None
        if reply is not None:
            raw = ctypes.create_string_buffer(reply, len(reply))
            given = _Buffer(len(reply), ctypes.cast(raw, ctypes.c_void_p))
        try:
            major = lib.gss_init_sec_context(
                ctypes.byref(minor), self._credential.handle if self._credential else None,
                self._context, self._target, ctypes.byref(self._mech),
                _GSS_C_MUTUAL_FLAG | _GSS_C_SEQUENCE_FLAG, 0, None,
                ctypes.byref(given) if given is not None else None, None,
                ctypes.byref(out), ctypes.byref(flags), None,
            )  # fmt: skip
            _check(major, minor, what)
            if major == 0 and not flags.value & _GSS_C_MUTUAL_FLAG:
                raise GssError(
                    f"{what}: the context was established without mutual authentication "
                    f"(GSS flags {flags.value:#x}): HTTP@{self.host} did not prove itself"
                )
            return major, ctypes.string_at(out.value, out.length) if out.value else b""
        finally:
            if out.value:
                lib.gss_release_buffer(ctypes.byref(minor), ctypes.byref(out))

    def verify(self, reply: bytes) -> None:
        """Checks the service's reply token; GssError when it does not complete the mutual
        authentication (a server that does not hold the service's key, a forged reply, a
        context the library completed without the mutual flag)."""
        major, _ = self._step(reply, f"the SPNEGO reply of HTTP@{self.host}")
        if major != 0:
            raise GssError(
                f"HTTP@{self.host} did not complete the mutual authentication (GSS status "
                f"{major:#x})"
            )
        self.complete = True

    def close(self) -> None:
        lib, minor = _lib(), _uint32(0)
        if self._context.value:
            lib.gss_delete_sec_context(ctypes.byref(minor), self._context, None)
            self._context = ctypes.c_void_p()
        if getattr(self, "_target", None) is not None:
            _release_name(self._target)
            self._target = None

    def __enter__(self) -> SpnegoContext:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def spnego_token(host: str, credential: Credential | None = None) -> bytes:
    """The first SPNEGO token (the bytes of ``Authorization: Negotiate``) for the service
    ``HTTP@host``, made with ``credential`` (else the default credentials), the context then
    released (:class:`SpnegoContext` keeps it to check the server's reply).

    Raises GssError naming ``host`` when the context cannot be started."""
    with SpnegoContext(host, credential) as context:
        return context.token


def default_realm() -> str | None:
    """The default realm of the Kerberos configuration (``KRB5_CONFIG``, else
    /etc/krb5.conf), None when none is set or libkrb5 is missing."""
    try:
        krb5 = ctypes.CDLL(ctypes.util.find_library("krb5") or "libkrb5.so.3")
    except OSError:
        return None
    ctx, realm = ctypes.c_void_p(), ctypes.c_char_p()
    if krb5.krb5_init_context(ctypes.byref(ctx)):
        return None
    try:
        krb5.krb5_get_default_realm.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_char_p)]
        if krb5.krb5_get_default_realm(ctx, ctypes.byref(realm)):
            return None
        value = realm.value.decode() if realm.value else None
        krb5.krb5_free_default_realm.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
        krb5.krb5_free_default_realm(ctx, realm)
        return value
    finally:
        krb5.krb5_free_context.argtypes = [ctypes.c_void_p]
        krb5.krb5_free_context(ctx)
