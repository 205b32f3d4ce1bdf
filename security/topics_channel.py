"""Signed requests to TDNs and replies only their requester can read.

Requests and replies travel as ordinary publications, which any subscriber of the right
class receives. So a request is *signed* (the TDN learns which key asks, and answers
according to it) and names a one-off X25519 reply key; the reply is signed by the TDN and
*sealed* to that reply key (X25519 + HKDF-SHA256 + AES-256-GCM). An eavesdropper that
subscribes to someone else's replies reads nothing, and cannot forge a TDN's answer.

Formats (msgpack): a request is ``[domain, key, signature, body]`` where ``body`` is the
msgpack bytes of a map and the signature covers ``[domain, body]``; a sealed reply is
``ephemeral public key (32) || nonce (12) || AES-GCM ciphertext``.
"""

from __future__ import annotations

import os
from typing import Any

import msgpack
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from security.envelope import Signer, public_key_to_bytes
from security.errors import IntegrityError, InvalidRequest
from security.topics_identity import signature_valid

__all__ = [
    "ReplyKey",
    "open_reply",
    "open_request",
    "seal_reply",
    "sign_request",
]

_REQUEST_DOMAIN = "trellis/tdn-request/v1"
_REPLY_DOMAIN = b"trellis/tdn-reply/v1"
_MAX_BODY = 512 * 1024


class ReplyKey:
    """A one-off X25519 key pair a requester names in a request and opens replies with."""

    def __init__(self) -> None:
        self._key = X25519PrivateKey.generate()

    @property
    def public(self) -> bytes:
        return self._key.public_key().public_bytes(
            serialization.Encoding.Raw, serialization.PublicFormat.Raw
        )

    def shared(self, peer: bytes) -> bytes:
        return self._key.exchange(X25519PublicKey.from_public_bytes(peer))


def _aead_key(shared: bytes, ephemeral: bytes, recipient: bytes) -> bytes:
    return HKDF(
        algorithm=hashes.SHA256(), length=32, salt=ephemeral + recipient, info=_REPLY_DOMAIN
    ).derive(shared)


def sign_request(signer: Signer, body: dict[str, Any]) -> bytes:
    """A request from ``signer`` to TDNs (or topic owners)."""
    raw = msgpack.packb(body, use_bin_type=True)
    signature = signer.sign(msgpack.packb([_REQUEST_DOMAIN, raw], use_bin_type=True))
    return msgpack.packb(
        [_REQUEST_DOMAIN, public_key_to_bytes(signer.public_key), signature, raw],
        use_bin_type=True,
    )


def open_request(blob: bytes) -> tuple[bytes, dict[str, Any]]:
    """The signer's raw public key and the body of a request.

    Raises:
        InvalidRequest: not a request (malformed, too large).
        IntegrityError: the signature does not verify.
    """
    if len(blob) > _MAX_BODY:
        raise InvalidRequest(f"request of {len(blob)} bytes is over {_MAX_BODY}")
    try:
        domain, key, signature, raw = msgpack.unpackb(blob, raw=False)
        body = msgpack.unpackb(raw, raw=False, strict_map_key=True)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise InvalidRequest(f"malformed request: {exc}") from None
    if domain != _REQUEST_DOMAIN or not isinstance(body, dict) or not isinstance(key, bytes):
        raise InvalidRequest("malformed request: not a TDN request")
    if not signature_valid(key, signature, msgpack.packb([domain, raw], use_bin_type=True)):
        raise IntegrityError("request signature does not verify")
    return key, body


def seal_reply(recipient: bytes, payload: bytes) -> bytes:
    """Encrypt ``payload`` so that only the holder of the X25519 key ``recipient`` reads it.

    Raises:
        InvalidRequest: ``recipient`` is not a 32-byte X25519 public key.
    """
    try:
        peer = X25519PublicKey.from_public_bytes(bytes(recipient))
    except ValueError:
        raise InvalidRequest("reply key must be a 32-byte X25519 public key") from None
    ephemeral = X25519PrivateKey.generate()
    eph_pub = ephemeral.public_key().public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    )
    key = _aead_key(ephemeral.exchange(peer), eph_pub, bytes(recipient))
    nonce = os.urandom(12)
    return eph_pub + nonce + AESGCM(key).encrypt(nonce, payload, _REPLY_DOMAIN)


def open_reply(reply_key: ReplyKey, sealed: bytes) -> bytes:
    """Decrypt a reply sealed to ``reply_key``.

    Raises:
        IntegrityError: the reply was not sealed to this key, or was altered.
    """
    if len(sealed) < 32 + 12 + 16:
        raise IntegrityError("sealed reply too short")
    eph_pub, nonce, body = sealed[:32], sealed[32:44], sealed[44:]
    key = _aead_key(reply_key.shared(eph_pub), eph_pub, reply_key.public)
    try:
        return AESGCM(key).decrypt(nonce, body, _REPLY_DOMAIN)
    except InvalidTag:
        raise IntegrityError("sealed reply does not open with this reply key") from None
