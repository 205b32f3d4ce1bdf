"""AES-256-GCM sealing and Ed25519 publisher signatures of confidential publications."""

from __future__ import annotations

import pytest

from security.envelope import (
    DecryptionError,
    EnvelopeError,
    SignatureError,
    Signer,
    canonical_attributes,
    generate_signing_key,
    new_key,
    open_sealed,
    private_key_from_bytes,
    private_key_to_bytes,
    public_key_from_bytes,
    public_key_to_bytes,
    seal,
    sign_publication,
    verify_publication,
)

ATTRS = {"class": "stock", "symbol": "ACME", "price": 99.5, "volume": 1200, "halted": False}
PUB_ID = b"pub-1:42"


def test_sealed_payload_opens_with_the_key_and_same_id_and_attributes() -> None:
    key = new_key()
    sealed = seal(key, PUB_ID, ATTRS, b"secret payload")
    assert b"secret payload" not in sealed
    assert open_sealed(key, PUB_ID, dict(reversed(ATTRS.items())), sealed) == b"secret payload"


def test_two_seals_of_the_same_payload_differ() -> None:
    key = new_key()
    assert seal(key, PUB_ID, ATTRS, b"x") != seal(key, PUB_ID, ATTRS, b"x")


@pytest.mark.parametrize(
    "tamper",
    [
        lambda k, i, a, s: (new_key(), i, a, s),
        lambda k, i, a, s: (k, b"pub-1:43", a, s),
        lambda k, i, a, s: (k, i, {**a, "price": 1.0}, s),
        lambda k, i, a, s: (k, i, {**a, "halted": 0}, s),
        lambda k, i, a, s: (k, i, a, s[:-1] + bytes([s[-1] ^ 1])),
        lambda k, i, a, s: (k, i, a, s[:20]),
    ],
    ids=["wrong-key", "other-id", "changed-attribute", "bool-became-int", "flipped-tag", "cut"],
)
def test_gcm_rejects_any_change_to_key_id_attributes_or_ciphertext(tamper: object) -> None:
    key = new_key()
    sealed = seal(key, PUB_ID, ATTRS, b"payload")
    args = tamper(key, PUB_ID, ATTRS, sealed)  # type: ignore[operator]
    with pytest.raises(DecryptionError):
        open_sealed(*args)


def test_publisher_signature_covers_id_attributes_and_ciphertext() -> None:
    signer = Signer.generate("publisher-1")
    sealed = seal(new_key(), PUB_ID, ATTRS, b"payload")
    signature = sign_publication(signer.key, PUB_ID, ATTRS, sealed)
    verify_publication(signer.public_key, PUB_ID, ATTRS, sealed, signature)
    for pub_id, attrs, blob in [
        (b"other", ATTRS, sealed),
        (PUB_ID, {**ATTRS, "symbol": "EVIL"}, sealed),
        (PUB_ID, ATTRS, sealed + b"\x00"),
    ]:
        with pytest.raises(SignatureError):
            verify_publication(signer.public_key, pub_id, attrs, blob, signature)
    with pytest.raises(SignatureError):
        verify_publication(Signer.generate("x").public_key, PUB_ID, ATTRS, sealed, signature)


def test_canonical_attributes_ignore_order_but_keep_types() -> None:
    a = canonical_attributes(PUB_ID, {"a": 1, "b": "x"})
    assert a == canonical_attributes(PUB_ID, {"b": "x", "a": 1})
    assert a != canonical_attributes(PUB_ID, {"a": True, "b": "x"})
    assert a != canonical_attributes(PUB_ID, {"a": 1.0, "b": "x"})


def test_attributes_of_unsupported_types_are_rejected() -> None:
    with pytest.raises(EnvelopeError, match="nested"):
        canonical_attributes(PUB_ID, {"nested": [1, 2]})  # type: ignore[dict-item]
    with pytest.raises(EnvelopeError, match="32 bytes"):
        seal(b"short", PUB_ID, ATTRS, b"x")


def test_keys_survive_raw_serialisation() -> None:
    key = generate_signing_key()
    again = private_key_from_bytes(private_key_to_bytes(key))
    public = public_key_from_bytes(public_key_to_bytes(key.public_key()))
    public.verify(again.sign(b"m"), b"m")
    assert len(private_key_to_bytes(key)) == 32
    assert len(public_key_to_bytes(public)) == 32
