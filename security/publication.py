"""What a confidential publication carries and how it is bound (SPEC §3).

A publication id binds every signature, commitment and AES-GCM tag of a publication; the
publisher's signature also binds the VN its key shares start from and its key epoch, so no
broker can redirect share verification. :class:`EpochKey` is a publisher's content key for
one key epoch, split once for its edge VN's replicas.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from security.envelope import (
    AttributeValue,
    EnvelopeError,
    Signer,
    new_key,
    public_key_from_bytes,
    public_key_to_bytes,
    publication_digest,
    seal,
    verify_publication,
)
from security.propagation import (
    Seal,
    ShareRecord,
    publisher_split_unsealed,
    seal_batch,
    statement_sealed,
    threshold_for,
    with_root_cert,
)


@dataclass(frozen=True, slots=True)
class SecBlock:
    """The security block of a confidential publication, as it travels with the content.

    Attributes:
        pk: the publisher's Ed25519 public key (raw 32 bytes).
        sig: the publisher's signature over :func:`signed_id`, the attributes and the
            sealed payload.
        vn: the publisher's edge VN, where its key shares start.
        epoch: the key epoch (the seq of the epoch's first publication).
        share: the key share for one edge replica; only on a client's ``PUBLISH`` of an
            epoch's first publication, never forwarded with the content.
        seal: (position, count, Merkle path) when ``sig`` signs a batch root rather than the
            publication alone: the publication that opens an epoch is sealed with its
            root split under one signature (:func:`signature_valid`), so the edge replica
            verifies one signature for both.
    """

    pk: bytes
    sig: bytes
    vn: str
    epoch: int
    share: bytes | None = None
    seal: tuple[int, int, tuple[bytes, ...]] | None = None

    def to_wire(self) -> dict[str, Any]:
        """The msgpack map form (``share`` and ``seal`` only when present)."""
        wire: dict[str, Any] = {"pk": self.pk, "sig": self.sig, "vn": self.vn, "epoch": self.epoch}
        if self.share is not None:
            wire["share"] = self.share
        if self.seal is not None:
            position, count, proof = self.seal
            wire["seal"] = [position, count, list(proof)]
        return wire

    def with_share(self, share: bytes) -> SecBlock:
        return replace(self, share=share)

    def without_share(self) -> SecBlock:
        """What travels on with the content once the edge broker took its share."""
        return self if self.share is None else replace(self, share=None)


def publication_id(publisher: str, seq: int) -> bytes:
    """The id every signature, commitment and AEAD tag of a publication is bound to."""
    return f"{publisher}/{seq}".encode()


def epoch_of(pub_id: bytes) -> tuple[str, int] | None:
    """The (publisher, seq) a publication id names (:func:`publication_id`'s inverse; a
    key share's id names its epoch's first seq), or None for anything else."""
    publisher, _, seq = pub_id.rpartition(b"/")
    if not publisher or not seq.isdigit():
        return None
    try:
        return publisher.decode(), int(seq)
    except UnicodeDecodeError:
        return None


@dataclass
class EpochKey:
    """A publisher's content key for one key epoch, named by the epoch's first seq.

    Each publication is sealed under the epoch key with its own id as associated data
    (and a fresh nonce); the key's shares, one per replica of the edge VN, are bound to
    the epoch's first publication id.
    """

    key: bytes
    first_seq: int
    vn: str
    records: list[ShareRecord]
    started: float
    used: int = 0
    replicas: int = 0
    # the key's root split travels by the pass (:mod:`security.pass_shares`, split by the
    # client beside the PUBLISH), not as records sealed with the publication's signature
    by_pass: bool = False
    # the root split of the key, made with the epoch's first publication and sealed with
    # its pass (:func:`sign_pass`), which moves it to ``records``
    _unsealed: list[ShareRecord] = field(default_factory=list, repr=False)

    @classmethod
    def start(
        cls, signer: Signer, first_seq: int, vn: str, replicas: int, *, by_pass: bool = False
    ) -> EpochKey:
        """A fresh key; its shares (:attr:`records`) are made when the epoch's first
        publication is sealed, under the same signature as that publication (``by_pass``:
        the caller splits the key by the pass instead)."""
        threshold_for(replicas)  # refuse a bad replica count now, not at the first seal
        return cls(
            new_key(), first_seq, vn, [], time.monotonic(), replicas=replicas, by_pass=by_pass
        )

    def expired(self, messages: int, seconds: float | None) -> bool:
        if self.used >= messages:
            return True
        return seconds is not None and time.monotonic() - self.started >= seconds

    def seal(
        self, signer: Signer, seq: int, attrs: Mapping[str, AttributeValue], payload: bytes
    ) -> tuple[bytes, SecBlock]:
        """Encrypt and sign one publication; returns the sealed payload and its block."""
        pending = self.prepare(signer, seq, attrs, payload)
        (sec,) = sign_pass(signer, [pending])
        return pending.sealed, sec

    def prepare(
        self, signer: Signer, seq: int, attrs: Mapping[str, AttributeValue], payload: bytes
    ) -> Unsigned:
        """Encrypt one publication; :func:`sign_pass` signs it with the others of its pass
        (and the root split of the key when it opens the epoch)."""
        self.used += 1
        pub_id = publication_id(signer.id, seq)
        sealed = seal(self.key, pub_id, attrs, payload)
        signed = signed_id(signer.id, seq, self.vn, self.first_seq)
        opens = seq == self.first_seq and not self.records and not self._unsealed
        if opens and not self.by_pass:
            r = self.replicas
            self._unsealed = publisher_split_unsealed(
                self.key, threshold_for(r), r, signer.id, pub_id
            )
        return Unsigned(self, sealed, publication_digest(signed, attrs, sealed), opens)


@dataclass(frozen=True, slots=True)
class Unsigned:
    """A sealed publication waiting for its pass's signature (:func:`sign_pass`)."""

    epoch: EpochKey
    sealed: bytes
    statement: bytes
    opens: bool


SIGNED_TOGETHER = 8
"""Most publications under one signature. Every copy of a publication carries its Merkle
path (32 bytes per level) to every hop, so the batch is capped: 8 keeps the path at 3-4
hashes while an edge replica still verifies one signature per 8 publications."""


def sign_pass(signer: Signer, pending: Sequence[Unsigned]) -> list[SecBlock]:
    """:func:`sign_batch` over a pass, :data:`SIGNED_TOGETHER` publications at a time."""
    return [
        sec
        for i in range(0, len(pending), SIGNED_TOGETHER)
        for sec in sign_batch(signer, pending[i : i + SIGNED_TOGETHER])
    ]


def sign_batch(signer: Signer, pending: Sequence[Unsigned]) -> list[SecBlock]:
    """Sign the publications of one pass, and the root splits of the epochs they open,
    with one Ed25519 signature over a Merkle root (:func:`seal_batch`); returns each
    publication's block. The epochs' :attr:`EpochKey.records` are sealed here.

    An edge replica verifies the signature once (its seal cache) for every publication
    and root share of the pass; a lone publication that opens no epoch keeps a plain
    signature (no Merkle path to carry)."""
    pk = public_key_to_bytes(signer.public_key)
    if len(pending) == 1 and not (pending[0].opens and pending[0].epoch._unsealed):
        (one,) = pending
        sig = signer.sign(one.statement)
        return [SecBlock(pk=pk, sig=sig, vn=one.epoch.vn, epoch=one.epoch.first_seq)]
    opening = [p.epoch for p in pending if p.opens and p.epoch._unsealed]
    certs, seals = seal_batch(
        [epoch._unsealed[0].certs[-1] for epoch in opening],
        signer,
        [p.statement for p in pending],
    )
    for epoch, cert in zip(opening, certs, strict=True):
        epoch.records, epoch._unsealed = with_root_cert(epoch._unsealed, cert), []
    return [
        SecBlock(
            pk=pk,
            sig=seal.signature,
            vn=p.epoch.vn,
            epoch=p.epoch.first_seq,
            seal=(seal.position, seal.size, seal.proof),
        )
        for p, seal in zip(pending, seals, strict=True)
    ]


def signed_id(publisher: str, seq: int, vn: str, epoch: int) -> bytes:
    """What the publisher's signature binds besides content: the publication, the VN its
    shares start from and its key epoch (so no broker can redirect share verification)."""
    return f"{publisher}/{seq}@{vn}#{epoch}".encode()


def signature_valid(
    publisher: str,
    seq: int,
    attrs: Mapping[str, AttributeValue],
    payload: bytes,
    sec: SecBlock,
) -> bool:
    """Whether ``sec`` carries the publisher's valid signature over this content (alone,
    or with ``sec.seal`` as a member of a batch the publisher sealed)."""
    signed = signed_id(publisher, seq, sec.vn, sec.epoch)
    try:
        key = public_key_from_bytes(sec.pk)
        if sec.seal is not None:
            position, count, proof = sec.seal
            statement = publication_digest(signed, attrs, payload)
            return statement_sealed(
                key, publisher, statement, Seal(sec.sig, position, count, proof)
            )
        verify_publication(key, signed, attrs, payload, sec.sig)
    except (EnvelopeError, ValueError):
        return False
    return True
