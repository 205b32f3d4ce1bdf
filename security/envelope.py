"""Payload encryption (AES-256-GCM) and publisher signatures (Ed25519) for confidential data.

A confidential publication keeps its routing attributes in the clear (matching needs them) and
carries its payload as a *sealed blob*: ``nonce (12 bytes) || AES-GCM ciphertext || tag``. The
attributes and publication id are the GCM associated data, so a broker cannot move a ciphertext
to other attributes without the tag failing; the publisher's Ed25519 signature covers
(publication id, attributes, SHA-256 of the sealed blob), so receivers can discard forged
content *before* they hold the key.

Canonical encoding (what is signed and authenticated): msgpack of a list
``[domain, pub_id, [[name, value], ...]]`` (plus the blob digest for signatures), attributes
sorted by name, ``use_bin_type=True``. msgpack is deterministic for a given list of Python
values: ints use the smallest encoding, floats are always float64 (``use_single_float`` off),
str and bytes keep distinct types, bool is distinct from int. Both ends encode the *decoded*
values, so the bytes agree whenever the values do. Domain strings keep the two signed formats
(and the share commitments in propagation.py) from ever being confused with one another.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field

import msgpack
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from security.errors import IntegrityError

__all__ = [
    "KEY_SIZE",
    "NONCE_SIZE",
    "AttributeValue",
    "DecryptionError",
    "EnvelopeError",
    "SignatureError",
    "Signer",
    "canonical_attributes",
    "generate_signing_key",
    "new_key",
    "open_sealed",
    "private_key_from_bytes",
    "private_key_to_bytes",
    "public_key_from_bytes",
    "public_key_to_bytes",
    "publication_digest",
    "seal",
    "sign_publication",
    "verify_publication",
]

KEY_SIZE = 32
NONCE_SIZE = 12
_TAG_SIZE = 16
_AAD_DOMAIN = "trellis/aad/v1"
_SIG_DOMAIN = "trellis/publication-signature/v1"

AttributeValue = str | int | float | bool


class EnvelopeError(IntegrityError):
    """A sealed payload or signature cannot be accepted; the content must be discarded."""


class DecryptionError(EnvelopeError):
    """AES-GCM authentication failed: wrong key, or ciphertext/attributes/id were altered."""


class SignatureError(EnvelopeError):
    """The publisher's signature does not verify over this id, these attributes and this blob."""


def _check_attributes(attributes: Mapping[str, AttributeValue]) -> list[list[AttributeValue]]:
    pairs: list[list[AttributeValue]] = []
    for name in sorted(attributes):
        if not isinstance(name, str):
            raise EnvelopeError(f"attribute names must be str, got {type(name).__name__}")
        value = attributes[name]
        if not isinstance(value, str | int | float | bool):
            raise EnvelopeError(
                f"attribute {name!r} must be str, int, float or bool, got {type(value).__name__}"
            )
        pairs.append([name, value])
    return pairs


def canonical_attributes(pub_id: bytes, attributes: Mapping[str, AttributeValue]) -> bytes:
    """The canonical bytes of (publication id, attributes): the AES-GCM associated data.

    Raises:
        EnvelopeError: an attribute name is not str or a value is not str/int/float/bool.
    """
    return msgpack.packb(
        [_AAD_DOMAIN, bytes(pub_id), _check_attributes(attributes)], use_bin_type=True
    )


def new_key() -> bytes:
    """A fresh random AES-256 key (32 bytes from the OS CSPRNG)."""
    return os.urandom(KEY_SIZE)


def seal(
    key: bytes, pub_id: bytes, attributes: Mapping[str, AttributeValue], plaintext: bytes
) -> bytes:
    """Encrypt ``plaintext`` under ``key``; returns ``nonce || ciphertext || tag``.

    A random 96-bit nonce is safe for a fresh key per publication and for epoch keys up to
    about 2^32 publications per key, far above any refresh interval the broker allows.
    """
    if len(key) != KEY_SIZE:
        raise EnvelopeError(f"key must be {KEY_SIZE} bytes, got {len(key)}")
    nonce = os.urandom(NONCE_SIZE)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, canonical_attributes(pub_id, attributes))


