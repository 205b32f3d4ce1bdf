"""The project certificate authority: one CA key, certificates for named brokers and clients.

Every broker and client of an overlay proves who it is with an X.509 certificate this CA
issued (SPEC §8, §9): broker links are mutual TLS, and a broker accepts a link only from a
certificate naming the broker it claims to be. The name and role travel in a URI
subject-alternative name, ``urn:trellis:<role>:<name>`` (the name percent-encoded), so a
client certificate can never pass for a broker's. A broker's certificate may certify the
Ed25519 key the overlay manifest already lists for it (one identity per broker, not two).

Keys are Ed25519 by default (TLS 1.3 and 1.2 with OpenSSL 3 accept them) or ECDSA P-256
for peers whose TLS stack lacks Ed25519. Everything here is pure: bytes and objects in and
out; :func:`save_ca`, :func:`load_ca` and :func:`write_issued` are the file edges.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import quote, unquote

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from security.errors import InvalidRequest

__all__ = [
    "CA_CERT",
    "CA_KEY",
    "CertificateAuthority",
    "Identity",
    "Issued",
    "KeyType",
    "Role",
    "create_ca",
    "identity_from_sans",
    "identity_of",
    "identity_uri",
    "issue",
    "load_ca",
    "load_private_key",
    "save_ca",
    "write_issued",
]

Role = Literal["broker", "client", "tdn"]
KeyType = Literal["ed25519", "ecdsa"]
PrivateKey = ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey

CA_CERT = "ca.crt"
CA_KEY = "ca.key"
_URN = "urn:trellis:"
_ROLES: dict[str, Role] = {"broker": "broker", "client": "client", "tdn": "tdn"}
# Where no --san is given, a broker certificate names the loopback addresses, so a
# local overlay's clients can check the name they dial.
_LOCAL_SANS = ("localhost", "127.0.0.1", "::1")
_LABEL = r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"^(?=.{{1,253}}$){_LABEL}(\.{_LABEL})*$")


@dataclass(frozen=True)
class Identity:
    """Who a certificate says its holder is."""

    role: Role
    name: str

    def __str__(self) -> str:
        return f"{self.role} '{self.name}'"


@dataclass(frozen=True)
class CertificateAuthority:
    """The CA's private key and self-signed certificate."""

    key: PrivateKey
    cert: x509.Certificate


@dataclass(frozen=True)
class Issued:
    """A certificate the CA issued and the private key it certifies."""

    key: PrivateKey
    cert: x509.Certificate

    @property
    def identity(self) -> Identity | None:
        return identity_of(self.cert)


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def _generate(kind: KeyType) -> PrivateKey:
    if kind == "ed25519":
        return ed25519.Ed25519PrivateKey.generate()
    if kind == "ecdsa":
        return ec.generate_private_key(ec.SECP256R1())
    raise InvalidRequest(f"unknown key type {kind!r}: choose ed25519 or ecdsa")


def _sign(builder: x509.CertificateBuilder, key: PrivateKey) -> x509.Certificate:
    # Ed25519 signs the message itself: no separate digest.
    algorithm = None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    return builder.sign(key, algorithm)


def create_ca(
    name: str = "Trellis project CA", *, days: int = 3650, key_type: KeyType = "ed25519"
) -> CertificateAuthority:
    """A new CA: a fresh key and a self-signed certificate that may sign leaf certificates
    only (path length 0)."""
    key = _generate(key_type)
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Trellis"),
            x509.NameAttribute(NameOID.COMMON_NAME, name),
        ]
    )
    now = _now()
    public = key.public_key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
    )
    return CertificateAuthority(key, _sign(builder, key))


def identity_uri(role: Role, name: str) -> str:
    """The URI subject-alternative name that carries an identity."""
    return f"{_URN}{role}:{quote(name, safe='')}"


def identity_from_sans(sans: Iterable[tuple[str, str]]) -> Identity | None:
    """The identity in subject-alternative names given as (kind, value) pairs, as Python's
    ``ssl`` reports a peer's (``("URI", "urn:trellis:broker:b1")``); None if none is there."""
    for kind, value in sans:
        if kind == "URI" and value.startswith(_URN):
            role, sep, name = value[len(_URN) :].partition(":")
            if sep and name and role in _ROLES:
                return Identity(_ROLES[role], unquote(name))
    return None


def identity_of(cert: x509.Certificate) -> Identity | None:
    """The identity a certificate carries (None for a certificate of no Trellis CA)."""
    try:
        sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return None
    return identity_from_sans(
        ("URI", uri) for uri in sans.get_values_for_type(x509.UniformResourceIdentifier)
    )


def _alt_name(text: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(text))
    except ValueError:
        pass
    if not _HOSTNAME.match(text.removeprefix("*.")):
        raise InvalidRequest(f"--san {text!r}: neither an IP address nor a DNS name")
    return x509.DNSName(text)


