"""Who an entity is, for topics: an id, an Ed25519 public key and, later, a certificate.

Topic ownership, permission lists and delegations name *principals*, and a principal is the
hex of a raw Ed25519 public key, not an id: without a certificate authority nothing binds the
id ``"bob"`` to a key, so a permission granted to an id could be claimed by anyone who picks
that id. Ids stay as labels (reply routing, logs). When the project CA lands, an
:class:`Identity` also carries its X.509 certificate (DER), and permission lists may then name
certified subjects as well; the key-based principal stays valid.

Identity files (``--identity``) are JSON: ``{"id": "alice", "key": "<64 hex: raw private
key>"}`` plus, later, ``"certificate": "<path to PEM>"``; written with mode 0600.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import InvalidSignature

from security.envelope import (
    Signer,
    private_key_from_bytes,
    private_key_to_bytes,
    public_key_from_bytes,
    public_key_to_bytes,
)
from security.errors import InvalidRequest

__all__ = [
    "Identity",
    "TdnAuthority",
    "TrustedTdns",
    "load_identity",
    "load_trusted_tdns",
    "own_copy",
    "principal_of",
    "save_identity",
    "signature_valid",
]


def principal_of(key: bytes) -> str:
    """The principal a raw 32-byte Ed25519 public key stands for (its hex)."""
    return bytes(key).hex()


def signature_valid(key: bytes, signature: bytes, data: bytes) -> bool:
    """Whether ``signature`` is ``key``'s Ed25519 signature over ``data`` (never raises)."""
    try:
        public_key_from_bytes(bytes(key)).verify(bytes(signature), data)
    except (InvalidSignature, ValueError, TypeError):
        return False
    return True


@dataclass(frozen=True)
class Identity:
    """The public half of an entity (client, broker or TDN).

    Attributes:
        id: the label other parties know the entity under.
        key: its raw Ed25519 public key (32 bytes).
        certificate: its X.509 certificate (DER) from the project CA; None until the CA
            exists (then the chain is checked where the key is checked today).
    """

    id: str
    key: bytes
    certificate: bytes | None = None

    @property
    def principal(self) -> str:
        return principal_of(self.key)

    @classmethod
    def of(cls, signer: Signer) -> Identity:
        return cls(signer.id, public_key_to_bytes(signer.public_key))


def load_identity(path: str | Path) -> Signer:
    """Read an identity file (see the module docstring).

    Raises:
        InvalidRequest: the file is missing, not JSON, or lacks a valid ``id`` or ``key``.
    """
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
        ident, raw = data["id"], bytes.fromhex(data["key"])
        if not isinstance(ident, str) or not ident:
            raise ValueError("id must be a non-empty string")
        return Signer(ident, private_key_from_bytes(raw))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise InvalidRequest(f"cannot read the identity file {str(path)!r}: {exc}") from None


def save_identity(signer: Signer, path: str | Path) -> None:
    """Write ``signer`` as an identity file, readable by its owner only."""
    target = Path(path)
    target.write_text(
        json.dumps({"id": signer.id, "key": private_key_to_bytes(signer.key).hex()}) + "\n",
        encoding="utf-8",
    )
    target.chmod(0o600)


@dataclass(frozen=True)
class TdnAuthority:
    """Trust in TDNs through the project CA instead of a list of their keys: an
    advertisement is from a trusted TDN when it carries a certificate the CA issued for role
    ``tdn`` and the advertisement's TDN id, for the key that signed it.

    Attributes:
        ca_der: the CA's certificate (DER).
    """

    ca_der: bytes

    def certified_key(self, tdn: str, certificate: bytes, now: float | None = None) -> bytes | None:
        """The key the CA certified for TDN ``tdn`` in ``certificate`` (DER), or None when
        the certificate does not prove it (another CA, another role or name, expired)."""
        from cryptography import x509

        from security.ca import Identity, identity_of, verify_issued
        from security.tls import peer_key

        if not certificate:
            return None
        try:
            ca = x509.load_der_x509_certificate(self.ca_der)
            cert = x509.load_der_x509_certificate(bytes(certificate))
        except ValueError:
            return None
        if not verify_issued(ca, cert) or identity_of(cert) != Identity("tdn", tdn):
            return None
        if now is not None and not (
            cert.not_valid_before_utc.timestamp() <= now <= cert.not_valid_after_utc.timestamp()
        ):
            return None
        return peer_key(bytes(certificate))


TrustedTdns = Mapping[str, bytes] | TdnAuthority
"""Who may issue advertisements: TDN id -> raw Ed25519 key, or the project CA."""


def own_copy(trusted: TrustedTdns) -> TrustedTdns:
    """A verifier's own copy of its trust anchor: a key list is copied (the caller's dict may
    change), a CA anchor is immutable and kept as is."""
    return trusted if isinstance(trusted, TdnAuthority) else dict(trusted)


def load_trusted_tdns(path: str | Path) -> TrustedTdns:
    """The trusted TDNs: a JSON file ``{"tdn-id": "<hex raw Ed25519 public key>", ...}``, or
    the project CA's certificate (PEM, ``trellis ca init``'s ``ca.crt``): then any TDN the CA
    certified (``trellis ca issue --tdn``) is trusted under its certified id and key.

    Raises:
        InvalidRequest: unreadable, not a certificate, or an entry is not 32 bytes of hex.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, ValueError) as exc:
        raise InvalidRequest(f"cannot read the trusted TDNs file {str(path)!r}: {exc}") from None
    if text.lstrip().startswith("-----BEGIN CERTIFICATE"):
        from cryptography import x509
        from cryptography.hazmat.primitives.serialization import Encoding

        try:
            ca = x509.load_pem_x509_certificate(text.encode())
        except ValueError as exc:
            raise InvalidRequest(f"{path}: not a PEM certificate: {exc}") from None
        return TdnAuthority(ca.public_bytes(Encoding.DER))
    try:
        data = json.loads(text)
        trusted = {str(k): bytes.fromhex(v) for k, v in data.items()}
    except (ValueError, AttributeError, TypeError) as exc:
        raise InvalidRequest(f"cannot read the trusted TDNs file {str(path)!r}: {exc}") from None
    bad = sorted(k for k, v in trusted.items() if len(v) != 32)
    if bad:
        raise InvalidRequest(f"{path}: the key of TDN {bad[0]!r} is not 32 bytes of hex")
    return trusted