def open_sealed(
    key: bytes, pub_id: bytes, attributes: Mapping[str, AttributeValue], sealed: bytes
) -> bytes:
    """Decrypt a blob made by :func:`seal`; the GCM tag is the final check of a reconstructed key.

    Raises:
        DecryptionError: the key is wrong, or the blob, id or attributes were altered.
    """
    if len(key) != KEY_SIZE:
        raise DecryptionError(f"key must be {KEY_SIZE} bytes, got {len(key)}")
    if len(sealed) < NONCE_SIZE + _TAG_SIZE:
        raise DecryptionError(f"sealed payload too short ({len(sealed)} bytes)")
    try:
        return AESGCM(key).decrypt(
            sealed[:NONCE_SIZE], sealed[NONCE_SIZE:], canonical_attributes(pub_id, attributes)
        )
    except InvalidTag:
        raise DecryptionError("AES-GCM authentication failed") from None


def publication_digest(
    pub_id: bytes, attributes: Mapping[str, AttributeValue], sealed: bytes
) -> bytes:
    """The exact bytes a publisher signs: id, attributes and SHA-256 of the sealed blob."""
    return msgpack.packb(
        [
            _SIG_DOMAIN,
            bytes(pub_id),
            _check_attributes(attributes),
            hashlib.sha256(sealed).digest(),
        ],
        use_bin_type=True,
    )


def sign_publication(
    key: Ed25519PrivateKey,
    pub_id: bytes,
    attributes: Mapping[str, AttributeValue],
    sealed: bytes,
) -> bytes:
    """The publisher's 64-byte Ed25519 signature over :func:`publication_digest`."""
    return key.sign(publication_digest(pub_id, attributes, sealed))


def verify_publication(
    public_key: Ed25519PublicKey,
    pub_id: bytes,
    attributes: Mapping[str, AttributeValue],
    sealed: bytes,
    signature: bytes,
) -> None:
    """Check a publisher signature; brokers call this before forwarding content.

    Raises:
        SignatureError: the signature does not match.
    """
    try:
        public_key.verify(signature, publication_digest(pub_id, attributes, sealed))
    except InvalidSignature:
        raise SignatureError("publisher signature does not verify") from None


def generate_signing_key() -> Ed25519PrivateKey:
    """A fresh Ed25519 private key."""
    return Ed25519PrivateKey.generate()


def private_key_to_bytes(key: Ed25519PrivateKey) -> bytes:
    """The 32-byte raw private key (store it encrypted or with 0600 permissions)."""
    return key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )


def private_key_from_bytes(raw: bytes) -> Ed25519PrivateKey:
    """Load a 32-byte raw private key (raises ValueError on a wrong length)."""
    return Ed25519PrivateKey.from_private_bytes(raw)


def public_key_to_bytes(key: Ed25519PublicKey) -> bytes:
    """The 32-byte raw public key, the form that travels in membership data."""
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def public_key_from_bytes(raw: bytes) -> Ed25519PublicKey:
    """Load a 32-byte raw public key (raises ValueError on a wrong length)."""
    return Ed25519PublicKey.from_public_bytes(raw)


@dataclass(frozen=True)
class Signer:
    """A broker's or publisher's identity and signing key, as the share propagation uses it.

    Attributes:
        id: the broker or client id other parties know this key under.
        key: the Ed25519 private key.
    """

    id: str
    key: Ed25519PrivateKey = field(repr=False)

    @classmethod
    def generate(cls, id: str) -> Signer:
        """A signer with a fresh key, for tests and first start-up."""
        return cls(id, Ed25519PrivateKey.generate())

    @property
    def public_key(self) -> Ed25519PublicKey:
        """The matching public key."""
        return self.key.public_key()

    def sign(self, data: bytes) -> bytes:
        """A 64-byte Ed25519 signature over ``data``."""
        return self.key.sign(data)