def issue(
    ca: CertificateAuthority,
    name: str,
    role: Role,
    *,
    sans: Sequence[str] = (),
    key: PrivateKey | None = None,
    key_type: KeyType = "ed25519",
    days: int = 825,
) -> Issued:
    """Issue a certificate for broker or client ``name``.

    Args:
        ca: the issuing CA.
        name: the broker id or client id the certificate proves.
        role: ``broker`` (may serve and dial links: server and client authentication),
            ``client`` (client authentication only) or ``tdn`` (a topic discovery node: its
            key signs topic advertisements, and it connects as a client).
        sans: DNS names and IP addresses a client may dial the holder by (brokers). A
            broker's certificate also names its id when that is a valid DNS name, and
            ``localhost``, ``127.0.0.1`` and ``::1`` when ``sans`` is empty.
        key: the key to certify (e.g. the broker's manifest key); default a fresh one.
        key_type: the kind of fresh key.
        days: validity.

    Raises:
        InvalidRequest: an empty name, a SAN that is no DNS name or IP address.
    """
    if not name or name != name.strip():
        raise InvalidRequest(f"a certificate needs a name without surrounding spaces: {name!r}")
    key = key or _generate(key_type)
    names: list[x509.GeneralName] = [x509.UniformResourceIdentifier(identity_uri(role, name))]
    wanted = list(sans)
    if role == "broker":
        if _HOSTNAME.match(name) and name not in wanted:
            wanted.insert(0, name)
        if not sans:
            wanted += [s for s in _LOCAL_SANS if s not in wanted]
    names += [_alt_name(s) for s in dict.fromkeys(wanted)]
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    if role == "broker":
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
    now = _now()
    public = key.public_key()
    builder = (
        x509.CertificateBuilder()
        .subject_name(
            x509.Name(
                [
                    x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Trellis"),
                    x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role),
                    x509.NameAttribute(NameOID.COMMON_NAME, name[:64]),
                ]
            )
        )
        .issuer_name(ca.cert.subject)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(min(now + dt.timedelta(days=days), ca.cert.not_valid_after_utc))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=isinstance(key, ec.EllipticCurvePrivateKey),
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()),
            critical=False,
        )
    )
    return Issued(key, _sign(builder, ca.key))


def verify_issued(ca_cert: x509.Certificate, cert: x509.Certificate) -> bool:
    """Whether ``cert`` carries a valid signature of ``ca_cert``'s key (no time check)."""
    try:
        cert.verify_directly_issued_by(ca_cert)
    except (ValueError, TypeError, InvalidSignature):
        return False
    return True


# -- files ---------------------------------------------------------------------------------


def _key_pem(key: PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def _cert_pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def _write_secret(path: Path, data: bytes) -> None:
    """Write a private key readable by its owner only (never world-readable, not even
    for a moment)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    path.chmod(0o600)


def save_ca(ca: CertificateAuthority, directory: Path, *, force: bool = False) -> Path:
    """Write ``ca.crt`` and ``ca.key`` (owner-only) into ``directory``.

    Raises:
        InvalidRequest: the directory holds a CA already (unless ``force``).
    """
    directory.mkdir(parents=True, exist_ok=True)
    if not force and (directory / CA_KEY).exists():
        raise InvalidRequest(f"{directory} already holds a CA ({CA_KEY}); refusing to overwrite it")
    _write_secret(directory / CA_KEY, _key_pem(ca.key))
    (directory / CA_CERT).write_bytes(_cert_pem(ca.cert))
    return directory / CA_CERT


def load_private_key(path: Path) -> PrivateKey:
    """A private key from a PEM file, the hex Ed25519 seed a broker's ``key_file`` holds, or
    a topics identity file (JSON with the hex seed under ``key``, ``trellis topic identity``):
    one key per entity, certified here for TLS and used for its topic credentials.

    Raises:
        InvalidRequest: the file holds none of these, or a key of an unsupported kind.
    """
    data = path.read_bytes()
    text = data.strip()
    if text.startswith(b"{"):
        try:
            seed = json.loads(text)["key"]
            if not isinstance(seed, str) or not re.fullmatch(r"[0-9a-fA-F]{64}", seed):
                raise ValueError("'key' is not 64 hex digits")
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidRequest(f"{path}: not an identity file with a hex key: {exc}") from None
        return ed25519.Ed25519PrivateKey.from_private_bytes(bytes.fromhex(seed))
    if len(text) == 64 and re.fullmatch(rb"[0-9a-fA-F]{64}", text):
        return ed25519.Ed25519PrivateKey.from_private_bytes(bytes.fromhex(text.decode()))
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        raise InvalidRequest(f"{path}: not a PEM private key or a hex Ed25519 key: {exc}") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey | ec.EllipticCurvePrivateKey):
        raise InvalidRequest(f"{path}: only Ed25519 and ECDSA keys are supported")
    return key


def load_ca(directory: Path) -> CertificateAuthority:
    """The CA ``trellis ca init`` wrote in ``directory``.

    Raises:
        InvalidRequest: a file is missing or does not hold a CA.
    """
    cert_path, key_path = directory / CA_CERT, directory / CA_KEY
    for path in (cert_path, key_path):
        if not path.exists():
            raise InvalidRequest(
                f"no CA in {directory}: {path.name} is missing (create one with trellis ca init)"
            )
    try:
        cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    except ValueError as exc:
        raise InvalidRequest(f"{cert_path}: not a PEM certificate: {exc}") from None
    key = load_private_key(key_path)
    if cert.public_key() != key.public_key():
        raise InvalidRequest(f"{key_path} is not the key of {cert_path}")
    return CertificateAuthority(key, cert)


def write_issued(
    issued: Issued, ca: CertificateAuthority, directory: Path, name: str
) -> tuple[Path, Path]:
    """Write ``NAME.crt``, ``NAME.key`` (owner-only) and the CA's ``ca.crt`` into
    ``directory``; the certificate and key paths."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = quote(name, safe="")
    cert_path, key_path = directory / f"{stem}.crt", directory / f"{stem}.key"
    cert_path.write_bytes(_cert_pem(issued.cert))
    _write_secret(key_path, _key_pem(issued.key))
    ca_path = directory / CA_CERT
    if not ca_path.exists() or ca_path.read_bytes() != _cert_pem(ca.cert):
        ca_path.write_bytes(_cert_pem(ca.cert))
    return cert_path, key_path
