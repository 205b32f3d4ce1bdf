"""TLS contexts for brokers and clients, and what a peer's certificate proves.

Three contexts, one per side of a connection:

* :func:`server_context` (a broker's listener): serves the broker's certificate and asks
  every peer for one from the project CA. A presented certificate must verify, or the
  handshake fails; whether a peer may go without one is decided after the handshake, by
  role (a broker never may), so the broker can say why in an ``ERROR`` frame instead of
  a bare reset.
* :func:`link_context` (a broker dialling a neighbour): presents the broker's certificate
  and trusts only the project CA; the host name is not checked, the broker id in the
  certificate is (:func:`peer_identity`), which is stronger and survives address changes.
* :func:`client_context` (the SDK): trusts the CA, checks the host name it dials against
  the broker certificate's DNS/IP names, and presents a client certificate if given.

Python's ``ssl`` and OpenSSL 3 accept the Ed25519 certificates :mod:`security.ca` issues
by default (TLS 1.2 and 1.3); TLS 1.2 is the floor.
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ed25519
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from security.ca import Identity, identity_from_sans
from security.errors import InvalidRequest

__all__ = [
    "client_context",
    "describe_tls_error",
    "link_context",
    "peer_identity",
    "peer_key",
    "server_context",
]


def _context(purpose: ssl.Purpose, ca: Path, cert: Path | None, key: Path | None) -> ssl.SSLContext:
    try:
        context = ssl.create_default_context(purpose, cafile=str(ca))
    except (OSError, ssl.SSLError) as exc:
        raise InvalidRequest(f"cannot load the CA certificate {ca}: {exc}") from None
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    if (cert is None) != (key is None):
        raise InvalidRequest("a certificate needs its key and a key its certificate")
    if cert is not None and key is not None:
        try:
            context.load_cert_chain(str(cert), str(key))
        except (OSError, ssl.SSLError) as exc:
            raise InvalidRequest(
                f"cannot load the certificate {cert} with the key {key}: {describe_tls_error(exc)}"
            ) from None
    return context


def server_context(ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
    """A broker listener's context: its certificate; peers' certificates verified against
    ``ca`` when presented (required of brokers, and of clients unless configured not to,
    after the handshake).

    Raises:
        InvalidRequest: a file is missing, unreadable, or the key does not match.
    """
    context = _context(ssl.Purpose.CLIENT_AUTH, ca, cert, key)
    context.verify_mode = ssl.CERT_OPTIONAL
    return context


def link_context(ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
    """A broker's context for dialling a neighbour: mutual TLS, the project CA only."""
    context = _context(ssl.Purpose.SERVER_AUTH, ca, cert, key)
    # The broker id in the certificate is checked instead (peer_identity).
    context.check_hostname = False
    context.verify_mode = ssl.CERT_REQUIRED
    return context


def client_context(ca: Path, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    """A client's context: trust ``ca``, check host names, present ``cert`` if given.

    Raises:
        InvalidRequest: a file is missing, unreadable, or the key does not match.
    """
    return _context(ssl.Purpose.SERVER_AUTH, ca, cert, key)


def peer_identity(peercert: Mapping[str, Any] | None) -> Identity | None:
    """The identity in a verified peer certificate as ``ssl`` reports it
    (``transport.get_extra_info("peercert")``); None when the peer presented none."""
    if not peercert:
        return None
    return identity_from_sans(peercert.get("subjectAltName", ()))


def peer_key(der: bytes | None) -> bytes | None:
    """The raw Ed25519 public key of a peer's certificate (DER), None for other kinds."""
    if not der:
        return None
    public = x509.load_der_x509_certificate(der).public_key()
    if not isinstance(public, ed25519.Ed25519PublicKey):
        return None
    return public.public_bytes(Encoding.Raw, PublicFormat.Raw)


def describe_tls_error(exc: BaseException) -> str:
    """One line saying why a TLS handshake failed, in the words an operator can act on."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        reason = exc.verify_message or exc.reason or str(exc)
        if exc.verify_code in (19, 20, 21):  # self-signed in chain, unknown issuer
            return f"certificate not issued by the project CA ({reason})"
        if exc.verify_code == 10:
            return f"certificate expired ({reason})"
        if exc.verify_code == 62:
            return f"host name not in the certificate ({reason})"
        return f"certificate rejected: {reason}"
    if isinstance(exc, ssl.SSLError):
        reason = (exc.reason or str(exc)).lower().replace("_", " ")
        if "wrong version number" in reason or "http request" in reason:
            return f"the peer does not speak TLS ({reason})"
        return reason
    if isinstance(exc, TimeoutError):
        return "TLS handshake timed out"
    if isinstance(exc, ConnectionResetError | BrokenPipeError):
        return "the peer closed the connection during the TLS handshake (does it trust our CA?)"
    return str(exc) or type(exc).__name__
